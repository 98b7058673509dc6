"""What every rank's program of one step shares: the step's constants, the workload
(:class:`Workload`), the kernel groups of a layer and their backward, and
:class:`TraceBuilder`, which holds the sizes and kernels every rank's program
(:mod:`workloads.trace.program`) reads and makes the ops. :func:`workloads.trace.builder.build_trace`
assembles the programs into a trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from workloads import counts, kernels, memory, moe_kernels, parameters, quantization
from workloads import schedules as sched
from workloads.activations import ActivationPolicy
from workloads.layout import ParallelLayout
from workloads.model import ModelSpec
from workloads.moe_load import ExpertLoad, hottest_rank, rank_load_factors
from workloads.pipeline import get_schedule
from workloads.shard import Shard
from workloads.trace.ops import Op, TraceError
from workloads.training import TrainingSpec

PARAM_BYTES = 2  # bf16 parameter storage (also under FP8 training: FP8 casts are transient)


@dataclass(frozen=True)
class Workload:
    model: ModelSpec
    layout: ParallelLayout
    training: TrainingSpec
    schedule: str = "1f1b"
    expert_load: ExpertLoad | None = None  # routing imbalance (None = perfectly balanced)
    domain_size: int = 0  # devices per scale-up domain (switched networks), 0 = unknown / not switched
    chip_family: str = ""  # topologies.chips family ("hopper", "blackwell", "tpu"...), "" = unknown


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


def split_layer_kernels(kernels: Sequence[kernels.Kernel]) -> tuple[tuple, tuple, tuple, tuple, tuple]:
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


#: Backward kernel groups by their forward group and part, shared by the estimates' builders
#: of a process (``TraceBuilder(w, shared_backward=True)``: a search or map screen builds one
#: per layout, and most layouts share their layers' shapes); cleared when it reaches
#: :data:`_BACKWARD_MAX` entries. A trace's own builder keeps its kernels to itself: which ops
#: share a kernel object shows in a trace's pickle, and so in its fingerprint
#: (``simulator.studies.search.rounds.trace_fingerprint``).
_BACKWARD: dict = {}
_BACKWARD_MAX = 4096


def shared_backward_kernels(fwd: Sequence[kernels.Kernel], part: str) -> tuple[kernels.Kernel, ...]:
    """:func:`backward_kernels` from the process's shared cache."""
    key = (tuple(fwd), part)
    hit = _BACKWARD.get(key)
    if hit is None:
        if len(_BACKWARD) >= _BACKWARD_MAX:
            _BACKWARD.clear()
        hit = _BACKWARD[key] = backward_kernels(key[0], part)
    return hit


def backward_kernels(fwd: Sequence[kernels.Kernel], part: str) -> tuple[kernels.Kernel, ...]:
    """Backward kernels of a group of forward kernels (:func:`workloads.kernels.backward_kernels`).

    ``part``: ``"B"`` both gradients, ``"I"`` the input-gradient kernels (GEMM
    ``.dgrad``, attention, element-wise), ``"W"`` the weight-gradient kernels (GEMM
    ``.wgrad`` and the embedding-table gradient)."""
    out = []
    for k in fwd:
        for bk in kernels.backward_kernels(k):
            is_w = bk.name.endswith(".wgrad") or bk.kind == "embedding"
            if part == "B" or (part == "I" and not is_w) or (part == "W" and is_w):
                out.append(bk)
    return tuple(out)


def optimizer_kernels(params: float, zero: int, dp_shards: float, optimizer: str) -> tuple[kernels.Kernel, ...]:
    """The optimizer step over the parameters a rank updates (its ZeRO shard when
    ``zero >= 1``): one memory-bound kernel."""
    local = params / dp_shards if zero >= 1 else params
    return (
        kernels.Kernel("optimizer_step", "elementwise", 10.0 * local, OPTIMIZER_BYTES_PER_PARAM[optimizer] * local),
    )


