"""Collective plans against closed forms, contention, busbw calibration and speed."""

import math
import time

import pytest
import simpy

from simulator.bench import (BenchError, collective_sweep, format_table, parse_size, plot_busbw,
                             size_range)
from simulator.collectives import (ALGORITHMS, OPS, CollectiveError, CollectivePlan, Phase,
                                   bus_bandwidth_factor, choose_algorithm, plan_collective,
                                   run_collective)
from simulator.netcal import default_calibration
from simulator.network import FlowNetwork, Transfer
from topologies.builders import switched, torus
from topologies.networks import IB_NIC_LATENCY_S, NVLINK_LATENCY_S, SwitchedNetwork
from topologies.presets import build_cluster, cluster_preset
from topologies.topology import Topology

S = 1e9          # bytes
B = 100e9        # bytes/s per direction
A = 1e-6         # s per hop


def ring_topo(n, wrap=True):
    return Topology(torus((n,), B, A, wrap=(wrap,)))


def crossbar(n, bw=B, nvls=False):
    """One switched domain: every device has one link of ``bw`` to a crossbar switch."""
    return Topology(switched(n, SwitchedNetwork(n, bw, 50e9, nvls=nvls)))


def sim(topo, plans, calibration=None, starts=None):
    """Run plans (each in its own process, or a list = twins merged); return finish times."""
    env = simpy.Environment()
    net = FlowNetwork(env, topo, calibration)
    finish = {}

    def proc(i, plan, start):
        yield env.timeout(start)
        yield env.process(run_collective(net, plan))
        finish[i] = env.now

    for i, plan in enumerate(plans):
        env.process(proc(i, plan, (starts or [0] * len(plans))[i]))
    env.run()
    return finish, net


def t_alone(topo, op, group, size, algorithm=None, calibration=None):
    plan = plan_collective(op, group, size, topo, algorithm)
    return sim(topo, [plan], calibration)[0][0], plan


# ---------------------------------------------------------------- closed forms

@pytest.mark.parametrize("n", [2, 5, 8])
def test_ring_all_reduce_on_ring(n):
    t, plan = t_alone(ring_topo(n), "all-reduce", range(n), S, "ring")
    assert len(plan.phases) == 1 and plan.phases[0].steps == 2 * (n - 1)
    assert t == pytest.approx(2 * (n - 1) * (A + S / (n * B)), rel=0.01)


@pytest.mark.parametrize("op", ["all-gather", "reduce-scatter"])
def test_ring_all_gather_reduce_scatter_on_ring(op):
    n = 8
    t, _ = t_alone(ring_topo(n), op, range(n), S, "ring")
    assert t == pytest.approx((n - 1) * (A + S / (n * B)), rel=0.01)


def test_bidirectional_ring_halves_bandwidth_term():
    n = 8
    t, _ = t_alone(ring_topo(n), "all-reduce", range(n), S, "ring-bidir")
    assert t == pytest.approx(2 * (n - 1) * (A + S / (2 * n * B)), rel=0.01)


def test_collapsed_ring_equals_step_by_step_ring():
    """Collapsing the 2(n-1) identical steps into one phase is exact alone on a ring."""
    n = 6
    topo = ring_topo(n)
    collapsed, _ = t_alone(topo, "all-reduce", range(n), S, "ring")
    step = Phase(tuple(Transfer(i, (i + 1) % n, S / n) for i in range(n)), 1)
    stepwise = CollectivePlan("all-reduce", "ring", tuple(range(n)), S, (step,) * (2 * (n - 1)))
    t_step = sim(topo, [stepwise])[0][0]
    assert collapsed == pytest.approx(t_step, rel=1e-12)


@pytest.mark.parametrize("n", [4, 8, 16])
def test_halving_doubling_on_crossbar(n):
    topo = crossbar(n)
    alpha = 2 * NVLINK_LATENCY_S              # device -> switch -> device
    t, plan = t_alone(topo, "all-reduce", range(n), S, "halving-doubling")
    assert len(plan.phases) == 2 * int(math.log2(n))
    assert t == pytest.approx(2 * math.log2(n) * alpha + 2 * (n - 1) / n * S / B, rel=0.01)


