"""Steady-state skipping (simulator/steady.py): the certified step against the full simulation of
every micro-batch, the certificate's refusals, and what a skipped step's result offers."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
from helpers import BALANCED_MODEL, SEARCH_MOE, TINY_MODEL, scenario, summary_numbers

from simulator import simulate, steady
from simulator.steady import certify, runs_for

# 1F1B over two DGX H100 nodes: the pipeline sends and the DP all-reduce cross InfiniBand. Its
# steady phase settles into a pattern two micro-batches long (0 and +1.32 us per micro-batch).
# These tiny steps are host-bound at 10 us a launch; the host is switched off where a test is
# about the op records' half of the certificate (the host's half: test_a_host_bound_step_...).
NO_HOST = {"host_launch_s": 0.0}
DENSE_1F1B = scenario(
    cluster={"preset": "dgx-h100", "devices": 16},
    parallel={"tp": 2, "pp": 4, "dp": 2},
    training={"global_batch_size": 128, **NO_HOST},
)
# ZB-H1 on the same GPUs: pipeline sends share NVLink with the TP collectives and overlap them
# differently from one micro-batch to the next (a send takes 14.7 us in one and 24.6 us in
# another); its step time departs from the affine line at isolated batch sizes (62 -> 64
# micro-batches adds 9.96 us more than every step before), so no period can be certified.
UNSETTLED_ZB = scenario(
    model=copy.deepcopy(BALANCED_MODEL),
    cluster={"preset": "dgx-h100", "devices": 16},
    parallel={"tp": 2, "pp": 4, "dp": 2},
    schedule="zb-h1",
    training={"global_batch_size": 128, **NO_HOST},
)
# A small MoE whose expert all-to-alls cross nodes (EP8 over two nodes of 4 GPUs) and share NICs
# with the pipeline sends: its step grows by 0.317-0.350 ms per micro-batch, with no period.
UNSETTLED_MOE = scenario(
    model=copy.deepcopy(SEARCH_MOE),
    cluster={"preset": "dgx-h100", "devices": 32, "devices_per_domain": 4},
    parallel={"tp": 1, "pp": 4, "dp": 8, "ep": 8},
    training={"global_batch_size": 512, **NO_HOST},
)


def test_a_certified_step_matches_every_micro_batch_simulated():
    full = simulate(DENSE_1F1B).summary
    res = simulate(DENSE_1F1B, steady_state=True)
    ext = res.summary
    assert full["steady_state"] is None
    assert ext["steady_state"] == {"micro_batches_simulated": [12], "period_micro_batches": 2}
    a, b = summary_numbers(full), summary_numbers(ext)
    assert a.keys() == b.keys()
    step = full["step_time_s"]
    for k in a:  # within 1e-9 of the step time (or of the figure, if larger)
        assert abs(a[k] - b[k]) <= 1e-9 * max(abs(a[k]), step), k
    assert ext["peak_memory_bytes"] == full["peak_memory_bytes"]
    assert ext["memory_breakdown_bytes"] == full["memory_breakdown_bytes"]
    assert ext["events_processed"] == full["events_processed"]
    assert ext["micro_batches"] == full["micro_batches"] == 64
    assert ext["notes"] == full["notes"]


def test_a_host_bound_step_is_certified_with_its_host():
    """With its host on (10 us a launch) the small MoE step above is host-bound: the host issues
    each period's ops exactly one period later, so its state repeats with the records' and the
    step is certified (simulator.steady.host_repeats), to 1e-9 of the full simulation, the host's
    waits per MoE layer included; with the host lead shrinking it would be simulated whole."""
    sc = copy.deepcopy(UNSETTLED_MOE)
    sc["training"].pop("host_launch_s")
    full = simulate(sc).summary
    ext = simulate(sc, steady_state=True).summary
    assert ext["steady_state"] == {"micro_batches_simulated": [20], "period_micro_batches": 2}
    assert full["moe_terms_s"]["host_exposed"] > 0  # the host binds
    a, b = summary_numbers(full), summary_numbers(ext)
    assert a.keys() == b.keys()
    for k in a:
        assert abs(a[k] - b[k]) <= 1e-9 * max(abs(a[k]), full["step_time_s"]), k


def test_the_host_half_refuses_a_host_that_falls_behind(monkeypatch):
    """The records repeat, but the host's issue times do not, and the GPU waited for it after
    the window's start: refused (simulated whole), not extrapolated."""
    sc = copy.deepcopy(UNSETTLED_MOE)
    sc["training"].pop("host_launch_s")
    real = steady.host_repeats
    seen = []

    def spy(raw, *args):
        ok = real(raw, *args)
        seen.append(ok)
        raw.host._start = {i: t * 1.001 for i, t in raw.host._start.items()}  # issue times drift
        return real(raw, *args)

    monkeypatch.setattr(steady, "host_repeats", spy)
    ext = simulate(sc, steady_state=True).summary
    # the run's own period, then twice it (simulate_steady): both refused on the drifting host
    assert seen and seen[0] and ext["steady_state"] is None


