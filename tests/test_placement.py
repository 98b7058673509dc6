"""Placement: the scenario's ``placement:`` block, the domains a run uses and leaves idle, the
devices per domain that align a layout's groups, and the search trying them."""

from __future__ import annotations

import numpy as np
import pytest
from test_moe import TINY_MOE, moe_scenario

from simulator import simulate
from simulator.scenario.loading import load_scenario
from simulator.scenario.schema import ScenarioError
from simulator.scenario.serialise import scenario_to_dict
from simulator.studies.search import search
from simulator.studies.search.layouts import SearchBounds, aligned_placement, enumerate_layouts
from topologies.placement import aligned_devices_per_domain, domain_usage, groups_aligned
from workloads.layout import ParallelLayout

DENSE = {
    "name": "placed",
    "model": "llama3-8b",
    "cluster": {"preset": "gb200-nvl72", "devices": 128},
    "parallel": {"tp": 8, "pp": 1},
    "training": {"seq_len": 2048, "global_batch_size": 16},
}


def test_placement_block_is_the_cluster_key_it_names():
    by_cluster = {**DENSE, "cluster": {**DENSE["cluster"], "devices_per_domain": 32}}
    by_placement = {**DENSE, "placement": {"devices_per_domain": 32}}
    a, b = simulate(by_cluster).summary, simulate(by_placement).summary
    assert a["step_time_s"] == b["step_time_s"]  # bit for bit
    assert b["placement"] == {"devices_per_domain": 32, "domain_capacity": 72, "domains": 4, "spare_devices": 160}
    tile = {
        "name": "t",
        "model": "llama3-8b",
        "cluster": {"preset": "tpu-v5p", "devices": 64},
        "parallel": {"tp": 4},
        "training": {"seq_len": 2048, "global_batch_size": 16},
    }
    assert load_scenario({**tile, "placement": {"tile": [4, 4, 4]}}).cluster.network.tile == (4, 4, 4)


@pytest.mark.parametrize(
    "placement, cluster, field, words",
    [
        ({"devices_per_domain": 60}, {}, "placement.devices_per_domain", "do not fill domains of 60"),
        ({"devices_per_domain": 80}, {}, "placement.devices_per_domain", "at most domain_size 72"),
        ({"devices_per_domain": 64}, {"devices_per_domain": 32}, "placement.devices_per_domain", "one place"),
        ({"tile": [2, 2]}, {}, "placement.tile", "applies to a torus"),
        ({"segment": 16}, {}, "placement.segment", "unknown key"),
    ],
)
def test_bad_placements_name_the_field(placement, cluster, field, words):
    sc = {**DENSE, "cluster": {**DENSE["cluster"], **cluster}, "placement": placement}
    with pytest.raises(ScenarioError) as e:
        load_scenario(sc)
    assert e.value.field == field and words in str(e.value)


def test_domains_used_spare_devices_and_throughput_per_domain():
    full = simulate(
        {
            **DENSE,
            "cluster": {"preset": "gb200-nvl72", "devices": 144},
            "parallel": {"tp": 8, "pp": 2},
            "training": {"seq_len": 2048, "global_batch_size": 18},
        }
    )
    s = full.summary
    assert s["placement"] == {"devices_per_domain": 72, "domain_capacity": 72, "domains": 2, "spare_devices": 0}
    assert s["tokens_per_s_per_domain"] == pytest.approx(s["tokens_per_s"] / 2, rel=1e-12)
    # 128 GPUs fill two racks with 64 each by default (8 idle in each)
    u = domain_usage(load_scenario(DENSE).cluster)
    assert (u.devices_per_domain, u.domains, u.spare_devices, u.label) == (64, 2, 16, "64/72 per domain")
    tpu = load_scenario(
        {**DENSE, "cluster": {"preset": "tpu-v5p", "devices": 64}, "parallel": {"tp": 4}, "name": "tpu"}
    )
    assert domain_usage(tpu.cluster) is None
    small = load_scenario({**DENSE, "cluster": {"preset": "gb200-nvl72", "devices": 16}, "parallel": {"tp": 8}})
    assert domain_usage(small.cluster).as_dict() == {
        "devices_per_domain": 16,
        "domain_capacity": 72,
        "domains": 1,
        "spare_devices": 56,
    }


