"""Expert-load imbalance: what top-k routing allows, what the EP group executes (HFU),
and what the most loaded device holds (activation memory)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import scenario

from simulator import simulate
from workloads.moe_load import ExpertLoad, hottest_rank, max_expert_load_factor, max_rank_load_factor, rank_load_factors

TINY_MOE = {
    "name": "tiny-moe",
    "layers": 4,
    "hidden": 1024,
    "heads": 8,
    "kv_heads": 8,
    "ffn_hidden": 4096,
    "vocab": 8,
    "ffn": "gelu",
    "moe": {"experts": 16, "top_k": 2, "expert_ffn_hidden": 1024, "shared_experts": 1, "dense_layers": 1},
}


def moe_scenario(training=None, parallel=None):
    return scenario(
        model=dict(TINY_MOE),
        cluster={"preset": "dgx-h100", "devices": 16},
        parallel={"tp": 1, "pp": 2, "dp": 8, "ep": 8, **(parallel or {})},
        training={"seq_len": 1024, "micro_batch_size": 1, "global_batch_size": 16, **(training or {})},
    )


def test_load_cap_closed_forms():
    # A token's k experts are distinct: an expert gets at most T of T*k assignments,
    # E/k times the mean T*k/E. DeepSeek-V3 (256 experts, top-8): 32.
    assert max_expert_load_factor(256, 8) == 32.0
    # An EP rank with n = E/ep experts gets at most min(n, k) of a token's k
    # assignments against a mean of k/ep: min(n, k) * ep / k = min(E/k, ep).
    assert max_rank_load_factor(256, 8, 256) == 32.0  # one expert per rank: E/k
    assert max_rank_load_factor(256, 8, 64) == 32.0  # 4 experts per rank: 4 * 64 / 8
    assert max_rank_load_factor(256, 8, 8) == 8.0  # 32 experts >= k per rank: every token's k at most, = ep
    assert max_rank_load_factor(16, 2, 8) == 8.0
    assert max_rank_load_factor(64, 8, 16) == 8.0  # 4 experts per rank: 4 * 16 / 8 = E/k
    assert max_rank_load_factor(64, 2, 16) == 16.0  # 4 experts >= k = 2 per rank: 2 * 16 / 2 = ep


@pytest.mark.parametrize("dist,skew", [("zipf", 2.0), ("zipf", 4.0), ("lognormal", 3.0), ("dirichlet", 50.0)])
@pytest.mark.parametrize("ep", [256, 64, 8])
def test_drawn_load_never_exceeds_what_top_k_routing_allows(dist, skew, ep):
    """The issue's case: 256 experts, top-8, Zipf skew 2 drew a rank at 157x the mean
    before; top-8 routing allows at most 32x (E/k), and min(E/k, ep) per EP rank."""
    tokens = 4096 * ep // 8
    f = rank_load_factors(ExpertLoad(dist, skew, None, seed=0), 256, 8, ep, tokens, 4)
    cap = max_rank_load_factor(256, 8, ep)
    assert f.max() <= cap * (1 + 1e-12)
    assert np.allclose(f.mean(axis=1), 1.0, rtol=1e-12)  # no token lost to the cap
    if ep == 256 and dist == "zipf":
        # Zipf skew >= 2 puts over 1/k of the routing mass on the top expert: it saturates
        # (one assignment from every token) and sits exactly at the cap.
        assert f.max() == pytest.approx(32.0, rel=1e-12)


def test_capped_draw_is_feasible_per_expert():
    """Per expert (ep = E): count <= T, the only constraint distinct top-k choices
    impose (a draw of counts c_e <= T summing to T*k is realisable)."""
    T, E, k = 1000, 32, 4
    f = rank_load_factors(ExpertLoad("zipf", 3.0, None, seed=5), E, k, E, T, 6)
    counts = f * T * k / E
    assert counts.max() <= T * (1 + 1e-12)
    assert np.allclose(counts.sum(axis=1), T * k)
    # a capacity factor still drops what exceeds capacity_factor x the mean
    g = rank_load_factors(ExpertLoad("zipf", 3.0, 1.5, seed=5), E, k, E, T, 6)
    assert g.max() <= 1.5 + 1e-12 and g.mean() < 1.0


def test_hottest_rank_is_the_one_with_most_tokens_over_its_layers():
    f = np.array([[3.0, 0.5, 0.5], [0.2, 1.9, 0.9], [0.3, 1.8, 0.9]])
    # per-layer maxima are ranks 0, 1, 1; over the three layers rank 1 holds the most (4.2)
    assert hottest_rank(f) == 1
    assert hottest_rank(np.ones((2, 4))) == 0


def test_hfu_does_not_rise_as_imbalance_slows_the_step():
    """Sweep the routing skew upward: the step slows (the slowest EP rank sets the pace),
    while the FLOPs the devices execute stay those of the balanced step (each EP rank
    its own load, mean 1): HFU x step_time is constant, so HFU falls as the step
    slows, and HFU >= MFU throughout."""
    rows = []
    for skew in (None, 0.5, 1.0, 1.5):
        tr = {} if skew is None else {"expert_load": {"distribution": "zipf", "skew": skew, "seed": 1}}
        s = simulate(moe_scenario(training={**tr, "recompute": "selective"})).summary
        rows.append((s["step_time_s"], s["hfu"], s["mfu"]))
    steps = [r[0] for r in rows]
    assert all(a < b for a, b in zip(steps, steps[1:])), steps  # imbalance slows the step
    work = [hfu * step for step, hfu, _ in rows]
    assert work == pytest.approx([work[0]] * len(work), rel=1e-9)  # executed FLOPs do not change
    hfus = [r[1] for r in rows]
    assert all(a > b for a, b in zip(hfus, hfus[1:])), hfus
    assert all(hfu >= mfu for _, hfu, mfu in rows)


def test_hfu_counts_only_the_tokens_kept_under_capacity_dropping():
    """With a capacity factor, dropped assignments are not computed: the hardware FLOPs
    fall by the dropped share of the routed-expert GEMMs."""
    from simulator import load_scenario
    from workloads.trace.builder import build_trace
    from workloads.trace.shared import TraceBuilder

    sc = load_scenario(
        moe_scenario(
            training={"expert_load": {"distribution": "zipf", "skew": 1.5, "seed": 1, "capacity_factor": 1.25}}
        )
    )
    b = TraceBuilder(sc.workload())
    assert all(b.load_mean[l] < 1.0 for l in b.load_mean)
    assert all(b.load_factor[l] <= 1.25 + 1e-12 for l in b.load_factor)
    trace = build_trace(sc.workload())
    for r in trace.ranks:
        # timed at the layer's max load, executed at its mean: the difference is unexecuted
        expect = sum(
            k.flops * (1 - b.load_mean[op.layer] / b.load_factor[op.layer])
            for op in trace.ops
            if op.rank == r and op.kind == "compute" and op.layer in b.load_mean
            for k in op.kernels
            if k.kind == "gemm" and k.name.startswith("expert_")
        )
        assert expect > 0
        assert trace.unexecuted_flops[r] == pytest.approx(expect, rel=1e-12)


def test_hottest_device_activation_memory_closed_form():
    """One stage (pp = 1) holding MoE layers 1-3, one micro-batch in flight at a time: the
    activation peak of the most loaded device exceeds the balanced one by its extra
    routed-token assignments x the bytes each keeps. Per assignment (bf16, GELU
    experts of width f): the permuted input (2h), the up GEMM's output / GELU input
    (2f), the GELU output / down GEMM input (2f) — Korthikanti et al. 2022's MLP terms
    (arXiv 2205.05198 §4.1, 2sbh + 8sbh + 8sbh for a 4h-wide MLP) per routed row — and,
    for the gate gradient, the fp32 gate weight (4 B: Megatron-Core >= 0.13 applies it
    to the activation output, `training.moe_gate_weighting: activation`, the default)."""
    h, f, k, ep, seq = 1024, 1024, 2, 8, 1024
    par = {"pp": 1, "dp": 16, "ep": ep}
    load = {"distribution": "zipf", "skew": 1.0, "seed": 2}
    bal = simulate(moe_scenario(parallel=par)).memory["activations"].max()
    imb = simulate(moe_scenario(parallel=par, training={"expert_load": load})).memory["activations"].max()
    # the trace's draw: T = the EP group's tokens of one micro-batch (tp = 1), 3 MoE layers
    loads = rank_load_factors(ExpertLoad("zipf", 1.0, None, seed=2), 16, k, ep, seq * ep, 3)
    hot = int(np.argmax(loads.sum(axis=0)))
    balanced_assignments = seq * k  # per layer and micro-batch on one rank
    per_assignment_bytes = 2 * h + 2 * 2 * f + 4
    extra = sum(loads[i, hot] - 1.0 for i in range(3)) * balanced_assignments * per_assignment_bytes
    assert extra > 0
    assert imb - bal == pytest.approx(extra, rel=1e-9)
    # the device's own loads, not the per-layer maxima (a different rank is hottest per layer)
    upper = sum(loads[i].max() - 1.0 for i in range(3)) * balanced_assignments * per_assignment_bytes
    assert imb - bal <= upper


@pytest.mark.slow
@pytest.mark.parametrize("imbalance", [False, True])
def test_builtin_scenarios_hardware_flops_at_least_model_flops(imbalance):
    """HFU >= MFU in every built-in scenario, with and without routing imbalance on the
    MoE ones: the hardware FLOPs of the step (what simulate() divides by devices x
    peak x step for HFU) are at least its model FLOPs (MFU's numerator). Checked on
    the traces (full-size layouts, fewest micro-batches the schedule allows), which is
    where both numerators come from; the simulated HFU is hardware / model x MFU."""
    from simulator import load_scenario
    from simulator.scenario.loading import builtin_scenarios, read_mapping
    from workloads.kernels import MATMUL_KINDS
    from workloads.trace.builder import build_trace

    for name, path in sorted(builtin_scenarios().items()):
        raw = read_mapping(path)
        sc = load_scenario(raw)
        if imbalance and not sc.model.is_moe:
            continue
        L = sc.layout
        m = 2 * L.pp if sc.schedule == "dualpipe" else L.pp
        raw["training"]["global_batch_size"] = m * L.dp * sc.training.micro_batch_size
        if imbalance:
            raw["training"]["expert_load"] = {"distribution": "zipf", "skew": 1.0, "seed": 0}
        trace = build_trace(load_scenario(raw).workload())
        hw = sum(
            trace.weight[op.rank] * sum(k.flops for k in op.kernels if k.kind in MATMUL_KINDS)
            for op in trace.ops
            if op.kind == "compute"
        )
        hw -= sum(trace.weight[r] * v for r, v in trace.unexecuted_flops.items())
        assert bool(trace.unexecuted_flops) == imbalance, name
        assert hw >= trace.model_flops * (1 - 1e-12), name
