"""Memory formulas, in bytes: activations stashed for the backward pass, and the
per-rank weights, gradients and optimizer states.

Activations
-----------
Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", arXiv 2205.05198, §4 and Table 2) count, for a GPT layer with 16-bit
activations and 1-byte dropout masks, the tensors each operation keeps for its
backward (``a`` heads, ``s`` sequence, ``b`` micro-batch, ``h`` hidden, ``t`` TP):

==============================  ==========  ================================
tensor kept                     bytes       split by ``t``
==============================  ==========  ================================
pre-attention norm input        2sbh        only with sequence parallelism
QKV GEMM input (norm output)    2sbh        only with sequence parallelism
Q and K (for ``Q K^T``)         4sbh        always (heads)
softmax output                  2as^2b      always
softmax dropout mask            as^2b       always
softmax dropout output (P V)    2as^2b      always
V                               2sbh        always
out-projection input            2sbh        always
attention dropout mask          sbh         only with sequence parallelism
pre-MLP norm input              2sbh        only with sequence parallelism
MLP up GEMM input               2sbh        only with sequence parallelism
GELU input (4h wide)            8sbh        always
down GEMM input (4h wide)       8sbh        always
MLP dropout mask                sbh         only with sequence parallelism
==============================  ==========  ================================

which sums to ``sbh(34 + 5as/h)``; ``sbh(10 + 24/t + 5as/(ht))`` under TP without
sequence parallelism, ``(sbh/t)(34 + 5as/h)`` with it, ``34sbh/t`` with selective
recompute (the ``s^2`` terms recomputed), and ``2sbh`` with full recompute (only
the layer input kept). :func:`activation_bytes_per_layer` builds the same table
tensor by tensor, so with ``dropout=True`` and a GELU MHA model it reproduces
those closed forms exactly, and it generalises them:

* **No dropout** (``dropout=False``, the default: modern LLMs train without it):
  no masks, and ``P V`` reads the softmax output itself, so the ``s^2`` part is
  ``2as^2b`` and the linear part loses ``2sbh``.
* **SwiGLU**: the gate/up GEMM output is ``2f`` wide and the down-GEMM input ``f``.
* **GQA/MQA**: K and V have ``kv_heads*head_dim`` columns (per TP rank: the local
  KV heads, replicated when ``t`` exceeds them).
* **MLA** (DeepSeek-V2 §2.1): the replicated down projections keep their input
  (the norm output) and the latents (query latent, KV latent + RoPE key, and their
  normed copies, not split by ``t``); the per-head Q, K (``qk_head_dim``) and V
  (``v_head_dim``) and the out-projection input are split by ``t``.
* **MoE**: the router keeps its input and fp32 routing probabilities; every
  token-expert assignment keeps its permuted input ``h``, the up GEMM output
  (``2f_e/etp`` or ``f_e/etp``) and the down GEMM input (``f_e/etp``), so routed
  memory scales with ``top_k * expert_ffn_hidden``. What the gate-weight gradient
  needs depends on where the gate weight multiplies (``moe_gate_weighting``):

  - ``"activation"`` (default): the weight scales the SwiGLU output, as Megatron-Core
    has done since core_v0.13 (NVIDIA/Megatron-LM commit 2659630, "Memory efficient
    token permutation", April 2025: the probabilities are permuted with the tokens and
    ``experts.py`` applies ``activation_func_with_probs``). The down projection is
    linear, so ``dL/dg = <dL/d(down input), act_out>`` comes from tensors the backward
    has anyway; only the fp32 weight is kept per assignment (4 bytes).
  - ``"combine"``: the weight scales the expert output when tokens are un-permuted
    (Megatron-Core up to core_v0.12, NeMo 1.0 recipes: ``moe_utils.unpermute`` with
    ``probs``), whose backward keeps that 16-bit expert output, ``h`` per assignment
    (2h bytes: with DeepSeek-V3's ``h = 7168`` the largest per-assignment tensor).

  Shared experts behave like a dense FFN.
* **Flash attention** (``flash_attention=True``): the ``s x s`` scores are never
  materialised, exactly as selective recompute (they are recomputed in the
  backward); the kernel keeps an fp32 log-sum-exp per query and head instead.
* **Context parallelism**: each rank keeps tensors for its ``s/cp`` tokens; a
  materialised score block is ``(s/cp) x s`` per head.

DeepSeek-V3's activation savings
--------------------------------
``activation_saving="deepseek-v3"`` (FP8 training; DeepSeek-V3, arXiv 2412.19437,
§3.2.3 and §3.3.2; Kimi K2 reports the same recipe): every RMSNorm output is
recomputed from its input (so the inputs of the QKV / down projections, the router,
the up GEMMs and the normed MLA latents are not kept); MLA's up-projections are
recomputed from the latents (per-head Q, K, V not kept); the attention output is
cached in E5M6 (1.5 bytes); the routed experts' permuted inputs and every SwiGLU
input are cached in FP8 (1 byte) and the SwiGLU output is recomputed. The
recomputed kernels are charged to the backward pass by the trace (phase ``R``).
DeepSeek-V3's list of cached tensors (§3.3.2) holds no expert output, so its preset
uses ``moe_gate_weighting="activation"``; it also keeps the AdamW moments in BF16
(§3.3.3, "low-precision optimizer states": ``TrainingSpec.optimizer_state_dtype``).

Recompute policies
------------------
Under ``recompute="selective"``, ``recompute_modules`` names what is recomputed instead
of kept: Megatron-Core's ``--recompute-modules`` (``core_attn``, ``layernorm``,
``mla_up_proj``, ``moe_act``), or ``matmul_outputs``, JAX's
``jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims``, which MaxText runs as
``remat_policy: minimal`` (MaxText/layers/models.py, ``Decoder``: "minimal" maps to that
policy). It saves only the outputs of ``dot_general`` ops without batch dimensions (the
projections and FFN GEMMs; not the attention products, whose heads and batch are batch
dimensions) and what the scanned layer takes as input; everything else the backward
needs is recomputed from them. A dense MHA SwiGLU layer (``t = 1``, 16-bit, flash
attention) keeps its input (``h`` per token), Q, K and V (``3h``), the out-projection
output (``h``, in place of its input: same bytes) and the two FFN up outputs (``2f``):
``2sbh(5 + 2f/h)`` bytes, against ``2sbh(8 + 3f/h)`` for plain selective recompute, which
also keeps the two norm outputs, the pre-FFN residual and the activation output. Norms,
residual adds, the activation and the flash attention forward run again before the
layer's backward. Routed experts keep their up outputs only
(the permutation is a gather).

Weights, gradients, optimizer states
------------------------------------
ZeRO (Rajbhandari et al. 2019, arXiv 1910.02054, §5 and Fig. 1): with ``Ψ``
parameters in mixed-precision Adam a rank keeps ``2Ψ`` 16-bit weights, ``2Ψ``
16-bit gradients and ``KΨ`` optimizer bytes with ``K = 12`` (fp32 master copy,
momentum, variance). Stage 1 shards the optimizer states over the ``N_d``
data-parallel ranks, stage 2 also the gradients, stage 3 also the weights. See
:func:`state_bytes` for the dtypes actually used by Megatron-LM and DeepSeek-V3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from workloads import counts, enums
from workloads.errors import WorkloadError
from workloads.layout import ParallelLayout
from workloads.model import ModelSpec
from workloads.training import RECOMPUTE_MODULES

_MASK_BYTES = 1  # dropout masks are stored as bytes (Korthikanti §4.1)
_FP32_BYTES = 4
_TOKEN_ID_BYTES = 8
RECOMPUTE_MODES = enums.RECOMPUTE_MODES
ACTIVATION_SAVINGS = ("none", "deepseek-v3")
MOE_GATE_WEIGHTINGS = ("activation", "combine")
_FP8_BYTES = 1  # FP8 activation cache (DeepSeek-V3 §3.3.2)
_E5M6_BYTES = 1.5  # the attention output's 12-bit cache (E5M6, DeepSeek-V3 §3.3.2)
OPTIMIZERS = ("adam", "muon", "sgd")
DTYPES = ("bf16", "fp8")


def _check_recompute(recompute: str) -> None:
    if recompute not in RECOMPUTE_MODES:
        raise WorkloadError("training.recompute", f"must be one of {', '.join(RECOMPUTE_MODES)}, got {recompute!r}")


def _sp_rows(tokens: float, tp: int, sequence_parallel: bool) -> float:
    return tokens / tp if sequence_parallel and tp > 1 else tokens


def activation_bytes_per_layer(
    model: ModelSpec,
    layer: int,
    micro_batch_size: int,
    seq_len: int,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = True,
    recompute: str = "none",
    ep: int = 1,
    dropout: bool = False,
    act_bytes: int = 2,
    flash_attention: bool = False,
    etp: int = 1,
    expert_tokens: Optional[float] = None,
    activation_saving: str = "none",
    moe_gate_weighting: str = "activation",
    recompute_modules: tuple = (),
) -> float:
    """Bytes one transformer layer keeps on one rank from its forward until its
    backward, for one micro-batch (see the module notes for the per-tensor table
    and its sources).

    ``recompute``: ``'none'``; ``'selective'`` (Korthikanti: the attention
    ``s^2`` tensors are recomputed); ``'full'`` (only the layer input is kept:
    ``2sbh``, split by ``tp`` under sequence parallelism). ``flash_attention``
    drops the ``s^2`` tensors whatever ``recompute`` says; it defaults to False so
    that the defaults reproduce Korthikanti's formulas. ``expert_tokens``
    overrides the token-expert assignments this rank processes (load imbalance);
    ``ep`` must divide the routed experts. ``activation_saving="deepseek-v3"``: see
    the module notes (*DeepSeek-V3's activation savings*). ``moe_gate_weighting``:
    where the gate weight scales a routed expert (``"activation"`` or ``"combine"``,
    see the module notes, *MoE*).
    """
    _check_recompute(recompute)
    if not 0 <= layer < model.layers:
        raise IndexError(f"layer {layer} outside 0..{model.layers - 1} of {model.name!r}")
    return _block_activation_bytes(
        model,
        model.is_moe_layer(layer),
        micro_batch_size,
        seq_len,
        tp,
        cp,
        sequence_parallel,
        recompute,
        ep,
        dropout,
        act_bytes,
        flash_attention,
        etp,
        expert_tokens,
        activation_saving,
        moe_gate_weighting,
        recompute_modules,
    )


def _block_activation_bytes(
    model: ModelSpec,
    moe: bool,
    micro_batch_size: int,
    seq_len: int,
    tp: int,
    cp: int,
    sequence_parallel: bool,
    recompute: str,
    ep: int,
    dropout: bool,
    act_bytes: int,
    flash_attention: bool,
    etp: int,
    expert_tokens: Optional[float],
    activation_saving: str = "none",
    moe_gate_weighting: str = "activation",
    recompute_modules: tuple = (),
) -> float:
    counts._check_positive(tp=tp, cp=cp, ep=ep, etp=etp)
    if moe_gate_weighting not in MOE_GATE_WEIGHTINGS:
        raise WorkloadError(
            "training.moe_gate_weighting",
            f"must be one of {', '.join(MOE_GATE_WEIGHTINGS)}, got {moe_gate_weighting!r}",
        )
    if activation_saving not in ACTIVATION_SAVINGS:
        raise WorkloadError(
            "training.activation_saving", f"must be one of {', '.join(ACTIVATION_SAVINGS)}, got {activation_saving!r}"
        )
    if micro_batch_size < 1 or seq_len < 1:
        raise WorkloadError(
            "training", f"micro_batch_size and seq_len must be positive, got {micro_batch_size!r}, {seq_len!r}"
        )
    h = model.hidden
    tokens = micro_batch_size * seq_len / cp  # the rank's token rows
    rows_sp = _sp_rows(tokens, tp, sequence_parallel)  # replicated across TP unless sequence-parallel

    if recompute == "full":
        return act_bytes * rows_sp * h  # the layer input (Korthikanti §5: 2sbh)

    ds = activation_saving == "deepseek-v3"
    for mod in recompute_modules:
        if mod not in RECOMPUTE_MODULES:
            raise WorkloadError(
                "training.recompute_modules", f"{mod!r} not allowed; choose from {', '.join(RECOMPUTE_MODULES)}"
            )
    # Under DeepSeek-V3's savings a norm's output (a GEMM input) is recomputed from the
    # norm's input, MLA's up-projections from their latents, SwiGLU from its FP8 input;
    # Megatron-Core's recompute modules drop the same tensors one group at a time.
    dots = "matmul_outputs" in recompute_modules  # JAX checkpoint_dots_with_no_batch_dims (module notes)
    norm_out = 0 if ds or dots or "layernorm" in recompute_modules else act_bytes
    up_proj_kept = not (ds or "mla_up_proj" in recompute_modules)
    latent_norm_out = act_bytes if up_proj_kept and not dots else 0
    total = 0.0
    # ---- attention ---------------------------------------------------------
    total += act_bytes * rows_sp * h  # pre-attention norm input
    heads = counts._local_heads(model, tp)
    mla = model.attention
    if mla is None:
        d = model.head_dim
        kv = counts._local_kv_heads(model, tp)
        total += norm_out * rows_sp * h  # QKV GEMM input
        total += act_bytes * tokens * (heads * d + 2 * kv * d)  # Q, K, V (local heads)
        v_width = heads * d
    else:
        d_qk, d_v = mla.qk_head_dim, mla.v_head_dim
        total += norm_out * rows_sp * h  # input of the down projections
        if mla.q_lora_rank:
            # query latent (norm input) and its normed copy (q_up input): replicated
            total += (act_bytes + latent_norm_out) * tokens * mla.q_lora_rank
        # KV latent + RoPE key (norm / rope input) and the normed latent (kv_up input)
        total += (
            act_bytes * tokens * (mla.kv_lora_rank + mla.qk_rope_head_dim) + latent_norm_out * tokens * mla.kv_lora_rank
        )
        if up_proj_kept:  # per-head Q, K, V: the up-projections' outputs
            total += act_bytes * tokens * heads * (2 * d_qk + d_v)
        v_width = heads * d_v
    # out-projection input (attention output); under matmul_outputs the attention output is
    # recomputed and the out-projection's output (as many bytes per token under SP) is kept instead
    total += (_E5M6_BYTES if ds else act_bytes) * tokens * v_width
    if dropout:
        total += _MASK_BYTES * rows_sp * h  # dropout after the out projection

    scores_stored = recompute == "none" and not flash_attention and "core_attn" not in recompute_modules
    if scores_stored:
        # One (s/cp) x s score block per local head and sequence.
        score_elems = micro_batch_size * (seq_len / cp) * seq_len * heads
        total += act_bytes * score_elems  # softmax output
        if dropout:
            total += (_MASK_BYTES + act_bytes) * score_elems  # dropout mask and output
    elif flash_attention and not dots:  # (under matmul_outputs the kernel reruns: nothing kept)
        total += _FP32_BYTES * tokens * heads  # log-sum-exp per query and head

    # ---- feed-forward ------------------------------------------------------
    if not dots:  # under matmul_outputs rebuilt from the layer input + out-projection output
        total += act_bytes * rows_sp * h  # pre-FFN norm input
    up = 2 if model.ffn == "swiglu" else 1
    # activation (SwiGLU / GELU) input and output (the down GEMM's input): under the
    # savings the input in FP8, the output recomputed from it
    act_in, act_out = (_FP8_BYTES, 0) if ds else (act_bytes, 0 if dots else act_bytes)
    if not moe:
        f = counts._split(model.ffn_hidden, tp, "ffn_hidden")
        total += norm_out * rows_sp * h  # up GEMM input
        total += tokens * (act_in * up * f + act_out * f)  # activation input, down GEMM input
    else:
        m = model.moe
        if tp > 1 and not sequence_parallel:
            raise WorkloadError(
                "parallel.sequence_parallel",
                "MoE layers with tp > 1 need sequence parallelism "
                "(Megatron-Core routes the sequence-parallel shard of tokens)",
            )
        counts._split(m.experts, ep, f"the {m.experts} routed experts", "parallel.ep")
        f = counts._split(m.expert_ffn_hidden, etp, "expert_ffn_hidden", "parallel.etp")
        total += norm_out * rows_sp * h  # router / shared-expert input
        total += _FP32_BYTES * rows_sp * m.experts  # routing probabilities
        assignments = rows_sp * m.top_k * etp if expert_tokens is None else float(expert_tokens)
        # per assignment: permuted input (FP8 under the savings), up out, down in, and
        # what the gate gradient needs: the fp32 gate weight ("activation") or the
        # 16-bit expert output ("combine")
        expert_in = _FP8_BYTES if ds else (0 if dots else act_bytes)  # a gather, not a matmul
        expert_act_out = 0 if "moe_act" in recompute_modules else act_out
        gate = _FP32_BYTES if moe_gate_weighting == "activation" else act_bytes * h
        total += assignments * (expert_in * h + act_in * up * f + expert_act_out * f + gate)
        if m.shared_experts:
            fs = counts._split(m.shared_experts * m.expert_ffn_hidden, tp, "the shared-expert width")
            total += tokens * (act_in * up * fs + act_out * fs)
    if dropout:
        total += _MASK_BYTES * rows_sp * h  # dropout after the FFN
    return total


def embedding_activation_bytes(
    model: ModelSpec,
    micro_batch_size: int,
    seq_len: int,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = True,
    dropout: bool = False,
) -> float:
    """Bytes the embedding keeps for its backward: the token ids (int64), plus
    the embedding-dropout mask when ``dropout`` (Korthikanti §4.3: ``sbh/t`` on
    the first pipeline stage, with sequence parallelism)."""
    tokens = micro_batch_size * seq_len / cp
    total = _TOKEN_ID_BYTES * tokens
    if dropout:
        total += _MASK_BYTES * _sp_rows(tokens, tp, sequence_parallel) * model.hidden
    return total


def head_activation_bytes(
    model: ModelSpec,
    micro_batch_size: int,
    seq_len: int,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = True,
    act_bytes: int = 2,
) -> float:
    """Bytes the output layer keeps: final-norm input and LM-head input (16-bit,
    ``h`` wide) and the fp32 logits the cross entropy needs, split by vocab over
    ``tp``: ``(4sbh/t)(1 + V/h)`` with sequence parallelism, as Korthikanti §4.3
    counts the output layer (``2sbh/t + 2sbh/t + 4sbV/t``)."""
    counts._check_positive(tp=tp, cp=cp)
    tokens = micro_batch_size * seq_len / cp
    rows = _sp_rows(tokens, tp, sequence_parallel)
    return 2 * act_bytes * rows * model.hidden + _FP32_BYTES * tokens * model.vocab / tp


def mtp_activation_bytes(
    model: ModelSpec,
    micro_batch_size: int,
    seq_len: int,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = True,
    recompute: str = "none",
    ep: int = 1,
    dropout: bool = False,
    act_bytes: int = 2,
    flash_attention: bool = False,
    etp: int = 1,
    expert_tokens: Optional[float] = None,
    activation_saving: str = "none",
    moe_gate_weighting: str = "activation",
    recompute_modules: tuple = (),
) -> float:
    """Bytes the MTP modules (DeepSeek-V3 §2.2) keep: per depth, the two norm
    inputs and the ``2h`` projection input, one transformer block and an output
    head; 0 when ``mtp_depth == 0``."""
    _check_recompute(recompute)
    if model.mtp_depth == 0:
        return 0.0
    tokens = micro_batch_size * seq_len / cp
    rows = _sp_rows(tokens, tp, sequence_parallel)
    per = _TOKEN_ID_BYTES * tokens
    per += act_bytes * (2 * rows * model.hidden + tokens * 2 * model.hidden)
    per += _block_activation_bytes(
        model,
        counts._mtp_block_is_moe(model),
        micro_batch_size,
        seq_len,
        tp,
        cp,
        sequence_parallel,
        recompute,
        ep,
        dropout,
        act_bytes,
        flash_attention,
        etp,
        expert_tokens,
        activation_saving,
        moe_gate_weighting,
        recompute_modules,
    )
    per += head_activation_bytes(model, micro_batch_size, seq_len, tp, cp, sequence_parallel, act_bytes)
    return model.mtp_depth * per


# ---------------------------------------------------------------------------
# Parameters on one rank
# ---------------------------------------------------------------------------


def rank_parameter_counts(
    model: ModelSpec,
    layout: ParallelLayout,
    stage_layers: range,
    has_embedding: bool,
    has_head: bool,
    has_mtp: Optional[bool] = None,
) -> tuple[int, int]:
    """``(dense, expert)`` parameters one rank holds for the transformer layers
    ``stage_layers`` (plus embedding / head / MTP when it holds them).

    ``tp`` splits attention heads, FFN and shared-expert widths and the
    vocabulary (padded up to a multiple of ``tp``); norms, MLA down projections,
    routers and row-parallel output biases are replicated. ``ep`` splits the
    routed experts, ``etp`` each expert's width; expert parameters are the
    routed experts only (they are replicated over ``edp`` ranks, the rest over
    ``dp*cp``; under MoE Parallel Folding ``edp = tp*cp*dp / (ep*etp)``, see
    :mod:`workloads.layout`). A rank with the head but not the embedding of a model with tied
    embeddings or MTP keeps a copy of the embedding table (Megatron-LM keeps the
    tied word embeddings on the last stage and syncs their gradients; DeepSeek-V3's
    MTP modules share the embedding). ``has_mtp`` defaults to ``has_head`` (MTP
    runs after the output head, on the last stage).
    """
    units = rank_parameter_units(model, layout, stage_layers, has_embedding, has_head, has_mtp)
    return sum(u[1] for u in units), sum(u[2] for u in units)


def rank_parameter_units(
    model: ModelSpec,
    layout: ParallelLayout,
    stage_layers,
    has_embedding: bool,
    has_head: bool,
    has_mtp: Optional[bool] = None,
) -> list[tuple[str, int, int]]:
    """The parameters one rank holds, cut into the units the trace reduces, gathers
    and shards as one bucket each: ``(name, dense, expert)`` with name ``"L<i>"``
    for transformer layer ``i``, ``"embed"`` for the input embedding table and
    ``"head"`` for everything the last chunk adds (final norm, output projection or
    the tied table's copy, the MTP modules and their embedding copy). The units sum
    to :func:`rank_parameter_counts`; see it for what is split and what replicated.
    Units with no parameters are left out."""
    tp, ep, etp = layout.tp, layout.ep, layout.etp
    h = model.hidden
    units: list[tuple[str, int, int]] = []
    for i in stage_layers:
        if not 0 <= i < model.layers:
            raise IndexError(f"layer {i} outside 0..{model.layers - 1} of {model.name!r}")
        d, e = counts._block_params(model, model.is_moe_layer(i), tp, ep, etp)
        units.append((f"L{i}", d, e))
    if has_mtp is None:
        has_mtp = has_head
    table = math.ceil(model.vocab / tp) * h  # one vocab-parallel shard
    if has_embedding:
        units.append(("embed", table, 0))
    dense = expert = 0
    if has_head:
        dense += counts._norm_params(model, h)
        if not model.tied_embeddings or not has_embedding:
            dense += table
    if has_mtp and model.mtp_depth:
        if not (has_embedding or (has_head and model.tied_embeddings)):
            dense += table  # the shared embedding the MTP modules look tokens up in
        d, e = counts._block_params(model, counts._mtp_block_is_moe(model), tp, ep, etp)
        proj = counts._split(h, tp, "hidden") * 2 * h + (counts._split(h, tp, "hidden") if model.bias else 0)
        dense += model.mtp_depth * (d + proj + 3 * counts._norm_params(model, h))
        expert += model.mtp_depth * e
    if dense or expert:
        units.append(("head", dense, expert))
    return units


# ---------------------------------------------------------------------------
# Weights, gradients, optimizer states
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StateBytes:
    """Per-rank bytes of model state."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


# Optimizer buffers per parameter besides the master copy (Adam: momentum and
# variance, Kingma & Ba 2014; Muon: one momentum buffer, Jordan et al. 2024 /
# Liu et al. 2025 arXiv 2502.16982; SGD: heavy-ball momentum).
_OPTIMIZER_BUFFERS = {"adam": 2, "muon": 1, "sgd": 1}


def expert_replicas(layout: ParallelLayout) -> int:
    """Ranks holding the same routed-expert shard in one pipeline stage, over which
    the distributed optimizer shards expert states: ``tp*cp*dp / (ep*etp)``, Megatron-Core's
    ``expert_data_parallel_size = world / (etp * ep * pp)`` (``megatron/core/parallel_state.py``):
    with ``etp < tp`` the tensor-parallel peers, which all hold whole experts, are
    replicas too. This is ``layout.edp``, the group the trace reduces expert gradients over."""
    return layout.edp


def state_bytes(
    params_dense: float,
    params_expert: float,
    layout: ParallelLayout,
    dtype: str = "bf16",
    optimizer: str = "adam",
    master_weights: bool = True,
    grad_dtype_bytes: int = 4,
    moment_dtype_bytes: int = 4,
    weight_dtype_bytes: int = 2,
    master_bytes: int = _FP32_BYTES,
) -> StateBytes:
    """Per-rank bytes of weights, gradients and optimizer states for a rank that
    holds ``params_dense`` dense and ``params_expert`` routed-expert parameters
    (see :func:`rank_parameter_counts`), under ``layout.zero``.

    * ``weights``: ``weight_dtype_bytes`` (2: BF16) per parameter. FP8 training
      (``dtype='fp8'``) keeps the same BF16 weights and casts them per GEMM
      (DeepSeek-V3 §3.3: FP8 GEMMs, higher-precision weights); transient FP8
      copies are not counted.
    * ``gradients``: ``grad_dtype_bytes`` per parameter, 4 by default: Megatron-LM
      accumulates gradients in an FP32 buffer, and DeepSeek-V3 keeps FP32
      gradients (§3.3.3); Kimi K2 reports "BF16 parameters plus FP32 gradient
      buffers". Pass 2 for the 16-bit gradients of the ZeRO paper.
    * ``optimizer``: the master copy (``master_bytes``: 4 for FP32, 2 when only the low
      16 bits are kept beside the BF16 weight; when ``master_weights``) plus
      one (Muon, SGD with momentum) or two (Adam) buffers of
      ``moment_dtype_bytes``. Adam with FP32 moments gives ZeRO's ``K = 12``;
      Muon ``K = 8``; DeepSeek-V3 stores Adam moments in BF16
      (``moment_dtype_bytes=2``: ``K = 8``).

    ZeRO stage 1 shards the optimizer states, stage 2 also the gradients, stage 3
    also the weights (Rajbhandari et al., arXiv 1910.02054 §5): dense parameters
    over the ``dp*cp`` ranks that hold the same dense shard, expert parameters
    over the :func:`expert_replicas` ranks that hold the same experts. Stage 2/3 figures are the
    persistent shards; the transient full-size gradient bucket is a buffer.
    """
    if dtype not in DTYPES:
        raise WorkloadError("training.dtype", f"must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if optimizer not in OPTIMIZERS:
        raise WorkloadError("training.optimizer", f"must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    if params_dense < 0 or params_expert < 0:
        raise ValueError(f"parameter counts must be non-negative, got {params_dense!r}, {params_expert!r}")
    zero = layout.zero
    dense_shards = layout.dp * layout.cp
    expert_shards = expert_replicas(layout)

    def sharded(bytes_per_param: float, stage: int) -> float:
        if zero >= stage:
            return bytes_per_param * (params_dense / dense_shards + params_expert / expert_shards)
        return bytes_per_param * (params_dense + params_expert)

    k_opt = (master_bytes if master_weights else 0) + _OPTIMIZER_BUFFERS[optimizer] * moment_dtype_bytes
    return StateBytes(
        weights=sharded(weight_dtype_bytes, 3),
        gradients=sharded(grad_dtype_bytes, 2),
        optimizer=sharded(k_opt, 1),
    )


def training_state_bytes(params_dense: float, params_expert: float, layout: ParallelLayout, training) -> StateBytes:
    """:func:`state_bytes` with the dtypes a :class:`workloads.training.TrainingSpec`
    names (gradient buffer ``grad_dtype``, optimizer moments ``optimizer_state_dtype``)."""
    if training.master_weights == "none":  # FP32 weights that are their own master (JAX / MaxText)
        return state_bytes(
            params_dense,
            params_expert,
            layout,
            dtype=training.dtype,
            optimizer=training.optimizer,
            master_weights=False,
            grad_dtype_bytes=training.grad_bytes,
            moment_dtype_bytes=training.moment_bytes,
            weight_dtype_bytes=_FP32_BYTES,
        )
    return state_bytes(
        params_dense,
        params_expert,
        layout,
        dtype=training.dtype,
        optimizer=training.optimizer,
        grad_dtype_bytes=training.grad_bytes,
        moment_dtype_bytes=training.moment_bytes,
        master_bytes=2 if training.master_weights == "remainder" else _FP32_BYTES,
    )


def activation_options(training) -> dict:
    """The keyword arguments of the activation functions that a
    :class:`workloads.training.TrainingSpec` sets (one place for the trace and the
    search's estimate)."""
    return dict(
        flash_attention=training.flash_attention,
        activation_saving=training.activation_saving,
        moe_gate_weighting=training.moe_gate_weighting,
        recompute_modules=training.recompute_modules,
        dropout=training.dropout,
    )


#: Forward kernels (``workloads.counts`` names) each recompute module runs again before
#: a layer's backward; DeepSeek-V3's savings run every norm, the MLA up-projections and
#: every FFN activation (§3.2.3, §3.3.2). ``core_attn`` adds none: fused attention
#: rebuilds its scores inside its own backward kernel.
RECOMPUTED_KERNELS = {
    "core_attn": (),
    "layernorm": ("attn_norm", "mlp_norm"),
    "mla_up_proj": ("q_down_norm", "kv_down_norm", "q_up", "kv_up"),
    "moe_act": ("expert_act",),
    # JAX's checkpoint_dots_with_no_batch_dims: everything but the matmuls reruns, the
    # flash attention forward included (its output is not a dot_general output)
    "matmul_outputs": (
        "attn_norm",
        "mlp_norm",
        "q_down_norm",
        "kv_down_norm",
        "attn_core",
        "attn_residual",
        "mlp_act",
        "expert_act",
        "shared_act",
    ),
    "deepseek-v3": (
        "attn_norm",
        "mlp_norm",
        "q_down_norm",
        "kv_down_norm",
        "q_up",
        "kv_up",
        "mlp_act",
        "expert_act",
        "shared_act",
    ),
}


def recomputed_kernel_names(training) -> frozenset:
    """Names of the forward kernels recomputed before each layer's backward under the
    training's activation savings and recompute modules (empty under full recompute,
    which reruns the whole layer)."""
    if training.recompute == "full":
        return frozenset()
    groups = list(training.recompute_modules)
    if training.activation_saving == "deepseek-v3":
        groups.append("deepseek-v3")
    return frozenset(n for g in groups for n in RECOMPUTED_KERNELS[g])


# ---------------------------------------------------------------------------
# Transient buffers of sharded data parallelism
# ---------------------------------------------------------------------------

# ZeRO-3 / FSDP keeps the gathered weights of two units at once: the one computing and
# the next one, whose all-gather is prefetched (PyTorch FSDP's ``limit_all_gathers``,
# on by default: "GPU memory usage from only *two* consecutive FSDP instances (the
# current instance running computation and the next instance whose all-gather is
# prefetched)", torch.distributed.fsdp.FullyShardedDataParallel docs; Zhao et al. 2023,
# arXiv 2304.11277, the "rate limiter"). The trace gathers one unit ahead likewise.
FSDP_GATHERED_UNITS = 2


def sharding_buffer_bytes(
    unit_params: "list[float] | tuple[float, ...]",
    zero: int,
    weight_dtype_bytes: int = 2,
    grad_dtype_bytes: int = 4,
    gathered_units: int = FSDP_GATHERED_UNITS,
) -> float:
    """Peak bytes of the full-size transient buffers that ZeRO-2/3 add on one rank,
    for a rank holding units (layers, embedding, head: :func:`rank_parameter_units`)
    of ``unit_params`` parameters each (``dense + expert`` per rank):

    * ZeRO-2: the unsharded gradient of the unit being reduce-scattered (the largest
      unit), ``grad_dtype_bytes * max(unit)`` — the gradient is accumulated full-size
      per bucket and only its reduce-scattered shard is kept;
    * ZeRO-3 / FSDP: that, plus the gathered weights of ``gathered_units`` units
      (the one computing and the prefetched one): ``max(unit) * (gathered_units *
      weight_dtype_bytes + grad_dtype_bytes)``;
    * ZeRO-0/1: nothing (the full gradients and weights are persistent state).
    """
    if zero not in (0, 1, 2, 3):
        raise WorkloadError("parallel.zero", f"must be one of 0, 1, 2, 3, got {zero!r}")
    largest = float(max(unit_params, default=0.0))
    if zero == 2:
        return grad_dtype_bytes * largest
    if zero == 3:
        return (gathered_units * weight_dtype_bytes + grad_dtype_bytes) * largest
    return 0.0
