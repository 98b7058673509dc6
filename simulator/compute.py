"""Compute-time model: a roofline per kernel with calibrated efficiencies.

A kernel takes ``max(flops / (peak * eff), bytes / (hbm_bw * mem_eff)) +
launch_overhead_s``. ``eff`` depends on the kernel kind and, for GEMMs, on the
shape: small dimensions under-fill the tensor cores, modelled by a saturating
factor ``d / (d + gemm_dim_half)`` per GEMM dimension (a documented smooth
stand-in for tile quantisation; ``gemm_dim_half`` = 0 disables it).

Efficiencies are per chip *family*, never per scenario: one table for Ampere,
Hopper, Blackwell and TPU, documented in :data:`DEFAULT_COMPUTE_CALIBRATION` and
overridable as a whole (``compute:`` in the scenario) for a user's own hardware.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Mapping

from topologies.chips import ChipSpec
from workloads.counts import Kernel


@dataclass(frozen=True)
class ComputeCalibration:
    """Achieved fractions of datasheet peaks for one chip family."""

    gemm_efficiency: float = 0.75  # large bf16 GEMM, fraction of dense peak
    fp8_gemm_efficiency: float = 0.60  # large fp8 GEMM, fraction of the fp8 peak
    gemm_dim_half: float = 64.0  # GEMM dimension at which the shape factor is 1/2
    attention_efficiency: float = 0.55  # fused (flash) attention, fraction of bf16 peak
    memory_efficiency: float = 0.85  # achieved fraction of HBM bandwidth for streaming kernels
    launch_overhead_s: float = 4e-6  # per kernel: launch + tail effects
    source: str = ""

    def with_(self, **changes) -> "ComputeCalibration":
        return replace(self, **changes)


# One calibration per chip family (reference-data.md "keep one calibration per chip
# family, never a per-case knob"). Starting points, refined by `stepsim validate`:
# * Hopper large bf16 GEMM: cuBLAS reaches ~700-750 TFLOP/s of 989 on H100 SXM
#   (~0.72-0.76); FP8 ~1300-1400 of 1979 (~0.66-0.70).
# * Ampere: cuBLAS ~250-270 TFLOP/s of 312 on A100 (~0.8-0.85).
# * FlashAttention-2 forward ~50-70% of peak on A100/H100 (Dao, arXiv 2307.08691 §4.1).
# * STREAM-style copies reach ~85-90% of HBM bandwidth.
DEFAULT_COMPUTE_CALIBRATION: Mapping[str, ComputeCalibration] = {
    "ampere": ComputeCalibration(
        gemm_efficiency=0.80, fp8_gemm_efficiency=0.80, attention_efficiency=0.60,
        memory_efficiency=0.85, launch_overhead_s=4e-6,
        source="A100: cuBLAS bf16 ~250 TF/s of 312; FlashAttention-2 paper Fig. 4",
    ),
    "hopper": ComputeCalibration(
        gemm_efficiency=0.74, fp8_gemm_efficiency=0.62, attention_efficiency=0.55,
        memory_efficiency=0.85, launch_overhead_s=4e-6,
        source="H100 SXM: cuBLAS bf16 ~730 TF/s of 989, fp8 ~1230 of 1979; FA-2/FA-3 papers",
    ),
    "blackwell": ComputeCalibration(
        gemm_efficiency=0.72, fp8_gemm_efficiency=0.62, attention_efficiency=0.55,
        memory_efficiency=0.85, launch_overhead_s=4e-6,
        source="B200: assumed Hopper-like achieved fractions until measured",
    ),
    "tpu": ComputeCalibration(
        gemm_efficiency=0.80, fp8_gemm_efficiency=0.80, attention_efficiency=0.60,
        memory_efficiency=0.85, launch_overhead_s=2e-6,
        source="TPU MXU large-matmul utilisation ~80% (How to Scale Your Model, rooflines chapter)",
    ),
}


def calibration_for(chip: ChipSpec, overrides: Mapping[str, float] | None = None) -> ComputeCalibration:
    cal = DEFAULT_COMPUTE_CALIBRATION.get(chip.family, DEFAULT_COMPUTE_CALIBRATION["hopper"])
    return cal.with_(**overrides) if overrides else cal


def gemm_shape_factor(k: Kernel, dim_half: float) -> float:
    if dim_half <= 0:
        return 1.0
    f = 1.0
    for d in (k.m, k.n, k.k):
        if d > 0:
            f *= d / (d + dim_half)
    return f


def kernel_time_s(k: Kernel, chip: ChipSpec, cal: ComputeCalibration, dtype: str = "bf16") -> float:
    """Roofline time of one kernel on one chip."""
    t_math = 0.0
    if k.flops > 0:
        if k.kind == "gemm":
            if dtype == "fp8":
                peak, eff = chip.peak("fp8"), cal.fp8_gemm_efficiency
            else:
                peak, eff = chip.peak("bf16"), cal.gemm_efficiency
            eff *= gemm_shape_factor(k, cal.gemm_dim_half)
        elif k.kind == "attention":
            peak, eff = chip.peak("bf16"), cal.attention_efficiency
        else:
            peak, eff = chip.peak("bf16"), cal.gemm_efficiency
        t_math = k.flops / (peak * eff)
    t_mem = k.bytes / (chip.hbm_bw_bytes_per_s * cal.memory_efficiency) if k.bytes > 0 else 0.0
    return max(t_math, t_mem) + cal.launch_overhead_s


def kernels_time_s(kernels: Iterable[Kernel], chip: ChipSpec, cal: ComputeCalibration, dtype: str = "bf16") -> float:
    return sum(kernel_time_s(k, chip, cal, dtype) for k in kernels)
