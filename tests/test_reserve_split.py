"""Reserved big phases materialised component by component (simulator.network.isolated):
the finish times and link bytes of reserving whole phases and of the flow-by-flow path."""

import numpy as np
import pytest
import simpy
from helpers import start_phases

from simulator.network import isolated
from simulator.network.flows import FlowNetwork, Transfer
from topologies.builders import torus
from topologies.topology import Topology

_SIDE = 6  # a 6 x 6 torus of 100 GB/s links


def _topology():
    return Topology(torus((_SIDE, _SIDE), 100e9, 1e-6))


def _neighbour(dev: int, axis: int, sign: int) -> int:
    x, y = divmod(dev, _SIDE)
    if axis == 0:
        x = (x + sign) % _SIDE
    else:
        y = (y + sign) % _SIDE
    return x * _SIDE + y


def _phases(seed: int) -> list:
    """Big phases of one-hop transfers (one link each: many own components, some of
    several flows where two transfers of the phase take the same link) among small phases
    of multi-hop transfers that land on some of their links while they run."""
    rng = np.random.default_rng(seed)
    sizes = [1e6, 4e6, 1.5e7]
    out = []
    for _ in range(12):
        k = int(rng.integers(70, 110))
        src = rng.integers(0, _SIDE * _SIDE, size=k).tolist()
        axis = rng.integers(0, 2, size=k).tolist()
        sign = rng.choice([-1, 1], size=k).tolist()
        big = [
            Transfer(s, _neighbour(s, a, g), float(rng.choice(sizes)), int(rng.integers(1, 3)))
            for s, a, g in zip(src, axis, sign)
        ]
        out.append((float(rng.uniform(0, 1e-3)), big))
    for _ in range(40):
        small = []
        for _ in range(int(rng.integers(1, 5))):
            s, d = rng.choice(_SIDE * _SIDE, size=2, replace=False).tolist()
            small.append(Transfer(s, d, float(rng.choice(sizes))))
        out.append((float(rng.uniform(0, 1.2e-3)), small))
    return out


def _run(phases, split: bool, reserve: bool = True):
    saved = isolated.SPLIT_BY_COMPONENT
    isolated.SPLIT_BY_COMPONENT = split
    try:
        env = simpy.Environment()
        net = FlowNetwork(env, _topology(), reserve_isolated=reserve)
    finally:
        isolated.SPLIT_BY_COMPONENT = saved
    finish = start_phases(env, net, phases)
    env.run()
    return finish, net


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_split_reservations_equal_whole_and_flow_by_flow(seed):
    phases = _phases(seed)
    split, ns = _run(phases, split=True)
    whole, nw = _run(phases, split=False)
    flows, nf = _run(phases, split=True, reserve=False)
    assert ns.stats.split_materialisations > 0
    assert nw.stats.split_materialisations == 0 == nf.stats.split_materialisations
    assert split.keys() == whole.keys() == flows.keys() == set(range(len(phases)))
    for i in split:
        assert split[i] == pytest.approx(whole[i], rel=1e-12, abs=0), i
        assert split[i] == pytest.approx(flows[i], rel=1e-12, abs=0), i
    assert ns.stats.link_bytes == pytest.approx(nw.stats.link_bytes, rel=1e-12)
    assert ns.stats.link_bytes == pytest.approx(nf.stats.link_bytes, rel=1e-12)
    assert ns.active_flows == 0 and not ns.reservations._reserved and ns.reservations._n_reserved_links == 0
    assert not (ns.reservations._reserved_on >= 0).any()


def test_component_materialised_alone_keeps_the_rest_reserved():
    """A big phase whose own components are one-link flows, among them A (1 GB) and B
    (0.5 GB) on 100 GB/s links, enters at 1 us. A 0.25 GB flow arriving on A's link at
    T ~ 2 ms materialises A alone; B stays reserved and finishes at 5.001 ms. The newcomer
    and A share the link at 50 GB/s until the newcomer ends (T + 5 ms); A, 0.55 GB left,
    then runs alone and ends at 12.501 ms, whatever T is."""
    topo = _topology()
    filler = [Transfer(12 + i, 13 + i, 1e3 * (i + 1)) for i in range(4) for _ in range(17)]
    big = [Transfer(0, 1, 1e9), Transfer(6, 7, 0.5e9)] + filler  # > 64 transfers: big
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    t_s = 2e-3 - 1e-6
    finish = start_phases(env, net, [(0.0, big), (t_s, [Transfer(0, 1, 0.25e9)])])
    env.run(until=3e-3)
    assert net.stats.split_materialisations == 1
    held = net.reservations._reserved[0]
    assert held.left is not None and held.left.sum() == held.left.shape[0] - 1  # all but A
    env.run(until=6e-3)
    assert 0 not in net.reservations._reserved  # B's reservation retired at 5.001 ms
    env.run()
    assert finish[1] == pytest.approx(t_s + 1e-6 + 5e-3, rel=1e-12)
    assert finish[0] == pytest.approx(12.5e-3 + 1e-6, rel=1e-12)
    assert net.stats.link_bytes[topo.route(0, 1)[0]] == pytest.approx(1.25e9, rel=1e-12)
    assert net.stats.link_bytes[topo.route(6, 7)[0]] == pytest.approx(0.5e9, rel=1e-12)
    assert net.active_flows == 0


@pytest.mark.slow
def test_whole_step_equal_with_and_without_split(monkeypatch):
    """Kimi K2 (16 layers) on 2,304 H100 in 8-GPU domains with 50 GB/s NICs, TP4 PP16 EP24
    DualPipe: its expert all-to-alls, reserved, meet pipeline sends on the NICs, which
    materialise some of their components. Splitting changes no figure of the step beyond
    rounding (1e-9)."""
    from helpers import assert_same_run, rerun_engine

    from simulator import simulate

    res = simulate(
        {
            "name": "split-step",
            "model": {"preset": "kimi-k2", "layers": 16},
            "cluster": {
                "preset": "dgx-h100",
                "devices": 2304,
                "network": {"domain_size": 8, "nic_bw_bytes_per_s": 50e9},
            },
            "parallel": {"tp": 4, "pp": 16, "ep": 24, "dp": 36, "zero": 1},
            "schedule": "dualpipe",
            "training": {
                "seq_len": 4096,
                "micro_batch_size": 1,
                "dtype": "fp8",
                "balance": "aux-free",
                "global_batch_size": 36 * 32,
            },
        }
    )
    eng, split = rerun_engine(res)
    assert eng.net.stats.split_materialisations > 100
    monkeypatch.setattr(isolated, "SPLIT_BY_COMPONENT", False)
    eng_whole, whole = rerun_engine(res)
    assert eng_whole.net.stats.split_materialisations == 0
    assert split.step_time_s == res.raw.step_time_s
    assert_same_run(split, whole)
