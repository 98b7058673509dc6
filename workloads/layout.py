"""Parallel layout: how ranks are split over data, tensor, pipeline, context and
expert parallelism, and which ranks form each communication group.

Ranks are numbered ``0 .. world-1`` and rank ``r`` runs on device ``r`` of the
cluster (devices are numbered so that devices sharing a scale-up domain are
consecutive). ``order`` lists the mesh axes innermost first: with the default
``tp-cp-ep-dp-pp`` the TP ranks of one group are consecutive, so they land in the
same NVLink domain, and pipeline stages are the outermost (farthest apart) axis.

Expert parallelism is carved out of the ``dp * cp`` ranks of a stage (as in
Megatron-Core): the ``dp*cp`` ranks with equal (tp, pp) coordinates, taken in
mesh order, are cut into consecutive blocks of ``ep`` ranks, one EP group each;
ranks at the same position of different blocks form the expert-data-parallel
group that reduces expert gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Optional, Union

MESH_AXES = ("tp", "cp", "dp", "pp")
ORDER_AXES = ("tp", "cp", "ep", "dp", "pp")
GROUP_AXES = ("tp", "cp", "dp", "pp", "ep", "edp", "dp_cp")


class LayoutError(ValueError):
    """A parallel layout that cannot be realised. ``field`` names the offending key."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class ParallelLayout:
    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    vpp: int = 1
    etp: int = 1
    zero: int = 1
    sequence_parallel: bool = True
    order: tuple[str, ...] = ORDER_AXES
    pipeline_layers: Optional[Union[tuple[int, ...], str]] = None  # per chunk, or "auto"

    def __post_init__(self) -> None:
        for name in ("tp", "cp", "pp", "dp", "ep", "vpp", "etp"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise LayoutError(f"parallel.{name}", f"must be a positive integer, got {v!r}")
        if self.zero not in (0, 1, 2, 3):
            raise LayoutError("parallel.zero", f"must be one of 0, 1, 2, 3, got {self.zero!r}")
        if (self.dp * self.cp) % self.ep:
            raise LayoutError(
                "parallel.ep",
                f"must divide dp*cp = {self.dp * self.cp} (expert parallelism is carved out of "
                f"data and context parallelism), got {self.ep}",
            )
        if self.etp != 1 and self.etp != self.tp:
            raise LayoutError("parallel.etp", f"must be 1 or equal to tp ({self.tp}), got {self.etp}")
        if sorted(self.order) != sorted(ORDER_AXES):
            raise LayoutError(
                "parallel.order",
                f"must name each of {', '.join(ORDER_AXES)} once (innermost first), got {'-'.join(self.order)}",
            )
        if self.vpp > 1 and self.pp == 1:
            raise LayoutError("parallel.vpp", "virtual stages need pp > 1")

    # ---- sizes ---------------------------------------------------------------
    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def edp(self) -> int:
        """Expert data-parallel degree: replicas of each expert."""
        return self.dp * self.cp // self.ep

    @property
    def stages(self) -> int:
        """Model chunks in the pipeline: pp * vpp."""
        return self.pp * self.vpp

    # ---- rank <-> coordinates -----------------------------------------------
    @cached_property
    def _mesh_order(self) -> tuple[str, ...]:
        return tuple(a for a in self.order if a != "ep")

    @cached_property
    def _strides(self) -> dict[str, int]:
        strides, s = {}, 1
        for a in self._mesh_order:
            strides[a] = s
            s *= getattr(self, a)
        return strides

    def coords(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of ``rank``: keys tp, cp, dp, pp (and ep, edp)."""
        if not 0 <= rank < self.world:
            raise IndexError(f"rank {rank} outside 0..{self.world - 1}")
        c = {a: (rank // self._strides[a]) % getattr(self, a) for a in self._mesh_order}
        flat = self._dpcp_index(c)
        c["ep"] = flat % self.ep
        c["edp"] = flat // self.ep
        return c

    def rank_of(self, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        c = dict(tp=tp, cp=cp, dp=dp, pp=pp)
        return sum(c[a] * self._strides[a] for a in self._mesh_order)

    def _dpcp_index(self, c: dict[str, int]) -> int:
        """Position of a rank among the dp*cp ranks of its (tp, pp) slice, in mesh order."""
        inner, outer = ("cp", "dp") if self._mesh_order.index("cp") < self._mesh_order.index("dp") else ("dp", "cp")
        return c[inner] + getattr(self, inner) * c[outer]

    def stage_of(self, rank: int) -> int:
        return (rank // self._strides["pp"]) % self.pp

    # ---- groups --------------------------------------------------------------
    def group(self, rank: int, axis: str) -> tuple[int, ...]:
        """The ranks of ``rank``'s communication group along ``axis``, sorted by
        their index along that axis (ring order)."""
        return _cached_group(self, rank, axis)

    def _group(self, rank: int, axis: str) -> tuple[int, ...]:
        c = self.coords(rank)
        if axis in MESH_AXES:
            size = getattr(self, axis)
            return tuple(self.rank_of(**{**_mesh(c), axis: i}) for i in range(size))
        members = self._dpcp_members(c)
        if axis == "dp_cp":
            return members
        if axis == "ep":
            blk = c["edp"]
            return members[blk * self.ep : (blk + 1) * self.ep]
        if axis == "edp":
            return members[c["ep"] :: self.ep]
        raise ValueError(f"unknown group axis {axis!r}; expected one of {GROUP_AXES}")

    def _dpcp_members(self, c: dict[str, int]) -> tuple[int, ...]:
        return _cached_dpcp(self, c["tp"], c["pp"])

    def _dpcp_members_uncached(self, tp: int, pp: int) -> tuple[int, ...]:
        c = {"tp": tp, "pp": pp, "cp": 0, "dp": 0}
        inner, outer = ("cp", "dp") if self._mesh_order.index("cp") < self._mesh_order.index("dp") else ("dp", "cp")
        out = []
        for o in range(getattr(self, outer)):
            for i in range(getattr(self, inner)):
                out.append(self.rank_of(**{**_mesh(c), inner: i, outer: o}))
        return tuple(out)

    def groups(self, axis: str, stage: Optional[int] = None) -> list[tuple[int, ...]]:
        """Every distinct group along ``axis`` (optionally only those in pipeline
        ``stage``), in ascending order of their first rank."""
        return list(_cached_groups(self, axis, stage))

    def _groups(self, axis: str, stage: Optional[int]) -> tuple[tuple[int, ...], ...]:
        seen: dict[tuple[int, ...], None] = {}
        ranks = range(self.world) if stage is None else self.stage_ranks(stage)
        for r in ranks:
            seen.setdefault(self.group(r, axis), None)
        return tuple(sorted(seen, key=lambda g: min(g)))

    def ep_subgroup(self, rank: int, kind: str, domain_size: int) -> tuple[int, ...]:
        """Part of ``rank``'s expert-parallel group used by a two-hop (node-limited)
        all-to-all on a network of ``domain_size``-device scale-up domains (rank ``r``
        on device ``r``): ``kind="inter"`` the members at the same position in their
        domain (one per domain, reached over one rail), ``"intra"`` the members in
        ``rank``'s own domain (reached over NVLink)."""
        return _cached_ep_subgroup(self, rank, kind, domain_size)

    def _ep_subgroup(self, rank: int, kind: str, domain_size: int) -> tuple[int, ...]:
        group = self.group(rank, "ep")
        if kind == "inter":
            return tuple(r for r in group if r % domain_size == rank % domain_size)
        if kind == "intra":
            return tuple(r for r in group if r // domain_size == rank // domain_size)
        raise ValueError(f"kind must be 'inter' or 'intra', got {kind!r}")

    def ep_subgroups(self, kind: str, stage: int, domain_size: int) -> list[tuple[int, ...]]:
        """Every distinct :meth:`ep_subgroup` among the ranks of ``stage``."""
        seen: dict[tuple[int, ...], None] = {}
        for r in self.stage_ranks(stage):
            seen.setdefault(self.ep_subgroup(r, kind, domain_size), None)
        return sorted(seen, key=min)

    def stage_ranks(self, stage: int) -> list[int]:
        """Ranks of pipeline stage ``stage``, ascending."""
        return list(_cached_stage_ranks(self, stage))

    # ---- layers onto stages -------------------------------------------------
    def layers_per_chunk(self, layers: int, chunks: Optional[int] = None, what: str = "") -> list[int]:
        """Transformer layers held by each of ``chunks`` model chunks (default
        ``pp * vpp``), in pipeline order: from ``pipeline_layers`` (explicit, or
        ``"auto"``: as even as possible with lighter first and last chunks), else an
        even split. ``what`` names the chunking in error messages.

        Raises :class:`LayoutError` naming ``parallel.pipeline_layers`` or
        ``parallel.pp`` when the layers cannot be split so."""
        n = self.stages if chunks is None else chunks
        what = what or f"pp*vpp = {self.pp}*{self.vpp}"
        if self.pipeline_layers == "auto":
            return auto_layer_split(layers, n)
        if self.pipeline_layers is not None:
            pl = list(self.pipeline_layers)
            if len(pl) != n:
                raise LayoutError("parallel.pipeline_layers", f"needs {n} entries (one per model chunk: {what}), "
                                                              f"got {len(pl)}")
            if any((not isinstance(x, int)) or x < 0 for x in pl) or sum(pl) != layers:
                raise LayoutError("parallel.pipeline_layers",
                                  f"must be non-negative integers summing to the model's {layers} layers, got {pl}")
            return pl
        if layers % n:
            raise LayoutError(
                "parallel.pp",
                f"{layers} layers do not split evenly over {n} model chunks ({what}); choose sizes dividing "
                "the layer count, or give parallel.pipeline_layers (a list, or auto)",
            )
        return [layers // n] * n

    def chunk_layer_ranges(self, layers: int, chunks: Optional[int] = None, what: str = "") -> list[range]:
        """Global layer indices of each model chunk, in pipeline order."""
        out, start = [], 0
        for n in self.layers_per_chunk(layers, chunks, what):
            out.append(range(start, start + n))
            start += n
        return out


def auto_layer_split(layers: int, chunks: int) -> list[int]:
    """``layers`` over ``chunks`` model chunks as evenly as possible, the extra layers
    going to the middle chunks first, so that the first chunk (which also holds the
    embedding) and the last (the LM head and loss) get the fewer — as Llama 3 does."""
    if chunks > layers:
        raise LayoutError("parallel.pipeline_layers", f"{chunks} model chunks for {layers} layers: "
                                                      "every chunk needs at least one layer")
    base, rem = divmod(layers, chunks)
    split = [base] * chunks
    order = list(range(1, chunks - 1)) + [0, chunks - 1] if chunks > 2 else list(range(chunks))
    for i in order[:rem]:
        split[i] += 1
    return split


@lru_cache(maxsize=4096)
def _cached_stage_ranks(layout: ParallelLayout, stage: int) -> tuple[int, ...]:
    s = layout._strides["pp"]
    block = s * layout.pp
    # Ranks whose pp digit is `stage`: within every block of pp*stride ranks, the
    # stride-long run starting at stage*stride.
    return tuple(b + stage * s + i for b in range(0, layout.world, block) for i in range(s))


@lru_cache(maxsize=1 << 14)
def _cached_dpcp(layout: ParallelLayout, tp: int, pp: int) -> tuple[int, ...]:
    return layout._dpcp_members_uncached(tp, pp)


@lru_cache(maxsize=1 << 16)
def _cached_group(layout: ParallelLayout, rank: int, axis: str) -> tuple[int, ...]:
    return layout._group(rank, axis)


@lru_cache(maxsize=1 << 16)
def _cached_ep_subgroup(layout: ParallelLayout, rank: int, kind: str,
                        domain_size: int) -> tuple[int, ...]:
    return layout._ep_subgroup(rank, kind, domain_size)


@lru_cache(maxsize=1024)
def _cached_groups(layout: ParallelLayout, axis: str, stage: Optional[int]) -> tuple[tuple[int, ...], ...]:
    return layout._groups(axis, stage)


def _mesh(c: dict[str, int]) -> dict[str, int]:
    return {a: c[a] for a in MESH_AXES}