@pytest.mark.parametrize("sc", [UNSETTLED_ZB, UNSETTLED_MOE], ids=["zb-h1", "moe"])
def test_a_step_whose_records_never_repeat_is_simulated_whole(sc):
    ext = simulate(sc, steady_state=True).summary
    full = simulate(sc).summary
    assert ext["steady_state"] is None and ext["steady_state_try"]["micro_batches_simulated"]
    assert 0 < ext["steady_state_try"]["wall_s"] < ext["sim_wall_s"]  # the try is part of the simulation's time
    run_keys = ("sim_wall_s", "steady_state_try")
    assert {k: v for k, v in ext.items() if k not in run_keys} == {k: v for k, v in full.items() if k not in run_keys}
    assert full["steady_state_try"] is None


def test_runs_per_schedule():
    assert runs_for("1f1b", 4, 64) == [(12, 2)]
    assert runs_for("1f1b", 64, 512) == [(72, 2)]
    assert runs_for("zb-h1", 8, 128) == [(16, 2)]
    assert runs_for("dualpipe", 4, 64) == [(16, 4)]
    assert runs_for("dualpipe", 4, 32) == [(16, 4)]  # the run is half the step: the most allowed
    assert runs_for("dualpipe", 4, 28) == []  # the run, 16, would be more than half
    # DualPipe with EP runs 3 pp + 16 micro-batches, or the longest run the step allows down to
    # 4 pp + 8: DeepSeek-V3 on 2,048 H800 (PP16 EP64, 120 micro-batches) would need 72, more than
    # the 0.4 of them allowed, so it has no try (48, 56 and 64 do not repeat)
    assert runs_for("dualpipe", 8, 256, expert_parallel=True) == [(40, 4)]
    # from PP16 on 6.5 pp, whole periods of 24 (tried besides 4 and 8) short of m where allowed
    assert runs_for("dualpipe", 16, 512, expert_parallel=True) == [(104, 4)]
    assert runs_for("dualpipe", 16, 256, expert_parallel=True) == [(88, 4)]  # 112 > 0.4 x 256
    assert runs_for("dualpipe", 16, 120, expert_parallel=True) == []  # 48 allowed, 72 the shortest
    assert runs_for("dualpipe", 16, 184, expert_parallel=True) == [(72, 4)]  # 0.4 x 184 = 73
    # expert all-to-alls settle later: pp + 4 micro-batches more
    assert runs_for("1f1b", 8, 128, expert_parallel=True) == [(28, 2)]
    assert runs_for("1f1b", 4, 64, expert_parallel=True) == [(20, 2)]
    # ... and may take at most 0.4 of the step (their certificates fail more often)
    assert runs_for("1f1b", 4, 50, expert_parallel=True) == [(20, 2)]
    assert runs_for("1f1b", 4, 48, expert_parallel=True) == []
    assert runs_for("interleaved-1f1b", 8, 248, vpp=2) == [(32, 8)]
    # Megatron-Core's batch-level all-to-all overlap settles at 8 pp: Qwen3-235B on 256 H100
    # (PP8 VPP4, 128 micro-batches) has no try (64 > 0.4 x 128), 160 has one
    assert runs_for("interleaved-1f1b", 8, 128, vpp=4, expert_parallel=True) == [(40, 8)]
    assert runs_for("interleaved-1f1b", 8, 128, vpp=4, expert_parallel=True, batch_overlap=True) == []
    assert runs_for("interleaved-1f1b", 8, 160, vpp=4, expert_parallel=True, batch_overlap=True) == [(64, 8)]
    assert runs_for("interleaved-1f1b", 8, 64, vpp=2) == [(32, 8)]  # m = 8 pp, as Megatron runs often are
    assert runs_for("interleaved-1f1b", 64, 512, vpp=2) == [(256, 64)]
    assert runs_for("interleaved-1f1b", 8, 56, vpp=2) == []  # a run of 32 > 0.5 x 56
    assert runs_for("gpipe", 4, 512) == []  # every micro-batch's activations at once
    assert runs_for("1f1b", 4, 512, global_aux=True) == []  # all forwards first
    assert runs_for("1f1b", 1, 512) == []  # no pipeline
    assert runs_for("1f1b", 4, 24) == [(12, 2)]
    assert runs_for("1f1b", 4, 22) == []  # too short to pay
    assert runs_for("1f1b", 4, 63) == []  # 63 - 12 is not a whole number of periods


