"""Compute-time model: a roofline per kernel with calibrated efficiencies.

A kernel takes ``max(flops / (peak * eff), bytes / (hbm_bw * mem_eff)) +
launch_overhead_s``, with the kernel's ``executed_flops`` in place of ``flops``
where it has them (a causal flash-attention kernel, counted in FlashAttention's
convention: see :mod:`workloads.counts`). ``eff`` depends on the kernel kind and, for GEMMs, on the
shape: small dimensions under-fill the tensor cores, modelled by a saturating
factor ``d / (d + gemm_dim_half)`` per GEMM dimension (a documented smooth
stand-in for tile quantisation; ``gemm_dim_half`` = 0 disables it). A grouped GEMM
(the routed experts) takes, on its token dimension (rows per expert), the published
grouped-GEMM efficiency of :mod:`simulator.engine.grouped_gemm` instead (DeepGEMM's H800
figures, scaled to other chips and dtypes by their ridge point).

Efficiencies are per chip *family*, never per scenario: one table for Ampere,
Hopper, Blackwell and TPU, documented in :data:`DEFAULT_COMPUTE_CALIBRATION` and
overridable as a whole (``compute:`` in the scenario) for a user's own hardware.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from simulator.engine import grouped_gemm
from topologies.chips import ChipSpec, ComputeCalibration
from workloads.counts import Kernel


# One calibration per chip family (reference-data.md "keep one calibration per chip
# family, never a per-case knob"). What the fields mean:
# * gemm_efficiency: achieved fraction of the dense bf16 peak by a large GEMM *inside a
#   training step* (sustained clocks under the power limit, cuBLAS kernel choice), before
#   the shape factor; fp8_gemm_efficiency the same against the fp8 peak.
# * gemm_dim_half: GEMM dimension at which the shape factor d/(d+half) is 1/2 (small-
#   dimension under-fill of the tensor cores).
# * attention_efficiency: achieved attention TFLOP/s / bf16 peak, in the convention the
#   FlashAttention papers report them (Dao 2023, arXiv 2307.08691 §4.1; Shah et al. 2024,
#   arXiv 2407.08608 §4.1): a causal kernel is credited half the dense 4*s^2*heads*d
#   FLOPs and a backward 2.5x its forward (the kernel's executed_flops). Applied to the
#   dense non-causal count (model-FLOPs convention) instead, 0.50 on an H100 would run
#   a causal kernel at 0.25 x 989 = 247 TF/s in the papers' units, below FlashAttention-2.
#   Unfused attention (batched GEMMs over the whole square) executes what it counts.
# * memory_efficiency: achieved fraction of HBM bandwidth by streaming kernels.
# * launch_overhead_s: per-kernel launch + tail.
# * comm_sm_fraction: share of the streaming multiprocessors given to the all-to-all
#   (and pipeline) communication kernels while a DualPipe forward/backward pair overlaps
#   them with its compute. DeepSeek-V3 (arXiv 2412.19437 §3.2.2 and §3.5.1) dedicates
#   20 of the H800's 132 SMs to communication ("we allocate 20 out of the 132 SMs
#   available in the H800 GPU for this purpose"): 20/132 = 0.1515 on every GPU family,
#   the only published figure (A100 and B200 have 108 and 148 SMs; the same 20 SMs would
#   be 0.19 / 0.14 there -- set `compute: {comm_sm_fraction: ...}` for those). TPUs
#   move collectives with DMA engines over ICI, not with their TensorCores: 0.
# Values below were set by `stepsim validate` (validation/, issue 8) against published
# end-to-end runs, staying inside what microbenchmarks allow:
# * Ampere gemm 0.68 (212 TF/s of 312): isolated cuBLAS bf16 GEMMs reach ~250-270 TF/s
#   (0.80-0.85) at boost clock, but under sustained tensor load the A100 SXM runs below
#   its 1410 MHz boost, and Megatron's best end-to-end rate *including* all non-GEMM work
#   is ~178 TF/s (Narayanan et al. 2021 Fig. 11, p=1, batch 128), which bounds in-situ
#   GEMMs to ~0.65-0.75. The large compute-bound cases were 17-23% too fast at 0.80
#   (Narayanan 39B/76B/146B, Korthikanti 175B); at 0.68 Narayanan 39B-1T are -0.2..+8.8%
#   and Korthikanti 175B/530B +4.8/-2.7%.
# * Ampere attention 0.55 (172 TF/s in FlashAttention units): FlashAttention-2 reaches
#   50-73% of peak on A100 (Dao 2023, arXiv 2307.08691 abstract and Fig. 4, fwd ~70%,
#   bwd lower), scaled by the same sustained-clock factor as the GEMMs. (The validation
#   suite's A100 runs are unfused Megatron attention, which this does not time.)
# * Hopper gemm 0.64 (633 TF/s of 989): H100 SXM cuBLAS bf16 reaches ~700-750 TF/s in
#   short microbenchmarks, ~620-700 sustained at 700 W. The NeMo DGX Cloud runs
#   (GPT-3 175B, Nemotron-4 340B, Llama 3.1 70B) were 2-15% too fast at 0.74 and
#   -9.9..-0.0% at 0.68 (issue 13). Refit over all 8 BF16 Hopper cases of the suite
#   (issue 15, 2026-12-02), the Hopper median |error| is 6.6 / 5.2 / 4.7 / 5.1 / 8.6 % at
#   0.62 / 0.63 / 0.64 / 0.65 / 0.68 (`stepsim validate` with `compute: {gemm_efficiency}`
#   on the Hopper cases): at 0.64 GPT-3 175B is -3.8/-4.9 %, Llama 3.1 70B +2.2/+4.0 %,
#   Nemotron-4 340B +4.7/-0.1 %, and the DGX Cloud Grok-1 row -8.9 % (was -13.0 %).
# * Hopper attention 0.48 (475 TF/s in FlashAttention units): Shah et al. 2024 (arXiv
#   2407.08608) Fig. 5, causal forward, head dim 128, H100 SXM5 BF16, seqlen 4k-16k:
#   FlashAttention-2 319-335, cuDNN 518-539, FlashAttention-3 579-616 TF/s; Fig. 6
#   backward, head dim 128: 310-322 / 499-516 / 542-561. NeMo 24.x runs cuDNN fused
#   attention (Transformer Engine): at 4k, 518 fwd and 499 bwd (0.51 of 989 weighted by
#   the 1 : 2.5 FLOPs), times the in-situ / microbenchmark ratio of the GEMMs above
#   (672 / ~720 = 0.93, with the GEMM value of issue 13) = 0.48. (Until issue 13 the value
#   was 0.50 applied to the dense count: 247 TF/s in these units.) It was not re-derived
#   with the refit GEMM value (633 / 720 = 0.88 would give 0.45): the BF16 cases do not
#   separate the two, and it is also the attention rate of FP8 runs.
# * fp8 GEMMs: ~1230-1300 TF/s of 1979 (0.62). The suite's FP8 Hopper cases: dense Llama 3
#   70B +2.6 %; the Qwen3 MoE rows +10.5 / +14.4 %, whose steps are 59-62 % exposed
#   expert all-to-all, so they do not measure the GEMMs.
# * memory_efficiency 0.85: STREAM-style copies reach ~85-90% of HBM bandwidth.
# * launch_overhead_s 4 us: CUDA launch + tail effects of a kernel (2-5 us typical).
# * Blackwell gemm 0.52 (1170 TF/s of 2250 on B200), fp8 0.45 (2025 of 4500), attention 0.40
#   (900 TF/s in FlashAttention units). Refitted in issue 15 after attention moved to
#   FlashAttention's convention (issue 13 item 10): the earlier 0.62 / 0.55 / 0.55 had been
#   fitted with attention timed on the dense non-causal count (3 F per fwd+bwd instead of
#   1.75 F), and with no Blackwell change Llama 3 8B FP8 on 8xB200 went +2.0% -> +17.9%.
#   Attention first, from kernel figures: FlashAttention-4 (Zadouri et al. 2026, arXiv
#   2603.05451, abstract) reaches 1613 TF/s BF16 forward on B200, 1.3x cuDNN 9.13, so cuDNN
#   (which Transformer Engine runs in NeMo 25.x) forwards at ~1240 TF/s (0.55); its authors
#   find the B200 backward bound by shared-memory traffic rather than the tensor cores (Together
#   AI's FlashAttention-4 post: "(b) in the shared-memory traffic during the BWD computation";
#   secondary summaries of the paper put these non-MMA costs 25-60% above the MMA time), i.e.
#   ~0.55 / 1.25..1.6 = 0.34..0.44 of peak for the backward. Weighted 1 : 2.5
#   (forward : backward FLOPs) with the backward at 0.40 that is 0.43, times the in-situ /
#   microbenchmark ratio of Hopper's GEMMs (0.93): 0.40. Then the GEMM rates, from the
#   Blackwell cases with attention fixed: fp8 0.45 from the dense rows without pipeline or
#   all-to-all (Llama 3 8B FP8: -4.3% B200, +0.5% GB200; Mixtral 8x7B FP8 -2.3% / +10.1%),
#   bf16 0.52 from the two BF16 MoE rows (Qwen3-235B +4.6%, DeepSeek-V3 +13.9% on 256 GB200,
#   both with expert all-to-all and pipeline, so these bound the GEMM rate from below less
#   cleanly). Both are below isolated cuBLAS rates on B200: what Megatron-Core sustains in a
#   step under the 1000-1200 W limit, with the host and small-kernel time the simulator does not
#   model folded in. GB200 rows stay ~5 points more optimistic than their B200 twins: the chip
#   table's GB200 peak is 2450 TF/s (dgxc) vs 2250 for B200, a 1.089 ratio, while the published
#   GB200/B200 throughput is 1.029 (Llama 3 8B FP8) -- achieved clocks, not fixed here (one
#   calibration per family). Mixtral 8x7B FP8 on 64 GB200 is compute-bound in the simulation
#   (one NVLink domain), while the B200 row has exposed expert-gradient reduction over IB.
# * TPU gemm 0.88, attention 0.41 (refitted in issue 15). MaxText's flash attention on TPU
#   (splash / Pallas flash kernels) skips fully masked causal blocks, so the FlashAttention
#   convention applies as on GPUs; the earlier 0.70 had been fitted with attention timed on the
#   dense non-causal count (3 F per fwd+bwd instead of 1.75 F): 0.70 x 1.75 / 3 = 0.41 keeps the
#   attention time it was fitted with (~188 TF/s of 459 on v5p in FlashAttention units). GEMMs:
#   MaxText's published v5e rows run full remat at 59.9-66.9% MFU, i.e. 80-89% of peak in
#   executed (recompute-counted) FLOPs, so in-situ XLA matmuls are near 0.9; the v5p rows
#   (minimal remat) are +6..+8% at 0.92 and the v5e rows +2.7 / -3.9 / +6.6%, so the family's
#   best single value is 0.88: v5e 16B/32B/64B -1.2 / -7.8 / +2.3%, v5p 32B/64B/128B
#   +2.5 / +3.8 / +4.6% (median |error| 3.2%). The 32B v5e row (66.9% MFU, the highest) is the
#   one that wants >= 0.92: v5e and v5p pull the family apart by ~10 points, not resolved.
# Unfused attention (2021-23 Megatron materialised the s x s scores) is timed as the
# attention products at attention_efficiency plus the scores' HBM traffic, 12 B per score
# forward and 17 B backward (workloads/counts.py): 1.24 ms for Korthikanti et al.'s 22B
# layer against the 1.3 ms their Table 4 measures. The small Narayanan rows were 11-16%
# slow (issue 15) from the case layouts (micro-batch 1 instead of the authors' 16/8, see
# examples/sc21/run_table_1.sh) and 2x13 B backward score traffic, not from the GEMM
# efficiencies: with the same 0.68 the rows 1.7B-18.4B are -1.4..+0.1%, 76.1B/145.6B
# -0.3/-3.3%; 39.1B is -7.1% (non-interleaved p=2 in the script; its fp16 gradients are
# all-reduced in 2 B there, 4 B here -- about 0.4 s of its 15.6 s step).
#: DeepSeek-V3's communication SM reservation: 20 of the H800's 132 SMs (arXiv 2412.19437 §3.5.1).
DEEPSEEK_COMM_SM_FRACTION = 20 / 132

DEFAULT_COMPUTE_CALIBRATION: Mapping[str, ComputeCalibration] = {
    "ampere": ComputeCalibration(
        comm_sm_fraction=DEEPSEEK_COMM_SM_FRACTION,
        gemm_efficiency=0.68,
        fp8_gemm_efficiency=0.68,
        attention_efficiency=0.55,
        memory_efficiency=0.85,
        launch_overhead_s=4e-6,
        source="A100: in-situ GEMMs ~212 TF/s of 312 (validation suite, Narayanan/Korthikanti/"
        "MegaScale); FlashAttention-2 paper Fig. 4",
    ),
    "hopper": ComputeCalibration(
        comm_sm_fraction=DEEPSEEK_COMM_SM_FRACTION,
        gemm_efficiency=0.64,
        fp8_gemm_efficiency=0.62,
        attention_efficiency=0.48,
        memory_efficiency=0.85,
        launch_overhead_s=4e-6,
        source="H100 SXM: in-situ bf16 GEMMs ~633 TF/s of 989 (validation suite, NeMo DGX Cloud "
        "recipes), fp8 ~1230 of 1979; FA-2/FA-3 papers",
    ),
    "blackwell": ComputeCalibration(
        comm_sm_fraction=DEEPSEEK_COMM_SM_FRACTION,
        gemm_efficiency=0.52,
        fp8_gemm_efficiency=0.45,
        attention_efficiency=0.40,
        memory_efficiency=0.85,
        launch_overhead_s=4e-6,
        source="B200/GB200: attention from FlashAttention-4 / cuDNN 9.13 B200 figures x in-situ 0.93; "
        "GEMMs fitted to the validation suite's Megatron-Bridge / NeMo performance-summary rows "
        "(Llama 3 8B FP8, Mixtral 8x7B FP8, Qwen3-235B and DeepSeek-V3 BF16)",
    ),
    "tpu": ComputeCalibration(
        gemm_efficiency=0.88,
        fp8_gemm_efficiency=0.88,
        attention_efficiency=0.41,
        memory_efficiency=0.85,
        launch_overhead_s=2e-6,
        source="TPU v5e/v5p: fitted to MaxText's published per-chip TFLOP/s (validation/maxtext)",
    ),
}


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
    the rows, :func:`workloads.counts.backward_kernels`)."""
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
    tdim = token_dim(k) if is_grouped else None
    f = 1.0
    if dim_half > 0:
        dims = [k.m, k.n, k.k]
        if is_grouped:  # the token dimension's loss is the table's
            dims.remove(tdim)
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
    the large-shape rate, for the summary's shape loss)."""
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
    t_mem = k.bytes / (chip.hbm_bw_bytes_per_s * cal.memory_efficiency) if k.bytes > 0 else 0.0
    return max(t_math, t_mem) + cal.launch_overhead_s


def grouped_gemm_shape_loss_s(k: Kernel, chip: ChipSpec, cal: ComputeCalibration, dtype: str = "bf16") -> float:
    """Time a grouped GEMM loses to its small per-group shape: its time at the shape's
    efficiency minus its time at the large-shape efficiency (0 for other kernels)."""
    if k.kind != "gemm" or k.groups <= 1:
        return 0.0
    return kernel_time_s(k, chip, cal, dtype) - kernel_time_s(k, chip, cal, dtype, grouped_shape=False)


def kernels_time_s(kernels: Iterable[Kernel], chip: ChipSpec, cal: ComputeCalibration, dtype: str = "bf16") -> float:
    return sum(kernel_time_s(k, chip, cal, dtype) for k in kernels)
