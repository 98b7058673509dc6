"""FP8 quantisation passes: the memory-bound kernels an FP8 GEMM needs beside it.

An FP8 GEMM multiplies FP8 operands, but the activations and gradients a layer produces
are BF16: before each FP8 GEMM the framework quantises its activation input (forward) and
its output gradient (backward), each into the two copies the three GEMMs of a linear layer
read (Transformer Engine's *rowwise* and *columnwise* usages: forward ``input x weight^T``
reads the input rowwise, the weight gradient ``output_grad^T x input`` reads both columnwise,
the input gradient reads the output gradient rowwise; TransformerEngine d0067d0,
docs/features/low_precision_training/performance_considerations, Table 2). DeepSeek-V3
describes the same passes for its own framework: 128 BF16 values read from HBM, quantised
and written back as FP8, to be read again by the GEMM (arXiv 2412.19437 §3.5.2).

Bytes per quantised element (:func:`bytes_per_element`), by ``training.fp8_recipe``
(Megatron-Core's ``--fp8-recipe``, transformer_config.py at NVIDIA/Megatron-LM d98e8a64):

* every recipe reads the BF16 tensor once (2 B) and writes a 1-byte rowwise copy;
* the columnwise copy is a second byte: on Hopper for the per-tensor recipes (``delayed``,
  ``tensorwise``: FP8 tensor cores cannot read an FP8 operand columnwise, so TE's
  cast-transpose writes a transposed copy; Blackwell reads the one copy both ways), and on
  every chip for the block-scaled ones (``mxfp8``: 1x32 blocks along rows and along columns;
  ``blockwise``: 1x128 tiles, DeepSeek-V3's activation scaling), whose two copies carry
  different scales (TE performance_considerations, "Architecture differences");
* ``tensorwise`` (current scaling) needs the tensor's amax before it can scale it: one more
  read of the BF16 tensor (2 B), unless a norm kernel computed the amax as it wrote its
  output (TE normalization.cpp ``FUSED_NORM_AMAX_FP8``); ``delayed`` scales by the amax
  history and records the new amax in the cast kernel itself;
* block scales: one E8M0 byte per 32 elements a copy (``mxfp8``), one FP32 per 128
  (``blockwise``).

A GEMM whose input comes from a norm Transformer Engine fuses with it (``LayerNormLinear``:
the attention's QKV projection, a dense MLP's up projection, MLA's up-projections) is quantised by the norm
kernel under ``delayed`` (``FULLY_FUSED``: the norm writes FP8; on Hopper one transpose pass,
1 B read + 1 B written, makes the columnwise copy, less the byte the FP8 write saves) and has
its amax from the norm under ``tensorwise``; under the block-scaled recipes the norm and the
quantisation stay two kernels (TE normalization.cpp at d0067d0, ``UNFUSED`` without cuDNN).

Weights are not quantised here: Transformer Engine keeps their FP8 copies across micro-batches
(``training.fp8_weight_cache``) or they are FP8 already (``training.fp8_params``), a cost once
a step. Under FP8 dispatch the routed experts' first GEMM gets FP8 tokens (quantised before
the all-to-all, :attr:`workloads.training.TrainingSpec.fp8_dispatch`): its forward pass covers
the tokens before their top-k copies, ``1 / top_k`` of its rows. The GEMMs that run in their own dtype (the MoE router) have none.

Transformer Engine's fused grouped MLP (``training.moe_expert_gemm: fused-mlp``,
:func:`fuse_grouped_mlp`) quantises once each way around the routed experts: the experts'
input before FC1 and their output gradient before FC2's backward; the passes between the two
GEMMs run in their epilogues.

Checked against Transformer Engine's published GEMM benchmark (tests/test_quantization.py).
"""

from __future__ import annotations

from dataclasses import replace

from workloads.enums import FP8_RECIPES
from workloads.kernels import Kernel