def _periodic(n_periods: int, P: int, delta: float, lead: int = 2):
    """One stream of ``lead`` warm-up ops, then ``n_periods`` periods of ``P`` ops, as
    :func:`simulator.steady._streams` gives it (signatures, starts, ends, ops)."""
    sig = [("w", i) for i in range(lead)] + [("p", j) for _ in range(n_periods) for j in range(P)]
    t = np.concatenate([np.arange(lead) * 0.1, lead * 0.1 + np.arange(n_periods * P) * (delta / P)])
    return sig, t, t + 0.5 * delta / P, list(range(len(sig)))


def test_certify_accepts_exact_repetition_and_refuses_the_rest():
    d = 1.0
    empty = ([], np.zeros(0), np.zeros(0), [])
    run = {(0, "compute"): _periodic(3, 4, d), (0, "dp"): empty}
    shorter = {(0, "compute"): _periodic(2, 4, d)[0], (0, "dp"): []}  # the shorter trace's signatures
    found = certify(run, shorter, d, 1e-12)
    assert found is not None
    (lo, hi), one_period = found
    # the window: a period and the longest op (d / 8) at least
    assert hi - lo >= d + d / 8 and len(one_period[(0, "compute")]) == 4
    # one op off by 1e-9 s in the middle of the stretch leaves no stretch of a period
    sig, s0, e0, ops = run[(0, "compute")]
    bad = s0.copy()
    bad[2 + 6] += 1e-9
    assert certify({**run, (0, "compute"): (sig, bad, e0, ops)}, shorter, d, 1e-12) is None
    # a wrong shift
    assert certify(run, shorter, 1.001 * d, 1e-12) is None
    # the run is not the shorter trace with a period inserted
    assert certify(run, {**shorter, (0, "compute"): shorter[(0, "compute")][:-1] + [("x", 0)]}, d, 1e-12) is None
    # a stream without a period running an op inside the window
    busy = (["dp"], np.array([2.0]), np.array([2.1]), ["dp"])
    assert certify({**run, (0, "dp"): busy}, {**shorter, (0, "dp"): ["dp"]}, d, 1e-12) is None


def test_a_skipped_step_has_no_op_level_tables():
    res = simulate(DENSE_1F1B, steady_state=True)
    assert res.summary["steady_state"] is not None
    assert len(res.per_stage) == 4
    for name in ("events", "memory", "idle"):
        with pytest.raises(KeyError, match="steady_state=False"):
            res.table(name)


def test_validate_skips_by_default_and_full_simulates_every_micro_batch(monkeypatch):
    from simulator.studies import validate as v

    seen = []
    real = steady.simulate_steady

    def spy(sc, *a, **kw):
        seen.append(sc.name)
        return real(sc, *a, **kw)

    monkeypatch.setattr(steady, "simulate_steady", spy)
    case = [c for c in v.discover() if c.name == "narayanan21-7.5b"][0]
    a = v.run_case(case)
    assert len(seen) == 1
    b = v.run_case(case, steady_state=False)
    assert len(seen) == 1
    assert a.simulated == b.simulated


def test_a_bad_scenario_names_its_field_with_skipping_asked_for_too():
    from simulator import ScenarioError

    bad = scenario(parallel={"tp": 1, "pp": 2, "dp": 4}, training={"global_batch_size": 30})
    with pytest.raises(ScenarioError, match="training.global_batch_size"):
        simulate(bad, steady_state=True)


