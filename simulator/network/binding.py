"""Links that can never bind a flow's max-min rate (:func:`never_binding`): a
representative run with one simulated rank per class leaves them out of its transfers'
incidence (:meth:`simulator.engine.lowering.Lowering._binding_only`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from topologies.topology import Topology


def never_binding(topo: Topology, capacity: np.ndarray) -> np.ndarray:
    """Whether each link (of capacities ``capacity``) can never be the one that limits a
    flow's max-min rate: a link from switch ``u`` to switch ``v`` where ``v`` is ``u``'s only
    neighbouring switch and the links from devices into ``u`` add up to no more than its
    capacity (every flow on it came in by one of them), or ``u`` is ``v``'s only neighbouring
    switch and the links from ``v`` out to devices add up to no more than it (every flow on
    it leaves by one of them). Such a link is full only when all of those are full and all
    their flows cross it, so it freezes no flow they do not: a leaf's uplink and downlink to
    the spine under oversubscription 1 (8 NICs of 50 GB/s below 400 GB/s on gb200-nvl72),
    none of an oversubscribed leaf's."""
    ends = topo.link_ends
    n_nodes = int(ends.max()) + 1 if ends.size else 0
    u, v = ends[:, 0], ends[:, 1]
    from_device, to_device = u < topo.n_devices, v < topo.n_devices  # devices are nodes 0..n-1
    to_device_only = ~from_device & to_device
    between = ~from_device & ~to_device
    # Each sum adds its links' capacities in link order (bincount's), as a loop over the links would.
    from_devices = np.bincount(v[from_device], capacity[from_device], n_nodes)
    to_devices = np.bincount(u[to_device_only], capacity[to_device_only], n_nodes)
    switches_in = np.bincount(v[between], minlength=n_nodes)
    switches_out = np.bincount(u[between], minlength=n_nodes)
    drop = between & (
        ((switches_in[u] == 1) & (from_devices[u] <= capacity)) | ((switches_out[v] == 1) & (to_devices[v] <= capacity))
    )
    return drop
