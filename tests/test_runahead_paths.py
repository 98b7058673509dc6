"""Chains that remember their paths (simulator.network.runahead.PathMemo) and a split's end
game held as one chain: the finish times and link bytes of the flow-by-flow path, bit for bit,
on repeated all-to-alls beside other traffic with newcomers on their links."""

import numpy as np
import pytest
from test_runahead import _phases, _run

from simulator.network import runahead
from simulator.network.runahead import PathMemo, chain_ahead


def _spy(monkeypatch) -> dict:
    """Counts of end-game chains (several parts) made, of partial returns and of chains
    started where a big phase arrived (its flows never in the link index)."""
    seen = {"multi": 0, "partial": 0, "at_arrival": 0}
    install, ret, arrived = runahead.RunAheads._install, runahead.RunAheads._return, runahead.RunAheads.arrived

    def _arrived(self, comps, singles):
        n = len(self._chains)
        arrived(self, comps, singles)
        seen["at_arrival"] += len(self._chains) > n

    def _install(self, parts, indexed):
        seen["multi"] += len(parts) > 1
        return install(self, parts, indexed)

    def _return(self, cid, chain, k, hit=None):
        seen["partial"] += hit is not None and not all(hit)
        return ret(self, cid, chain, k, hit)

    monkeypatch.setattr(runahead.RunAheads, "_install", _install)
    monkeypatch.setattr(runahead.RunAheads, "_return", _return)
    monkeypatch.setattr(runahead.RunAheads, "arrived", _arrived)
    return seen


@pytest.mark.parametrize(
    ("seed", "newcomers", "min_hits"), [(3, 0, 500), (1, 40, 200), pytest.param(5, 150, 300, marks=pytest.mark.slow)]
)
def test_remembered_paths_give_the_flow_by_flow_results(seed, newcomers, min_hits, monkeypatch):
    phases = _phases(seed, newcomers)
    seen = _spy(monkeypatch)
    fast, nf = _run(phases, True, monkeypatch)
    monkeypatch.setattr(runahead, "PATH_MEMO", False)
    plain, npl = _run(phases, True, monkeypatch)
    slow, ns = _run(phases, False, monkeypatch)
    paths = nf.ahead._paths
    assert paths is not None and npl.ahead._paths is None
    assert paths.hits > min_hits  # the repeats took remembered paths
    assert seen["multi"] > 0 or newcomers  # a split's end game ran as one chain
    assert seen["at_arrival"] > 0
    assert nf.stats.instants_ahead == npl.stats.instants_ahead > 100
    for i in slow:
        assert fast[i] == plain[i] == slow[i], i
    assert np.array_equal(nf.stats.link_bytes, ns.stats.link_bytes)
    assert np.array_equal(npl.stats.link_bytes, ns.stats.link_bytes)
    assert nf.stats.recomputations == ns.stats.recomputations
    assert nf.active_flows == 0 and not nf.ahead._chains and not nf.ahead._on


def _random_rates(rng, asked: list):
    """A ``split_of`` that gives each set of survivors random rates (the same ones each time
    it is asked for the same identities), counting the questions in ``asked``."""
    table: dict[bytes, tuple] = {}

    def split_of(fids, rest):
        asked.append(fids.shape[0])
        key = fids.tobytes()
        if key not in table:
            table[key] = (np.arange(fids.shape[0]), (fids.shape[0],), 0, rng.uniform(1.0, 3.0, fids.shape[0]))
        return table[key]

    return split_of


