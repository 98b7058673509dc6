"""The links table of one step (``links.csv``): bytes, busy fraction and peak concurrent
flows of every loaded network link, by parallelism axis.

Built after the run from the engine's records (nothing is recorded during the run): each
collective instance (one rendezvous ``key``) is planned again as the engine lowered it
(:class:`~simulator.engine.lowering.Lowering` with the scenario's algorithm choice),
together, in representative mode, with the twin groups it stands for, so the table
holds the whole cluster's traffic; each send likewise with its twin pairs. A transfer
loads the links of its route (or of its incidence), ``size_bytes x weight`` on each.

Per link and axis (and per link over every axis, ``axis == "all"``):

* ``bytes``: bytes carried;
* ``busy_fraction``: the union of the ``[start, end]`` spans of the collectives and
  sends that load the link, over the step time -- an upper bound on the time the link
  carries data, since a flow may finish before the collective it belongs to;
* ``peak_flows``: the most flows on the link at once, each collective counting, over its
  whole span, the flows of its busiest phase on that link.
"""

from __future__ import annotations

import numpy as np

LINK_COLUMNS = [
    "link",
    "src",
    "dst",
    "kind",
    "bw_bytes_per_s",
    "axis",
    "bytes",
    "busy_s",
    "busy_fraction",
    "peak_flows",
]


def _lowering(res):
    """A :class:`~simulator.engine.lowering.Lowering` planning as the run did."""
    import simpy

    from simulator.engine.lowering import Lowering
    from simulator.network.flows import FlowNetwork

    sc = res.scenario
    assert sc is not None and res.trace is not None and res.topology is not None
    net = FlowNetwork(simpy.Environment(), res.topology)
    return Lowering(res.trace, res.topology, sc.layout, net, dict(sc.algorithms))


def _loads(topo, transfers) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(links, bytes, flows)`` of ``transfers`` summed per link (links sorted)."""
    links, nbytes, flows = [], [], []
    for t in transfers:
        if t.incidence is not None:
            for lk, m in t.incidence:
                links.append(lk)
                nbytes.append(t.size_bytes * t.weight * m)
                flows.append(t.weight)
        else:
            for lk in topo.route(t.src, t.dst):
                links.append(lk)
                nbytes.append(t.size_bytes * t.weight)
                flows.append(t.weight)
    lk = np.asarray(links, dtype=np.int64)
    uniq, inv = np.unique(lk, return_inverse=True)
    return (
        uniq,
        np.bincount(inv, weights=np.asarray(nbytes, dtype=float), minlength=len(uniq)),
        np.bincount(inv, weights=np.asarray(flows, dtype=float), minlength=len(uniq)),
    )


def _groups(low, op, group: tuple) -> list[tuple]:
    """``group`` and, in representative mode, the groups it stands for: every group of its
    stage along its axis (:meth:`~simulator.engine.lowering.Lowering._twins`), or with one
    simulated rank per class those of its class; unlike the engine, also for a group inside
    one scale-up domain (whose twins the engine leaves out, as they meet none of its links)."""
    if not low.trace.representative:
        return [group]
    rows = low._twins(op.axis, low.layout.stage_of(op.rank), group)
    if low._cls is not None:
        rows = low._class_twins(rows, group)
    return [tuple(g) for g in (rows if isinstance(rows, list) else rows.tolist())]


def _op_loads(low, topo, op, cache: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(links, bytes, peak flows)`` of one collective or send with its twins."""
    stage = low.layout.stage_of(op.rank)
    if op.kind == "send":
        key = ("send", op.rank, op.peer, op.size_bytes, op.axis)
    else:
        key = (op.coll, op.group, op.size_bytes, op.scaleout_fraction, op.axis, stage)
    hit = cache.get(key)
    if hit is not None:
        return hit
    from simulator.network.phases import Transfer

    if op.kind == "send":
        phases = [[Transfer(a, b, op.size_bytes) for a, b in _groups(low, op, (op.rank, op.peer))]]
    else:
        # flows are counted per phase: a plan's phases run one after another, the twins'
        # i-th phases together
        plans = [low._plan(op.coll, g, op.size_bytes, op.scaleout_fraction) for g in _groups(low, op, op.group)]
        depth = max(len(p.phases) for p in plans)
        phases = [[t for p in plans if i < len(p.phases) for t in p.phases[i].transfers] for i in range(depth)]
    links_all, bytes_all = [], []
    flows: dict[int, float] = {}
    for ph in phases:
        lk, b, f = _loads(topo, ph)
        links_all.append(lk)
        bytes_all.append(b)
        for i, n in zip(lk.tolist(), f.tolist()):
            flows[i] = max(flows.get(i, 0.0), n)
    lk = np.concatenate(links_all) if links_all else np.zeros(0, dtype=np.int64)
    b = np.concatenate(bytes_all) if bytes_all else np.zeros(0)
    uniq, inv = np.unique(lk, return_inverse=True)
    hit = cache[key] = (
        uniq,
        np.bincount(inv, weights=b, minlength=len(uniq)),
        np.array([flows[i] for i in uniq.tolist()], dtype=float),
    )
    return hit


