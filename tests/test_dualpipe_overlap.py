"""DualPipe's computation-communication overlap (issue 13, items 4 and 9).

DeepSeek-V3 (arXiv 2412.19437) §3.2.1 and Figure 4: a forward chunk and a backward
chunk of two micro-batches are interleaved at the granularity attention / dispatch /
MLP / combine, so that each expert all-to-all is in flight while the other chunk
computes; 20 of the H800's 132 SMs run the communication kernels meanwhile
(§3.2.2, §3.5.1), so the pair's compute runs on the other 112.
"""

from __future__ import annotations

import pandas as pd
import pytest
from helpers import FAST_SWITCHED, IDEAL_CHIP, ideal_scenario
from test_moe import TINY_MOE, moe_scenario

from simulator import simulate
from simulator.engine.compute import calibration_for, kernels_time_s, overlap_slowdown
from simulator.network.calibration import HOPPER_A2A_EFFICIENCY
from workloads.schedules import schedule
from workloads.trace.builder import build_trace
from workloads.trace.io import trace_from_dict, trace_to_dict

# DeepSeek-V3 §3.5.1: "we allocate 20 out of the 132 SMs available in the H800 GPU" to
# communication: the pair's compute runs on 112 SMs, 132/112 = 1.1786 times as long.
DEEPSEEK_SLOWDOWN = 132 / 112

PP, M = 2, 8  # pp=2: one layer per stage; m=8: five overlapped pairs per rank


def overlap_scenario(**over) -> dict:
    """2 stages x 4-way EP on one 8-device switched domain; an ideal chip (compute =
    FLOPs / (peak x 0.5)); domain links slow enough that each all-to-all takes about
    1.1 ms, a bit less than the shortest compute window that hides it (1.3 ms)."""
    moe = dict(
        TINY_MOE,
        layers=2,
        hidden=4096,
        heads=32,
        kv_heads=32,
        ffn_hidden=16384,
        moe={"experts": 8, "top_k": 2, "expert_ffn_hidden": 4096, "shared_experts": 0, "dense_layers": 0},
    )
    # 55 GB/s as all-to-all kernels reach it (calibration.a2a_efficiency)
    net = dict(FAST_SWITCHED, domain_bw_bytes_per_s=5.5e10 / HOPPER_A2A_EFFICIENCY["nvlink"])
    sc = ideal_scenario(
        8,
        model=moe,
        cluster={"chip": dict(IDEAL_CHIP), "devices": 8, "network": net},
        parallel={"tp": 1, "pp": PP, "dp": 4, "ep": 4},
        schedule="dualpipe",
        training={"seq_len": 4096, "global_batch_size": M * 4},
    )
    for k, v in over.items():
        sc[k] = {**sc[k], **v} if isinstance(v, dict) and isinstance(sc.get(k), dict) else v
    return sc


@pytest.fixture(scope="module")
def run():
    return simulate(overlap_scenario())


def _action_ops(ev, rank: int, a):
    phases = ("F",) if a.op == "F" else ("B", "I", "R")
    return ev[(ev["rank"] == rank) & (ev["mb"] == a.mb) & ev["phase"].isin(phases)]


def _input_ready_s(ev, rank: int, a) -> float:
    """When the activation (forward) or gradient (backward) this action needs from
    another stage arrived (0 when it needs none: first stage forward, last stage backward)."""
    kind = "F" if a.op == "F" else "B"
    sends = ev[(ev["rank"] != rank) & (ev["kind"] == "send") & (ev["mb"] == a.mb) & (ev["phase"] == kind)]
    return float(sends["end_s"].max()) if not sends.empty else 0.0


def test_overlapped_pair_takes_max_of_compute_and_comm_not_the_sum(run):
    ev = run.events
    rank = 0
    pairs = [st for st in schedule("dualpipe", rank, PP, M) if len(st) == 2]
    assert len(pairs) == 5
    checked = 0
    for st in pairs:
        ops = pd.concat([_action_ops(ev, rank, a) for a in st])
        comp = ops[ops["kind"] == "compute"]
        a2a = ops[ops["coll"] == "all-to-all"]
        compute_s = comp["duration_s"].sum()
        comm_s = a2a["duration_s"].sum()
        start_s = comp["start_s"].min()
        span_s = comp["end_s"].max() - start_s
        if max(_input_ready_s(ev, rank, a) for a in st) > start_s:
            continue  # a pair still waiting for the other stage is not the steady state
        checked += 1
        assert len(a2a) == 4  # dispatch + combine of the forward, their gradients in the backward
        assert comm_s > 0.4 * compute_s  # serialised, the pair would take >= 1.4x its compute
        # Every all-to-all is shorter than the compute it hides behind: max(compute, comm) = compute.
        assert span_s == pytest.approx(max(compute_s, comm_s), rel=1e-9)
        # The forward's all-to-alls are in flight while the backward half computes, and
        # vice versa (the dispatch gradient may also hide behind its own weight gradient).
        hidden_by_other = set()
        for _, c in a2a.iterrows():
            other = comp[(comp["mb"] != c["mb"]) & (comp["start_s"] < c["end_s"]) & (comp["end_s"] > c["start_s"])]
            if not other.empty:
                hidden_by_other.add(c["phase"])
        assert hidden_by_other == {"F", "B"}
    assert checked >= 3


