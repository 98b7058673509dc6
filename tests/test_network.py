"""Max-min maths on tiny matrices, and the simpy flow network on tiny graphs."""

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.network.calibration import (
    IDEAL,
    NVLINK_EFFICIENCY,
    CalibrationError,
    NetCalibration,
    default_calibration,
)
from simulator.network.flows import FlowNetwork, NetworkError, Transfer
from simulator.network.maxmin import maxmin_rates
from topologies.builders import switched, torus
from topologies.networks import IB_NIC_LATENCY_S, IB_SWITCH_LATENCY_S, NVLINK_LATENCY_S, SwitchedNetwork
from topologies.presets import build_cluster, cluster_preset
from topologies.topology import Topology


def inc(rows, n_links):
    """Incidence matrix from a list of link lists."""
    data, ind, ptr = [], [], [0]
    for r in rows:
        ind += r
        data += [1.0] * len(r)
        ptr.append(len(ind))
    return sp.csr_matrix((data, ind, ptr), shape=(len(rows), n_links))


# ---------------------------------------------------------------- maxmin_rates


def test_two_flows_one_link_split_evenly():
    assert maxmin_rates(inc([[0], [0]], 1), np.array([1.0])).tolist() == [0.5, 0.5]


def test_classic_two_links():
    # f0 on A (cap 1); f1 on A and B; f2 on B (cap 2): A is the bottleneck of f0, f1.
    r = maxmin_rates(inc([[0], [0, 1], [1]], 2), np.array([1.0, 2.0]))
    assert r == pytest.approx([0.5, 0.5, 1.5], rel=1e-15)


def test_parking_lot_three_levels():
    # long flow over links 0,1,2 (caps 1,2,3) plus one short flow per link
    r = maxmin_rates(inc([[0, 1, 2], [0], [1], [2]], 3), np.array([1.0, 2.0, 3.0]))
    assert r == pytest.approx([0.5, 0.5, 1.5, 2.5], rel=1e-15)


def test_weights_count_as_identical_flows():
    # weight 2 and weight 1 on a link of 3: each unit flow gets 1
    assert maxmin_rates(inc([[0], [0]], 1), np.array([3.0]), np.array([2, 1])).tolist() == [1, 1]
    # f0 (weight 3) alone on link 0 (cap 1) -> 1/3 per unit; f1 shares link 1 (cap 4) -> 3
    r = maxmin_rates(inc([[0, 1], [1]], 2), np.array([1.0, 4.0]), np.array([3.0, 1.0]))
    assert r == pytest.approx([1 / 3, 3.0], rel=1e-15)


def test_weighted_equals_replicated():
    a = inc([[0, 1], [1, 2], [0, 2]], 3)
    cap = np.array([2.0, 3.0, 5.0])
    w = np.array([2.0, 1.0, 3.0])
    rep = inc([[0, 1]] * 2 + [[1, 2]] + [[0, 2]] * 3, 3)
    r_rep = maxmin_rates(rep, cap)
    assert maxmin_rates(a, cap, w) == pytest.approx(r_rep[[0, 2, 3]], rel=1e-12)


def test_flow_without_links_is_unbounded_and_empty_ok():
    r = maxmin_rates(inc([[], [0]], 1), np.array([2.0]))
    assert r[0] == np.inf and r[1] == 2.0
    assert maxmin_rates(inc([], 3), np.ones(3)).shape == (0,)