def test_halving_doubling_non_power_of_two_folds_extra_ranks():
    n, p = 6, 4
    topo = crossbar(n)
    alpha = 2 * NVLINK_LATENCY_S
    t, plan = t_alone(topo, "all-reduce", range(n), S, "halving-doubling")
    expected = 2 * (alpha + S / B) + 2 * math.log2(p) * alpha + 2 * (p - 1) / p * S / B
    assert t == pytest.approx(expected, rel=0.01)
    assert plan_collective("all-gather", range(n), S, topo, "halving-doubling").algorithm == "ring"


def test_halving_doubling_reduce_scatter_and_all_gather():
    n = 8
    topo = crossbar(n)
    alpha = 2 * NVLINK_LATENCY_S
    for op in ("reduce-scatter", "all-gather"):
        t, _ = t_alone(topo, op, range(n), S, "halving-doubling")
        assert t == pytest.approx(3 * alpha + (n - 1) / n * S / B, rel=0.01)


def test_2d_torus_all_reduce_wrapped():
    topo = Topology(torus((4, 4), B, A, wrap=(True, True)))
    t, plan = t_alone(topo, "all-reduce", range(16), S)
    assert plan.algorithm == "torus" and len(plan.phases) == 4
    # bidirectional rings: axis 0 on S, axis 1 on S/4, there and back
    expected = 2 * (3 * (A + S / (2 * 4 * B)) + 3 * (A + S / (2 * 16 * B)))
    assert t == pytest.approx(expected, rel=0.01)


def test_2d_torus_all_reduce_without_wrap_is_a_chain():
    topo = Topology(torus((4, 4), B, A, wrap=(False, False)))
    t, _ = t_alone(topo, "all-reduce", range(16), S, "torus")
    expected = 2 * (3 * (A + S / (4 * B)) + 3 * (A + S / (16 * B)))
    assert t == pytest.approx(expected, rel=0.01)


def test_torus_sub_box_uses_lines():
    topo = Topology(torus((8, 4), B, A, wrap=(True, True)))
    group = [topo.device_at((x, y)) for y in range(4) for x in range(2, 6)]   # 4 x 4 box
    assert choose_algorithm("all-reduce", group, topo) == "torus"
    t, _ = t_alone(topo, "all-reduce", group, S)
    # axis 0 is a part of a ring: line; axis 1 is whole and wraps: bidirectional ring
    expected = 2 * (3 * (A + S / (4 * B)) + 3 * (A + S / (2 * 16 * B)))
    assert t == pytest.approx(expected, rel=0.01)


def test_hierarchical_on_fat_tree():
    k, m = 8, 4
    bw_nv, bw_ib = 450e9, 50e9
    topo = Topology(switched(k * m, SwitchedNetwork(k, bw_nv, bw_ib)))   # rail-optimised
    t, plan = t_alone(topo, "all-reduce", range(k * m), S)
    assert plan.algorithm == "hierarchical" and len(plan.phases) == 3
    a_nv, a_ib = 2 * NVLINK_LATENCY_S, 2 * IB_NIC_LATENCY_S
    expected = (2 * (k - 1) * (a_nv + S / (k * bw_nv))
                + 2 * (m - 1) * (a_ib + S / (k * m * bw_ib)))
    assert t == pytest.approx(expected, rel=0.01)


def test_hierarchical_across_leaves_with_full_bisection():
    k, m = 8, 4
    net = SwitchedNetwork(k, 450e9, 50e9, domains_per_leaf=1)   # every hop climbs the spine
    topo = Topology(switched(k * m, net))
    t, _ = t_alone(topo, "all-reduce", range(k * m), S)
    a_nv = 2 * NVLINK_LATENCY_S
    a_ib = 2 * IB_NIC_LATENCY_S + 2 * net.switch_latency_s
    expected = 2 * (k - 1) * (a_nv + S / (k * 450e9)) + 2 * (m - 1) * (a_ib + S / (k * m * 50e9))
    assert t == pytest.approx(expected, rel=0.01)


