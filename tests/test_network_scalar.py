"""The scalar twin of the flow network's rate update (``FlowNetwork._recompute_scalar``)
gives the vectorised update's bits: finish times and link bytes equal exactly whatever
the size up to which updates are solved on scalars."""

import numpy as np
import pytest
import simpy
from helpers import start_phases

from simulator.network import flows
from simulator.network.flows import FlowNetwork, Transfer
from topologies.builders import SwitchedNetwork, switched
from topologies.topology import Topology


def _phases(seed: int) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(60):
        k = int(rng.integers(1, 12))
        transfers = []
        for _ in range(k):
            s, d = rng.choice(32, size=2, replace=False).tolist()
            transfers.append(Transfer(s, d, float(rng.choice([1e6, 4e6, 1.5e7])), int(rng.integers(1, 3))))
        out.append((float(rng.uniform(0, 2e-3)), transfers))
    return out


def _run(phases, scalar_max: int, monkeypatch):
    monkeypatch.setattr(flows, "_SCALAR_SOLVE_MAX", scalar_max)
    env = simpy.Environment()
    net = FlowNetwork(env, Topology(switched(32, SwitchedNetwork(8, 450e9, 50e9, domains_per_leaf=2))))
    finish = start_phases(env, net, phases)
    env.run()
    return finish, net


@pytest.mark.parametrize("seed", [0, 1])
def test_scalar_update_equals_vectorised_bit_for_bit(seed, monkeypatch):
    phases = _phases(seed)
    vec, nv = _run(phases, 0, monkeypatch)
    sca, ns = _run(phases, 48, monkeypatch)
    assert sca == vec
    assert np.array_equal(ns.stats.link_bytes, nv.stats.link_bytes)
    assert ns.stats.recomputations == nv.stats.recomputations > 0