def test_maxmin_rejects_bad_input():
    with pytest.raises(NetworkError, match="capacity has 2"):
        maxmin_rates(inc([[0]], 1), np.ones(2))
    with pytest.raises(NetworkError, match="weights must be > 0"):
        maxmin_rates(inc([[0]], 1), np.ones(1), np.array([0.0]))
    with pytest.raises(NetworkError, match="capacity must be >= 0"):
        maxmin_rates(inc([[0]], 1), np.array([-1.0]))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_maxmin_is_feasible_and_every_flow_has_a_bottleneck(data):
    n_links = data.draw(st.integers(1, 5))
    n_flows = data.draw(st.integers(1, 7))
    rows = [
        data.draw(st.lists(st.integers(0, n_links - 1), min_size=1, max_size=n_links, unique=True))
        for _ in range(n_flows)
    ]
    cap = np.array(data.draw(st.lists(st.integers(1, 20), min_size=n_links, max_size=n_links)), dtype=float)
    w = np.array(data.draw(st.lists(st.integers(1, 4), min_size=n_flows, max_size=n_flows)), dtype=float)
    a = inc(rows, n_links)
    r = maxmin_rates(a, cap, w)
    load = a.T @ (w * r)
    assert np.all(load <= cap * (1 + 1e-9))
    # max-min: each flow crosses a saturated link on which it has the largest rate
    for f, links in enumerate(rows):
        assert any(
            load[l] >= cap[l] * (1 - 1e-9) and r[f] >= max(r[g] for g, lk in enumerate(rows) if l in lk) * (1 - 1e-9)
            for l in links
        )


# ---------------------------------------------------------------- FlowNetwork


def line_topology(n=3, bw=1e9, lat=1e-6):
    """d0 - d1 - ... a line of devices (a 1-D torus without wrap)."""
    return Topology(torus((n,), bw, lat, wrap=(False,)))


def run_phases(topo, phases, calibration=None, reserve=True):
    """phases: list of (start_time, transfers, steps); returns finish times and the network.
    ``reserve=False``: no isolated-phase fast path (every flow through the incremental
    machinery, whose bookkeeping some tests count)."""
    env = simpy.Environment()
    net = FlowNetwork(env, topo, calibration, reserve_isolated=reserve)
    finish = {}

    def proc(i, start, transfers, steps):
        yield env.timeout(start)
        yield net.transfer(transfers, steps)
        finish[i] = env.now

    for i, (start, transfers, steps) in enumerate(phases):
        env.process(proc(i, start, transfers, steps))
    env.run()
    return finish, net


def test_single_transfer_latency_plus_size_over_bw():
    topo = line_topology(3, 1e9, 1e-6)
    finish, net = run_phases(topo, [(0, [Transfer(0, 2, 1e9)], 1)])
    assert finish[0] == pytest.approx(2e-6 + 1.0, rel=1e-12)
    # 1e9 bytes crossed two links
    assert net.stats.link_bytes.sum() == pytest.approx(2e9)
    assert net.stats.flows_started == 1


def test_steps_multiply_latency():
    topo = line_topology(2, 1e9, 1e-6)
    finish, _ = run_phases(topo, [(0, [Transfer(0, 1, 1e6)], 5)])
    assert finish[0] == pytest.approx(5e-6 + 1e-3, rel=1e-12)


def test_staggered_sharing_is_exact():
    # A: 1 GB from t=0; B: 0.25 GB from t=0.5 on the same link of 1 GB/s, no latency
    topo = line_topology(2, 1e9, 0.0)
    finish, net = run_phases(topo, [(0, [Transfer(0, 1, 1e9)], 1), (0.5, [Transfer(0, 1, 0.25e9)], 1)], reserve=False)
    assert finish[1] == pytest.approx(1.0, rel=1e-12)
    assert finish[0] == pytest.approx(1.25, rel=1e-12)
    assert net.stats.recomputations == 3  # A arrives, B arrives, B leaves
    assert net.stats.utilisation(1.25)[net.topo.link_id("d0", "d1")] == pytest.approx(1.0)


def test_opposite_directions_do_not_share():
    topo = line_topology(2, 1e9, 0.0)
    finish, _ = run_phases(topo, [(0, [Transfer(0, 1, 1e9), Transfer(1, 0, 1e9)], 1)])
    assert finish[0] == pytest.approx(1.0, rel=1e-12)


def test_weight_bundles_identical_transfers():
    topo = line_topology(2, 1e9, 0.0)
    bundled, net1 = run_phases(topo, [(0, [Transfer(0, 1, 1e8, weight=3)], 1)])
    separate, net2 = run_phases(topo, [(0, [Transfer(0, 1, 1e8)] * 3, 1)])
    assert bundled[0] == pytest.approx(0.3, rel=1e-12) == separate[0]
    assert net1.stats.flows_started == 1 and net1.stats.unit_flows_started == 3
    assert net2.stats.flows_started == 3
    assert np.allclose(net1.stats.link_bytes, net2.stats.link_bytes)


