"""Placement: how a job's ranks land on the scale-up domains of a switched cluster.

Rank ``r`` runs on device ``r`` and devices fill one scale-up domain (an NVLink node or
NVL72 rack) before the next, ``devices_per_domain`` in each (:class:`~topologies.networks.
ClusterSpec`). Using every device of a domain is the default; an operator can instead ask
the scheduler for whole blocks of fewer devices per domain -- Slurm's topology/block
plugin with ``--segment=S`` places segments of ``S`` nodes inside one block (an NVL72 rack
of 18 compute trays of 4 GPUs: ``--segment=16`` uses 64 of its 72 GPUs) -- so that a
layout's groups tile the domains instead of straddling them. The devices left over are
idle: :func:`domain_usage` counts them, so that layouts are compared per domain as well
as per device.

Everything here is plain arithmetic on counts and on rank-group tables (numpy arrays whose
rows are groups of ranks), so it knows nothing of parallel layouts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .networks import ClusterSpec, SwitchedNetwork


@dataclass(frozen=True)
class DomainUsage:
    """How a switched cluster's devices fill its scale-up domains."""

    devices_per_domain: int  # devices used in each domain
    domain_capacity: int  # devices each domain holds
    domains: int  # domains used (all pods)
    spare_devices: int  # devices of those domains left idle

    def as_dict(self) -> dict:
        return {
            "devices_per_domain": self.devices_per_domain,
            "domain_capacity": self.domain_capacity,
            "domains": self.domains,
            "spare_devices": self.spare_devices,
        }

    @property
    def label(self) -> str:
        """``"64/72 per domain"``; ``"72/72 per domain"`` when domains are full."""
        return f"{self.devices_per_domain}/{self.domain_capacity} per domain"


def domain_usage(cluster: ClusterSpec) -> DomainUsage | None:
    """The domains ``cluster`` uses and the devices it leaves idle in them; ``None`` on a
    torus (a TPU slice is allocated whole: its devices are all the job's)."""
    net = cluster.network
    if not isinstance(net, SwitchedNetwork):
        return None
    per_pod = cluster.devices_per_pod
    # after a partial fill, network.domain_size is the devices used per domain; a pod of
    # fewer devices than one domain uses that many of it
    used = min(net.domain_size, per_pod)
    capacity = cluster.domain_capacity or net.domain_size
    domains_per_pod = -(-per_pod // used)
    domains = domains_per_pod * cluster.n_pods
    return DomainUsage(used, capacity, domains, domains * capacity - cluster.devices)


def groups_aligned(tables: Iterable[np.ndarray], devices_per_domain: int) -> bool:
    """Whether every group (row) of every table either lies inside one domain or covers its
    domains evenly (the same number of members in each), with ranks filling domains of
    ``devices_per_domain`` consecutively -- the groups then see the network alike."""
    for table in tables:
        size = table.shape[1]
        if size <= 1:
            continue
        dom = np.sort(table // devices_per_domain, axis=1)
        splits = np.count_nonzero(np.diff(dom, axis=1), axis=1) + 1  # domains each group touches
        k = int(splits[0])
        if (splits != k).any() or size % k:
            return False  # groups split unlike one another, or unevenly
        blocks = dom.reshape(dom.shape[0], k, size // k)
        if not (blocks == blocks[:, :, :1]).all():
            return False  # some domain holds more of a group than another
    return True


def aligned_devices_per_domain(tables: list[np.ndarray], capacity: int, devices_per_pod: int) -> int | None:
    """The most devices per domain, at most ``capacity``, that a cluster of
    ``devices_per_pod`` devices per pod can be placed with (every domain used equally) and
    under which every group of ``tables`` is aligned (:func:`groups_aligned`); ``None``
    when no count is."""
    for d in range(min(capacity, devices_per_pod), 0, -1):
        if devices_per_pod > d and devices_per_pod % d:
            continue
        if groups_aligned(tables, d):
            return d
    return None
