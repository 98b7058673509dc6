"""Straddling layouts simulate fast (issue 39 part 3): in representative mode with one simulated
rank per class, every refined class is simulated; the lowering plans a group's collective once
whichever of its simulated members asks, the twin groups that are not images of the simulated
group fold into one quotient plan per orbit, and the figures stay --exact's."""

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
from simulator.network.phases import Transfer
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
def test_every_refined_class_is_simulated_and_figures_stay_exact(monkeypatch, oversubscription):
    """Each position of a leaf group (72 ranks: 9 expert groups over 8 domains) is a class of
    its own, and all 72 are simulated; each expert all-to-all runs as one plan (its group's
    translates in the other 3 leaf groups fold into it as images), and every device figure
    equals --exact's to 1e-9: with the leaf uplinks loaded (4:1) and, at 1:1, left out of the
    representative run's transfers (lowering.never_binding) while --exact loads them. The 5
    coarser classes of the groups' splits, simulated here before, also matched --exact on
    this layout, but not on DeepSeek-V3 EP64 on 576 GB200 (test_symmetry.py's STRADDLING)."""
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
    assert rep["simulated_ranks"] == 72
    assert dict(plans) == {r: {1} for r in range(0, 72, 8)}  # one member per group asks
    assert not any("coarser" in n for n in rep["notes"])
    monkeypatch.setattr(lowering.Lowering, "_network_plans", network_plans)
    exact = simulate(sc, exact=True).summary
    for key in FIGURES:
        assert rep[key] == pytest.approx(exact[key], rel=1e-9, abs=1e-15), key


def test_classes_of_the_straddling_groups_are_positions_in_a_leaf_group():
    """symmetry.rank_classes on EP8 over 9-GPU domains: refined until stable, the classes are
    the 72 positions of a leaf group (8 domains, 9 expert groups), numbered in the order of
    their first ranks; they refine the groups' splits (group k of a leaf group splits as
    group 8 - k does, its mirror image, which refining tells apart)."""
    s = load_scenario(_ep8_on_9gpu_domains())
    classes = rank_classes(s.layout, build_cluster(s.cluster))
    assert classes.tolist() == (np.arange(288) % 72).tolist()


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


def test_members_of_a_group_share_its_phases():
    """With one simulated rank per class, Lowering.collective_phases lowers a collective once per
    group and stage, whichever simulated member asks first (its plan, twins and quotients read
    the rank only for its stage): each member's own lowering, in a fresh Lowering, equals the
    shared one. EP8 on 288 GPUs in 9-GPU domains simulates 72 ranks, several in each expert
    group (DeepSeek-V3 EP64 on 2,304 GB200 in NVL72 racks: 7.4 -> 2.0 CPU-s at 5 layers on 576)."""
    import simpy

    from simulator.engine.symmetry import representative_trace
    from simulator.network.flows import FlowNetwork

    s = load_scenario(_ep8_on_9gpu_domains())
    topo = build_cluster(s.cluster)
    trace = representative_trace(s.workload(), s.layout, topo)
    sim = set(trace.ranks)

    def fresh():
        return lowering.Lowering(trace, topo, s.layout, FlowNetwork(simpy.Environment(), topo))

    by_group: dict = collections.defaultdict(list)
    for op in trace.ops:
        if op.kind == "collective" and sum(r in sim for r in op.group) > 1:
            by_group[(op.coll, op.group, op.size_bytes, op.axis)].append(op)
    shared = fresh()
    checked = 0
    for ops in by_group.values():
        ranks = {op.rank: op for op in ops}
        if len(ranks) < 2:
            continue
        a, b = list(ranks.values())[:2]
        assert shared.collective_phases(a) is shared.collective_phases(b)
        assert fresh().collective_phases(b) == shared.collective_phases(a)
        checked += 1
    assert checked >= 4


def test_links_users_count_processes():
    """private._users counts the distinct processes loading each link, in one pass over the
    arrays (each process's arrays in turn), as sorting every (process, link) pair does; the
    processes' arrays come interleaved and overlap."""
    from simulator.engine.private import _users

    rng = np.random.default_rng(7)
    n_links = 50
    loads = [
        (rng.choice(n_links, size=int(rng.integers(1, 20)), replace=False), int(rng.integers(0, 9))) for _ in range(60)
    ]
    pairs = {(w, int(lk)) for a, w in loads for lk in a}
    expected = np.bincount([lk for _, lk in pairs], minlength=n_links)
    assert _users(loads, n_links).tolist() == expected.tolist()
    assert _users([], n_links).tolist() == [0] * n_links