def test_local_and_empty_transfers_are_free():
    topo = line_topology(2, 1e9, 1e-6)
    finish, net = run_phases(topo, [(0, [Transfer(0, 0, 1e9), Transfer(1, 0, 0)], 3), (0, [], 1)])
    assert finish == {0: 0.0, 1: 0.0}
    assert net.stats.flows_started == 0


def test_calibration_scales_capacity_and_adds_overhead():
    topo = line_topology(2, 1e9, 1e-6)
    cal = NetCalibration(efficiency={"ici": 0.5}, message_overhead_s={"ici": 2e-6})
    finish, _ = run_phases(topo, [(0, [Transfer(0, 1, 1e9)], 2)], cal)
    assert finish[0] == pytest.approx(2 * (1e-6 + 2e-6) + 2.0, rel=1e-12)


def test_transfer_rejects_bad_input():
    env = simpy.Environment()
    net = FlowNetwork(env, line_topology(2))
    with pytest.raises(NetworkError, match="steps"):
        net.transfer([Transfer(0, 1, 1.0)], steps=0)
    with pytest.raises(NetworkError, match="size_bytes"):
        net.transfer([Transfer(0, 1, -1.0)])
    with pytest.raises(NetworkError, match="weight"):
        net.transfer([Transfer(0, 1, 1.0, weight=0)])
    with pytest.raises(NetworkError, match="devices must be in"):
        net.transfer([Transfer(0, 7, 1.0)])


def test_deterministic_bit_identical():
    topo = Topology(torus((4, 4), 45e9, 1e-6))
    rng = np.random.default_rng(7)
    phases = []
    for _ in range(40):
        s, d = rng.integers(0, 16, size=2)
        phases.append((float(rng.uniform(0, 1e-3)), [Transfer(int(s), int(d), float(rng.uniform(1e5, 1e8)))], 1))
    a, na = run_phases(topo, phases)
    b, nb = run_phases(topo, phases)
    assert a == b
    assert np.array_equal(na.stats.link_bytes, nb.stats.link_bytes)


def test_many_flows_complete_and_conserve_bytes():
    # heterogeneous sizes and path lengths: many distinct completion times
    topo = Topology(torus((4, 4), 45e9, 1e-6, wrap=(True, True)))
    transfers = [Transfer(s, d, 1e6 * (1 + (s * 7 + d) % 5)) for s in range(16) for d in range(16)]
    finish, net = run_phases(topo, [(0, transfers, 1)])
    expected = sum(t.size_bytes * len(topo.route(t.src, t.dst)) for t in transfers)
    assert net.stats.link_bytes.sum() == pytest.approx(expected, rel=1e-9)
    assert net.active_flows == 0
    assert net.stats.recomputations > 5
    # the last flow ends no earlier than the busiest link's bytes at full capacity
    assert max(finish.values()) >= (net.stats.link_bytes / net.capacity).max() + 1e-6


# ---------------------------------------------------------------- calibration


def test_default_calibrations():
    h = default_calibration("hopper")
    assert h.efficiency_of("nvlink") * 450e9 == pytest.approx(370e9)
    assert default_calibration("H100") is h
    assert default_calibration("tpu-v5p").efficiency_of("ici") == 1.0
    assert IDEAL.efficiency_of("nvlink") == 1.0
    with pytest.raises(CalibrationError, match="allowed: ampere"):
        default_calibration("volta")
    with pytest.raises(CalibrationError, match="efficiency"):
        NetCalibration(efficiency={"nvlink": 1.5})
    assert h.with_overrides(efficiency={"nic": 0.5}).efficiency_of("nic") == 0.5
    assert h.with_overrides().efficiency_of("nvlink") == NVLINK_EFFICIENCY