@pytest.mark.parametrize(
    "parallel, micro_batches, overlap",
    [
        ({"tp": 2, "pp": 2, "dp": 1, "zero": 1}, 80, False),
        ({"tp": 1, "pp": 2, "dp": 1, "zero": 0}, 80, True),
        ({"tp": 2, "pp": 2, "dp": 1, "zero": 3}, 64, True),
        ({"tp": 1, "pp": 2, "dp": 1, "zero": 3}, 120, True),
    ],
)
def test_certified_variants_match_the_full_step(parallel, micro_batches, overlap):
    """A few of the 1F1B steps that a fuzz over schedules, layouts, ZeRO stages and gradient
    overlap certified (`python benchmarks/steady_fuzz.py --seed S --steps 40`, seeds 1-5: 24 of
    200 steps certified, none off by more than 1e-9): ZeRO-3's per-micro-batch gathers and a
    reduction after the last backward included."""
    devices = parallel["tp"] * parallel["pp"] * parallel["dp"]
    sc = scenario(
        model=copy.deepcopy(BALANCED_MODEL),
        cluster={"preset": "dgx-h100", "devices": devices},
        parallel=parallel,
        training={"global_batch_size": micro_batches * parallel["dp"], "overlap_grad_reduce": overlap},
    )
    ext = simulate(sc, steady_state=True).summary
    assert ext["steady_state"] is not None
    full = simulate(sc).summary
    a, b = summary_numbers(full), summary_numbers(ext)
    for k in a:
        assert abs(a[k] - b[k]) <= 1e-9 * max(abs(a[k]), full["step_time_s"]), k


def test_an_interleaved_step_of_eight_micro_batches_per_stage_skips():
    """Interleaved 1F1B runs ``4 pp`` micro-batches (its period is ``pp``), half of Megatron's
    common ``m = 8 pp``: :data:`steady.MAX_SHARE` lets it try, and the certificate holds."""
    sc = scenario(
        model=copy.deepcopy(BALANCED_MODEL),
        cluster={"preset": "dgx-h100", "devices": 4},
        parallel={"tp": 1, "pp": 4, "dp": 1, "vpp": 2},
        schedule="interleaved-1f1b",
        training={"global_batch_size": 32},
    )
    ext = simulate(sc, steady_state=True).summary
    assert ext["steady_state"] == {"micro_batches_simulated": [16], "period_micro_batches": 4}
    full = simulate(sc).summary
    a, b = summary_numbers(full), summary_numbers(ext)
    for k in a:
        assert abs(a[k] - b[k]) <= 1e-9 * max(abs(a[k]), full["step_time_s"]), k


def test_the_host_half_reads_a_period_inside_the_stretch():
    """Megatron-Bridge's DeepSeek-V3 on 256 GB200 (interleaved 1F1B, PP4 VPP4, 64 micro-batches,
    per-layer CUDA graphs, the dispatcher's host syncs): the records repeat from 20 micro-batches
    on, and so does the host over the steady phase, but the last period's copies end where the
    cool-down's host program begins, and 3 of the last stage's 668 copies are issued one launch
    (10 us) late there, with the host 24 ms ahead of the GPU. The host half read that last period
    only and refused the step; over the period before it the host repeats exactly, and the
    skipped step is the full one to 1e-9."""
    from simulator.studies.validate.cases import discover

    (case,) = discover(["*mbridge-deepseek-v3-256xgb200-bf16"])
    full = simulate(case.scenario).summary
    ext = simulate(case.scenario, steady_state=True).summary
    assert ext["steady_state"] == {"micro_batches_simulated": [20], "period_micro_batches": 4}
    a, b = summary_numbers(full), summary_numbers(ext)
    assert a.keys() == b.keys()
    for k in a:
        assert abs(a[k] - b[k]) <= 1e-9 * max(abs(a[k]), full["step_time_s"]), k


def test_a_window_one_period_long_certifies_where_an_op_outlasts_the_rest():
    """The window over which every stream repeats must be a period long and hold the end of every
    op in flight at its start (simulator.steady._repeats): the state one period later is then the
    same. It used to need a period plus the longest op of the stretches, which refused this
    DualPipe step (found by ``benchmarks/steady_fuzz.py --seed 1``) and DeepSeek-V3 on 2,048 H800
    (window 0.523 s, period 0.493 s, its LM head's backward 0.054 s)."""
    sc = scenario(
        model={**copy.deepcopy(TINY_MODEL), "name": "tiny8", "layers": 8},
        cluster={"preset": "dgx-h100", "devices": 2},
        parallel={"tp": 1, "pp": 2, "dp": 1, "zero": 1},
        schedule="dualpipe",
        training={"global_batch_size": 64, "overlap_grad_reduce": True},
    )
    ext = simulate(sc, steady_state=True).summary
    assert ext["steady_state"] == {"micro_batches_simulated": [12], "period_micro_batches": 4}
    full = simulate(sc).summary
    a, b = summary_numbers(full), summary_numbers(ext)
    assert a.keys() == b.keys()
    for k in a:
        assert abs(a[k] - b[k]) <= 1e-9 * max(abs(a[k]), full["step_time_s"]), k


