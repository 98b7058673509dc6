"""The fast path (one representative rank per pipeline stage, twin traffic on the
network) against the full per-device simulation, and symmetry broken on purpose."""

from __future__ import annotations

import pytest
from helpers import ideal_scenario, scenario
from test_mla_tp import TINY_MLA
from test_moe import moe_scenario

from simulator import simulate
from workloads.schedules import schedule

CASES = {
    "1f1b": scenario(cluster={"preset": "dgx-h100", "devices": 16}, parallel={"tp": 2, "pp": 2, "dp": 4}),
    "gpipe-zero3": scenario(
        cluster={"preset": "dgx-h100", "devices": 16}, parallel={"tp": 2, "pp": 2, "dp": 4, "zero": 3}, schedule="gpipe"
    ),
    "interleaved": scenario(
        cluster={"preset": "dgx-h100", "devices": 16},
        parallel={"tp": 2, "pp": 2, "dp": 4, "vpp": 2},
        schedule="interleaved-1f1b",
    ),
    "zb-h1": scenario(
        cluster={"preset": "dgx-h100", "devices": 16}, parallel={"tp": 2, "pp": 2, "dp": 4}, schedule="zb-h1"
    ),
    "dualpipe": scenario(
        cluster={"preset": "dgx-h100", "devices": 16}, parallel={"tp": 2, "pp": 2, "dp": 4}, schedule="dualpipe"
    ),
    "moe-ep": moe_scenario(),
    "torus": scenario(cluster={"preset": "tpu-v5p", "devices": 16}, parallel={"tp": 2, "pp": 2, "dp": 4}),
    # multi-latent attention with column-parallel down projections, and MoE routing the SP shard
    "mla-column-moe": moe_scenario(
        model={**TINY_MLA, "moe": {"experts": 16, "top_k": 2, "expert_ffn_hidden": 512, "dense_layers": 1}},
        parallel={"tp": 2, "pp": 2, "dp": 4, "ep": 4, "mla_down_proj": "column"},
    ),
    "zero0-cp": scenario(
        cluster={"preset": "dgx-h100", "devices": 16}, parallel={"tp": 2, "cp": 2, "pp": 2, "dp": 2, "zero": 0}
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_fast_path_equals_exact(name):
    fast = simulate(CASES[name])
    exact = simulate(CASES[name], exact=True)
    assert fast.summary["simulated_ranks"] < exact.summary["simulated_ranks"]
    assert fast.summary["step_time_s"] == pytest.approx(exact.summary["step_time_s"], rel=1e-9)
    assert fast.summary["peak_memory_bytes"] == pytest.approx(exact.summary["peak_memory_bytes"], rel=1e-9)
    assert fast.summary["bubble_fraction"] == pytest.approx(exact.summary["bubble_fraction"], rel=1e-6, abs=1e-12)


def test_straggler_slows_the_step_as_its_stage_critical_path_predicts():
    pp, dp, m = 4, 2, 8
    base = ideal_scenario(pp * dp, parallel={"tp": 1, "pp": pp, "dp": dp}, training={"global_batch_size": m * dp})
    res = simulate(base)
    ev = res.events
    one = ev[(ev["stage"] == 1) & (ev["mb"] == 0) & (ev["kind"] == "compute")]
    f = one.loc[one["phase"] == "F", "duration_s"].sum()
    b = one.loc[one["phase"] == "B", "duration_s"].sum()
    slow_dev = res.scenario.layout.rank_of(pp=1, dp=1)
    straggled = simulate({**base, "perturbations": [{"devices": [slow_dev], "compute_scale": 0.5}]})
    assert straggled.summary["exact"]
    durations = [{"F": f, "B": b}] * pp
    durations[1] = {"F": 2 * f, "B": 2 * b}
    from workloads.schedule_timing import run_schedule

    predicted = run_schedule([schedule("1f1b", r, pp, m) for r in range(pp)], durations, m).makespan
    assert straggled.summary["step_time_s"] == pytest.approx(predicted, rel=0.01)
    assert straggled.summary["step_time_s"] > 1.3 * res.summary["step_time_s"]


def test_failed_fat_tree_uplink_reroutes_traffic():
    sc = scenario(
        cluster={"preset": "dgx-h100", "devices": 16, "network": {"domains_per_leaf": 1}},
        parallel={"tp": 1, "pp": 1, "dp": 16},
    )
    base = simulate(sc)
    failed = simulate({**sc, "perturbations": [{"link": ["p0.leaf0.r0", "p0.spine"], "failed": True}]})
    topo = failed.topology
    path = [topo.link_endpoints(l) for l in topo.route(0, 8)]
    assert ("p0.leaf0.r0", "p0.spine") not in path and path[0] == ("d0", "p0.nvsw0")
    assert failed.summary["step_time_s"] >= base.summary["step_time_s"]
    degraded = simulate({**sc, "perturbations": [{"link": ["p0.leaf0.r0", "p0.spine"], "bw_scale": 0.1}]})
    assert degraded.summary["step_time_s"] > base.summary["step_time_s"]


@pytest.mark.parametrize("name", ["1f1b", "dualpipe", "moe-ep", "torus"])
def test_reserved_isolated_phases_equal_flow_by_flow(name):
    """The network's isolated-phase fast path changes no figure of a whole step."""
    from helpers import assert_same_run, rerun_engine

    res = simulate(CASES[name])
    _, fast = rerun_engine(res)
    _, slow = rerun_engine(res, reserve_isolated=False)
    assert fast.step_time_s == res.raw.step_time_s
    assert_same_run(fast, slow)
    assert fast.network_stats["reserved_phases"] > 0 == slow.network_stats["reserved_phases"]