@pytest.mark.parametrize(
    "src,dst,expected",
    [
        (0, 1, 3.33e-6),  # NVLink, same node
        (0, 8, 2.8e-6),  # IB, same leaf (same rail)
        (0, 16, 3.7e-6),  # IB, cross leaf
    ],
)
def test_small_message_latency_matches_deepseek(src, dst, expected):
    # DeepSeek ISCA'25 64 B latencies; one node per leaf group so d16 is on another leaf
    spec = cluster_preset("dgx-h100", 24, network={"domains_per_leaf": 2})
    topo = build_cluster(spec)
    finish, _ = run_phases(topo, [(0, [Transfer(src, dst, 64)], 1)], default_calibration("hopper"))
    assert finish[0] == pytest.approx(expected, rel=0.01)
    assert pytest.approx(3.33e-6) == NVLINK_LATENCY_S * 2
    assert pytest.approx(3.7e-6) == 2 * IB_NIC_LATENCY_S + 2 * IB_SWITCH_LATENCY_S


def test_switched_capacity_uses_kind_efficiency():
    topo = Topology(switched(16, SwitchedNetwork(8, 450e9, 50e9)))
    net = FlowNetwork(simpy.Environment(), topo, default_calibration("hopper"))
    kinds = np.array(topo.link_kind)
    assert np.allclose(net.capacity[kinds == "nvlink"], 370e9)
    assert np.allclose(net.capacity[kinds == "nic"], 48e9)
    assert isinstance(topo.graph, nx.Graph)


# ---------------------------------------------------------------- incremental recomputation

from simulator.network.maxmin import fill_arrays, fill_small  # noqa: E402


def random_problem(rng, n_links, n_flows, max_path=4):
    links = [
        tuple(rng.choice(n_links, size=int(rng.integers(1, min(max_path, n_links) + 1)), replace=False).tolist())
        for _ in range(n_flows)
    ]
    w = rng.integers(1, 4, size=n_flows).astype(float).tolist()
    cap = rng.choice([1.0, 2.0, 3.0, 5.5], size=n_links) * rng.uniform(0.5, 2.0, size=n_links)
    return links, w, cap


def test_python_and_numpy_filling_are_bit_identical():
    rng = np.random.default_rng(3)
    for _ in range(200):
        links, w, cap = random_problem(rng, int(rng.integers(1, 12)), int(rng.integers(1, 30)))
        lens = [len(lk) for lk in links]
        owner = np.repeat(np.arange(len(links)), lens)
        flat = np.array([x for lk in links for x in lk], dtype=np.int64)
        a = fill_arrays(owner, flat, np.ones(flat.shape[0]), np.array(w), cap)
        b = fill_small(links, w, cap.tolist())
        assert a.tolist() == b
        assert np.array_equal(maxmin_rates(inc(links, cap.shape[0]), cap, np.array(w)), a)


