"""Big link-sharing components run ahead (simulator.network.runahead): the finish times and
link bytes of the flow-by-flow path, with and without chains, on repeated all-to-alls that
share links with other traffic and newcomers that land on their links while they run."""

import numpy as np
import pytest
import simpy
from helpers import start_phases

from simulator.network import runahead
from simulator.network.flows import FlowNetwork, Transfer
from simulator.network.runahead import chain_ahead
from topologies.builders import torus
from topologies.topology import Topology

_SIDE = 6  # a 6 x 6 torus of 100 GB/s links: an all-to-all of its 36 devices is 1,260 flows


def _topology():
    return Topology(torus((_SIDE, _SIDE), 100e9, 1e-6))


def _phases(seed: int, newcomers: int) -> list:
    """One all-to-all (random sizes, fixed across repeats) started 4 times 10 ms apart, each
    with a gather of multi-hop transfers beside it, and ``newcomers`` small phases at random
    instants, some of them on the all-to-alls' links while they run."""
    rng = np.random.default_rng(seed)
    n = _SIDE * _SIDE
    pairs = [(s, d) for s in range(n) for d in range(n) if s != d]
    sizes = rng.choice([2e6, 3e6, 5e6, 8e6], size=len(pairs)).tolist()
    a2a = [Transfer(s, d, b) for (s, d), b in zip(pairs, sizes)]
    gather = [Transfer(s, (s + 7) % n, 4e6, 2) for s in range(0, n, 3)]
    out = []
    for r in range(4):
        out.append((0.01 * (r + 1), a2a))
        out.append((0.01 * (r + 1) + 2e-5, gather))
    for _ in range(newcomers):
        s, d = rng.choice(n, size=2, replace=False).tolist()
        out.append((float(rng.uniform(0.01, 0.05)), [Transfer(s, d, float(rng.choice([1e5, 1e6])))]))
    return out


def _run(phases, ahead: bool, monkeypatch):
    monkeypatch.setattr(runahead, "RUN_AHEAD", ahead)
    env = simpy.Environment()
    net = FlowNetwork(env, _topology())
    finish = start_phases(env, net, phases)
    env.run()
    return finish, net


@pytest.mark.parametrize(("seed", "newcomers"), [(0, 0), (1, 40), pytest.param(2, 120, marks=pytest.mark.slow)])
def test_chains_give_the_flow_by_flow_results(seed, newcomers, monkeypatch):
    phases = _phases(seed, newcomers)
    returns = []
    real = runahead.RunAheads._return
    monkeypatch.setattr(runahead.RunAheads, "_return", lambda self, *a: returns.append(a[2]) or real(self, *a))
    fast, nf = _run(phases, True, monkeypatch)
    slow, ns = _run(phases, False, monkeypatch)
    assert nf.stats.instants_ahead > 100 and ns.stats.instants_ahead == 0
    if newcomers >= 40:
        assert returns  # a newcomer on a chain's links returned its survivors early
    assert fast.keys() == slow.keys() == set(range(len(phases)))
    for i in fast:
        assert fast[i] == slow[i], i
    assert np.array_equal(nf.stats.link_bytes, ns.stats.link_bytes)
    assert nf.stats.recomputations == ns.stats.recomputations
    assert nf.active_flows == 0 and not nf.ahead._chains and not nf.ahead._on


def test_chain_ahead_matches_hand_computed_instants():
    """Three flows on one link of 30 (bytes/s) at rates 10 each, 10 / 20 / 40 bytes left at
    t = 1: the first ends at 2; the split gives the survivors 15 each, so the second ends at
    2 + 10/15 and the third (30 bytes left at 2) then has 20 bytes left, alone at 30, and
    ends at 2 + 10/15 + 20/30, the last instant."""
    sl = np.array([5, 6, 7])
    fid = np.array([0, 1, 2])
    rates = {(1, 2): np.array([15.0, 15.0]), (2,): np.array([30.0])}
    asked = []

    def split_of(fids, rest):
        asked.append(rest.tolist())
        r = rates.get(tuple(fids.tolist()))
        return None if r is None else (np.arange(r.shape[0]), (r.shape[0],), 0, r)

    t0, rem, rate = np.ones(3), np.array([10.0, 20.0, 40.0]), np.full(3, 10.0)
    inst = chain_ahead(sl, fid, t0, rem, rate, t0 + rem / rate, split_of, 100.0)
    assert asked == [[6, 7], [7]]
    assert [i.t_s for i in inst] == [2.0, 2.0 + 10 / 15, 2.0 + 10 / 15 + 20 / 30]
    assert [i.done.tolist() for i in inst] == [[5], [6], [7]]
    assert inst[1].sl.tolist() == [7] and inst[1].rem.tolist() == [pytest.approx(20.0)]
    assert inst[1].end.tolist() == [inst[2].t_s] and inst[2].sl.shape[0] == 0
    # nothing known past the limit; a split not known ends the chain before it
    assert chain_ahead(sl, fid, t0, rem, rate, t0 + rem / rate, split_of, 1.5) == []
    del rates[(2,)]
    assert len(chain_ahead(sl, fid, t0, rem, rate, t0 + rem / rate, split_of, 100.0)) == 1


