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

import functools
import math
from dataclasses import replace
from typing import TYPE_CHECKING

from workloads.errors import WorkloadError
from workloads.kernels import (
    _CROSS_ENTROPY_FLOPS_PER_ELEMENT,
    _FP32_BYTES,
    _TOKEN_ID_BYTES,
    _UNFUSED_SCORE_BYTES,
    CAUSAL_EXECUTED_FRACTION,
    MATMUL_KINDS,
    UNFUSED_SCORES_KERNEL,
    Kernel,
    _ffn,
    _gemm,
    _norm,
    _residual,
    backward_flops_factor,
)
from workloads.model import ModelSpec
from workloads.shapes import _local_heads, _local_kv_heads, _mtp_block_is_moe, _split, mla_down_widths
from workloads.shard import Shard
from workloads.training import TrainingSpec

if TYPE_CHECKING:  # workloads.moe_kernels builds on this module's kernels
    from workloads.moe_kernels import MoEOptions


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
        # DeepSeek-V2 §2.1 (arXiv 2405.04434): down projections to the query and KV latents
        # (plus the shared RoPE key), their norms, up projections and the output projection
        # split by heads. Megatron-Core runs the down projections on 1/tp of the work either
        # way (parallel.mla_down_proj, workloads.layout): duplicated on the rank's
        # sequence-parallel rows, or column-parallel on the whole sequence; the latents' norms
        # see the shard's rows.
        d_qk = mla.qk_head_dim
        down_rows = tokens if shard.mla_down_proj == "column" else norm_rows
        q_down, kv_down = mla_down_widths(mla, shard.tp, shard.mla_down_proj)
        if mla.q_lora_rank:
            out.append(_gemm("q_down", down_rows, q_down, h, act_bytes))
            out.append(_norm(model, "q_down_norm", norm_rows, mla.q_lora_rank, act_bytes))
            out.append(_gemm("q_up", tokens, heads * d_qk, mla.q_lora_rank, act_bytes))
        else:
            out.append(_gemm("q_proj", tokens, heads * d_qk, h, act_bytes))
        out.append(_gemm("kv_down", down_rows, kv_down, h, act_bytes))
        out.append(_norm(model, "kv_down_norm", norm_rows, mla.kv_lora_rank, act_bytes))
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
        # the allgather dispatcher gathers the shards of the expert-TP x EP group
        gathered = routed_rows * shard.etp * shard.ep
        out += moe_kernels(model, shard, routed_rows, assignments, local_experts, width, opts, gathered)
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


@functools.lru_cache(maxsize=256)
def forward_flops_per_token(model: ModelSpec, seq_len: int, include_mtp: bool = True) -> float:
    """Forward matmul FLOPs per token over all layers, the LM head and (by
    default) the MTP modules, with the attention convention of the module notes.
    Computed from the same kernels the simulator runs, at one token, ``tp=1``; remembered
    per (frozen, hashable) model and sequence length, since every scenario load checks the
    step's model FLOPs (``stepsim search`` and ``ppmap`` load thousands of layouts of one model)."""
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