def components(links):
    """Connected components (lists of flow indices) of flows sharing links."""
    parent = list(range(len(links)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner = {}
    for f, lk in enumerate(links):
        for x in lk:
            if x in owner:
                parent[find(f)] = find(owner[x])
            else:
                owner[x] = f
    out = {}
    for f in range(len(links)):
        out.setdefault(find(f), []).append(f)
    return list(out.values())


def test_component_local_maxmin_equals_global():
    rng = np.random.default_rng(11)
    for _ in range(100):
        n_links = int(rng.integers(4, 40))
        links, w, cap = random_problem(rng, n_links, int(rng.integers(2, 60)), max_path=3)
        glob = maxmin_rates(inc(links, n_links), cap, np.array(w))
        local = np.empty(len(links))
        for comp in components(links):
            local[comp] = fill_small([links[f] for f in comp], [w[f] for f in comp], cap)
        assert local == pytest.approx(glob, rel=1e-12, abs=0)


def random_phases(topo, rng, n_phases, t_max=2e-3, max_flows=6):
    phases = []
    for _ in range(n_phases):
        k = int(rng.integers(1, max_flows + 1))
        transfers = []
        for _ in range(k):
            s, d = rng.choice(topo.n_devices, size=2, replace=False).tolist()
            transfers.append(Transfer(s, d, float(rng.choice([1e6, 4e6, 1.5e7])), int(rng.integers(1, 3))))
        phases.append((float(rng.uniform(0, t_max)), transfers, 1))
    return phases


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_network_rates_equal_global_maxmin_at_all_times(seed):
    """Incremental, component-local recomputation gives the global max-min rates."""
    topo = Topology(switched(32, SwitchedNetwork(8, 450e9, 50e9, domains_per_leaf=2)))
    rng = np.random.default_rng(seed)
    env = simpy.Environment()
    net = FlowNetwork(env, topo, default_calibration("hopper"))

    def proc(start, transfers, steps):
        yield env.timeout(start)
        yield net.transfer(transfers, steps)

    for ph in random_phases(topo, rng, 60):
        env.process(proc(*ph))
    checked = 0
    for t in np.sort(rng.uniform(0, 3e-3, size=40)):
        env.run(until=float(t))
        table = net.flow_table()
        if not table:
            continue
        links = [row[0] for row in table]
        glob = maxmin_rates(inc(links, net.n_links), net.capacity, np.array([r[1] for r in table]))
        assert np.array([r[2] for r in table]) == pytest.approx(glob, rel=1e-12, abs=0)
        checked += len(table)
    env.run()
    assert checked > 50 and net.active_flows == 0
    assert net.stats.flows_recomputed < net.stats.recomputations * net.stats.max_concurrent_flows


def test_disjoint_phase_leaves_other_completion_times_unchanged():
    topo = Topology(switched(16, SwitchedNetwork(8, 450e9, 50e9)))
    ring = [Transfer(i, (i + 1) % 8, 3e6) for i in range(8)]
    mixed = [Transfer(i, 7 - i, 2e6) for i in range(8)] + [Transfer(0, 3, 5e6)]
    base = [(0.0, ring, 1), (2e-6, mixed, 2), (9e-6, ring[:3], 1), (1e-5, mixed[2:], 1)]
    other = [Transfer(8 + i, 8 + (i + 3) % 8, 7e6) for i in range(8)]  # domain 1 only
    alone, net_a = run_phases(topo, base, reserve=False)
    for extra in ([(0.0, other, 1)], [(2e-6, other, 2)], [(4.1e-6, other, 1), (1e-5, other, 3)]):
        both, net_b = run_phases(topo, base + extra, reserve=False)
        assert [both[i] for i in range(len(base))] == [alone[i] for i in range(len(base))]
        # and the extra phases cost the others no recomputation
        net_c = run_phases(topo, extra, reserve=False)[1]
        assert net_b.stats.flows_recomputed == net_a.stats.flows_recomputed + net_c.stats.flows_recomputed


def test_completion_recomputes_only_its_component():
    topo = Topology(switched(16, SwitchedNetwork(8, 450e9, 50e9)))
    # two flows share d0's uplink; a third phase in the other domain is independent
    finish, net = run_phases(
        topo, [(0, [Transfer(0, 1, 1e6), Transfer(0, 2, 3e6)], 1), (0, [Transfer(8, 9, 5e6)], 1)], reserve=False
    )
    # solves: arrival (2 components: 2 flows + 1 flow), first completion (1 flow left)
    assert net.stats.flows_recomputed == 4
    assert net.stats.components_solved == 3
    assert net.stats.wakeups == 3


def test_wakeups_are_not_rescheduled_for_later_completions():
    topo = line_topology(2, 1e9, 0.0)
    # one long flow, then many short phases on the reverse link (disjoint) that end later
    phases = [(0, [Transfer(0, 1, 1e8)], 1)] + [(1e-3 * i, [Transfer(1, 0, 1e9)], 1) for i in range(1, 6)]
    finish, net = run_phases(topo, phases, reserve=False)
    assert finish[0] == pytest.approx(0.1, rel=1e-12)
    # one wake per distinct completion instant: the long flow, then the 5 reverse
    # flows (they share the reverse link and finish one after another)
    assert net.stats.wakeups == 6


def test_random_mix_is_deterministic_and_conserves_bytes():
    topo = Topology(switched(32, SwitchedNetwork(8, 450e9, 50e9, domains_per_leaf=2)))
    phases = random_phases(topo, np.random.default_rng(5), 80)
    a, na = run_phases(topo, phases)
    b, nb = run_phases(topo, phases)
    assert a == b
    assert np.array_equal(na.stats.link_bytes, nb.stats.link_bytes)
    expected = sum(t.size_bytes * t.weight * len(topo.route(t.src, t.dst)) for _, ts, _ in phases for t in ts)
    assert na.stats.link_bytes.sum() == pytest.approx(expected, rel=1e-12)


def test_identical_transfers_merge_into_one_flow():
    topo = Topology(switched(16, SwitchedNetwork(8, 450e9, 50e9)))
    ts = [Transfer(0, 9, 1e6), Transfer(0, 9, 1e6), Transfer(1, 9, 1e6), Transfer(0, 9, 1e6, 2)]
    merged, net = run_phases(topo, [(0, ts, 1)])
    assert net.stats.flows_started == 4 and net.stats.flow_rows_started == 2
    assert net.stats.unit_flows_started == 5
    sep, _ = run_phases(topo, [(0, [Transfer(0, 9, 1e6)] * 4 + [Transfer(1, 9, 1e6)], 1)])
    assert merged[0] == pytest.approx(sep[0], rel=1e-12)


def test_big_phase_paths_match_small_phase_paths():
    """Vectorised preparation / completion (big phases) equals the per-flow path."""
    topo = Topology(switched(64, SwitchedNetwork(8, 450e9, 50e9, domains_per_leaf=2)))
    rng = np.random.default_rng(9)
    ts = [
        Transfer(int(s), int(d), float(rng.choice([1e6, 2e6])), int(rng.integers(1, 3)))
        for s, d in rng.integers(0, 64, size=(300, 2))
    ]
    big, nb = run_phases(topo, [(0, ts, 1)])
    chunks = [(0, ts[i : i + 50], 1) for i in range(0, 300, 50)]
    small, ns = run_phases(topo, chunks)
    assert big[0] == pytest.approx(max(small.values()), rel=1e-9)
    assert np.allclose(nb.stats.link_bytes, ns.stats.link_bytes, rtol=1e-12)
    with pytest.raises(NetworkError, match="weight"):
        FlowNetwork(simpy.Environment(), topo).transfer(ts + [Transfer(0, 1, 1.0, 0)])


def test_fill_components_equals_each_component_alone():
    from simulator.network.maxmin import fill_components

    rng = np.random.default_rng(21)
    for _ in range(50):
        probs = [
            random_problem(rng, int(rng.integers(2, 10)), int(rng.integers(1, 25)), 3)
            for _ in range(int(rng.integers(1, 6)))
        ]
        owner, link, w, cap, link_comp, starts, expected = [], [], [], [], [], [0], []
        for c, (links, ws, cp) in enumerate(probs):
            base_f, base_l = len(w), len(cap)
            for f, lk in enumerate(links):
                owner += [base_f + f] * len(lk)
                link += [base_l + x for x in lk]
            w += ws
            cap += cp.tolist()
            link_comp += [c] * len(cp)
            starts.append(len(cap))
            expected += fill_small(links, ws, cp.tolist())
        got = fill_components(
            np.array(owner), np.array(link), np.array(w), np.array(cap), np.array(link_comp), np.array(starts)
        )
        assert got.tolist() == expected


def test_isolated_big_phase_shortcut_matches_search():
    """A big phase alone on its links takes its precomputed components; the same
    phase arriving with another (forcing the link search) finishes at the same bits."""
    topo = Topology(switched(64, SwitchedNetwork(8, 450e9, 50e9, domains_per_leaf=2)))
    big = tuple(Transfer(s, d, 1e6 * (1 + (s + d) % 3)) for s in range(32) for d in range(32) if s != d)
    alone, _ = run_phases(topo, [(0, big, 1)])
    other = [Transfer(32, 48, 1e6)]  # cross-leaf too: arrives at the same instant
    with_other, _ = run_phases(topo, [(0, big, 1), (0, other, 1)])
    assert alone[0] == with_other[0]


# ------------------------------------------------- isolated phases (reserved)


def _finishes_close(a, b, rel=1e-12):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k] == pytest.approx(b[k], rel=rel, abs=0), k


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_reserved_phases_equal_flow_by_flow(seed):
    """Random overlapping phases: reserving isolated phases (and materialising them
    when traffic arrives on their links) gives the flow-by-flow finish times and bytes."""
    topo = Topology(switched(32, SwitchedNetwork(8, 450e9, 50e9, domains_per_leaf=2)))
    phases = random_phases(topo, np.random.default_rng(seed), 80)
    fast, nf = run_phases(topo, phases)
    slow, ns = run_phases(topo, phases, reserve=False)
    _finishes_close(fast, slow)
    assert nf.stats.link_bytes == pytest.approx(ns.stats.link_bytes, rel=1e-12)
    assert nf.stats.reserved_phases > 0 and ns.stats.reserved_phases == 0
    assert nf.active_flows == 0


def test_reserved_phase_materialised_mid_segment():
    """A phase of unequal flows (two completion instants) is interrupted in its second
    segment by a flow on one of its links; the result is the hand-computed one."""
    # d0 -> d1 on a 1 GB/s line: A = {1 GB, 0.5 GB} from t = 0 share the link (0.5 GB/s
    # each); the 0.5 GB flow ends at 1.0 s, the 1 GB flow then runs alone at 1 GB/s.
    # At 1.25 s B (0.25 GB) arrives: A's big flow has 0.25 GB left; both get 0.5 GB/s
    # and finish together at 1.75 s.
    topo = line_topology(2, 1e9, 0.0)
    phases = [(0, [Transfer(0, 1, 1e9), Transfer(0, 1, 0.5e9)], 1), (1.25, [Transfer(0, 1, 0.25e9)], 1)]
    fast, nf = run_phases(topo, phases)
    slow, _ = run_phases(topo, phases, reserve=False)
    assert fast[0] == pytest.approx(1.75, rel=1e-12) and fast[1] == pytest.approx(1.75, rel=1e-12)
    _finishes_close(fast, slow)
    assert nf.stats.reserved_phases == 1  # A (materialised when B arrives); B shares A's link
    assert nf.stats.link_bytes[topo.link_id("d0", "d1")] == pytest.approx(1.75e9, rel=1e-12)


def test_reserved_phase_alone_costs_no_recomputation():
    topo = Topology(switched(16, SwitchedNetwork(8, 450e9, 50e9)))
    ring = [Transfer(i, (i + 1) % 8, 3e6) for i in range(8)]
    fast, nf = run_phases(topo, [(0, ring, 1), (1e-3, ring, 1)])
    slow, ns = run_phases(topo, [(0, ring, 1), (1e-3, ring, 1)], reserve=False)
    _finishes_close(fast, slow)
    assert nf.stats.recomputations == 0 and nf.stats.reserved_phases == 2
    assert ns.stats.recomputations == 2


def test_isolated_evolution_gives_up_on_many_segments():
    from simulator.network.isolated import isolated_evolution

    topo = line_topology(2, 1e9, 0.0)
    net = FlowNetwork(simpy.Environment(), topo)
    n = 80  # 80 completion instants
    many = tuple(Transfer(0, 1, 1e6 * (i + 1)) for i in range(n))
    prep = net.prepared(many)
    assert isolated_evolution(prep, net.capacity) is None
    iso = isolated_evolution(prep, net.capacity, max_segments=n)
    # closed form: flows of sizes 1..n MB sharing 1 GB/s finish at sum_{j<=i} (n+1-j) MB/GB/s
    sizes = np.arange(1, n + 1) * 1e6
    expect = sum((n - j) * (sizes[j] - (sizes[j - 1] if j else 0)) for j in range(n)) / 1e9
    assert iso.duration_s == pytest.approx(expect, rel=1e-12)
    fast, _ = run_phases(topo, [(0, list(many), 1)])
    assert fast[0] == pytest.approx(expect, rel=1e-12)


def test_reservation_during_latency_hands_over_to_an_earlier_arrival():
    """A phase reserved while in its latency (d0 -> d2, 2 ms) is overtaken by one that
    arrives first on a shared link (d1 -> d2 issued at 0.5 ms, 1 ms latency): the later
    one runs alone until A's flows arrive, then they share, as computed by hand."""
    topo = line_topology(3, 1e9, 1e-3)
    phases = [(0.0, [Transfer(0, 2, 1e9)], 1), (0.5e-3, [Transfer(1, 2, 0.25e9)], 1)]
    fast, nf = run_phases(topo, phases)
    slow, _ = run_phases(topo, phases, reserve=False)
    # B alone 1.5 -> 2 ms (0.5 MB), then 0.5 GB/s each: B ends at 2 ms + 0.2495 / 0.5 s;
    # A has 0.7505 GB left then and runs alone
    assert fast[1] == pytest.approx(2e-3 + 0.499, rel=1e-12)
    assert fast[0] == pytest.approx(2e-3 + 0.499 + 0.7505, rel=1e-12)
    _finishes_close(fast, slow)
    # A from t = 0 (handed back at 1.5 ms), then B alone at its arrival (materialised
    # mid-flow when A's flows arrive)
    assert nf.stats.reserved_phases == 2


def test_tiled_torus_numbering_fills_blocks_and_routes_as_the_plain_one():
    """cluster.network.tile: devices 0-63 of an 8x8x8 torus numbered in 4x4x4 tiles are one
    cube; the graph is the same torus (every device has its 6 neighbours), and a route
    between two coordinates has the same length under either numbering."""
    from topologies.builders import tiled_coords

    coords = tiled_coords((8, 8, 8), (4, 4, 4))
    assert sorted(coords) == sorted(tiled_coords((8, 8, 8)))  # a permutation of the devices
    assert {c for c in coords[:64]} == {(x, y, z) for x in range(4) for y in range(4) for z in range(4)}
    assert coords[64] == (4, 0, 0) and coords[128] == (0, 4, 0)
    tiled, plain = Topology(torus((8, 8, 8), 45e9, 1e-6, tile=(4, 4, 4))), Topology(torus((8, 8, 8), 45e9, 1e-6))
    assert all(tiled.graph.degree(n) == 6 for n in tiled.graph)
    for a, b in (((0, 0, 0), (7, 7, 7)), ((1, 2, 3), (5, 1, 6)), ((3, 3, 3), (4, 3, 3))):
        assert tiled.torus_coords(tiled.device_at(a)) == a
        r_t = tiled.route(tiled.device_at(a), tiled.device_at(b))
        r_p = plain.route(plain.device_at(a), plain.device_at(b))
        assert len(r_t) == len(r_p) == sum(min(abs(p - q), 8 - abs(p - q)) for p, q in zip(a, b))


@pytest.mark.parametrize(
    "tile, message",
    [([4, 4], "one block length per axis"), ([3, 4, 4], "must divide"), ([0, 4, 4], ">= 1")],
)
def test_bad_tile_names_the_field(tile, message):
    from topologies.errors import TopologyError
    from topologies.networks import TorusNetwork

    with pytest.raises(TopologyError, match=f"cluster.network.tile.*{message}"):
        TorusNetwork((8, 8, 8), 45e9, tile=tile)


def test_tile_in_a_scenario_is_kept_in_its_dict_and_checked():
    """cluster.network.tile resolves, is written back by scenario_to_dict (and left out when
    not given, so sweep keys of other tori stay as they were), and a bad one is refused
    naming the field."""
    from simulator.scenario.loading import load_scenario
    from simulator.scenario.schema import ScenarioError
    from simulator.scenario.serialise import scenario_to_dict

    base = {
        "model": "llama3-8b",
        "cluster": {"preset": "tpu-v5p", "devices": 128},
        "parallel": {"dp": 128},
        "training": {"seq_len": 1024, "global_batch_size": 128},
    }
    plain = scenario_to_dict(load_scenario(base))
    assert "tile" not in plain["cluster"]["network"]
    tiled = load_scenario({**base, "cluster": {**base["cluster"], "network": {"tile": [4, 4, 4]}}})
    assert tiled.cluster.network.tile == (4, 4, 4)
    assert scenario_to_dict(tiled)["cluster"]["network"]["tile"] == [4, 4, 4]
    assert load_scenario(scenario_to_dict(tiled)).cluster.network.tile == (4, 4, 4)
    with pytest.raises(ScenarioError, match="cluster.network.tile"):
        load_scenario({**base, "cluster": {**base["cluster"], "network": {"tile": [3, 4, 4]}}})
