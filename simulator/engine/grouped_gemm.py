"""Grouped-GEMM efficiency by shape: what the routed experts' GEMMs lose when each expert
gets few tokens.

A grouped GEMM runs one product per local expert over the rows routed to it. With few
rows per expert every group pays its own weight reads, pipeline fill and partial tiles,
so the achieved rate falls below the large-shape rate the compute calibration holds
(:data:`simulator.engine.compute.DEFAULT_COMPUTE_CALIBRATION`). This module gives that
loss as a factor ``r <= 1`` on the large-shape efficiency, from published kernel figures,
never fitted to a validation row.

The figures
-----------
DeepGEMM's README (deepseek-ai/DeepGEMM, commit 327ec92f6977e7fee022cb76a8f273b75483c3d8,
2025-04-09, the last revision with its performance tables; "H800 SXM5 with NVCC 12.8",
FP8 with fine-grained scaling), the tables "Grouped GEMMs for MoE models (contiguous
layout)" and "(masked layout)": TFLOP/s by groups, rows per group (M), N and K, for the
two DeepSeek-V3 expert shapes (N 4096 / K 7168: the fused gate+up projection; N 7168 /
K 2048: the down projection). :data:`DEEPGEMM_H800_FP8` lists every row. The masked rows
keep the total work fixed (1 x 1024, 2 x 512, 4 x 256 rows), so they measure the per-group
loss itself, not an under-filled GPU.

How it is used
--------------
* ``r`` for a (N, K) curve is TFLOP/s at M over TFLOP/s at the curve's largest M
  (8192: 4096 and 8192 rows give the same rate, so the curve has saturated), interpolated
  linearly in log(M) between table points, 1 above the largest M and held at the smallest
  table value (256 rows) below it: under that, the roofline's memory side
  (:func:`simulator.engine.compute.kernel_time_s`, each group's weights read once) takes
  over as M shrinks, and no published grouped figure says more.
* Between the two curves ``r`` is interpolated in log of the smaller non-token dimension
  (4096 for the gate+up curve, 2048 for the down curve; clamped outside). The shorter
  dimension is the K loop of the down projection, where a group's fixed costs weigh most.
  The table has only these two (N, K) pairs, so N and K are not separated further; the
  calibration's ``d / (d + gemm_dim_half)`` factor still applies to N and K.
* The token dimension is M of the forward and input-gradient GEMMs and K of the weight
  gradient (``dW = X^T dY`` reduces over a group's rows); ``r`` applies to it in both.
* Other chips and dtypes: the loss is set by how many rows a group needs to hide its
  weight traffic behind its math, i.e. by the ridge point in FLOPs per weight element,
  ``peak(dtype) x bytes per element / HBM bandwidth`` (H800 FP8: 1979 TFLOP/s x 1 B /
  3.35 TB/s = 591). A chip and dtype with ridge ``R`` sees ``M x 591 / R`` H800-FP8 rows:
  H100 BF16 (989 x 2 / 3.35 = 591) reads the table as it stands, A100 BF16
  (312 x 2 / 2.04 = 306) loses less at the same M, GB200 BF16 (2450 x 2 / 8 = 613) a little
  more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: DeepGEMM's reference machine: H800 SXM5 FP8 (1979 dense TFLOP/s, 3.35 TB/s HBM3, 1-byte
#: operands; topologies.chips "h800").
REFERENCE_PEAK_FLOPS_PER_S = 1979e12
REFERENCE_HBM_BYTES_PER_S = 3.35e12
REFERENCE_ELEMENT_BYTES = 1
ELEMENT_BYTES = {"fp8": 1, "bf16": 2, "tf32": 4}


@dataclass(frozen=True)
class GroupedGemmPoint:
    """One published grouped-GEMM measurement."""

    groups: int
    m: int  # rows per group (tokens per expert)
    n: int
    k: int
    tflops: float
    source: str


_DG = "deepseek-ai/DeepGEMM README.md @327ec92 (2025-04-09), H800 SXM5 FP8"
#: Every grouped-GEMM row of DeepGEMM's README tables (see the module notes).
DEEPGEMM_H800_FP8: tuple[GroupedGemmPoint, ...] = (
    # "Grouped GEMMs for MoE models (contiguous layout)"
    GroupedGemmPoint(4, 8192, 4096, 7168, 1346.0, _DG + ", contiguous layout"),
    GroupedGemmPoint(4, 8192, 7168, 2048, 1214.0, _DG + ", contiguous layout"),
    GroupedGemmPoint(8, 4096, 4096, 7168, 1346.0, _DG + ", contiguous layout"),
    GroupedGemmPoint(8, 4096, 7168, 2048, 1214.0, _DG + ", contiguous layout"),
    # "Grouped GEMMs for MoE models (masked layout)"
    GroupedGemmPoint(1, 1024, 4096, 7168, 1233.0, _DG + ", masked layout"),
    GroupedGemmPoint(1, 1024, 7168, 2048, 925.0, _DG + ", masked layout"),
    GroupedGemmPoint(2, 512, 4096, 7168, 1040.0, _DG + ", masked layout"),
    GroupedGemmPoint(2, 512, 7168, 2048, 916.0, _DG + ", masked layout"),
    GroupedGemmPoint(4, 256, 4096, 7168, 932.0, _DG + ", masked layout"),
    GroupedGemmPoint(4, 256, 7168, 2048, 815.0, _DG + ", masked layout"),
)


def _curves(points=DEEPGEMM_H800_FP8) -> dict[int, tuple[tuple[float, float], ...]]:
    """Per (N, K) pair, keyed by its smaller dimension: (log M, r) sorted by M, r relative
    to the largest M of the pair."""
    by_shape: dict[tuple[int, int], list[GroupedGemmPoint]] = {}
    for p in points:
        by_shape.setdefault((p.n, p.k), []).append(p)
    out = {}
    for (n, k), ps in by_shape.items():
        ps.sort(key=lambda p: p.m)
        top = ps[-1].tflops
        out[min(n, k)] = tuple((math.log(p.m), p.tflops / top) for p in ps)
    return dict(sorted(out.items()))


CURVES = _curves()


def _interp(x: float, xs: list[float], ys: list[float]) -> float:
    """Piecewise-linear in ``x``, held at the end values outside ``xs``."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
            return ys[i - 1] + t * (ys[i] - ys[i - 1])
    return ys[-1]


