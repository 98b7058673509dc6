"""Accelerator catalogue: dense peak FLOP/s per dtype, HBM capacity and bandwidth.

All values are dense (no structured sparsity), in SI units: FLOP/s, bytes and
bytes/s. Sources are the tables of Part B1 of the project's reference data; the
primary source is named beside each entry. ``HSYM`` is "How to Scale Your
Model" (Google DeepMind, jax-ml/scaling-book), GPU and TPU chapters.

Chips without a faster FP8 path (A100, TPU v4, v5e, v5p, v6e: their 2x rate is
INT8 only) list ``fp8`` equal to ``bf16``, so an FP8 scenario on them runs at the
BF16 rate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .errors import TopologyError, UnknownPresetError

#: Calibration families: compute efficiency tables are kept per family.
FAMILIES = ("ampere", "hopper", "blackwell", "tpu")

GiB = 2**30

# Physical ranges (docs/scenario.md, "Physical ranges"); the chip input model and the
# networks (topologies.networks) check against them. Bandwidths per direction, bytes/s.
MIN_BW_BYTES_PER_S = 1e6  # 1 MB/s: far below any NIC or data-centre share
MAX_BW_BYTES_PER_S = 1e18  # 1 EB/s: 100 x any HBM (an "ideal", free memory or network as a what-if)
MIN_PEAK_FLOPS_PER_S = 1e9  # 1 GFLOP/s
MAX_PEAK_FLOPS_PER_S = 1e18  # 1 EFLOP/s per chip
MIN_HBM_BYTES = 1e6  # 1 MB
MAX_HBM_BYTES = 1e15  # 1 PB
MIN_EFFICIENCY = 1e-3  # achieved fraction of a peak: at least 0.1 %


@dataclass(frozen=True)
class ComputeCalibration:
    """Achieved fractions of datasheet peaks for one chip family. The constraints in ``metadata``
    (pydantic's ``gt``/``ge``/``le``/``lt``) are what the scenario's ``compute:`` overrides are checked
    against (``simulator.scenario.schema.ComputeCalIn``); the values per family, with their sources, are
    the data files ``simulator/calibration/compute-<family>.json``."""

    # large bf16 GEMM, fraction of dense peak
    gemm_efficiency: float = field(default=0.75, metadata={"ge": MIN_EFFICIENCY, "le": 1})
    # large fp8 GEMM, fraction of the fp8 peak
    fp8_gemm_efficiency: float = field(default=0.60, metadata={"ge": MIN_EFFICIENCY, "le": 1})
    # GEMM dimension at which the shape factor is 1/2
    gemm_dim_half: float = field(default=64.0, metadata={"ge": 0, "le": 1e6})
    # fused (flash) attention, FlashAttention's FLOP convention, fraction of bf16 peak
    attention_efficiency: float = field(default=0.55, metadata={"ge": MIN_EFFICIENCY, "le": 1})
    # achieved fraction of HBM bandwidth for streaming kernels
    memory_efficiency: float = field(default=0.85, metadata={"ge": MIN_EFFICIENCY, "le": 1})
    # per kernel: launch + tail effects
    launch_overhead_s: float = field(default=4e-6, metadata={"ge": 0, "le": 1e-2})
    # Share of the compute units held by communication kernels while an overlapped
    # forward/backward pair (DualPipe) computes: its compute ops take 1 / (1 - share)
    # as long (``simulator.engine.compute.overlap_slowdown``).
    comm_sm_fraction: float = field(default=0.0, metadata={"ge": 0, "lt": 1})
    # How much longer an expert all-to-all takes while Megatron-Core's batch-level overlap runs
    # it beside the other micro-batch's compute (``training.overlap_moe_expert_parallel_comm``):
    # its kernels share the SMs and HBM with that compute. Not applied to DualPipe's pairs,
    # whose dedicated communication SMs keep the links full (DeepSeek-V3 §3.2.2).
    overlap_a2a_slowdown: float = field(default=1.0, metadata={"ge": 1, "le": 10})
    # The FP8 quantisation passes' achieved HBM rate as a share of ``memory_efficiency``'s
    # (``workloads.quantization``: amax, scale and cast into rowwise and columnwise copies,
    # kernels of kind "quantize"), where it differs from a streaming copy's.
    quantize_bandwidth_share: float = field(default=1.0, metadata={"ge": MIN_EFFICIENCY, "le": 1})
    source: str = ""

    def with_(self, **changes) -> ComputeCalibration:
        return replace(self, **changes)


@dataclass(frozen=True)
class ChipSpec:
    """One accelerator.

    ``peak_flops_per_s`` maps a dtype name (``'bf16'``, ``'fp8'``) to the dense
    peak in FLOP/s; ``'bf16'`` is required. ``family`` selects the compute
    calibration (one of :data:`FAMILIES`).
    """

    name: str
    peak_flops_per_s: Mapping[str, float] = field(hash=False)
    # constraints in metadata (pydantic's gt/ge/...): the scenario schema's chip input model
    # is built from these fields (simulator.scenario.schema)
    hbm_bytes: float = field(metadata={"ge": MIN_HBM_BYTES, "le": MAX_HBM_BYTES})
    hbm_bw_bytes_per_s: float = field(metadata={"ge": MIN_BW_BYTES_PER_S, "le": MAX_BW_BYTES_PER_S})
    family: str
    source: str = ""

    def __post_init__(self) -> None:
        peaks = dict(self.peak_flops_per_s)
        if "bf16" not in peaks:
            raise TopologyError(
                f"cluster.chip.peak_flops_per_s: chip {self.name!r} needs a 'bf16' peak; got keys {sorted(peaks)}",
                field="cluster.chip.peak_flops_per_s",
            )
        for dtype, value in peaks.items():
            if not (_is_number(value) and MIN_PEAK_FLOPS_PER_S <= value <= MAX_PEAK_FLOPS_PER_S):
                raise TopologyError(
                    f"cluster.chip.peak_flops_per_s.{dtype}: must be from {MIN_PEAK_FLOPS_PER_S:g} to "
                    f"{MAX_PEAK_FLOPS_PER_S:g} FLOP/s, got {value!r}",
                    field=f"cluster.chip.peak_flops_per_s.{dtype}",
                )
        peaks = {k: float(v) for k, v in sorted(peaks.items())}
        object.__setattr__(self, "peak_flops_per_s", peaks)
        for name, low, high in (
            ("hbm_bytes", MIN_HBM_BYTES, MAX_HBM_BYTES),
            ("hbm_bw_bytes_per_s", MIN_BW_BYTES_PER_S, MAX_BW_BYTES_PER_S),
        ):
            value = getattr(self, name)
            if not (_is_number(value) and low <= value <= high):
                raise TopologyError(
                    f"cluster.chip.{name}: must be from {low:g} to {high:g}, got {value!r}",
                    field=f"cluster.chip.{name}",
                )
        if self.family not in FAMILIES:
            raise TopologyError(
                f"cluster.chip.family: {self.family!r} is not a calibration family; allowed: {', '.join(FAMILIES)}",
                field="cluster.chip.family",
            )

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``; the BF16 peak for a dtype not listed."""
        return self.peak_flops_per_s.get(dtype, self.peak_flops_per_s["bf16"])


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _chip(name, bf16_tflops, fp8_tflops, hbm_bytes, hbm_bw, family, source) -> ChipSpec:
    return ChipSpec(name, {"bf16": bf16_tflops * 1e12, "fp8": fp8_tflops * 1e12}, hbm_bytes, hbm_bw, family, source)


CHIPS: dict[str, ChipSpec] = {
    c.name: c
    for c in (
        # A100 SXM 80GB: 312 TF BF16; no FP8 (624 is INT8); 80 GB HBM2e at 2039 GB/s.
        _chip(
            "a100",
            312,
            312,
            80e9,
            2.039e12,
            "ampere",
            "NVIDIA A100 datasheet via HSYM GPU tables; Megatron-LM SC'21 section 5",
        ),
        # H100 SXM: 989 TF BF16, 1979 TF FP8 dense; 80 GB HBM3 at 3.35 TB/s.
        _chip("h100", 989, 1979, 80e9, 3.35e12, "hopper", "NVIDIA H100 SXM datasheet; HSYM GPU tables"),
        # H800 SXM: same Tensor Cores and HBM as H100 (only NVLink is cut to 400 GB/s bidir).
        _chip("h800", 989, 1979, 80e9, 3.35e12, "hopper", "DeepSeek-V3 report (arXiv 2412.19437) section 3.1"),
        # H200 SXM: H100 compute with 141 GB HBM3e at 4.8 TB/s.
        _chip("h200", 989, 1979, 141e9, 4.8e12, "hopper", "NVIDIA H200 datasheet; HSYM GPU tables"),
        # B200: 2250 TF BF16, 4500 TF FP8 dense; 192 GB HBM3e at 8 TB/s (HSYM; some pages say 180 GB).
        _chip("b200", 2250, 4500, 192e9, 8.0e12, "blackwell", "HSYM GPU tables; NVIDIA DGX B200 datasheet"),
        # GB200 (one Blackwell GPU of an NVL72): 2450 / 4900 TF dense (dgxc), ~186 GB (13.4 TB / 72),
        # 8 TB/s (576 TB/s / 72).
        _chip(
            "gb200",
            2450,
            4900,
            186e9,
            8.0e12,
            "blackwell",
            "NVIDIA DGX Cloud benchmarking README (dgxc); GB200 NVL72 rack datasheet / 72",
        ),
        # GB300 (one Blackwell Ultra GPU of an NVL72): the rack's dense FP8 is 360 PF, 5.0 PF a GPU,
        # the same as GB200 NVL72's (720 PF sparse / 72 / 2): Blackwell Ultra raises FP4 and the
        # attention exponent rate (10.7 against 5 tera-exponentials/s, Verda's per-GPU table), not
        # FP8 or BF16 tensor throughput, so the tensor rates are gb200's (DGX Cloud's 2450 / 4900);
        # 20.7 TB of HBM3e / 72 = 287.5 GB (12-high stacks; "288 GB" per GPU) at 576 TB/s / 72.
        _chip(
            "gb300",
            2450,
            4900,
            287.5e9,
            8.0e12,
            "blackwell",
            "NVIDIA GB300 NVL72 rack datasheet (360 PF FP8 dense, 20.7 TB HBM3e, 576 TB/s) / 72, "
            "the same FP8 a GPU as the GB200 NVL72 datasheet's: rates as gb200",
        ),
        # TPU v4: 275 TF BF16 (INT8 the same), 32 GiB HBM2 at 1200 GB/s.
        _chip("tpu-v4", 275, 275, 32 * GiB, 1.2e12, "tpu", "Cloud TPU v4 documentation; HSYM TPU table"),
        # TPU v5e: 197 TF BF16 (394 is INT8), "16 GB" HBM2 at 819 GB/s. The capacity is what XLA
        # lets a program allocate, 15.75 GiB (16.9e9 B): its out-of-memory message reads "Used ...
        # of 15.75G hbm" on v5e, G being GiB (the datasheet's 16 GB are 16 GiB less XLA's reserve).
        _chip(
            "tpu-v5e",
            197,
            197,
            15.75 * GiB,
            819e9,
            "tpu",
            "Cloud TPU v5e documentation; HSYM TPU table; XLA:TPU out-of-memory report (15.75G hbm)",
        ),
        # TPU v5p: 459 TF BF16, no FP8 speed-up (918 is INT8), "95 GB" HBM2e at 2765 GB/s; XLA
        # allocates up to 95.74 GiB (102.8e9 B): "Used ... of 95.74G hbm" in its out-of-memory report.
        _chip(
            "tpu-v5p",
            459,
            459,
            95.74 * GiB,
            2.765e12,
            "tpu",
            "Cloud TPU v5p documentation; HSYM TPU table; XLA:TPU out-of-memory report (95.74G hbm)",
        ),
        # TPU v6e (Trillium): 918 TF BF16 (1836 is INT8), 32 GB HBM at 1638 GB/s.
        _chip("tpu-v6e", 918, 918, 32e9, 1.638e12, "tpu", "Cloud TPU v6e documentation; HSYM TPU table"),
        # TPU7x (Ironwood): 2307 TF BF16, 4614 TF FP8, 192 GiB HBM3e at 7.37 TB/s.
        _chip(
            "tpu-v7", 2307, 4614, 192 * GiB, 7.37e12, "tpu", "Cloud TPU7x documentation; HSYM TPU table; Hot Chips 2025"
        ),
    )
}


def get_chip(name: str) -> ChipSpec:
    """The catalogue chip called ``name`` (case-insensitive).

    Raises
    ------
    UnknownPresetError
        If ``name`` is not in :data:`CHIPS`; the message lists the allowed names.
    """
    key = str(name).strip().lower()
    try:
        return CHIPS[key]
    except KeyError:
        raise UnknownPresetError.named("chip", name, CHIPS, "cluster.chip") from None
