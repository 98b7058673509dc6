"""The kernels Megatron-Core runs around the routed experts of one MoE layer: the router,
the score function and top-k, balance statistics, capacity dropping, the token counts, the
permutations before the dispatch and after the combine, and the expert GEMMs between them
(:func:`moe_kernels`), with the framework's options for them (:class:`MoEOptions`) and the
names the summary reports them under (:data:`MOE_TERM_KERNELS`). Built on the kernel
constructors of :mod:`workloads.counts`, which calls :func:`moe_kernels` for MoE layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from workloads import moe_unfused
from workloads.kernels import _FP32_BYTES, Kernel, _ffn, _gemm
from workloads.model import ModelSpec, MoESpec
from workloads.shard import Shard

# ---------------------------------------------------------------------------
# What Megatron-Core runs besides the expert GEMMs, per MoE layer and micro-batch, read
# from NVIDIA/Megatron-LM at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22):
# megatron/core/transformer/moe/router.py (TopKRouter.gating / routing), moe_utils.py
# (router_gating_linear, topk_routing_with_score_function, compute_routing_scores_for_aux_loss,
# apply_router_token_dropping, permute / unpermute, sort_chunks_by_idxs), token_dispatcher.py
# (MoEAlltoAllTokenDispatcher.preprocess / dispatch_preprocess / dispatch_postprocess /
# combine_preprocess / combine_postprocess) and experts.py (the gate weight multiplied
# inside the expert activation). The permutations are counted as the fused Transformer
# Engine kernels that --moe-permute-fusion selects (the NeMo / Megatron-Bridge MoE recipes
# set it): NVIDIA/TransformerEngine transformer_engine/common/triton/permutation.py (commit
# de379b9647472c9bd575658133cf4f46c2eb9df9): _permute_kernel runs one program per source
# token, which reads its row once and stores it to each of its routed rows; _unpermute_kernel
# one per output token, which reads its routed rows, optionally scales them by the merging
# probabilities in FP32 and writes one row; _sort_chunks_by_map_kernel reads and writes
# every row once. All of them are memory-bound: bytes are HBM reads + writes, the FLOPs
# rough operation counts that never decide their time (as for the norms above).
# T = the tokens a rank routes (its sequence-parallel shard), E experts, k = top_k,
# h = hidden, S = T*k rows it permutes (times the capacity factor under drop-and-pad),
# A = token-expert rows its local experts receive (A = S*etp when balanced).
_ROUTER_SCORE_FLOPS_PER_ELEMENT = 8.0  # score function (exp, add, divide) + top-k compares
_INDEX_BYTES = 4  # int32 row maps (TE's row_id_map) and FP32 routing probabilities
_MAP_BYTES = 1  # bool routing map [T, E]
_COUNT_BYTES = 8  # int64 tokens_per_expert


@dataclass(frozen=True)
class MoEOptions:
    """How the framework runs the kernels around the routed experts (from the scenario's
    training settings; :func:`MoEOptions.of`).

    * ``router_dtype``: ``"bf16"`` (Megatron's default ``moe_router_dtype: None``) or
      ``"fp32"`` (``--moe-router-dtype fp32``): the router GEMM takes BF16 operands and
      writes FP32 logits, its gradients are FP32 GEMMs, which Transformer Engine runs as
      TF32 (``CUBLAS_COMPUTE_32F_FAST_TF32``: "default to tf32", TransformerEngine
      transformer_engine/common/gemm/cublaslt_gemm.cu, commit 0143a5e04dcb), half the BF16
      tensor rate (H100 SXM datasheet: 494.7 vs 989.4 dense TFLOP/s).
    * ``balance``: ``"aux-free"`` (the expert-bias update counts the routed tokens per
      expert: ``TopKRouter._apply_expert_bias``) or an auxiliary loss (``aux-loss-local`` /
      ``aux-loss-global``: scores recomputed for the loss, its token counts and the
      probabilities' sums, ``compute_routing_scores_for_aux_loss`` and
      ``switch_load_balancing_loss_func``).
    * ``gate_weighting``: where the routing weight multiplies, ``"activation"`` (inside the
      expert activation, experts.py ``bias_act_func``) or ``"combine"`` (in the unpermutation,
      Megatron-Core <= 0.12: ``unpermute(..., probs=...)``).
    * ``capacity_factor``: token dropping (``--moe-expert-capacity-factor``; None: dropless);
      ``pad_to_capacity``: ``--moe-pad-expert-input-to-capacity``, every expert computing on its
      capacity (:attr:`pad_factor`).
    * ``allgather``: Megatron-Core's allgather dispatcher (``training.moe_token_dispatcher``):
      the permutation picks the local experts' rows out of the gathered tokens
      (``MoEAllGatherTokenDispatcher.dispatch_postprocess``: ``permute`` with the local
      columns of the gathered routing map, already grouped by local expert, so no chunk sort)
      and the unpermutation writes every gathered row (``combine_preprocess``: ``unpermute`` to
      ``hidden_shape_before_permute``) for the reduce-scatter.
    * ``per_expert_gemms``: the routed experts' GEMMs run as one GEMM per local expert
      (``training.moe_expert_gemm: per-expert``; Transformer Engine's GroupedLinear on its
      default cuBLAS path): each grouped GEMM kernel is launched ``groups`` times
      (:attr:`workloads.kernels.Kernel.launches`).
    * ``router_fusion`` / ``permute_fusion``: the router's score function and top-k (and an
      auxiliary loss), and the permutations, as fused Transformer Engine kernels (True) or as
      Megatron-Core's unfused chains of PyTorch ops (``training.moe_router_fusion`` /
      ``training.moe_permute_fusion``: False; :mod:`workloads.moe_unfused`).
    """

    router_dtype: str = "bf16"
    balance: str = "aux-free"
    gate_weighting: str = "activation"
    capacity_factor: float | None = None
    pad_to_capacity: bool = False
    allgather: bool = False
    per_expert_gemms: bool = False
    router_fusion: bool = True
    permute_fusion: bool = True

    @property
    def pad_factor(self) -> float:
        """The rows every expert computes relative to the dropless mean: the capacity factor
        under ``pad_to_capacity``, else 1."""
        return float(self.capacity_factor) if self.pad_to_capacity and self.capacity_factor is not None else 1.0

    @classmethod
    def of(cls, training, expert_load=None) -> MoEOptions:
        """The options of a :class:`~workloads.training.TrainingSpec` and its
        :class:`~workloads.moe_load.ExpertLoad` (None: balanced, dropless)."""
        cf = None if expert_load is None else expert_load.capacity_factor
        pad = bool(expert_load is not None and expert_load.pad_to_capacity and cf is not None)
        return cls(
            router_dtype=getattr(training, "moe_router_dtype", "bf16"),
            balance=training.balance,
            gate_weighting=training.moe_gate_weighting,
            capacity_factor=cf,
            pad_to_capacity=pad,
            allgather=getattr(training, "moe_token_dispatcher", "auto") == "allgather",
            per_expert_gemms=getattr(training, "moe_expert_gemm", "grouped") == "per-expert",
            router_fusion=getattr(training, "moe_router_fusion", True),
            permute_fusion=getattr(training, "moe_permute_fusion", True),
        )


#: Names of the kernels around the experts, by the term the summary reports them under
#: (``simulator.results.moe_terms``): routing (router GEMM, score function and top-k, balance
#: statistics, capacity dropping, the token-count histogram), permutation (before the
#: dispatch, and the sort by local expert after it) and unpermutation (the reverse).
MOE_TERM_KERNELS = {
    "routing": (
        "router",
        "moe_router_topk",
        "moe_router_topk_nograd",
        "moe_router_stats",
        "moe_router_stats_nograd",
        "moe_capacity_drop",
        "moe_tokens_per_expert",
    ),
    "permutation": ("moe_permute", "moe_permute_nograd", "expert_sort_chunks"),
    "unpermutation": ("expert_unsort_chunks", "moe_unpermute", "moe_unpermute_nograd"),
    # FP8 training: the passes quantising the experts' inputs and output gradients
    # (workloads.quantization; none in BF16)
    "quantization": ("expert_up_quant", "expert_down_quant"),
}


def moe_kernels(
    model: ModelSpec,
    shard: Shard,
    routed_rows: float,
    assignments: float,
    local_experts: int,
    width: int,
    opts: MoEOptions,
    gathered_rows: float = 0.0,
) -> list[Kernel]:
    """Forward kernels of one MoE layer from the router to the unpermutation (the shared
    experts and the residual are the caller's), in Megatron-Core's order. Notes above: ``T`` =
    ``routed_rows``, ``A`` = ``assignments`` (rows the local experts receive), ``gathered_rows``
    the rows the allgather dispatcher gathers (``opts.allgather``)."""
    m, h, act = model.moe, model.hidden, shard.act_bytes
    T, E, k = routed_rows, m.experts, m.top_k
    S = T * k * opts.pad_factor  # rows permuted on this rank before the dispatch
    A = assignments
    out = _routing_kernels(m, T, h, act, opts)
    # The allgather dispatcher permutes the local experts' rows out of the gathered tokens,
    # grouped by expert already (no chunk sort), and unpermutes them into every gathered row.
    sort = local_experts > 1 and not opts.allgather
    G = max(gathered_rows, T)
    # unfused (workloads.moe_unfused): the rows permuted, the routing map's columns, the rows out
    unfused = (G, local_experts, A) if opts.allgather else (T, E, S)
    unfused_args = (opts.pad_to_capacity, act, h, _logit_bytes(opts, act))
    probs_permuted = opts.gate_weighting == "activation"
    if not opts.permute_fusion:
        out += _chain_kernels("moe_permute", moe_unfused.permute(*unfused, probs_permuted, *unfused_args))
    elif opts.allgather:
        out.append(_gathered_permute_kernel(G, local_experts, A, h, act))
    else:
        out.append(_permute_kernel(T, E, k, S, h, act))
    # Permutation 2 (dispatch_postprocess, more than one local expert: sort_chunks_by_idxs, TE
    # _sort_chunks_by_map_kernel; under drop-and-pad a transpose copy): the A received rows
    # regrouped by local expert, read and written once, probabilities alongside. The backward
    # moves them back the same way.
    # Unfused (sort_chunks_by_idxs: torch.split and torch.cat) the probabilities are a second cat.
    chunks = 2 * act * A * h + 3 * _INDEX_BYTES * A
    sort_launches = 2 if not opts.permute_fusion and probs_permuted else 1
    if sort:
        out.append(Kernel("expert_sort_chunks", "elementwise", 0.0, chunks, bwd_bytes=chunks, launches=sort_launches))
    ffn = _ffn(model, "expert", A, width, act, groups=local_experts)
    if opts.gate_weighting == "activation":
        # experts.py bias_act_func: the activation's output times its row's FP32 routing weight
        # (Megatron's fused weighted SwiGLU): one more multiply per element, one weight per row.
        ffn[1] = replace(ffn[1], flops=ffn[1].flops + A * width, bytes=ffn[1].bytes + _FP32_BYTES * A)
    if opts.per_expert_gemms and local_experts > 1:
        # TE GroupedLinear: one cuBLAS GEMM per local expert (multi_stream_cublas_gemm), the
        # same math as one grouped kernel, launched local_experts times.
        ffn[0], ffn[2] = (replace(g, launches=local_experts) for g in (ffn[0], ffn[2]))
    out += ffn
    # combine_preprocess: the expert outputs restored to the order the all-to-all sends.
    if sort:
        out.append(Kernel("expert_unsort_chunks", "elementwise", 0.0, chunks, bwd_bytes=chunks))
    combine = opts.gate_weighting == "combine"
    if not opts.permute_fusion:
        out += _chain_kernels("moe_unpermute", moe_unfused.unpermute(*unfused, combine, *unfused_args))
    elif opts.allgather:
        out.append(_unpermute_kernel(G, max(1, min(k, local_experts)), A, h, act, combine))
    else:
        out.append(_unpermute_kernel(T, k, S, h, act, combine))
    return out


def _logit_bytes(opts: MoEOptions, act: int) -> int:
    """Bytes of a router logit: FP32 under ``--moe-router-dtype fp32``, else the activations'."""
    return _FP32_BYTES if opts.router_dtype == "fp32" else act


def _chain_kernels(name: str, c: moe_unfused.Chain) -> list[Kernel]:
    """An unfused chain of ops (:mod:`workloads.moe_unfused`) as two memory-bound kernels: ``name``
    stands for as many forward launches as the chain's backward has, and carries the backward's
    bytes; ``<name>_nograd`` for the forward launches beyond those, with no backward. The chain's
    forward bytes are split between them in proportion to their launches. The roofline's time
    of a kernel with no FLOPs is linear in its bytes and launches, so the pair takes the chain's
    time, and the host issues its launches."""
    share = c.bwd_launches / c.launches
    out = [Kernel(name, "elementwise", 0.0, c.bytes * share, bwd_bytes=c.bwd_bytes, launches=c.bwd_launches)]
    if c.launches > c.bwd_launches:
        rest = c.launches - c.bwd_launches
        out.append(Kernel(f"{name}_nograd", "elementwise", 0.0, c.bytes - out[0].bytes, bwd_bytes=0.0, launches=rest))
    return out


def _routing_kernels(m: MoESpec, T: float, h: int, act: int, opts: MoEOptions) -> list[Kernel]:
    """Router GEMM, score function and top-k, balance statistics, capacity dropping and the
    token-count histogram of ``T`` routed rows over the ``m.experts`` experts of ``m``
    (:class:`~workloads.model.MoESpec`)."""
    E = m.experts
    logit_bytes = _logit_bytes(opts, act)
    out: list[Kernel] = []
    # Router GEMM (router.py TopKRouter.gating -> moe_utils.router_gating_linear): X[T, h] W^T[h, E],
    # BF16 operands, logits in the router dtype. Its FP32 gradients read and write FP32 operands.
    router = _gemm("router", T, E, h, act)
    out.append(
        replace(
            router,
            bytes=act * (T * h + E * h) + logit_bytes * T * E,
            math_dtype="bf16",
            grad_math_dtype="tf32" if opts.router_dtype == "fp32" else "bf16",
            bwd_bytes=2 * _FP32_BYTES * (T * E + E * h + T * h) if opts.router_dtype == "fp32" else None,
        )
    )
    # Score function (softmax, or sigmoid for DeepSeek-V3 / Kimi K2) and top-k, group-limited
    # where routing is node-limited (moe_utils.topk_routing_with_score_function; fused with
    # --moe-router-fusion into Transformer Engine's fused_topk_with_score_function, one pass):
    # reads the [T, E] logits, writes the [T, E] routing probabilities and the bool routing map.
    # The score function and the grouping change operation counts, not this traffic.
    if opts.router_fusion:
        out.append(
            Kernel(
                "moe_router_topk",
                "elementwise",
                _ROUTER_SCORE_FLOPS_PER_ELEMENT * T * E,
                T * E * (2 * logit_bytes + _MAP_BYTES),
            )
        )
    else:  # Megatron-Core's unfused ops (workloads.moe_unfused)
        bias, groups = opts.balance == "aux-free", m.max_nodes_per_token is not None
        chain = moe_unfused.router_topk(m.score_function, bias, groups, logit_bytes, T, E)
        out += _chain_kernels("moe_router_topk", chain)
    # Load-balancing statistics (router.py TopKRouter.routing): aux-loss-free balancing adds the
    # routing map's column sums to local_tokens_per_expert (_apply_expert_bias; the bias itself is
    # updated once per step, moe_utils.get_updated_expert_bias: E values, not counted): reads
    # the [T, E] map, no gradient. An auxiliary loss recomputes the scores over all experts
    # (compute_routing_scores_for_aux_loss: reads the logits, writes FP32 scores, top-k reads
    # them and writes a map), sums the map (tokens per expert) and the scores (the switch loss):
    # T*E*(logit + 4 + 4 + 1 + 1 + 4) bytes; its gradient writes the FP32 score gradient and
    # runs the score function's backward (reads the scores, writes a logit gradient).
    if opts.balance == "aux-free":
        out.append(Kernel("moe_router_stats", "elementwise", T * E, _MAP_BYTES * T * E, bwd_bytes=0.0))
    elif not opts.router_fusion:
        out += _chain_kernels("moe_router_stats", moe_unfused.aux_loss(m.score_function, logit_bytes, T, E))
    else:
        out.append(
            Kernel(
                "moe_router_stats",
                "elementwise",
                _ROUTER_SCORE_FLOPS_PER_ELEMENT * T * E,
                T * E * (logit_bytes + 3 * _FP32_BYTES + 2 * _MAP_BYTES),
                bwd_bytes=T * E * (2 * _FP32_BYTES + logit_bytes),
            )
        )
    # Capacity (moe_utils.apply_router_token_dropping, --moe-expert-capacity-factor): a top-k
    # over the tokens of each expert's column of probabilities (reads [T, E]), a scatter into
    # a capacity mask and the masked probabilities and map (writes [T, E] twice, 1 + logit B).
    if opts.capacity_factor is not None:
        out.append(
            Kernel(
                "moe_capacity_drop",
                "elementwise",
                T * E * math.log2(max(2.0, T)),
                T * E * (2 * logit_bytes + 2 * _MAP_BYTES),
                bwd_bytes=T * E * 2 * logit_bytes,
            )
        )
    # tokens_per_expert (token_dispatcher.py MoEAlltoAllTokenDispatcher.preprocess:
    # routing_map.sum(dim=0)), the counts the all-to-all splits and the grouped GEMM need
    # (and, dropless, the host reads back). Drop-and-pad fills fixed counts instead.
    if not opts.pad_to_capacity:
        out.append(
            Kernel("moe_tokens_per_expert", "elementwise", T * E, _MAP_BYTES * T * E + _COUNT_BYTES * E, bwd_bytes=0.0)
        )
    return out


def _permute_kernel(T: float, E: int, k: int, S: float, h: int, act: int) -> Kernel:
    """Permutation 1 (dispatch_preprocess -> moe_utils.permute, TE _permute_kernel): reads each
    of the T token rows once and writes its S rows, with the routing probabilities alongside
    (read and written, FP32); TE first builds the row map in three passes over the routing map
    (reads [T, E] bool, writes int32 [T, 2E + 1]) and the kernel reads each token's 2k + 1
    entries. Backward: the rows' gradients gathered back into T rows (read S, write T) and the
    probabilities' gradient."""
    row_map = _MAP_BYTES * T * E + _INDEX_BYTES * T * (2 * E + 1) + _INDEX_BYTES * T * (2 * k + 1)
    return Kernel(
        "moe_permute",
        "elementwise",
        0.0,
        act * (T * h + S * h) + 2 * _INDEX_BYTES * S + row_map,
        bwd_bytes=act * (S * h + T * h) + 2 * _INDEX_BYTES * S + _INDEX_BYTES * T * (2 * k + 1),
    )


def _gathered_permute_kernel(G: float, local_experts: int, A: float, h: int, act: int) -> Kernel:
    """The allgather dispatcher's permutation (``dispatch_postprocess`` -> moe_utils.permute on
    the gathered tokens with the local experts' columns of the routing map, TE
    ``_permute_kernel``): the row map built from the ``[G, local experts]`` bool map, the rows
    of the local experts' ``A`` assignments read (at most one read a gathered token) and written
    with their probabilities (``local_probs ... masked_select``). Backward: their gradients
    gathered back into the ``G`` rows (read ``A``, write ``G``)."""
    read = min(G, A)
    row_map = _MAP_BYTES * G * local_experts + _INDEX_BYTES * G * (2 * local_experts + 1)
    return Kernel(
        "moe_permute",
        "elementwise",
        0.0,
        act * (read * h + A * h) + 2 * _INDEX_BYTES * A + _FP32_BYTES * A + row_map,
        bwd_bytes=act * (A * h + G * h) + 2 * _INDEX_BYTES * A,
    )


def _unpermute_kernel(T: float, k: int, S: float, h: int, act: int, combine: bool) -> Kernel:
    """Unpermutation 1 (combine_postprocess -> moe_utils.unpermute, TE _unpermute_kernel): each
    output row sums its routed rows (reads S rows, writes T), scaled by the FP32 merging
    probabilities where the weight multiplies here (``combine``). Backward: the output gradient
    scattered to the S rows (read T, write S); with merging probabilities also the forward
    inputs read again for the probabilities' gradient (TE _unpermute_bwd_with_merging_probs_kernel)."""
    return Kernel(
        "moe_unpermute",
        "elementwise",
        (2.0 if combine else 1.0) * S * h,
        act * (S * h + T * h) + _INDEX_BYTES * T * (2 * k + 1) + (_FP32_BYTES * S if combine else 0.0),
        bwd_bytes=act * (T * h + S * h * (2 if combine else 1))
        + _INDEX_BYTES * T * (2 * k + 1)
        + (2 * _FP32_BYTES * S if combine else 0.0),
    )
