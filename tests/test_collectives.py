"""Collective plans against closed forms, contention, busbw calibration and speed."""

import math
import time

import pytest
import simpy

from simulator.network.calibration import default_calibration
from simulator.network.collectives import (
    ALGORITHMS,
    OPS,
    CollectiveError,
    CollectivePlan,
    Phase,
    bus_bandwidth_factor,
    choose_algorithm,
    plan_collective,
    run_collective,
)
from simulator.network.flows import FlowNetwork, Transfer
from simulator.studies.bench import BenchError, collective_sweep, format_table, parse_size, plot_busbw, size_range
from topologies.builders import switched, torus
from topologies.networks import IB_NIC_LATENCY_S, NVLINK_LATENCY_S, SwitchedNetwork
from topologies.presets import build_cluster, cluster_preset
from topologies.topology import Topology

S = 1e9  # bytes
B = 100e9  # bytes/s per direction
A = 1e-6  # s per hop


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
    alpha = 2 * NVLINK_LATENCY_S  # device -> switch -> device
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
    # two shares of S/2, one per axis order (x then y, y then x), run at once: bidirectional
    # rings on S/2 along both axes, then on S/8, there and back
    expected = 2 * (3 * (A + S / 2 / (2 * 4 * B)) + 3 * (A + S / 2 / (2 * 16 * B)))
    assert t == pytest.approx(expected, rel=0.01)


def test_2d_torus_all_reduce_without_wrap_is_a_chain():
    topo = Topology(torus((4, 4), B, A, wrap=(False, False)))
    t, _ = t_alone(topo, "all-reduce", range(16), S, "torus")
    expected = 2 * (3 * (A + S / 2 / (4 * B)) + 3 * (A + S / 2 / (16 * B)))
    assert t == pytest.approx(expected, rel=0.01)


def test_torus_sub_box_uses_lines():
    topo = Topology(torus((8, 4), B, A, wrap=(True, True)))
    group = [topo.device_at((x, y)) for y in range(4) for x in range(2, 6)]  # 4 x 4 box
    assert choose_algorithm("all-reduce", group, topo) == "torus"
    t, _ = t_alone(topo, "all-reduce", group, S)
    # axis 0 is a part of a ring: line; axis 1 is whole and wraps: bidirectional ring.
    # Each stage runs one share on each axis and lasts as long as the line's share.
    expected = 2 * (3 * (A + S / 2 / (4 * B)) + 3 * (A + S / 8 / (4 * B)))
    assert t == pytest.approx(expected, rel=0.01)


def test_torus_collectives_use_every_axis_at_once():
    """Issue 13 item 2. A 1 GiB all-gather on a wrapped 4 x 4 torus of v5p links (90 GB/s
    per direction) took 5.598 ms, the time of one axis at a time; with both axes busy it
    is half that, 2.80 ms."""
    bw = 90e9
    topo = Topology(torus((4, 4), bw, A, wrap=(True, True)))
    size = float(1 << 30)
    t, plan = t_alone(topo, "all-gather", range(16), size)
    assert len(plan.phases) == 2
    # closed form, (m-1)(a + d/(2mB)) per axis for d bytes per rank after the gather: shares
    # of S/2 gather along one axis (S/8 per rank after it), then along the other (S/2)
    expected = 3 * (A + size / 8 / (2 * 4 * bw)) + 3 * (A + size / 2 / (2 * 4 * bw))
    assert t == pytest.approx(expected, rel=1e-6)
    assert t == pytest.approx(2.80e-3, rel=0.01)
    # TPU v5p 4 x 4 x 4 (64 chips, 90 GB/s per link and direction): "How to Scale Your Model"
    # (TPU chapter) -- a collective over several axes gets the bandwidth of every axis, so
    # the all-reduce busbw is 3 x the 180 GB/s of one axis's bidirectional ring, ~540 GB/s.
    v5p = build_cluster(cluster_preset("tpu-v5p", 64))
    cal = default_calibration("tpu-v5p")
    size = float(4 << 30)
    for op in ("all-reduce", "all-gather", "reduce-scatter"):
        torus_row = collective_sweep(op, v5p, range(64), [size], None, cal)[0]
        ring_row = collective_sweep(op, v5p, range(64), [size], "ring-bidir", cal)[0]
        assert torus_row["algorithm"] == "torus"
        assert torus_row["busbw_bytes_per_s"] == pytest.approx(540e9, rel=0.01)
        assert torus_row["busbw_bytes_per_s"] >= 2.5 * ring_row["busbw_bytes_per_s"]


