"""The links table of one step (``links.csv``): bytes, busy fraction and peak concurrent
flows of every loaded network link, by parallelism axis.

Built after the run from the engine's records (nothing is recorded during the run): each
collective instance (one rendezvous ``key``) is planned again as the engine lowered it
(:class:`~simulator.engine.lowering.Lowering` with the scenario's algorithm choice),
together, in representative mode, with the twin groups it stands for, so the table
holds the whole cluster's traffic; each send likewise with its twin pairs. A transfer
loads the links of its route (or of its incidence), ``size_bytes x weight`` on each. On a
switched network the groups of one domain pattern share one plan, each with its own members
in its places (:func:`_folded`): the same transfers as planning each group.

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
    """``(links, bytes, flows)`` of ``transfers`` summed per link (links sorted). The routes
    come from one vectorised :meth:`~topologies.topology.Topology.routes` call; each link's
    sums add the transfers in their order, as one by one."""
    ts = list(transfers)
    plain = [t for t in ts if t.incidence is None]
    if len(plain) == len(ts):  # all routed
        return _routed_loads(
            topo,
            [t.src for t in ts],
            [t.dst for t in ts],
            np.array([t.size_bytes * t.weight for t in ts], dtype=float),
            np.array([t.weight for t in ts], dtype=float),
        )
    rows = topo.routes([t.src for t in plain], [t.dst for t in plain]) if plain else np.zeros((0, 1), dtype=np.int64)
    links, nb, fl = [], [], []
    routed = iter(rows.tolist())
    for t in ts:
        if t.incidence is not None:
            for link, m in t.incidence:
                links.append(link)
                nb.append(t.size_bytes * t.weight * m)
                fl.append(t.weight)
        else:
            for link in next(routed):
                if link >= 0:
                    links.append(link)
                    nb.append(t.size_bytes * t.weight)
                    fl.append(t.weight)
    lk = np.asarray(links, dtype=np.int64)
    nbytes, flows = np.asarray(nb, dtype=float), np.asarray(fl, dtype=float)
    return _summed(lk, nbytes, flows)


def _routed_loads(topo, src, dst, nbytes: np.ndarray, flows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_loads` of routed transfers given as columns (``nbytes``: each transfer's
    ``size_bytes x weight``, ``flows``: its weight): the rows in order, each row's links in
    route order."""
    rows = topo.routes(src, dst) if len(nbytes) else np.zeros((0, 1), dtype=np.int64)
    hops = (rows >= 0).sum(axis=1)
    return _summed(rows[rows >= 0], np.repeat(nbytes, hops), np.repeat(flows, hops))