def test_double_binary_tree_on_crossbar():
    n = 8
    t, _ = t_alone(crossbar(n), "all-reduce", range(n), S, "tree")
    assert t == pytest.approx(2 * 3 * 2 * NVLINK_LATENCY_S + 2 * S / B, rel=0.01)


def test_broadcast_send_recv_and_direct_all_to_all_on_crossbar():
    n = 8
    topo = crossbar(n)
    alpha = 2 * NVLINK_LATENCY_S
    t, _ = t_alone(topo, "broadcast", range(n), S, "ring")
    assert t == pytest.approx((n - 1) * alpha + S / B, rel=0.01)
    t, _ = t_alone(topo, "broadcast", range(n), S, "tree")
    assert t == pytest.approx(3 * alpha + 2 * S / B, rel=0.01)
    t, _ = t_alone(topo, "send-recv", [3, 5], S)
    assert t == pytest.approx(alpha + S / B, rel=1e-9)
    t, _ = t_alone(topo, "all-to-all", range(n), S)
    assert t == pytest.approx(alpha + (n - 1) / n * S / B, rel=0.01)


def test_hierarchical_a2a_is_rail_bound():
    k, m = 8, 4
    topo = Topology(switched(k * m, SwitchedNetwork(k, 450e9, 50e9)))
    n = k * m
    t, plan = t_alone(topo, "all-to-all", range(n), S)
    assert plan.algorithm == "hierarchical-a2a"
    # each rank sends k*S/n to each of the m-1 other domains over its own NIC
    rail = (m - 1) * k * S / n / 50e9
    nvlink = (k - 1) * m * S / n / 450e9
    assert t == pytest.approx(2 * 2 * IB_NIC_LATENCY_S + max(rail, nvlink), rel=0.01)
    direct, _ = t_alone(topo, "all-to-all", range(n), S, "direct")
    assert direct == pytest.approx(2 * IB_NIC_LATENCY_S + (m - 1) * k * S / n / 50e9, rel=0.01)


def test_nvls_and_sharp_in_network_reduction():
    n = 8
    topo = crossbar(n, nvls=True)
    t, plan = t_alone(topo, "all-reduce", range(n), S)
    assert plan.algorithm == "nvls" and plan.phases[0].in_network
    assert t == pytest.approx(2 * 2 * NVLINK_LATENCY_S + (n + 1) / n * S / B, rel=0.01)
    topo = Topology(switched(32, SwitchedNetwork(8, 450e9, 50e9, sharp=True)))
    t, plan = t_alone(topo, "all-reduce", range(32), S)
    assert plan.algorithm == "sharp"
    expected = 2 * 7 * (2 * NVLINK_LATENCY_S + S / (8 * 450e9)) + (
        2 * IB_NIC_LATENCY_S + S / 8 / 50e9)
    assert t == pytest.approx(expected, rel=0.01)
    with pytest.raises(CollectiveError, match="topo.nvls"):
        plan_collective("all-reduce", range(8), S, crossbar(8), "nvls")


# ---------------------------------------------------------------- contention

def test_two_collectives_on_one_bottleneck_take_twice_as_long():
    n = 8
    topo = ring_topo(n)
    alone, _ = t_alone(topo, "all-reduce", range(n), S, "ring")
    plan = plan_collective("all-reduce", range(n), S, topo, "ring")
    finish, _ = sim(topo, [plan, plan])
    lat = 2 * (n - 1) * A
    for t in finish.values():
        assert t - lat == pytest.approx(2 * (alone - lat), rel=0.01)


def test_disjoint_collectives_do_not_slow_each_other():
    topo = Topology(torus((4, 4), B, A, wrap=(True, True)))
    rows = [[topo.device_at((x, y)) for x in range(4)] for y in range(2)]
    plans = [plan_collective("all-reduce", r, S, topo, "ring") for r in rows]
    alone = sim(topo, plans[:1])[0][0]
    finish, _ = sim(topo, plans)
    assert finish[0] == pytest.approx(alone, rel=1e-12) == finish[1]