#: Suffix of a quantisation kernel's name: ``<gemm>_quant`` runs before GEMM ``<gemm>``.
QUANT_SUFFIX = "_quant"
#: Under sequence parallelism, GEMMs whose input (forward) or output gradient (backward) is
#: all-gathered over the TP group: Transformer Engine quantises each rank's sequence shard
#: before the all-gather ("all-gather of quantized tensors ... quantization work is
#: distributed across GPUs", docs/features/low_precision_training/performance_considerations
#: at d0067d0), so a rank's pass covers ``1 / tp`` of the gathered rows. The column-parallel
#: linears read the gathered block input; the row-parallel ones get the gathered gradient.
GATHERED_INPUT_GEMMS = frozenset({"qkv_proj", "q_proj", "q_down", "kv_down", "mlp_up", "shared_up"})
GATHERED_GRAD_GEMMS = frozenset({"out_proj", "mlp_down", "shared_down"})
#: GEMMs whose input a Transformer Engine ``LayerNormLinear`` norm produces (module notes):
#: Megatron-Core's layer specs build the QKV projection, a dense MLP's first linear and, with
#: ``qk_layernorm``, MLA's up-projections as ``column_parallel_layer_norm_linear``
#: (megatron/core/models/gpt/gpt_layer_specs.py at d98e8a64); MLA's down-projections read the
#: separate input norm's output, each quantising it.
NORM_FED_GEMMS = frozenset({"qkv_proj", "mlp_up", "q_up", "kv_up"})

_BF16_READ = 2.0
_FP8_COPY = 1.0
#: Scale bytes per element and copy: an E8M0 byte per 32 (MXFP8, OCP MX spec v1.0), an FP32
#: per 128-element tile (TE Float8BlockScaling, DeepSeek-V3 §3.3.1's 1x128 tiles).
_SCALE_BYTES = {"mxfp8": 1.0 / 32.0, "blockwise": 4.0 / 128.0}


def saved_copy_bytes(recipe: str) -> float:
    """Bytes per element of the FP8 copy of a GEMM input Transformer Engine keeps for the weight
    gradient: one usage only, the columnwise one, or the rowwise shard where the input is
    all-gathered again in the backward (``transformer_engine/pytorch/module/linear.py``
    ``_Linear.forward`` at d0067d0: ``inputmat.update_usage`` drops the other before
    ``saved_inputmat = inputmat``), with its block scales."""
    if recipe not in FP8_RECIPES:
        raise ValueError(f"fp8 recipe {recipe!r}: choose from {', '.join(FP8_RECIPES)}")
    return _FP8_COPY + _SCALE_BYTES.get(recipe, 0.0)


def columnwise_copies(recipe: str, transpose_free: bool) -> int:
    """Extra FP8 copies for the columnwise usage: 0 where the chip reads the rowwise copy
    columnwise (Blackwell, per-tensor recipes), else 1."""
    if recipe in ("mxfp8", "blockwise"):
        return 1
    return 0 if transpose_free else 1


def bytes_per_element(recipe: str, transpose_free: bool, norm_fed: bool = False) -> float:
    """HBM bytes per element of one quantisation pass producing both usages (module notes).

    ``transpose_free``: the chip reads a per-tensor FP8 copy columnwise (Blackwell);
    ``norm_fed``: the tensor is a ``LayerNormLinear`` norm's output (forward only)."""
    if recipe not in FP8_RECIPES:
        raise ValueError(f"fp8 recipe {recipe!r}: choose from {', '.join(FP8_RECIPES)}")
    copies = 1 + columnwise_copies(recipe, transpose_free)
    if norm_fed and recipe == "delayed":
        # the norm writes FP8 itself, a byte less than BF16; on Hopper a transpose pass (read
        # the FP8 copy, write the column copy) adds two: one byte net. Blackwell's byte saved
        # is not counted (no pass, no negative kernel).
        return _FP8_COPY if copies > 1 else 0.0
    out = _BF16_READ + copies * (_FP8_COPY + _SCALE_BYTES.get(recipe, 0.0))
    if recipe == "tensorwise" and not norm_fed:
        out += _BF16_READ  # the amax pass
    return out


def gemm_rows(k: Kernel) -> float:
    """Token rows of a forward GEMM over all its groups (exact: from its FLOPs)."""
    return k.flops / (2.0 * k.n * k.k) if k.n and k.k else 0.0


def quantization_kernel(
    gemm: Kernel,
    recipe: str,
    transpose_free: bool,
    norm_fed: bool = False,
    input_share: float = 1.0,
    grad_share: float = 1.0,
) -> Kernel | None:
    """The pass quantising ``gemm``'s input (forward: ``input_share`` of its rows) and its
    output gradient (backward, the kernel's ``bwd_bytes``: ``grad_share`` of its rows), named
    ``<gemm>_quant``; None where it moves nothing. Norm-fed under ``delayed`` on Blackwell the
    norm writes FP8 and the forward moves nothing, but the kernel stays for the gradient's
    pass (one launch more)."""
    rows = gemm_rows(gemm)
    fwd = rows * input_share * gemm.k * bytes_per_element(recipe, transpose_free, norm_fed)
    bwd = rows * grad_share * gemm.n * bytes_per_element(recipe, transpose_free)
    if fwd <= 0 and bwd <= 0:
        return None
    # A GEMM run one per local expert (Kernel.launches) reads its splits quantised one by one:
    # Transformer Engine's split_quantize runs one quantize a split (multi_tensor_quantize_impl,
    # transformer_engine/pytorch/csrc/extensions/cast.cpp at d0067d0), fused into one
    # multi_cast_transpose kernel for delayed scaling only.
    launches = gemm.launches if recipe != "delayed" else 1
    return Kernel(gemm.name + QUANT_SUFFIX, "quantize", 0.0, fwd, bwd_bytes=bwd, launches=launches)


