"""Where representative mode's symmetry fails: groups of a stage split unlike one another over
the scale-up domains (simulator.engine.symmetry), found, noted, and measured against --exact."""

from __future__ import annotations

import pytest
from helpers import scenario
from test_moe import TINY_MOE

from simulator import simulate
from simulator.engine.symmetry import class_ranks, rank_classes, representative_position, uneven_groups
from simulator.scenario.loading import load_scenario
from topologies.presets import build_cluster
from workloads.trace.builder import build_trace


def _moe(experts: int, cluster: dict, parallel: dict, gbs: int) -> dict:
    model = dict(TINY_MOE, hidden=2048, ffn_hidden=8192, moe={**TINY_MOE["moe"], "experts": experts})
    return scenario(
        model=model,
        cluster=cluster,
        parallel=parallel,
        training={"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": gbs},
    )


def _uneven(sc: dict) -> dict:
    s = load_scenario(sc)
    return uneven_groups(s.layout, build_cluster(s.cluster))


def test_groups_that_straddle_domains_unevenly_are_found():
    nvl = {"preset": "gb200-nvl72", "devices": 144}
    # EP48 over two 72-GPU domains: groups 0-47, 48-95 (24 + 24), 96-143
    assert _uneven(_moe(48, nvl, {"tp": 1, "pp": 1, "dp": 144, "ep": 48}, 144)) == {"ep": [(24, 24), (48,)]}
    # TP2 x EP8 spans 16 ranks of 12-GPU domains: 6 + 2, 4 + 4, 2 + 6 (a group and its mirror alike)
    h12 = {"preset": "dgx-h100", "devices": 48, "network": {"domain_size": 12}}
    assert _uneven(_moe(16, h12, {"tp": 2, "pp": 1, "dp": 24, "ep": 8, "expert_mapping": "deepspeed"}, 48)) == {
        "ep": [(4, 4), (6, 2)]
    }
    # aligned: EP8 x TP2 = two whole 8-GPU domains; EP72 = one NVL72 domain; a torus has no domains
    h8 = {"preset": "dgx-h100", "devices": 64}
    assert _uneven(_moe(16, h8, {"tp": 2, "pp": 2, "dp": 16, "ep": 8}, 32)) == {}
    assert _uneven(_moe(72, nvl, {"tp": 1, "pp": 1, "dp": 144, "ep": 72}, 144)) == {}
    tpu = {"preset": "tpu-v5p", "devices": 64}
    assert _uneven(_moe(16, tpu, {"tp": 1, "pp": 1, "dp": 64, "ep": 16}, 64)) == {}


def test_uneven_groups_are_simulated_one_rank_per_class():
    """EP48 on 144 GB200: the group 48-95 straddles both NVL72 domains and crosses the NICs; the
    groups 0-47 and 96-143 stay inside one. One rank per class of ranks whose groups lie alike
    (symmetry.rank_classes) is simulated, each weighted by its class: the step, the exposed
    communication averaged over every device and the peak memory are --exact's (with rank 0
    alone the step was 13.8 ms, as if no group crossed the NICs; with rank 48 alone the
    exposed share was the straddling group's, 0.55 against 0.41). An aligned EP (EP8) keeps
    one rank per stage and is not noted."""
    nvl = {"preset": "gb200-nvl72", "devices": 144}
    sc = _moe(48, nvl, {"tp": 1, "pp": 1, "dp": 144, "ep": 48}, 288)
    s = load_scenario(sc)
    topo = build_cluster(s.cluster)
    assert representative_position(s.layout, topo) == 48
    classes = rank_classes(s.layout, topo)
    assert class_ranks(s.layout, classes) == ([0, 24, 48], {0: 48, 24: 48, 48: 48})
    res = simulate(sc)
    rep, exact = res.summary, simulate(sc, exact=True).summary
    assert res.trace.ranks == (0, 24, 48) and res.trace.representative
    assert any("straddle scale-up domains unevenly" in n and "3 ranks are simulated" in n for n in rep["notes"])
    assert not any("straddle" in n for n in exact["notes"])
    for key in ("step_time_s", "exposed_comm_fraction", "bubble_fraction", "peak_memory_bytes"):
        assert rep[key] == pytest.approx(exact[key], rel=1e-9), key
    assert 0.0215 < exact["step_time_s"] < 0.0235
    first = simulate(s, trace=build_trace(s.workload())).summary["step_time_s"]  # rank 0 alone
    assert first < 0.7 * exact["step_time_s"]
    aligned = _moe(48, nvl, {"tp": 1, "pp": 1, "dp": 144, "ep": 8}, 288)
    a, b = simulate(aligned), simulate(aligned, exact=True).summary
    assert a.trace.ranks == (0,) and a.summary["step_time_s"] == b["step_time_s"]
    assert not any("straddle" in n for n in a.summary["notes"])