def test_torus_strided_grid_uses_both_axes():
    """A data-parallel group laid out with a stride on the torus (tp = 8 ranks innermost on
    a 4 x 4 x 8 v5p-256 slice leave each DP group the plane x = 0, rows y in {0, 2}, all of
    z) is a grid, not a box: it still runs dimension by dimension on both axes ("How to
    Scale Your Model", TPU chapter: a collective over several axes gets the bandwidth of
    every axis), not as one 16-rank ring. Closed form for an all-gather of S, two shares
    of S/2 (orders y-z and z-y), gathered in reverse order:
      phase 1: z ring (m=8) on S/4 -> busiest link 7/8 * S/4 / 2 = 7S/64; y line (m=2,
               2-hop routes, disjoint both ways) on S/16 -> S/32; 7 steps of 2-hop latency
      phase 2: z ring on S/2 -> 7S/32; y line on S/2 -> S/4; 7 steps of 2-hop latency."""
    topo = Topology(torus((4, 4, 8), B, A, wrap=(True, True, True)))
    group = [topo.device_at((0, y, z)) for z in range(8) for y in (0, 2)]
    assert choose_algorithm("all-gather", group, topo) == "torus"
    t, plan = t_alone(topo, "all-gather", group, S)
    assert [ph.steps for ph in plan.phases] == [7, 7]
    expected = 7 * 2 * A + 7 * S / (64 * B) + 7 * 2 * A + S / (4 * B)
    assert t == pytest.approx(expected, rel=1e-6)
    ring, _ = t_alone(topo, "all-gather", group, S, "ring")
    assert t < 0.4 * ring  # the old fallback: one ring of 15 steps, 15/16 S / B
    # every other position of a wrapped axis of 8 (m = 4 > 2) is a ring of 2-hop neighbours
    line = Topology(torus((8,), B, A, wrap=(True,)))
    t, plan = t_alone(line, "all-gather", [0, 2, 4, 6], S)
    assert plan.algorithm == "torus"
    assert t == pytest.approx(3 * (2 * A + S / (2 * 4 * B)), rel=1e-6)
    # not evenly spaced: no grid, ring fallback
    assert choose_algorithm("all-gather", [0, 1, 3], line) == "ring"


def test_torus_shares_contend_with_traffic_on_one_axis():
    """The per-axis shares are real flows: a ring on one row's links slows the 2D
    all-reduce, which in turn leaves that ring part of its links."""
    topo = Topology(torus((4, 4), B, A, wrap=(True, True)))
    full = plan_collective("all-reduce", range(16), S, topo)
    row = plan_collective("all-reduce", [topo.device_at((x, 0)) for x in range(4)], S, topo, "ring-bidir")
    alone_full = sim(topo, [full])[0][0]
    alone_row = sim(topo, [row])[0][0]
    both = sim(topo, [full, row])[0]
    assert both[0] > alone_full * 1.05
    assert both[1] > alone_row * 1.05


def test_rail_ring_on_fat_tree():
    """NCCL's ring across nodes: every rank's data crosses every NIC once per pass, one
    channel per rail; the intra-node links carry the whole ring load (PXN hand-over)."""
    k, m = 8, 4
    n = k * m
    bw_nv, bw_ib = 450e9, 50e9
    topo = Topology(switched(n, SwitchedNetwork(k, bw_nv, bw_ib)))  # rail-optimised
    t, plan = t_alone(topo, "all-reduce", range(n), S)
    assert plan.algorithm == "rail-ring" and len(plan.phases) == 1
    alpha = max(2 * NVLINK_LATENCY_S, 2 * IB_NIC_LATENCY_S)
    per_rank = 2 * (n - 1) / n * S
    expected = 2 * (n - 1) * alpha + max(per_rank / bw_nv, per_rank / k / bw_ib)
    assert t == pytest.approx(expected, rel=1e-6)
    for op in ("all-gather", "reduce-scatter"):
        t, _ = t_alone(topo, op, range(n), S)
        assert t == pytest.approx((n - 1) * alpha + max(per_rank / 2 / bw_nv, per_rank / 2 / k / bw_ib), rel=1e-6)


def test_pipelined_hierarchical_on_fat_tree():
    k, m = 8, 4
    bw_nv, bw_ib = 450e9, 50e9
    topo = Topology(switched(k * m, SwitchedNetwork(k, bw_nv, bw_ib)))  # rail-optimised
    t, plan = t_alone(topo, "all-reduce", range(k * m), S, "hierarchical")
    assert plan.algorithm == "hierarchical" and len(plan.phases) == 1
    alpha = max(2 * NVLINK_LATENCY_S, 2 * IB_NIC_LATENCY_S)
    # intra reduce-scatter and all-gather share NVLink; the rail all-reduce of S/k runs beside
    expected = (2 * (k - 1) + 2 * (m - 1)) * alpha + max(2 * (k - 1) / k * S / bw_nv, 2 * (m - 1) / m * S / k / bw_ib)
    assert t == pytest.approx(expected, rel=1e-6)


