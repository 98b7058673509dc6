"""Network calibration: how much of a link's line rate a collective library achieves.

A :class:`NetCalibration` holds two tables keyed by link kind (the ``kind``
attribute of a topology edge: ``'ici'``, ``'nvlink'``, ``'nic'``, ``'fabric'``,
``'dcn'``):

* ``efficiency`` -- the fraction of the per-direction line rate that bulk
  transfers achieve (protocol headers, flow control, NCCL's chunking). The flow
  network multiplies every link's capacity by it.
* ``message_overhead_s`` -- extra software latency paid once per bulk-synchronous
  step by a transfer whose path crosses a link of that kind (the largest value
  along the path counts). It is *on top of* the link latencies of the topology.

``algorithm_efficiency`` scales the bandwidth of whole collective algorithms whose
throughput is limited by something other than link protocol overhead (in-switch
reduction ALUs): :func:`simulator.network.collectives.run_collective` divides the bytes of
such a plan by it.

``a2a_efficiency`` (per link kind) is the share of the bulk-copy rate above that
all-to-all kernels reach: many small per-peer messages at once, and (DeepEP) a few SMs
driving them. Every transfer of an all-to-all plan (``direct``, ``hierarchical-a2a``) is
divided by the value of the least efficient kind of link it loads. Each default is the
mean of the published measurements of its family, each expressed as stepsim's time with
bulk rates alone over the measured time for the same traffic on the same machine
(``tests/test_a2a_measured.py`` rebuilds each benchmark's traffic from its script):

* Hopper NVLink, 0.855: DeepEP V1 intranode EP 8 on H800, dispatch 153 GB/s and combine
  158 GB/s "bottleneck bandwidth" at 24 SMs (deepseek-ai/DeepEP, docs/legacy.md): 0.817
  and 0.844; NCCL ``alltoall_perf`` on 4 x H100, 334.90 GB/s busbw at 500 MiB
  (NVIDIA/nccl issue #2169): 334.90 / 370 = 0.905.
* InfiniBand NIC and fabric, 0.913 (Hopper; carried over to Ampere and Blackwell, an
  assumption): DeepEP V1 internode EP 32 and 64 on H800 with 400 Gb/s CX7, dispatch 58
  / 51 and combine 57 / 50 GB/s, RDMA-bound: 0.910, 0.894, 0.933, 0.915.
* Blackwell NVLink, 0.823: DeepEP V2 intranode EP 8 on B200 (README), dispatch 726 / 643
  GB/s and combine 740 / 675 GB/s at 64 / 24 SMs: 0.858, 0.760, 0.875, 0.798.
* Ampere NVLink: Hopper's fraction carried over (an assumption); TPU: none (1.0).

With them the DeepEP and NCCL figures are matched within 6 % except DeepEP's EP 16 on 2
nodes (NVLink-bound by its forwarding: stepsim 12 % faster).

Defaults per chip family (the data files ``simulator/calibration/network-<family>.json``, each value
with its source and the figure it was checked against), with the measurement each number comes from:

* NVLink (Hopper): nccl-tests busbw of about 370 GB/s on 8 x H100 against a
  450 GB/s per-direction line rate, "about 20 % protocol overhead" -- S. Jeaugey
  (NCCL maintainer), NVIDIA/nccl-tests issue #212. 370 / 450 = 0.822.
* NVLink SHARP (NVLS, Hopper): peak all-reduce busbw about 480 GB/s, i.e. algbw
  about 275 GB/s on 8 x H100 at sizes > 256 MB (same issue #212). The NVLS plan
  moves ``S (n+1)/n`` bytes per direction per GPU (see ``collectives.py``), so the
  achieved per-direction rate is 275 x 9/8 = 309 GB/s = 0.688 of line rate, i.e.
  0.688 / 0.822 = 0.836 of what NVLink copies achieve.
* InfiniBand NIC and fabric links: "12.2 GB/s (for a 100 Gbps card) is as good as
  you can get", and a DGX-1 with four such adapters reaches 48 GB/s -- S. Jeaugey,
  NVIDIA/nccl-tests issue #29. 12.2 / 12.5 = 0.976, 48 / 50 = 0.96; we use 0.96.
* Latency: the topology builders (``topologies/networks.py``) already split the
  small-message (64 B) end-to-end latencies measured by DeepSeek (Zhao et al.,
  "Insights into DeepSeek-V3", ISCA'25: IB 2.8 us same leaf, 3.7 us cross leaf,
  NVLink 3.33 us) over the links of a path, and the TPU torus builder uses about
  1 us per ICI hop (the assumption of "How to Scale Your Model", TPU chapter). As
  those figures are already end to end, the default ``message_overhead_s`` is 0
  for every kind so that nothing is counted twice; a send-recv of a tiny message
  then takes exactly the published latency (checked in ``tests/test_network.py``).
* Ampere and Blackwell NVLink: no busbw measurement in the project's reference
  data; the Hopper fraction 0.82 is carried over (an assumption). As a sanity
  check, a GB200 user measured 770 GB/s GPU-to-GPU copy bandwidth with
  nvbandwidth against 900 GB/s line rate (0.86; Azure/AI-benchmarking-guide
  issue #7), close to it.
* NVLink SHARP (NVLS, Blackwell): a full GB200 NVL72 rack (72 GPUs) measures an
  all-reduce algbw of 425.49 GB/s (busbw 839.16) at 4 GiB out of place, 835-847
  busbw at 4-8 GiB (coreweave/nccl-tests pull request #43, "Add a GB200 NVL72
  example"). With ``S (n+1)/n`` bytes per direction per GPU that is
  425.49 x 73/72 = 431.4 GB/s = 0.479 of the 900 GB/s line rate, i.e. 0.583 of
  what NVLink copies achieve -- well below Hopper's 0.836, so Hopper's NVLS figure is
  not carried over. 8-GPU Blackwell domains (DGX B200) get the same fraction (an
  assumption: no single-node B200 NVLS measurement at hand).
* TPU ICI and DCN: "How to Scale Your Model" computes its collective rooflines at
  the full per-link bandwidth; with no published achieved-to-line ratio in the
  reference data the default is 1.0 (an assumption, overridable).
* DCN on GPU clusters: no measurement at hand; 0.96 as for InfiniBand (assumption).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from simulator.errors import NetworkError

#: Link kinds that topologies put on edges.
LINK_KINDS = ("ici", "nvlink", "nic", "fabric", "dcn")

#: Chip families with default calibrations (same names as ``topologies.chips.FAMILIES``).
FAMILIES = ("ampere", "hopper", "blackwell", "tpu")


class CalibrationError(NetworkError):
    """A calibration table with a bad entry, or an unknown chip family."""


def _frozen(mapping: Mapping[str, float], name: str, upper: float | None) -> Mapping[str, float]:
    out = {}
    for key, value in dict(mapping).items():
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise CalibrationError(f"{name}[{key!r}]: expected a number, got {value!r}") from None
        if not (v >= 0.0) or v != v or v == float("inf"):
            raise CalibrationError(f"{name}[{key!r}]: must be a finite number >= 0, got {value!r}")
        if upper is not None and not (0.0 < v <= upper):
            raise CalibrationError(f"{name}[{key!r}]: must be in (0, {upper}], got {value!r}")
        out[str(key)] = v
    return MappingProxyType(out)


@dataclass(frozen=True)
class NetCalibration:
    """Achieved fraction of line rate and per-step software latency, per link kind.

    Kinds missing from ``efficiency`` get 1.0; kinds missing from
    ``message_overhead_s`` get 0.0. ``algorithm_efficiency`` (by collective
    algorithm name) defaults to 1.0.
    """

    efficiency: Mapping[str, float] = field(default_factory=dict, hash=False)
    message_overhead_s: Mapping[str, float] = field(default_factory=dict, hash=False)
    algorithm_efficiency: Mapping[str, float] = field(default_factory=dict, hash=False)
    a2a_efficiency: Mapping[str, float] = field(default_factory=dict, hash=False)
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "efficiency", _frozen(self.efficiency, "efficiency", 1.0))
        object.__setattr__(self, "a2a_efficiency", _frozen(self.a2a_efficiency, "a2a_efficiency", 1.0))
        object.__setattr__(self, "message_overhead_s", _frozen(self.message_overhead_s, "message_overhead_s", None))
        object.__setattr__(
            self, "algorithm_efficiency", _frozen(self.algorithm_efficiency, "algorithm_efficiency", 1.0)
        )

    def efficiency_of(self, kind: str) -> float:
        return self.efficiency.get(kind, 1.0)

    def overhead_of(self, kind: str) -> float:
        return self.message_overhead_s.get(kind, 0.0)

    def algorithm_efficiency_of(self, algorithm: str) -> float:
        return self.algorithm_efficiency.get(algorithm, 1.0)

    def a2a_efficiency_of(self, kind: str) -> float:
        return self.a2a_efficiency.get(kind, 1.0)

    def with_overrides(
        self,
        *,
        efficiency: Mapping[str, float] | None = None,
        message_overhead_s: Mapping[str, float] | None = None,
        algorithm_efficiency: Mapping[str, float] | None = None,
        a2a_efficiency: Mapping[str, float] | None = None,
    ) -> NetCalibration:
        """A copy with some entries replaced (others kept)."""
        return replace(
            self,
            efficiency={**self.efficiency, **(efficiency or {})},
            message_overhead_s={**self.message_overhead_s, **(message_overhead_s or {})},
            algorithm_efficiency={**self.algorithm_efficiency, **(algorithm_efficiency or {})},
            a2a_efficiency={**self.a2a_efficiency, **(a2a_efficiency or {})},
        )


#: Line rate, no software latency: what closed-form tests compare against.
IDEAL = NetCalibration(source="ideal: line rate, no overhead")

#: The folder of the calibration data files: ``network-<family>.json`` gives each value of a
#: family's calibration with its source and the figure it was checked against.
CALIBRATION_DIR = Path(__file__).resolve().parent.parent / "calibration"
#: The schema tag of a network calibration file.
NETWORK_SCHEMA = "stepsim.network-calibration/1"
TABLES = ("efficiency", "message_overhead_s", "algorithm_efficiency", "a2a_efficiency")


def calibration_from_document(doc: Mapping, where: str) -> NetCalibration:
    """A :class:`NetCalibration` from a network calibration document (``{"schema", "family",
    "summary", <table>: {key: {"value", "source", "checked_against"}}}`` for each of
    :data:`TABLES`)."""
    if not isinstance(doc, Mapping) or doc.get("schema") != NETWORK_SCHEMA:
        raise CalibrationError(f"{where}: not a network calibration (schema {NETWORK_SCHEMA!r})")
    tables = {}
    for table in TABLES:
        entries = doc.get(table) or {}
        if not isinstance(entries, Mapping) or not all(
            isinstance(e, Mapping) and isinstance(e.get("value"), (int, float)) for e in entries.values()
        ):
            raise CalibrationError(f"{where}: {table} must map each key to a mapping with a numeric value")
        tables[table] = {k: float(e["value"]) for k, e in entries.items()}
    return NetCalibration(**tables, source=str(doc.get("summary", "")))


def _load_family(family: str) -> NetCalibration:
    path = CALIBRATION_DIR / f"network-{family}.json"
    return calibration_from_document(json.loads(path.read_text(encoding="utf-8")), str(path))


_DEFAULTS = {family: _load_family(family) for family in FAMILIES}
#: Hopper's NVLink efficiency and all-to-all shares, as tests and scenarios quote them.
NVLINK_EFFICIENCY = _DEFAULTS["hopper"].efficiency["nvlink"]
HOPPER_A2A_EFFICIENCY = dict(_DEFAULTS["hopper"].a2a_efficiency)


def default_calibration(family: str) -> NetCalibration:
    """The default calibration of a chip family (or of a catalogue chip name).

    ``family`` is one of :data:`FAMILIES` (``'hopper'``...) or a chip name known to
    ``topologies.chips`` (``'h100'``, ``'tpu-v5p'``...), case-insensitive.

    Raises
    ------
    CalibrationError
        If ``family`` is neither; the message lists the allowed families.
    """
    key = str(family).strip().lower()
    if key in _DEFAULTS:
        return _DEFAULTS[key]
    try:
        from topologies.chips import CHIPS
    except ImportError:  # pragma: no cover - the catalogue ships with stepsim
        CHIPS = {}
    if key in CHIPS:
        return _DEFAULTS[CHIPS[key].family]
    raise CalibrationError(
        f"calibration family {family!r} is unknown; allowed: {', '.join(FAMILIES)} "
        f"or a chip name ({', '.join(sorted(CHIPS))})"
    )
