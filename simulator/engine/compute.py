"""Compute-time model: a roofline per kernel with calibrated efficiencies.

A kernel takes ``max(flops / (peak * eff), bytes / (hbm_bw * mem_eff)) +
launches * launch_overhead_s`` (one launch, but one per local expert for a GEMM run expert by
expert; an FP8 quantisation pass streams at ``quantize_bandwidth_share`` of ``mem_eff``), with
the kernel's ``executed_flops`` in place of ``flops`` where it has them (a causal
flash-attention kernel, counted in FlashAttention's convention: see :mod:`workloads.counts`).
``eff`` depends on the kernel kind and, for GEMMs, on the shape: small dimensions under-fill the tensor cores, modelled by a saturating
factor ``d / (d + gemm_dim_half)`` per GEMM dimension (a documented smooth
stand-in for tile quantisation; ``gemm_dim_half`` = 0 disables it). A grouped GEMM
(the routed experts) takes, on its token dimension (rows per expert), the published
grouped-GEMM efficiency of :mod:`simulator.engine.grouped_gemm` instead (DeepGEMM's H800
figures, scaled to other chips and dtypes by their ridge point).

Efficiencies are per chip *family*, never per scenario: one data file each for Ampere,
Hopper, Blackwell and TPU (``simulator/calibration/compute-<family>.json``: each value
with its source and the validation figure it was checked against), loaded into
:data:`DEFAULT_COMPUTE_CALIBRATION` and overridable field by field (``compute:`` in the
scenario) for a user's own hardware.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from simulator.engine import grouped_gemm
from topologies.chips import ChipSpec, ComputeCalibration
from workloads.kernels import Kernel

# One calibration per chip family (reference-data.md: "keep one calibration per chip family,
# never a per-case knob"), as data: simulator/calibration/compute-<family>.json gives each
# field's value, its source and the validation figure it was checked against
# (docs/calibration.md; how the values were fitted over time is in CHANGES.md). What the
# fields mean is on :class:`topologies.chips.ComputeCalibration`.

#: The folder of the calibration data files (package data).
CALIBRATION_DIR = Path(__file__).resolve().parent.parent / "calibration"
#: The schema tag of a compute calibration file (also what ``stepsim calibrate`` writes).
COMPUTE_SCHEMA = "stepsim.compute-calibration/1"
FAMILY_FILES = ("ampere", "hopper", "blackwell", "tpu")


def calibration_from_document(doc: Mapping, where: str) -> ComputeCalibration:
    """A :class:`ComputeCalibration` from a compute calibration document (the files in
    :data:`CALIBRATION_DIR`, or ``stepsim calibrate --out X.json``'s ``compute`` part):
    ``{"schema", "family", "summary", "values": {field: {"value", "source",
    "checked_against"}}}``. A field the document leaves out keeps the dataclass default."""
    fields = {f.name for f in dataclasses.fields(ComputeCalibration)} - {"source"}
    if not isinstance(doc, Mapping) or doc.get("schema") != COMPUTE_SCHEMA:
        raise ValueError(f"{where}: not a compute calibration (schema {COMPUTE_SCHEMA!r})")
    values = doc.get("values")
    if not isinstance(values, Mapping) or set(values) - fields:
        raise ValueError(f"{where}: values must be a mapping of {', '.join(sorted(fields))}")
    out = {}
    for name, entry in values.items():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("value"), (int, float)):
            raise ValueError(f"{where}: values.{name} must be a mapping with a numeric value")
        out[name] = float(entry["value"])
    return ComputeCalibration(**out, source=str(doc.get("summary", "")))


def _load_family(family: str) -> ComputeCalibration:
    path = CALIBRATION_DIR / f"compute-{family}.json"
    return calibration_from_document(json.loads(path.read_text(encoding="utf-8")), str(path))


DEFAULT_COMPUTE_CALIBRATION: Mapping[str, ComputeCalibration] = {f: _load_family(f) for f in FAMILY_FILES}


def calibration_for(chip: ChipSpec, overrides: Mapping[str, float] | None = None) -> ComputeCalibration:
    cal = DEFAULT_COMPUTE_CALIBRATION.get(chip.family, DEFAULT_COMPUTE_CALIBRATION["hopper"])
    return cal.with_(**overrides) if overrides else cal


def overlap_slowdown(cal: ComputeCalibration) -> float:
    """How much longer a compute op of an overlapped forward/backward pair takes:
    ``1 / (1 - comm_sm_fraction)``, every kernel (GEMM, attention and memory-bound
    alike) running on the SMs the communication kernels leave free (DeepSeek-V3's
    20 of 132 SMs: 132/112 = 1.179)."""
    return 1.0 / (1.0 - cal.comm_sm_fraction)


def token_dim(k: Kernel) -> int:
    """The dimension of a grouped GEMM that counts one group's token rows: M of the forward
    and input-gradient products, K of the weight gradient (``dW = X^T dY`` reduces over
    the rows, :func:`workloads.kernels.backward_kernels`)."""
    return k.k if k.name.endswith(".wgrad") else k.m


def grouped_shape_factor(k: Kernel, chip: ChipSpec | None, dtype: str = "bf16") -> float:
    """Grouped-GEMM efficiency by rows per group (:mod:`simulator.engine.grouped_gemm`,
    DeepGEMM's H800 figures, rows scaled to ``chip`` and ``dtype`` by the ridge point); 1 for
    a plain GEMM or without a chip."""
    if k.groups <= 1 or chip is None:
        return 1.0
    t = token_dim(k)
    if t <= 0:
        return 1.0
    others = (k.n, k.m) if k.name.endswith(".wgrad") else (k.n, k.k)
    rows = grouped_gemm.equivalent_rows(t, chip.peak(dtype), chip.hbm_bw_bytes_per_s, dtype)
    return grouped_gemm.grouped_gemm_efficiency(rows, others)


def gemm_shape_factor(
    k: Kernel, dim_half: float, chip: ChipSpec | None = None, dtype: str = "bf16", grouped: bool = True
) -> float:
    """Shape factor on the large-GEMM efficiency: ``d / (d + dim_half)`` per dimension (a
    smooth stand-in for tile quantisation); for a grouped GEMM (``groups > 1``) given a
    ``chip``, its token dimension takes the published grouped-GEMM factor instead
    (:func:`grouped_shape_factor`), 1 with ``grouped=False`` (the large-shape rate the
    summary's shape loss is measured against)."""
    is_grouped = k.groups > 1 and chip is not None
    f = 1.0
    if dim_half > 0:
        dims = [k.m, k.n, k.k]
        if is_grouped:  # the token dimension's loss is the table's
            dims.remove(token_dim(k))
        for d in dims:
            if d > 0:
                f *= d / (d + dim_half)
    if is_grouped and grouped:
        f *= grouped_shape_factor(k, chip, dtype)
    return f


def _gemm_rate(k: Kernel, chip: ChipSpec, cal: ComputeCalibration, dtype: str) -> tuple[float, float, str]:
    """Peak, large-shape efficiency and math dtype of a GEMM kernel: its own ``math_dtype``
    where it has one (the MoE router in BF16 within an FP8 step; ``"tf32"``: FP32 operands on
    tensor cores at half the BF16 rate, NVIDIA A100 / H100 SXM / B200 datasheets: 156 / 495 /
    1100 against 312 / 989 / 2250 dense TFLOP/s), else the step's."""
    dt = k.math_dtype or dtype
    if dt == "fp8":
        return chip.peak("fp8"), cal.fp8_gemm_efficiency, "fp8"
    if dt == "tf32":
        return chip.peak("bf16") / 2.0, cal.gemm_efficiency, "tf32"
    return chip.peak("bf16"), cal.gemm_efficiency, "bf16"


def kernel_time_s(
    k: Kernel, chip: ChipSpec, cal: ComputeCalibration, dtype: str = "bf16", grouped_shape: bool = True
) -> float:
    """Roofline time of one kernel on one chip (``grouped_shape=False``: a grouped GEMM at
    the large-shape rate, for the summary's shape loss); a recorded kernel's own time."""
    if k.recorded_s is not None:
        return k.recorded_s
    t_math = 0.0
    if k.flops > 0:
        if k.kind == "gemm":
            peak, eff, dt = _gemm_rate(k, chip, cal, dtype)
            eff *= gemm_shape_factor(k, cal.gemm_dim_half, chip, dt, grouped_shape)
        elif k.kind == "attention":
            peak, eff = chip.peak("bf16"), cal.attention_efficiency
        else:
            peak, eff = chip.peak("bf16"), cal.gemm_efficiency
        t_math = (k.flops if k.executed_flops is None else k.executed_flops) / (peak * eff)
    t_mem = 0.0
    if k.bytes > 0:
        mem_eff = cal.memory_efficiency
        if k.kind == "quantize":  # an FP8 quantisation pass, at its own share of the rate
            mem_eff *= cal.quantize_bandwidth_share
        t_mem = k.bytes / (chip.hbm_bw_bytes_per_s * mem_eff)
    # the GPU's own gap and tail per launch (a per-expert GEMM kernel: one per group)
    return max(t_math, t_mem) + cal.launch_overhead_s * k.launches


def grouped_gemm_shape_loss_s(k: Kernel, chip: ChipSpec, cal: ComputeCalibration, dtype: str = "bf16") -> float:
    """Time a grouped GEMM loses to its small per-group shape: its time at the shape's
    efficiency minus its time at the large-shape efficiency (0 for other kernels)."""
    if k.kind != "gemm" or k.groups <= 1:
        return 0.0
    return kernel_time_s(k, chip, cal, dtype) - kernel_time_s(k, chip, cal, dtype, grouped_shape=False)


def kernels_time_s(kernels: Iterable[Kernel], chip: ChipSpec, cal: ComputeCalibration, dtype: str = "bf16") -> float:
    return sum(kernel_time_s(k, chip, cal, dtype) for k in kernels)