def test_rail_ring_across_leaves_with_full_bisection():
    k, m = 8, 4
    n = k * m
    net = SwitchedNetwork(k, 450e9, 50e9, domains_per_leaf=1)  # every hop climbs the spine
    topo = Topology(switched(n, net))
    t, _ = t_alone(topo, "all-reduce", range(n), S)
    alpha = 2 * IB_NIC_LATENCY_S + 2 * net.switch_latency_s
    per_rank = 2 * (n - 1) / n * S
    expected = 2 * (n - 1) * alpha + max(per_rank / 450e9, per_rank / k / 50e9)
    assert t == pytest.approx(expected, rel=1e-6)


def test_cross_node_busbw_matches_nccl_tests():
    """Issue 13 item 1, at 4 GiB with the default calibrations.

    * H100, 8 x 400 Gb/s NDR per node: "around 48GB/s from each CX7 NIC ... aggregated to
      achieve up to ~396GB/s with the RING protocol" (NCCL team, NVIDIA/nccl-tests issue
      #319); 365.84 GB/s on 4 HGX nodes and "380GB/s in a multi-host" DGX (issue #309).
    * DGX A100, 8 x 200 Gb/s HDR: "we measure 192GB/s AllReduce BusBW" (NCCL team,
      NVIDIA/nccl issue #812).
    The ring is bound by the NVLink ring (0.822 x 450 = 370 GB/s on H100) or the NICs
    (8 x 0.96 x 25 = 192 GB/s on A100), so busbw = min of the two for every size of group
    and for all-gather / reduce-scatter alike."""
    cases = [
        ("dgx-h100", 16, 340e9, 400e9, 0.822 * 450e9),
        ("dgx-h100", 64, 340e9, 400e9, 0.822 * 450e9),
        ("dgx-a100", 16, 170e9, 200e9, 8 * 0.96 * 25e9),
    ]
    for preset, n, lo, hi, bound in cases:
        topo = build_cluster(cluster_preset(preset, n))
        cal = default_calibration(preset.split("-")[1])
        for op in ("all-reduce", "all-gather", "reduce-scatter"):
            row = collective_sweep(op, topo, range(n), [float(4 << 30)], None, cal)[0]
            assert row["algorithm"] == "rail-ring"
            assert lo <= row["busbw_bytes_per_s"] <= hi, (preset, n, op, row)
            assert row["busbw_bytes_per_s"] == pytest.approx(bound, rel=0.02)


def test_rail_ring_shares_nvlink_with_tensor_parallel_traffic():
    """The intra-node part of the ring is a real flow: an all-reduce inside node 0 on the
    same NVLink links slows the cross-node all-reduce, and vice versa."""
    topo = Topology(switched(16, SwitchedNetwork(8, 450e9, 50e9)))
    dp = plan_collective("all-reduce", range(16), S, topo)
    tp = plan_collective("all-reduce", range(8), S, topo, "ring")
    alone_dp, alone_tp = sim(topo, [dp])[0][0], sim(topo, [tp])[0][0]
    both = sim(topo, [dp, tp])[0]
    assert both[0] > alone_dp * 1.2 and both[1] > alone_tp * 1.2


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


# DeepSeek-V3 technical report §3.2.2: H800 nodes, NVLink 160 GB/s achievable vs IB 50 GB/s
# (about 3.2x), each token dispatched to at most 4 nodes; "IB sending, IB-to-NVLink
# forwarding, and NVLink receiving" are overlapped, so a token can pick about 3.2 experts
# per node without extra NVLink cost: the two hops cost max(IB, NVLink), not the sum.
DSV3_NVLINK_BPS = 160e9
DSV3_IB_BPS = 50e9