def test_twin_plans_merge_into_one_transfer_call():
    topo = Topology(torus((4, 4), B, A, wrap=(True, True)))
    rows = [[topo.device_at((x, y)) for x in range(4)] for y in range(4)]
    plans = [plan_collective("all-reduce", r, S, topo, "ring") for r in rows]
    separate, _ = sim(topo, plans)
    merged, net = sim(topo, [plans])
    assert merged[0] == pytest.approx(separate[0], rel=1e-12)
    assert net.stats.phases_started == 1


def test_dp_all_reduce_slows_ep_all_to_all_sharing_nics():
    topo = Topology(switched(16, SwitchedNetwork(8, 450e9, 50e9)))
    a2a = plan_collective("all-to-all", range(16), 1e8, topo, "direct")
    # data-parallel all-reduce of each rail's pair of ranks (twins, merged)
    ars = [plan_collective("all-reduce", [j, j + 8], 1e9, topo, "ring") for j in range(8)]
    alone = sim(topo, [a2a])[0][0]
    both = sim(topo, [a2a, ars])[0]
    # each NIC now carries 8 all-to-all flows and 1 all-reduce flow: max-min gives the
    # all-to-all 8/9 of the NIC
    assert both[0] - 2 * IB_NIC_LATENCY_S == pytest.approx(
        9 / 8 * (alone - 2 * IB_NIC_LATENCY_S), rel=0.02)


# ---------------------------------------------------------------- calibration

def test_dgx_h100_busbw_plateau_and_latency_bound():
    topo = build_cluster(cluster_preset("dgx-h100", 8))
    cal = default_calibration("h100")
    sizes = [8 * 1024, 1 << 20, 1 << 26, 1 << 33]
    rows = collective_sweep("all-reduce", topo, range(8), sizes, "ring", cal)
    busbw = [r["busbw_bytes_per_s"] for r in rows]
    assert busbw == sorted(busbw)
    assert busbw[-1] == pytest.approx(370e9, rel=0.02)
    small = rows[0]
    assert small["time_s"] >= 2 * 7 * 3.33e-6 * 0.999           # 14 NVLink latencies
    assert small["busbw_bytes_per_s"] < 0.01 * busbw[-1]
    # default on dgx-h100 is NVLS: ~480 GB/s busbw at large sizes (nccl-tests #212)
    nvls = collective_sweep("all-reduce", topo, range(8), [1 << 33], None, cal)[0]
    assert nvls["algorithm"] == "nvls"
    assert nvls["busbw_bytes_per_s"] == pytest.approx(480e9, rel=0.02)


# ---------------------------------------------------------------- rules and errors

def test_choose_algorithm_rules():
    sw = Topology(switched(32, SwitchedNetwork(8, 450e9, 50e9, nvls=True)))
    assert choose_algorithm("all-reduce", range(8), sw) == "nvls"
    assert choose_algorithm("all-gather", range(8), sw) == "ring"
    assert choose_algorithm("all-reduce", range(32), sw) == "hierarchical"
    assert choose_algorithm("all-reduce", [0, 8, 16, 24], sw) == "ring"
    assert choose_algorithm("all-reduce", [0, 1, 8], sw) == "ring"
    assert choose_algorithm("all-to-all", range(32), sw) == "hierarchical-a2a"
    assert choose_algorithm("all-to-all", range(8), sw) == "direct"
    assert choose_algorithm("send-recv", [0, 9], sw) == "p2p"
    assert choose_algorithm("broadcast", range(8), sw) == "ring"
    tt = Topology(torus((4, 4), B, A))
    assert choose_algorithm("all-reduce", range(16), tt) == "torus"
    assert choose_algorithm("all-reduce", [0, 5, 10], tt) == "ring"
    pods = build_cluster(cluster_preset("tpu-v5e", 512))
    assert pods.n_pods == 2
    assert choose_algorithm("all-reduce", range(512), pods) == "hierarchical"
    assert choose_algorithm("all-reduce", range(256), pods) == "torus"


def test_multi_pod_hierarchical_runs():
    topo = build_cluster(cluster_preset("tpu-v5e", 512))
    t, plan = t_alone(topo, "all-reduce", range(512), 1e8)
    assert plan.algorithm == "hierarchical" and t > 0


