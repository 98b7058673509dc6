"""Network descriptions: frozen plain data that the builders turn into graphs.

Bandwidths are **per direction**: per link for a torus, per device for a
switched network. Latencies are per link (one hop); a path's latency is the sum
over its links.

Default latencies of :class:`SwitchedNetwork` split the small-message (64 B)
end-to-end latencies measured by DeepSeek (Zhao et al., "Insights into
DeepSeek-V3", ISCA'25) over the links a message crosses:

* NVLink 3.33 us device -> NVSwitch -> device: two links of 1.665 us;
* InfiniBand 2.8 us within one leaf: device -> leaf -> device, two NIC links of 1.4 us;
* InfiniBand 3.7 us across leaves adds leaf -> spine -> leaf: two more links of 0.45 us.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

from .chips import MAX_BW_BYTES_PER_S, MIN_BW_BYTES_PER_S, ChipSpec
from .errors import TopologyError

NVLINK_LATENCY_S = 3.33e-6 / 2  # ISCA'25 NVLink 3.33 us over two links
IB_NIC_LATENCY_S = 2.8e-6 / 2  # ISCA'25 IB same-leaf 2.8 us over two NIC links
IB_SWITCH_LATENCY_S = (3.7e-6 - 2.8e-6) / 2  # ISCA'25 IB cross-leaf 3.7 us: two more links

# Physical ranges of a cluster's numbers (docs/scenario.md, "Physical ranges"): anything
# outside is refused naming the key, so that no bandwidth, latency or count the simulation
# sees is non-finite or absurd. Bandwidths per direction: 1 MB/s (far below any NIC or DCN
# share) to 1 EB/s (100 x any HBM: an "ideal" free network as a what-if; topologies.chips); latencies per link at most 1 s (networks
# are microseconds); counts (devices per domain, axis lengths, pods) at most MAX_COUNT.
MAX_LATENCY_S = 1.0
MAX_OVERSUBSCRIPTION = 1e3
MAX_COUNT = 262_144
MAX_NAME_CHARS = 200


def is_number(value) -> bool:
    """A real number that is not a boolean or a string (YAML's ``"5e9"`` in quotes is a string)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_bw(value, field_name: str) -> None:
    """A bandwidth in bytes/s within [:data:`MIN_BW_BYTES_PER_S`, :data:`MAX_BW_BYTES_PER_S`]."""
    if not (is_number(value) and MIN_BW_BYTES_PER_S <= value <= MAX_BW_BYTES_PER_S):
        raise TopologyError(
            f"{field_name}: must be a bandwidth from {MIN_BW_BYTES_PER_S:g} to {MAX_BW_BYTES_PER_S:g} bytes/s, "
            f"got {value!r}",
            field=field_name,
        )


def check_latency(value, field_name: str) -> None:
    """A latency in seconds within [0, :data:`MAX_LATENCY_S`]."""
    if not (is_number(value) and 0 <= value <= MAX_LATENCY_S):
        raise TopologyError(
            f"{field_name}: must be a latency from 0 to {MAX_LATENCY_S:g} s, got {value!r}", field=field_name
        )


def check_flag(value, field_name: str) -> None:
    """``true`` or ``false``: a string (``"false"``, ``"no"``) or a number is refused, not read as a flag."""
    if not isinstance(value, bool):
        quoted = " (in quotes it is a string)" if isinstance(value, str) else ""
        raise TopologyError(f"{field_name}: must be true or false{quoted}, got {value!r}", field=field_name)


def _positive_int(value, field_name: str) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_COUNT):
        raise TopologyError(
            f"{field_name}: must be an integer >= 1 (at most {MAX_COUNT:,}), got {value!r}", field=field_name
        )


def check_tile(shape: tuple[int, ...], tile) -> tuple[int, ...]:
    """``tile`` as a tuple of block lengths, one per axis of ``shape``, each dividing its axis.

    Raises
    ------
    TopologyError
        (field ``cluster.network.tile``) otherwise."""
    try:
        tile = tuple(tile)
    except TypeError:
        raise TopologyError(
            f"cluster.network.tile: must be a list of block lengths, got {tile!r}", field="cluster.network.tile"
        ) from None
    if len(tile) != len(shape):
        raise TopologyError(
            f"cluster.network.tile: needs one block length per axis of shape {list(shape)}, got {list(tile)}",
            field="cluster.network.tile",
        )
    for t, n in zip(tile, shape):
        _positive_int(t, "cluster.network.tile")
        if n % t:
            raise TopologyError(
                f"cluster.network.tile: block lengths must divide the axis lengths of shape {list(shape)}, "
                f"got {list(tile)}",
                field="cluster.network.tile",
            )
    return tile


