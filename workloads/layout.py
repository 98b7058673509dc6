"""Parallel layout: how ranks are split over data, tensor, pipeline, context and
expert parallelism, and which ranks form each communication group.

Ranks are numbered ``0 .. world-1`` and rank ``r`` runs on device ``r`` of the
cluster (devices are numbered so that devices sharing a scale-up domain are
consecutive). ``order`` lists the mesh axes innermost first: with the default
``tp-cp-ep-dp-pp`` the TP ranks of one group are consecutive, so they land in the
same NVLink domain, and pipeline stages are the outermost (farthest apart) axis.

Expert layout. Two mappings, as Megatron-Core has them (``megatron/core/transformer/
moe/README.md``, "MoE Parallel Folding"; Liu et al. 2025, arXiv 2504.14960):

* **Carved out of data parallelism** (the traditional mapping, where "the EP group
  in MoE is a sub-group of DP in Attention"): when ``ep`` divides ``dp*cp`` and
  ``etp`` is 1 or ``tp``. The ``dp*cp`` ranks with equal (tp, pp) coordinates,
  taken in mesh order, are cut into consecutive blocks of ``ep`` ranks, one EP
  group each; ranks at the same position of different blocks hold the same
  experts and form the expert-data-parallel group that reduces expert gradients —
  with ``etp = 1 < tp``, the same positions at every TP coordinate too (each TP
  rank then holds the full-width experts). With ``etp = tp`` the TP group is the
  expert-tensor-parallel group.
* **Folded** (every other layout with ``ep*etp`` dividing ``tp*cp*dp``): the
  attention layout (TP x CP x DP) and the expert layout (ETP x EP x EDP) are two
  decompositions of the same ranks of a pipeline stage, so that "the EPxTP group
  in MoE is a sub-group of DPxCPxTP in Attention" and EP may span the TP (and CP)
  ranks. The stage's ``tp*cp*dp`` ranks in ascending order (the mesh order of tp,
  cp and dp) are cut into an ``etp x ep x edp`` mesh, ``edp = tp*cp*dp /
  (ep*etp)``, nested as ``order`` nests tp, ep and dp (the default
  ``tp-cp-ep-dp-pp``: etp innermost, then ep, then edp) — what Megatron-Core's
  ``initialize_model_parallel`` builds with its second, expert ``RankGenerator``
  (``tp=etp, ep=ep, dp=edp, cp=1`` over the same ``order`` string;
  ``expert_data_parallel_size = world / (etp * ep * pp)``), whose pipeline groups
  must equal the attention generator's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Optional, Union

import numpy as np

from workloads.errors import WorkloadError

MESH_AXES = ("tp", "cp", "dp", "pp")
ORDER_AXES = ("tp", "cp", "ep", "dp", "pp")
GROUP_AXES = ("tp", "cp", "dp", "pp", "ep", "edp", "etp", "dp_cp")
EXPERT_AXES = {"tp": "etp", "ep": "ep", "dp": "edp"}  # order names -> folded expert mesh axes


class LayoutError(WorkloadError):
    """A parallel layout that cannot be realised. ``field`` names the offending key."""


@dataclass(frozen=True)
class ParallelLayout:
    # constraints in metadata (pydantic's ge/gt/...): the scenario schema's ``parallel`` input
    # model is built from these fields (simulator.scenario.schema)
    tp: int = field(default=1, metadata={"ge": 1})
    cp: int = field(default=1, metadata={"ge": 1})
    pp: int = field(default=1, metadata={"ge": 1})
    dp: int = field(default=1, metadata={"ge": 1})
    ep: int = field(default=1, metadata={"ge": 1})
    vpp: int = field(default=1, metadata={"ge": 1})
    etp: int = field(default=1, metadata={"ge": 1})
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
        n = self.tp * self.cp * self.dp
        if n % self.etp:
            raise LayoutError(
                "parallel.etp",
                f"must divide tp*cp*dp = {n} (the ranks of a pipeline stage, which the expert layout "
                f"etp x ep x edp reuses), got {self.etp}",
            )
        if n % (self.ep * self.etp):
            raise LayoutError(
                "parallel.ep",
                f"ep*etp = {self.ep}*{self.etp} must divide tp*cp*dp = {n} (the ranks of a pipeline stage, "
                f"which the expert layout etp x ep x edp reuses), got ep = {self.ep}",
            )
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
    def folded(self) -> bool:
        """Whether the expert layout is folded over the stage's ranks (see the module
        doc) rather than carved out of ``dp*cp``: ``ep`` does not divide ``dp*cp``,
        or ``etp`` is neither 1 nor ``tp``."""
        return (self.dp * self.cp) % self.ep != 0 or self.etp not in (1, self.tp)

    @property
    def edp(self) -> int:
        """Expert data-parallel degree: the ranks of a stage holding the same expert
        shard, over which expert gradients are reduced, ``tp*cp*dp / (ep*etp)``
        (Megatron-Core's ``expert_data_parallel_size``). Carved out of DP with
        ``etp = tp`` this is ``dp*cp / ep``; with ``etp = 1`` the ``tp`` ranks at one
        EP position hold the same full-width experts too, so it is ``tp`` times that."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)

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
        """Mesh coordinates of ``rank``: keys tp, cp, dp, pp, and its expert
        coordinates ep, edp, etp."""
        if not 0 <= rank < self.world:
            raise IndexError(f"rank {rank} outside 0..{self.world - 1}")
        c = {a: (rank // self._strides[a]) % getattr(self, a) for a in self._mesh_order}
        if self.folded:
            pos = self._stage_pos(c)
            for a, (size, stride) in self._expert_mesh.items():
                c[a] = (pos // stride) % size
            return c
        flat = self._dpcp_index(c)
        c["ep"] = flat % self.ep
        c["edp"] = flat // self.ep
        c["etp"] = c["tp"] if self.etp == self.tp else 0
        return c

    # ---- the folded expert mesh ----------------------------------------------
    @cached_property
    def _stage_strides(self) -> dict[str, int]:
        """Strides of tp, cp and dp in a rank's position among its stage's ranks."""
        strides, s = {}, 1
        for a in self._mesh_order:
            if a != "pp":
                strides[a] = s
                s *= getattr(self, a)
        return strides

    def _stage_pos(self, c: dict[str, int]) -> int:
        """Position of a rank among its stage's ranks in ascending order."""
        return sum(c[a] * s for a, s in self._stage_strides.items())

    @cached_property
    def _expert_mesh(self) -> dict[str, tuple[int, int]]:
        """Folded layout: ``axis -> (size, stride)`` of etp, ep and edp over the
        stage positions, nested as ``order`` nests tp, ep and dp."""
        out, s = {}, 1
        for a in self.order:
            if a in EXPERT_AXES:
                name = EXPERT_AXES[a]
                size = getattr(self, name)
                out[name] = (size, s)
                s *= size
        return out

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

    def groups(self, axis: str, stage: Optional[int] = None) -> list[tuple[int, ...]]:
        """Every distinct group along ``axis`` (optionally only those in pipeline
        ``stage``), in ascending order of their first rank."""
        return list(_cached_groups(self, axis, stage))

    def group_table(self, axis: str) -> "np.ndarray":
        """Every group along ``axis`` as the rows of one read-only ``(groups, size)``
        array, each row in ring order (as :meth:`group` gives it), rows in ascending
        order of their smallest rank. Every axis partitions the ranks."""
        return _group_tables(self, axis)[0]

    def group_index(self, axis: str) -> "np.ndarray":
        """Row of :meth:`group_table` holding each rank (read-only, length ``world``)."""
        return _group_tables(self, axis)[1]

    def _rank_mesh(self) -> "np.ndarray":
        """``ranks[pp, ..., tp]``: the ranks as an array over the mesh axes, one numpy
        axis per mesh axis, the innermost (fastest-varying) last."""
        return np.arange(self.world).reshape([getattr(self, a) for a in reversed(self._mesh_order)])

    def _mesh_axis(self, axis: str) -> int:
        """Numpy axis of mesh axis ``axis`` in :meth:`_rank_mesh`."""
        return len(self._mesh_order) - 1 - self._mesh_order.index(axis)

    def _dpcp_table(self) -> "np.ndarray":
        """``members[pp, tp, i]``: the dp*cp ranks of each (pp, tp) slice in mesh order
        (position ``i = inner + inner_size * outer``, inner the one of cp and dp nearer
        the front of ``order``)."""
        inner, outer = ("cp", "dp") if self._mesh_order.index("cp") < self._mesh_order.index("dp") else ("dp", "cp")
        ranks = self._rank_mesh().transpose([self._mesh_axis(a) for a in ("pp", "tp", outer, inner)])
        return ranks.reshape(self.pp, self.tp, self.dp * self.cp)

    def _stage_table(self) -> "np.ndarray":
        """``ranks[pp, pos]``: the rank at position ``pos`` of each pipeline stage (the
        stage's ranks in ascending order)."""
        return np.moveaxis(self._rank_mesh(), self._mesh_axis("pp"), 0).reshape(self.pp, -1)

    def _group_rows(self, axis: str) -> "np.ndarray":
        """The groups along ``axis`` as rows in ring order, rows in no particular order
        (the module doc gives the mappings)."""
        if axis in MESH_AXES:
            ranks = self._rank_mesh()
            return np.moveaxis(ranks, self._mesh_axis(axis), -1).reshape(-1, getattr(self, axis))
        if axis == "etp" and not self.folded:
            return self._group_rows("tp") if self.etp == self.tp else np.arange(self.world).reshape(-1, 1)
        if axis in ("ep", "edp", "etp") and self.folded:
            # Positions of a stage as an array over the expert mesh, outermost first.
            mesh = list(self._expert_mesh.items())  # innermost first
            pos = np.arange(self.tp * self.cp * self.dp).reshape([size for _, (size, _) in reversed(mesh)])
            at = len(mesh) - 1 - [name for name, _ in mesh].index(axis)
            rows = np.moveaxis(pos, at, -1).reshape(-1, self._expert_mesh[axis][0])
            return self._stage_table()[:, rows].reshape(-1, rows.shape[1])
        if axis not in GROUP_AXES:
            raise ValueError(f"unknown group axis {axis!r}; expected one of {GROUP_AXES}")
        members = self._dpcp_table()  # [pp, tp, dp*cp]
        n = self.dp * self.cp
        if axis == "dp_cp":
            return members.reshape(-1, n)
        blocks = members.reshape(self.pp, self.tp, n // self.ep, self.ep)  # [pp, tp, edp, ep]
        if axis == "ep":
            return blocks.reshape(-1, self.ep)
        if self.etp == self.tp:  # edp: same EP position, own TP rank
            return blocks.transpose(0, 1, 3, 2).reshape(-1, n // self.ep)
        # etp = 1 < tp: every TP coordinate holds the same experts at this EP position
        rows = blocks.transpose(0, 3, 1, 2).reshape(self.pp * self.ep, -1)
        return np.sort(rows, axis=1)

    def _groups(self, axis: str, stage: Optional[int]) -> tuple[tuple[int, ...], ...]:
        table = self.group_table(axis)
        if stage is not None and axis != "pp":  # every other group lies in one stage
            table = table[(table[:, 0] // self._strides["pp"]) % self.pp == stage]
        return tuple(map(tuple, table.tolist()))

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
        """Every distinct :meth:`ep_subgroup` among the ranks of ``stage``, in ascending
        order of their first rank."""
        return list(_cached_ep_subgroups(self, kind, stage, domain_size))

    def _ep_subgroups(self, kind: str, stage: int, domain_size: int) -> tuple[tuple[int, ...], ...]:
        if kind not in ("inter", "intra"):
            raise ValueError(f"kind must be 'inter' or 'intra', got {kind!r}")
        table = self.group_table("ep")
        table = table[(table[:, 0] // self._strides["pp"]) % self.pp == stage]
        if table.size == 0:
            return ()
        # Members sharing a domain position (inter) or a domain (intra) in each EP group,
        # in the group's order: a stable sort by (group, key) makes each subgroup a run.
        key = table % domain_size if kind == "inter" else table // domain_size
        run = np.arange(table.shape[0])[:, None] * (int(key.max()) + 1) + key
        order = np.argsort(run, axis=None, kind="stable")
        ranks, run = table.ravel()[order], run.ravel()[order]
        starts = np.flatnonzero(np.r_[True, run[1:] != run[:-1]])
        bounds = np.r_[starts, ranks.size].tolist()
        flat = ranks.tolist()
        subgroups = [tuple(flat[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        by_first = np.argsort(np.minimum.reduceat(ranks, starts), kind="stable")
        return tuple(subgroups[i] for i in by_first.tolist())

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
                raise LayoutError(
                    "parallel.pipeline_layers", f"needs {n} entries (one per model chunk: {what}), got {len(pl)}"
                )
            if any((not isinstance(x, int)) or x < 0 for x in pl) or sum(pl) != layers:
                raise LayoutError(
                    "parallel.pipeline_layers",
                    f"must be non-negative integers summing to the model's {layers} layers, got {pl}",
                )
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
        raise LayoutError(
            "parallel.pipeline_layers",
            f"{chunks} model chunks for {layers} layers: every chunk needs at least one layer",
        )
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


@lru_cache(maxsize=256)
def _group_tables(layout: ParallelLayout, axis: str) -> tuple:
    """``(table, index)`` of :meth:`ParallelLayout.group_table` and ``group_index``."""
    rows = layout._group_rows(axis)
    table = rows[np.argsort(rows.min(axis=1), kind="stable")]
    index = np.empty(layout.world, dtype=np.int64)
    index[table] = np.arange(table.shape[0])[:, None]
    table.setflags(write=False)
    index.setflags(write=False)
    return table, index


@lru_cache(maxsize=1 << 16)
def _cached_group(layout: ParallelLayout, rank: int, axis: str) -> tuple[int, ...]:
    if not 0 <= rank < layout.world:
        raise IndexError(f"rank {rank} outside 0..{layout.world - 1}")
    return tuple(layout.group_table(axis)[layout.group_index(axis)[rank]].tolist())


@lru_cache(maxsize=1 << 16)
def _cached_ep_subgroup(layout: ParallelLayout, rank: int, kind: str, domain_size: int) -> tuple[int, ...]:
    return layout._ep_subgroup(rank, kind, domain_size)


@lru_cache(maxsize=1024)
def _cached_ep_subgroups(
    layout: ParallelLayout, kind: str, stage: int, domain_size: int
) -> tuple[tuple[int, ...], ...]:
    return layout._ep_subgroups(kind, stage, domain_size)


@lru_cache(maxsize=1024)
def _cached_groups(layout: ParallelLayout, axis: str, stage: Optional[int]) -> tuple[tuple[int, ...], ...]:
    return layout._groups(axis, stage)
