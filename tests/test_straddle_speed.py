"""Straddling layouts simulate fast (issue 39 part 3): in representative mode with one simulated
rank per class, the twin groups of a collective that are not images of the simulated group --
its mirror image (1 + 7 against 7 + 1) and the mirror's translates in the other leaf groups --
fold into one quotient plan per orbit instead of running one plan each, and the figures stay
--exact's."""

from __future__ import annotations

import collections

import pytest
from helpers import scenario
from test_moe import TINY_MOE
from test_symmetry import FIGURES

from simulator import simulate
from simulator.engine import lowering


def _ep8_on_9gpu_domains() -> dict:
    """EP8 on 288 GPUs in 9-GPU domains, 8 domains (72 GPUs, 9 expert groups) per leaf group,
    leaves oversubscribed 4:1 so that the fabric is what the groups share: the groups split
    8, 1 + 7, 2 + 6, ..., 7 + 1, 8 in each of the 4 leaf groups, a small copy of EP64 on
    2,304 GB200 in NVL72 racks without a placement block."""
    model = dict(TINY_MOE, moe={**TINY_MOE["moe"], "experts": 16})
    network = {"domain_size": 9, "domains_per_leaf": 8, "oversubscription": 4.0}
    return scenario(
        model=model,
        cluster={"preset": "dgx-h100", "devices": 288, "network": network},
        parallel={"tp": 1, "pp": 1, "dp": 288, "ep": 8},
        training={"seq_len": 1024, "micro_batch_size": 1, "global_batch_size": 288},
    )


def test_mirror_groups_fold_by_translation_and_figures_stay_exact(monkeypatch):
    """Each straddling simulated rank's expert all-to-all runs as 2 plans (its own quotient and
    its mirror's, each folding the 4 leaf groups' translates) rather than 5 (the mirror's 4
    copies one by one), and every device figure equals --exact's to 1e-9."""
    plans: dict = collections.defaultdict(set)
    network_plans = lowering.Lowering._network_plans

    def counted(self, op):
        out = network_plans(self, op)
        if op.coll == "all-to-all":
            plans[op.rank].add(len(out))
        return out

    monkeypatch.setattr(lowering.Lowering, "_network_plans", counted)
    sc = _ep8_on_9gpu_domains()
    rep = simulate(sc).summary
    assert rep["simulated_ranks"] == 5  # groups 8, 1 + 7 / 7 + 1, 2 + 6 / 6 + 2, ...
    assert dict(plans) == {0: {1}, 8: {2}, 16: {2}, 24: {2}, 32: {1}}
    monkeypatch.setattr(lowering.Lowering, "_network_plans", network_plans)
    exact = simulate(sc, exact=True).summary
    for key in FIGURES:
        assert rep[key] == pytest.approx(exact[key], rel=1e-9, abs=1e-15), key
