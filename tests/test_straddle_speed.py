"""Straddling layouts simulate fast (issue 39 part 3): in representative mode with one simulated
rank per class, the twin groups of a collective that are not images of the simulated group --
its mirror image (1 + 7 against 7 + 1) and the mirror's translates in the other leaf groups --
fold into one quotient plan per orbit instead of running one plan each, and the figures stay
--exact's."""

from __future__ import annotations

import collections
import itertools

import numpy as np
import pytest
from helpers import scenario
from test_moe import TINY_MOE
from test_symmetry import FIGURES

from simulator import simulate
from simulator.engine import lowering
from simulator.engine.symmetry import _least_rotation, rank_classes
from simulator.scenario.loading import load_scenario
from topologies.presets import build_cluster


def _ep8_on_9gpu_domains(oversubscription: float = 4.0) -> dict:
    """EP8 on 288 GPUs in 9-GPU domains, 8 domains (72 GPUs, 9 expert groups) per leaf group:
    the groups split 8, 1 + 7, 2 + 6, ..., 7 + 1, 8 in each of the 4 leaf groups, a small copy
    of EP64 on 2,304 GB200 in NVL72 racks without a placement block. Leaves oversubscribed
    4:1 make the fabric what the groups share; at 1:1 the uplinks never bind."""
    model = dict(TINY_MOE, moe={**TINY_MOE["moe"], "experts": 16})
    network = {"domain_size": 9, "domains_per_leaf": 8, "oversubscription": oversubscription}
    return scenario(
        model=model,
        cluster={"preset": "dgx-h100", "devices": 288, "network": network},
        parallel={"tp": 1, "pp": 1, "dp": 288, "ep": 8},
        training={"seq_len": 1024, "micro_batch_size": 1, "global_batch_size": 288},
    )


@pytest.mark.parametrize("oversubscription", [4.0, 1.0])
def test_mirror_groups_fold_by_translation_and_figures_stay_exact(monkeypatch, oversubscription):
    """Each straddling simulated rank's expert all-to-all runs as 2 plans (its own quotient and
    its mirror's, each folding the 4 leaf groups' translates) rather than 5 (the mirror's 4
    copies one by one); so does rank 0's, whose group lies inside one domain (ranks 0-7 of
    domain 0 and, of its class, 64-71, ranks 1-8 of domain 7: their twins run on the network
    too, since the expert-data-parallel groups of simulated ranks load those devices' links),
    and every device figure equals --exact's to 1e-9: with the leaf
    uplinks loaded (4:1) and, at 1:1, left out of the representative run's transfers
    (lowering.never_binding) while --exact loads them."""
    plans: dict = collections.defaultdict(set)
    network_plans = lowering.Lowering._network_plans

    def counted(self, op):
        out = network_plans(self, op)
        if op.coll == "all-to-all":
            plans[op.rank].add(len(out))
        return out

    monkeypatch.setattr(lowering.Lowering, "_network_plans", counted)
    sc = _ep8_on_9gpu_domains(oversubscription)
    rep = simulate(sc).summary
    assert rep["simulated_ranks"] == 5  # groups 8, 1 + 7 / 7 + 1, 2 + 6 / 6 + 2, ...
    assert dict(plans) == {0: {2}, 8: {2}, 16: {2}, 24: {2}, 32: {1}}
    monkeypatch.setattr(lowering.Lowering, "_network_plans", network_plans)
    exact = simulate(sc, exact=True).summary
    for key in FIGURES:
        assert rep[key] == pytest.approx(exact[key], rel=1e-9, abs=1e-15), key


def test_classes_of_the_straddling_groups_are_their_splits():
    """symmetry.rank_classes on EP8 over 9-GPU domains: the expert group k of each leaf group is
    of class min(k, 8 - k) (a group and its mirror alike: 8, 1 + 7, 2 + 6, 3 + 5, 4 + 4), the
    classes numbered in the order of their first ranks."""
    s = load_scenario(_ep8_on_9gpu_domains())
    classes = rank_classes(s.layout, build_cluster(s.cluster))
    k = np.arange(288) // 8 % 9
    assert classes.tolist() == np.minimum(k, 8 - k).tolist()


def test_least_rotation_names_a_cycle():
    """symmetry._least_rotation equals the least of all rotations (checked exhaustively over
    the cycles of up to 7 beads of 3 colours), so rotations of one cycle get one name."""
    for n in range(1, 8):
        for seq in itertools.product(range(3), repeat=n):
            s = list(seq)
            assert _least_rotation(s) == min(tuple(s[i:] + s[:i]) for i in range(n)), s


@pytest.mark.parametrize("oversubscription", [1.0, 1.5])
def test_only_uplinks_that_cannot_bind_are_left_out(oversubscription):
    """lowering.never_binding on 2,304 GB200 in NVL72 racks: under oversubscription 1 every
    leaf-spine link in either direction (288 rail leaves a direction, each as wide as its 8
    NICs), no NVLink or NIC link; oversubscribed, none."""
    import simpy

    from simulator.network.flows import FlowNetwork

    cluster = {"preset": "gb200-nvl72", "devices": 2304, "network": {"oversubscription": oversubscription}}
    sc = {**_ep8_on_9gpu_domains(), "cluster": cluster, "parallel": {"tp": 1, "pp": 1, "dp": 2304, "ep": 8}}
    sc["training"] = {**sc["training"], "global_batch_size": 2304}
    topo = build_cluster(load_scenario(sc).cluster)
    kinds = np.array(topo.link_kind)
    expected = kinds == "fabric" if oversubscription == 1.0 else np.zeros(kinds.size, dtype=bool)
    assert (kinds == "fabric").sum() == 576
    assert lowering.never_binding(topo, FlowNetwork(simpy.Environment(), topo).capacity).tolist() == expected.tolist()


def test_classes_coarser_than_the_network_distinguishes_are_said():
    """Where refining the classes would give more than symmetry.class_limit (MAX_CLASSES a
    stage, or more on a small world), representative mode simulates the coarser classes of
    the groups' splits, which --exact need not match on every figure: the summary says so
    (and not where refining stays under the limit)."""
    from simulator.engine.symmetry import MAX_CLASSES, _rank_classes, class_limit

    sc = load_scenario(_ep8_on_9gpu_domains(1.0))
    topo = build_cluster(sc.cluster)
    classes, n_refined = _rank_classes(sc.layout, topo)
    assert n_refined > class_limit(sc.layout) >= MAX_CLASSES and len(np.unique(classes)) == 5
    notes = simulate(sc).summary["notes"]
    assert any(
        f"form at least {n_refined} classes, more than the {class_limit(sc.layout)} simulated" in n for n in notes
    )
    small = dict(
        _ep8_on_9gpu_domains(1.0), cluster={"preset": "dgx-h100", "devices": 288, "network": {"domain_size": 12}}
    )
    small_sc = load_scenario(small)
    assert _rank_classes(small_sc.layout, build_cluster(small_sc.cluster))[1] == 0
    assert not any("classes of the groups' splits" in n for n in simulate(small_sc).summary["notes"])