def link_columns(res) -> dict[str, np.ndarray]:
    """The links table (``docs/formats.md``, "Links table") of the
    :class:`~simulator.results.result.Result` ``res``, as columns: one row per loaded
    link and axis, then one per loaded link with ``axis == "all"``; sorted by link, then
    axis (``all`` last). Needs the run's trace, topology and records."""
    if res.raw is None or res.trace is None or res.topology is None or res.scenario is None:
        raise KeyError("links: the table needs the run itself (a Result rebuilt from its tables has none)")
    topo = res.topology
    low = _lowering(res)
    # one entry per collective instance (its rendezvous key) or send: span over its records
    spans: dict[str, list] = {}
    for rec in res.raw.records:
        op = rec.op
        if op.kind not in ("collective", "send") or op.size_bytes <= 0:
            continue
        k = op.key or f"op{op.id}"
        s = spans.get(k)
        if s is None:
            spans[k] = [op, rec.start_s, rec.end_s]
        else:
            s[1], s[2] = min(s[1], rec.start_s), max(s[2], rec.end_s)
    axes = sorted({s[0].axis or "none" for s in spans.values()})
    axis_id = {a: i for i, a in enumerate(axes)}
    cache: dict = {}
    parts = []  # (link, axis id, start, end, bytes, flows) per (op, link)
    for op, t0, t1 in spans.values():
        lk, b, f = _op_loads(low, topo, op, cache)
        if len(lk):
            n = len(lk)
            parts.append((lk, np.full(n, axis_id[op.axis or "none"]), np.full(n, t0), np.full(n, t1), b, f))
    if parts:
        link, ax, t0, t1, nb, nf = (np.concatenate(c) for c in zip(*parts))
    else:
        link = ax = np.zeros(0, dtype=np.int64)
        t0 = t1 = nb = nf = np.zeros(0)
    step = float(res.raw.step_time_s)
    per_axis = _aggregate(link, ax, t0, t1, nb, nf, len(axes) + 1)
    overall = _aggregate(link, np.full(len(link), len(axes)), t0, t1, nb, nf, len(axes) + 1)
    rows = [np.concatenate([a, b]) for a, b in zip(per_axis, overall)]
    g_link, g_axis, g_bytes, g_busy, g_peak = rows
    order = np.lexsort((g_axis, g_link))
    g_link, g_axis, g_bytes, g_busy, g_peak = (c[order] for c in rows)
    names = np.array([*axes, "all"], dtype=object)
    ends = [topo.link_endpoints(int(i)) for i in g_link.tolist()]
    return {
        "link": g_link.astype(np.int64),
        "src": np.array([str(u) for u, _ in ends], dtype=object),
        "dst": np.array([str(v) for _, v in ends], dtype=object),
        "kind": np.array([topo.link_kind[i] for i in g_link.tolist()], dtype=object),
        "bw_bytes_per_s": topo.link_capacity[g_link].astype(float),
        "axis": names[g_axis],
        "bytes": g_bytes,
        "busy_s": g_busy,
        "busy_fraction": g_busy / step if step > 0 else np.zeros(len(g_busy)),
        "peak_flows": g_peak.astype(np.int64),
    }


def _aggregate(link, ax, t0, t1, nb, nf, n_axes: int):
    """Per (link, axis) group: ``(link, axis, bytes, union of spans, peak concurrent flows)``."""
    if not len(link):
        z = np.zeros(0)
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), z, z, z
    gid = link.astype(np.int64) * n_axes + ax
    groups, inv = np.unique(gid, return_inverse=True)
    inv = inv.reshape(-1)
    total = np.bincount(inv, weights=nb, minlength=len(groups))
    # union of spans: sort by group then start; spans of later groups are pushed past the
    # earlier ones by an offset, so one running maximum of the ends serves every group
    width = float(max(t1.max(), 0.0)) + 1.0
    off = inv * width
    order = np.lexsort((t0, inv))
    s, e, g = t0[order] + off[order], t1[order] + off[order], inv[order]
    reach = np.maximum.accumulate(e)
    before = np.concatenate([[-np.inf], reach[:-1]])
    before = np.where(np.concatenate([[True], g[1:] != g[:-1]]), -np.inf, before)
    covered = np.clip(e - np.maximum(s, before), 0.0, None)
    busy = np.bincount(g, weights=covered, minlength=len(groups))
    # peak flows: +flows at a start, -flows at an end (ends first at one instant); each
    # group's changes sum to zero, so one running sum over all groups serves each
    times = np.concatenate([t0, t1])
    delta = np.concatenate([nf, -nf])
    starts = np.concatenate([np.ones(len(t0)), np.zeros(len(t1))])
    gg = np.concatenate([inv, inv])
    order = np.lexsort((starts, times, gg))
    level = np.cumsum(delta[order])
    gs = gg[order]
    first = np.flatnonzero(np.concatenate([[True], gs[1:] != gs[:-1]]))
    peak = np.maximum.reduceat(level, first)
    return groups // n_axes, groups % n_axes, total, busy, np.rint(peak)
