"""The ops of one rank, generated from its pipeline schedule's action list (:class:`RankProgram`):
the op helpers (compute, collectives, expert all-to-alls), the schedule's actions in order and the
pipeline sends and receives between stages. The layer-level ops are
:class:`~workloads.trace.program_layers.LayerOps`'s, the data-parallel traffic, optimizer and static
memory :class:`~workloads.trace.program_params.ParamOps`'s; :func:`workloads.trace.builder.build_trace`
runs one program per simulated rank."""

from __future__ import annotations

from workloads import schedules as sched
from workloads.pipeline.ep_overlap import combine_forward_backward
from workloads.trace.ops import Op, collective_op, compute_op, send_op
from workloads.trace.program_layers import LayerOps
from workloads.trace.program_params import ParamOps
from workloads.trace.program_tp_overlap import TpOverlapOps
from workloads.trace.shared import (
    TraceBuilder,
)


class RankProgram:
    """The ops of one rank, generated from its schedule's action list: the op helpers and the
    state its three parts share (composition: each part holds the program as ``p``), the
    layers' ops (:class:`LayerOps`), the parameters' traffic, optimizer and static memory
    (:class:`ParamOps`) and the TP collectives around a block (:class:`TpOverlapOps`)."""

    def __init__(self, b: TraceBuilder, rank: int):
        self.b, self.rank = b, rank
        self.layer_ops, self.param_ops, self.tp_ops = LayerOps(self), ParamOps(self), TpOverlapOps(self)
        L = b.L
        self.c = L.coords(rank)
        self.stage = L.stage_of(rank)
        self.n_local = sched.local_chunks(b.w.schedule, L.vpp)
        self.last_compute: Op | None = None
        self.grad_ops: list[int] = []
        self.param_gather: dict[str, int] = {}  # unit -> op id of its ZeRO-1/2 parameter all-gather
        self.compute_history: list[int] = []  # compute op ids in stream order (ZeRO-3 prefetch window)
        self.deferred_grads: list[tuple[str, int, int, bool]] = []  # reductions held back (no grad overlap)
        self.reduced: list[tuple[str, list[int]]] = []  # (unit, its final reduction's op ids) in issue order
        self.in_pair = False  # building an overlapped pair whose compute shares the SMs with all-to-alls
        self._stage_ranks: dict[int, int] = {}  # pp rank -> this rank's peer there (rank_at_stage)
        self._paths: dict[int, tuple] = {}  # micro-batch -> its path (path)
        self._positions: dict[tuple, int] = {}  # (id(path), local chunk) -> this rank's position on it
        self._groups: dict[str, tuple] = {}  # axis -> this rank's group along it (collective)

    # ---- helpers ---------------------------------------------------------------
    def rank_at_stage(self, pp_rank: int) -> int:
        """The rank with this rank's tp, cp and dp coordinates in pipeline stage ``pp_rank``."""
        hit = self._stage_ranks.get(pp_rank)
        if hit is None:
            c = self.c
            hit = self._stage_ranks[pp_rank] = self.b.L.rank_of(tp=c["tp"], cp=c["cp"], dp=c["dp"], pp=pp_rank)
        return hit

    def path(self, mb: int) -> tuple[tuple[int, int], ...]:
        """Micro-batch ``mb``'s ``(stage, chunk)`` path through the pipeline (one per micro-batch:
        every action of it asks)."""
        hit = self._paths.get(mb)
        if hit is None:
            b = self.b
            hit = self._paths[mb] = tuple(sched.micro_batch_path(b.w.schedule, mb, b.m, b.L.pp, b.L.vpp))
        return hit

    def chunk_index(self, local_chunk: int) -> int:
        """Model chunk (layer group) this rank holds as ``local_chunk``."""
        b = self.b
        return sched.model_chunk(b.w.schedule, self.stage, local_chunk, b.L.pp, b.L.vpp)

    def compute(self, name, kernels, phase, mb, chunk, layer, deps=(), mem=(), recompute=False) -> Op:
        ops = self.b.ops  # TraceBuilder.add, inlined: a step has up to millions of compute ops
        op = compute_op(len(ops), self.rank, name, phase, mb, chunk, layer, tuple(deps), tuple(kernels), tuple(mem),
                        recompute, self.in_pair)  # fmt: skip
        ops.append(op)
        self.last_compute = op
        self.compute_history.append(op.id)
        return op

    def after_compute(self) -> list[int]:
        return [self.last_compute.id] if self.last_compute is not None else []

    def collective(
        self,
        coll,
        axis,
        size,
        name,
        phase,
        mb,
        chunk,
        layer,
        deps,
        stream=None,
        group=None,
        scaleout_fraction: float = 1.0,
    ) -> Op | None:
        if group is not None:
            group = tuple(group)
        else:
            group = self._groups.get(axis)
            if group is None:  # ParallelLayout.group hashes the layout on every call
                group = self._groups[axis] = self.b.L.group(self.rank, axis)
        if len(group) <= 1 or size <= 0:
            return None
        key = f"{axis}:{group[0]}:{name}:{mb}:{chunk}:{phase}"
        if stream is None:
            # expert-TP collectives share the TP stream (tensor-parallel traffic of a block)
            stream = "tp" if axis == "etp" else axis if axis in ("tp", "cp", "ep") else "dp"
        ops = self.b.ops  # TraceBuilder.add, inlined
        op = collective_op(len(ops), self.rank, stream, name, phase, mb, chunk, layer, tuple(deps), coll, axis, group,
                           key, size, scaleout_fraction, self.in_pair and self.b.a2a_beside_compute
                           and coll == "all-to-all")  # fmt: skip
        ops.append(op)
        return op

    def all_to_all(self, size: float, name: str, phase: str, mb: int, k: int, l: int, deps):
        """An expert-parallel all-to-all of ``size`` bytes per rank (tokens x top_k x
        hidden x bytes). Under node-limited routing it is two hops, as DeepSeek-V3
        dispatches (§3.2.2): each token crosses the scale-out network once per
        destination node (to the rank at the same position there), which forwards it
        over NVLink to its experts as it arrives; a combine (and the gradient of a
        dispatch) runs the hops in reverse, which loads the same links. The hops are
        pipelined, so they form one collective whose rail transfers carry
        ``scaleout_fraction`` = (distinct nodes per token) / top_k of the routed copies
        (``hierarchical-a2a`` in :mod:`simulator.network.collectives`)."""
        if self.b.t.moe_token_dispatcher == "allgather":
            return self.allgather_dispatch(name, phase, mb, k, l, deps)
        nl = self.b.node_limited()
        frac = 1.0 if nl is None else min(1.0, nl[0] / self.b.model.moe.top_k)
        return self.collective("all-to-all", "ep", size, name, phase, mb, k, l, deps, scaleout_fraction=frac)

    def allgather_dispatch(self, name: str, phase: str, mb: int, k: int, l: int, deps):
        """What the allgather dispatcher runs where the alltoall dispatcher's all-to-all
        ``name`` would run (``L{l}.dispatch``, ``.combine`` and their ``.bwd``): an all-gather
        over EP (the dispatch and the combine's gradient) or a reduce-scatter (the combine and
        the dispatch's gradient), sized by :meth:`TraceBuilder.allgather_bytes`. The dispatch
        blocks the host until it ends: the dispatcher reads the gathered token counts per
        local expert on the host (``tokens_per_expert ... .cpu()``) before permuting."""
        backward = name.endswith(".bwd")
        gather = name.endswith((".dispatch", ".combine.bwd"))
        coll = "all-gather" if gather else "reduce-scatter"
        op = self.collective(coll, "ep", self.b.allgather_bytes(gather, backward), name, phase, mb, k, l, deps)
        if op is not None and gather and not backward and self.b.t.moe_host_sync:
            op.host_sync = True
        return op

    # ---- program ---------------------------------------------------------------
    def build(self) -> None:
        b, L = self.b, self.b.L
        steps = sched.schedule(b.w.schedule, self.stage, L.pp, b.m, L.vpp)
        if b.global_aux:
            steps = sched.all_forward_first(steps)
        elif b.t.overlap_moe_expert_parallel_comm:  # Megatron-Core's combined 1F1B
            steps = combine_forward_backward(steps)
        flat = [a for st in steps for a in st]
        # The last action touching each local chunk's weight gradients triggers its DP reduction.
        self.last_grad: dict[int, int] = {}
        for i, a in enumerate(flat):
            if a.op in ("B", "W"):
                self.last_grad[a.chunk] = i
        self.action_index = {id(a): i for i, a in enumerate(flat)}
        if L.zero in (1, 2):
            self.param_ops.param_gathers()
        for st in steps:
            self.in_pair = len(st) > 1 and b.ep_overlap
            if self.in_pair:
                # The backward half goes first: its combine gradient is then in flight
                # while the forward half's attention computes (see _interleave).
                st = tuple(sorted(st, key=lambda a: a.op == "F"))
            self._interleave([self.action_ops(a) for a in st])
            self.in_pair = False
        # Without overlap, every gradient reduction starts after the last backward.
        for unit, k, mb, last in self.deferred_grads:
            self.param_ops._grad_sync(unit, k, mb, last, deferred=True)
        if sched.weight_copies(b.w.schedule) > 1:
            self.param_ops.mirror_grad_sync()
        self.param_ops.tp_replicated_grad_sync()
        self.param_ops.tied_embedding_sync()
        self.param_ops.optimizer()

    @staticmethod
    def _interleave(gens: list) -> None:
        """Run the op generators of one step, round robin.

        A lone action's generator is simply drained. An overlapped pair (DualPipe's
        forward and backward of two micro-batches, DeepSeek-V3 §3.2.1, Figure 4)
        alternates between its halves at the points where a half has issued an
        expert all-to-all and would next wait for it (:meth:`layer_forward`,
        :meth:`layer_backward`), or at a layer's end when the layer has no
        all-to-all. With the backward first, the compute stream then runs, per
        pair of MoE layers,

            B: MLP-out grad | F: attention + router | B: experts grad |
            F: experts      | B: router + attention grad | F: MLP out ...

        while the communication stream carries, in the same order, the combine
        gradient, the dispatch, the dispatch gradient and the combine: each
        all-to-all is in flight while the other half computes, and every data
        dependency is kept (an op still waits for the all-to-all it needs)."""
        while gens:
            for g in list(gens):
                try:
                    next(g)
                except StopIteration:
                    gens.remove(g)

    def action_ops(self, a):
        path = self.path(a.mb)
        key = (id(path), a.chunk)  # paths are kept in self._paths: ids stay theirs
        pos = self._positions.get(key)
        if pos is None:
            pos = self._positions[key] = path.index((self.stage, a.chunk))
        layers = self.b.chunks[self.chunk_index(a.chunk)]
        is_last_grad = self.last_grad.get(a.chunk) == self.action_index[id(a)]
        if a.op == "F":
            yield from self.layer_ops.forward(a, path, pos, layers)
        elif a.op in ("B", "I"):
            yield from self.layer_ops.backward(a, path, pos, layers, is_last_grad)
        else:
            yield from self.layer_ops.weight_grad(a, path, pos, layers, is_last_grad)

    def _recv(self, kind: str, path, pos: int, mb: int, deps: list) -> None:
        """Depend on the neighbouring chunk's send (forward: previous chunk; backward: next)."""
        src_pos = pos - 1 if kind == "F" else pos + 1
        src_rank = self.rank_at_stage(path[src_pos][0])
        deps.append((kind, src_pos, mb, src_rank))

    def _send(self, kind: str, path, pos: int, mb: int, after: Op | None = None) -> None:
        """Send the chunk's output on; ``after``: the chunk's own last compute op (in an
        overlapped pair the stream's last op may be the other half's)."""
        b, L = self.b, self.b.L
        after = after or self.last_compute
        nxt = pos + 1 if kind == "F" else pos - 1
        tag = (kind, pos, mb, self.rank)
        if not 0 <= nxt < len(path):
            return
        dst = self.rank_at_stage(path[nxt][0])
        if dst == self.rank:  # the neighbouring chunk lives here too (DualPipe's middle)
            b.tags[tag] = after.id
            return
        size = b.hidden_bytes / (L.tp if L.sequence_parallel else 1)
        ops = b.ops  # TraceBuilder.add, inlined
        key = f"pp:{self.rank}->{dst}:{kind}:{mb}:{pos}"
        op = send_op(len(ops), self.rank, "pp", f"send.{kind}", kind, mb, pos, (after.id,), "pp", key, size, dst)
        ops.append(op)
        b.tags[tag] = op.id
