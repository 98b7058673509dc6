"""Parallel layout: how ranks are split over data, tensor, pipeline, context and
expert parallelism, and which ranks form each communication group.

Ranks are numbered ``0 .. world-1`` and rank ``r`` runs on device ``r`` of the
cluster (devices are numbered so that devices sharing a scale-up domain are
consecutive). ``order`` lists the mesh axes innermost first: with the default
``tp-cp-ep-dp-pp`` the TP ranks of one group are consecutive, so they land in the
same NVLink domain, and pipeline stages are the outermost (farthest apart) axis.

Expert layout (``expert_mapping``). Which ranks hold which experts is the framework's
choice; stepsim builds the groups as the framework's own code does:

* ``"megatron-core"`` (the default): Megatron-Core's two rank generators over the same
  ranks (``megatron/core/parallel_state.py`` at NVIDIA/Megatron-LM commit d98e8a64,
  ``initialize_model_parallel`` and ``RankGenerator``; "MoE Parallel Folding", Liu et al.
  2025, arXiv 2504.14960). The attention generator decomposes a rank over ``order`` with
  sizes ``tp, cp, ep=1, dp, pp``; the expert generator over the same ``order`` with sizes
  ``tp->etp, cp->1, ep->ep, dp->edp, pp->pp`` where ``edp = world / (etp*ep*pp)``. A group
  along one axis is the ranks that differ only in that axis's digit, in order of it. With
  ``tp: 2, etp: 1, ep: 8`` the EP group is 8 consecutive ranks (one NVLink node), spanning
  the attention's TP ranks ("folded"); with ``etp = tp`` it is the ranks ``tp`` apart, the
  same ranks as carving EP out of data parallelism. Megatron-Core refuses an ``order``
  whose last axis is not ``pp`` when ``pp > 1`` and ``edp != dp``, and expert pipeline
  groups that differ from the attention's; so does stepsim (``parallel.order``).
* ``"deepspeed"``: EP carved out of data parallelism, as DeepSpeed's
  ``deepspeed/utils/groups.py`` (``_get_expert_parallel_ranks``, deepspeedai/DeepSpeed
  commit edaa7221) builds it: the ``dp*cp`` ranks with equal (tp, pp) coordinates, in mesh
  order, cut into consecutive blocks of ``ep``; ranks at the same position of different
  blocks hold the same experts (their expert-data-parallel group, with ``etp = 1`` at
  every TP coordinate too). Needs ``ep`` dividing ``dp*cp`` and ``etp`` 1 or ``tp``.

:attr:`ParallelLayout.folded` says whether the EP group spans the attention's TP ranks (the
expert tensor-parallel group is not the attention's TP group); :attr:`ParallelLayout.routes_sp_shard`
says which MoE dispatcher the trace runs. Megatron-Core's routes each TP rank's sequence-parallel
shard, all-to-alls its assignments over EP and all-gathers them over the expert-TP group, folded
or not (``etp = tp`` too: the expert-TP group is then the TP group); DeepSpeed's mapping gathers
the sequence over TP before the router instead.

Multi-latent attention under TP (``mla_down_proj``). The down projections to the query and KV
latents are small; Megatron-Core has split them two ways over the TP ranks:

* ``"duplicated"`` (the default; Megatron-Core from core_v0.14.0, and at d98e8a64): each rank
  holds the whole down projections (``backend.linear()`` in ``gpt_layer_specs.py``, a
  ``TELinear`` with ``parallel_mode="duplicated"``) and runs them on its own sequence-parallel
  shard; the up projections (column-parallel, sequence-parallel) all-gather only the latents, and
  ``get_query_key_value_tensors`` the shared RoPE key (``multi_latent_attention.py``). Their
  gradients are all-reduced over TP after the step's data-parallel reduction, with the norms' and
  the router's (``finalize_model_grads``, parameters marked ``sequence_parallel``).
* ``"column"`` (core_v0.10.0 through core_v0.13.x): the down projections are column-parallel
  (``TEColumnParallelLinear``): each all-gathers the sequence-parallel hidden states itself,
  computes its share of the latent's columns over the whole sequence, and the latents are
  all-gathered over their columns (``gather_from_tensor_model_parallel_region``) and cut back to
  the shard before the up projections gather them again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np

from workloads.errors import WorkloadError

MESH_AXES = ("tp", "cp", "dp", "pp")
ORDER_AXES = ("tp", "cp", "ep", "dp", "pp")
GROUP_AXES = ("tp", "cp", "dp", "pp", "ep", "edp", "etp", "dp_cp")
EXPERT_AXES = {"tp": "etp", "ep": "ep", "dp": "edp"}  # order names -> the expert generator's axes
EXPERT_MAPPINGS = ("megatron-core", "deepspeed")  # parallel.expert_mapping (module doc)
MLA_DOWN_PROJS = ("duplicated", "column")  # parallel.mla_down_proj (module doc)


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
    pipeline_layers: tuple[int, ...] | str | None = None  # per chunk, or "auto"
    expert_mapping: str = "megatron-core"  # whose rank generator builds the expert groups
    mla_down_proj: str = "duplicated"  # how MLA's down projections are split over TP (module doc)

    def __post_init__(self) -> None:
        for name in ("tp", "cp", "pp", "dp", "ep", "vpp", "etp"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise LayoutError(f"must be a positive integer, got {v!r}", field=f"parallel.{name}")
        if self.zero not in (0, 1, 2, 3):
            raise LayoutError(f"must be one of 0, 1, 2, 3, got {self.zero!r}", field="parallel.zero")
        n = self.tp * self.cp * self.dp
        if n % self.etp:
            raise LayoutError(
                f"must divide tp*cp*dp = {n} (the ranks of a pipeline stage, which the expert layout "
                f"etp x ep x edp reuses), got {self.etp}",
                field="parallel.etp",
            )
        if n % (self.ep * self.etp):
            raise LayoutError(
                f"ep*etp = {self.ep}*{self.etp} must divide tp*cp*dp = {n} (the ranks of a pipeline stage, "
                f"which the expert layout etp x ep x edp reuses), got ep = {self.ep}",
                field="parallel.ep",
            )
        if sorted(self.order) != sorted(ORDER_AXES):
            raise LayoutError(
                f"must name each of {', '.join(ORDER_AXES)} once (innermost first), got {'-'.join(self.order)}",
                field="parallel.order",
            )
        if self.vpp > 1 and self.pp == 1:
            raise LayoutError("virtual stages need pp > 1", field="parallel.vpp")
        if self.expert_mapping not in EXPERT_MAPPINGS:
            raise LayoutError(
                f"must be one of {', '.join(EXPERT_MAPPINGS)}, got {self.expert_mapping!r}",
                field="parallel.expert_mapping",
            )
        if self.mla_down_proj not in MLA_DOWN_PROJS:
            raise LayoutError(
                f"must be one of {', '.join(MLA_DOWN_PROJS)}, got {self.mla_down_proj!r}",
                field="parallel.mla_down_proj",
            )
        if self.expert_mapping == "deepspeed":
            if (self.dp * self.cp) % self.ep:
                raise LayoutError(
                    f"with expert_mapping deepspeed, ep must divide dp*cp = {self.dp * self.cp} (EP is carved out "
                    f"of data parallelism), got {self.ep}",
                    field="parallel.ep",
                )
            if self.etp not in (1, self.tp):
                raise LayoutError(
                    f"with expert_mapping deepspeed, etp must be 1 or tp = {self.tp}, got {self.etp}",
                    field="parallel.etp",
                )
        elif self.pp > 1 and self._expert_mesh_stride("pp") != self._strides["pp"]:
            # parallel_state.py (d98e8a64) asserts "Pipeline parallel groups are expected to
            # be the same for Non-Expert and Expert part"
            raise LayoutError(
                f"puts pp after axes whose expert sizes (etp = {self.etp}, ep = {self.ep}, edp = {self.edp}) "
                f"differ from their attention sizes (tp = {self.tp}, cp = {self.cp}, dp = {self.dp}), so the "
                f"expert layers' pipeline groups would differ from the attention's, which Megatron-Core refuses; "
                f"got {'-'.join(self.order)} (put pp last)",
                field="parallel.order",
            )
        elif self.pp > 1 and self.order[-1] != "pp" and self.edp != self.dp:
            # megatron/core/parallel_state.py (d98e8a64), initialize_model_parallel: "When not
            # using pp-last rank ordering, the data parallel size of the attention and moe
            # layers must be the same"
            raise LayoutError(
                f"with pp > 1 and an expert data-parallel size (edp = {self.edp}) other than dp = {self.dp}, "
                f"the last (outermost) axis must be pp, as Megatron-Core requires; got {'-'.join(self.order)}",
                field="parallel.order",
            )

    # ---- sizes ---------------------------------------------------------------
    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def folded(self) -> bool:
        """Whether MoE tokens leave the attention's tensor-parallel layout for the
        experts (the module doc): under Megatron-Core whenever the expert tensor-parallel
        group is not the attention's TP group (``etp != tp``); under DeepSpeed's mapping
        never (EP is carved out of data parallelism at each TP coordinate)."""
        return self.expert_mapping == "megatron-core" and self.etp != self.tp

    @property
    def routes_sp_shard(self) -> bool:
        """Whether a MoE block routes each TP rank's sequence-parallel shard, all-to-alls its
        assignments over EP and all-gathers them over the expert-TP group before the experts
        (reduce-scatter and all-to-all back after them), as Megatron-Core's dispatchers do
        whatever the expert layout: ``MoEAlltoAllTokenDispatcher.token_permutation`` runs
        ``all_to_all`` over the EP group and then ``gather_from_sequence_parallel_region`` over
        the expert tensor-parallel group, and ``MoELayer.forward`` routes the layer's input as
        it comes, the SP shard (megatron/core/transformer/moe/token_dispatcher.py and
        moe_layer.py, NVIDIA/Megatron-LM core_v0.10.0 through d98e8a64). So under Megatron-Core
        whenever :attr:`folded` or ``tp > 1`` (``etp = tp``: the expert-TP group is the TP
        group); with ``tp = etp = 1`` both dispatchers are the same collectives. Under
        DeepSpeed's mapping the block all-gathers the sequence over TP before the router."""
        return self.folded or (self.expert_mapping == "megatron-core" and self.tp > 1)

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
        if self.expert_mapping == "megatron-core":
            for a, (size, stride) in self._expert_mesh.items():
                c[a] = (rank // stride) % size
            return c
        flat = self._dpcp_index(c)
        c["ep"] = flat % self.ep
        c["edp"] = flat // self.ep
        c["etp"] = c["tp"] if self.etp == self.tp else 0
        return c

    # ---- Megatron-Core's expert rank generator ----------------------------------
    @cached_property
    def _expert_sizes(self) -> tuple[int, ...]:
        """Sizes of the expert generator's axes in ``order`` (innermost first):
        tp -> etp, cp -> 1, ep -> ep, dp -> edp, pp -> pp (megatron/core/parallel_state.py,
        d98e8a64: ``RankGenerator(tp=expert_tensor_parallel_size, ep=..., dp=
        expert_data_parallel_size, pp=..., cp=1, order=order)``)."""
        sizes = {"tp": self.etp, "cp": 1, "ep": self.ep, "dp": self.edp, "pp": self.pp}
        return tuple(sizes[a] for a in self.order)

    def _expert_mesh_stride(self, axis: str) -> int:
        """Stride of order axis ``axis`` in a rank's number under the expert generator."""
        s = 1
        for a, size in zip(self.order, self._expert_sizes):
            if a == axis:
                return s
            s *= size
        raise ValueError(axis)

    @cached_property
    def _expert_mesh(self) -> dict[str, tuple[int, int]]:
        """``axis -> (size, stride)`` of etp, ep and edp in a rank's number under the
        expert generator."""
        out, s = {}, 1
        for a, size in zip(self.order, self._expert_sizes):
            if a in EXPERT_AXES:
                out[EXPERT_AXES[a]] = (size, s)
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

    def groups(self, axis: str, stage: int | None = None) -> list[tuple[int, ...]]:
        """Every distinct group along ``axis`` (optionally only those in pipeline
        ``stage``), in ascending order of their first rank."""
        return list(_cached_groups(self, axis, stage))

    def group_table(self, axis: str) -> np.ndarray:
        """Every group along ``axis`` as the rows of one read-only ``(groups, size)``
        array, each row in ring order (as :meth:`group` gives it), rows in ascending
        order of their smallest rank. Every axis partitions the ranks."""
        return _group_tables(self, axis)[0]

    def group_index(self, axis: str) -> np.ndarray:
        """Row of :meth:`group_table` holding each rank (read-only, length ``world``)."""
        return _group_tables(self, axis)[1]

    def _rank_mesh(self) -> np.ndarray:
        """``ranks[pp, ..., tp]``: the ranks as an array over the mesh axes, one numpy
        axis per mesh axis, the innermost (fastest-varying) last."""
        return np.arange(self.world).reshape([getattr(self, a) for a in reversed(self._mesh_order)])

    def _mesh_axis(self, axis: str) -> int:
        """Numpy axis of mesh axis ``axis`` in :meth:`_rank_mesh`."""
        return len(self._mesh_order) - 1 - self._mesh_order.index(axis)

    def _dpcp_table(self) -> np.ndarray:
        """``members[pp, tp, i]``: the dp*cp ranks of each (pp, tp) slice in mesh order
        (position ``i = inner + inner_size * outer``, inner the one of cp and dp nearer
        the front of ``order``)."""
        inner, outer = ("cp", "dp") if self._mesh_order.index("cp") < self._mesh_order.index("dp") else ("dp", "cp")
        ranks = self._rank_mesh().transpose([self._mesh_axis(a) for a in ("pp", "tp", outer, inner)])
        return ranks.reshape(self.pp, self.tp, self.dp * self.cp)

    def _group_rows(self, axis: str) -> np.ndarray:
        """The groups along ``axis`` as rows in ring order, rows in no particular order
        (the module doc gives the mappings)."""
        if axis in MESH_AXES:
            ranks = self._rank_mesh()
            return np.moveaxis(ranks, self._mesh_axis(axis), -1).reshape(-1, getattr(self, axis))
        if axis not in GROUP_AXES:
            raise ValueError(f"unknown group axis {axis!r}; expected one of {GROUP_AXES}")
        if axis in ("ep", "edp", "etp") and self.expert_mapping == "megatron-core":
            token = {"etp": "tp", "ep": "ep", "edp": "dp"}[axis]
            return orthogonal_groups(self._expert_sizes, (self.order.index(token),))
        if axis == "etp":
            return self._group_rows("tp") if self.etp == self.tp else np.arange(self.world).reshape(-1, 1)
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

    def _groups(self, axis: str, stage: int | None) -> tuple[tuple[int, ...], ...]:
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
    def layers_per_chunk(self, layers: int, chunks: int | None = None, what: str = "", mtp_depth: int = 0) -> list[int]:
        """Transformer layers held by each of ``chunks`` model chunks (default
        ``pp * vpp``), in pipeline order: from ``pipeline_layers`` (explicit, or
        ``"auto"``: as even as possible with lighter first and last chunks, the last lighter
        still by the model's ``mtp_depth`` multi-token-prediction modules,
        :func:`auto_layer_split`), else an even split. ``what`` names the chunking in error
        messages.

        Raises :class:`LayoutError` naming ``parallel.pipeline_layers`` or
        ``parallel.pp`` when the layers cannot be split so."""
        n = self.stages if chunks is None else chunks
        what = what or f"pp*vpp = {self.pp}*{self.vpp}"
        if self.pipeline_layers == "auto":
            return auto_layer_split(layers, n, mtp_depth)
        if self.pipeline_layers is not None:
            pl = list(self.pipeline_layers)
            if len(pl) != n:
                raise LayoutError(
                    f"needs {n} entries (one per model chunk: {what}), got {len(pl)}", field="parallel.pipeline_layers"
                )
            if any((not isinstance(x, int)) or x < 0 for x in pl) or sum(pl) != layers:
                raise LayoutError(
                    f"must be non-negative integers summing to the model's {layers} layers, got {pl}",
                    field="parallel.pipeline_layers",
                )
            return pl
        if layers % n:
            raise LayoutError(
                f"{layers} layers do not split evenly over {n} model chunks ({what}); choose sizes dividing "
                "the layer count, or give parallel.pipeline_layers (a list, or auto)",
                field="parallel.pp",
            )
        return [layers // n] * n

    def chunk_layer_ranges(
        self, layers: int, chunks: int | None = None, what: str = "", mtp_depth: int = 0
    ) -> list[range]:
        """Global layer indices of each model chunk, in pipeline order."""
        out, start = [], 0
        for n in self.layers_per_chunk(layers, chunks, what, mtp_depth):
            out.append(range(start, start + n))
            start += n
        return out


def orthogonal_groups(sizes: tuple[int, ...], axes: tuple[int, ...]) -> np.ndarray:
    """The rank groups of a mixed-radix mesh: ranks numbered with ``sizes`` digits
    (innermost first), one group per setting of the digits not in ``axes``, each row the
    ranks that differ only in the ``axes`` digits, in order of their number along those
    axes (the first of ``axes`` fastest). Rows come in order of the other digits'
    number. This is what Megatron-Core's ``generate_masked_orthogonal_rank_groups``
    returns for the mask that selects ``axes`` (megatron/core/parallel_state.py,
    NVIDIA/Megatron-LM d98e8a64)."""
    n = len(sizes)
    # numpy's C order has the last axis fastest: reverse the digits, outermost first.
    ranks = np.arange(int(np.prod(sizes))).reshape(sizes[::-1])
    inside = [n - 1 - a for a in sorted(axes, reverse=True)]  # masked, outermost first
    outside = [j for j in range(n) if j not in inside]
    size = int(np.prod([sizes[a] for a in axes]))
    return ranks.transpose(outside + inside).reshape(-1, size)


#: Layers' worth of work one multi-token-prediction module adds to the last model chunk: its
#: transformer block and its pass through the shared output head and loss. With it
#: :func:`auto_layer_split` gives every layout of Megatron-Bridge's DeepSeek-V3 table
#: (``set_deepseek_v3_pipeline_model_parallel_layout``, src/megatron/bridge/recipes/deepseek/
#: h100/deepseek_v3.py at v0.6.0: (pp, vpp) = (4, 1) 16/16/16/13, (8, 1) 8 x 7 and 5, 16 chunks
#: 4 x 15 and 1, the embedding before the first chunk's layers, the MTP module and the loss after
#: the last's).
MTP_MODULE_LAYERS = 2


def auto_layer_split(layers: int, chunks: int, mtp_depth: int = 0) -> list[int]:
    """``layers`` over ``chunks`` model chunks as evenly as possible, the extra layers
    going to the middle chunks first, so that the first chunk (which also holds the
    embedding) and the last (the LM head and loss) get the fewer — as Llama 3 does. The
    last chunk also holds the model's ``mtp_depth`` multi-token-prediction modules, each
    counted as :data:`MTP_MODULE_LAYERS` layers in the split and then left out of that chunk
    (never below one layer)."""
    if chunks > layers:
        raise LayoutError(
            f"{chunks} model chunks for {layers} layers: every chunk needs at least one layer",
            field="parallel.pipeline_layers",
        )
    extra = MTP_MODULE_LAYERS * mtp_depth
    order = list(range(1, chunks - 1)) + [0, chunks - 1] if chunks > 2 else list(range(chunks))
    while True:
        base, rem = divmod(layers + extra, chunks)
        split = [base] * chunks
        for i in order[:rem]:
            split[i] += 1
        if split[-1] - extra >= 1 or extra == 0:
            split[-1] -= extra
            return split
        extra -= 1


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


@lru_cache(maxsize=64)
def _group_tuples(layout: ParallelLayout, axis: str) -> tuple[tuple[int, ...], ...]:
    """Every group along ``axis`` as a tuple, once: the ranks of a group share it."""
    return tuple(map(tuple, layout.group_table(axis).tolist()))


@lru_cache(maxsize=1 << 16)
def _cached_group(layout: ParallelLayout, rank: int, axis: str) -> tuple[int, ...]:
    # Each rank's entry is its group's shared tuple, not a copy: a copy per rank held a
    # world-sized tuple for every rank of a data-parallel group as wide as the world (2,304
    # ranks: 83 KB each, 380 MB for three axes of one layout), and a map that simulates
    # hundreds of layouts in one process grew to 8 GB.
    if not 0 <= rank < layout.world:
        raise IndexError(f"rank {rank} outside 0..{layout.world - 1}")
    return _group_tuples(layout, axis)[int(layout.group_index(axis)[rank])]


@lru_cache(maxsize=1 << 16)
def _cached_ep_subgroup(layout: ParallelLayout, rank: int, kind: str, domain_size: int) -> tuple[int, ...]:
    return layout._ep_subgroup(rank, kind, domain_size)


@lru_cache(maxsize=1024)
def _cached_ep_subgroups(
    layout: ParallelLayout, kind: str, stage: int, domain_size: int
) -> tuple[tuple[int, ...], ...]:
    return layout._ep_subgroups(kind, stage, domain_size)


@lru_cache(maxsize=1024)
def _cached_groups(layout: ParallelLayout, axis: str, stage: int | None) -> tuple[tuple[int, ...], ...]:
    return layout._groups(axis, stage)
