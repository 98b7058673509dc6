"""Partly filled scale-up domains (issue 14 item 6): 128 GPUs on GB200 NVL72 racks.

Ranks fill one domain before the next; ``cluster.devices_per_domain`` (or, without
it, the fewest domains filled equally) sets how many devices of each domain are used.
"""

from __future__ import annotations

import pytest
from helpers import scenario

from simulator import simulate
from simulator.scenario.loading import load_scenario
from simulator.scenario.schema import ScenarioError
from simulator.scenario.serialise import scenario_to_dict
from simulator.studies.bench import collective_time_s
from topologies import TopologyError
from topologies.presets import build_cluster, cluster_preset


def kinds(topo, route):
    return [topo.link_kind[link] for link in route]


def test_128_gpus_on_nvl72_are_two_racks_of_64():
    spec = cluster_preset("gb200-nvl72", 128)
    assert spec.devices_per_domain == 64 and spec.network.domain_size == 64
    topo = build_cluster(spec)
    assert topo.n_devices == 128 and topo.domain_size == 64
    # ranks fill rack 0 (devices 0..63) before rack 1 (64..127)
    assert [topo.domain_of(i) for i in (0, 63, 64, 127)] == [0, 0, 1, 1]
    nvswitches = [n for n in topo.graph if str(n).startswith("p0.nvsw")]
    assert sorted(nvswitches) == ["p0.nvsw0", "p0.nvsw1"]
    counts = {k: topo.link_kind.count(k) // 2 for k in set(topo.link_kind)}
    assert counts["nvlink"] == 128 and counts["nic"] == 128
    # the same as asking for it explicitly
    explicit = cluster_preset("gb200-nvl72", 128, devices_per_domain=64)
    assert explicit == spec


def test_fill_rule_without_devices_per_domain():
    assert cluster_preset("gb200-nvl72", 100).devices_per_domain == 50  # 2 racks of 50
    assert cluster_preset("gb200-nvl72", 144).devices_per_domain is None  # 2 whole racks
    assert cluster_preset("gb200-nvl72", 64).devices_per_domain is None  # within one rack
    assert cluster_preset("dgx-h100", 12).devices_per_domain == 6  # 2 nodes of 6
    # 146 = 2 x 73: not 2 racks filled equally; refused, pointing at the setting
    with pytest.raises(TopologyError, match="devices_per_domain .*largest: 2, on 73 domains") as err:
        cluster_preset("gb200-nvl72", 146)
    assert err.value.field == "cluster.devices"


def test_devices_per_domain_checks():
    four = cluster_preset("gb200-nvl72", 128, devices_per_domain=32)
    assert four.network.domain_size == 32 and build_cluster(four).domain_of(127) == 3
    for bad, field in [
        (dict(devices_per_domain=80), "at most domain_size 72"),
        (dict(devices_per_domain=48), "do not fill domains of 48 equally"),
        (dict(devices_per_domain=0), "integer >= 1"),
    ]:
        with pytest.raises(TopologyError, match=field) as err:
            cluster_preset("gb200-nvl72", 128, **bad)
        assert err.value.field == "cluster.devices_per_domain"
    with pytest.raises(ScenarioError, match="cluster.devices_per_domain: applies to switched"):
        load_scenario(
            scenario(
                cluster={"preset": "tpu-v5p", "devices": 16, "devices_per_domain": 8},
                parallel={"tp": 2, "pp": 2, "dp": 4},
            )
        )


def test_intra_rack_traffic_on_nvlink_and_cross_rack_on_nics():
    topo = build_cluster(cluster_preset("gb200-nvl72", 128, devices_per_domain=64))
    assert kinds(topo, topo.route(0, 63)) == ["nvlink", "nvlink"]
    # device 64 is local index 0 of rack 1: same rail (leaf p0.leaf0.r0) as device 0
    assert kinds(topo, topo.route(0, 64)) == ["nic", "nic"]
    # another rail: up through the spine
    assert kinds(topo, topo.route(1, 64)) == ["nic", "fabric", "fabric", "nic"]

    # An all-reduce inside rack 0 runs on the NVSwitch (NVLS) exactly as on a full
    # 72-GPU rack using 64 of its GPUs: the idle GPUs change nothing.
    full = build_cluster(cluster_preset("gb200-nvl72", 72))
    t_part, alg_part = collective_time_s("all-reduce", topo, range(64), 1e9)
    t_full, alg_full = collective_time_s("all-reduce", full, range(64), 1e9)
    assert alg_part == alg_full == "nvls"
    assert t_part == pytest.approx(t_full, rel=1e-12)

    # Between the racks the bytes cross the 400 Gb/s NICs (50e9 B/s per GPU, per direction;
    # NVIDIA GB200 NVL72 datasheet): a 2-rank ring all-reduce of S bytes sends S per rank,
    # S / 50e9 = 20 ms for 1 GB, plus microseconds of latency.
    t_x, alg_x = collective_time_s("all-reduce", topo, [0, 64], 1e9)
    assert alg_x == "ring"
    assert t_x == pytest.approx(1e9 / 50e9, rel=0.01)
    # every member of both racks: a two-level algorithm (NVLink inside a rack, rails across)
    _, alg_all = collective_time_s("all-reduce", topo, range(128), 1e6)
    assert alg_all in ("hierarchical", "rail-ring")


def test_partial_rack_scenario_round_trips():
    sc = load_scenario(
        scenario(
            cluster={"preset": "gb200-nvl72", "devices": 128, "devices_per_domain": 64},
            parallel={"tp": 4, "pp": 2, "dp": 16},
        )
    )
    d = scenario_to_dict(sc)
    assert d["cluster"]["devices_per_domain"] == 64 and d["cluster"]["network"]["domain_size"] == 64
    assert scenario_to_dict(load_scenario(d)) == d
    assert sc.workload().domain_size == 64


def test_partial_domains_fast_path_equals_exact():
    # 12 H100 as 3 nodes of 4 (of 8): tp pairs inside a node, data parallelism across nodes.
    sc = scenario(
        cluster={"preset": "dgx-h100", "devices": 12, "devices_per_domain": 4},
        parallel={"tp": 2, "pp": 2, "dp": 3},
        training={"global_batch_size": 6},
    )
    fast = simulate(sc)
    exact = simulate(sc, exact=True)
    assert fast.summary["simulated_ranks"] < exact.summary["simulated_ranks"] == 12
    assert fast.summary["step_time_s"] == pytest.approx(exact.summary["step_time_s"], rel=1e-9)
    assert fast.summary["peak_memory_bytes"] == pytest.approx(exact.summary["peak_memory_bytes"], rel=1e-9)