def with_quantization(
    kernels: list[Kernel],
    recipe: str,
    transpose_free: bool,
    input_shares: dict[str, float] | None = None,
    sp_shard: float = 1.0,
) -> list[Kernel]:
    """``kernels`` (one layer's forward kernels of an FP8 step) with a quantisation pass
    before each GEMM that runs in the step's FP8 (``math_dtype`` unset); ``input_shares``:
    per GEMM name, the share of its forward input rows quantised (FP8 dispatch: ``1 / top_k``);
    ``sp_shard``: ``1 / tp`` under sequence parallelism, the share of a gathered tensor a rank
    quantises (:data:`GATHERED_INPUT_GEMMS`, :data:`GATHERED_GRAD_GEMMS`), else 1."""
    shares = input_shares or {}
    out: list[Kernel] = []
    for k in kernels:
        if k.kind == "gemm" and k.math_dtype is None:
            share = shares.get(k.name, 1.0) * (sp_shard if k.name in GATHERED_INPUT_GEMMS else 1.0)
            grad = sp_shard if k.name in GATHERED_GRAD_GEMMS else 1.0
            q = quantization_kernel(k, recipe, transpose_free, k.name in NORM_FED_GEMMS, share, grad)
            if q is not None:
                out.append(q)
        out.append(k)
    return out


#: The routed experts' kernels (``workloads.moe_kernels``) that Transformer Engine's fused
#: grouped MLP runs inside its GEMMs' epilogues (:func:`fuse_grouped_mlp`).
FUSED_MLP_KERNELS = frozenset({"expert_act", "expert_down" + QUANT_SUFFIX})


def fuse_grouped_mlp(kernels: list[Kernel]) -> list[Kernel]:
    """One layer's quantised forward kernels (:func:`with_quantization`) with the routed experts
    run as Transformer Engine's fused grouped MLP for block-scaled FP8 on Blackwell
    (``training.moe_expert_gemm: fused-mlp``; Megatron-Core's ``--use-transformer-engine-op-fuser``
    with ``NVTE_CUTEDSL_FUSED_GROUPED_MLP=1``, which Megatron-Bridge's MXFP8 MoE recipes on GB200
    set from v0.6.0 on). In NVIDIA/TransformerEngine's ``ForwardGroupedMLP_CuTeGEMMSwiGLU_MXFP8``
    and ``BackwardGroupedMLP_CuTeGEMMDSwiGLU_MXFP8`` (transformer_engine/pytorch/ops/fused/
    forward_grouped_mlp.py and backward_grouped_mlp.py; the cuDNN front-end's SM100 CuTe DSL
    kernels ``grouped_gemm_glu`` / ``grouped_gemm_dglu``), for MXFP8 GroupedLinear + ScaledSwiGLU +
    GroupedLinear without biases:

    * forward, the experts' input is group-quantised once (``expert_up_quant``), FC1's kernel
      applies the SwiGLU and the routing weight in its epilogue and writes FC2's input already
      quantised: no ``expert_act`` kernel, no forward pass of ``expert_down_quant``;
    * backward, the experts' output gradient is group-quantised once, and FC2's input-gradient
      kernel applies the SwiGLU backward in its epilogue and writes FC1's output gradient
      already quantised: no activation backward, no quantisation of FC1's output gradient.

    The one pass each way is ``expert_up_quant``: its forward quantises the experts' input, its
    backward the experts' output gradient, the backward pass ``expert_down_quant`` had. Its backward kernel keeps the place of the pass it replaces, after the
    experts' gradient GEMMs rather than before them: the same op, so the same time. The
    epilogues' extra writes ride in the GEMMs and are not counted."""
    down_q = next((k for k in kernels if k.name == "expert_down" + QUANT_SUFFIX), None)
    if down_q is None:
        return kernels
    up_q = "expert_up" + QUANT_SUFFIX
    return [
        replace(k, bwd_bytes=down_q.bwd_bytes) if k.name == up_q else k
        for k in kernels
        if k.name not in FUSED_MLP_KERNELS
    ]