def _summed(lk: np.ndarray, nbytes: np.ndarray, flows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(links, bytes, flows)``: each link's entries added in order (links sorted)."""
    uniq, inv = np.unique(lk, return_inverse=True)
    return (
        uniq,
        np.bincount(inv, weights=nbytes, minlength=len(uniq)),
        np.bincount(inv, weights=flows, minlength=len(uniq)),
    )


def _groups(low, op, group: tuple) -> list[tuple]:
    """``group`` and, in representative mode, the groups it stands for: every group of its
    stage along its axis (:meth:`~simulator.engine.lowering.Lowering._twins`), or with one
    simulated rank per class those of its class; also for a group inside one scale-up domain
    (whose twins the engine leaves out with one simulated rank per stage, as they meet none of
    its links)."""
    if not low.trace.representative:
        return [group]
    rows = low._twins(op.axis, low.layout.stage_of(op.rank), group)
    if low._cls is not None:
        rows = low._class_twins(rows, group)
    return [tuple(g) for g in (rows if isinstance(rows, list) else rows.tolist())]


def _op_key(low, op) -> tuple:
    """What fixes an op's loads: its shape, axis and stage (the twins it stands for)."""
    if op.kind == "send":
        return ("send", op.rank, op.peer, op.size_bytes, op.axis)
    return (op.coll, op.group, op.size_bytes, op.scaleout_fraction, op.axis, low.layout.stage_of(op.rank))


def _op_loads(low, topo, op, fold: dict | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(links, bytes, peak flows)`` of one collective or send with its twins. ``fold``: the
    plans by shape (:func:`_folded`), or None to plan every twin group."""
    from simulator.network.phases import Transfer

    if op.kind == "send":
        per_phase = [_loads(topo, [Transfer(a, b, op.size_bytes) for a, b in _groups(low, op, (op.rank, op.peer))])]
    else:
        groups = _groups(low, op, op.group)
        folded = _folded(low, topo, op, groups, fold) if fold is not None else None
        if folded is not None:
            per_phase = folded
        else:
            # flows are counted per phase: a plan's phases run one after another, the twins'
            # i-th phases together
            plans = [low._plan(op.coll, g, op.size_bytes, op.scaleout_fraction) for g in groups]
            depth = max(len(p.phases) for p in plans)
            phases = [[t for p in plans if i < len(p.phases) for t in p.phases[i].transfers] for i in range(depth)]
            per_phase = [_loads(topo, ph) for ph in phases]
    lk = np.concatenate([x[0] for x in per_phase]) if per_phase else np.zeros(0, dtype=np.int64)
    b = np.concatenate([x[1] for x in per_phase]) if per_phase else np.zeros(0)
    f = np.concatenate([x[2] for x in per_phase]) if per_phase else np.zeros(0)
    uniq, inv = np.unique(lk, return_inverse=True)
    peak = np.zeros(len(uniq))  # each link's flows in its busiest phase
    np.maximum.at(peak, inv, f)
    return uniq, np.bincount(inv, weights=b, minlength=len(uniq)), peak


# Algorithms whose phases read a group only through its members' order and its split into
# domains (simulator/network/alltoall.py, reductions.py, collectives.py): a group with the
# same domain pattern gets the same transfers with its own members in the same places.
_LABEL_ONLY = frozenset({"ring", "ring-bidir", "rail-ring", "direct", "hierarchical-a2a"})


def _folded(low, topo, op, groups: list[tuple], fold: dict) -> list | None:
    """:func:`_loads` of each phase of collective ``op`` over every group of ``groups``
    together (the i-th phases of the groups' plans as one), from one plan per shape, or None
    where a group's plan cannot be had so.

    On a switched network the algorithm :func:`~simulator.network.collectives.plan_collective`
    runs depends on a group only through how many of its members each domain holds, and the
    algorithms of ``_LABEL_ONLY`` read the group only through its members' order and its
    split into domains (:func:`~simulator.network.plans.split_by_domain`). So two groups
    with the same domain pattern (each member's domain, numbered by first appearance), the
    same size and scale-out fraction get the same transfers, in the same order, with the
    second group's members in the first's places. ``fold`` keeps each shape's plan as places
    (group positions); the twin groups are not planned again (DeepSeek-V3 on 2,048 H800:
    3,564 plans down to 16, among them 64 node-limited all-to-alls of 896 transfers each)."""
    if topo.kind == "torus" or op.kind != "collective":
        return None
    per_group = []
    for g in groups:
        pattern: dict = {}
        key = (
            op.coll,
            tuple(pattern.setdefault(d, len(pattern)) for d in topo.domains_of(g).tolist()),
            op.size_bytes,
            op.scaleout_fraction,
        )
        places = fold.get(key)
        if places is None:
            places = fold[key] = _places(low._plan(op.coll, g, op.size_bytes, op.scaleout_fraction), g)
        if places == ():
            return None
        per_group.append((np.asarray(g, dtype=np.int64), places))
    depth = max((len(places) for _, places in per_group), default=0)
    out = []
    for i in range(depth):
        cols = [(m[ph[0]], m[ph[1]], ph[2], ph[3]) for m, places in per_group if i < len(places) for ph in [places[i]]]
        out.append(_routed_loads(topo, *(np.concatenate(c) for c in zip(*cols))))
    return out


def _places(plan, group: tuple) -> tuple:
    """``plan`` (over ``group``) as columns per phase: each transfer's source and destination
    as positions in ``group``, its ``size_bytes x weight`` and its weight; ``()`` for a plan
    of another algorithm than ``_LABEL_ONLY``'s, or with incidences."""
    if plan.algorithm not in _LABEL_ONLY or any(t.incidence is not None for ph in plan.phases for t in ph.transfers):
        return ()
    at = {d: i for i, d in enumerate(group)}
    return tuple(
        (
            np.array([at[t.src] for t in ph.transfers], dtype=np.int64),
            np.array([at[t.dst] for t in ph.transfers], dtype=np.int64),
            np.array([t.size_bytes * t.weight for t in ph.transfers], dtype=float),
            np.array([t.weight for t in ph.transfers], dtype=float),
        )
        for ph in plan.phases
    )


def link_columns(res, fold: bool = True) -> dict[str, np.ndarray]:
    """The links table (``docs/formats.md``, "Links table") of the
    :class:`~simulator.results.result.Result` ``res``, as columns: one row per loaded
    link and axis, then one per loaded link with ``axis == "all"``; sorted by link, then
    axis (``all`` last). Needs the run's trace, topology and records. ``fold=False`` plans
    every twin group itself instead of one group per shape (:func:`_folded`; the same
    table, tests compare)."""
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
    # ops of one shape, axis and stage load the same links alike: one pattern each
    shapes: dict | None = {} if fold else None  # plans by shape, as places (_folded)
    pattern: dict = {}  # op key -> pattern index
    loads: list = []  # per pattern: (links, bytes, flows, axis id)
    op_pat, op_t0, op_t1 = [], [], []
    for op, t0, t1 in spans.values():
        k = _op_key(low, op)
        p = pattern.get(k)
        if p is None:
            p = pattern[k] = len(loads)
            loads.append((*_op_loads(low, topo, op, shapes), axis_id[op.axis or "none"]))
        op_pat.append(p)
        op_t0.append(t0)
        op_t1.append(t1)
    pats = np.asarray(op_pat, dtype=np.int64)
    count = np.bincount(pats, minlength=len(loads)).astype(float)
    t0, t1 = np.asarray(op_t0, dtype=float), np.asarray(op_t1, dtype=float)
    rows = _rows(loads, count, pats, t0, t1, len(axes))
    order = np.lexsort((rows[1], rows[0]))
    g_link, g_axis, g_bytes, g_busy, g_peak = (c[order] for c in rows)
    step = float(res.raw.step_time_s)
    names = np.array([*axes, "all"], dtype=object)
    # each link's names and kind once (a link has a row per axis loading it, and ``all``)
    uniq, at = np.unique(g_link, return_inverse=True)
    ends = [topo.link_endpoints(i) for i in uniq.tolist()]
    return {
        "link": g_link.astype(np.int64),
        "src": np.array([str(u) for u, _ in ends], dtype=object)[at],
        "dst": np.array([str(v) for _, v in ends], dtype=object)[at],
        "kind": np.array([topo.link_kind[i] for i in uniq.tolist()], dtype=object)[at],
        "bw_bytes_per_s": topo.link_capacity[g_link].astype(float),
        "axis": names[g_axis],
        "bytes": g_bytes,
        "busy_s": g_busy,
        "busy_fraction": g_busy / step if step > 0 else np.zeros(len(g_busy)),
        "peak_flows": g_peak.astype(np.int64),
    }


def _rows(loads: list, count: np.ndarray, pats, t0, t1, n_axes: int):
    """``(link, axis id, bytes, busy seconds, peak flows)`` per loaded (link, axis) and per
    loaded link over every axis (axis id ``n_axes``), sorted by link and axis, from the
    patterns' loads, each pattern's op count and the ops' spans. Links loaded by the same
    patterns with the same flows share one timing, computed once (:func:`_busy_and_peak`).

    Columnar: every (pattern, link) entry twice (its axis, and ``all``), grouped by (link,
    axis) with the patterns in order; each group's bytes added one pattern after another (a
    pass per position in the groups), the sums of a loop over the patterns to the bit."""
    if not loads or not sum(len(ld[0]) for ld in loads):
        return [np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0), np.zeros(0)]
    sizes = [len(ld[0]) for ld in loads]
    link = np.concatenate([ld[0] for ld in loads]).astype(np.int64)
    nbytes = np.concatenate([ld[1] * count[p] for p, ld in enumerate(loads)])
    flows = np.concatenate([ld[2] for ld in loads]).astype(float)
    pat = np.repeat(np.arange(len(loads), dtype=np.int64), sizes)
    axis = np.repeat(np.array([ld[3] for ld in loads], dtype=np.int64), sizes)
    link, pat, nbytes, flows = (np.concatenate([x, x]) for x in (link, pat, nbytes, flows))
    axis = np.concatenate([axis, np.full(len(axis), n_axes, dtype=np.int64)])
    order = np.lexsort((pat, axis, link))
    link, axis, pat, nbytes, flows = link[order], axis[order], pat[order], nbytes[order], flows[order]
    first = np.flatnonzero(np.r_[True, (link[1:] != link[:-1]) | (axis[1:] != axis[:-1])])
    size = np.diff(np.r_[first, len(link)])
    total = nbytes[first].copy()  # 0.0 + the first pattern's bytes
    for j in range(1, int(size.max())):
        more = size > j
        total[more] += nbytes[first[more] + j]
    # each group's signature, its (pattern, flows) pairs in order, as the bytes of one number
    # per pair: equal bytes, equal signatures; numbered by first appearance
    _, flow_code = np.unique(flows, return_inverse=True)
    buf = (pat * (int(flow_code.max()) + 1) + flow_code.ravel()).astype(np.int64).tobytes()
    number: dict[bytes, int] = {}
    lo, hi = (first * 8).tolist(), ((first + size) * 8).tolist()
    sig_of = np.fromiter((number.setdefault(buf[a:b], len(number)) for a, b in zip(lo, hi)), np.int64, len(lo))
    pl, fl = pat.tolist(), flows.tolist()
    timing = np.empty((len(number), 2))  # per signature: busy seconds, peak flows
    for k, g in enumerate(np.unique(sig_of, return_index=True)[1].tolist()):  # a group of each
        a, n = int(first[g]), int(size[g])
        timing[k] = _busy_and_peak(tuple(zip(pl[a : a + n], fl[a : a + n])), pats, t0, t1)
    return [link[first], axis[first], total, timing[sig_of, 0], timing[sig_of, 1]]


def _busy_and_peak(sig: tuple, pats: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> tuple[float, float]:
    """For a link loaded by the patterns of ``sig`` (``(pattern, flows)`` pairs): the union
    of the spans of their ops, and the most flows at once (an op's flows from its start to
    its end; at one instant the ends come before the starts)."""
    flows_of = np.zeros(int(pats.max()) + 1 if len(pats) else 0)
    mine = np.zeros(len(flows_of), dtype=bool)
    for p, f in sig:
        flows_of[p] = f
        mine[p] = True
    sel = mine[pats]
    s, e, f = t0[sel], t1[sel], flows_of[pats[sel]]
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    before = np.concatenate([[-np.inf], reach[:-1]])
    busy = float(np.clip(e - np.maximum(s, before), 0.0, None).sum())
    times = np.concatenate([t0[sel], t1[sel]])
    delta = np.concatenate([f, -f])
    is_start = np.concatenate([np.ones(len(f)), np.zeros(len(f))])
    level = np.cumsum(delta[np.lexsort((is_start, times))])
    return busy, float(np.rint(level.max()))
