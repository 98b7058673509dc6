"""Mixture-of-experts: expert parallelism, load imbalance, aux-loss schedule constraint."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import rerun_engine, scenario

from simulator import load_scenario, simulate
from workloads.moe_load import ExpertLoad, rank_load_factors

TINY_MOE = {
    "name": "tiny-moe",
    "layers": 4,
    "hidden": 1024,
    "heads": 8,
    "kv_heads": 8,
    "ffn_hidden": 4096,
    "vocab": 8,
    "moe": {"experts": 16, "top_k": 2, "expert_ffn_hidden": 1024, "shared_experts": 1, "dense_layers": 1},
}


def moe_scenario(**over):
    base = scenario(
        model=dict(TINY_MOE),
        cluster={"preset": "dgx-h100", "devices": 16},
        parallel={"tp": 1, "pp": 2, "dp": 8, "ep": 8},
        training={"seq_len": 1024, "micro_batch_size": 1, "global_batch_size": 16},
    )
    for k, v in over.items():
        base[k] = {**base[k], **v} if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return base


def test_balanced_load_factors_are_one():
    f = rank_load_factors(ExpertLoad(), 16, 2, 8, 1024, 3)
    assert np.all(f == 1.0)


def test_skewed_load_is_seeded_and_capped():
    a = rank_load_factors(ExpertLoad("zipf", 1.2, None, seed=3), 64, 8, 8, 4096, 5)
    b = rank_load_factors(ExpertLoad("zipf", 1.2, None, seed=3), 64, 8, 8, 4096, 5)
    assert np.array_equal(a, b)
    assert np.allclose(a.mean(axis=1), 1.0)
    assert a.max() > 1.2
    capped = rank_load_factors(ExpertLoad("zipf", 1.2, 1.25, seed=3), 64, 8, 8, 4096, 5)
    assert capped.max() <= 1.25 + 1e-12


def test_ep_all_to_all_appears_and_imbalance_slows_the_step():
    res = simulate(moe_scenario())
    ev = res.events
    assert (ev["coll"] == "all-to-all").any()
    assert set(ev.loc[ev["coll"] == "all-to-all", "axis"]) == {"ep"}
    skewed = simulate(moe_scenario(training={"expert_load": {"distribution": "zipf", "skew": 1.5, "seed": 1}}))
    assert skewed.summary["step_time_s"] > res.summary["step_time_s"]


def test_global_aux_loss_forces_all_forward_first():
    """Activation memory on the first stage grows with m under aux-loss-global and stays
    bounded by p under aux-free with 1F1B."""
    peaks = {}
    for balance in ("aux-free", "aux-loss-global"):
        for m in (4, 8):
            sc = moe_scenario(training={"global_batch_size": 8 * m, "balance": balance})
            res = simulate(sc)
            stage0 = res.memory[res.memory["stage"] == 0]
            peaks[(balance, m)] = stage0["activations"].max()
            if balance == "aux-loss-global":
                assert res.summary["schedule_enforced"] == "all-forward-first"
            else:
                assert res.summary["schedule_enforced"] is None
    assert peaks[("aux-loss-global", 8)] == pytest.approx(2 * peaks[("aux-loss-global", 4)], rel=1e-9)
    assert peaks[("aux-free", 8)] == pytest.approx(peaks[("aux-free", 4)], rel=1e-9)
    assert peaks[("aux-loss-global", 8)] > 3 * peaks[("aux-free", 8)]


def test_node_limited_dispatch_is_two_hops_and_cuts_scale_out_traffic():
    """DeepSeek-V3's node-limited routing (§2.1.2): tokens cross InfiniBand once per
    destination node (at most M nodes), then fan out over NVLink, both hops pipelined in
    one all-to-all (§3.2.2)."""
    from simulator.network.collectives import plan_collective

    model = {**TINY_MOE, "moe": {**TINY_MOE["moe"], "top_k": 4, "max_nodes_per_token": 1}}
    sc = moe_scenario(model=model, parallel={"tp": 1, "pp": 1, "dp": 16, "ep": 16})
    res = simulate(sc)
    a2a = [op for op in res.trace.ops if op.coll == "all-to-all"]
    assert a2a and {op.axis for op in a2a} == {"ep"} and {len(op.group) for op in a2a} == {16}
    # M = 1 node per token (two 8-GPU nodes): the rail hop carries 1/top_k of the copies
    assert {op.scaleout_fraction for op in a2a} == {0.25}
    plan = plan_collective("all-to-all", a2a[0].group, 1.6e6, res.topology, scaleout_fraction=0.25)
    assert plan.algorithm == "hierarchical-a2a" and len(plan.phases) == 1
    rail = {t.size_bytes for t in plan.phases[0].transfers if t.src // 8 != t.dst // 8}
    nvlink = {t.size_bytes for t in plan.phases[0].transfers if t.src // 8 == t.dst // 8}
    # hierarchical-a2a without node limit: k S/n = S/2 to the rail peer, m S/n = S/8 per NVLink peer
    assert sorted(rail) == pytest.approx([0.25 * 1.6e6 / 2]) and sorted(nvlink) == pytest.approx([1.6e6 / 8])
    unlimited = simulate(
        moe_scenario(
            parallel={"tp": 1, "pp": 1, "dp": 16, "ep": 16}, model={**TINY_MOE, "moe": {**TINY_MOE["moe"], "top_k": 4}}
        )
    )
    assert res.summary["step_time_s"] < unlimited.summary["step_time_s"]
    exact = simulate(sc, exact=True)
    assert exact.summary["step_time_s"] == pytest.approx(res.summary["step_time_s"], rel=1e-9)
    # trace files keep the fraction (and reject one outside (0, 1])
    from workloads.trace.io import trace_from_dict, trace_to_dict
    from workloads.trace.ops import TraceError

    data = trace_to_dict(res.trace)
    back = trace_from_dict(data)
    assert [op.scaleout_fraction for op in back.ops] == [op.scaleout_fraction for op in res.trace.ops]
    i = next(i for i, d in enumerate(data["ops"]) if d.get("coll") == "all-to-all")
    data["ops"][i]["scaleout_fraction"] = 1.5
    with pytest.raises(TraceError, match=rf"ops\[{i}\]\.scaleout_fraction"):
        trace_from_dict(data)


def test_node_limited_quotient_agrees_with_the_full_plan():
    """In representative mode a node-limited all-to-all runs as the representative's own
    rail sends and receives and its own NVLink sends, the other transfers folded in as
    their images (simulator.engine.loop); with DualPipe's pipeline sends on the same NICs it
    must give the step of its full hierarchical-a2a plan (every transfer of the EP group,
    twin groups quotiented)."""
    model = {**TINY_MOE, "moe": {**TINY_MOE["moe"], "top_k": 4, "max_nodes_per_token": 1}}
    sc = moe_scenario(
        model=model,
        cluster={"preset": "dgx-h100", "devices": 32},
        parallel={"tp": 1, "pp": 2, "dp": 16, "ep": 16},
        schedule="dualpipe",
        training={"global_batch_size": 64},
    )
    from simulator.engine.compute import calibration_for
    from simulator.engine.loop import Engine

    fast = simulate(sc)
    chip = fast.scenario.cluster.chip

    (_, pieces), (_, full) = rerun_engine(fast), rerun_engine(fast, a2a_quotient=False)
    assert pieces.step_time_s == fast.summary["step_time_s"]
    assert pieces.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    assert pieces.network_stats["flows_started"] < 0.5 * full.network_stats["flows_started"]
    # one phase of 2 steps: 2 (m-1) = 2 rail flows and the k-1 = 7 NVLink sends, whose images
    # load the same links, as one flow of weight 7, instead of the full plan's 16 x 15 = 240
    # (2 x 8 rail + 2 x 56 NVLink in each stage's EP group)
    eng = Engine(fast.trace, fast.topology, fast.scenario.layout, chip, calibration_for(chip, {}))
    op = next(op for op in fast.trace.ops if op.coll == "all-to-all")
    ((transfers, steps, _),) = eng.lowering.collective_phases(op)
    assert steps == 2 and len(transfers) == 3
    assert sum(t.src // 8 != t.dst // 8 for t in transfers) == 2
    (nvlink,) = [t for t in transfers if t.src // 8 == t.dst // 8]
    assert nvlink.weight == 7 and {m for _, m in nvlink.incidence} == {1.0}


def test_all_to_all_inside_one_domain_runs_as_its_quotient():
    """A direct expert all-to-all inside one NVLink domain (EP8 of a GB200 rack, beside
    tensor-parallel collectives and pipeline sends on the same GPU links) runs as the
    representative's 7 sends bundled into one flow and its 7 receives into another: 2 flows
    instead of n (n - 1) = 56, and the step of the full plan."""
    sc = moe_scenario(
        cluster={"preset": "gb200-nvl72", "devices": 32, "network": {"domain_size": 32}},
        parallel={"tp": 2, "pp": 2, "dp": 8, "ep": 8, "sequence_parallel": True},
        training={"global_batch_size": 64},
    )
    fast = simulate(sc)
    (_, quotient), (_, full) = rerun_engine(fast), rerun_engine(fast, a2a_quotient=False)
    assert quotient.step_time_s == fast.summary["step_time_s"]
    assert quotient.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    assert quotient.network_stats["flows_started"] < 0.5 * full.network_stats["flows_started"]
    eng, _ = rerun_engine(fast)
    op = next(op for op in fast.trace.ops if op.coll == "all-to-all")
    ((transfers, steps, _),) = eng.lowering.collective_phases(op)
    assert steps == 1 and len(transfers) == 2
    sends, receives = transfers
    assert sends.src == op.rank and sends.weight == 7 and receives.dst == op.rank and receives.weight == 7
    # each send's 7 images (the 8th lands in the representative: a receive of its own) cross
    # 7 uplinks and 7 downlinks once each, over 2 n - 1 = 15 links (every uplink, every
    # downlink but the representative's); the receives cross their 7 uplinks and the
    # representative's downlink: 3 n - 1 = 23 link crossings instead of 2 n (n - 1) = 112
    assert sum(sends.weight * m for _, m in sends.incidence) == pytest.approx(7 * (7 + 7))
    assert sum(receives.weight * m for _, m in receives.incidence) == pytest.approx(7 * 2)
    assert len(sends.incidence) == 15 and len(receives.incidence) == 8


def test_deepseek_v3_activation_savings_in_the_trace():
    """``training.activation_saving: deepseek-v3`` lowers the activation peak, charges
    the recomputed norms / up-projections / SwiGLUs to the backward (phase R, HFU only)
    and needs FP8 training."""
    import copy

    from simulator import ScenarioError, load_scenario

    base = moe_scenario()
    base["training"]["dtype"] = "fp8"
    saving = copy.deepcopy(base)
    saving["training"]["activation_saving"] = "deepseek-v3"
    a, b = simulate(base), simulate(saving)
    act_a = a.summary["memory_breakdown_bytes"]["activations"]
    act_b = b.summary["memory_breakdown_bytes"]["activations"]
    assert act_b < 0.8 * act_a
    redo = b.events[b.events["name"].str.endswith(".recompute.R")]
    assert len(redo) > 0 and set(redo["phase"]) == {"R"}
    assert not a.events["name"].str.endswith(".recompute.R").any()
    assert b.summary["step_time_s"] > a.summary["step_time_s"]
    # what is run again on an MLA + MoE layer: every norm, the up-projections, the SwiGLUs
    from workloads.trace.shared import TraceBuilder

    ds = load_scenario("deepseek-v3-2048xh800")
    names = [k.name for k in TraceBuilder(ds.workload()).saved_recompute_kernels(5)]
    assert names == [
        "attn_norm",
        "q_down_norm",
        "q_up",
        "kv_down_norm",
        "kv_up",
        "mlp_norm",
        "shared_act",
        "expert_act",
    ]
    bad = copy.deepcopy(saving)
    bad["training"]["dtype"] = "bf16"
    with pytest.raises(ScenarioError, match="training.activation_saving"):
        load_scenario(bad)


def test_moe_with_tp_needs_sequence_parallel_at_load():
    """Refused when the scenario is loaded, naming the field (not when a layer is counted)."""
    from simulator.scenario.loading import load_scenario
    from simulator.scenario.schema import ScenarioError

    sc = {
        "model": "mixtral-8x7b",
        "cluster": {"preset": "dgx-h100", "devices": 8},
        "parallel": {"tp": 2, "sequence_parallel": False},
        "training": {"global_batch_size": 8},
    }
    with pytest.raises(ScenarioError) as e:
        load_scenario(sc)
    assert e.value.field == "parallel.sequence_parallel" and "MoE layers with tp > 1" in str(e.value)
    load_scenario({**sc, "parallel": {"tp": 2}})  # sequence parallel: fine
    load_scenario({**sc, "parallel": {"tp": 1, "sequence_parallel": False}})  # no tensor parallelism: fine


def test_the_dispatch_wire_dtype_sets_the_dispatch_bytes_not_the_combine():
    """``training.moe_dispatch_dtype``: the dispatch all-to-all carries one byte an element in
    FP8 (DeepSeek-V3 §3.3; ``auto`` under FP8 training), two in BF16 (Megatron-Core); the
    combine is BF16 always."""

    def a2a_bytes(**training):
        sc = load_scenario(moe_scenario(training={"dtype": "fp8", **training}))
        ev = simulate(sc).events
        a2a = ev[(ev.coll == "all-to-all") & (ev.phase == "F")]
        return (
            a2a[a2a.name.str.endswith(".dispatch")].size_bytes.iloc[0],
            a2a[a2a.name.str.endswith(".combine")].size_bytes.iloc[0],
        )

    auto, fp8, bf16 = a2a_bytes(), a2a_bytes(moe_dispatch_dtype="fp8"), a2a_bytes(moe_dispatch_dtype="bf16")
    assert auto == fp8
    assert bf16[0] == 2 * fp8[0] and bf16[1] == fp8[1] == bf16[0]


def test_the_terminal_summary_prints_the_moe_terms_per_layer_and_micro_batch():
    """``stepsim run`` prints ``summary.json``'s ``moe_terms_s`` (ms per MoE layer and
    micro-batch) for an MoE model, and nothing of the kind for a dense one."""
    from simulator.results.report import format_summary

    res = simulate(load_scenario(moe_scenario()))
    text = format_summary(res)
    assert "MoE layer, per micro-batch" in text
    for term, seconds in res.summary["moe_terms_s"].items():
        assert f"{term.replace('_', ' ')} {1e3 * seconds:.3f} ms" in text
    assert "MoE layer" not in format_summary(simulate(load_scenario(scenario())))
