"""The links table's columnar sums (``simulator.results.links._rows`` and ``_loads``) give
what a loop over the patterns and transfers gives, to the bit: bytes per (link, axis) added
one pattern after another, each transfer's route (or incidence) in order, one timing per
signature; on a MoE step with an all-to-all (routes) and a torus step (incidences)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import scenario
from test_moe import moe_scenario

from simulator import simulate
from simulator.results import links as L


def _loop_loads(topo, transfers):
    """``_loads`` as a loop: each transfer's links one by one."""
    lk, nb, fl = [], [], []
    for t in transfers:
        pairs = t.incidence if t.incidence is not None else [(x, 1) for x in topo.route(t.src, t.dst)]
        for link, m in pairs:
            lk.append(link)
            nb.append(t.size_bytes * t.weight * m if t.incidence is not None else t.size_bytes * t.weight)
            fl.append(t.weight)
    uniq, inv = np.unique(np.asarray(lk, dtype=np.int64), return_inverse=True)
    return (
        uniq,
        np.bincount(inv, weights=np.asarray(nb, dtype=float)),
        np.bincount(inv, weights=np.asarray(fl, dtype=float)),
    )


def _loop_rows(loads, count, pats, t0, t1, n_axes):
    """``_rows`` as a loop over the patterns, a dict per (link, axis), sorted at the end."""
    out: dict = {}
    for p, (links, nbytes, flows, ax) in enumerate(loads):
        for lk, b, f in zip(links.tolist(), (nbytes * count[p]).tolist(), flows.tolist()):
            for key in ((lk, ax), (lk, n_axes)):
                row = out.setdefault(key, [0.0, []])
                row[0] += b
                row[1].append((p, f))
    rows = sorted((lk, ax, b, *L._busy_and_peak(tuple(sig), pats, t0, t1)) for (lk, ax), (b, sig) in out.items())
    return [np.asarray(c) for c in zip(*rows)]


@pytest.fixture(scope="module", params=["moe", "torus"])
def run(request):
    if request.param == "moe":
        return simulate(moe_scenario())
    return simulate(scenario(cluster={"preset": "tpu-v5p", "devices": 16}, parallel={"tp": 2, "pp": 2, "dp": 4}))


def _patterns(res):
    """Every pattern's loads, its op count and the ops' spans, as ``link_columns`` gathers them."""
    low = L._lowering(res)
    spans: dict = {}
    for rec in res.raw.records:
        op = rec.op
        if op.kind in ("collective", "send") and op.size_bytes > 0:
            s = spans.setdefault(op.key or f"op{op.id}", [op, rec.start_s, rec.end_s])
            s[1], s[2] = min(s[1], rec.start_s), max(s[2], rec.end_s)
    axes = sorted({s[0].axis or "none" for s in spans.values()})
    pattern, loads, pats, t0, t1 = {}, [], [], [], []
    for op, a, b in spans.values():
        k = L._op_key(low, op)
        if k not in pattern:
            pattern[k] = len(loads)
            loads.append((*L._op_loads(low, res.topology, op), axes.index(op.axis or "none")))
        pats.append(pattern[k])
        t0.append(a)
        t1.append(b)
    pats = np.asarray(pats, dtype=np.int64)
    return (
        low,
        loads,
        np.bincount(pats, minlength=len(loads)).astype(float),
        pats,
        np.asarray(t0),
        np.asarray(t1),
        len(axes),
    )


def test_columnar_rows_equal_the_loop(run):
    _, loads, count, pats, t0, t1, n_axes = _patterns(run)
    assert len(loads) > 1
    got = L._rows(loads, count, pats, t0, t1, n_axes)
    want = _loop_rows(loads, count, pats, t0, t1, n_axes)
    assert len(got[0]) == len(want[0]) > 0
    for g, w in zip(got, want):
        assert np.array_equal(g, w)  # bit for bit


def test_vectorised_loads_equal_the_loop(run):
    low, *_ = _patterns(run)
    seen = 0
    for rec in run.raw.records:
        op = rec.op
        if op.kind != "collective" or op.size_bytes <= 0:
            continue
        groups = L._groups(low, op, op.group)
        plans = [low._plan(op.coll, g, op.size_bytes, op.scaleout_fraction) for g in groups]
        for p in plans:
            for ph in p.phases:
                got, want = L._loads(run.topology, ph.transfers), _loop_loads(run.topology, ph.transfers)
                for g, w in zip(got, want):
                    assert np.array_equal(g, w)
                seen += 1
        if seen > 40:
            break
    assert seen


def test_mixed_incidence_and_routed_transfers():
    """A phase with both kinds of transfer takes the loop path, in transfer order; one of
    routed transfers alone (weights, a transfer to itself) the vectorised one."""
    from simulator.network.phases import Transfer

    res = simulate(scenario(cluster={"preset": "dgx-h100", "devices": 16}, parallel={"tp": 8, "pp": 1, "dp": 2}))
    topo = res.topology
    r = topo.route(0, 9)  # across two nodes
    ts = [
        Transfer(0, 9, 1e6),
        Transfer(1, 2, 3e6, incidence=((r[0], 2.0), (r[-1], 1.0))),
        Transfer(0, 9, 5e5, weight=3),
    ]
    routed = [ts[0], ts[2], Transfer(3, 3, 1e6), Transfer(2, 12, 7e5, weight=2)]  # the vectorised path
    for phase in (ts, routed):
        for g, w in zip(L._loads(topo, phase), _loop_loads(topo, phase)):
            assert np.array_equal(g, w)