@pytest.mark.parametrize("m, frac, bound", [(2, 0.5, "nvlink"), (4, 0.5, "ib"), (4, 0.25, "nvlink")])
def test_node_limited_a2a_costs_the_slower_hop_not_the_sum(m, frac, bound):
    """Pipelined two-hop all-to-all alone on m nodes of 8: rail (IB) bytes per rank
    (m-1) f k S/n at the NIC rate, NVLink bytes (k-1) m S/n at the NVLink rate, at once."""
    k = 8
    n = k * m
    topo = Topology(switched(n, SwitchedNetwork(k, DSV3_NVLINK_BPS, DSV3_IB_BPS)))
    plan = plan_collective("all-to-all", range(n), S, topo, scaleout_fraction=frac)
    assert plan.algorithm == "hierarchical-a2a" and len(plan.phases) == 1
    t = sim(topo, [plan])[0][0]
    ib = (m - 1) * frac * k * S / n / DSV3_IB_BPS
    nvlink = (k - 1) * m * S / n / DSV3_NVLINK_BPS
    # 2 steps, each the slower path: NVLink's 3.33 us (two links) against IB's 2 x 1.4 us
    latency = 2 * max(2 * NVLINK_LATENCY_S, 2 * IB_NIC_LATENCY_S)
    assert t == pytest.approx(latency + max(ib, nvlink), rel=1e-6)
    assert t < 0.9 * (latency + ib + nvlink)
    # NVLink delivers (k-1) m / ((m-1) f k) copies per rail crossing: 3.5 (m=2, f=1/2) and
    # 4.7 (m=4, f=1/4) exceed the 160/50 = 3.2 that DeepSeek-V3 quotes, 2.3 (m=4, f=1/2) not
    assert ("ib" if ib > nvlink else "nvlink") == bound
    # the un-limited hierarchical all-to-all carries every copy over the rail
    full = sim(topo, [plan_collective("all-to-all", range(n), S, topo)])[0][0]
    assert full == pytest.approx(latency + max(ib / frac, nvlink), rel=1e-6)


@pytest.mark.parametrize("devices, frac", [(32, 0.5), (64, 0.5), (64, 0.25)])
def test_node_limited_a2a_estimate_matches_simulation(devices, frac):
    """estimate.NetModel's closed form for the pipelined two-hop all-to-all (max of the IB
    and NVLink legs) against the simulated plan on dgx-h100 with its calibration."""
    from simulator.studies.search.network_model import NetModel

    spec = cluster_preset("dgx-h100", devices)
    topo = build_cluster(spec)
    plan = plan_collective("all-to-all", range(devices), float(1 << 28), topo, scaleout_fraction=frac)
    t = sim(topo, [plan], default_calibration("h100"))[0][0]
    est = NetModel(spec).time_s("all-to-all", range(devices), float(1 << 28), scaleout_fraction=frac)
    assert est == pytest.approx(t, rel=0.01)


def test_node_limited_a2a_shares_nics_with_other_traffic():
    """Both hops run as flows of one phase: the rail flows still share each NIC max-min
    with a concurrent data-parallel all-reduce ring over the same rails (4 nodes, f = 1/2,
    IB-bound), each slowing the other."""
    k, m, frac, size, B = 8, 4, 0.5, 1e8, DSV3_IB_BPS
    topo = Topology(switched(k * m, SwitchedNetwork(k, DSV3_NVLINK_BPS, B)))
    a2a = plan_collective("all-to-all", range(k * m), size, topo, scaleout_fraction=frac)
    ars = [plan_collective("all-reduce", [j + k * d for d in range(m)], 1e9, topo, "ring") for j in range(k)]
    a = 2 * IB_NIC_LATENCY_S  # one NIC-to-NIC step
    lat = 2 * max(2 * NVLINK_LATENCY_S, a)  # the all-to-all's 2 steps
    rail = frac * k * size / (k * m)  # bytes of each of the m-1 rail flows per NIC
    ar_bytes = 2 * (m - 1) / m * 1e9  # ring all-reduce: per rank and NIC
    a2a_alone = sim(topo, [a2a])[0][0]
    assert a2a_alone == pytest.approx(lat + rail / (B / (m - 1)), rel=1e-6)
    # start the all-to-all so that both start flowing after the ring's 2(m-1) steps
    ar_lat = 2 * (m - 1) * a
    both = sim(topo, [a2a, ars], starts=[ar_lat - lat, 0])[0]
    # each NIC carries m-1 = 3 rail flows and 1 ring flow: B/4 each
    assert both[0] - (ar_lat - lat) == pytest.approx(lat + rail / (B / m), rel=1e-6)
    # the ring sends only `rail` bytes while the all-to-all runs instead of (m-1) rail
    ar_alone = ar_lat + ar_bytes / B
    assert sim(topo, [ars])[0][0] == pytest.approx(ar_alone, rel=1e-6)
    assert both[1] == pytest.approx(ar_alone + (m - 1) * rail / B, rel=1e-6)