def test_in_flight_until():
    """The latest end among the ops in flight at ``t``, one stream at a time."""
    s0, e0 = np.array([0.0, 1.0, 2.0]), np.array([0.5, 1.8, 2.5])
    assert steady._in_flight_until([(s0, e0)], 1.2) == 1.8
    assert steady._in_flight_until([(s0, e0)], 0.7) == 0.7  # idle at 0.7
    assert steady._in_flight_until([(s0, e0), (np.array([1.1]), np.array([3.0]))], 1.2) == 3.0
    assert steady._in_flight_until([(s0, e0)], -1.0) == -1.0


def test_a_skipped_step_out_of_range_is_refused_as_the_full_one_is(monkeypatch):
    """The full simulation refuses a step longer than ``checks.MAX_STEP_TIME_S``; a step skipped
    ahead from a shorter run (whose own step is in range) is refused the same way, naming
    ``step_time_s``, without simulating the whole step to find out."""
    import sys

    from simulator.errors import StepsimError
    from simulator.scenario import checks

    full = simulate(DENSE_1F1B).summary["step_time_s"]
    monkeypatch.setattr(checks, "MAX_STEP_TIME_S", 0.9 * full)
    whole = []
    # the module (the package's ``simulate`` is the function)
    monkeypatch.setattr(sys.modules["simulator.simulate"], "_simulate", lambda *a, **k: whole.append(1))
    with pytest.raises(StepsimError, match="^step_time_s: ") as err:
        simulate(DENSE_1F1B, steady_state=True)
    assert err.value.field == "step_time_s" and not whole


def test_a_run_refused_for_its_period_is_certified_for_twice_it_without_a_second_run(monkeypatch):
    """``simulate_steady`` certifies one run for the period ``runs_for`` gives, then for twice it:
    steps often settle into a pattern twice as long (Kimi K2 TP4 PP8 EP48 DualPipe on 2,304 H100
    in 144-GPU domains repeats every 8 micro-batches, not every 4, from a run of 40: 4.1 against
    16 CPU-s, the step within 6.6e-14 of the full one). One more trace is built, no second run.
    Here the run's own period is refused by hand."""
    import simulator.step as step_module

    real_run, real_certified = step_module.run_step, steady._certified
    runs, tried = [], []

    def run_step(*a, **k):
        runs.append(a[0])
        return real_run(*a, **k)

    def certified(sc, run, short, m, m1, k):
        tried.append((m1, k))
        res, period = real_certified(sc, run, short, m, m1, k)
        return (None, period) if k == 2 else (res, period)

    monkeypatch.setattr(step_module, "run_step", run_step)
    monkeypatch.setattr(steady, "_certified", certified)
    monkeypatch.setattr(steady, "runs_for", lambda *a: [(24, 2)])  # a run long enough for two periods of 4
    ext = simulate(DENSE_1F1B, steady_state=True).summary
    assert tried == [(24, 2), (24, 4)] and len(runs) == 1
    assert ext["steady_state"] == {"micro_batches_simulated": [24], "period_micro_batches": 4}
    full = simulate(DENSE_1F1B).summary
    a, b = summary_numbers(full), summary_numbers(ext)
    for key in a:
        assert abs(a[key] - b[key]) <= 1e-9 * max(abs(a[key]), full["step_time_s"]), key


def _count_runs(monkeypatch) -> list:
    import simulator.step as step_module

    real_run, runs = step_module.run_step, []

    def run_step(*a, **k):
        runs.append(a[0].training.micro_batches(a[0].layout.dp))
        return real_run(*a, **k)

    monkeypatch.setattr(step_module, "run_step", run_step)
    return runs


