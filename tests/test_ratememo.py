"""Max-min solutions remembered by flow identities (simulator.network.ratememo): the same
finish times and link bytes, bit for bit, as solving every time."""

import numpy as np
import simpy
from helpers import start_phases

from simulator.network.flows import FlowNetwork, Transfer
from simulator.network.ratememo import MEMO_MIN_FLOWS, RateMemo
from topologies.builders import torus
from topologies.topology import Topology


class _Forgetful(RateMemo):
    """A memo that never remembers: every update solves."""

    def rates(self, fids, lens):
        self.misses += 1
        return None

    def split(self, fids):
        self.misses += 1
        return None

    def components(self, key):
        return None


def _run(phases, memo: bool, reserve: bool):
    topo = Topology(torus((6, 6), 100e9, 1e-6))
    env = simpy.Environment()
    net = FlowNetwork(env, topo, reserve_isolated=reserve)
    if not memo:
        net._memo = _Forgetful()
    finish = start_phases(env, net, phases)
    env.run()
    return finish, net


def _repeated_phases():
    """An all-to-all over a 6 x 6 torus (1,260 flows of unequal sizes: many completion
    instants) three times, each time with a ring on part of its links arriving during it,
    and once more alone."""
    n = 36
    a2a = tuple(Transfer(s, d, 1e6 * (1 + (s * 7 + d * 3) % 5)) for s in range(n) for d in range(n) if s != d)
    ring = tuple(Transfer(i, (i + 1) % 6, 4e6) for i in range(6))
    out = []
    for k in range(3):
        out += [(k * 1e-2, a2a), (k * 1e-2 + 5e-5, ring)]
    out.append((5e-2, a2a))
    return out


def test_remembered_rates_give_the_same_bits():
    phases = _repeated_phases()
    assert len(phases[0][1]) >= MEMO_MIN_FLOWS
    for reserve in (False, True):
        fast, nf = _run(phases, memo=True, reserve=reserve)
        slow, ns = _run(phases, memo=False, reserve=reserve)
        assert fast == slow  # bit for bit
        assert np.array_equal(nf.stats.link_bytes, ns.stats.link_bytes)
        assert nf.stats.recomputations == ns.stats.recomputations
        assert nf._memo.hits > 0 and ns._memo.hits == 0
        assert nf.active_flows == 0


def test_the_repeats_are_answered_from_the_memo():
    """The second and third all-to-all (with the ring at the same offset) pass through the
    flow sets of the first: after the first, (almost) every large update is a hit."""
    phases = _repeated_phases()
    _, net = _run(phases[:6], memo=True, reserve=False)
    # the all-to-all runs as a chain from its arrival: its first run asks the memo and the
    # solvers, and a repeat takes the path remembered (simulator.network.runahead.PathMemo)
    assert net._memo.hits > 0 and net.ahead._paths.hits >= net.ahead._paths.misses > 0


def test_flow_identities_tell_weights_and_multiplicities_apart():
    topo = Topology(torus((4,), 1e9, 0.0))
    net = FlowNetwork(simpy.Environment(), topo)
    link = net.route(0, 1)[0][0]
    plain = net.prepared((Transfer(0, 1, 1e6),))
    heavy = net.prepared((Transfer(0, 1, 2e6, weight=2),))
    mult = net.prepared((Transfer(0, 1, 1e6, incidence=((link, 2.0),)),))
    same = net.prepared((Transfer(0, 1, 5e6),))  # another size: the solver's input is the same
    ids = [int(net.slots._flow_ids(p)[0]) for p in (plain, heavy, mult, same)]
    assert ids[0] != ids[1] and ids[0] != ids[2] and ids[1] != ids[2]
    assert ids[3] == ids[0]


class _NoComponents(RateMemo):
    """A memo that remembers rates and splits but searches every large component again."""

    def components(self, key):
        return None


def test_remembered_component_searches_give_the_same_bits():
    """The components of a large search are remembered by every active flow's identity and the
    seed links (``components.remembered_components``): the ring arriving during each of the
    three all-to-alls meets the same flows each time, and the finish times and link bytes are
    those of searching every time."""
    phases = _repeated_phases()
    for reserve in (False, True):
        fast, nf = _run(phases, memo=True, reserve=reserve)
        topo = Topology(torus((6, 6), 100e9, 1e-6))
        env = simpy.Environment()
        ns = FlowNetwork(env, topo, reserve_isolated=reserve)
        ns._memo = _NoComponents()
        slow = start_phases(env, ns, phases)
        env.run()
        assert fast == slow  # bit for bit
        assert np.array_equal(nf.stats.link_bytes, ns.stats.link_bytes)
        assert nf._memo.component_hits > 0 and ns._memo.component_hits == 0