def test_scenario_json_keeps_the_racks_capacity():
    sc = load_scenario({**DENSE, "placement": {"devices_per_domain": 32}})
    d = scenario_to_dict(sc)
    assert d["cluster"]["network"]["domain_size"] == 32 and d["cluster"]["devices_per_domain"] == 32
    assert d["cluster"]["domain_capacity"] == 72
    again = load_scenario({**d, "name": "again"})
    assert (again.cluster.domain_capacity, again.cluster.network.domain_size) == (72, 32)


def test_groups_aligned_closed_forms():
    ep64 = ParallelLayout(dp=2304, ep=64).group_table("ep")
    assert not groups_aligned([ep64], 72)  # 0-63, 64-127 straddles 8 + 56, ...
    assert groups_aligned([ep64], 64) and groups_aligned([ep64], 32)  # inside a domain / two whole
    assert aligned_devices_per_domain([ep64], 72, 2304) == 64
    ep48 = ParallelLayout(dp=144, ep=48).group_table("ep")  # 48, 24 + 24, 48 on two NVL72 racks
    assert not groups_aligned([ep48], 72) and aligned_devices_per_domain([ep48], 72, 144) == 48
    ep128 = ParallelLayout(dp=2304, ep=128).group_table("ep")  # 2 x 64: two whole 64-GPU domains
    assert aligned_devices_per_domain([ep128], 72, 2304) == 64
    ep8 = ParallelLayout(dp=2304, ep=8).group_table("ep")
    assert groups_aligned([ep8], 72)  # 9 groups a rack
    # no count aligns: the only divisors of 9 devices per pod are 1, 3, 9 > capacity 2 ... 1 aligns
    assert aligned_devices_per_domain([np.arange(9).reshape(3, 3)], 2, 9) == 1


def test_search_tries_the_aligned_placement_and_reports_it_per_domain():
    # EP48 on 144 GB200 (tiny MoE): whole racks leave the middle EP group split 24 + 24 over
    # the NICs; 48 per rack keeps every group in one rack on 3 racks (72 idle GPUs).
    model = {**TINY_MOE, "hidden": 512, "ffn_hidden": 1024, "moe": {**TINY_MOE["moe"], "experts": 48}}
    sc = moe_scenario(
        model=model,
        cluster={"preset": "gb200-nvl72", "devices": 144},
        parallel={"tp": 1, "pp": 1, "dp": 144, "ep": 48},
        training={"seq_len": 1024, "micro_batch_size": 1, "global_batch_size": 144},
    )
    s0 = load_scenario(sc)
    p = {"tp": 1, "cp": 1, "pp": 1, "dp": 144, "ep": 48, "vpp": 1}
    assert aligned_placement(s0, p) == 48
    assert aligned_placement(s0, {**p, "ep": 24}) is None  # 3 groups a rack: aligned already
    bounds = SearchBounds(max_tp=1, max_pp=1, schedules=("1f1b",), recompute=("none",), max_ep=48)
    bounds = SearchBounds(**{**bounds.__dict__, "estimate_margin": None})
    layouts = [x for x in enumerate_layouts(s0, bounds) if x["ep"] == 48]
    assert [x["devices_per_domain"] for x in layouts] == [None, 48]
    res = search(sc, bounds=bounds, jobs=1)
    t = res.table.set_index("label")
    whole, aligned = (
        t.loc["tp1-pp1-dp144-ep48-1f1b-z1-mb1-none"],
        t.loc["tp1-pp1-dp144-ep48-1f1b-z1-mb1-none-48perdomain"],
    )
    assert aligned["devices_per_domain"] == 48 and aligned["step_time_s"] < whole["step_time_s"]
    # per domain: 3 racks against 2
    assert aligned["tokens_per_s_per_domain"] == pytest.approx(aligned["tokens_per_s"] / 3)
    assert whole["tokens_per_s_per_domain"] == pytest.approx(whole["tokens_per_s"] / 2)
    assert res.best_per_domain is not None and "per domain" in res.to_text()