def test_lone_forward_exposes_its_all_to_alls(run):
    """Contrast: a forward run alone (warm-up) has nothing to hide its all-to-alls
    behind, so it takes compute + comm (there are no shared experts here)."""
    ev = run.events
    first = schedule("dualpipe", 0, PP, M)[0]
    assert len(first) == 1 and first[0].op == "F"
    ops = _action_ops(ev, 0, first[0])
    comp = ops[ops["kind"] == "compute"]
    a2a = ops[ops["coll"] == "all-to-all"]
    assert len(a2a) == 2
    start = comp[comp["name"].str.contains("attn")]["start_s"].min()
    comp = comp[comp["start_s"] >= start]  # not the embedding before it (memory-bound, ~1e-10 s)
    span_s = comp["end_s"].max() - start
    assert span_s == pytest.approx(comp["duration_s"].sum() + a2a["duration_s"].sum(), rel=1e-9)


def test_sm_reservation_slows_pair_compute_by_documented_factor(run):
    cal = calibration_for(run.scenario.cluster.chip, dict(run.scenario.compute_overrides))
    assert overlap_slowdown(cal) == pytest.approx(DEEPSEEK_SLOWDOWN, rel=1e-12)
    ops = {op.id: op for op in run.trace.ops}
    recs = [r for r in run.raw.records if r.op.kind == "compute" and r.op.kernels]
    paired = [r for r in recs if r.op.comm_overlap]
    alone = [r for r in recs if not r.op.comm_overlap]
    assert paired and alone
    for r in paired + alone:
        roof = kernels_time_s(ops[r.op.id].kernels, run.scenario.cluster.chip, cal, "bf16")
        want = roof * (DEEPSEEK_SLOWDOWN if r.op.comm_overlap else 1.0)
        assert r.end_s - r.start_s == pytest.approx(want, rel=1e-9)
    # With no SMs reserved the same pairs compute 112/132 as long.
    free = simulate(overlap_scenario(compute={"comm_sm_fraction": 0.0}))
    f_paired = sum(r.end_s - r.start_s for r in free.raw.records if r.op.kind == "compute" and r.op.comm_overlap)
    assert f_paired == pytest.approx(sum(r.end_s - r.start_s for r in paired) / DEEPSEEK_SLOWDOWN, rel=1e-9)


def test_overlap_only_where_an_all_to_all_exists():
    """Without expert parallelism a DualPipe pair has no all-to-all and no SMs are
    reserved: no op is marked, durations are the plain roofline."""
    sc = simulate(overlap_scenario(parallel={"ep": 1}))
    assert not any(op.comm_overlap for op in sc.trace.ops)
    other = simulate(overlap_scenario(schedule="1f1b"))
    assert not any(op.comm_overlap for op in other.trace.ops)


def test_exact_agrees_with_representative_ranks():
    sc = moe_scenario(schedule="dualpipe", training={"global_batch_size": 64})
    fast = simulate(sc)
    exact = simulate(sc, exact=True)
    assert any(op.comm_overlap for op in fast.trace.ops)
    assert fast.summary["simulated_ranks"] < exact.summary["simulated_ranks"]
    assert fast.summary["step_time_s"] == pytest.approx(exact.summary["step_time_s"], rel=1e-9)
    assert fast.summary["exposed_comm_by_axis_s"]["ep"] == pytest.approx(
        exact.summary["exposed_comm_by_axis_s"]["ep"], rel=1e-6
    )


def test_trace_file_keeps_the_overlap_flag():
    sc = moe_scenario(schedule="dualpipe", training={"global_batch_size": 64})
    from simulator.scenario.loading import load_scenario

    trace = build_trace(load_scenario(sc).workload())
    back = trace_from_dict(trace_to_dict(trace))
    assert [op.comm_overlap for op in back.ops] == [op.comm_overlap for op in trace.ops]
    assert sum(op.comm_overlap for op in back.ops) > 0


def test_global_aux_loss_runs_dualpipe_all_forward_first():
    """Item 9: a batch-wide auxiliary loss needs every micro-batch's forward (both of
    DualPipe's directions, whose last stages are opposite ranks) before any backward,
    so no forward/backward pair can form: the step runs GPipe-like in both directions,
    with every all-to-all exposed."""
    res = simulate(overlap_scenario(training={"balance": "aux-loss-global"}))
    assert res.summary["schedule_enforced"] == "all-forward-first"
    assert any("pairs cannot form" in n for n in res.summary["notes"])
    assert not any(op.comm_overlap for op in res.trace.ops)
    ev = res.events
    comp = ev[ev["kind"] == "compute"]
    last_head = comp[comp["name"] == "head.F"]["end_s"].max()
    assert sorted(comp[comp["name"] == "head.F"]["mb"]) == list(range(M))  # both directions' losses
    assert comp[comp["phase"].isin(["B", "I", "W"])]["start_s"].min() >= last_head
    paired = simulate(overlap_scenario())
    assert res.summary["step_time_s"] > paired.summary["step_time_s"]