def test_a_remembered_path_repeats_the_instants_bit_for_bit():
    """Random components whose survivors keep random rates: a second run from the same start
    (same identities and rates, other times) takes the remembered path, and its instants equal
    a run without the memo (times, flows done, survivors' state)."""
    rng = np.random.default_rng(11)
    for _ in range(5):
        n = int(rng.integers(5, 40))
        sl = rng.permutation(100)[:n]
        fid = np.arange(n) + 1000
        asked: list[int] = []
        split_of = _random_rates(rng, asked)

        rate = rng.uniform(1.0, 3.0, n)
        rem = rng.choice([1.0, 2.0, 3.0], n)
        memo = PathMemo()
        for start in (0.5, 0.75):
            t0 = np.full(n, start)
            end = t0 + rem / rate
            asked.clear()
            ref = chain_ahead(sl, fid, t0, rem, rate, end, split_of, 1e9)
            n_asked = len(asked)
            got = chain_ahead(sl, fid, t0, rem, rate, end, split_of, 1e9, memo)
            assert len(asked) == n_asked + (n_asked if start == 0.5 else 0)
            assert [i.t_s for i in got] == [i.t_s for i in ref]
            for a, b in zip(got, ref):
                assert a.done.tolist() == b.done.tolist() and a.n_left == b.n_left == a.sl.shape[0]
                for x, y in zip(a.survivors(), b.survivors()):
                    assert x.tolist() == y.tolist()
        assert memo.hits > 0


def test_a_newcomer_returns_only_the_end_game_part_on_its_link(monkeypatch):
    """A phase arriving on a link of one part of a split's end game (one chain of several
    parts) returns that part to the flow-by-flow path and the others run on; every finish
    time and link byte equals the flow-by-flow path's."""
    from simulator.network.flows import Transfer

    phases = _phases(3, 0)
    made = []
    install = runahead.RunAheads._install

    def _install(self, parts, indexed):
        if len(parts) > 1:
            tab = self.net.slots._tab
            made.append((self.net.env.now, [(p.sl.shape[0], p.instants[-1].t_s, int(tab[p.sl[0], 0])) for p in parts]))
        return install(self, parts, indexed)

    monkeypatch.setattr(runahead.RunAheads, "_install", _install)
    _, net = _run(phases, True, monkeypatch)
    now, parts = next(m for m in made if sum(p[0] > 1 for p in m[1]) >= 2)
    _, last, link = max(parts, key=lambda p: p[1])  # the part that runs longest: its first flow's link
    u, v = (net.topo.devices.index(x) for x in net.topo.link_endpoints(link))
    assert net.topo.route(u, v) == (link,)
    start = now + 0.25 * (last - now)
    newcomer = [Transfer(u, v, 1e5)]
    monkeypatch.setattr(runahead.RunAheads, "_install", install)
    seen = _spy(monkeypatch)
    fast, nf = _run([*phases, (start, newcomer)], True, monkeypatch)
    slow, ns = _run([*phases, (start, newcomer)], False, monkeypatch)
    assert seen["partial"] > 0
    assert fast == slow
    assert np.array_equal(nf.stats.link_bytes, ns.stats.link_bytes)


def test_phases_held_back_from_the_index_count_where_links_are_checked(monkeypatch):
    """All-to-alls arrive on an idle torus (their flows held back from the link index until
    the update, then run ahead from the arrival) with a ring of one-hop transfers landing at the
    first one's arrival instant. Finish times and link bytes equal the flow-by-flow path's.
    (A held-back phase left out of the reservations' link checks is caught by the whole TPU
    step in tests/test_runahead.py.)"""
    from simulator.network.flows import Transfer

    a2a = _phases(6, 0)[0][1]
    ring = tuple(Transfer(s, 6 * (s // 6) + (s + 1) % 6, 2e6) for s in range(36))
    probe = _run([], True, monkeypatch)[1]
    start = (0.01 + probe.phase_latency_s(a2a)) - probe.phase_latency_s(ring)
    assert start + probe.phase_latency_s(ring) == 0.01 + probe.phase_latency_s(a2a)  # one instant
    phases = [(0.01, a2a), (start, ring), (0.02, a2a), (0.03, a2a)]
    seen = _spy(monkeypatch)
    fast, nf = _run(phases, True, monkeypatch)
    slow, ns = _run(phases, False, monkeypatch)
    assert seen["at_arrival"] > 0
    assert fast == slow
    assert np.array_equal(nf.stats.link_bytes, ns.stats.link_bytes)