def test_node_limited_a2a_rejects_bad_fractions():
    topo = Topology(switched(16, SwitchedNetwork(8, 450e9, 50e9)))
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(CollectiveError, match="scaleout_fraction"):
            plan_collective("all-to-all", range(16), S, topo, scaleout_fraction=bad)
    with pytest.raises(CollectiveError, match="all-to-all only"):
        plan_collective("all-reduce", range(16), S, topo, scaleout_fraction=0.5)
    with pytest.raises(CollectiveError, match="hierarchical-a2a"):
        plan_collective("all-to-all", range(16), S, topo, "direct", scaleout_fraction=0.5)


def test_nvls_and_sharp_in_network_reduction():
    n = 8
    topo = crossbar(n, nvls=True)
    t, plan = t_alone(topo, "all-reduce", range(n), S)
    assert plan.algorithm == "nvls" and plan.phases[0].in_network
    assert t == pytest.approx(2 * 2 * NVLINK_LATENCY_S + (n + 1) / n * S / B, rel=0.01)
    topo = Topology(switched(32, SwitchedNetwork(8, 450e9, 50e9, sharp=True)))
    t, plan = t_alone(topo, "all-reduce", range(32), S)
    assert plan.algorithm == "sharp" and len(plan.phases) == 1
    # pipelined: intra reduce-scatter + all-gather on NVLink beside the in-switch reduction
    alpha = max(2 * NVLINK_LATENCY_S, 2 * IB_NIC_LATENCY_S)
    expected = (2 * 7 + 1) * alpha + max(2 * 7 / 8 * S / 450e9, S / 8 / 50e9)
    assert t == pytest.approx(expected, rel=1e-6)
    with pytest.raises(CollectiveError, match="topo.nvls"):
        plan_collective("all-reduce", range(8), S, crossbar(8), "nvls")


def test_gb200_nvl72_in_switch_all_reduce():
    """Issue 13 item 3: a full GB200 NVL72 rack (72 GPUs) measures 839.16 / 835.32 GB/s
    busbw at 4 GiB and 834.57 / 846.82 at 8 GiB (out of place / in place; coreweave/
    nccl-tests pull request #43). The Hopper NVLS efficiency gave 1,202 GB/s."""
    topo = build_cluster(cluster_preset("gb200-nvl72", 72))
    cal = default_calibration("gb200")
    for size, measured in ((4 << 30, 839.16e9), (8 << 30, 834.57e9)):
        row = collective_sweep("all-reduce", topo, range(72), [float(size)], None, cal)[0]
        assert row["algorithm"] == "nvls"
        assert 780e9 <= row["busbw_bytes_per_s"] <= 900e9
        assert row["busbw_bytes_per_s"] == pytest.approx(measured, rel=0.02)


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
    assert both[0] - 2 * IB_NIC_LATENCY_S == pytest.approx(9 / 8 * (alone - 2 * IB_NIC_LATENCY_S), rel=0.02)


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
    assert small["time_s"] >= 2 * 7 * 3.33e-6 * 0.999  # 14 NVLink latencies
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
    assert choose_algorithm("all-reduce", range(32), sw) == "rail-ring"
    assert choose_algorithm("all-gather", range(32), sw) == "rail-ring"
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_large_collectives_are_fast(capsys):
    topo = build_cluster(cluster_preset("dgx-h100", 1024))
    t0 = time.perf_counter()
    t_ar, plan = t_alone(topo, "all-reduce", range(1024), 1 << 30, None, default_calibration("hopper"))
    t1 = time.perf_counter()
    topo256 = build_cluster(cluster_preset("dgx-h100", 256))
    t2 = time.perf_counter()
    t_a2a, _ = t_alone(topo256, "all-to-all", range(256), 1 << 28, "direct")
    t3 = time.perf_counter()
    with capsys.disabled():
        print(
            f"\n1024-device {plan.algorithm} all-reduce: {t1 - t0:.3f} s wall "
            f"(simulated {t_ar * 1e3:.2f} ms); 256-device direct all-to-all "
            f"({256 * 255} flows): {t3 - t2:.3f} s wall (simulated {t_a2a * 1e3:.2f} ms)"
        )
    assert t1 - t0 < 10 and t3 - t2 < 10


def test_domains_keep_first_appearance_order_small_and_large():
    import random

    from simulator.network.plans import FEW_MEMBERS, split_by_domain
    from topologies import Topology

    topo = Topology(switched(2048, SwitchedNetwork(8, 450e9, 50e9, domains_per_leaf=4)))
    shuffled = random.Random(3).sample(range(2048), 4 * FEW_MEMBERS)
    for group in (shuffled, shuffled[:FEW_MEMBERS], sorted(shuffled)):  # numpy and plain paths
        expected: dict = {}
        for d in group:
            expected.setdefault(topo.domain_of(d), []).append(d)
        assert split_by_domain(group, topo) == list(expected.values())