def test_a_run_that_nearly_repeats_is_tried_once_more_as_long_as_the_step_allows(monkeypatch):
    """A first run whose records repeat to 1 % of the period but not to the certificate's
    tolerance has not settled yet (DeepSeek-V3 TP4 PP16 EP16 DualPipe on 16-GPU domains: 104 of
    512 micro-batches refused, 200 certified, 13 instead of 24 CPU-s): one more run, the longest
    the step allows in whole longest periods, here 32 of 64. The first run is refused by hand;
    the second certifies, with the full step's figures to 1e-9, and the summary names both runs."""
    from workloads.pipeline.base import PipelineSchedule

    runs = _count_runs(monkeypatch)
    monkeypatch.setattr(PipelineSchedule, "steady_retries", lambda self: True)  # DualPipe's; 1F1B's is off
    real_certified = steady._certified
    monkeypatch.setattr(
        steady,
        "_certified",
        lambda sc, run, short, m, m1, k: (
            (None, real_certified(sc, run, short, m, m1, k)[1])
            if m1 == 12
            else real_certified(sc, run, short, m, m1, k)
        ),
    )
    ext = simulate(DENSE_1F1B, steady_state=True).summary
    assert runs == [12, 32]
    assert ext["steady_state"] == {"micro_batches_simulated": [12, 32], "period_micro_batches": 2}
    assert ext["steady_state_try"] is None
    full = simulate(DENSE_1F1B).summary
    a, b = summary_numbers(full), summary_numbers(ext)
    for key in a:
        assert abs(a[key] - b[key]) <= 1e-9 * max(abs(a[key]), full["step_time_s"]), key


def test_a_run_that_does_not_nearly_repeat_is_not_tried_again(monkeypatch):
    runs = _count_runs(monkeypatch)
    monkeypatch.setattr(steady, "_certified", lambda *a: (None, {}))
    monkeypatch.setattr(steady, "_nearly_repeats", lambda *a: False)
    ext = simulate(DENSE_1F1B, steady_state=True).summary
    assert runs == [12] and ext["steady_state"] is None  # the try only; then every micro-batch
    assert ext["steady_state_try"]["micro_batches_simulated"] == [12]


def test_only_dualpipe_retries_a_run_that_nearly_repeats(monkeypatch):
    """A retry pays where it certifies more often than the share of the step it costs: in the PP
    map's stored simulations 11 of 14 DualPipe retries certified, 8 of 63 for the other schedules
    (workloads.pipeline.base.PipelineSchedule.steady_retries). A 1F1B run that nearly repeats is
    not tried again: the try, then every micro-batch."""
    from workloads.pipeline import get_schedule

    assert [s for s in ("1f1b", "zb-h1", "interleaved-1f1b", "dualpipe") if get_schedule(s).steady_retries()] == [
        "dualpipe"
    ]
    runs = _count_runs(monkeypatch)
    monkeypatch.setattr(steady, "_certified", lambda *a: (None, {}))
    monkeypatch.setattr(steady, "_nearly_repeats", lambda *a: True)
    ext = simulate(DENSE_1F1B, steady_state=True).summary
    assert runs == [12] and ext["steady_state"] is None
    assert ext["steady_state_try"]["micro_batches_simulated"] == [12]


def test_longer_run_and_nearly_repeats():
    assert steady._longer_run(64, 12, 4, False) == 32  # half of 64, whole periods of 4 short of it
    assert steady._longer_run(512, 104, 24, True) == 200  # 0.4 of 512 is 204; 512 - 200 = 13 x 24
    assert steady._longer_run(128, 48, 24, True) is None  # 0.4 of 128 leaves no period more
    # one stream, its period of 2 ops 1.0 s long; its copies 1.0 s later to 0.5 % (nearly) or 5 %
    sig = ["F", "B"] * 20
    starts = np.arange(40) * 0.5
    near = starts + np.tile([0.0, 0.005], 20)
    far = starts + np.tile([0.0, 0.05], 20) * (np.arange(40) // 2 % 2)
    for s0, expected in ((near, True), (far, False)):
        short = {(0, "compute"): (sig, s0, s0 + 0.1, [None] * 40)}
        assert steady._nearly_repeats(short, {(0, "compute"): 2}) is expected


BUILT_INS = sorted(p.stem for p in (Path(steady.__file__).parent / "scenarios").glob("*.yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in BUILT_INS if "tpu" not in n])
def test_no_built_in_pays_a_try_that_fails(name):
    """A built-in's default run (``stepsim run NAME``) either skips ahead or simulates the step
    whole without first paying a shorter run that refuses: ``deepseek-v3-2048xh800`` did from the
    FP8 quantisation passes (b3e579d) on, its run of 48 micro-batches no longer repeating (it needs
    72 of 120), 2 s of every default run for two sessions before anyone saw it."""
    s = simulate(name, steady_state=True).summary
    assert s["steady_state"] is not None or s["steady_state_try"] is None, s["steady_state_try"]
