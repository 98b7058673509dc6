"""Representative mode's classes within an op limit (issue 39): where refining the classes
of ranks whose groups straddle domains unlike one another gives more simulated ranks than
``symmetry.MAX_CLASS_OPS`` admits, the finest coarser round is simulated, and the summary says so.
DeepSeek-V3 TP4 PP4 VPP4 EP64 on 2,304 H100 in 72-GPU domains with 128 micro-batches refined
to 288 ranks, about 15 M ops, and grew past 20 GB resident (the PP map's 72-GPU points at
200 and 400 GB/s were killed by it)."""

from __future__ import annotations

import numpy as np
import pytest
from test_straddle_speed import _ep8_on_9gpu_domains
from test_symmetry import FIGURES

from simulator import simulate
from simulator.engine import symmetry
from simulator.scenario.loading import load_scenario
from topologies.presets import build_cluster

#: estimated ops a simulated rank of _ep8_on_9gpu_domains (builder.estimated_ops)
OPS_PER_RANK = 144


def test_a_budget_stops_the_refinement_at_its_finest_round_within_it():
    """EP8 on 288 GPUs in 9-GPU domains: the groups' splits give 5 classes, one refinement
    round the 72 positions of a leaf group. A budget of 5 to 71 keeps the 5, 72 or more the
    72, under 5 none (one rank per stage); the budget's answer is found again from the
    count it gave (the lowering asks with the trace's rank count)."""
    s = load_scenario(_ep8_on_9gpu_domains())
    topo = build_cluster(s.cluster)
    full = symmetry.rank_classes(s.layout, topo)
    counts = {m: symmetry.rank_classes(s.layout, topo, max_classes=m) for m in (4, 5, 40, 71, 72, 500)}
    assert counts[4] is None
    assert {m: len(np.unique(c)) for m, c in counts.items() if c is not None} == {5: 5, 40: 5, 71: 5, 72: 72, 500: 72}
    assert counts[40].tolist() == counts[5].tolist()
    assert counts[72].tolist() == full.tolist()
    # the coarse classes are unions of the fine ones
    assert all(len(np.unique(counts[5][full == c])) == 1 for c in np.unique(full))


def test_over_the_op_limit_fewer_ranks_are_simulated_and_the_summary_says_so(monkeypatch):
    """With the class op limit at 10 ranks' worth, the 72 refined classes are over it: the 5 classes
    of the splits are simulated (on this layout their figures are --exact's too), and a note
    says the classes are coarser than refined; under 5 ranks' worth, one rank per stage."""
    sc = _ep8_on_9gpu_domains()
    assert simulate(sc).summary["simulated_ranks"] == 72
    exact = simulate(sc, exact=True).summary
    monkeypatch.setattr(symmetry, "MAX_CLASS_OPS", 10 * OPS_PER_RANK)
    coarse = simulate(sc).summary
    assert coarse["simulated_ranks"] == 5
    assert any("coarser round" in n and "would be 72 ranks" in n for n in coarse["notes"])
    for key in FIGURES:
        assert coarse[key] == pytest.approx(exact[key], rel=1e-9, abs=1e-15), key
    monkeypatch.setattr(symmetry, "MAX_CLASS_OPS", 3 * OPS_PER_RANK)
    one = simulate(sc).summary
    assert one["simulated_ranks"] == 1
    assert any("one rank per stage is simulated" in n for n in one["notes"])
    assert one["step_time_s"] == pytest.approx(exact["step_time_s"], rel=0.05)


def _ep4_pp3_on_3gpu_domains() -> dict:
    """EP4 PP3 on 48 H100 in 3-GPU domains: every stage's expert groups straddle domains, each
    stage's 16 ranks unlike those of the others relative to the domains and leaf switches."""
    return {
        "model": {"preset": "deepseek-v3", "layers": 12},
        "cluster": {"preset": "dgx-h100", "devices": 48, "network": {"domain_size": 3}},
        "parallel": {"tp": 1, "pp": 3, "ep": 4, "zero": 1},
        "schedule": "1f1b",
        "training": {"seq_len": 1024, "micro_batch_size": 1, "global_batch_size": 96, "dtype": "fp8"},
    }


def _positions_per_stage(layout, classes) -> set:
    ranks, _ = symmetry.class_ranks(layout, classes)
    per = layout.world // layout.pp
    return {tuple(r - s * per for r in ranks if s * per <= r < (s + 1) * per) for s in range(layout.pp)}


def test_every_budget_gives_classes_at_the_same_positions_in_every_stage():
    """A rank's pipeline peers (the ranks at its position in the next and previous stages) must be
    simulated too: whatever round a budget stops the refinement at, every stage's classes sit at
    the same positions. At a budget of 41 to 47 here the refinement used to stop at a round
    of 41 classes whose three stages split their positions unlike one another (on the PP map, Kimi K2 TP2 PP8 EP48 in 32-GPU domains: 'op ... waits for ('F', 2, 0, 640), which no
    simulated rank produces'); the fine classes are unchanged (48, as many as --exact's ranks)."""
    s = load_scenario(_ep4_pp3_on_3gpu_domains())
    topo = build_cluster(s.cluster)
    assert len(np.unique(symmetry.rank_classes(s.layout, topo))) == 48
    counts = {}
    for budget in range(s.layout.pp, 49):
        classes = symmetry.rank_classes(s.layout, topo, max_classes=budget)
        if classes is None:
            continue
        counts[budget] = len(np.unique(classes))
        assert len(_positions_per_stage(s.layout, classes)) == 1, budget
    assert set(counts.values()) == {9, 48}


def test_a_budget_that_stops_the_refinement_early_still_simulates(monkeypatch):
    """The budget-limited run builds its trace and runs (it raised a TraceError at a budget of 41),
    on the 9 classes of the groups' splits; at the full budget it is --exact's step to 1e-9."""
    sc = _ep4_pp3_on_3gpu_domains()
    exact = simulate(sc, exact=True).summary
    assert simulate(sc).summary["step_time_s"] == pytest.approx(exact["step_time_s"], rel=1e-9)
    monkeypatch.setattr(symmetry, "MAX_CLASS_OPS", 41 * 864)  # 864 estimated ops a rank
    coarse = simulate(sc).summary
    assert coarse["simulated_ranks"] == 9
    assert coarse["step_time_s"] == pytest.approx(exact["step_time_s"], rel=1e-3)


def test_a_step_skipped_ahead_simulates_the_ranks_of_its_full_run(monkeypatch):
    """Steady-state skipping's shorter run simulates the ranks the full step would (the full
    step's op budget, not its own): EP16 PP2 on 96 H100 in 12-GPU domains, 48 micro-batches, a
    budget of two ranks' worth at 48 (one rank per stage) that would admit classes at the
    shorter run's 16. With the shorter run's own budget its classes drifted from one another,
    its records did not repeat, and the whole step was simulated after it; now both run one
    rank per stage, the run certifies, and its figures are the full run's."""
    from test_symmetry import _case, _h12

    sc = _case(_h12(96), {"tp": 1, "pp": 2, "dp": 48, "ep": 16}, 48 * 48)
    monkeypatch.setattr(symmetry, "MAX_CLASS_OPS", 2 * 4608)  # 4,608 estimated ops a rank at 48
    full = simulate(sc).summary
    skipped = simulate(sc, steady_state=True).summary
    assert full["simulated_ranks"] == skipped["simulated_ranks"] == 2
    assert skipped["steady_state"] == {"micro_batches_simulated": [16], "period_micro_batches": 2}
    for key in FIGURES:
        assert skipped[key] == pytest.approx(full[key], rel=1e-9, abs=1e-15), key
