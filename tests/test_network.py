"""Max-min maths on tiny matrices, and the simpy flow network on tiny graphs."""

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.netcal import (IDEAL, CalibrationError, NetCalibration, NVLINK_EFFICIENCY,
                              default_calibration)
from simulator.network import FlowNetwork, NetworkError, Transfer, maxmin_rates
from topologies.builders import switched, torus
from topologies.networks import (IB_NIC_LATENCY_S, IB_SWITCH_LATENCY_S, NVLINK_LATENCY_S,
                                 SwitchedNetwork)
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
    rows = [data.draw(st.lists(st.integers(0, n_links - 1), min_size=1, max_size=n_links,
                               unique=True)) for _ in range(n_flows)]
    cap = np.array(data.draw(st.lists(st.integers(1, 20), min_size=n_links, max_size=n_links)),
                   dtype=float)
    w = np.array(data.draw(st.lists(st.integers(1, 4), min_size=n_flows, max_size=n_flows)),
                 dtype=float)
    a = inc(rows, n_links)
    r = maxmin_rates(a, cap, w)
    load = a.T @ (w * r)
    assert np.all(load <= cap * (1 + 1e-9))
    # max-min: each flow crosses a saturated link on which it has the largest rate
    for f, links in enumerate(rows):
        assert any(load[l] >= cap[l] * (1 - 1e-9)
                   and r[f] >= max(r[g] for g, lk in enumerate(rows) if l in lk) * (1 - 1e-9)
                   for l in links)


# ---------------------------------------------------------------- FlowNetwork

def line_topology(n=3, bw=1e9, lat=1e-6):
    """d0 - d1 - ... a line of devices (a 1-D torus without wrap)."""
    return Topology(torus((n,), bw, lat, wrap=(False,)))


def run_phases(topo, phases, calibration=None):
    """phases: list of (start_time, transfers, steps); returns finish times and the network."""
    env = simpy.Environment()
    net = FlowNetwork(env, topo, calibration)
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
    finish, net = run_phases(topo, [(0, [Transfer(0, 1, 1e9)], 1),
                                    (0.5, [Transfer(0, 1, 0.25e9)], 1)])
    assert finish[1] == pytest.approx(1.0, rel=1e-12)
    assert finish[0] == pytest.approx(1.25, rel=1e-12)
    assert net.stats.recomputations == 3     # A arrives, B arrives, B leaves
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
    finish, net = run_phases(topo, [(0, [Transfer(0, 0, 1e9), Transfer(1, 0, 0)], 3),
                                    (0, [], 1)])
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
        phases.append((float(rng.uniform(0, 1e-3)),
                       [Transfer(int(s), int(d), float(rng.uniform(1e5, 1e8)))], 1))
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


@pytest.mark.parametrize("src,dst,expected", [
    (0, 1, 3.33e-6),           # NVLink, same node
    (0, 8, 2.8e-6),            # IB, same leaf (same rail)
    (0, 16, 3.7e-6),           # IB, cross leaf
])
def test_small_message_latency_matches_deepseek(src, dst, expected):
    # DeepSeek ISCA'25 64 B latencies; one node per leaf group so d16 is on another leaf
    spec = cluster_preset("dgx-h100", 24, network={"domains_per_leaf": 2})
    topo = build_cluster(spec)
    finish, _ = run_phases(topo, [(0, [Transfer(src, dst, 64)], 1)], default_calibration("hopper"))
    assert finish[0] == pytest.approx(expected, rel=0.01)
    assert NVLINK_LATENCY_S * 2 == pytest.approx(3.33e-6)
    assert 2 * IB_NIC_LATENCY_S + 2 * IB_SWITCH_LATENCY_S == pytest.approx(3.7e-6)


def test_switched_capacity_uses_kind_efficiency():
    topo = Topology(switched(16, SwitchedNetwork(8, 450e9, 50e9)))
    net = FlowNetwork(simpy.Environment(), topo, default_calibration("hopper"))
    kinds = np.array(topo.link_kind)
    assert np.allclose(net.capacity[kinds == "nvlink"], 370e9)
    assert np.allclose(net.capacity[kinds == "nic"], 48e9)
    assert isinstance(topo.graph, nx.Graph)
