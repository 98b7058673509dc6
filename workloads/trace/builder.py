"""Build the operation trace of one training step.

:func:`build_trace` turns (model, parallel layout, training settings, pipeline
schedule) into the ops each simulated rank executes:

* per micro-batch and model chunk, forward ops per transformer layer (attention
  block, MLP / MoE block) with their tensor-parallel collectives (all-gather and
  reduce-scatter under sequence parallelism, all-reduce without), context-parallel
  K/V all-gathers, expert-parallel dispatch/combine all-to-alls;
* the matching backward ops in reverse (input-gradient and weight-gradient work
  fused as ``B``, or split as ``I`` then ``W`` for zero-bubble schedules), with
  recomputation ahead of them when asked;
* pipeline sends of activations and gradients between stages;
* data-parallel gradient reduction per parameter unit (layer, embedding, head),
  issued as soon as the last micro-batch's backward of that unit is done (every
  micro-batch's under ZeRO-2/3) so that it overlaps the rest of the backward pass;
  DualPipe's gradient sum between the two ranks holding a stage; the tied-embedding
  sum between first and last stage; ZeRO parameter all-gathers; the optimizer step.

Ranks running the same program on symmetric hardware need not all be built: with
``representatives=True`` (the default) one rank per pipeline stage is built and
stands for its ``world / pp`` twins (see :mod:`simulator.engine.loop` for how their
network traffic is still accounted).

Modelling choices (each documented where it is made):

* Gradients are reduced in fp32 (Megatron-LM's default ``main_grad``), parameters
  gathered in the compute dtype's storage (bf16).
* ZeRO-1/2 parameter all-gathers happen at the start of the step, overlapped with
  the forward pass (Megatron's ``--overlap-param-gather``): the first forward of a
  unit waits for its bucket. ZeRO-3 gathers each unit's parameters before its
  forward and before its backward, for every micro-batch, one unit ahead
  (prefetch). ZeRO-0/1 reduce gradients once after the last micro-batch; ZeRO-2/3
  reduce-scatter them after every micro-batch (see :meth:`_RankProgram._grads_ready`).
* Tensor-parallel collectives block the compute stream (no TP comm overlap).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Optional, Sequence

import numpy as np

from workloads import counts, memory
from workloads import schedules as sched
from workloads.errors import WorkloadError
from workloads.layout import ParallelLayout
from workloads.moe_load import ExpertLoad, hottest_rank, rank_load_factors
from workloads.model import ModelSpec
from workloads.trace.ops import Op, Trace, TraceError
from workloads.training import TrainingSpec

# A trace larger than this is refused rather than simulated for hours: it means a
# scenario with (micro-batches x layers per rank x simulated ranks) in the billions.
MAX_TRACE_OPS = 20_000_000
GRAD_REDUCE_BYTES = 4  # fp32 main gradients (Megatron-LM default, no --grad-reduce-in-bf16); TrainingSpec.grad_bytes
PARAM_BYTES = 2  # bf16 parameter storage (also under FP8 training: FP8 casts are transient)


@dataclass(frozen=True)
class Workload:
    model: ModelSpec
    layout: ParallelLayout
    training: TrainingSpec
    schedule: str = "1f1b"
    expert_load: Optional[ExpertLoad] = None  # routing imbalance (None = perfectly balanced)
    domain_size: int = 0  # devices per scale-up domain (switched networks), 0 = unknown / not switched


# Fraction of a layer's stashed activations an input-gradient pass (``I``) can free;
# the rest (the inputs of the linear layers) stays until the weight-gradient pass
# (``W``) has used it. Korthikanti's GPT table keeps 2+2+2+2+8 = 16 of 34 sbh as
# GEMM inputs (QKV, out-proj, MLP up and down inputs), so about half; the
# zero-bubble paper (Qi et al. 2024, §3) likewise keeps only GEMM inputs for W.
INPUT_GRAD_FREED_FRACTION = 0.5

# Optimizer update traffic per parameter held (bytes read + written), for the
# memory-bound optimizer kernel: Adam reads and writes the fp32 master weight and
# both fp32 moments (24 B), reads the fp32 gradient (4 B) and writes the bf16 weight
# (2 B); Muon and SGD keep one fp32 momentum (16 + 4 + 2 B).
OPTIMIZER_BYTES_PER_PARAM = {"adam": 30.0, "muon": 22.0, "sgd": 22.0}

# CPU optimizer update under offload: memory-bound on host DRAM. A two-socket DDR5
# host streams ~400 GB/s (e.g. 2 x 8 channels x DDR5-4800 = 614 GB/s peak, ~65%
# achieved), shared by its 8 GPUs' updates: ~50 GB/s per device.
HOST_UPDATE_BYTES_PER_S = 50e9


def split_layer_kernels(kernels: Sequence[counts.Kernel]) -> tuple[tuple, tuple, tuple, tuple, tuple]:
    """Split one layer's forward kernels into the groups the trace schedules apart:
    (attention block, pre-dispatch MLP/router work, shared experts, routed experts,
    post-combine work). The attention block is everything before ``mlp_norm``.
    Dense layers put the whole MLP in the second group."""
    names = [k.name for k in kernels]
    cut = names.index("mlp_norm") if "mlp_norm" in names else len(kernels)
    attn = tuple(kernels[:cut])
    rest = list(kernels[cut:])
    if not any(k.name.startswith("expert") for k in rest):
        return attn, tuple(rest), (), (), ()
    pre, shared, expert, post = [], [], [], []
    for k in rest:
        if k.name.startswith("expert"):
            expert.append(k)
        elif k.name.startswith("shared"):
            shared.append(k)
        elif expert or k.name.startswith(("moe_unpermute", "mlp_residual")):
            post.append(k)
        else:
            pre.append(k)
    return attn, tuple(pre), tuple(shared), tuple(expert), tuple(post)


def backward_kernels(fwd: Sequence[counts.Kernel], part: str) -> tuple[counts.Kernel, ...]:
    """Backward kernels of a group of forward kernels (:func:`counts.backward_kernels`).

    ``part``: ``"B"`` both gradients, ``"I"`` the input-gradient kernels (GEMM
    ``.dgrad``, attention, element-wise), ``"W"`` the weight-gradient kernels (GEMM
    ``.wgrad`` and the embedding-table gradient)."""
    out = []
    for k in fwd:
        for bk in counts.backward_kernels(k):
            is_w = bk.name.endswith(".wgrad") or bk.kind == "embedding"
            if part == "B" or (part == "I" and not is_w) or (part == "W" and is_w):
                out.append(bk)
    return tuple(out)


def optimizer_kernels(params: float, zero: int, dp_shards: float, optimizer: str) -> tuple[counts.Kernel, ...]:
    """The optimizer step over the parameters a rank updates (its ZeRO shard when
    ``zero >= 1``): one memory-bound kernel."""
    local = params / dp_shards if zero >= 1 else params
    return (counts.Kernel("optimizer_step", "elementwise", 10.0 * local, OPTIMIZER_BYTES_PER_PARAM[optimizer] * local),)


def representative_ranks(layout: ParallelLayout) -> list[int]:
    """One rank per pipeline stage: the one at tp = cp = dp = 0."""
    return [layout.rank_of(pp=s) for s in range(layout.pp)]


def chunk_layer_ranges(model: ModelSpec, layout: ParallelLayout, schedule: str) -> list[range]:
    """Layers of each model chunk of ``schedule`` (DualPipe cuts ``pp`` chunks, the
    others ``pp * vpp``), per :meth:`ParallelLayout.layers_per_chunk`."""
    n = sched.model_chunks(schedule, layout.pp, layout.vpp)
    return layout.chunk_layer_ranges(model.layers, n, f"pp={layout.pp}, vpp={layout.vpp}, schedule {schedule}")


class TraceBuilder:
    def __init__(self, w: Workload):
        self.w = w
        self.model, self.L, self.t = w.model, w.layout, w.training
        L, t = self.L, self.t
        sched.validate_schedule_args(w.schedule, L.pp, t.micro_batches(L.dp), L.vpp)
        self.m = t.micro_batches(L.dp)
        self.chunks = chunk_layer_ranges(self.model, L, w.schedule)
        self.n_chunks = len(self.chunks)
        self.tokens = t.micro_batch_size * t.seq_len // L.cp  # tokens of one micro-batch on one CP rank
        self.act_bytes = 2
        self.ops: list[Op] = []
        self.notes: list[str] = []
        self._kern_cache: dict = {}
        self._bwd_cache: dict = {}
        self._stash_cache: dict = {}
        # Tags of ops other ranks depend on: ("send", kind, chunk, mb, rank) -> op id.
        self.tags: dict[tuple, int] = {}
        self.pending: list[tuple[Op, tuple]] = []  # ops waiting for tags defined later
        self.global_aux = self.model.is_moe and t.balance == "aux-loss-global"
        # Expert-load imbalance (see workloads.moe_load), per MoE layer: every EP rank's
        # load factor; the slowest rank's sets the time of the layer's expert work and
        # all-to-alls (load_factor), the mean over the ranks the FLOPs the EP group
        # executes (load_mean, 1 unless capacity drops tokens). Empty when balanced.
        self.load_factor: dict[int, float] = {}
        self.load_mean: dict[int, float] = {}
        self.rank_loads: dict[int, np.ndarray] = {}
        if self.model.is_moe and w.expert_load is not None:
            moe_layers = [l for l in range(self.model.layers) if self.model.is_moe_layer(l)]
            routed = self.tokens / (L.tp if L.sequence_parallel else 1) * L.ep
            f = rank_load_factors(
                w.expert_load, self.model.moe.experts, self.model.moe.top_k, L.ep, int(round(routed)), len(moe_layers)
            )
            self.rank_loads = {l: f[i] for i, l in enumerate(moe_layers)}
            self.load_factor = {l: float(f[i].max()) for i, l in enumerate(moe_layers)}
            self.load_mean = {l: float(f[i].mean()) for i, l in enumerate(moe_layers)}
        self._memory_load: dict[int, float] = {}  # layer -> load factor of its stage's hottest device
        if self.global_aux and w.schedule != "gpipe":
            self.notes.append(
                f"balance aux-loss-global: every forward must finish before the first backward "
                f"(batch-level routing statistics); schedule {w.schedule} was run all-forward-first"
                + (
                    "; DualPipe's overlapped forward/backward pairs cannot form (no backward runs while a "
                    "forward is left), so no all-to-all hides behind the other direction's compute"
                    if w.schedule == "dualpipe"
                    else ""
                )
            )
        # DualPipe's overlapped pairs hide expert all-to-alls behind the other chunk's compute.
        self.ep_overlap = self.model.is_moe and L.ep > 1
        self.dualpipe_ep = self.ep_overlap and w.schedule == "dualpipe"

    # ---- kernels -------------------------------------------------------------
    def saved_recompute_kernels(self, layer: int) -> tuple:
        """The forward kernels DeepSeek-V3's activation savings and the recompute
        modules run again before the layer's backward (:func:`memory.recomputed_kernel_names`),
        in forward order."""
        key = ("saved-recompute", layer, self.model.is_moe_layer(layer), self.load_factor.get(layer, 1.0))
        if key not in self._kern_cache:
            names = memory.recomputed_kernel_names(self.t)
            self._kern_cache[key] = tuple(k for part in self.layer_parts(layer) for k in part if k.name in names)
        return self._kern_cache[key]

    def layer_parts(self, layer: int):
        moe = self.model.is_moe_layer(layer)
        factor = self.load_factor.get(layer, 1.0)
        key = ("layer", moe, factor)
        if key not in self._kern_cache:
            L = self.L
            expert_tokens = self.expert_assignments(factor) if moe and factor != 1.0 else None
            ks = counts.layer_kernels(
                self.model,
                layer,
                tokens=self.tokens,
                seq_len=self.t.seq_len,
                tp=L.tp,
                cp=L.cp,
                ep=L.ep,
                etp=L.etp,
                act_bytes=self.act_bytes,
                sequence_parallel=L.sequence_parallel,
                expert_tokens=expert_tokens,
                flash_attention=self.t.flash_attention,
            )
            self._kern_cache[key] = split_layer_kernels(ks)
        return self._kern_cache[key]

    def expert_assignments(self, factor: float) -> float:
        """Token-expert assignments one rank's routed experts process per micro-batch
        at load factor ``factor`` (1 = balanced: the rank's sequence-parallel shard
        times top_k, gathered over the etp ranks)."""
        L = self.L
        routed_rows = self.tokens / L.tp if (L.sequence_parallel and L.tp > 1) else self.tokens
        return routed_rows * self.model.moe.top_k * L.etp * factor

    def memory_load_factors(self, layers: Sequence[int]) -> None:
        """Record, for the MoE layers of one device's chunks, the load factors of the
        EP rank that holds the most routed tokens over them (the device whose
        activations peak highest, :func:`workloads.moe_load.hottest_rank`)."""
        moe = [l for l in layers if l in self.rank_loads]
        if not moe:
            return
        hot = hottest_rank(np.stack([self.rank_loads[l] for l in moe]))
        for l in moe:
            self._memory_load[l] = float(self.rank_loads[l][hot])

    def unexecuted_flops(self) -> dict[int, float]:
        """Per simulated rank: matmul FLOPs its expert ops are timed for (at the
        layer's slowest EP rank's load) that the EP ranks it stands for do not
        execute (they run their own loads, mean ``load_mean``, then wait at the
        combine). :func:`simulator.simulate` leaves them out of HFU."""
        out: dict[int, float] = {}
        if not self.load_factor:
            return out
        cache: dict = {}
        for op in self.ops:
            l = op.layer
            if op.kind != "compute" or l not in self.load_factor or not op.kernels:
                continue
            key = (id(op.kernels), l)
            v = cache.get(key)
            if v is None:
                hot = sum(k.flops for k in op.kernels if k.kind in counts.MATMUL_KINDS and k.name.startswith("expert_"))
                v = cache[key] = hot * (1.0 - self.load_mean[l] / self.load_factor[l])
            if v:
                out[op.rank] = out.get(op.rank, 0.0) + v
        return out

    def scaled(self, kernel: counts.Kernel, f: float) -> counts.Kernel:
        """``kernel`` with ``f`` of its FLOPs and bytes (cached: one object per (kernel, f))."""
        key = ("scaled", id(kernel), f)
        if key not in self._kern_cache:
            executed = None if kernel.executed_flops is None else kernel.executed_flops * f
            self._kern_cache[key] = (
                kernel,
                counts.Kernel(
                    kernel.name,
                    kernel.kind,
                    kernel.flops * f,
                    kernel.bytes * f,
                    kernel.m,
                    kernel.n,
                    kernel.k,
                    kernel.groups,
                    executed,
                ),
            )
        return self._kern_cache[key][1]

    def layer_all(self, layer: int) -> tuple:
        """All forward kernels of a layer as one (cached) tuple."""
        parts = self.layer_parts(layer)
        key = ("all", id(parts))
        if key not in self._kern_cache:
            self._kern_cache[key] = (parts, sum(parts, ()))
        return self._kern_cache[key][1]

    def embed_kernels(self):
        key = ("embed",)
        if key not in self._kern_cache:
            self._kern_cache[key] = tuple(counts.embedding_kernels(self.model, self.tokens, tp=self.L.tp))
        return self._kern_cache[key]

    def head_kernels(self):
        key = ("head",)
        if key not in self._kern_cache:
            L = self.L
            ks = list(counts.head_kernels(self.model, self.tokens, tp=L.tp, sequence_parallel=L.sequence_parallel))
            if self.model.mtp_depth:
                ks += counts.mtp_kernels(
                    self.model,
                    self.tokens,
                    self.t.seq_len,
                    tp=L.tp,
                    cp=L.cp,
                    ep=L.ep,
                    etp=L.etp,
                    sequence_parallel=L.sequence_parallel,
                )
            self._kern_cache[key] = tuple(ks)
        return self._kern_cache[key]

    # ---- sizes ---------------------------------------------------------------
    @property
    def hidden_bytes(self) -> float:
        """Activation tensor of one micro-batch at a layer boundary on one CP rank (all TP ranks)."""
        return self.tokens * self.model.hidden * self.act_bytes

    def kv_bytes(self) -> float:
        """K and V of the local sequence chunk held by one TP rank (what CP exchanges)."""
        m = self.model
        if m.attention is not None:
            per_tok = m.heads * (m.attention.qk_head_dim + m.attention.v_head_dim)
        else:
            per_tok = 2 * m.kv_heads * m.head_dim
        return self.tokens * per_tok * self.act_bytes / self.L.tp

    def dispatch_bytes(self, combine: bool, layer: int) -> float:
        """Per-rank all-to-all send buffer of an MoE dispatch (FP8 under FP8 training,
        as DeepSeek-V3 §3.3 does) or combine (BF16), scaled by the layer's slowest
        expert rank's load factor (see :mod:`workloads.moe_load`)."""
        moe = self.model.moe
        per = 1 if (self.t.dtype == "fp8" and not combine) else 2
        tokens = self.tokens / (self.L.tp if self.L.sequence_parallel else 1)
        return tokens * moe.top_k * self.model.hidden * per * self.load_factor.get(layer, 1.0)

    def node_limited(self) -> Optional[tuple[float, int]]:
        """DeepSeek-V3 node-limited routing (§2.1.2, M = 4 nodes per token) when the
        EP group spans several scale-up domains: ``(expected distinct nodes per token,
        nodes spanned)``, else ``None``. With k of the group's experts chosen
        uniformly over N nodes a token reaches N(1 - (1 - 1/N)^k) distinct nodes on
        average, at most M."""
        return self._node_limited

    @cached_property
    def _node_limited(self) -> Optional[tuple[float, int]]:
        moe, D = self.model.moe, self.w.domain_size
        if moe is None or not moe.max_nodes_per_token or D <= 0 or self.L.ep <= 1:
            return None
        group = self.L.group(0, "ep")
        nodes = len({r // D for r in group})
        if (
            nodes <= 1
            or len(group) % nodes
            or any(len([r for r in group if r // D == n]) != len(group) // nodes for n in {r // D for r in group})
        ):
            return None
        distinct = nodes * (1 - (1 - 1 / nodes) ** moe.top_k)
        return min(float(moe.max_nodes_per_token), distinct), nodes

    def layer_param_split(self, layer: int) -> tuple[float, float]:
        """(dense, expert) parameters of one layer held by one rank: tensor-parallel
        matrices split, norms, routers and MLA down projections replicated, routed
        experts split over ``ep`` and ``etp`` (as :func:`memory.rank_parameter_units`)."""
        L = self.L
        return counts._block_params(self.model, self.model.is_moe_layer(layer), L.tp, L.ep, L.etp)

    def bwd(self, fwd: tuple, part: str) -> tuple:
        """Memoised :func:`backward_kernels` (forward groups are long-lived cached tuples)."""
        key = (id(fwd), part)
        hit = self._bwd_cache.get(key)
        if hit is None:
            hit = self._bwd_cache[key] = (fwd, backward_kernels(fwd, part))
        return hit[1]

    # ---- op helpers ------------------------------------------------------------
    def add(self, **kw) -> Op:
        op = Op(id=len(self.ops), **kw)
        self.ops.append(op)
        return op


def estimated_ops(w: Workload, n_ranks: int) -> float:
    """An upper estimate of the trace's op count (about 12 ops per layer pass)."""
    L = w.layout
    m = w.training.micro_batches(L.dp)
    passes = 3 if w.training.recompute == "full" else 2
    layers_per_rank = (
        w.model.layers * sched.local_chunks(w.schedule, L.vpp) / max(1, sched.model_chunks(w.schedule, L.pp, L.vpp))
    )
    return n_ranks * m * passes * (layers_per_rank + 2) * 12


def build_trace(w: Workload, ranks: Optional[Sequence[int]] = None) -> Trace:
    """Build the step's trace for ``ranks`` (default: one representative per stage).

    Raises :class:`LayoutError` / :class:`ScheduleError` / ``ValueError`` naming the
    scenario field when the workload cannot be laid out."""
    b = TraceBuilder(w)
    L = b.L
    rep = ranks is None
    sim_ranks = representative_ranks(L) if rep else sorted(set(ranks))
    n_est = estimated_ops(w, len(sim_ranks))
    if n_est > MAX_TRACE_OPS:
        raise WorkloadError(
            "training.global_batch_size",
            f"the step would need about {n_est:,.0f} operations "
            f"({b.m} micro-batches x {w.model.layers} layers over {len(sim_ranks)} simulated ranks); "
            f"the limit is {MAX_TRACE_OPS:,}: use fewer micro-batches (larger micro_batch_size) or fewer layers",
        )
    for r in sim_ranks:
        if not 0 <= r < L.world:
            raise TraceError(f"ranks: {r} is outside 0..{L.world - 1}")
    programs = {r: _RankProgram(b, r) for r in sim_ranks}
    for p in programs.values():
        b.memory_load_factors(p.my_layers())
    for p in programs.values():
        p.build()
    # Cross-rank dependencies were recorded as tags; resolve them to op ids now.
    for op in b.ops:
        if any(isinstance(d, tuple) for d in op.deps):
            resolved = []
            for d in op.deps:
                if isinstance(d, tuple):
                    if d not in b.tags:
                        raise TraceError(
                            f"op {op.id} ({op.name} on rank {op.rank}) waits for {d}, which no simulated rank produces"
                        )
                    resolved.append(b.tags[d])
                else:
                    resolved.append(d)
            op.deps = tuple(resolved)
    weight = {r: (L.world // L.pp if rep else 1) for r in sim_ranks}
    static = {r: programs[r].static_memory() for r in sim_ranks}
    return Trace(
        ops=b.ops,
        ranks=tuple(sim_ranks),
        weight=weight,
        static_memory=static,
        world=L.world,
        notes=b.notes,
        model_flops=counts.model_flops_per_step(w.model, w.training),
        representative=rep,
        unexecuted_flops=b.unexecuted_flops(),
    )


class _RankProgram:
    """The ops of one rank, generated from its schedule's action list."""

    def __init__(self, b: TraceBuilder, rank: int):
        self.b, self.rank = b, rank
        L = b.L
        self.c = L.coords(rank)
        self.stage = L.stage_of(rank)
        self.n_local = sched.local_chunks(b.w.schedule, L.vpp)
        self.last_compute: Optional[Op] = None
        self.grad_ops: list[int] = []
        self.param_gather: dict[str, int] = {}  # unit -> op id of its ZeRO-1/2 parameter all-gather
        self.compute_history: list[int] = []  # compute op ids in stream order (ZeRO-3 prefetch window)
        self.deferred_grads: list[tuple[str, int, int, bool]] = []  # reductions held back (no grad overlap)
        self.reduced: list[tuple[str, list[int]]] = []  # (unit, its final reduction's op ids) in issue order
        self.in_pair = False  # building an overlapped pair whose compute shares the SMs with all-to-alls

    # ---- helpers ---------------------------------------------------------------
    def rank_at_stage(self, pp_rank: int) -> int:
        c = self.c
        return self.b.L.rank_of(tp=c["tp"], cp=c["cp"], dp=c["dp"], pp=pp_rank)

    def path(self, mb: int) -> tuple[tuple[int, int], ...]:
        b = self.b
        return sched.micro_batch_path(b.w.schedule, mb, b.m, b.L.pp, b.L.vpp)

    def chunk_index(self, local_chunk: int) -> int:
        """Model chunk (layer group) this rank holds as ``local_chunk``."""
        b = self.b
        return sched.model_chunk(b.w.schedule, self.stage, local_chunk, b.L.pp, b.L.vpp)

    def compute(self, name, kernels, phase, mb, chunk, layer, deps=(), mem=(), recompute=False) -> Op:
        op = self.b.add(
            rank=self.rank,
            stream="compute",
            kind="compute",
            name=name,
            phase=phase,
            mb=mb,
            chunk=chunk,
            layer=layer,
            deps=tuple(deps),
            kernels=tuple(kernels),
            mem=tuple(mem),
            recompute=recompute,
            comm_overlap=self.in_pair,
        )
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
    ) -> Optional[Op]:
        L = self.b.L
        group = tuple(group) if group is not None else L.group(self.rank, axis)
        if len(group) <= 1 or size <= 0:
            return None
        key = f"{axis}:{group[0]}:{name}:{mb}:{chunk}:{phase}"
        if stream is None:
            # expert-TP collectives share the TP stream (tensor-parallel traffic of a block)
            stream = "tp" if axis == "etp" else axis if axis in ("tp", "cp", "ep") else "dp"
        return self.b.add(
            rank=self.rank,
            stream=stream,
            kind="collective",
            name=name,
            phase=phase,
            mb=mb,
            chunk=chunk,
            layer=layer,
            deps=tuple(deps),
            coll=coll,
            axis=axis,
            group=group,
            key=key,
            size_bytes=size,
            scaleout_fraction=scaleout_fraction,
        )

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
        nl = self.b.node_limited()
        frac = 1.0 if nl is None else min(1.0, nl[0] / self.b.model.moe.top_k)
        return self.collective("all-to-all", "ep", size, name, phase, mb, k, l, deps, scaleout_fraction=frac)

    # ---- program ---------------------------------------------------------------
    def build(self) -> None:
        b, L = self.b, self.b.L
        steps = sched.schedule(b.w.schedule, self.stage, L.pp, b.m, L.vpp)
        if b.global_aux:
            steps = sched.all_forward_first(steps)
        flat = [a for st in steps for a in st]
        # The last action touching each local chunk's weight gradients triggers its DP reduction.
        self.last_grad: dict[int, int] = {}
        for i, a in enumerate(flat):
            if a.op in ("B", "W"):
                self.last_grad[a.chunk] = i
        self.action_index = {id(a): i for i, a in enumerate(flat)}
        if L.zero in (1, 2):
            self.param_gathers()
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
            self._grad_sync(unit, k, mb, last, deferred=True)
        if sched.weight_copies(b.w.schedule) > 1:
            self.mirror_grad_sync()
        self.tied_embedding_sync()
        self.optimizer()

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
        pos = path.index((self.stage, a.chunk))
        layers = self.b.chunks[self.chunk_index(a.chunk)]
        is_last_grad = self.last_grad.get(a.chunk) == self.action_index[id(a)]
        if a.op == "F":
            yield from self.forward(a, path, pos, layers)
        elif a.op in ("B", "I"):
            yield from self.backward(a, path, pos, layers, is_last_grad)
        else:
            yield from self.weight_grad(a, path, pos, layers, is_last_grad)

    def _recv(self, kind: str, path, pos: int, mb: int, deps: list) -> None:
        """Depend on the neighbouring chunk's send (forward: previous chunk; backward: next)."""
        src_pos = pos - 1 if kind == "F" else pos + 1
        src_rank = self.rank_at_stage(path[src_pos][0])
        deps.append((kind, src_pos, mb, src_rank))

    def _send(self, kind: str, path, pos: int, mb: int, after: Optional[Op] = None) -> None:
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
        op = b.add(
            rank=self.rank,
            stream="pp",
            kind="send",
            name=f"send.{kind}",
            phase=kind,
            mb=mb,
            chunk=pos,
            deps=(after.id,),
            peer=dst,
            size_bytes=size,
            axis="pp",
            key=f"pp:{self.rank}->{dst}:{kind}:{mb}:{pos}",
        )
        b.tags[tag] = op.id

    # ---- forward ---------------------------------------------------------------
    def forward(self, a, path, pos, layers):
        b = self.b
        deps: list = []
        own = None  # this action's last compute op
        if pos > 0:
            self._recv("F", path, pos, a.mb, deps)
        else:
            own = self.compute(
                "embed.F", b.embed_kernels(), "F", a.mb, pos, -1, deps=self._params_for("embed", a.mb, pos, "F")
            )
        for l in layers:
            deps += self._params_for(f"L{l}", a.mb, pos, "F")
            handed = yield from self.layer_forward(l, a.mb, pos, deps, recompute=False)
            own = self.last_compute
            deps = []
            if not handed:
                yield  # no all-to-all to hand over at: hand over at the layer's end
        if pos == len(path) - 1:
            head = own = self.compute(
                "head.F",
                b.head_kernels(),
                "F",
                a.mb,
                pos,
                -1,
                deps=self._params_for("head", a.mb, pos, "F"),
                mem=(("activations", self._head_bytes(), "start"),),
            )
            b.tags[("HEAD", a.mb, self.rank)] = head.id
        self._send("F", path, pos, a.mb, after=own)

    def _head_bytes(self) -> float:
        """Activations the last chunk's head op keeps: output layer and MTP modules."""
        b, L, t = self.b, self.b.L, self.b.t
        key = ("head", "stash")
        if key not in b._stash_cache:
            kw = dict(tp=L.tp, cp=L.cp, sequence_parallel=L.sequence_parallel)
            b._stash_cache[key] = memory.head_activation_bytes(
                b.model, t.micro_batch_size, t.seq_len, **kw
            ) + memory.mtp_activation_bytes(
                b.model,
                t.micro_batch_size,
                t.seq_len,
                recompute=t.recompute,
                ep=L.ep,
                etp=L.etp,
                **memory.activation_options(t),
                **kw,
            )
        return b._stash_cache[key]

    def layer_forward(self, l: int, mb: int, k: int, deps: list, recompute: bool):
        """Generate one layer's forward ops (or its recomputation). A generator: it
        yields wherever it has issued an expert all-to-all and its next op would wait
        for it (an overlapped pair hands over to its other half there, see
        :meth:`_interleave`), and returns how many times it yielded."""
        b, L = self.b, self.b.L
        handed = 0
        attn, pre, shared, expert, post = b.layer_parts(l)
        phase = "R" if recompute else "F"
        sp = L.sequence_parallel
        h = b.hidden_bytes
        deps = list(deps)
        # Attention block: [TP all-gather] [CP K/V all-gather] compute, TP reduce-scatter/all-reduce.
        if sp:
            ag = self.collective("all-gather", "tp", h, f"L{l}.attn.ag", phase, mb, k, l, deps + self.after_compute())
            deps = [ag.id] if ag else deps
        if recompute:
            mem = (("activations", self._recompute_transient(l), "start"),)
        else:
            mem = (("activations", self._stash(l), "end"),)
        if L.cp > 1:
            op = self.cp_attention(l, attn, phase, mb, k, deps, mem, recompute)
        else:
            op = self.compute(f"L{l}.attn.{phase}", attn, phase, mb, k, l, deps=deps, mem=mem, recompute=recompute)
        out = self.collective(
            "reduce-scatter" if sp else "all-reduce", "tp", h, f"L{l}.attn.out", phase, mb, k, l, [op.id]
        )
        deps = [out.id] if out else []
        if expert and L.folded:
            handed = yield from self.folded_moe_forward(l, mb, k, deps, phase, recompute)
            self._offload_stash(l, mb, k, recompute)
            return handed
        if sp and out:
            ag = self.collective("all-gather", "tp", h, f"L{l}.mlp.ag", phase, mb, k, l, deps)
            deps = [ag.id] if ag else deps
        op = self.compute(f"L{l}.mlp.{phase}", pre, phase, mb, k, l, deps=deps, recompute=recompute)
        if expert:
            d = self.all_to_all(b.dispatch_bytes(False, l), f"L{l}.dispatch", phase, mb, k, l, [op.id])
            if shared:  # shared experts run while the dispatch is in flight
                self.compute(f"L{l}.shared.{phase}", shared, phase, mb, k, l, recompute=recompute)
            if d:
                handed += 1
                yield
            op = self.compute(
                f"L{l}.experts.{phase}", expert, phase, mb, k, l, deps=[d.id] if d else [], recompute=recompute
            )
            c = self.all_to_all(b.dispatch_bytes(True, l), f"L{l}.combine", phase, mb, k, l, [op.id])
            if c:
                handed += 1
                yield
            op = self.compute(
                f"L{l}.moe_out.{phase}", post, phase, mb, k, l, deps=[c.id] if c else [], recompute=recompute
            )
        out = self.collective(
            "reduce-scatter" if sp else "all-reduce", "tp", h, f"L{l}.mlp.out", phase, mb, k, l, [op.id]
        )
        if out:
            # The next layer's compute waits for this collective: a zero-cost join on
            # the compute stream carries the dependency in stream order.
            self.compute(f"L{l}.join", (), phase, mb, k, l, deps=[out.id])
        self._offload_stash(l, mb, k, recompute)
        return handed

    def _offload_stash(self, l: int, mb: int, k: int, recompute: bool) -> None:
        """Activation offload: copy layer ``l``'s stash to the host after its forward."""
        if self.b.t.offload_activations and not recompute:
            stash = self._stash(l)
            self.host(
                f"L{l}.act.d2h",
                stash,
                "F",
                deps=self.after_compute(),
                mb=mb,
                chunk=k,
                layer=l,
                mem=(("activations", -stash, "end"),),
            )

    # ---- MoE block under a folded expert layout ---------------------------------------
    # With MoE Parallel Folding (see workloads.layout) the EP group may span the TP
    # ranks, so tokens leave the attention's TP layout for the experts. Megatron-Core's
    # all-to-all dispatcher (megatron/core/transformer/moe/token_dispatcher.py,
    # MoEAlltoAllTokenDispatcher) routes the sequence-parallel shard each TP rank holds
    # after the attention block's reduce-scatter ([S/TP, B, H]): no TP all-gather before
    # the router; all-to-all over the (folded) EP group; all-gather over the expert-TP
    # group (``gather_from_sequence_parallel_region`` on the ETP group) before the expert
    # GEMMs (each ETP rank computes 1/etp of every expert's width over the assignments
    # of its etp ranks) and reduce-scatter over it after them; all-to-all back, and the
    # output is again the SP shard, so no TP reduce-scatter follows. Shared experts keep
    # the attention's TP split ("the parallelism patterns of the shared experts follow
    # the settings of the dense part", megatron/core/transformer/moe/README.md): a TP
    # all-gather of the block input before them and a reduce-scatter of their output.

    def etp_bytes(self, combine: bool, layer: int) -> float:
        """Expert-TP all-gather (dispatch) / reduce-scatter (combine) of a folded MoE
        block: the assignments of the ``etp`` ranks, in the all-to-all's precision."""
        return self.b.dispatch_bytes(combine, layer) * self.b.L.etp

    def folded_moe_forward(self, l: int, mb: int, k: int, deps: list, phase: str, recompute: bool):
        """One folded MoE block's forward (after the attention block's TP collective,
        ``deps``); yields like :meth:`layer_forward` after each all-to-all."""
        b = self.b
        _, pre, shared, expert, post = b.layer_parts(l)
        h, handed = b.hidden_bytes, 0
        op = self.compute(f"L{l}.mlp.{phase}", pre, phase, mb, k, l, deps=deps, recompute=recompute)
        d = self.all_to_all(b.dispatch_bytes(False, l), f"L{l}.dispatch", phase, mb, k, l, [op.id])
        wait = [d.id] if d else []
        if shared:  # shared experts run while the dispatch is in flight
            ag = self.collective("all-gather", "tp", h, f"L{l}.shared.ag", phase, mb, k, l, [op.id])
            sh = self.compute(
                f"L{l}.shared.{phase}", shared, phase, mb, k, l, deps=[ag.id] if ag else [], recompute=recompute
            )
            rs = self.collective("reduce-scatter", "tp", h, f"L{l}.shared.rs", phase, mb, k, l, [sh.id])
            wait += [rs.id] if rs else []
        if d:
            handed += 1
            yield
        ag = self.collective("all-gather", "etp", self.etp_bytes(False, l), f"L{l}.experts.ag", phase, mb, k, l, wait)
        op = self.compute(
            f"L{l}.experts.{phase}", expert, phase, mb, k, l, deps=[ag.id] if ag else wait, recompute=recompute
        )
        rs = self.collective(
            "reduce-scatter", "etp", self.etp_bytes(True, l), f"L{l}.experts.rs", phase, mb, k, l, [op.id]
        )
        c = self.all_to_all(b.dispatch_bytes(True, l), f"L{l}.combine", phase, mb, k, l, [rs.id if rs else op.id])
        if c:
            handed += 1
            yield
        self.compute(f"L{l}.moe_out.{phase}", post, phase, mb, k, l, deps=[c.id] if c else [], recompute=recompute)
        return handed

    def folded_moe_backward(self, l: int, mb: int, k: int, deps: list, part: str):
        """One folded MoE block's backward (the reverse of :meth:`folded_moe_forward`),
        down to the router's gradient; yields like :meth:`layer_backward`."""
        b = self.b
        _, pre, shared, expert, post = b.layer_parts(l)
        h, handed = b.hidden_bytes, 0
        op = self.compute(f"L{l}.moe_out.{part}", self.b.bwd(post, part), part, mb, k, l, deps=deps)
        c = self.all_to_all(b.dispatch_bytes(True, l), f"L{l}.combine.bwd", part, mb, k, l, [op.id])
        wait = [c.id] if c else []
        if shared:  # overlaps the combine's backward all-to-all
            ag = self.collective("all-gather", "tp", h, f"L{l}.shared.rs.bwd", part, mb, k, l, [op.id])
            sh = self.compute(
                f"L{l}.shared.{part}", self.b.bwd(shared, part), part, mb, k, l, deps=[ag.id] if ag else []
            )
            rs = self.collective("reduce-scatter", "tp", h, f"L{l}.shared.ag.bwd", part, mb, k, l, [sh.id])
            wait += [rs.id] if rs else []
        if c:
            handed += 1
            yield
        split = part == "B" and b.dualpipe_ep  # see layer_backward
        ag = self.collective("all-gather", "etp", self.etp_bytes(True, l), f"L{l}.experts.rs.bwd", part, mb, k, l, wait)
        op = self.compute(
            f"L{l}.experts.{part}",
            self.b.bwd(expert, "I" if split else part),
            part,
            mb,
            k,
            l,
            deps=[ag.id] if ag else wait,
        )
        rs = self.collective(
            "reduce-scatter", "etp", self.etp_bytes(True, l), f"L{l}.experts.ag.bwd", part, mb, k, l, [op.id]
        )
        d = self.all_to_all(b.dispatch_bytes(True, l), f"L{l}.dispatch.bwd", part, mb, k, l, [rs.id if rs else op.id])
        if split:
            self.compute(f"L{l}.experts_w.{part}", self.b.bwd(expert, "W"), part, mb, k, l)
        if d:
            handed += 1
            yield
        self.compute(f"L{l}.mlp.{part}", self.b.bwd(pre, part), part, mb, k, l, deps=[d.id] if d else [])
        return handed

    def _prefetch(self, l: int, mb: int, k: int) -> list[int]:
        """Activation offload: bring layer ``l``'s stash back to HBM before its backward."""
        if not self.b.t.offload_activations:
            return []
        stash = self._stash(l)
        op = self.host(f"L{l}.act.h2d", stash, "B", mb=mb, chunk=k, layer=l, mem=(("activations", stash, "start"),))
        return [op.id]

    def cp_attention(self, l, attn, phase, mb, k, deps, mem, recompute) -> Op:
        """Attention under context parallelism. The QKV projection runs first; its K
        and V are then exchanged over the CP group. ``ring`` (ring attention, Liu et
        al. 2023, arXiv 2310.01889, as Megatron-Core's CP runs it): attention over
        the local K/V block (1/cp of the core) proceeds while the other blocks
        circulate, and the remaining (cp-1)/cp of the core waits for them.
        ``all-gather``: the whole core waits for the gathered K/V."""
        b, L = self.b, self.b.L
        names = [x.name for x in attn]
        cut = names.index("attn_core")
        proj, core, rest = attn[:cut], attn[cut], attn[cut + 1 :]
        op = self.compute(f"L{l}.attn_qkv.{phase}", proj, phase, mb, k, l, deps=deps, recompute=recompute)
        kv = self.collective("all-gather", "cp", b.kv_bytes() * L.cp, f"L{l}.attn.kv_ag", phase, mb, k, l, [op.id])
        wait = [kv.id] if kv else []
        if b.t.cp_algorithm == "ring":
            local = b.scaled(core, 1.0 / L.cp)
            self.compute(f"L{l}.attn_local.{phase}", (local,), phase, mb, k, l, recompute=recompute)
            remote = (b.scaled(core, (L.cp - 1) / L.cp),) + tuple(rest)
        else:
            remote = (core,) + tuple(rest)
        return self.compute(f"L{l}.attn.{phase}", remote, phase, mb, k, l, deps=wait, mem=mem, recompute=recompute)

    def _stash(self, l: int) -> float:
        b = self.b
        key = (l, "stash")
        if key not in b._stash_cache:
            b._stash_cache[key] = self._stash_uncached(l)
        return b._stash_cache[key]

    def _expert_tokens(self, l: int) -> Optional[float]:
        """Routed-token assignments layer ``l``'s activations hold on the stage's most
        loaded device under expert-load imbalance (None: balanced)."""
        f = self.b._memory_load.get(l)
        return None if f is None else self.b.expert_assignments(f)

    def _stash_uncached(self, l: int) -> float:
        b, L, t = self.b, self.b.L, self.b.t
        return memory.activation_bytes_per_layer(
            b.model,
            l,
            t.micro_batch_size,
            t.seq_len,
            tp=L.tp,
            cp=L.cp,
            sequence_parallel=L.sequence_parallel,
            recompute=t.recompute,
            ep=L.ep,
            etp=L.etp,
            expert_tokens=self._expert_tokens(l),
            **memory.activation_options(t),
        )

    def _recompute_transient(self, l: int) -> float:
        """Activations rebuilt by full recomputation of one layer, alive until its backward ends."""
        b, L, t = self.b, self.b.L, self.b.t
        return memory.activation_bytes_per_layer(
            b.model,
            l,
            t.micro_batch_size,
            t.seq_len,
            tp=L.tp,
            cp=L.cp,
            sequence_parallel=L.sequence_parallel,
            recompute="none",
            ep=L.ep,
            etp=L.etp,
            expert_tokens=self._expert_tokens(l),
            **memory.activation_options(t),
        )

    # ---- backward --------------------------------------------------------------
    def backward(self, a, path, pos, layers, is_last_grad):
        b, t = self.b, self.b.t
        part = a.op
        deps: list = []
        own = None  # this action's last compute op
        if b.global_aux:
            # Every micro-batch's loss (its head op, on the last rank of its own path:
            # DualPipe's two directions end on opposite ranks) before any backward.
            deps += [("HEAD", j, self.rank_at_stage(self.path(j)[-1][0])) for j in range(b.m)]
        if pos < len(path) - 1:
            self._recv("B", path, pos, a.mb, deps)
        else:
            deps += self._zero3_gather("head", a.mb, pos, part)
            own = self.compute(
                "head." + part,
                self.b.bwd(b.head_kernels(), part),
                part,
                a.mb,
                pos,
                -1,
                deps=deps,
                mem=(("activations", -self._head_bytes(), "end"),),
            )
            deps = []
            if part == "B":
                self._grads_ready("head", pos, a.mb, is_last_grad)
        rev = list(reversed(layers))
        fetched = {rev[0]: self._prefetch(rev[0], a.mb, pos)} if rev else {}
        for i, l in enumerate(rev):
            deps += self._zero3_gather(f"L{l}", a.mb, pos, part) + fetched.pop(l, [])
            if i + 1 < len(rev):  # prefetch one layer ahead
                fetched[rev[i + 1]] = self._prefetch(rev[i + 1], a.mb, pos)
            handed = 0
            if t.recompute == "full":
                handed += yield from self.layer_forward(l, a.mb, pos, deps, recompute=True)
                deps = []
            handed += yield from self.layer_backward(l, a.mb, pos, deps, part, is_last_grad)
            own = self.last_compute
            deps = []
            if not handed:
                yield
        if pos == 0:
            own = self.compute(
                "embed." + part,
                self.b.bwd(b.embed_kernels(), part),
                part,
                a.mb,
                pos,
                -1,
                deps=self._zero3_gather("embed", a.mb, pos, part),
            )
            if part == "B":
                self._grads_ready("embed", pos, a.mb, is_last_grad)
        self._send("B", path, pos, a.mb, after=own)

    def layer_backward(self, l, mb, k, deps, part, is_last_grad):
        """Generate one layer's backward ops; yields and returns like :meth:`layer_forward`."""
        b, L, t = self.b, self.b.L, self.b.t
        handed = 0
        attn, pre, shared, expert, post = b.layer_parts(l)
        sp = L.sequence_parallel
        h = b.hidden_bytes
        deps = list(deps)
        if part in ("B", "I") and memory.recomputed_kernel_names(t):
            # the norms, MLA up-projections and SwiGLUs whose outputs were not kept
            redo = b.saved_recompute_kernels(l)
            if redo:
                op = self.compute(f"L{l}.recompute.R", redo, "R", mb, k, l, deps=deps, recompute=True)
                deps = [op.id]
        # Reverse of the forward: the gradient of a reduce-scatter is an all-gather and vice versa.
        if expert and L.folded:
            handed += yield from self.folded_moe_backward(l, mb, k, deps + self.after_compute(), part)
            ag = (
                self.collective("all-gather", "tp", h, f"L{l}.attn.out.bwd", part, mb, k, l, self.after_compute())
                if sp
                else None
            )
            deps = [ag.id] if ag else []
            self._attention_backward(l, mb, k, deps, part, attn, is_last_grad)
            return handed
        if sp:
            ag = self.collective(
                "all-gather", "tp", h, f"L{l}.mlp.out.bwd", part, mb, k, l, deps + self.after_compute()
            )
            deps = [ag.id] if ag else deps
        if expert:
            op = self.compute(f"L{l}.moe_out.{part}", self.b.bwd(post, part), part, mb, k, l, deps=deps)
            c = self.all_to_all(b.dispatch_bytes(True, l), f"L{l}.combine.bwd", part, mb, k, l, [op.id])
            if shared:  # overlaps the combine's backward all-to-all
                self.compute(f"L{l}.shared.{part}", self.b.bwd(shared, part), part, mb, k, l)
            if c:
                handed += 1
                yield
            # DualPipe splits a backward chunk's MLP into input- and weight-gradient parts
            # (DeepSeek-V3 §3.2.1, Figure 4's "MLP(B)" then "MLP(W)"): the experts' input
            # gradient is computed and sent back (the dispatch's gradient), and their
            # weight gradient computes while it is in flight.
            split = part == "B" and b.dualpipe_ep
            op = self.compute(
                f"L{l}.experts.{part}",
                self.b.bwd(expert, "I" if split else part),
                part,
                mb,
                k,
                l,
                deps=[c.id] if c else [],
            )
            d = self.all_to_all(b.dispatch_bytes(True, l), f"L{l}.dispatch.bwd", part, mb, k, l, [op.id])
            deps = [d.id] if d else []
            if split:
                self.compute(f"L{l}.experts_w.{part}", self.b.bwd(expert, "W"), part, mb, k, l)
            if d:
                handed += 1
                yield
        op = self.compute(f"L{l}.mlp.{part}", self.b.bwd(pre, part), part, mb, k, l, deps=deps)
        out = self.collective(
            "reduce-scatter" if sp else "all-reduce", "tp", h, f"L{l}.mlp.ag.bwd", part, mb, k, l, [op.id]
        )
        deps = [out.id] if out else []
        if sp and out:
            ag = self.collective("all-gather", "tp", h, f"L{l}.attn.out.bwd", part, mb, k, l, deps)
            deps = [ag.id] if ag else deps
        self._attention_backward(l, mb, k, deps, part, attn, is_last_grad)
        return handed

    def _attention_backward(self, l, mb, k, deps, part, attn, is_last_grad):
        """The attention block's backward (after the gradient reached the block's
        output, ``deps``) and the layer's gradient hand-off."""
        b, L, t = self.b, self.b.L, self.b.t
        sp, h = L.sequence_parallel, b.hidden_bytes
        free = -self._stash(l)
        if part == "I":
            free *= INPUT_GRAD_FREED_FRACTION
        mem = [("activations", free, "end")]
        if t.recompute == "full":
            mem.append(("activations", -self._recompute_transient(l), "end"))
        op = self.compute(f"L{l}.attn.{part}", self.b.bwd(attn, part), part, mb, k, l, deps=deps, mem=tuple(mem))
        if L.cp > 1:
            self.collective("reduce-scatter", "cp", b.kv_bytes() * L.cp, f"L{l}.attn.dkv_rs", part, mb, k, l, [op.id])
        out = self.collective(
            "reduce-scatter" if sp else "all-reduce", "tp", h, f"L{l}.attn.ag.bwd", part, mb, k, l, [op.id]
        )
        if out:
            self.compute(f"L{l}.join", (), part, mb, k, l, deps=[out.id])
        if part == "B":
            self._grads_ready(f"L{l}", k, mb, is_last_grad)

    def weight_grad(self, a, path, pos, layers, is_last_grad):
        b = self.b
        if pos == len(path) - 1:  # the LM head's (and MTP modules') weight-gradient GEMMs
            self.compute("head.W", self.b.bwd(b.head_kernels(), "W"), "W", a.mb, pos, -1)
            self._grads_ready("head", pos, a.mb, is_last_grad)
        for l in reversed(layers):
            kern = self.b.bwd(b.layer_all(l), "W")
            free = -self._stash(l) * (1 - INPUT_GRAD_FREED_FRACTION)
            self.compute(f"L{l}.W", kern, "W", a.mb, pos, l, mem=(("activations", free, "end"),))
            self._grads_ready(f"L{l}", pos, a.mb, is_last_grad)
            yield
        if pos == 0:
            self.compute("embed.W", self.b.bwd(b.embed_kernels(), "W"), "W", a.mb, pos, -1)
            self._grads_ready("embed", pos, a.mb, is_last_grad)

    # ---- data-parallel gradient and parameter traffic --------------------------------
    # Parameters move in units (one bucket each): every transformer layer, the
    # embedding table (first chunk) and the head (last chunk: final norm, output
    # projection or the tied table's copy, MTP modules), as
    # :func:`memory.rank_parameter_units` cuts them.
    @cached_property
    def units(self) -> dict[str, tuple[float, float]]:
        """``unit name -> (dense, expert)`` parameters this rank holds."""
        b, L = self.b, self.b.L
        own = [self.chunk_index(c) for c in range(self.n_local)]
        return {
            name: (float(d), float(e))
            for name, d, e in memory.rank_parameter_units(
                b.model, L, self.my_layers(), has_embedding=0 in own, has_head=b.n_chunks - 1 in own
            )
        }

    def unit_order(self) -> list[str]:
        """The units in forward order over the rank's local chunks."""
        out = []
        for c in range(self.n_local):
            k = self.chunk_index(c)
            if k == 0:
                out.append("embed")
            out += [f"L{l}" for l in self.b.chunks[k]]
            if k == self.b.n_chunks - 1:
                out.append("head")
        return [u for u in out if u in self.units]

    @staticmethod
    def _unit_layer(unit: str) -> int:
        return int(unit[1:]) if unit.startswith("L") else -1

    def _grad_coll(self) -> str:
        return "all-reduce" if self.b.L.zero == 0 else "reduce-scatter"

    def _grads_ready(self, unit: str, k: int, mb: int, is_last_grad: bool) -> None:
        """A backward pass has produced ``unit``'s gradients for micro-batch ``mb``.

        ZeRO-0/1 reduce once, after the last micro-batch (Megatron-LM accumulates into
        a full-size fp32 buffer, then all-reduces or reduce-scatters it). ZeRO-2 and
        ZeRO-3 reduce-scatter after *every* micro-batch's backward and keep only the
        shard, which is what their sharded gradient memory assumes: DeepSpeed stage 2
        "communicates during non gradient accumulation boundaries as well"
        (deepspeedai/DeepSpeed PR #338, ``allreduce_gradients``), and PyTorch FSDP
        reduce-scatters in every micro-batch's backward unless told not to
        (pytorch/pytorch PR #126166: "FSDP2 offers (1) [reduce-scatter per microbatch
        backward, storing the sharded gradients] without any intervention")."""
        per_mb = self.b.L.zero >= 2
        if is_last_grad or per_mb:
            self._grad_sync(unit, k, mb if per_mb else -1, is_last_grad)

    def _grad_sync(self, unit: str, k: int, mb: int, last: bool, deferred: bool = False) -> None:
        if unit not in self.units:
            return
        if not self.b.t.overlap_grad_reduce and not deferred:
            self.deferred_grads.append((unit, k, mb, last))
            return
        dense, expert = self.units[unit]
        dep = self.after_compute()
        ids = []
        for axis, p, nm in (("dp_cp", dense, "grad"), ("edp", expert, "egrad")):
            op = self.collective(
                self._grad_coll(),
                axis,
                p * self.b.t.grad_bytes,
                f"{unit}.{nm}",
                "sync",
                mb,
                k,
                self._unit_layer(unit),
                dep,
                stream="dp",
            )
            if op:
                ids.append(op.id)
                self.grad_ops.append(op.id)
        if last:
            self.reduced.append((unit, ids or dep))

    def mirror_grad_sync(self) -> None:
        """DualPipe keeps each stage's parameters on two ranks (r and pp-1-r); the pair
        sums its gradients unit by unit as soon as both copies are reduced over the
        data-parallel group, overlapping the rest of the backward pass: the full
        gradients without ZeRO, each rank's reduce-scattered shard with it (the shards
        of the two copies line up, so the pair sums shard against shard).

        The sums run on their own ``mirror`` stream in one order on both ranks of the
        pair (model chunk of the later stage first, then backward order within a chunk:
        DualPipe finishes the stage farther from the pipeline ends first on both ranks);
        the pair's two ranks produce a unit's gradients at different times, so issue
        order alone would cross and deadlock."""
        b, L = self.b, self.b.L
        mirror = self.rank_at_stage(L.pp - 1 - self.stage)
        if mirror == self.rank:
            return
        group = tuple(sorted((self.rank, mirror)))
        chunk_of = {u: self._unit_chunk(u) for u, _ in self.reduced}

        def key(item):
            u = item[0]
            pos = b.model.layers if u == "head" else self._unit_layer(u)
            return (-chunk_of[u], -pos)

        for unit, deps in sorted(self.reduced, key=key):
            dense, expert = self.units[unit]
            if L.zero >= 1:
                dense, expert = dense / (L.dp * L.cp), expert / L.edp
            op = self.collective(
                "all-reduce",
                "pp_mirror",
                (dense + expert) * self.b.t.grad_bytes,
                f"{unit}.mirror",
                "sync",
                -1,
                -1,
                self._unit_layer(unit),
                deps,
                stream="mirror",
                group=group,
            )
            if op:
                self.grad_ops.append(op.id)

    def _unit_chunk(self, unit: str) -> int:
        """Model chunk a unit belongs to."""
        if unit == "embed":
            return 0
        if unit == "head":
            return self.b.n_chunks - 1
        l = self._unit_layer(unit)
        return next(k for k, r in enumerate(self.b.chunks) if l in r)

    def tied_embedding_sync(self) -> None:
        """The first and last pipeline chunks each hold the embedding table when the
        output head is tied to it or the MTP modules look tokens up in it; when they
        live on different ranks, those two ranks all-reduce the table's full fp32
        gradient after the data-parallel reduction, as Megatron-LM's
        ``finalize_model_grads`` does (``_allreduce_word_embedding_grads`` over the
        embedding group, after ``finish_grad_sync``)."""
        b, L, m = self.b, self.b.L, self.b.model
        if not (m.tied_embeddings or m.mtp_depth):
            return
        own = {self.chunk_index(c) for c in range(self.n_local)}
        has_first, has_last = 0 in own, b.n_chunks - 1 in own
        if has_first == has_last:  # neither end, or both (DualPipe's end ranks, pp = 1)
            return
        other_chunk = b.n_chunks - 1 if has_first else 0
        other = self.rank_at_stage(sched.chunk_owner(b.w.schedule, other_chunk, L.pp, L.vpp)[0])
        if other == self.rank:
            return
        table = math.ceil(m.vocab / L.tp) * m.hidden
        op = self.collective(
            "all-reduce",
            "pp_embed",
            table * self.b.t.grad_bytes,
            "embed.tied_grad",
            "sync",
            -1,
            -1,
            -1,
            self.grad_ops + self.after_compute(),
            stream="mirror",
            group=tuple(sorted((self.rank, other))),
        )
        if op:
            self.grad_ops.append(op.id)

    def my_layers(self) -> list[int]:
        out = []
        for c in range(self.n_local):
            out.extend(self.b.chunks[self.chunk_index(c)])
        return out

    def param_gathers(self) -> None:
        """ZeRO-1/2: all-gather the updated parameter shards, one bucket per unit
        (embedding, layers, head), at the start of the step (overlapped with the
        forward pass)."""
        for unit in self.unit_order():
            dense, expert = self.units[unit]
            ids = []
            for axis, p in (("dp_cp", dense), ("edp", expert)):
                op = self.collective(
                    "all-gather",
                    axis,
                    p * PARAM_BYTES,
                    f"{unit}.param_ag",
                    "sync",
                    -1,
                    -1,
                    self._unit_layer(unit),
                    [],
                    stream="dp",
                )
                if op:
                    ids.append(op.id)
            if ids:
                self.param_gather[unit] = ids[-1]

    def _params_for(self, unit: str, mb: int, k: int, phase: str) -> list[int]:
        """What a forward of ``unit`` waits for: its ZeRO-1/2 gather of this step, or
        its ZeRO-3 gather."""
        out = self._zero3_gather(unit, mb, k, phase)
        if unit in self.param_gather:
            out.append(self.param_gather[unit])
        return out

    def _zero3_gather(self, unit: str, mb: int, k: int, phase: str) -> list[int]:
        """ZeRO-3 / FSDP: gather a unit's parameters before each use, at most one
        unit ahead of the compute stream (prefetch depth 1)."""
        if self.b.L.zero != 3 or unit not in self.units:
            return []
        dense, expert = self.units[unit]
        window = self.compute_history[-2:-1]  # may start once the op before last is done
        ids = []
        for axis, p in (("dp_cp", dense), ("edp", expert)):
            op = self.collective(
                "all-gather",
                axis,
                p * PARAM_BYTES,
                f"{unit}.fsdp_ag",
                phase,
                mb,
                k,
                self._unit_layer(unit),
                window,
                stream="fsdp",
            )
            if op:
                ids.append(op.id)
        return ids

    def optimizer(self) -> None:
        L, t = self.b.L, self.b.t
        dense, expert = self.local_params()
        kern = optimizer_kernels(dense, L.zero, L.dp * L.cp, t.optimizer)
        if expert:
            kern += optimizer_kernels(expert, L.zero, L.edp, t.optimizer)
        if not t.offload_optimizer:
            self.compute("optimizer", kern, "opt", -1, -1, -1, deps=self.grad_ops)
            return
        # ZeRO-Offload: fp32 gradients down to the host, the update on the CPU,
        # bf16 parameters back up; the compute stream waits for the new weights.
        shard = sum(k.bytes for k in kern) / OPTIMIZER_BYTES_PER_PARAM[t.optimizer]
        # after the last backward kernel too: with dp·cp = 1 there is no reduction to wait on
        d2h = self.host("grads.d2h", shard * t.grad_bytes, "opt", deps=self.after_compute() + self.grad_ops)
        cpu = self.host(
            "optimizer.cpu",
            shard * OPTIMIZER_BYTES_PER_PARAM[t.optimizer],
            "opt",
            deps=[d2h.id],
            rate=HOST_UPDATE_BYTES_PER_S,
        )
        h2d = self.host("params.h2d", shard * PARAM_BYTES, "opt", deps=[cpu.id])
        self.compute("optimizer.wait", (), "opt", -1, -1, -1, deps=[h2d.id])

    def host(self, name: str, size: float, phase: str, deps=(), mb=-1, chunk=-1, layer=-1, rate=0.0, mem=()) -> Op:
        """A transfer over the device's host link (or, with ``rate``, CPU work)."""
        return self.b.add(
            rank=self.rank,
            stream="offload",
            kind="host",
            name=name,
            phase=phase,
            mb=mb,
            chunk=chunk,
            layer=layer,
            deps=tuple(deps),
            size_bytes=size,
            rate_bytes_per_s=rate,
            mem=tuple(mem),
        )

    def local_params(self) -> tuple[float, float]:
        """(dense, expert) parameters this rank holds, counting every local chunk
        (:func:`memory.rank_parameter_counts`: the sum of its units)."""
        return (sum(d for d, _ in self.units.values()), sum(e for _, e in self.units.values()))

    def static_memory(self) -> dict[str, float]:
        L, t = self.b.L, self.b.t
        dense, expert = self.local_params()
        s = memory.training_state_bytes(dense, expert, L, t)
        buffers = memory.sharding_buffer_bytes(
            [d + e for d, e in self.units.values()],
            L.zero,
            weight_dtype_bytes=PARAM_BYTES,
            grad_dtype_bytes=t.grad_bytes,
        )
        return {
            "weights": s.weights,
            "gradients": s.gradients,
            "optimizer": 0.0 if t.offload_optimizer else s.optimizer,  # offloaded: in host memory
            "activations": 0.0,
            "buffers": buffers,
        }
