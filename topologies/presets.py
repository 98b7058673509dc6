"""Cluster presets: chips plus network defaults, sized to a device count.

Numbers come from Part B of the project's reference data; each preset names its
primary sources. ``HSYM`` = "How to Scale Your Model" (Google DeepMind,
jax-ml/scaling-book). Bandwidths are per direction: NVIDIA's bidirectional
NVLink figures are halved, e.g. H800's 400 GB/s becomes 200e9.

GPU latencies are the :class:`~topologies.networks.SwitchedNetwork` defaults,
split from DeepSeek's ISCA'25 measurements (see :mod:`topologies.networks`) and
used for every GPU preset. TPU ICI hops use 1 us, the per-hop figure HSYM assumes
in its worked examples (an assumption, not a published spec).

TPU slices are sized by :func:`torus_shape_for`; a device count larger than one
pod is split into equal pods of whole hosts joined by the data-centre network.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from .builders import join_pods, switched, torus
from .chips import ChipSpec, get_chip
from .errors import TopologyError, UnknownPresetError
from .networks import ClusterSpec, PodsSpec, SwitchedNetwork, TorusNetwork
from .topology import Topology

ICI_HOP_LATENCY_S = 1e-6  # HSYM's assumed per-hop ICI latency (TPU v5e worked example)


@dataclass(frozen=True)
class TpuSliceRule:
    """How a TPU generation lays out slices.

    ``wrap_length`` ``None`` means an axis wraps when its length is a multiple of 4
    (v4, v5p, TPU7x); an integer means only axes of exactly that length wrap
    (16 on v5e/v6e).
    """

    dims: int
    link_bw_bytes_per_s: float
    pod_devices: int
    chips_per_host: int
    dcn_bw_bytes_per_s: float
    max_axis: int | None = None
    wrap_length: int | None = None

    def wrap(self, shape: tuple[int, ...]) -> tuple[bool, ...] | None:
        if self.wrap_length is None:
            return None
        return tuple(n == self.wrap_length for n in shape)


@dataclass(frozen=True)
class ClusterPreset:
    """A named cluster design: exactly one of ``network`` (switched) or ``tpu`` is set."""

    chip: str
    default_devices: int
    host_bw_bytes_per_s: float
    source: str
    network: SwitchedNetwork | None = None
    tpu: TpuSliceRule | None = None


PCIE4_X16 = 32e9  # PCIe Gen4 x16, per direction
PCIE5_X16 = 64e9  # PCIe Gen5 x16, per direction

CLUSTER_PRESETS: dict[str, ClusterPreset] = {
    # DGX A100 (Selene): NVLink3 300 GB/s per direction, 8x HDR 200 Gb/s IB = 25e9 per GPU;
    # NVSwitch v2 has no NVLS. Megatron-LM SC'21 section 5 ran up to 3072 GPUs; default 1024.
    "dgx-a100": ClusterPreset(
        "a100",
        1024,
        PCIE4_X16,
        "Megatron-LM (arXiv 2104.04473) section 5; HSYM GPU tables",
        network=SwitchedNetwork(8, 300e9, 25e9),
    ),
    # DGX H100 SuperPOD: NVLink4 450 GB/s per direction with NVLS, 8x NDR 400 Gb/s (50e9) per
    # node rail-optimised, scalable unit of 32 nodes under 8 leaves, full bisection; 1024 GPUs.
    "dgx-h100": ClusterPreset(
        "h100",
        1024,
        PCIE5_X16,
        "NVIDIA DGX H100 SuperPOD reference architecture via HSYM",
        network=SwitchedNetwork(8, 450e9, 50e9, domains_per_leaf=32, nvls=True),
    ),
    # H800 (DeepSeek-V3): NVLink 400 GB/s bidirectional = 200e9 per direction, 8x 400G IB CX7
    # (50e9 per GPU), one plane per GPU-NIC pair of a 2-layer fat tree of 64-port switches
    # (32 nodes per leaf); DeepSeek-V3 trained on 2048 H800.
    "h800": ClusterPreset(
        "h800",
        2048,
        PCIE5_X16,
        "DeepSeek-V3 report (arXiv 2412.19437) 3.1; ISCA'25 insights",
        network=SwitchedNetwork(8, 200e9, 50e9, domains_per_leaf=32, nvls=True),
    ),
    # DGX B200: NVLink5 900 GB/s per direction (2 NVSwitch), 400 Gb/s (50e9) per GPU.
    "dgx-b200": ClusterPreset(
        "b200",
        1024,
        PCIE5_X16,
        "HSYM GPU tables; NVIDIA DGX B200 reference design",
        network=SwitchedNetwork(8, 900e9, 50e9, domains_per_leaf=32, nvls=True),
    ),
    # GB200 NVL72: 72 GPUs on 18 NVSwitch trays at 900 GB/s per direction, 400 Gb/s (50e9)
    # scale-out per GPU (3.6 TB/s per rack); a 576-GPU SuperPOD of 8 racks is the unit.
    "gb200-nvl72": ClusterPreset(
        "gb200",
        576,
        PCIE5_X16,
        "NVIDIA GB200 NVL72 datasheet; HSYM GPU chapter",
        network=SwitchedNetwork(72, 900e9, 50e9, domains_per_leaf=8, nvls=True),
    ),
    # GB300 NVL72: the GB200 NVL72 rack (72 GPUs, 18 NVSwitch trays, NVLink 5 at 900 GB/s per
    # direction) with one ConnectX-8 800 Gb/s (100e9) NIC per GPU (72 a rack, 4 a compute tray);
    # a SuperPOD of 8 racks (576 GPUs) is the unit, as for GB200.
    "gb300-nvl72": ClusterPreset(
        "gb300",
        576,
        PCIE5_X16,
        "NVIDIA GB300 NVL72 datasheet (72 ConnectX-8 NICs, 130 TB/s NVLink); NVIDIA Enterprise RA "
        "'NVL72 AI factory' components (4 ConnectX-8 HCAs a compute tray of 4 GPUs)",
        network=SwitchedNetwork(72, 900e9, 100e9, domains_per_leaf=8, nvls=True),
    ),
    # TPU v4: 3D torus, 45e9 per link one way, 4096-chip pod (16x16x16), 4 chips per host.
    # No per-chip DCN figure in the reference data: assumed equal to v5p's 6.25e9.
    "tpu-v4": ClusterPreset(
        "tpu-v4",
        4096,
        16e9,
        "Cloud TPU v4 documentation; HSYM TPU table",
        tpu=TpuSliceRule(3, 45e9, 4096, 4, 6.25e9, max_axis=16),
    ),
    # TPU v5e: 16x16 2D torus pod, 45e9 per link one way, wrap only on axes of 16,
    # 8 chips per host, DCN 3.125e9 per chip.
    "tpu-v5e": ClusterPreset(
        "tpu-v5e",
        256,
        16e9,
        "Cloud TPU v5e documentation; HSYM TPU table",
        tpu=TpuSliceRule(2, 45e9, 256, 8, 3.125e9, max_axis=16, wrap_length=16),
    ),
    # TPU v5p: 3D torus, 90e9 per link one way, 8960-chip pod (16x20x28); largest slice
    # 16x16x24 = 6144 is the default; 4 chips per host; DCN 50 Gb/s = 6.25e9 per chip.
    "tpu-v5p": ClusterPreset(
        "tpu-v5p",
        6144,
        16e9,
        "Cloud TPU v5p documentation; HSYM TPU table",
        tpu=TpuSliceRule(3, 90e9, 8960, 4, 6.25e9, max_axis=28),
    ),
    # TPU v6e (Trillium): 16x16 2D torus, 90e9 per link one way, wrap on axes of 16,
    # 8 chips per host, DCN 12.5e9 per chip, PCIe Gen5 32e9.
    "tpu-v6e": ClusterPreset(
        "tpu-v6e",
        256,
        32e9,
        "Cloud TPU v6e documentation; HSYM TPU table",
        tpu=TpuSliceRule(2, 90e9, 256, 8, 12.5e9, max_axis=16, wrap_length=16),
    ),
    # TPU7x (Ironwood): 3D torus, 90e9 per link one way, 9216-chip pod, 4 chips per host,
    # DCN 12.5e9 per chip.
    "tpu-v7": ClusterPreset(
        "tpu-v7", 9216, 16e9, "Cloud TPU7x documentation; HSYM TPU table", tpu=TpuSliceRule(3, 90e9, 9216, 4, 12.5e9)
    ),
}


def torus_shape_for(devices: int, dims: int, max_axis: int | None = None) -> tuple[int, ...]:
    """A near-cubic ``dims``-axis torus shape holding exactly ``devices`` devices.

    Among all factorisations with every axis at most ``max_axis``, the chosen
    shape has the fewest axes longer than 2 that are not a multiple of 4 (those
    would not wrap), then the smallest longest/shortest axis ratio. Axes are
    returned in increasing order.

    Raises
    ------
    TopologyError
        (field ``cluster.devices``) when no factorisation fits ``max_axis``.
    """
    if not (isinstance(devices, int) and devices >= 1):
        raise TopologyError(f"cluster.devices: must be an integer >= 1, got {devices!r}", field="cluster.devices")
    if not (isinstance(dims, int) and dims >= 1):
        raise TopologyError(f"cluster.network.shape: dims must be >= 1, got {dims!r}", field="cluster.network.shape")
    limit = devices if max_axis is None else max_axis

    def factorisations(n: int, k: int, lowest: int):
        if k == 1:
            if lowest <= n <= limit:
                yield (n,)
            return
        f = lowest
        while f**k <= n:
            if n % f == 0 and f <= limit:
                for rest in factorisations(n // f, k - 1, f):
                    yield (f,) + rest
            f += 1

    def score(shape):
        open_axes = sum(1 for n in shape if n > 2 and n % 4)
        return (open_axes, shape[-1] / shape[0], shape)

    shapes = list(factorisations(devices, dims, 1))
    if not shapes:
        raise TopologyError(
            f"cluster.devices: {devices} devices cannot form a {dims}-D torus with every axis <= {max_axis}",
            field="cluster.devices",
        )
    return min(shapes, key=score)


def _tpu_layout(devices: int, rule: TpuSliceRule, pod_count: int | None):
    """(pods, per-pod shape) for ``devices`` chips under ``rule``."""
    if pod_count is not None:
        candidates = [pod_count]
    elif devices <= rule.pod_devices:
        candidates = [1]
    else:
        candidates = range(math.ceil(devices / rule.pod_devices), devices // rule.chips_per_host + 1)
    for k in candidates:
        per_pod = devices // k
        if devices % k or per_pod > rule.pod_devices or (k > 1 and per_pod % rule.chips_per_host):
            continue
        try:
            return k, torus_shape_for(per_pod, rule.dims, rule.max_axis)
        except TopologyError:
            continue
    raise TopologyError(
        f"cluster.devices: {devices} devices cannot be split into equal pods of at most "
        f"{rule.pod_devices} chips made of whole {rule.chips_per_host}-chip hosts, each a "
        f"{rule.dims}-D torus with axes <= {rule.max_axis}",
        field="cluster.devices",
    )


def _merge(base, override, cls, field: str):
    """``override`` as a ``cls`` instance: itself, or a mapping applied field by field to ``base``."""
    if isinstance(override, cls):
        return override
    if not isinstance(override, Mapping):
        raise TopologyError(f"{field}: expected a mapping or {cls.__name__}, got {override!r}", field=field)
    allowed = [f.name for f in dataclasses.fields(cls)]
    values = {k: v for k, v in override.items() if k != "kind"}
    if "kind" in override and override["kind"] != getattr(cls, "kind", override["kind"]):
        raise TopologyError(
            f"{field}.kind: this preset's network is {cls.kind!r}, got "
            f"{override['kind']!r}; give the whole network without a preset "
            "to change its kind",
            field=f"{field}.kind",
        )
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise TopologyError(
            f"{field}.{unknown[0]}: unknown key; allowed: {', '.join(allowed)}", field=f"{field}.{unknown[0]}"
        )
    try:
        return dataclasses.replace(base, **values) if base is not None else cls(**values)
    except TypeError as err:  # a required field missing
        raise TopologyError(f"{field}: {err}; fields: {', '.join(allowed)}", field=field) from err


def cluster_preset(name: str, /, devices: int | None = None, **overrides) -> ClusterSpec:
    """The preset ``name`` sized to ``devices`` (default: the preset's own count).

    ``overrides`` take the :class:`ClusterSpec` field names: ``name``,
    ``host_bw_bytes_per_s``, ``chip`` (a preset name, a :class:`ChipSpec`, or a
    mapping of ChipSpec fields applied over the preset chip), ``network`` (a
    network object, or a mapping applied field by field over the preset's
    network), ``pods`` (``None``, a :class:`PodsSpec` or a mapping) and
    ``domain_capacity`` (devices a domain holds, when ``network.domain_size`` is already the
    devices used, as a resolved scenario writes it), ``devices_per_domain`` (devices used per
    scale-up domain, for partly filled racks;
    see :class:`~topologies.networks.ClusterSpec`).

    Raises
    ------
    UnknownPresetError
        For an unknown preset (field ``cluster.preset``).
    TopologyError
        For an unknown override key or devices that do not fit (``cluster.devices``).
    """
    key = str(name).strip().lower()
    if key not in CLUSTER_PRESETS:
        raise UnknownPresetError.named("cluster preset", name, CLUSTER_PRESETS, "cluster.preset")
    preset = CLUSTER_PRESETS[key]
    allowed = (
        "name",
        "chip",
        "network",
        "pods",
        "host_bw_bytes_per_s",
        "storage_bw_bytes_per_s",
        "devices_per_domain",
        "domain_capacity",
    )
    for k in overrides:
        if k not in allowed:
            raise TopologyError(
                f"cluster.{k}: unknown key; allowed: devices, preset, {', '.join(allowed)}", field=f"cluster.{k}"
            )
    devices = preset.default_devices if devices is None else devices
    if not (isinstance(devices, int) and not isinstance(devices, bool) and devices >= 1):
        raise TopologyError(f"cluster.devices: must be an integer >= 1, got {devices!r}", field="cluster.devices")

    chip: ChipSpec | str | Mapping = overrides.get("chip", preset.chip)
    if isinstance(chip, str):
        chip = get_chip(chip)
    elif not isinstance(chip, ChipSpec):
        chip = _merge(get_chip(preset.chip), chip, ChipSpec, "cluster.chip")

    net_override = overrides.get("network", {})
    pods_override = overrides.get("pods", {})
    pods: PodsSpec | None
    if preset.tpu is None:
        network = _merge(preset.network, net_override, SwitchedNetwork, "cluster.network")
        pods = None if pods_override in ({}, None) else _merge(None, pods_override, PodsSpec, "cluster.pods")
    else:
        rule = preset.tpu
        network = _tpu_network(rule, devices, net_override, pods_override)
        n_pods = max(1, devices // network.devices)
        default_pods = PodsSpec(n_pods, rule.dcn_bw_bytes_per_s) if n_pods > 1 else None
        if pods_override is None:
            pods = None
        elif pods_override == {}:
            pods = default_pods
        else:
            pods = _merge(
                default_pods or PodsSpec(n_pods, rule.dcn_bw_bytes_per_s), pods_override, PodsSpec, "cluster.pods"
            )
    return ClusterSpec(
        name=overrides.get("name", key),
        devices=devices,
        chip=chip,
        network=network,
        pods=pods,
        host_bw_bytes_per_s=overrides.get("host_bw_bytes_per_s", preset.host_bw_bytes_per_s),
        storage_bw_bytes_per_s=overrides.get("storage_bw_bytes_per_s", 2e12),  # ClusterSpec's default, cited there
        devices_per_domain=overrides.get("devices_per_domain"),
        domain_capacity=overrides.get("domain_capacity"),
    )


def _tpu_network(rule, devices: int, net_override, pods_override) -> TorusNetwork:
    """A TPU preset's torus: the override itself, or the preset's layout for ``devices``
    (over the pods the override asks for) with the override's fields applied."""
    if isinstance(net_override, TorusNetwork):
        return net_override
    net_map = dict(net_override) if isinstance(net_override, Mapping) else net_override
    if isinstance(net_map, dict) and "shape" in net_map:
        shape = tuple(net_map["shape"])
    else:
        count = None
        if isinstance(pods_override, PodsSpec):
            count = pods_override.count
        elif isinstance(pods_override, Mapping) and "count" in pods_override:
            count = pods_override["count"]
        shape = _tpu_layout(devices, rule, count)[1]
    base = TorusNetwork(shape, rule.link_bw_bytes_per_s, ICI_HOP_LATENCY_S, rule.wrap(shape))
    return _merge(base, net_map, TorusNetwork, "cluster.network")


def build_cluster(spec: ClusterSpec) -> Topology:
    """The :class:`Topology` of ``spec``: one graph per pod, joined over the DCN if several.

    Raises
    ------
    TopologyError
        (field ``cluster.devices``) when the devices do not fit the torus shape or
        the domains; :class:`ClusterSpec` already refuses such specs when built.
    """
    net = spec.network
    per_pod = spec.devices_per_pod
    if isinstance(net, TorusNetwork):
        if per_pod * spec.n_pods != spec.devices or per_pod != net.devices:
            raise TopologyError(
                f"cluster.devices: {spec.devices} devices do not fit torus shape "
                f"{list(net.shape)} x {spec.n_pods} pod(s)",
                field="cluster.devices",
            )
        pod = torus(net.shape, net.link_bw_bytes_per_s, net.link_latency_s, net.wrap, net.tile)
    else:
        pod = switched(per_pod, net)
    graph = pod if spec.n_pods == 1 else join_pods([pod] * spec.n_pods, spec.pods)
    return Topology(graph, spec.name)
