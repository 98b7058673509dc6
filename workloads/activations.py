"""Activation memory, in bytes: the tensors each layer (and the embedding, the output layer and the
MTP modules) stashes for its backward pass, per micro-batch, under the recompute and saving policies.

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
tensor by tensor for one rank's :class:`~workloads.shard.Shard` under an
:class:`ActivationPolicy` (the training options below), so with ``dropout=True`` and a
GELU MHA model it reproduces those closed forms exactly, and it generalises them:

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

FP8 training
------------
Under ``training.dtype: fp8`` Transformer Engine's linear layers (the QKV, up and down
projections, MLA's projections, the routed and shared experts' GEMMs) quantise their input for
the forward GEMM and keep that FP8 copy, not the 16-bit input, for the weight gradient: one
usage of it (the columnwise copy, or the rowwise shard that the backward all-gathers again
under sequence parallelism), 1 byte an element plus the recipe's block scales
(``transformer_engine/pytorch/module/linear.py`` ``_Linear.forward``, ``saved_inputmat``;
``grouped_linear.py`` likewise; NVIDIA/TransformerEngine d0067d0;
:func:`workloads.quantization.saved_copy_bytes`). So a GEMM input the layer keeps only for
that GEMM (a norm output feeding the QKV or up projection, the SwiGLU output feeding the
down projection, a routed expert's permuted tokens) takes 1 byte an element instead of 2; the
norm output MLA's query and KV down projections both read is kept twice, a copy each, as
Megatron-Core's default MLA layer builds them (two linears; ``mla_down_proj_fusion`` fuses them).
Tensors other kernels keep stay 16-bit: the SwiGLU input, Q/K/V and the attention output
(which the fused attention keeps; under the ``delayed`` recipe the out projection keeps its
own FP8 copy beside it, from ``tensorwise`` on Megatron-Core has it keep the original
instead: ``set_save_original_input(self.linear_proj)``, megatron/core/transformer/attention.py
at NVIDIA/Megatron-LM d98e8a64), and the pre-MLP norm output of an MoE layer, which the
16-bit router keeps (a shared expert's up GEMM keeps its FP8 copy beside it). A module whose
input is recomputed (``layernorm``, ``moe_act``) keeps nothing, as before: Megatron-Core sets
``save_original_input`` on the linear after it. DeepSeek-V3's savings and JAX's dots policy say
what they keep themselves.

Distributed saved activations
-----------------------------
Under full recompute a layer keeps only its input, ``2sbh`` (``2sbh/t`` with sequence
parallelism). Megatron-LM's ``--distribute-saved-activations`` (``TransformerConfig.
distribute_saved_activations``) splits that saved input into ``t`` equal 1-D chunks, each TP
rank keeping one, and all-gathers it before the layer's recompute
(``megatron/core/tensor_parallel/random.py``, ``CheckpointFunction``: ``split_tensor_into_1d_
equal_chunks`` in the forward, ``gather_split_1d_tensor`` in the backward; NVIDIA/Megatron-LM
commit d98e8a64), so each rank keeps ``2sbh/t`` as sequence parallelism would. Megatron allows
it only with full recompute, ``t > 1`` and no sequence parallelism; so does stepsim
(``training.distribute_saved_activations``). The gathered input lives only during the
layer's recompute, where the rebuilt layer's activations (which contain it) are counted.

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
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads import shapes
from workloads.enums import FP8_RECIPES, RECOMPUTE_MODES
from workloads.errors import WorkloadError
from workloads.model import ModelSpec
from workloads.quantization import saved_copy_bytes
from workloads.shard import Shard
from workloads.training import RECOMPUTE_MODULES, TrainingSpec

_MASK_BYTES = 1  # dropout masks are stored as bytes (Korthikanti §4.1)
_FP32_BYTES = 4
_TOKEN_ID_BYTES = 8
ACTIVATION_SAVINGS = ("none", "deepseek-v3")
MOE_GATE_WEIGHTINGS = ("activation", "combine")
_FP8_BYTES = 1  # FP8 activation cache (DeepSeek-V3 §3.3.2)
_E5M6_BYTES = 1.5  # the attention output's 12-bit cache (E5M6, DeepSeek-V3 §3.3.2)


@dataclass(frozen=True)
class ActivationPolicy:
    """How a layer is trained, as far as what it keeps for its backward goes (the module notes).

    ``recompute``: ``'none'``; ``'selective'`` (Korthikanti: the attention ``s^2`` tensors
    are recomputed; ``recompute_modules`` names more, see *Recompute policies*); ``'full'``
    (only the layer input is kept: ``2sbh``, split by ``tp`` under sequence parallelism).
    ``flash_attention`` drops the ``s^2`` tensors whatever ``recompute`` says; it defaults
    to False so that the defaults reproduce Korthikanti's formulas (with ``dropout=True``
    for his masks). ``activation_saving="deepseek-v3"``: *DeepSeek-V3's activation
    savings*. ``moe_gate_weighting``: where the gate weight scales a routed expert
    (``"activation"`` or ``"combine"``, *MoE*). ``fp8_recipe``: the recipe of FP8 training
    (``None`` otherwise), whose linear layers keep FP8 copies of their inputs (*FP8 training*).
    Raises ``WorkloadError`` naming the ``training.`` field of a value outside these.
    """

    recompute: str = "none"
    flash_attention: bool = False
    dropout: bool = False
    activation_saving: str = "none"
    moe_gate_weighting: str = "activation"
    recompute_modules: tuple = ()
    distribute_saved_activations: bool = False
    fp8_recipe: str | None = None

    def __post_init__(self) -> None:
        if self.fp8_recipe is not None and self.fp8_recipe not in FP8_RECIPES:
            raise WorkloadError(
                f"must be one of {', '.join(FP8_RECIPES)}, got {self.fp8_recipe!r}", field="training.fp8_recipe"
            )
        if self.recompute not in RECOMPUTE_MODES:
            raise WorkloadError(
                f"must be one of {', '.join(RECOMPUTE_MODES)}, got {self.recompute!r}", field="training.recompute"
            )
        if self.moe_gate_weighting not in MOE_GATE_WEIGHTINGS:
            raise WorkloadError(
                f"must be one of {', '.join(MOE_GATE_WEIGHTINGS)}, got {self.moe_gate_weighting!r}",
                field="training.moe_gate_weighting",
            )
        if self.activation_saving not in ACTIVATION_SAVINGS:
            raise WorkloadError(
                f"must be one of {', '.join(ACTIVATION_SAVINGS)}, got {self.activation_saving!r}",
                field="training.activation_saving",
            )
        for mod in self.recompute_modules:
            if mod not in RECOMPUTE_MODULES:
                raise WorkloadError(
                    f"{mod!r} not allowed; choose from {', '.join(RECOMPUTE_MODULES)}",
                    field="training.recompute_modules",
                )

    @classmethod
    def of(cls, training: TrainingSpec) -> ActivationPolicy:
        """The policy a :class:`~workloads.training.TrainingSpec` sets (one place for the trace
        and the search's estimate)."""
        return cls(
            recompute=training.recompute,
            flash_attention=training.flash_attention,
            dropout=training.dropout,
            activation_saving=training.activation_saving,
            moe_gate_weighting=training.moe_gate_weighting,
            recompute_modules=training.recompute_modules,
            distribute_saved_activations=training.distribute_saved_activations,
            fp8_recipe=training.fp8_recipe if training.dtype == "fp8" else None,
        )


def _tokens(shard: Shard) -> float:
    """The rank's token rows, ``micro_batch_size * seq_len / cp`` (the exact share)."""
    return shard.micro_batch_size * shard.seq_len / shard.cp


def activation_bytes_per_layer(
    model: ModelSpec,
    layer: int,
    shard: Shard,
    policy: ActivationPolicy = ActivationPolicy(),
    expert_tokens: float | None = None,
) -> float:
    """Bytes transformer layer ``layer`` keeps on the rank of ``shard`` from its forward until
    its backward, for one micro-batch, under ``policy`` (see the module notes for the
    per-tensor table and its sources). ``expert_tokens`` overrides the token-expert
    assignments this rank processes (load imbalance); ``ep`` must divide the routed experts.
    """
    if not 0 <= layer < model.layers:
        raise IndexError(f"layer {layer} outside 0..{model.layers - 1} of {model.name!r}")
    return _block_activation_bytes(model, model.is_moe_layer(layer), shard, policy, expert_tokens)


def _saved_input_rows(shard: Shard, policy: ActivationPolicy) -> float:
    """Token rows of the layer input full recompute keeps on one rank: ``s/cp`` per sequence,
    split by ``tp`` under sequence parallelism or ``distribute_saved_activations`` (which
    Megatron allows only with ``tp > 1`` and without sequence parallelism: refused otherwise,
    naming the field)."""
    rows = shard.sp_rows(_tokens(shard))
    if not policy.distribute_saved_activations:
        return rows
    if shard.tp == 1 or shard.sequence_parallel:
        raise WorkloadError(
            "needs parallel.tp > 1 without parallel.sequence_parallel (Megatron-LM asserts both: "
            f"megatron/training/arguments.py, TransformerConfig); got tp {shard.tp}, "
            f"sequence_parallel {shard.sequence_parallel}",
            field="training.distribute_saved_activations",
        )
    return rows / shard.tp


@dataclass(frozen=True)
class _Kept:
    """Bytes per element the policy keeps of the tensors several parts of a layer share."""

    ds: bool  # DeepSeek-V3's savings
    dots: bool  # JAX checkpoint_dots_with_no_batch_dims (module notes)
    norm_out: float  # a norm's output, kept by the linear layer it feeds
    norm_out_16bit: float  # the same output where a 16-bit router or the MoE layer keeps it
    mla_down_in: float  # the norm output MLA's two down projections (or Q and KV down) keep
    up_proj_kept: bool  # MLA's per-head Q, K, V
    latent_norm_out: float  # MLA's normed latents
    linear_in: float  # a linear layer's input (FP8 training: its FP8 copy)
    fp8_copy: float  # bytes of a linear layer's own FP8 copy of its input (0 without FP8)
    fp8_proj_copy: float  # the out projection's FP8 copy beside the attention output

    @classmethod
    def of(cls, policy: ActivationPolicy, act_bytes: int) -> _Kept:
        # Under DeepSeek-V3's savings a norm's output (a GEMM input) is recomputed from the
        # norm's input, MLA's up-projections from their latents, SwiGLU from its FP8 input;
        # Megatron-Core's recompute modules drop the same tensors one group at a time.
        mods = policy.recompute_modules
        ds = policy.activation_saving == "deepseek-v3"
        dots = "matmul_outputs" in mods
        up_proj_kept = not (ds or "mla_up_proj" in mods)
        # FP8 training (module notes): Transformer Engine's linear layers keep their FP8 copy
        # of the input; JAX's dots policy and DeepSeek-V3's savings say themselves what is kept
        recipe = None if ds or dots else policy.fp8_recipe
        fp8_copy = saved_copy_bytes(recipe) if recipe else 0.0
        linear_in = fp8_copy or act_bytes
        norm_recomputed = ds or dots or "layernorm" in mods
        return cls(
            ds=ds,
            dots=dots,
            norm_out=0 if norm_recomputed else linear_in,
            norm_out_16bit=0 if norm_recomputed else act_bytes,
            # two linears read it, each keeping its own FP8 copy (Megatron-Core's default MLA spec,
            # linear_q_down_proj and linear_kv_down_proj: gpt_layer_specs.py at d98e8a64)
            mla_down_in=0 if norm_recomputed else (2 * fp8_copy or act_bytes),
            up_proj_kept=up_proj_kept,
            latent_norm_out=linear_in if up_proj_kept and not dots else 0,
            linear_in=linear_in,
            fp8_copy=fp8_copy,
            fp8_proj_copy=fp8_copy if recipe == "delayed" else 0.0,
        )


def _block_activation_bytes(
    model: ModelSpec, moe: bool, shard: Shard, policy: ActivationPolicy, expert_tokens: float | None
) -> float:
    if policy.recompute == "full":
        # the layer input (Korthikanti §5: 2sbh), split over TP by sequence parallelism or by
        # --distribute-saved-activations (module notes, "Distributed saved activations")
        return shard.act_bytes * _saved_input_rows(shard, policy) * model.hidden
    kept = _Kept.of(policy, shard.act_bytes)
    total = _attention_activation_bytes(model, shard, policy, kept)
    total = _ffn_activation_bytes(model, moe, shard, policy, kept, expert_tokens, total)
    if policy.dropout:
        total += _MASK_BYTES * shard.sp_rows(_tokens(shard)) * model.hidden  # dropout after the FFN
    return total


def _attention_activation_bytes(model: ModelSpec, shard: Shard, policy: ActivationPolicy, kept: _Kept) -> float:
    """The attention block's share: its norm and projection inputs, Q/K/V, the attention
    output and what the core keeps (scores or log-sum-exp), and the dropout mask after it."""
    h, act_bytes, norm_out = model.hidden, shard.act_bytes, kept.norm_out
    tokens = _tokens(shard)  # the rank's token rows
    rows_sp = shard.sp_rows(tokens)  # replicated across TP unless sequence-parallel
    total = 0.0
    total += act_bytes * rows_sp * h  # pre-attention norm input
    heads = shapes._local_heads(model, shard.tp)
    mla = model.attention
    if mla is None:
        d = model.head_dim
        kv = shapes._local_kv_heads(model, shard.tp)
        total += norm_out * rows_sp * h  # QKV GEMM input
        total += act_bytes * tokens * (heads * d + 2 * kv * d)  # Q, K, V (local heads)
        v_width = heads * d
    else:
        d_qk, d_v = mla.qk_head_dim, mla.v_head_dim
        total += kept.mla_down_in * rows_sp * h  # input of the down projections
        # Megatron-Core keeps the latents on the sequence-parallel shard, either way it splits
        # the down projections (parallel.mla_down_proj): the norms run there and the up
        # projections keep their input shard (gathered again for the weight gradient)
        if mla.q_lora_rank:
            # query latent (norm input) and its normed copy (q_up input)
            total += (act_bytes + kept.latent_norm_out) * rows_sp * mla.q_lora_rank
        # KV latent (norm input), the normed latent (kv_up input) and the RoPE key, which is
        # gathered for the whole sequence before the rotary embedding
        total += (
            act_bytes * (rows_sp * mla.kv_lora_rank + tokens * mla.qk_rope_head_dim)
            + kept.latent_norm_out * rows_sp * mla.kv_lora_rank
        )
        if kept.up_proj_kept:  # per-head Q, K, V: the up-projections' outputs
            total += act_bytes * tokens * heads * (2 * d_qk + d_v)
        v_width = heads * d_v
    # out-projection input (attention output); under matmul_outputs the attention output is
    # recomputed and the out-projection's output (as many bytes per token under SP) is kept instead
    total += (_E5M6_BYTES if kept.ds else act_bytes + kept.fp8_proj_copy) * tokens * v_width
    if policy.dropout:
        total += _MASK_BYTES * rows_sp * h  # dropout after the out projection

    scores_stored = (
        policy.recompute == "none" and not policy.flash_attention and "core_attn" not in policy.recompute_modules
    )
    if scores_stored:
        # One (s/cp) x s score block per local head and sequence.
        seq_len = shard.seq_len
        score_elems = shard.micro_batch_size * (seq_len / shard.cp) * seq_len * heads
        total += act_bytes * score_elems  # softmax output
        if policy.dropout:
            total += (_MASK_BYTES + act_bytes) * score_elems  # dropout mask and output
    elif policy.flash_attention and not kept.dots:  # (under matmul_outputs the kernel reruns: nothing kept)
        total += _FP32_BYTES * tokens * heads  # log-sum-exp per query and head
    return total


def _ffn_activation_bytes(
    model: ModelSpec,
    moe: bool,
    shard: Shard,
    policy: ActivationPolicy,
    kept: _Kept,
    expert_tokens: float | None,
    total: float,
) -> float:
    """``total`` plus the feed-forward block's share: its norm and GEMM inputs and the
    activation's input and output, or for an MoE block the router's, the routed experts'
    (per token-expert assignment) and the shared experts'."""
    h, act_bytes, ds, dots = model.hidden, shard.act_bytes, kept.ds, kept.dots
    tokens = _tokens(shard)
    rows_sp = shard.sp_rows(tokens)
    if not dots:  # under matmul_outputs rebuilt from the layer input + out-projection output
        total += act_bytes * rows_sp * h  # pre-FFN norm input
    up = 2 if model.ffn == "swiglu" else 1
    # activation (SwiGLU / GELU) input and output (the down GEMM's input): under the
    # savings the input in FP8, the output recomputed from it
    act_in, act_out = (_FP8_BYTES, 0) if ds else (act_bytes, 0 if dots else kept.linear_in)
    if not moe:
        f = shapes._split(model.ffn_hidden, shard.tp, "ffn_hidden")
        total += kept.norm_out * rows_sp * h  # up GEMM input
        total += tokens * (act_in * up * f + act_out * f)  # activation input, down GEMM input
        return total
    m = model.moe
    if shard.tp > 1 and not shard.sequence_parallel:
        raise WorkloadError(
            "MoE layers with tp > 1 need sequence parallelism "
            "(Megatron-Core routes the sequence-parallel shard of tokens)",
            field="parallel.sequence_parallel",
        )
    shapes._split(m.experts, shard.ep, f"the {m.experts} routed experts", "parallel.ep")
    f = shapes._split(m.expert_ffn_hidden, shard.etp, "expert_ffn_hidden", "parallel.etp")
    total += kept.norm_out_16bit * rows_sp * h  # router / shared-expert input
    total += _FP32_BYTES * rows_sp * m.experts  # routing probabilities
    assignments = rows_sp * m.top_k * shard.etp if expert_tokens is None else float(expert_tokens)
    # per assignment: permuted input (FP8 under the savings), up out, down in, and
    # what the gate gradient needs: the fp32 gate weight ("activation") or the
    # 16-bit expert output ("combine")
    expert_in = _FP8_BYTES if ds else (0 if dots else kept.linear_in)  # a gather, not a matmul
    expert_act_out = 0 if "moe_act" in policy.recompute_modules else act_out
    gate = _FP32_BYTES if policy.moe_gate_weighting == "activation" else act_bytes * h
    total += assignments * (expert_in * h + act_in * up * f + expert_act_out * f + gate)
    if m.shared_experts:
        fs = shapes._split(m.shared_experts * m.expert_ffn_hidden, shard.tp, "the shared-expert width")
        total += tokens * (act_in * up * fs + act_out * fs)
        if kept.norm_out_16bit:  # the shared up GEMM's own FP8 copy of the router's input
            total += kept.fp8_copy * rows_sp * h
    return total


def embedding_activation_bytes(model: ModelSpec, shard: Shard, policy: ActivationPolicy = ActivationPolicy()) -> float:
    """Bytes the embedding keeps for its backward: the token ids (int64), plus
    the embedding-dropout mask under ``policy.dropout`` (Korthikanti §4.3: ``sbh/t`` on
    the first pipeline stage, with sequence parallelism)."""
    tokens = _tokens(shard)
    total = _TOKEN_ID_BYTES * tokens
    if policy.dropout:
        total += _MASK_BYTES * shard.sp_rows(tokens) * model.hidden
    return total


def head_activation_bytes(model: ModelSpec, shard: Shard) -> float:
    """Bytes the output layer keeps: final-norm input and LM-head input (16-bit,
    ``h`` wide) and the fp32 logits the cross entropy needs, split by vocab over
    ``tp``: ``(4sbh/t)(1 + V/h)`` with sequence parallelism, as Korthikanti §4.3
    counts the output layer (``2sbh/t + 2sbh/t + 4sbV/t``)."""
    tokens = _tokens(shard)
    rows = shard.sp_rows(tokens)
    return 2 * shard.act_bytes * rows * model.hidden + _FP32_BYTES * tokens * model.vocab / shard.tp


def mtp_activation_bytes(
    model: ModelSpec,
    shard: Shard,
    policy: ActivationPolicy = ActivationPolicy(),
    expert_tokens: float | None = None,
) -> float:
    """Bytes the MTP modules (DeepSeek-V3 §2.2) keep: per depth, the two norm
    inputs and the ``2h`` projection input, one transformer block and an output
    head; 0 when ``mtp_depth == 0``."""
    if model.mtp_depth == 0:
        return 0.0
    tokens = _tokens(shard)
    rows = shard.sp_rows(tokens)
    per = _TOKEN_ID_BYTES * tokens
    per += shard.act_bytes * (2 * rows * model.hidden + tokens * 2 * model.hidden)
    per += _block_activation_bytes(model, shapes._mtp_block_is_moe(model), shard, policy, expert_tokens)
    per += head_activation_bytes(model, shard)
    return model.mtp_depth * per