def test_chain_splits_into_components_and_lone_flows():
    """Flows 0-1 share link A, 2-3 link B, and flow 4 crosses A and B: when 4 completes the
    survivors split into two components; the instant is the chain's last, and holds them
    back to back as the split's positions give them, lone flows last."""
    sl = np.arange(5)
    t0, rem = np.zeros(5), np.array([4.0, 9.0, 8.0, 9.0, 1.0])
    rate = np.ones(5)

    def split_of(fids, rest):
        return np.array([1, 3, 0, 2]), (2,), 2, np.array([2.0, 2.0, 5.0, 6.0])

    (inst,) = chain_ahead(sl, sl, t0, rem, rate, t0 + rem / rate, split_of, 100.0)
    assert inst.lens == (2, 1, 1) and inst.done.tolist() == [4]
    assert inst.sl.tolist() == [1, 3, 0, 2]
    assert inst.rate.tolist() == [2.0, 2.0, 5.0, 6.0]
    assert inst.rem.tolist() == [8.0, 8.0, 3.0, 7.0] and inst.t0.tolist() == [1.0] * 4


def test_components_among_by_search_and_by_array_pass(monkeypatch):
    """The two ways of finding components among a set of flows give the same canonical
    answer on random routes (chains of links shared at random)."""
    from simulator.network import components

    rng = np.random.default_rng(5)
    for _ in range(20):
        n = int(rng.integers(1, 60))
        routes = [tuple(sorted(set(rng.integers(0, 3 * n, size=int(rng.integers(1, 4))).tolist()))) for _ in range(n)]
        tab = np.full((n, 3), -1, dtype=np.int32)
        for i, r in enumerate(routes):
            tab[i, : len(r)] = r
        sl = rng.permutation(n)[: int(rng.integers(1, n + 1))]
        seq = rng.permutation(n)
        monkeypatch.setattr(components, "SEARCH_AMONG", 10**6)
        by_search = components.components_among(sl, tab, routes, seq)
        monkeypatch.setattr(components, "SEARCH_AMONG", 0)
        by_array = components.components_among(sl, tab, routes, seq)
        assert by_search == by_array
        flat = sorted([f for c in by_search[0] for f in c] + by_search[1])
        assert flat == sorted(sl.tolist())


@pytest.mark.slow
def test_whole_tpu_step_equal_with_and_without_chains(monkeypatch):
    """DeepSeek-V3 (4 layers) on the 2,048-chip TPU v5p built-in's layout: its expert groups cut
    across torus rows, so its all-to-alls share links with the ZeRO-3 gathers and run as chains.
    The step without chains is the same to the bit."""
    from helpers import assert_same_run, rerun_engine

    from simulator import simulate

    res = simulate(
        {
            "name": "tpu-chains",
            "model": {"preset": "deepseek-v3", "layers": 4},
            "cluster": {"preset": "tpu-v5p", "devices": 2048},
            "parallel": {"tp": 1, "pp": 1, "dp": 2048, "ep": 64, "zero": 3},
            "schedule": "1f1b",
            "training": {
                "seq_len": 4096,
                "micro_batch_size": 1,
                "global_batch_size": 4096,
                "dtype": "bf16",
                "recompute": "full",
                "balance": "aux-free",
            },
        }
    )
    eng, fast = rerun_engine(res)
    assert eng.net.stats.instants_ahead > 100
    monkeypatch.setattr(runahead, "RUN_AHEAD", False)
    eng_slow, slow = rerun_engine(res)
    assert eng_slow.net.stats.instants_ahead == 0
    assert fast.step_time_s == slow.step_time_s == res.raw.step_time_s
    assert_same_run(fast, slow, rel=0.0)
    assert np.array_equal(eng.net.stats.link_bytes, eng_slow.net.stats.link_bytes)
