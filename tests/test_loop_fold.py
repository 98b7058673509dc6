"""The links table plans one group per shape and puts every other twin group's members in
its places (``simulator.results.links._folded``): the same table, to the bit, as planning
each twin group itself (``link_columns(res, fold=False)``), and the same transfers, in the
same order, as ``plan_collective`` gives each group."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import simulate
from simulator.network.collectives import plan_collective
from simulator.results import links as L

# DeepSeek-V3's node-limited all-to-all (hierarchical-a2a) over 8 H800 nodes, two EP groups a
# stage; data-parallel rings over 64 and 128 twin groups; rail rings inside the stage.
NODE_LIMITED = {
    "name": "fold",
    "model": {"preset": "deepseek-v3", "layers": 4},
    "cluster": {"preset": "h800", "devices": 256},
    "parallel": {"tp": 1, "pp": 2, "dp": 128, "ep": 64, "zero": 1},
    "schedule": "1f1b",
    "training": {"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": 256, "dtype": "fp8"},
}


def _case(name: str) -> dict:
    if name == "node-limited":
        return NODE_LIMITED
    if name == "bidir":  # a bidirectional ring for the tensor- and data-parallel collectives
        return {
            **NODE_LIMITED,
            "model": {"preset": "llama3-8b", "layers": 2},
            "parallel": {"tp": 4, "pp": 2, "dp": 32},
            "algorithms": {"all-reduce": "ring-bidir", "all-gather": "ring-bidir", "reduce-scatter": "ring-bidir"},
        }
    return {  # a torus: plans read coordinates, nothing is folded
        **NODE_LIMITED,
        "model": {"preset": "llama3-8b", "layers": 2},
        "cluster": {"preset": "tpu-v5p", "devices": 64},
        "parallel": {"tp": 4, "pp": 2, "dp": 8},
        "training": {"seq_len": 2048, "micro_batch_size": 1, "global_batch_size": 16},
    }


@pytest.fixture(scope="module", params=["node-limited", "bidir", "torus"])
def run(request):
    return request.param, simulate(_case(request.param))


def test_folded_table_equals_every_group_planned(run):
    name, res = run
    a, b = L.link_columns(res, fold=False), L.link_columns(res)
    assert a.keys() == b.keys() and len(a["link"]) > 0
    for k in a:
        assert np.array_equal(a[k], b[k]), (name, k)  # bit for bit


def test_places_give_each_groups_own_plan(run):
    """Every collective's twin groups, rebuilt from the first group of their shape, against
    ``plan_collective`` of each group: the same transfers in the same order."""
    name, res = run
    low, topo = L._lowering(res), res.topology
    shapes: dict = {}
    algorithms, folded, groups_checked = set(), 0, 0
    for rec in res.raw.records:
        op = rec.op
        if op.kind != "collective" or op.size_bytes <= 0:
            continue
        groups = L._groups(low, op, op.group)
        got = L._folded(low, topo, op, groups, shapes)
        if name == "torus":
            assert got is None
            continue
        assert got is not None
        folded += 1
        for g in groups:
            pattern: dict = {}
            key = (op.coll, tuple(pattern.setdefault(d, len(pattern)) for d in topo.domains_of(g).tolist()))
            places = shapes[(*key, op.size_bytes, op.scaleout_fraction)]
            algo = low.algorithms.get(op.coll) if op.scaleout_fraction == 1.0 else None
            plan = plan_collective(
                op.coll, g, op.size_bytes, topo, algorithm=algo, scaleout_fraction=op.scaleout_fraction
            )
            algorithms.add(plan.algorithm)
            members = np.asarray(g)
            assert len(places) == len(plan.phases)
            for (src, dst, nbytes, weight), ph in zip(places, plan.phases):
                assert members[src].tolist() == [t.src for t in ph.transfers]
                assert members[dst].tolist() == [t.dst for t in ph.transfers]
                assert nbytes.tolist() == [t.size_bytes * t.weight for t in ph.transfers]
                assert weight.tolist() == [float(t.weight) for t in ph.transfers]
            groups_checked += 1
    if name == "node-limited":
        assert {"hierarchical-a2a", "ring", "rail-ring"} <= algorithms
    elif name == "bidir":
        assert "ring-bidir" in algorithms
    assert name == "torus" or (folded and groups_checked > folded)  # twins were rebuilt


def test_an_unlike_domain_pattern_is_planned_again():
    """Two groups with the same members per domain in another order do not share places:
    a ring's transfers follow the members' order, so the second is planned itself."""
    res = simulate(NODE_LIMITED)
    low, topo = L._lowering(res), res.topology
    op = next(r.op for r in res.raw.records if r.op.kind == "collective" and r.op.coll == "all-gather")
    a = (0, 1, 8, 9)  # nodes 0, 0, 1, 1
    b = (0, 8, 1, 9)  # nodes 0, 1, 0, 1
    shapes: dict = {}
    for g in (a, b):
        (links, nbytes, flows) = L._folded(low, topo, op, [g], shapes)[0]
        want = L._loads(topo, low._plan(op.coll, g, op.size_bytes, op.scaleout_fraction).phases[0].transfers)
        for x, y in zip((links, nbytes, flows), want):
            assert np.array_equal(x, y)
    assert len(shapes) == 2
