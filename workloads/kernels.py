"""Kernels as plain data: :class:`Kernel` (the FLOPs and HBM bytes of one kernel, its kind and
math dtype), their backward counterparts (:func:`backward_kernels`), and the constructors of
GEMM, norm, residual, activation and feed-forward kernels that :mod:`workloads.counts` and
:mod:`workloads.moe_kernels` build layers from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from workloads.model import ModelSpec
from workloads.shapes import _ffn_up_width

# "quantize": an FP8 quantisation pass (workloads.quantization), memory-bound at its own share of
# the HBM rate (ComputeCalibration.quantize_bandwidth_share)
KERNEL_KINDS = ("gemm", "attention", "elementwise", "norm", "embedding", "quantize")
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
#: The most launches one kernel may stand for (:attr:`Kernel.launches`; a trace file's bound).
MAX_KERNEL_LAUNCHES = 65536


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
    # A kernel timed by its recording, not the roofline (a GPU node of a recorded Chakra trace
    # with no FLOPs or bytes, workloads.trace.chakra): its measured seconds on any chip.
    recorded_s: float | None = None
    # Kernel launches it stands for: a grouped GEMM run as one GEMM per group (Transformer
    # Engine's GroupedLinear on its cuBLAS path, training.moe_expert_gemm: per-expert) is
    # ``groups``; each costs the host a launch and the GPU its per-kernel overhead.
    launches: int = 1


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

        def grad(suffix: str, m: int, n: int, k: int) -> Kernel:
            return Kernel(
                f"{kernel.name}.{suffix}",
                "gemm",
                half,
                nbytes,
                m,
                n,
                k,
                kernel.groups,
                math_dtype=dt,
                launches=kernel.launches,
            )

        return (grad("dgrad", kernel.m, kernel.k, kernel.n), grad("wgrad", kernel.k, kernel.n, kernel.m))
    if kernel.bwd_bytes is not None:  # a pass whose backward is not twice its forward
        if kernel.bwd_bytes <= 0:
            return ()
        return (Kernel(f"{kernel.name}.bwd", kernel.kind, kernel.flops, kernel.bwd_bytes, launches=kernel.launches),)
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