def test_bad_plans_raise():
    topo = crossbar(4)
    with pytest.raises(CollectiveError, match="unknown collective op"):
        plan_collective("allreduce", range(4), S, topo)
    with pytest.raises(CollectiveError, match="does not implement"):
        plan_collective("all-to-all", range(4), S, topo, "ring")
    with pytest.raises(CollectiveError, match="unknown algorithm"):
        plan_collective("all-reduce", range(4), S, topo, "butterfly")
    with pytest.raises(CollectiveError, match="repeats"):
        plan_collective("all-reduce", [0, 0], S, topo)
    with pytest.raises(CollectiveError, match="group of 2"):
        plan_collective("send-recv", [0, 1, 2], S, topo)
    with pytest.raises(CollectiveError, match="box"):
        plan_collective("all-reduce", [0, 1], S, topo, "torus")
    assert plan_collective("all-reduce", [2], S, topo).phases == ()


def test_every_valid_algorithm_plans_and_runs():
    topo = Topology(switched(16, SwitchedNetwork(8, 450e9, 50e9, nvls=True, sharp=True)))
    for op in OPS:
        for algo in ALGORITHMS:
            group = [0, 9] if op == "send-recv" else (range(8) if algo == "nvls" else range(16))
            try:
                plan = plan_collective(op, group, 1e6, topo, algo)
            except CollectiveError:
                continue
            t = sim(topo, [plan])[0][0]
            assert 0 < t < 1, (op, algo)


def test_bus_bandwidth_factor():
    assert bus_bandwidth_factor("all-reduce", 8) == 2 * 7 / 8
    assert bus_bandwidth_factor("all-gather", 8) == 7 / 8
    assert bus_bandwidth_factor("reduce-scatter", 4) == 3 / 4
    assert bus_bandwidth_factor("all-to-all", 8) == 7 / 8
    assert bus_bandwidth_factor("broadcast", 8) == 1
    assert bus_bandwidth_factor("send-recv", 2) == 1


# ---------------------------------------------------------------- bench helpers

def test_sizes_and_table(tmp_path):
    assert parse_size("8G") == 8 << 30
    assert parse_size("512M") == 512 << 20
    assert parse_size("1.5K") == 1536
    assert parse_size("64") == 64
    assert parse_size("8GB") == parse_size("8gib") == 8 << 30
    with pytest.raises(BenchError, match="cannot parse"):
        parse_size("eight")
    assert size_range("8", "64") == [8, 16, 32, 64]
    assert size_range(1 << 20, "4M") == [1 << 20, 2 << 20, 4 << 20]
    with pytest.raises(BenchError):
        size_range(64, 8)
    rows = collective_sweep("all-gather", ring_topo(4), range(4), size_range("1M", "4M"))
    table = format_table(rows)
    assert "busbw(GB/s)" in table and "Avg bus bandwidth" in table
    assert len(table.splitlines()) == 5
    out = tmp_path / "busbw.png"
    plot_busbw(rows, str(out))
    assert out.stat().st_size > 0


# ---------------------------------------------------------------- speed

def test_large_collectives_are_fast(capsys):
    topo = build_cluster(cluster_preset("dgx-h100", 1024))
    t0 = time.perf_counter()
    t_ar, plan = t_alone(topo, "all-reduce", range(1024), 1 << 30, None,
                         default_calibration("hopper"))
    t1 = time.perf_counter()
    topo256 = build_cluster(cluster_preset("dgx-h100", 256))
    t2 = time.perf_counter()
    t_a2a, plan2 = t_alone(topo256, "all-to-all", range(256), 1 << 28, "direct")
    t3 = time.perf_counter()
    with capsys.disabled():
        print(f"\n1024-device {plan.algorithm} all-reduce: {t1 - t0:.3f} s wall "
              f"(simulated {t_ar * 1e3:.2f} ms); 256-device direct all-to-all "
              f"({256 * 255} flows): {t3 - t2:.3f} s wall (simulated {t_a2a * 1e3:.2f} ms)")
    assert t1 - t0 < 10 and t3 - t2 < 10
