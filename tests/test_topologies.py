"""Chips, builders, routing and perturbations of :mod:`topologies`."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest

from topologies import (
    CHIPS,
    ChipSpec,
    PodsSpec,
    SwitchedNetwork,
    Topology,
    TopologyError,
    UnknownPresetError,
    get_chip,
    join_pods,
    switched,
    torus,
)

H100_NET = SwitchedNetwork(domain_size=8, domain_bw_bytes_per_s=450e9, nic_bw_bytes_per_s=50e9, domains_per_leaf=2)


def kinds(topo, route):
    return [topo.link_kind[link] for link in route]


def assert_contiguous(topo, route, src, dst):
    nodes = [topo.link_endpoints(link) for link in route]
    assert nodes[0][0] == topo.devices[src] and nodes[-1][1] == topo.devices[dst]
    for (_, v), (u, _) in zip(nodes, nodes[1:]):
        assert v == u


# ---- chips -----------------------------------------------------------------------------
def test_chip_catalogue_values():
    names = {"a100", "h100", "h800", "h200", "b200", "gb200", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-v7"}
    assert names <= set(CHIPS)
    h100 = get_chip("H100")
    assert h100.peak("bf16") == 989e12 and h100.peak("fp8") == 1979e12
    assert h100.peak("fp4") == 989e12  # unknown dtype falls back to bf16
    assert h100.hbm_bytes == 80e9 and h100.hbm_bw_bytes_per_s == 3.35e12
    assert h100.family == "hopper" and h100.source
    assert get_chip("a100").peak("fp8") == 312e12  # no FP8 path on Ampere
    assert get_chip("tpu-v5p").peak("fp8") == get_chip("tpu-v5p").peak("bf16") == 459e12
    assert get_chip("tpu-v7").peak("fp8") == 4614e12
    assert get_chip("tpu-v4").hbm_bytes == 32 * 2**30
    assert get_chip("b200").family == "blackwell" and get_chip("tpu-v6e").family == "tpu"
    assert all(c.source for c in CHIPS.values())
    assert hash(h100) == hash(get_chip("h100"))


def test_unknown_chip_names_field_and_allowed():
    with pytest.raises(UnknownPresetError) as err:
        get_chip("h900")
    assert err.value.field == "cluster.chip"
    assert "h900" in str(err.value) and "tpu-v5p" in str(err.value)
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)


def test_chip_validation():
    with pytest.raises(TopologyError, match="family") as err:
        ChipSpec("x", {"bf16": 1e12}, 1e9, 1e9, "volta")
    assert err.value.field == "cluster.chip.family"
    with pytest.raises(TopologyError, match="bf16"):
        ChipSpec("x", {"fp8": 1e12}, 1e9, 1e9, "hopper")


# ---- torus -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "shape, wrap, edges",
    [
        ((4, 4, 4), None, 192),  # 3 links per device
        ((2, 3), (False, False), 3 + 4),
        ((2, 4), None, 4 + 8),  # length-2 axis: one link per pair; 4-rings wrap
        ((2, 2, 2), (True, True, True), 12),
        ((5,), (True,), 5),
        ((5,), (False,), 4),
    ],
)
def test_torus_counts(shape, wrap, edges):
    G = torus(shape, 45e9, 1e-6, wrap)
    assert G.number_of_nodes() == int(np.prod(shape))
    assert G.number_of_edges() == edges
    assert G.graph["kind"] == "torus" and G.graph["shape"] == shape
    assert all(d["kind"] == "ici" and d["bw_bytes_per_s"] == 45e9 for _, _, d in G.edges(data=True))


def test_torus_numbering_and_default_wrap():
    G = torus((4, 4, 6), 90e9)
    assert G.graph["wrap"] == (True, True, False)
    node = G.nodes["d57"]  # 1 + 4*2 + 16*3
    assert node["coords"] == (1, 2, 3) and node["index"] == 57 and node["domain"] == 0
    topo = Topology(G)
    assert topo.device_at((1, 2, 3)) == 57 and topo.torus_coords(57) == (1, 2, 3)
    assert G.has_edge("d0", "d12") and not G.has_edge("d0", "d80")  # axis 1 wraps, axis 2 not


def test_torus_routes_are_dimension_ordered_shortest():
    shape, wrap = (4, 3, 5), (True, False, True)
    topo = Topology(torus(shape, 90e9, 1e-6, wrap))
    for s, t in itertools.product(range(topo.n_devices), repeat=2):
        route = topo.route(s, t)
        cs, ct = topo.torus_coords(s), topo.torus_coords(t)
        expected = 0
        for a, n in enumerate(shape):
            d = abs(cs[a] - ct[a])
            expected += min(d, n - d) if wrap[a] else d
        assert len(route) == expected
        if s == t:
            assert route == ()
            continue
        assert_contiguous(topo, route, s, t)
        axes = []
        for link in route:
            u, v = topo.link_endpoints(link)
            cu, cv = topo.graph.nodes[u]["coords"], topo.graph.nodes[v]["coords"]
            axes.append(next(a for a in range(3) if cu[a] != cv[a]))
        assert axes == sorted(axes)


def test_torus_tie_goes_positive_and_latency():
    topo = Topology(torus((4,), 45e9, 2e-6, (True,)))
    route = topo.route(0, 2)  # 2 hops either way: + wins
    assert [topo.link_endpoints(k) for k in route] == [("d0", "d1"), ("d1", "d2")]
    assert topo.path_latency_s(0, 2) == pytest.approx(4e-6)
    assert topo.route(0, 3) == (topo.link_id("d0", "d3"),)


# ---- switched --------------------------------------------------------------------------
def test_switched_counts():
    G = switched(32, H100_NET)  # 4 domains, 2 leaf groups x 8 rails
    devices = [n for n, d in G.nodes(data=True) if d["kind"] == "device"]
    assert len(devices) == 32
    assert G.number_of_nodes() == 32 + 4 + 16 + 1
    assert G.number_of_edges() == 32 + 32 + 16
    assert G.nodes["d13"]["domain"] == 1 and G.has_edge("d13", "p0.leaf0.r5")
    assert G.has_edge("d21", "p0.leaf1.r5") and G.has_edge("p0.leaf1.r5", "p0.spine")
    single = switched(8, H100_NET)
    assert single.number_of_nodes() == 9 and single.number_of_edges() == 8
    flat = switched(32, SwitchedNetwork(8, 450e9, 50e9, domains_per_leaf=2, rails=False))
    assert {"p0.leaf0", "p0.leaf1", "p0.spine"} <= set(flat)
    with pytest.raises(TopologyError) as err:
        switched(12, H100_NET)
    assert err.value.field == "cluster.devices"


def test_switched_routes_and_latencies():
    topo = Topology(switched(32, H100_NET))
    intra = topo.route(0, 5)
    assert kinds(topo, intra) == ["nvlink", "nvlink"]
    assert topo.path_latency_s(0, 5) == pytest.approx(3.33e-6)  # ISCA'25 NVLink
    same_rail = topo.route(0, 8)  # domains 0,1; group 0; rail 0
    assert kinds(topo, same_rail) == ["nic", "nic"]
    assert topo.path_latency_s(0, 8) == pytest.approx(2.8e-6)  # ISCA'25 IB same leaf
    cross_rail = topo.route(0, 9)
    assert kinds(topo, cross_rail) == ["nic", "fabric", "fabric", "nic"]
    cross_group = topo.route(0, 16)  # same rail, other group
    assert kinds(topo, cross_group) == ["nic", "fabric", "fabric", "nic"]
    assert topo.link_endpoints(cross_group[1]) == ("p0.leaf0.r0", "p0.spine")
    assert topo.path_latency_s(0, 16) == pytest.approx(3.7e-6)  # ISCA'25 IB cross leaf
    for s, t in [(0, 5), (0, 8), (0, 9), (0, 16), (31, 2)]:
        assert_contiguous(topo, topo.route(s, t), s, t)
    assert topo.domain_of(9) == 1 and topo.domain_size == 8 and topo.kind == "switched"


def test_oversubscription_sets_leaf_uplinks():
    net = SwitchedNetwork(8, 450e9, 50e9, oversubscription=2.0, domains_per_leaf=4)
    topo = Topology(switched(64, net))  # 8 domains: 2 groups of 4 domains, 8 rails
    up = topo.link_id("p0.leaf1.r3", "p0.spine")
    assert topo.link_capacity[up] == pytest.approx(4 * 50e9 / 2)
    assert topo.link_capacity[topo.link_id("p0.spine", "p0.leaf1.r3")] == pytest.approx(100e9)
    assert topo.link_capacity[topo.link_id("d0", "p0.nvsw0")] == 450e9


def test_one_leaf_group_still_has_spine():
    topo = Topology(switched(16, SwitchedNetwork(8, 450e9, 50e9)))
    assert "p0.spine" in topo.graph
    assert kinds(topo, topo.route(0, 9)) == ["nic", "fabric", "fabric", "nic"]


def test_join_pods():
    pod = switched(16, H100_NET)
    G = join_pods([pod, pod], PodsSpec(2, 6.25e9, dcn_latency_s=8e-6))
    topo = Topology(G)
    assert topo.n_devices == 32 and topo.pod_of(16) == 1 and topo.domain_of(16) == 2
    assert "p1.nvsw1" in G and "p1.spine" in G and "dcn" in G
    route = topo.route(3, 20)
    assert kinds(topo, route) == ["dcn"] * 4
    assert [topo.link_endpoints(k)[1] for k in route] == ["p0.dcn", "dcn", "p1.dcn", "d20"]
    assert topo.path_latency_s(3, 20) == pytest.approx(8e-6)
    assert topo.link_capacity[topo.link_id("p1.dcn", "dcn")] == pytest.approx(16 * 6.25e9)
    assert kinds(topo, topo.route(16, 24)) == ["nic", "nic"]  # inside pod 1
    with pytest.raises(TopologyError, match="pods"):
        join_pods([pod], PodsSpec(2, 6.25e9))


def test_torus_pods_route_inside_and_across():
    pod = torus((4, 4), 45e9, 1e-6, (True, True))
    topo = Topology(join_pods([pod, pod], PodsSpec(2, 3.125e9)))
    assert topo.torus_coords(21) == (1, 1) and topo.device_at((1, 1), pod=1) == 21
    assert len(topo.route(16, 26)) == 4 and set(kinds(topo, topo.route(16, 26))) == {"ici"}
    assert topo.route(16, 21) == (topo.link_id("d16", "d17"), topo.link_id("d17", "d21"))
    assert kinds(topo, topo.route(0, 31)) == ["dcn"] * 4


# ---- determinism and perturbations ------------------------------------------------------
def test_deterministic_ids_and_routes():
    a = Topology(switched(32, H100_NET))
    b = Topology(switched(32, H100_NET))
    pairs = [(0, 9), (3, 30), (17, 1)]
    assert [a.route(*p) for p in pairs] == [b.route(*p) for p in pairs]
    assert a.link_kind == b.link_kind and np.array_equal(a.link_capacity, b.link_capacity)
    assert a.n_links == 2 * a.graph.number_of_edges()
    # insertion order does not matter
    G = nx.Graph()
    G.graph.update(a.graph.graph)
    G.add_nodes_from(reversed(list(a.graph.nodes(data=True))))
    G.add_edges_from(reversed(list(a.graph.edges(data=True))))
    c = Topology(G)
    assert [c.route(*p) for p in pairs] == [a.route(*p) for p in pairs]
    assert all(c.link_endpoints(k) == a.link_endpoints(k) for k in range(a.n_links))


def test_failed_link_reroutes_torus():
    topo = Topology(torus((4, 4), 45e9, 1e-6, (True, True)))
    failed = topo.without_link("d0", "d1")
    route = failed.route(0, 1)
    hops = [failed.link_endpoints(k) for k in route]
    assert len(route) == 3 and ("d0", "d1") not in hops
    assert_contiguous(failed, route, 0, 1)
    assert failed.n_links == topo.n_links - 2
    # pairs that never used the link keep their dimension-order route
    assert [failed.link_endpoints(k) for k in failed.route(5, 7)] == [topo.link_endpoints(k) for k in topo.route(5, 7)]
    assert topo.route(0, 1) == (topo.link_id("d0", "d1"),)  # original untouched


def test_failed_link_reroutes_switched():
    topo = Topology(switched(32, H100_NET))
    failed = topo.without_link("d0", "p0.leaf0.r0")
    route = failed.route(0, 8)
    assert ("d0", "p0.leaf0.r0") not in [failed.link_endpoints(k) for k in route]
    assert_contiguous(failed, route, 0, 8)
    assert kinds(failed, failed.route(1, 9)) == ["nic", "nic"]


def test_failed_link_that_disconnects_raises():
    line = Topology(torus((3,), 45e9, 1e-6, (False,)))
    with pytest.raises(TopologyError, match="d1") as err:
        line.without_link("d1", "d2")
    assert "d2" in str(err.value) and err.value.field == "perturbations.link"
    with pytest.raises(TopologyError, match="no link"):
        line.without_link("d0", "d2")


def test_degraded_link():
    topo = Topology(switched(32, H100_NET))
    slow = topo.with_link_scaled("d3", "p0.leaf0.r3", 0.5)
    for u, v in [("d3", "p0.leaf0.r3"), ("p0.leaf0.r3", "d3")]:
        assert slow.link_capacity[slow.link_id(u, v)] == pytest.approx(25e9)
    assert slow.route(3, 11) == topo.route(3, 11)
    assert topo.link_capacity[topo.link_id("d3", "p0.leaf0.r3")] == 50e9
    with pytest.raises(TopologyError, match="bw_scale"):
        topo.with_link_scaled("d3", "p0.leaf0.r3", 0.0)


# ---- validation --------------------------------------------------------------------------
def _two_devices(**edge):
    G = nx.Graph()
    G.add_node("d0", kind="device", index=0)
    G.add_node("d1", kind="device", index=1)
    attrs = {"bw_bytes_per_s": 1e9, "latency_s": 1e-6, "kind": "nic"}
    attrs.update(edge)
    G.add_edge("d0", "d1", **{k: v for k, v in attrs.items() if v is not None})
    return G


def test_graph_validation_messages():
    custom = Topology(_two_devices())
    assert custom.kind == "custom" and custom.route(0, 1) == (0,)
    with pytest.raises(TopologyError, match=r"\('d0', 'd1'\).*bw_bytes_per_s"):
        Topology(_two_devices(bw_bytes_per_s=0.0))
    with pytest.raises(TopologyError, match="lacks the 'latency_s'"):
        Topology(_two_devices(latency_s=None))
    G = _two_devices()
    G.add_node("d2", kind="device", index=2)
    with pytest.raises(TopologyError, match="device 'd2' is unreachable"):
        Topology(G)
    with pytest.raises(TopologyError, match="device index"):
        custom.route(0, 5)


# ---- batch routing ---------------------------------------------------------------------
def _batch_cases():
    pod = switched(32, H100_NET)
    flat = SwitchedNetwork(8, 450e9, 50e9, domains_per_leaf=2, rails=False)
    yield "switched", Topology(pod)
    yield "flat-leaves", Topology(switched(32, flat))
    yield "pods", Topology(join_pods([pod, pod], PodsSpec(2, 6.25e9)))
    yield "failed-link", Topology(pod).without_link("d0", "p0.leaf0.r0")
    yield "torus", Topology(torus((4, 4), 45e9, 1e-6, (True, True)))


@pytest.mark.parametrize("name,topo", list(_batch_cases()), ids=lambda x: x if isinstance(x, str) else "")
def test_batch_routes_equal_one_by_one(name, topo):
    import simpy

    from simulator.network.calibration import NetCalibration
    from simulator.network.flows import FlowNetwork

    n = topo.n_devices
    src, dst = np.divmod(np.arange(n * n), n)  # every ordered pair, self-pairs included
    links = topo.routes(src, dst)
    cal = NetCalibration(message_overhead_s={"nvlink": 1.3e-6, "nic": 2.1e-6, "fabric": 0.7e-6, "ici": 1.1e-6})
    net = FlowNetwork(simpy.Environment(), topo, cal)
    links2, latency = net.routes(src, dst)
    assert (links2 == links).all()
    few, few_latency = net.routes(src[:40], dst[:40])  # one by one, through route()
    assert (few == links[:40, : few.shape[1]]).all() and (links[:40, few.shape[1] :] == -1).all()
    assert (few_latency == latency[:40]).all()
    for i, (s, d) in enumerate(zip(src.tolist(), dst.tolist())):
        route = topo.route(s, d)
        assert tuple(links[i, : len(route)].tolist()) == route and (links[i, len(route) :] == -1).all()
        _, lat, ovh = net.route(s, d)
        assert latency[i] == lat + ovh  # exactly, not approximately
    with pytest.raises(TopologyError, match="device index"):
        topo.routes([0], [n])