def representative_ranks(layout: ParallelLayout, position: int = 0) -> list[int]:
    """One rank per pipeline stage: the one ``position`` ranks into it (0: tp = cp = dp = 0;
    another where the groups of a stage are unlike one another, see
    :func:`simulator.engine.symmetry.representative_position`)."""
    per_stage = layout.world // layout.pp
    if not 0 <= position < per_stage:
        raise TraceError(f"ranks: representative position {position} is outside 0..{per_stage - 1}")
    return [layout.rank_of(pp=s) + position for s in range(layout.pp)]


def chunk_layer_ranges(model: ModelSpec, layout: ParallelLayout, schedule: str) -> list[range]:
    """Layers of each model chunk of ``schedule`` (DualPipe cuts ``pp`` chunks, the
    others ``pp * vpp``), per :meth:`ParallelLayout.layers_per_chunk`."""
    n = sched.model_chunks(schedule, layout.pp, layout.vpp)
    return layout.chunk_layer_ranges(
        model.layers, n, f"pp={layout.pp}, vpp={layout.vpp}, schedule {schedule}", model.mtp_depth
    )


class TraceBuilder:
    def __init__(self, w: Workload, shared_backward: bool = False):
        self.w = w
        self._backward = shared_backward_kernels if shared_backward else backward_kernels
        self.model, self.L, self.t = w.model, w.layout, w.training
        L, t = self.L, self.t
        sched.validate_schedule_args(w.schedule, L.pp, t.micro_batches(L.dp), L.vpp)
        self.m = t.micro_batches(L.dp)
        self.chunks = chunk_layer_ranges(self.model, L, w.schedule)
        self.n_chunks = len(self.chunks)
        self.shard = Shard.of(L, t)  # one rank's slice of one micro-batch
        self.policy = ActivationPolicy.of(t)  # what its layers keep for the backward
        # how the kernels around the routed experts run (router dtype, balance, capacity)
        self.moe_options = moe_kernels.MoEOptions.of(t, w.expert_load)
        self.ops: list[Op] = []
        self.notes: list[str] = []
        self._kern_cache: dict = {}
        self._bwd_cache: dict = {}
        self._param_split: dict = {}  # is an MoE layer -> layer_param_split
        self._stash_cache: dict = {}
        self._dispatch_cache: dict[tuple[bool, int], float] = {}  # (combine, layer) -> dispatch_bytes
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
            routed = self.shard.tokens / (L.tp if L.sequence_parallel else 1) * L.ep
            f = rank_load_factors(
                w.expert_load, self.model.moe.experts, self.model.moe.top_k, L.ep, int(round(routed)), len(moe_layers)
            )
            self.rank_loads = {l: f[i] for i, l in enumerate(moe_layers)}
            self.load_factor = {l: float(f[i].max()) for i, l in enumerate(moe_layers)}
            self.load_mean = {l: float(f[i].mean()) for i, l in enumerate(moe_layers)}
        self._memory_load: dict[int, float] = {}  # layer -> load factor of its stage's hottest device
        schedule = get_schedule(w.schedule)
        if self.global_aux and not schedule.forwards_all_first:
            self.notes.append(
                f"balance aux-loss-global: every forward must finish before the first backward "
                f"(batch-level routing statistics); schedule {w.schedule} was run all-forward-first"
                + (
                    "; DualPipe's overlapped forward/backward pairs cannot form (no backward runs while a "
                    "forward is left), so no all-to-all hides behind the other direction's compute"
                    if schedule.overlapped_pairs
                    else ""
                )
            )
        # DualPipe's overlapped pairs hide expert all-to-alls behind the other chunk's compute.
        self.ep_overlap = self.model.is_moe and L.ep > 1
        # forward kernels rerun before each layer's backward (memory.recomputed_kernel_names)
        self.recomputed_names = memory.recomputed_kernel_names(self.t)
        # paired passes split their MLP backward (input then weight gradient; Megatron-Core's
        # --delay-wgrad-compute beside --overlap-moe-expert-parallel-comm)
        self.dualpipe_ep = self.ep_overlap and (schedule.overlapped_pairs or self.t.overlap_moe_expert_parallel_comm)
        # Megatron-Core's pairs run their all-to-alls beside the other pass's compute on shared
        # SMs (marked ``comm_overlap``); DualPipe's kernels have SMs of their own
        self.a2a_beside_compute = self.ep_overlap and bool(self.t.overlap_moe_expert_parallel_comm)

    # ---- kernels -------------------------------------------------------------
    def saved_recompute_kernels(self, layer: int) -> tuple:
        """The forward kernels DeepSeek-V3's activation savings and the recompute
        modules run again before the layer's backward (:func:`memory.recomputed_kernel_names`),
        in forward order."""
        key = ("saved-recompute", layer, self.model.is_moe_layer(layer), self.load_factor.get(layer, 1.0))
        if key not in self._kern_cache:
            names = self.recomputed_names
            self._kern_cache[key] = tuple(k for part in self.layer_parts(layer) for k in part if k.name in names)
        return self._kern_cache[key]

    def layer_parts(self, layer: int):
        moe = self.model.is_moe_layer(layer)
        factor = self.load_factor.get(layer, 1.0)
        key = ("layer", moe, factor)
        if key not in self._kern_cache:
            expert_tokens = self.expert_assignments(factor) if moe and factor != 1.0 else None
            ks = counts.layer_kernels(
                self.model,
                layer,
                self.shard,
                expert_tokens=expert_tokens,
                flash_attention=self.t.flash_attention,
                moe_options=self.moe_options,
            )
            self._kern_cache[key] = split_layer_kernels(self.quantized(ks))
        return self._kern_cache[key]

    def quantized(self, ks: list) -> list:
        """A layer's forward kernels with the FP8 quantisation passes beside its FP8 GEMMs
        (:mod:`workloads.quantization`; unchanged outside FP8 training). Under FP8 dispatch the
        experts' first GEMM gets tokens quantised before their top-k copies; under sequence
        parallelism a rank quantises its shard of a tensor the TP group all-gathers; Transformer
        Engine's fused grouped MLP runs the passes between the experts' GEMMs in their epilogues
        (:func:`workloads.quantization.fuse_grouped_mlp`)."""
        if self.t.dtype != "fp8":
            return ks
        moe = self.model.moe
        shares = {"expert_up": 1.0 / moe.top_k} if moe is not None and self.t.fp8_dispatch else None
        sp = 1.0 / self.L.tp if self.L.sequence_parallel and self.L.tp > 1 else 1.0
        out = quantization.with_quantization(ks, self.t.fp8_recipe, self.w.chip_family == "blackwell", shares, sp)
        return quantization.fuse_grouped_mlp(out) if self.t.moe_expert_gemm == "fused-mlp" else out

    def expert_assignments(self, factor: float) -> float:
        """Token-expert assignments one rank's routed experts process per micro-batch
        at load factor ``factor`` (1 = balanced: the rank's sequence-parallel shard
        times top_k, gathered over the etp ranks)."""
        return self.shard.sp_rows(self.shard.tokens) * self.model.moe.top_k * self.L.etp * factor

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
                hot = sum(
                    k.flops for k in op.kernels if k.kind in kernels.MATMUL_KINDS and k.name.startswith("expert_")
                )
                v = cache[key] = hot * (1.0 - self.load_mean[l] / self.load_factor[l])
            if v:
                out[op.rank] = out.get(op.rank, 0.0) + v
        return out

    def scaled(self, kernel: kernels.Kernel, f: float) -> kernels.Kernel:
        """``kernel`` with ``f`` of its FLOPs and bytes (cached: one object per (kernel, f))."""
        key = ("scaled", id(kernel), f)
        if key not in self._kern_cache:
            executed = None if kernel.executed_flops is None else kernel.executed_flops * f
            bwd = None if kernel.bwd_bytes is None else kernel.bwd_bytes * f
            self._kern_cache[key] = (
                kernel,
                replace(kernel, flops=kernel.flops * f, bytes=kernel.bytes * f, executed_flops=executed, bwd_bytes=bwd),
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
            self._kern_cache[key] = tuple(counts.embedding_kernels(self.model, self.shard))
        return self._kern_cache[key]

    def head_kernels(self):
        key = ("head",)
        if key not in self._kern_cache:
            ks = list(counts.head_kernels(self.model, self.shard))
            if self.model.mtp_depth:
                ks += counts.mtp_kernels(self.model, self.shard, moe_options=self.moe_options)
            self._kern_cache[key] = tuple(ks)
        return self._kern_cache[key]

    # ---- sizes ---------------------------------------------------------------
    @cached_property
    def hidden_bytes(self) -> float:
        """Activation tensor of one micro-batch at a layer boundary on one CP rank (all TP ranks)."""
        return self.shard.tokens * self.model.hidden * self.shard.act_bytes

    @cached_property
    def attn_tp_bytes(self) -> tuple[float, float, float]:
        """The attention block's TP traffic per micro-batch (all TP ranks' rows): ``(forward
        all-gather before the block, backward reduce-scatter after it -- all-reduce without
        sequence parallelism --, backward all-gather)``. Other attention gathers the hidden
        states and reduce-scatters their gradient. Multi-latent attention follows
        ``parallel.mla_down_proj`` (:mod:`workloads.layout`): ``duplicated`` gathers the query
        and KV latents (the up projections' inputs) and the RoPE key, ``column`` the hidden
        states once per down projection, the latents over their columns and the latents again
        (the backward mirrors each: the columns' gather is a split, the cut back to the shard
        an all-gather). Gathers issued back to back are one collective of their summed bytes."""
        h, mla = self.hidden_bytes, self.model.attention
        if mla is None:
            return (h if self.L.sequence_parallel else 0.0), h, 0.0
        per_width = self.shard.tokens * self.shard.act_bytes  # one element a token
        H, q, kv, rope = self.model.hidden, mla.q_lora_rank, mla.kv_lora_rank, mla.qk_rope_head_dim
        sp = self.L.sequence_parallel
        if self.L.mla_down_proj == "duplicated":
            # no query compression: the column-parallel query projection takes the hidden states
            up = (q or H) + kv
            return (up + rope) * per_width if sp else 0.0, (up + rope if sp else up) * per_width, 0.0
        # column: the query (or query projection's) and KV down projections each gather the
        # hidden states and reduce-scatter their gradient
        if not sp:
            return (q + kv + rope) * per_width, (2 * H + q + kv) * per_width, 0.0
        return (2 * H + 2 * q + 2 * kv + rope) * per_width, (2 * H + q + kv) * per_width, (q + kv) * per_width

    @cached_property
    def column_sp_gemms(self) -> frozenset[str]:
        """The GEMMs whose input the TP group all-gathers inside the linear layer under sequence
        parallelism (column-parallel layers: Megatron-Core's ``ColumnParallelLinear``, Transformer
        Engine's ``Linear`` / ``LayerNormLinear`` with ``parallel_mode="column"``): the QKV and
        MLP up projections (the shared experts' too: Megatron-Core's ``SharedExpertMLP`` is an
        ``MLP`` of the dense part's TP split), MLA's up projections (under ``duplicated`` the
        latents' shard is each one's input) and, under ``column``, its down projections."""
        names = {"qkv_proj", "mlp_up", "shared_up", "q_up", "q_proj", "kv_up"}
        if self.model.attention is not None and self.L.mla_down_proj == "column":
            names |= {"q_down", "kv_down"}
        return frozenset(names)

    def regather_bytes(self, attention: bool) -> float:
        """The bytes a sequence-parallel block's backward all-gathers again (all TP ranks' rows):
        a column-parallel layer keeps only its input's shard for the weight gradient and gathers it
        once more, overlapped with the input-gradient GEMM (``LinearWithGradAccumulationAndAsync
        Communication.backward``, megatron/core/tensor_parallel/layers.py, NVIDIA/Megatron-LM
        d98e8a64; ``_LayerNormLinear.backward``'s ``ln_out_needs_gather``,
        transformer_engine/pytorch/module/layernorm_linear.py, NVIDIA/TransformerEngine d0067d0).
        ``attention`` False: the dense MLP's up projection's input, the hidden states."""
        if not self.L.sequence_parallel or self.L.tp <= 1:
            return 0.0
        mla = self.model.attention
        if not attention or mla is None:
            return self.hidden_bytes
        per_width = self.shard.tokens * self.shard.act_bytes
        H, q, kv = self.model.hidden, mla.q_lora_rank, mla.kv_lora_rank
        if self.L.mla_down_proj == "duplicated":  # the up projections' inputs, the latents
            return ((q or H) + kv) * per_width
        return (2 * H + (q or 0) + kv) * per_width  # the down projections' hidden states, then the latents

    def column_split(self, fwd: tuple, part: str) -> tuple[tuple, tuple, tuple] | None:
        """A block's backward ``part`` (``B`` or ``I``) in the three pieces a sequence-parallel
        block runs (:meth:`regather_bytes`): ``(the kernels after the first column-parallel GEMM,
        the column-parallel GEMMs' input gradients, their weight gradients and the kernels before
        the first of them)``; None where the block has no column-parallel GEMM. Memoised as
        :meth:`bwd`."""
        key = (id(fwd), part, "column")
        hit = self._bwd_cache.get(key)
        if hit is None:
            cols = self.column_sp_gemms
            first = next((i for i, k in enumerate(fwd) if k.name in cols and k.kind == "gemm"), -1)
            split = None
            if first >= 0:
                gemms = tuple(k for k in fwd[first:] if k.name in cols and k.kind == "gemm")
                rest = tuple(k for k in fwd[first:] if not (k.name in cols and k.kind == "gemm"))
                wgrad = self._backward(gemms, "W") if part == "B" else ()
                split = (
                    self._backward(rest, part),
                    self._backward(gemms, "I"),
                    wgrad + self._backward(fwd[:first], part),
                )
            hit = self._bwd_cache[key] = (fwd, split)
        return hit[1]

    def kv_bytes(self) -> float:
        """K and V of the local sequence chunk held by one TP rank (what CP exchanges)."""
        m = self.model
        if m.attention is not None:
            per_tok = m.heads * (m.attention.qk_head_dim + m.attention.v_head_dim)
        else:
            per_tok = 2 * m.kv_heads * m.head_dim
        return self.shard.tokens * per_tok * self.shard.act_bytes / self.L.tp

    def dispatch_bytes(self, combine: bool, layer: int) -> float:
        """Per-rank all-to-all send buffer of an MoE dispatch (in
        ``training.moe_dispatch_dtype``: by default FP8 under FP8 training, as DeepSeek-V3
        §3.3 does) or combine (BF16), scaled by the layer's slowest expert rank's load
        factor (see :mod:`workloads.moe_load`)."""
        key = (combine, layer)  # asked once per all-to-all op: worked out once per layer
        hit = self._dispatch_cache.get(key)
        if hit is None:
            moe = self.model.moe
            per = 1 if (self.t.fp8_dispatch and not combine) else 2
            tokens = self.shard.tokens / (self.L.tp if self.L.sequence_parallel else 1)
            hit = self._dispatch_cache[key] = (
                tokens * moe.top_k * self.model.hidden * per * self.load_factor.get(layer, 1.0)
            )
        return hit

    def allgather_bytes(self, gather: bool, backward: bool, etp_stage: bool = False) -> float:
        """Full buffer of one collective of Megatron-Core's allgather dispatcher
        (``training.moe_token_dispatcher: allgather``; ``MoEAllGatherTokenDispatcher``,
        megatron/core/transformer/moe/token_dispatcher.py at NVIDIA/Megatron-LM d98e8a64).

        Each rank gathers the sequence-parallel shards of its expert-TP x EP group
        (``gather_from_sequence_parallel_region`` over ``tp_ep_group``): the hidden states in
        BF16 with the routing map (one byte an expert) and probabilities (the router dtype) of
        every token; the unpermuted expert outputs go back by a reduce-scatter over the same
        group in the probabilities' dtype (``token_combine``). Their gradients run the other
        way: an all-gather of the output gradient (``gather``, ``backward``) and a
        reduce-scatter of the hidden states' and probabilities' gradient. The trace runs the
        group's collective as its two factors, as it runs the alltoall dispatcher's: over EP
        the rows of its shard, then over the expert-TP group the whole group's rows
        (``etp_stage``; :attr:`~workloads.layout.ParallelLayout.routes_sp_shard`), or, where the
        block gathers the sequence over TP first (DeepSpeed's mapping), over EP the rows of the
        rank's TP-gathered block; every rank receives ``(etp ep - 1)`` shards either way, as
        the group's one collective gives it."""
        moe, h = self.model.moe, self.model.hidden
        prob = 4 if self.t.moe_router_dtype == "fp32" else 2
        if gather and not backward:  # dispatch: hidden, routing map, probabilities
            per = 2 * h + moe.experts * (prob + 1)
        elif gather or not backward:  # the combine and its gradient, in the probabilities' dtype
            per = prob * h
        else:  # the dispatch's gradient: hidden states and probabilities
            per = 2 * h + moe.experts * prob
        shard = self.shard.sp_rows(self.shard.tokens)  # what one rank routes
        rows = shard * self.L.ep * (self.L.etp if etp_stage or not self.L.routes_sp_shard else 1)
        return rows * per

    def node_limited(self) -> tuple[float, int] | None:
        """Per-node dispatch, where the expert all-to-all sends a token once to each other
        scale-up domain its experts are in and forwards it there over NVLink (DeepEP's
        internode dispatch; DeepSeek-V3 §3.2.2): ``(expected distinct domains per token,
        domains spanned)``, else ``None`` (one copy per routed expert). It applies when the
        EP group spans several domains evenly and ``training.moe_token_dispatcher`` is
        ``flex``, or ``auto`` with node-limited routing (``model.moe.max_nodes_per_token``,
        DeepSeek-V3 §2.1.2: M = 4); never under ``alltoall``. With k of the group's experts
        chosen uniformly over N domains a token reaches N(1 - (1 - 1/N)^k) distinct domains on
        average, at most M."""
        return self._node_limited

    @cached_property
    def _node_limited(self) -> tuple[float, int] | None:
        moe, D, dispatcher = self.model.moe, self.w.domain_size, self.t.moe_token_dispatcher
        if moe is None or D <= 0 or self.L.ep <= 1:
            return None
        if dispatcher in ("alltoall", "allgather") or (dispatcher == "auto" and not moe.max_nodes_per_token):
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
        return min(float(moe.max_nodes_per_token or nodes), distinct), nodes

    def layer_param_split(self, layer: int) -> tuple[float, float]:
        """(dense, expert) parameters of one layer held by one rank: tensor-parallel
        matrices split, norms, routers and (duplicated) MLA down projections replicated, routed
        experts split over ``ep`` and ``etp`` (as :func:`memory.rank_parameter_units`)."""
        moe = self.model.is_moe_layer(layer)
        hit = self._param_split.get(moe)
        if hit is None:
            L = self.L
            hit = self._param_split[moe] = parameters._block_params(
                self.model, moe, L.tp, L.ep, L.etp, mla_down_proj=L.mla_down_proj
            )
        return hit

    def bwd(self, fwd: tuple, part: str) -> tuple:
        """Memoised :func:`backward_kernels` (forward groups are long-lived cached tuples)."""
        key = (id(fwd), part)
        hit = self._bwd_cache.get(key)
        if hit is None:
            hit = self._bwd_cache[key] = (fwd, self._backward(fwd, part))
        return hit[1]

    # ---- op helpers ------------------------------------------------------------
    def add(self, **kw) -> Op:
        op = Op(id=len(self.ops), **kw)
        self.ops.append(op)
        return op
