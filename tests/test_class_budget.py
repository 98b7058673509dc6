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