def _curve_value(curve, m: float) -> float:
    if m >= math.exp(curve[-1][0]):
        return 1.0
    return _interp(math.log(max(m, 1.0)), [c[0] for c in curve], [c[1] for c in curve])


def equivalent_rows(m: float, peak_flops_per_s: float, hbm_bytes_per_s: float, dtype: str) -> float:
    """``m`` rows per group on a chip and dtype, as DeepGEMM's H800 FP8 rows (module notes):
    ``m x ridge_ref / ridge`` with ridge = peak x element bytes / HBM bandwidth."""
    ridge = peak_flops_per_s * ELEMENT_BYTES.get(dtype, 2) / hbm_bytes_per_s
    ref = REFERENCE_PEAK_FLOPS_PER_S * REFERENCE_ELEMENT_BYTES / REFERENCE_HBM_BYTES_PER_S
    return m * ref / ridge


def grouped_gemm_efficiency(rows_per_group: float, other_dims: tuple[int, int]) -> float:
    """``r``: achieved / large-shape rate of a grouped GEMM with ``rows_per_group`` rows
    (in DeepGEMM's H800 FP8 units: :func:`equivalent_rows`) and the two other dimensions
    ``other_dims``, from :data:`DEEPGEMM_H800_FP8` (module notes). 1 at and above 8192 rows,
    monotone in the rows, equal to the table at its points."""
    d = float(min(other_dims))
    keys = list(CURVES)
    vals = [_curve_value(CURVES[key], rows_per_group) for key in keys]
    if len(keys) == 1:
        return vals[0]
    return _interp(math.log(max(d, 1.0)), [math.log(key) for key in keys], vals)
