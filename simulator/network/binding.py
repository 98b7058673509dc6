"""Links that can never bind a flow's max-min rate (:func:`never_binding`): a
representative run with one simulated rank per class leaves them out of its transfers'
incidence (:meth:`simulator.engine.lowering.Lowering._binding_only`)."""

from __future__ import annotations

from collections import defaultdict
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
    ends = [topo.link_endpoints(k) for k in range(topo.n_links)]
    device = {u for u, _ in ends if topo.graph.nodes[u].get("kind") == "device"}
    from_devices: dict = defaultdict(float)  # switch -> capacity of the links from devices into it
    to_devices: dict = defaultdict(float)  # switch -> capacity of its links out to devices
    switches_in: dict = defaultdict(int)  # switch -> links into it from switches
    switches_out: dict = defaultdict(int)
    for k, (u, v) in enumerate(ends):
        if u in device:
            from_devices[v] += capacity[k]
        elif v in device:
            to_devices[u] += capacity[k]
        else:
            switches_in[v] += 1
            switches_out[u] += 1
    drop = np.zeros(topo.n_links, dtype=bool)
    for k, (u, v) in enumerate(ends):
        if u not in device and v not in device:
            drop[k] = (switches_in[u] == 1 and from_devices[u] <= capacity[k]) or (
                switches_out[v] == 1 and to_devices[v] <= capacity[k]
            )
    return drop