def default_wrap(shape: tuple[int, ...]) -> tuple[bool, ...]:
    """Wrap-around rule of TPU v4/v5p slices: an axis wraps iff its length is a multiple of 4.

    (Cloud TPU v4/v5p docs: full 4x4x4 cubes and their multiples get wrap-around
    links through the optical switches.) TPU v5e/v6e 2D slices wrap only on axes of
    length 16; pass their ``wraparound`` explicitly.
    """
    return tuple(n % 4 == 0 for n in shape)


@dataclass(frozen=True)
class TorusNetwork:
    """An n-D torus of point-to-point links (TPU ICI), one device per lattice point.

    ``wraparound`` gives per axis whether the ends are joined; ``None`` applies
    :func:`default_wrap`. ``wrap`` is the resolved tuple.
    """

    kind: ClassVar[str] = "torus"
    shape: tuple[int, ...]
    link_bw_bytes_per_s: float
    link_latency_s: float = 1e-6
    wraparound: tuple[bool, ...] | None = None
    # Device numbering in blocks (topologies.builders.torus): consecutive devices fill one
    # ``tile`` block (axis 0 fastest) before the next block; None numbers axis by axis.
    tile: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        try:
            shape = tuple(self.shape)
        except TypeError:
            raise TopologyError(
                f"cluster.network.shape: must be a list of axis lengths, got {self.shape!r}",
                field="cluster.network.shape",
            ) from None
        if not shape:
            raise TopologyError("cluster.network.shape: needs at least one axis", field="cluster.network.shape")
        for n in shape:
            _positive_int(n, "cluster.network.shape")
        object.__setattr__(self, "shape", shape)
        check_bw(self.link_bw_bytes_per_s, "cluster.network.link_bw_bytes_per_s")
        check_latency(self.link_latency_s, "cluster.network.link_latency_s")
        if self.wraparound is not None:
            try:
                wrap = tuple(self.wraparound)
            except TypeError:
                raise TopologyError(
                    f"cluster.network.wraparound: must be a list of true/false, one per axis, got {self.wraparound!r}",
                    field="cluster.network.wraparound",
                ) from None
            for w in wrap:
                check_flag(w, "cluster.network.wraparound")
            if len(wrap) != len(shape):
                raise TopologyError(
                    f"cluster.network.wraparound: needs one flag per axis of shape {shape}, got {self.wraparound!r}",
                    field="cluster.network.wraparound",
                )
            object.__setattr__(self, "wraparound", wrap)
        if self.tile is not None:
            object.__setattr__(self, "tile", check_tile(shape, self.tile))

    @property
    def wrap(self) -> tuple[bool, ...]:
        return self.wraparound if self.wraparound is not None else default_wrap(self.shape)

    @property
    def devices(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class SwitchedNetwork:
    """Scale-up domains (NVLink behind NVSwitches) joined by a scale-out fat-tree.

    ``domain_size`` consecutive devices form one domain, each with
    ``domain_bw_bytes_per_s`` to its domain's switch. Each device also has a NIC of
    ``nic_bw_bytes_per_s`` to a leaf switch; ``domains_per_leaf`` domains form one
    leaf group. ``rails=True`` gives every local index ``j`` of the group its own
    leaf (rail-optimised); ``rails=False`` puts the whole group under one leaf.
    Leaves reach each other through a spine with leaf uplinks of (downlink
    bandwidth) / ``oversubscription``. ``nvls`` (NVLink SHARP in the NVSwitch) and
    ``sharp`` (in-network reduction on the scale-out fabric) are capability flags
    for the collective algorithms.
    """

    kind: ClassVar[str] = "switched"
    domain_size: int
    domain_bw_bytes_per_s: float
    nic_bw_bytes_per_s: float
    oversubscription: float = 1.0
    domain_latency_s: float = NVLINK_LATENCY_S
    nic_latency_s: float = IB_NIC_LATENCY_S
    switch_latency_s: float = IB_SWITCH_LATENCY_S
    domains_per_leaf: int = 32
    rails: bool = True
    nvls: bool = False
    sharp: bool = False

    def __post_init__(self) -> None:
        _positive_int(self.domain_size, "cluster.network.domain_size")
        check_bw(self.domain_bw_bytes_per_s, "cluster.network.domain_bw_bytes_per_s")
        check_bw(self.nic_bw_bytes_per_s, "cluster.network.nic_bw_bytes_per_s")
        if not (is_number(self.oversubscription) and 1 <= self.oversubscription <= MAX_OVERSUBSCRIPTION):
            raise TopologyError(
                f"cluster.network.oversubscription: must be a number from 1 (full bisection) to "
                f"{MAX_OVERSUBSCRIPTION:g}, got {self.oversubscription!r}",
                field="cluster.network.oversubscription",
            )
        for name in ("domain_latency_s", "nic_latency_s", "switch_latency_s"):
            check_latency(getattr(self, name), f"cluster.network.{name}")
        _positive_int(self.domains_per_leaf, "cluster.network.domains_per_leaf")
        for name in ("rails", "nvls", "sharp"):
            check_flag(getattr(self, name), f"cluster.network.{name}")


@dataclass(frozen=True)
class PodsSpec:
    """``count`` identical pods (slices) joined by a data-centre network.

    ``dcn_bw_bytes_per_s`` is per device, per direction. ``dcn_latency_s`` is the
    one-way device-to-device latency across the DCN; the builder splits it evenly
    over the four links of a cross-pod path.
    """

    count: int
    dcn_bw_bytes_per_s: float
    dcn_latency_s: float = 10e-6

    def __post_init__(self) -> None:
        _positive_int(self.count, "cluster.pods.count")
        check_bw(self.dcn_bw_bytes_per_s, "cluster.pods.dcn_bw_bytes_per_s")
        check_latency(self.dcn_latency_s, "cluster.pods.dcn_latency_s")


Network = TorusNetwork | SwitchedNetwork


@dataclass(frozen=True)
class ClusterSpec:
    """A whole cluster: ``devices`` chips on ``network``, optionally in several pods.

    With ``pods``, ``network`` describes one pod and ``devices`` counts all pods.
    Construction checks that the devices fit: a torus needs ``devices ==
    prod(shape) * pods``; a switched network places the devices of each pod on
    scale-up domains (racks, nodes) filled one after another, ``devices_per_domain``
    in each (rank ``r`` is in domain ``r // devices_per_domain``):

    * ``devices_per_domain`` given: at most ``domain_size``, and the devices per pod
      are at most one domain or a multiple of it (e.g. 128 GB200 as 2 racks of 64);
    * not given: whole domains when the devices per pod are at most one domain or a
      multiple of ``domain_size``; otherwise the fewest domains that hold them,
      filled equally (128 on NVL72: 2 racks of 64; 100: 2 racks of 50) -- and when
      they cannot be filled equally (146 on NVL72) the spec is refused, naming
      ``cluster.devices_per_domain``.

    A partly filled domain works as a domain of ``devices_per_domain`` devices (the
    NVSwitch is a non-blocking crossbar, so idle GPUs on it change nothing): after
    construction ``network.domain_size`` is the devices used per domain and
    ``devices_per_domain`` records it (``None`` when whole domains are used and it
    was not given).
    """

    name: str
    devices: int
    chip: ChipSpec
    network: Network
    pods: PodsSpec | None = None
    host_bw_bytes_per_s: float = 32e9
    devices_per_domain: int | None = None
    # Aggregate bandwidth of the storage checkpoints are written to and read from (bytes/s,
    # the whole cluster): Meta's Tectonic for Llama 3, "2 TB/s sustained" (arXiv 2407.21783
    # §3.3.1). Read by the goodput study (simulator.studies.goodput), not by the step.
    storage_bw_bytes_per_s: float = 2e12
    # Devices one scale-up domain holds (switched networks): the network's domain_size
    # before a partial fill replaced it by the devices used; set at construction.
    domain_capacity: int | None = None

    def __post_init__(self) -> None:
        _positive_int(self.devices, "cluster.devices")
        if not (isinstance(self.name, str) and len(self.name) <= MAX_NAME_CHARS):
            shown = repr(self.name) if len(repr(self.name)) <= 80 else f"{len(self.name):,} characters"
            raise TopologyError(
                f"cluster.name: must be a name of at most {MAX_NAME_CHARS} characters, got {shown}",
                field="cluster.name",
            )
        if not isinstance(self.chip, ChipSpec):
            raise TopologyError(f"cluster.chip: expected a ChipSpec, got {self.chip!r}", field="cluster.chip")
        if not isinstance(self.network, (TorusNetwork, SwitchedNetwork)):
            raise TopologyError(
                f"cluster.network: expected a TorusNetwork or SwitchedNetwork, got {type(self.network).__name__}",
                field="cluster.network",
            )
        if self.pods is not None and not isinstance(self.pods, PodsSpec):
            raise TopologyError(f"cluster.pods: expected a PodsSpec or None, got {self.pods!r}", field="cluster.pods")
        check_bw(self.host_bw_bytes_per_s, "cluster.host_bw_bytes_per_s")
        check_bw(self.storage_bw_bytes_per_s, "cluster.storage_bw_bytes_per_s")
        n_pods = self.n_pods
        if self.devices % n_pods:
            raise TopologyError(
                f"cluster.devices: {self.devices} devices do not split evenly into {n_pods} pods",
                field="cluster.devices",
            )
        per_pod = self.devices // n_pods
        net = self.network
        if isinstance(net, TorusNetwork):
            if self.devices_per_domain is not None:
                raise TopologyError(
                    "cluster.devices_per_domain: applies to switched networks (NVLink domains); "
                    "a torus is sized by its shape",
                    field="cluster.devices_per_domain",
                )
            if per_pod != net.devices:
                raise TopologyError(
                    f"cluster.devices: {self.devices} devices do not fit torus shape "
                    f"{list(net.shape)} x {n_pods} pod(s) = {net.devices * n_pods} devices",
                    field="cluster.devices",
                )
            return
        if self.domain_capacity is None:
            object.__setattr__(self, "domain_capacity", net.domain_size)
        elif _positive_int(self.domain_capacity, "cluster.domain_capacity") or self.domain_capacity < net.domain_size:
            raise TopologyError(
                f"cluster.network.domain_size: at most the domain's capacity {self.domain_capacity}, "
                f"got {net.domain_size}",
                field="cluster.network.domain_size",
            )
        used = partial_domain_fill(per_pod, net.domain_size, self.devices_per_domain)
        if used is not None and used != net.domain_size:
            object.__setattr__(self, "network", dataclasses.replace(net, domain_size=used))
        object.__setattr__(self, "devices_per_domain", used)

    @property
    def n_pods(self) -> int:
        return self.pods.count if self.pods is not None else 1

    @property
    def devices_per_pod(self) -> int:
        return self.devices // self.n_pods


def partial_domain_fill(per_pod: int, domain_size: int, devices_per_domain: int | None) -> int | None:
    """Devices used per scale-up domain (see :class:`ClusterSpec`), or ``None`` for whole
    domains. Raises :class:`TopologyError` naming ``cluster.devices_per_domain`` or
    ``cluster.devices`` when the devices cannot be placed."""
    field = "cluster.devices_per_domain"
    if devices_per_domain is not None:
        _positive_int(devices_per_domain, field)
        if devices_per_domain > domain_size:
            raise TopologyError(f"{field}: at most domain_size {domain_size}, got {devices_per_domain}", field=field)
        if per_pod > devices_per_domain and per_pod % devices_per_domain:
            raise TopologyError(
                f"{field}: {per_pod} devices per pod do not fill domains of {devices_per_domain} equally; "
                f"allowed: a divisor of {per_pod} up to {domain_size} "
                f"({', '.join(map(str, _divisors_up_to(per_pod, domain_size)[-4:]))})",
                field=field,
            )
        return devices_per_domain
    if per_pod <= domain_size or per_pod % domain_size == 0:
        return None
    n_domains = -(-per_pod // domain_size)
    if per_pod % n_domains == 0:
        return per_pod // n_domains
    best = _divisors_up_to(per_pod, domain_size)[-1]
    raise TopologyError(
        f"cluster.devices: {per_pod} devices per pod neither fill whole domains of {domain_size} nor "
        f"{n_domains} domains equally; set cluster.devices_per_domain to a divisor of {per_pod} up to "
        f"{domain_size} (largest: {best}, on {per_pod // best} domains) or use a multiple of "
        f"{domain_size} devices",
        field="cluster.devices",
    )


def _divisors_up_to(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]
