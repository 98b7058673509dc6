"""FLOP counts of a :class:`~workloads.model.ModelSpec`: its kernels and model FLOPs.

Everything here is a pure function of the model spec and one rank's
:class:`~workloads.shard.Shard` (parallel degrees, micro-batch, sequence, activation
width). The
parameter counts (:func:`~workloads.parameters.parameter_count`,
:func:`~workloads.parameters.active_parameter_count`, the per-layer breakdown in
:func:`~workloads.parameters._block_params`) live in :mod:`workloads.parameters`, the
tensor-parallel shapes both use in :mod:`workloads.shapes`. What comes out here:

* **Kernels** (:func:`layer_kernels`, :func:`embedding_kernels`,
  :func:`head_kernels`, :func:`mtp_kernels`): the GPU kernels of one forward pass
  on the rank of a shard, each with its FLOPs, its HBM traffic and (for GEMMs) its shape, for
  the roofline compute model.

Conventions (chosen once, used everywhere)
------------------------------------------
* A multiply-add is 2 FLOPs. A GEMM of an ``m x k`` by a ``k x n`` matrix costs
  ``2*m*n*k``.
* **Attention core.** The score product ``Q K^T`` and the value product ``P V``
  are counted over the *full* (non-causal) ``s x s`` square:
  ``2*t*s*heads*d_qk + 2*t*s*heads*d_v`` forward FLOPs for ``t`` query tokens
  and ``s`` keys, which is ``4*t*s*heads*head_dim`` when ``d_qk = d_v``. This is
  the convention of Narayanan et al. 2021 (arXiv 2104.04473, Eq. 3: the
  ``4*B*s^2*h`` attention term per layer) and of PaLM (Chowdhery et al. 2022,
  arXiv 2204.02311, App. B, ``6*N + 12*L*H*Q*T``), so MFU figures compare with
  published ones. A causal fused (flash) kernel executes about half of that
  work, and its backward recomputes ``Q K^T``: such kernels carry
  ``executed_flops`` in FlashAttention's own convention (Dao 2023, arXiv
  2307.08691 §4.1, and its benchmark script: causal = half the dense count,
  backward = 2.5 x forward), the convention of the TFLOP/s the efficiency table
  is calibrated against. The compute model times them by ``executed_flops``;
  model and hardware FLOPs (MFU/HFU) keep the dense count above. Unfused
  attention (``flash_attention: false``) computes the whole square with batched
  GEMMs and executes what it counts.
* **Backward.** Every matmul (GEMMs *and* the two attention products) costs 2x
  its forward in the backward pass: one product for the input gradient and one
  for the weight gradient (for attention: dQ/dK from dS and dV/dP from dO).
  FlashAttention-2 (Dao 2023, arXiv 2307.08691) counts attention backward as
  2.5x forward because it *recomputes* ``Q K^T``; that extra product is
  recomputation, so it belongs to hardware FLOPs (HFU), not model FLOPs.
  :func:`backward_flops_factor` returns this 2.0.
* **Model FLOPs** (:func:`model_flops_per_token`) are ``(1 + 2) x`` the forward
  matmul FLOPs of all layers, the LM head, and the MTP modules (DeepSeek-V3 trains
  them, so they are part of the step's useful work; pass ``include_mtp=False`` to
  leave them out). Norms, activations, softmax and the loss are not counted, as in
  Narayanan Eq. 3. For a GPT model this reproduces Narayanan Eq. 3 without the
  recompute pass exactly: ``72*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h))``.
* **MTP and parameter totals.** DeepSeek-V3's "671B total / 37B activated"
  (arXiv 2412.19437 §4.2) counts the main model only; its Hugging Face release
  is "685B: 671B main model + 14B MTP module", where the 14B includes a stored
  copy of the (shared) embedding and output head. Here the MTP modules are part
  of the model: :func:`parameter_count` and :func:`active_parameter_count` count
  their *unique* weights (embedding and head shared, DeepSeek-V3 §2.2) unless
  ``include_mtp=False``, which is what to compare with the published 671B / 37B.
* **Active parameters** count every weight a token's forward touches: the
  embedding table and output head, attention, shared experts, the router, and
  ``top_k`` of the routed experts. (Mixtral's published 12.9B active needs the
  embeddings counted; without them it would be 12.75B.)

Not modelled (each well under 0.01% of the totals): learned absolute position
embeddings (GPT-2/3: ``s*h``), Qwen3's per-head QK-norm scales, DeepSeek-V3's
routing-bias vector, Grok-1's extra post-norms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from workloads.errors import WorkloadError
from workloads.model import ModelSpec
from workloads.shapes import _ffn_up_width, _local_heads, _local_kv_heads, _mtp_block_is_moe, _split
from workloads.shard import Shard
from workloads.training import TrainingSpec

if TYPE_CHECKING:  # workloads.moe_kernels builds on this module's kernels
    from workloads.moe_kernels import MoEOptions

KERNEL_KINDS = ("gemm", "attention", "elementwise", "norm", "embedding")
MATH_DTYPES = ("bf16", "fp8", "tf32")  # a GEMM kernel's own math dtype (Kernel.math_dtype)
# FlashAttention's FLOP convention (Dao 2023, arXiv 2307.08691 §4.1; Shah et al. 2024,
# arXiv 2407.08608 §4.1, and benchmarks/benchmark_flash_attention.py of
# Dao-AILab/flash-attention): a causal mask halves the forward's 4*s^2*heads*d FLOPs
# (only the lower triangle of score blocks is computed) and the backward counts 2.5x
# the forward (five matmuls against two: Q K^T is recomputed). Every model here is a
# causal decoder.
CAUSAL_EXECUTED_FRACTION = 0.5
FLASH_BACKWARD_FACTOR = 2.5
MATMUL_KINDS = ("gemm", "attention")  # the kinds counted in model FLOPs

# FLOPs per element of the memory-bound kernels. These only matter for the
# roofline's compute side, which they never dominate; they are rough operation
# counts, not part of model FLOPs.
_NORM_FLOPS_PER_ELEMENT = {"rmsnorm": 4.0, "layernorm": 7.0}  # square/sum/scale/mul (+mean/shift)
_SWIGLU_FLOPS_PER_ELEMENT = 5.0  # silu(g) * u: exp, add, divide, two multiplies
_GELU_FLOPS_PER_ELEMENT = 8.0  # tanh approximation
_RESIDUAL_FLOPS_PER_ELEMENT = 1.0
_CROSS_ENTROPY_FLOPS_PER_ELEMENT = 4.0  # max, subtract, exp, sum over the vocab
_TOKEN_ID_BYTES = 8  # int64 token ids, as PyTorch embeddings take them
# Unfused attention (Megatron-LM before FlashAttention, as in Narayanan et al. 2021
# and Korthikanti et al. 2022) materialises the s x s scores per head. HBM bytes per
# score element, beyond the Q/K/V/O traffic of ``attn_core``:
# * forward, 12 B: the QK^T batched GEMM writes the scores (2); Megatron's fused
#   causal softmax (megatron/fused_kernels/scaled_upper_triang_masked_softmax.h,
#   NVIDIA/Megatron-LM) loads only the unmasked lower triangle of each row -- on
#   average half of it (1) -- and writes the full row, zeros included (2); dropout
#   reads the probabilities and writes its output and a 1-byte mask (2 + 2 + 1); the
#   PV batched GEMM reads the dropped-out probabilities (2).
# * backward, 17 B: dP = dO V^T writes the score gradient (2); dV = P^T dO reads the
#   dropped-out probabilities (2); the dropout backward reads the gradient and the mask
#   and writes a gradient (2 + 1 + 2); the fused softmax backward reads the gradient
#   and its saved output over the unmasked half (1 + 1) and writes the full row (2);
#   dQ = dS K and dK = dS^T Q read the score gradient once each (2 + 2).
# Check: Korthikanti et al. 2022 (arXiv 2205.05198) Table 4 measures recomputing this
# forward (QK^T, softmax, dropout, PV; "selective recompute") for one 22B layer on
# A100 (b=4, s=2048, 64/8 heads per rank): 1.3 ms; tests/test_counts.py times it.
_UNFUSED_SCORE_BYTES = 12
_UNFUSED_SCORE_BWD_BYTES = 17
#: Name of the unfused-attention score-traffic kernel (its backward has its own bytes).
UNFUSED_SCORES_KERNEL = "attn_scores"
_FP32_BYTES = 4


@dataclass(frozen=True)
class Kernel:
    """One GPU kernel (or fused group) of a forward pass on one rank.

    ``flops`` are forward FLOPs (multiply-add = 2) and exact even when ``m`` is
    rounded. ``bytes`` is HBM traffic (reads + writes) for the roofline. For a
    GEMM, ``m x n x k`` is the shape of one product and ``groups`` how many such
    products a grouped GEMM runs (the local experts of an MoE layer; ``m`` is then
    the mean rows per expert, rounded up). Non-GEMMs have ``m = n = k = 0``.
    ``executed_flops`` (None: equal to ``flops``) is what the kernel's math units
    run, in the convention its efficiency is calibrated in, where that differs
    from the counted ``flops``: a causal fused attention kernel (module notes).
    The compute model times it; MFU and HFU count ``flops``.
    """

    name: str
    kind: str
    flops: float
    bytes: float
    m: int = 0
    n: int = 0
    k: int = 0
    groups: int = 1
    executed_flops: float | None = None
    # The math dtype where it is not the step's GEMM dtype (None: the step's): the MoE
    # router runs in BF16 in an FP8 step (a plain linear, not a Transformer Engine FP8
    # module), "tf32" for FP32 operands on tensor cores (the FP32 router's gradients).
    math_dtype: str | None = None
    # The math dtype of its gradient GEMMs (None: ``math_dtype``).
    grad_math_dtype: str | None = None
    # HBM bytes of its backward kernel where that is not 2x the forward's (a permutation
    # moves the same rows back; 0: no backward kernel, e.g. the token-count histogram).
    bwd_bytes: float | None = None


def backward_flops_factor() -> float:
    """Backward FLOPs / forward FLOPs for every matmul: 2.0.

    One product for the input gradient and one for the weight gradient (for the
    attention core: ``dP = dO V^T`` and ``dV = P^T dO``, then ``dQ = dS K`` and
    ``dK = dS^T Q``: four products against two forward). See the module notes for
    why FlashAttention-2's 2.5 (which includes recomputing ``Q K^T``) is not used.
    """
    return 2.0


def backward_kernels(kernel: Kernel) -> tuple[Kernel, ...]:
    """The backward kernels of one forward kernel.

    A GEMM ``Y[m,n] = X[m,k] W[k,n]`` becomes an input-gradient GEMM
    ``dX = dY W^T`` (shape ``m x k x n``, name ``<name>.dgrad``) and a
    weight-gradient GEMM ``dW = X^T dY`` (shape ``k x n x m``, ``<name>.wgrad``),
    each with the forward's FLOPs; zero-bubble schedules and DualPipe place the
    two separately. Attention backward is one kernel with 2x the forward FLOPs and
    about 2x its bytes (reads Q, K, V, O, dO; writes dQ, dK, dV); a fused kernel's
    ``executed_flops`` are 2.5x the forward's (FlashAttention's count). Memory-bound
    kernels (norms, activations, residuals, loss, embedding) read their saved
    input and the output gradient and write the input gradient: 2x bytes, 2x FLOPs.
    The materialised attention scores of unfused attention (``attn_scores``) move
    17/12 of their forward bytes (see ``_UNFUSED_SCORE_BYTES``).
    """
    f = backward_flops_factor()
    if kernel.kind == "gemm":
        # Each gradient GEMM moves the same three operands' worth of bytes as the
        # forward: dgrad reads dY and W and writes dX; wgrad reads X and dY and
        # writes dW.
        half = kernel.flops * f / 2.0
        nbytes = kernel.bytes if kernel.bwd_bytes is None else kernel.bwd_bytes / 2.0
        dt = kernel.math_dtype if kernel.grad_math_dtype is None else kernel.grad_math_dtype
        return (
            Kernel(
                f"{kernel.name}.dgrad", "gemm", half, nbytes, kernel.m, kernel.k, kernel.n, kernel.groups, math_dtype=dt
            ),
            Kernel(
                f"{kernel.name}.wgrad", "gemm", half, nbytes, kernel.k, kernel.n, kernel.m, kernel.groups, math_dtype=dt
            ),
        )
    if kernel.bwd_bytes is not None:  # a pass whose backward is not twice its forward
        if kernel.bwd_bytes <= 0:
            return ()
        return (Kernel(f"{kernel.name}.bwd", kernel.kind, kernel.flops, kernel.bwd_bytes),)
    if kernel.name.rsplit(".", 1)[-1] == UNFUSED_SCORES_KERNEL:
        # Materialised scores: 17 B per score element back against 12 forward (notes
        # at _UNFUSED_SCORE_BYTES), not the 2x of a plain element-wise kernel.
        nbytes = kernel.bytes * _UNFUSED_SCORE_BWD_BYTES / _UNFUSED_SCORE_BYTES
        return (Kernel(f"{kernel.name}.bwd", kernel.kind, kernel.flops * f, nbytes),)
    executed = None if kernel.executed_flops is None else kernel.executed_flops * FLASH_BACKWARD_FACTOR
    return (Kernel(f"{kernel.name}.bwd", kernel.kind, kernel.flops * f, kernel.bytes * 2.0, executed_flops=executed),)


# ---------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------


def _gemm(name: str, rows: float, n: int, k: int, act_bytes: int, groups: int = 1) -> Kernel:
    """``rows`` token rows (over all ``groups``) times a ``k x n`` weight per group."""
    flops = 2.0 * rows * n * k
    traffic = act_bytes * (rows * k + rows * n + groups * n * k)
    m = max(1, math.ceil(rows / groups)) if rows > 0 else 0
    return Kernel(name, "gemm", flops, traffic, m, n, k, groups)


def _norm(model: ModelSpec, name: str, rows: float, width: int, act_bytes: int) -> Kernel:
    elems = rows * width
    return Kernel(name, "norm", _NORM_FLOPS_PER_ELEMENT[model.norm] * elems, act_bytes * (2 * elems + width))


def _residual(name: str, rows: float, width: int, act_bytes: int) -> Kernel:
    elems = rows * width
    return Kernel(name, "elementwise", _RESIDUAL_FLOPS_PER_ELEMENT * elems, act_bytes * 3 * elems)


def _activation(model: ModelSpec, name: str, rows: float, width: int, act_bytes: int) -> Kernel:
    elems = rows * width
    if model.ffn == "swiglu":  # reads gate and up, writes the product
        return Kernel(name, "elementwise", _SWIGLU_FLOPS_PER_ELEMENT * elems, act_bytes * 3 * elems)
    return Kernel(name, "elementwise", _GELU_FLOPS_PER_ELEMENT * elems, act_bytes * 2 * elems)


def _ffn(model: ModelSpec, prefix: str, rows: float, width: int, act_bytes: int, groups: int = 1) -> list[Kernel]:
    """Up GEMM, activation, down GEMM of an FFN of (local) width ``width``."""
    h = model.hidden
    return [
        _gemm(f"{prefix}_up", rows, _ffn_up_width(model, width), h, act_bytes, groups),
        _activation(model, f"{prefix}_act", rows, width, act_bytes),
        _gemm(f"{prefix}_down", rows, h, width, act_bytes, groups),
    ]


def _attention_core(
    name: str, q_rows: float, seq_len: int, heads: int, kv_heads: int, d_qk: int, d_v: int, act_bytes: int, batch: float
) -> Kernel:
    """Fused (flash) attention over ``q_rows`` local queries and, per sequence,
    ``seq_len`` keys. ``batch`` = sequences in the micro-batch, so the kernel reads
    ``batch*seq_len`` keys (with context parallelism: the whole sequence arrives
    over the ring). FLOPs per the module's non-causal convention. Bytes: read Q,
    K, V, write O and the fp32 log-sum-exp per query and head."""
    flops = 2.0 * q_rows * seq_len * heads * (d_qk + d_v)
    keys = batch * seq_len
    traffic = act_bytes * (q_rows * heads * d_qk + keys * kv_heads * (d_qk + d_v) + q_rows * heads * d_v)
    traffic += _FP32_BYTES * q_rows * heads
    return Kernel(name, "attention", flops, traffic)


def _unfused_scores(q_rows: float, seq_len: int, heads: int) -> Kernel:
    """Memory traffic of materialised attention scores (no FLOPs beyond the
    products already in ``attn_core``): the score writes and reads of the two
    batched GEMMs, the causal softmax and dropout over ``q_rows x seq_len`` per head."""
    return Kernel(UNFUSED_SCORES_KERNEL, "elementwise", 0.0, _UNFUSED_SCORE_BYTES * q_rows * seq_len * heads)


def _attention_kernels(model: ModelSpec, shard: Shard, norm_rows: float, flash_attention: bool) -> list[Kernel]:
    h, tokens, seq_len, act_bytes = model.hidden, shard.tokens, shard.seq_len, shard.act_bytes
    heads = _local_heads(model, shard.tp)
    batch = tokens * shard.cp / seq_len  # sequences in the micro-batch
    out: list[Kernel] = [_norm(model, "attn_norm", norm_rows, h, act_bytes)]
    mla = model.attention
    if mla is None:
        kv = _local_kv_heads(model, shard.tp)
        d = model.head_dim
        out.append(_gemm("qkv_proj", tokens, (heads + 2 * kv) * d, h, act_bytes))
        out.append(_attention_core("attn_core", tokens, seq_len, heads, kv, d, d, act_bytes, batch))
        if not flash_attention:
            out.append(_unfused_scores(tokens, seq_len, heads))
        out.append(_gemm("out_proj", tokens, h, heads * d, act_bytes))
    else:
        # DeepSeek-V2 §2.1 (arXiv 2405.04434): the down projections (to the query
        # and KV latents, plus the shared RoPE key) are small and replicated on
        # every TP rank; the up projections and the output projection are split
        # by heads.
        d_qk = mla.qk_head_dim
        if mla.q_lora_rank:
            out.append(_gemm("q_down", tokens, mla.q_lora_rank, h, act_bytes))
            out.append(_norm(model, "q_down_norm", tokens, mla.q_lora_rank, act_bytes))
            out.append(_gemm("q_up", tokens, heads * d_qk, mla.q_lora_rank, act_bytes))
        else:
            out.append(_gemm("q_proj", tokens, heads * d_qk, h, act_bytes))
        out.append(_gemm("kv_down", tokens, mla.kv_lora_rank + mla.qk_rope_head_dim, h, act_bytes))
        out.append(_norm(model, "kv_down_norm", tokens, mla.kv_lora_rank, act_bytes))
        out.append(_gemm("kv_up", tokens, heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank, act_bytes))
        # After the up projection every head has its own K (d_qk) and V (d_v).
        out.append(_attention_core("attn_core", tokens, seq_len, heads, heads, d_qk, mla.v_head_dim, act_bytes, batch))
        if not flash_attention:
            out.append(_unfused_scores(tokens, seq_len, heads))
        out.append(_gemm("out_proj", tokens, h, heads * mla.v_head_dim, act_bytes))
    out.append(_residual("attn_residual", norm_rows, h, act_bytes))
    if flash_attention:  # causal fused kernel: about half the counted square (module notes)
        out = [
            replace(k, executed_flops=k.flops * CAUSAL_EXECUTED_FRACTION) if k.kind == "attention" else k for k in out
        ]
    return out


# ---------------------------------------------------------------------------
# The kernels around the routed experts (Megatron-Core's MoE layer)
def _block_kernels(
    model: ModelSpec,
    moe: bool,
    shard: Shard,
    expert_tokens: float | None,
    flash_attention: bool = True,
    opts: MoEOptions | None = None,
) -> list[Kernel]:
    from workloads.moe_kernels import MoEOptions, moe_kernels  # it builds on this module's kernels

    opts = opts or MoEOptions()
    h, tokens, tp, act_bytes = model.hidden, shard.tokens, shard.tp, shard.act_bytes
    norm_rows = shard.sp_rows(tokens)  # norms, residuals and dropout see tokens/tp under SP
    out = _attention_kernels(model, shard, norm_rows, flash_attention)
    out.append(_norm(model, "mlp_norm", norm_rows, h, act_bytes))
    if not moe:
        out += _ffn(model, "mlp", tokens, _split(model.ffn_hidden, tp, "ffn_hidden"), act_bytes)
    else:
        m = model.moe
        if tp > 1 and not shard.sequence_parallel:
            raise WorkloadError(
                "MoE layers with tp > 1 need sequence parallelism "
                "(Megatron-Core routes the sequence-parallel shard of tokens)",
                field="parallel.sequence_parallel",
            )
        local_experts = _split(m.experts, shard.ep, f"the {m.experts} routed experts", "parallel.ep")
        width = _split(m.expert_ffn_hidden, shard.etp, "expert_ffn_hidden", "parallel.etp")
        routed_rows = norm_rows  # each TP rank routes its sequence-parallel shard
        # Balanced routing: the EP all-to-all brings back as many token-expert
        # assignments as this rank sent (routed_rows * top_k); expert tensor
        # parallelism gathers the assignments of the etp ranks, each computing
        # 1/etp of every expert's width.
        # Drop-and-pad (``opts.pad_factor``) fills every expert to its capacity.
        balanced = routed_rows * m.top_k * shard.etp * opts.pad_factor
        assignments = balanced if expert_tokens is None else float(expert_tokens)
        if assignments < 0:
            raise ValueError(f"expert_tokens: must be non-negative, got {expert_tokens!r}")
        out += moe_kernels(model, shard, routed_rows, assignments, local_experts, width, opts)
        if m.shared_experts:
            shared_width = _split(m.shared_experts * m.expert_ffn_hidden, tp, "the shared-expert width")
            out += _ffn(model, "shared", tokens, shared_width, act_bytes)
    out.append(_residual("mlp_residual", norm_rows, h, act_bytes))
    return out


def layer_kernels(
    model: ModelSpec,
    layer: int,
    shard: Shard,
    expert_tokens: float | None = None,
    flash_attention: bool = True,
    moe_options: MoEOptions | None = None,
) -> list[Kernel]:
    """Forward kernels of transformer layer ``layer`` (0-based) on the rank of ``shard``.

    The rank has ``shard.tokens`` = micro_batch_size * seq_len // cp token rows. GEMMs
    see all of them (sequence-parallel shards are all-gathered before them) with heads
    and FFN width split by ``tp``; norms and residual adds see ``tokens / tp`` under
    sequence parallelism. The attention core has ``tokens`` local queries against
    ``seq_len`` keys per sequence (context parallelism splits queries, every key is
    visited). MoE layers: the router GEMM over the rank's sequence-parallel shard, the
    routed experts as grouped GEMMs over ``experts / ep`` local experts of width
    ``expert_ffn_hidden / etp`` processing ``expert_tokens`` token-expert assignments
    (default: the balanced ``tokens/tp * top_k * etp``), and the shared experts split by
    ``tp``; around the experts, the kernels Megatron-Core runs (:func:`workloads.moe_kernels.moe_kernels`:
    router, top-k, balance statistics, token-count histogram, permutations), per
    ``moe_options`` (:class:`workloads.moe_kernels.MoEOptions`). ``parallel_block`` changes ordering, not kernels or FLOPs. Without
    ``flash_attention`` the materialised scores add an ``attn_scores`` memory-bound
    kernel (softmax, dropout, their reads and writes).

    Raises ``ValueError`` naming the parallel degree that does not divide the
    model, or ``IndexError`` for a layer outside the model.
    """
    if not 0 <= layer < model.layers:
        raise IndexError(f"layer {layer} outside 0..{model.layers - 1} of {model.name!r}")
    return _block_kernels(model, model.is_moe_layer(layer), shard, expert_tokens, flash_attention, moe_options)


def embedding_kernels(model: ModelSpec, shard: Shard) -> list[Kernel]:
    """Token-embedding lookup on one rank: no FLOPs. The table is split by vocab
    over ``tp`` (Megatron's vocab-parallel embedding): the rank reads the token
    ids, its expected share ``tokens/tp`` of the looked-up rows, and writes the
    full ``tokens x hidden`` output that the TP reduction then sums."""
    h, tokens = model.hidden, shard.tokens
    traffic = _TOKEN_ID_BYTES * tokens + shard.act_bytes * (tokens / shard.tp * h + tokens * h)
    return [Kernel("embed", "embedding", 0.0, traffic)]


def head_kernels(model: ModelSpec, shard: Shard) -> list[Kernel]:
    """Final norm, LM-head GEMM (vocab split by ``tp``) and cross-entropy loss.

    The loss kernel is Megatron's vocab-parallel cross-entropy: it reads the
    rank's logits and keeps fp32 softmax values for the backward, so its traffic
    is ``tokens * vocab/tp * (act_bytes + 4)``. A vocabulary that ``tp`` does not
    divide is padded (the GEMM's ``n`` rounds up; FLOPs stay exact)."""
    h, v, tokens, act_bytes = model.hidden, model.vocab, shard.tokens, shard.act_bytes
    norm_rows = shard.sp_rows(tokens)
    local_vocab = v / shard.tp  # exact share for FLOPs and bytes; the GEMM's n is the padded shard
    head = Kernel(
        "lm_head",
        "gemm",
        2.0 * tokens * local_vocab * h,
        act_bytes * (tokens * h + tokens * local_vocab + local_vocab * h),
        tokens,
        math.ceil(local_vocab),
        h,
    )
    logits = tokens * local_vocab
    loss = Kernel("loss", "elementwise", _CROSS_ENTROPY_FLOPS_PER_ELEMENT * logits, logits * (act_bytes + _FP32_BYTES))
    return [_norm(model, "final_norm", norm_rows, h, act_bytes), head, loss]


def mtp_kernels(
    model: ModelSpec, shard: Shard, expert_tokens: float | None = None, moe_options: MoEOptions | None = None
) -> list[Kernel]:
    """Forward kernels of the multi-token-prediction modules (DeepSeek-V3,
    arXiv 2412.19437 §2.2), in order; empty when ``mtp_depth == 0``.

    Module ``d`` embeds the tokens shifted by ``d+1`` with the shared embedding,
    RMS-normalises that and the previous depth's hidden state, projects their
    concatenation ``2h -> h`` (split by ``tp``), runs one transformer block (with
    the FFN of the last main layer, its attention fused) and the shared output head
    and loss. Kernel names carry the prefix ``mtp<d>.``.
    """
    out: list[Kernel] = []
    h, tokens, act_bytes = model.hidden, shard.tokens, shard.act_bytes
    norm_rows = shard.sp_rows(tokens)
    for d in range(model.mtp_depth):
        block: list[Kernel] = embedding_kernels(model, shard)
        block.append(_norm(model, "hidden_norm", norm_rows, h, act_bytes))
        block.append(_norm(model, "embed_norm", norm_rows, h, act_bytes))
        block.append(_gemm("proj", tokens, _split(h, shard.tp, "hidden"), 2 * h, act_bytes))
        block += _block_kernels(model, _mtp_block_is_moe(model), shard, expert_tokens, True, moe_options)
        block += head_kernels(model, shard)
        out += [replace(k, name=f"mtp{d}.{k.name}") for k in block]
    return out


# ---------------------------------------------------------------------------
# Model FLOPs
# ---------------------------------------------------------------------------


def matmul_flops(kernels) -> float:
    """FLOPs of the matmul kinds (GEMMs and attention products) among ``kernels``: what model
    FLOPs, HFU and the engine's per-rank tally count."""
    return sum(k.flops for k in kernels if k.kind in MATMUL_KINDS)


def forward_flops_per_token(model: ModelSpec, seq_len: int, include_mtp: bool = True) -> float:
    """Forward matmul FLOPs per token over all layers, the LM head and (by
    default) the MTP modules, with the attention convention of the module notes.
    Computed from the same kernels the simulator runs, at one token, ``tp=1``."""
    if seq_len < 1:
        raise WorkloadError(f"must be a positive integer, got {seq_len!r}", field="training.seq_len")
    # One token: a sequence cut over seq_len context-parallel ranks (one query, every key).
    one = Shard(micro_batch_size=1, seq_len=seq_len, cp=seq_len)
    total = sum(matmul_flops(layer_kernels(model, i, one)) for i in range(model.layers))
    total += matmul_flops(head_kernels(model, one))
    if include_mtp:
        total += matmul_flops(mtp_kernels(model, one))
    return total


def model_flops_per_token(model: ModelSpec, seq_len: int, include_mtp: bool = True) -> float:
    """Model FLOPs (forward + backward, no recomputation) per token:
    ``(1 + backward_flops_factor()) * forward_flops_per_token``. For a GPT model
    (no MTP) this is Narayanan et al. Eq. 3 without its recompute pass, per
    token: ``72*l*h^2*(1 + s/(6h) + V/(12*l*h))``."""
    return (1.0 + backward_flops_factor()) * forward_flops_per_token(model, seq_len, include_mtp)


def model_flops_per_step(model: ModelSpec, training: TrainingSpec, include_mtp: bool = True) -> float:
    """Model FLOPs of one optimizer step: per-token model FLOPs times the
    step's ``global_batch_size * seq_len`` tokens."""
    return model_flops_per_token(model, training.seq_len, include_mtp) * training.tokens_per_step
