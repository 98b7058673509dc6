"""The flow network's link -> flows index stays the one its active flows make, through big
phases whose flows each cross links of their own (a torus neighbour exchange), arriving on
links already in use and completing in batches that empty some links and leave others
shared (simulator/network/flowslots.py: ``_index_links``, ``_complete``)."""

import numpy as np
import simpy
from helpers import start_phases

from simulator.network.flows import FlowNetwork, Transfer
from topologies.builders import torus
from topologies.topology import Topology

SIDE = 8  # an 8 x 8 torus: 256 one-hop flows in a neighbour exchange


def _neighbours(size_bytes: float) -> tuple:
    """Every device sends to its +x and +y neighbours: 128 flows, one link each."""
    out = []
    for d in range(SIDE * SIDE):
        x, y = d % SIDE, d // SIDE
        out.append(Transfer(d, (x + 1) % SIDE + SIDE * y, size_bytes))
        out.append(Transfer(d, x + SIDE * ((y + 1) % SIDE), size_bytes))
    return tuple(out)


def _block_a2a(size_bytes: float) -> tuple:
    """A direct all-to-all among the 4 x 4 block at the origin (multi-hop routes)."""
    block = [x + SIDE * y for y in range(4) for x in range(4)]
    return tuple(Transfer(s, d, size_bytes) for s in block for d in block if s != d)


def _index_of(net: FlowNetwork) -> dict:
    slots = net.slots
    out: dict = {}
    for s in np.flatnonzero(slots._batch[: len(slots._links)] != -1).tolist():
        for lk in slots._links[s]:
            out.setdefault(lk, set()).add(s)
    return out


def test_link_index_matches_active_flows_through_big_phases():
    topo = Topology(torus((SIDE, SIDE), 1e9, 1e-6))
    env = simpy.Environment()
    net = FlowNetwork(env, topo, reserve_isolated=False)
    phases = [
        (0.0, _neighbours(1e6)),
        (2e-4, _block_a2a(3e5)),  # on links the exchange still uses
        (4e-4, _neighbours(5e5)),  # the same links again, the first exchange still running
        (4e-4, _block_a2a(1e5)),
    ]
    done = start_phases(env, net, phases)
    checks = 0
    shared = 0
    while env.peek() != float("inf"):
        env.step()
        index = net.slots._link_flows
        assert index == _index_of(net)
        checks += 1
        shared += sum(len(v) > 1 for v in index.values())
    assert sorted(done) == [0, 1, 2, 3] and net.active_flows == 0 and net.slots._link_flows == {}
    assert checks > 20 and shared > 0  # links did hold several flows at once
    # every byte sent is counted once on each link of its route
    sent = sum(t.size_bytes * len(net.route(t.src, t.dst)[0]) for _, ts in phases for t in ts)
    assert abs(net.stats.link_bytes.sum() / sent - 1) < 1e-12
