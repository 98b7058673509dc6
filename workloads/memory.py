"""Memory formulas, in bytes: the per-rank weights, gradients and optimizer states, the parameters
a rank holds and their units, and the ZeRO-3 / FSDP gathering buffers. The activations stashed for
the backward pass are :mod:`workloads.activations`'s.

Weights, gradients, optimizer states
------------------------------------
ZeRO (Rajbhandari et al. 2019, arXiv 1910.02054, §5 and Fig. 1): with ``Ψ``
parameters in mixed-precision Adam a rank keeps ``2Ψ`` 16-bit weights, ``2Ψ``
16-bit gradients and ``KΨ`` optimizer bytes with ``K = 12`` (fp32 master copy,
momentum, variance). Stage 1 shards the optimizer states over the ``N_d``
data-parallel ranks, stage 2 also the gradients, stage 3 also the weights. See
:func:`state_bytes` for the dtypes actually used by Megatron-LM and DeepSeek-V3.

Memory as allocated
-------------------
What a framework allocates besides the formulas above, each a ``training`` option with the
framework's default (docs/scenario.md):

* **Distributed saved activations** (``distribute_saved_activations``, Megatron
  ``--distribute-saved-activations``): under full recompute the saved layer input is split
  over the TP group (:mod:`workloads.activations`, "Distributed saved activations").
* **FSDP's gather and reduce-scatter buffers** (ZeRO-2/3): the unsharded weights of the
  unit computing and of ``fsdp_prefetch_units`` prefetched ones, or of every unit from its
  forward to its backward without ``reshard_after_forward`` (ZeRO-3), plus the unsharded
  gradients of ``fsdp_grad_units`` units: the one being reduce-scattered and the one whose
  backward produces the next (:func:`sharding_buffer_bytes`).
* **Optimizers without FP32 master weights** (``master_weights``: :data:`MASTER_BYTES`;
  ``optimizer_state_dtype`` down to FP8 moments).
* **The caching allocator's reserve** (``allocator_reserve_fraction``): PyTorch's CUDA
  caching allocator keeps freed blocks cached and splits segments, so the bytes it holds
  (``torch.cuda.memory_reserved``) exceed those allocated (``memory_allocated``). The reserve
  is charged to what is allocated and freed within the step, the activations and the
  communication buffers, not to the persistent state that Megatron allocates once in large
  contiguous buffers: ``reserved = allocated + fraction x (activations + buffers)``, at every
  instant on every device. ``peak_memory_bytes`` stays the allocated peak (what the
  frameworks' ``max_memory_allocated`` reports); ``reserved_memory_bytes`` is the reserved
  peak, and ``oom`` compares it with the chip's ``hbm_bytes``: a run fits when what the
  allocator holds fits. The default fraction and its sources:
  :data:`workloads.training.ALLOCATOR_RESERVE_FRACTION` (0 on TPUs, where XLA assigns
  buffers when it compiles the step). The catalogue's 80 GB GPUs hold ``80e9`` bytes, below
  the 79.17 GiB (85.0e9 B) PyTorch reports as their total capacity ("79.17 GiB total
  capacity" in an A100 80 GB out-of-memory report, facebookresearch/metaseq pull request
  #314; "a total capacity of 79.18 GiB", vllm-project/compressed-tensors pull request #587);
  the difference stands for what neither term models (the CUDA context, NCCL's and
  cuBLAS's buffers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from workloads import enums, parameters, shapes
from workloads.errors import WorkloadError
from workloads.layout import ParallelLayout
from workloads.model import ModelSpec

_FP32_BYTES = 4
RECOMPUTE_MODES = enums.RECOMPUTE_MODES
OPTIMIZERS = ("adam", "muon", "sgd")
DTYPES = ("bf16", "fp8")


# ---------------------------------------------------------------------------
# Parameters on one rank
# ---------------------------------------------------------------------------


def rank_parameter_counts(
    model: ModelSpec,
    layout: ParallelLayout,
    stage_layers: range,
    has_embedding: bool,
    has_head: bool,
    has_mtp: bool | None = None,
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
    has_mtp: bool | None = None,
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
    block: dict[bool, tuple[int, int]] = {}  # an MoE layer or not -> its (dense, expert)
    for i in stage_layers:
        if not 0 <= i < model.layers:
            raise IndexError(f"layer {i} outside 0..{model.layers - 1} of {model.name!r}")
        moe = model.is_moe_layer(i)
        if moe not in block:
            block[moe] = parameters._block_params(model, moe, tp, ep, etp, mla_down_proj=layout.mla_down_proj)
        units.append((f"L{i}", *block[moe]))
    if has_mtp is None:
        has_mtp = has_head
    table = math.ceil(model.vocab / tp) * h  # one vocab-parallel shard
    if has_embedding:
        units.append(("embed", table, 0))
    dense = expert = 0
    if has_head:
        dense += parameters._norm_params(model, h)
        if not model.tied_embeddings or not has_embedding:
            dense += table
    if has_mtp and model.mtp_depth:
        if not (has_embedding or (has_head and model.tied_embeddings)):
            dense += table  # the shared embedding the MTP modules look tokens up in
        d, e = parameters._block_params(
            model, shapes._mtp_block_is_moe(model), tp, ep, etp, mla_down_proj=layout.mla_down_proj
        )
        proj = shapes._split(h, tp, "hidden") * 2 * h + (shapes._split(h, tp, "hidden") if model.bias else 0)
        dense += model.mtp_depth * (d + proj + 3 * parameters._norm_params(model, h))
        expert += model.mtp_depth * e
    if dense or expert:
        units.append(("head", dense, expert))
    return units


def rank_tp_replicated_params(model: ModelSpec, layout: ParallelLayout, stage_layers, has_head: bool) -> float:
    """The parameters of a rank's layers (and, ``has_head``, the final norm and the MTP
    modules) that every TP rank holds whole (:func:`parameters.tp_replicated_params`), whose
    gradients Megatron-Core all-reduces over TP under sequence parallelism; under ZeRO-3
    (Megatron-FSDP) a rank reduces its shard of them."""
    down = layout.mla_down_proj
    params = float(sum(parameters.tp_replicated_params(model, model.is_moe_layer(l), down) for l in stage_layers))
    if has_head:
        norm = parameters._norm_params(model, model.hidden)
        mtp = parameters.tp_replicated_params(model, shapes._mtp_block_is_moe(model), down)
        params += norm + model.mtp_depth * (mtp + 3 * norm)  # the final norm; each MTP module's
    return params / (layout.dp * layout.cp) if layout.zero == 3 else params


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
        raise WorkloadError(f"must be one of {', '.join(DTYPES)}, got {dtype!r}", field="training.dtype")
    if optimizer not in OPTIMIZERS:
        raise WorkloadError(f"must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}", field="training.optimizer")
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


#: Bytes per parameter of the optimizer's master copy of the weights, by
#: ``training.master_weights``, and of the weights the model computes with:
#:
#: * ``fp32``: a 4-byte master beside 2-byte BF16 weights (mixed-precision Adam, ZeRO's
#:   ``K = 12``; Megatron-LM's default ``--main-params-dtype fp32``);
#: * ``remainder``: the 16 low bits of the FP32 master beside the BF16 weight, its high bits
#:   (Apex DistributedFusedAdam ``store_param_remainders``, NeMo 1.0 for BF16 models);
#: * ``fp16``: a 2-byte FP16 master (Megatron ``--use-precision-aware-optimizer
#:   --main-params-dtype fp16``, Transformer Engine's FusedAdam keeps it;
#:   megatron/training/arguments.py and megatron/core/optimizer/optimizer_config.py at
#:   NVIDIA/Megatron-LM d98e8a64);
#: * ``none``: no copy, the weights themselves are FP32 and cast per matmul (JAX / MaxText
#:   ``weight_dtype: float32``): 4-byte weights;
#: * ``bf16``: no copy, the optimizer updates the 2-byte BF16 weights in place (pure BF16
#:   AdamW: BF16 parameters handed to the optimizer, as torchao.optim's AdamW variants
#:   with ``bf16_stochastic_round=True`` in pytorch/ao take them).
#:
#: Mixed-precision Adam with FP32 moments and gradients thus costs 2 + 4 + 4 + 8 = 18 bytes
#: per parameter with ``fp32``, 16 with ``fp16`` or ``remainder``, 14 with ``bf16``.
MASTER_BYTES = {"fp32": _FP32_BYTES, "remainder": 2, "fp16": 2, "none": 0, "bf16": 0}
WEIGHT_BYTES = {"fp32": 2, "remainder": 2, "fp16": 2, "none": _FP32_BYTES, "bf16": 2}


def training_state_bytes(params_dense: float, params_expert: float, layout: ParallelLayout, training) -> StateBytes:
    """:func:`state_bytes` with the dtypes a :class:`workloads.training.TrainingSpec`
    names (gradient buffer ``grad_dtype``, optimizer moments ``optimizer_state_dtype``,
    master copy ``master_weights``: :data:`MASTER_BYTES`)."""
    master = MASTER_BYTES[training.master_weights]
    return state_bytes(
        params_dense,
        params_expert,
        layout,
        dtype=training.dtype,
        optimizer=training.optimizer,
        master_weights=master > 0,
        grad_dtype_bytes=training.grad_bytes,
        moment_dtype_bytes=training.moment_bytes,
        weight_dtype_bytes=WEIGHT_BYTES[training.master_weights],
        master_bytes=master or _FP32_BYTES,
    )


#: Bytes a cached FP8 weight takes per parameter, by chip family: a rowwise and a columnwise
#: copy, one byte each -- on Hopper the per-tensor FP8 weight and its transpose (FP8 GEMMs take
#: only the TN layout there), on Blackwell MXFP8's two scalings (scales, 1/32 of it, not
#: counted); Blackwell's per-tensor recipe needs one copy only (non-TN FP8 GEMMs: TransformerEngine
#: pytorch/utils.py is_non_tn_fp8_gemm_supported, tensor/float8_tensor.py at d0067d0), which
#: this overstates by a byte. Other families have no Transformer Engine FP8 weights.
FP8_WEIGHT_CACHE_BYTES = {"hopper": 2, "blackwell": 2}


def fp8_weight_cache_bytes(layer_params: float, training, family: str, zero: int) -> float:
    """Bytes the transformer layers' FP8 weights take beyond the BF16 weights
    :func:`state_bytes` counts, for ``layer_params`` parameters (embedding and output layer run
    in BF16; norms and routers, a fraction of a per cent, are counted with the layers):

    * BF16 weights (``training.fp8_weight_cache``, Transformer Engine with Megatron-Core's
      default): the cached FP8 copy, :data:`FP8_WEIGHT_CACHE_BYTES` per parameter;
    * FP8 primary weights (``training.fp8_params``): the FP8 weight in place of the BF16 one,
      ``FP8_WEIGHT_CACHE_BYTES - 2`` (0: its two copies take the BF16 weight's 2 bytes);
    * nothing without FP8, with the cache off, or under ZeRO-3, whose gathered weights TE does not
      cache (module/layernorm_linear.py: no cache under FSDP2) and whose shards are counted at
      BF16 size."""
    if zero >= 3:  # (both keys need FP8 training: TrainingSpec refuses them otherwise)
        return 0.0
    per = FP8_WEIGHT_CACHE_BYTES.get(family)
    if per is None:
        return 0.0
    if training.fp8_params:
        return (per - 2) * layer_params
    return per * layer_params if training.fp8_weight_cache else 0.0


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
# training.fsdp_prefetch_units (default 1) sets the prefetched units: 1 + it are gathered.
FSDP_GATHERED_UNITS = 2


def grad_array_params(model: ModelSpec, layout: ParallelLayout, training) -> float | None:
    """The ``grad_array_params`` of :func:`sharding_buffer_bytes` for a training recipe:
    the largest weight array with ``grad_reduce_granularity: tensor``, else None (whole
    units)."""
    if training.grad_reduce_granularity != "tensor":
        return None
    return float(parameters.largest_weight_params(model, layout.tp, layout.ep, layout.etp))


def training_sharding_buffer_bytes(
    model: ModelSpec,
    layout: ParallelLayout,
    training,
    unit_params: list[float] | tuple[float, ...],
    weight_dtype_bytes: int = 2,
) -> float:
    """:func:`sharding_buffer_bytes` under a :class:`workloads.training.TrainingSpec`: the
    gradient dtype, ``grad_reduce_granularity``, ``fsdp_prefetch_units`` (units gathered at
    once: the computing one plus that many prefetched), ``reshard_after_forward`` and
    ``fsdp_grad_units`` (full-size unit gradients held at once)."""
    return sharding_buffer_bytes(
        unit_params,
        layout.zero,
        weight_dtype_bytes=weight_dtype_bytes,
        grad_dtype_bytes=training.grad_bytes,
        gathered_units=1 + training.fsdp_prefetch_units,
        grad_array_params=grad_array_params(model, layout, training),
        reshard_after_forward=training.reshard_after_forward,
        grad_units=training.fsdp_grad_units,
    )


def sharding_buffer_bytes(
    unit_params: list[float] | tuple[float, ...],
    zero: int,
    weight_dtype_bytes: int = 2,
    grad_dtype_bytes: int = 4,
    gathered_units: int = FSDP_GATHERED_UNITS,
    grad_array_params: float | None = None,
    reshard_after_forward: bool = True,
    grad_units: int = 1,
) -> float:
    """Peak bytes of the full-size transient buffers that ZeRO-2/3 add on one rank,
    for a rank holding units (layers, embedding, head: :func:`rank_parameter_units`)
    of ``unit_params`` parameters each (``dense + expert`` per rank):

    * ZeRO-2: the unsharded gradient being reduce-scattered, ``grad_dtype_bytes *
      max(unit)`` — the gradient is accumulated full-size per bucket and only its
      reduce-scattered shard is kept; ``grad_units`` such unit gradients at once (2 to
      overlap one unit's reduce-scatter with the next unit's backward: training
      ``fsdp_grad_units``); with ``grad_array_params`` (training
      ``grad_reduce_granularity: tensor``, the largest weight array:
      :func:`workloads.parameters.largest_weight_params`) one array at a time instead
      of whole units (XLA reduce-scatters each array as its matmul produces it);
    * ZeRO-3 / FSDP: that, plus the gathered weights of ``gathered_units`` units
      (the one computing and the prefetched ones, each counted as the largest): ``gathered_units *
      weight_dtype_bytes * max(unit)``; without ``reshard_after_forward`` every unit's
      gathered weights stay from its forward to its backward, so at the turn from the
      last forward to the first backward all of them are held: ``weight_dtype_bytes *
      sum(unit)`` (FSDP2 ``fully_shard(reshard_after_forward=False)``: "keeps the unsharded
      parameters in memory after forward and avoids the all-gather in backward",
      torch.distributed.fsdp.fully_shard docs, docs.pytorch.org/docs/stable/
      distributed.fsdp.fully_shard.html);
    * ZeRO-0/1: nothing (the full gradients and weights are persistent state).
    """
    if zero not in (0, 1, 2, 3):
        raise WorkloadError(f"must be one of 0, 1, 2, 3, got {zero!r}", field="parallel.zero")
    if gathered_units < 1:
        raise ValueError(f"gathered_units must be at least 1 (the computing unit), got {gathered_units!r}")
    if grad_units < 1:
        raise ValueError(f"grad_units must be at least 1, got {grad_units!r}")
    units = [float(u) for u in unit_params]
    largest = max(units, default=0.0)
    if grad_array_params is None:  # whole units, grad_units of them (at most every unit)
        grad_params = largest * min(grad_units, max(len(units), 1))
    else:
        grad_params = min(largest, float(grad_array_params))
    if zero == 2:
        return grad_dtype_bytes * grad_params
    if zero == 3:
        if reshard_after_forward:
            gathered = gathered_units * largest
        else:
            gathered = sum(units)
        return weight_dtype_bytes * gathered + grad_dtype_bytes * grad_params
    return 0.0