def test_transfers_leave_out_exactly_the_links_that_cannot_bind():
    """Lowering._binding_only (routes checked as arrays, only the transfers through a link that
    cannot bind rebuilt) gives each transfer of a lowered collective its route less the
    never_binding links as incidence, and leaves the others as they are; equal groups that are
    different tuples share one cache number (Lowering._group_id)."""
    import simpy

    from simulator.engine.symmetry import representative_trace
    from simulator.network import collectives
    from simulator.network.flows import FlowNetwork

    s = load_scenario(_ep8_on_9gpu_domains(1.0))
    topo = build_cluster(s.cluster)
    trace = representative_trace(s.workload(), s.layout, topo)
    low = lowering.Lowering(trace, topo, s.layout, FlowNetwork(simpy.Environment(), topo))
    drop = low._never_binding()
    assert drop.any()
    changed = 0
    for op in [op for op in trace.ops if op.kind == "collective"][:40]:
        merged = collectives.merged_phases(low.net, low._network_plans(op))
        for (before, _, _), (after, _, _) in zip(merged, low._binding_only(merged)):
            for t, u in zip(before, after, strict=True):
                if t.incidence is None and t.src != t.dst and t.size_bytes > 0:
                    route = [int(lk) for lk in low.net.routes(np.array([t.src]), np.array([t.dst]))[0][0] if lk >= 0]
                    kept = tuple((lk, 1.0) for lk in route if not drop[lk])
                    expected = t if len(kept) == len(route) else Transfer(t.src, t.dst, t.size_bytes, t.weight, kept)
                else:
                    inc = t.incidence and tuple((lk, m) for lk, m in t.incidence if not drop[lk])
                    expected = t if inc == t.incidence else Transfer(t.src, t.dst, t.size_bytes, t.weight, inc)
                assert u == expected
                changed += u != t
        assert low._group_id(tuple(list(op.group))) == low._group_id(op.group)
    assert changed > 0


def test_class_twins_as_arrays_equal_the_groups_one_by_one():
    """Lowering._class_twins on an array of groups (classes sorted and compared as arrays)
    picks the same twins, in the same order, as on the same groups as a list of tuples (one
    group at a time), for every expert and expert-data-parallel group of each stage, and
    for the sends' translated pairs."""
    import simpy

    from simulator.engine.symmetry import representative_trace
    from simulator.network.flows import FlowNetwork

    s = load_scenario({**_ep8_on_9gpu_domains(), "parallel": {"tp": 1, "pp": 2, "dp": 144, "ep": 8}})
    topo = build_cluster(s.cluster)
    trace = representative_trace(s.workload(), s.layout, topo)
    low = lowering.Lowering(trace, topo, s.layout, FlowNetwork(simpy.Environment(), topo))
    picked = 0
    for axis in ("ep", "edp", "pp"):
        for stage in range(2):
            rows = low._twins(axis, stage, (0, 144) if axis == "pp" else s.layout.group(144 * stage, axis))
            for group in map(tuple, rows.tolist()):
                if not low._sim[list(group)].any():
                    continue
                fast = low._class_twins(rows, group)
                assert fast.tolist() == low._class_twins([tuple(r) for r in rows.tolist()], group).tolist()
                picked += len(fast)
    assert picked > 2 * len(trace.ranks)


def test_one_rank_per_stage_leaves_out_the_uplinks_that_cannot_bind(monkeypatch):
    """Representative mode with one simulated rank per stage (the classes over the op budget)
    leaves out the never_binding uplinks too: EP16 PP2 on 96 H100 in 12-GPU domains under 1:1
    leaves, every twin group injected (twin_quotient=False, the network as it is), gives the
    step, exposed communication and bubble it gives with the uplinks, to 1e-12."""
    from simulator.engine import symmetry

    model = dict(TINY_MOE, moe={**TINY_MOE["moe"], "experts": 16})
    sc = scenario(
        model=model,
        cluster={"preset": "dgx-h100", "devices": 96, "network": {"domain_size": 12}},
        parallel={"tp": 1, "pp": 2, "dp": 48, "ep": 16},
        training={"seq_len": 1024, "micro_batch_size": 1, "global_batch_size": 192},
    )
    monkeypatch.setattr(symmetry, "MAX_CLASS_OPS", 1)  # one rank per stage
    calls = []
    real = lowering.Lowering._binding_only

    def spy(self, phases):
        out = real(self, phases)
        calls.append(out != phases)
        return out

    monkeypatch.setattr(lowering.Lowering, "_binding_only", spy)
    dropped = simulate(sc, twin_quotient=False).summary
    assert dropped["simulated_ranks"] == 2 and any(calls)  # some transfers lost an uplink
    monkeypatch.setattr(lowering.Lowering, "_binding_only", lambda self, phases: phases)
    kept = simulate(sc, twin_quotient=False).summary
    for key in ("step_time_s", "exposed_comm_fraction", "bubble_fraction"):
        assert dropped[key] == pytest.approx(kept[key], rel=1e-12, abs=1e-15), key
