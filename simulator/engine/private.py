"""Private communication: ops whose network phases nothing else can ever meet.

Such an op's timing is known when it starts (its phases run alone on their links, from
their cached isolated evolution, see :mod:`simulator.network.isolated`), so the engine
runs it as a known duration (:func:`known_end`) and may move it into its rank's
compute stream (:func:`absorb`) so that a compute chain runs through it without an
event. ``Engine(..., private_phases=False)`` sends every op through the network.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

from simulator.engine.lowering import Lowering
from simulator.network.flows import FlowNetwork
from workloads.trace.ops import Trace


def private_ops(trace: Trace, lowering: Lowering, sim_ranks: set, members: dict) -> dict[int, tuple]:
    """Communication ops whose timing is known when they start: op id ->
    ``((prepared phase or None, isolated evolution, seconds), ...)`` per phase.

    An op qualifies when it runs in its own stream's process (a send, or a collective
    with no other simulated member), every phase of it has a cached isolated
    evolution, and no link any of its phases loads is loaded by a phase of another
    process (stream, or collective rendezvous) anywhere in the trace. Its stream runs
    one op at a time, so each of its phases is always alone on its links: the
    network would reserve it on arrival and never materialise it, and it ends
    ``steps x latency + evolution`` after it starts (see :mod:`simulator.network.flows`).
    :func:`known_end` books what the network would have booked."""
    users: dict[int, set] = defaultdict(set)  # link -> processes that load it
    shapes: dict[int, tuple] = {}  # id(phases) -> (phases, links, info | None)
    seen: dict[tuple, tuple] = {}  # (id(phases), process) -> shape
    cand: list[tuple[int, tuple, tuple]] = []
    sim = sim_ranks
    for op in trace.ops:
        kind = op.kind
        if kind == "collective":
            n = members.get(op.group)
            if n is None:
                n = members[op.group] = sum(r in sim for r in op.group)
            phases = lowering.collective_phases(op)
            who = (op.rank, op.stream) if n == 1 else ("rendezvous", op.key)
        elif kind == "send":
            phases = lowering.send_transfers(op)
            who = (op.rank, op.stream)
            n = 1
        else:
            continue
        key = (id(phases), who)
        hit = seen.get(key)
        if hit is None:
            hit = shapes.get(id(phases))
            if hit is None:
                merged = phases if kind == "collective" else ((phases, 1, 0.0),)
                hit = shapes[id(phases)] = (phases,) + phase_info(lowering.net, merged)
            seen[key] = hit
            for lk in hit[1]:
                users[lk].add(who)
        if hit[2] is not None and n == 1:
            cand.append((op.id, who, hit))
    private: dict[tuple, bool] = {}
    out = {}
    for oid, who, hit in cand:
        key = (id(hit[0]), who)
        ok = private.get(key)
        if ok is None:
            ok = private[key] = all(len(users[lk]) == 1 for lk in hit[1])  # only ``who``
        if ok:
            out[oid] = hit[2]
    return out


def phase_info(net: FlowNetwork, phases: tuple) -> tuple:
    """``(links loaded, per-phase (prepared, evolution, seconds) or None)`` of merged
    network phases; None where a phase has no cached isolated evolution."""
    links: set[int] = set()
    info: Optional[list] = []
    for transfers, steps, _compute in phases:
        prep = net.prepared(transfers)
        if prep is None:
            if info is not None:
                info.append((None, None, 0.0))
            continue
        arr, link_list, iso = net.isolation(prep)
        links.update(link_list)
        if iso is None:
            info = None
        elif info is not None:
            info.append((prep, iso, steps * prep.latency_s + iso.duration_s))
    return links, None if info is None else tuple(info)


def known_end(net: FlowNetwork, phases: tuple, t: float) -> float:
    """Run a private op's ``phases`` (its entry of :func:`private_ops`) from ``t``: its end, with the
    network's counters and link bytes booked as its reservations would book them
    (``max_concurrent_flows`` counts its flows with those in flight at its start)."""
    st = net.stats
    for prep, iso, dur in phases:
        st.phases_started += 1
        if prep is None:
            continue
        k = len(prep.links)
        st.flows_started += prep.n_transfers
        st.flow_rows_started += k
        st.unit_flows_started += prep.units
        st.reserved_phases += 1
        if net.active_flows + k > st.max_concurrent_flows:
            st.max_concurrent_flows = net.active_flows + k
        st.link_bytes[iso.links] += iso.link_bytes
        t = t + dur
    return t


def absorb(streams: dict, known: dict) -> dict:
    """Move private ops (:func:`private_ops`, ``known``) of a rank's communication streams into
    its compute stream where that changes no start time, so that a compute chain runs
    through them without an event: a run ``a_j .. a_k`` of stream S (each depending
    on the one before alone) joins right after compute op ``c`` when

    * ``a_j`` depends on ``c`` alone and the compute op after ``c`` depends on ``a_k``
      (the compute stream waits for the run anyway, and nothing else of it overlaps it);
    * the op before ``a_j`` in S has ended when ``c`` ends (it was moved before ``c``,
      or the compute stream waited for it at or before ``c``);
    * the op after ``a_k`` in S starts after ``a_k`` ends (it was moved too, or it
      depends on a compute op after the run).

    Returns op id -> the stream that now runs it; ``streams`` is edited in place."""
    moved: dict[int, tuple] = {}
    for (rank, stream), cops in list(streams.items()):
        if stream != "compute":
            continue
        pos = {op.id: i for i, op in enumerate(cops)}
        first_wait: dict[int, int] = {}  # op id -> first compute index depending on it
        for i, op in enumerate(cops):
            for d in op.deps:
                if d not in first_wait:
                    first_wait[d] = i
        claimed: dict[int, list] = {}  # compute index -> the ops moved after it
        for (r2, s2), sops in list(streams.items()):
            if r2 != rank or s2 == "compute":
                continue
            units = _runs_after_compute(sops, cops, pos, claimed, known)
            _keep_safe_runs(units, sops, cops, pos, first_wait)
            if units:
                gone = set()
                for j, (k, i) in units.items():
                    claimed[i] = sops[j : k + 1]
                    gone.update(op.id for op in sops[j : k + 1])
                streams[(r2, s2)] = [op for op in sops if op.id not in gone]
        if not claimed:
            continue
        new = []
        for i, op in enumerate(cops):
            new.append(op)
            run = claimed.get(i)
            if run is not None:
                new.extend(run)
                for a in run:
                    moved[a.id] = (rank, stream)
        streams[(rank, stream)] = new
    return moved


def _runs_after_compute(sops: list, cops: list, pos: dict, claimed: dict, known: dict) -> dict[int, tuple[int, int]]:
    """Candidate runs ``a_j .. a_k`` of stream ``sops``: ``a_j`` depends on compute op
    ``c`` alone (index ``i`` in ``cops``, not yet claimed), each next one on the one
    before alone, and the compute op after ``c`` on ``a_k``. Returns ``{j: (k, i)}``."""
    units: dict[int, tuple[int, int]] = {}  # start j -> (end k, compute index)
    j = 0
    while j < len(sops):
        a = sops[j]
        if a.id in known and len(a.deps) == 1 and a.deps[0] in pos:
            i = pos[a.deps[0]]
            if i not in claimed and i + 1 < len(cops):
                waits = cops[i + 1].deps
                k = j
                while (
                    sops[k].id not in waits
                    and k + 1 < len(sops)
                    and sops[k + 1].id in known
                    and sops[k + 1].deps in ((), (sops[k].id,))
                ):
                    k += 1
                if sops[k].id in waits:
                    units[j] = (k, i)
                    j = k + 1
                    continue
        j += 1
    return units


def _keep_safe_runs(units: dict, sops: list, cops: list, pos: dict, first_wait: dict) -> None:
    """Drop from ``units`` (edited in place), one at a time until none fails, the runs
    whose move could change a start time: the op before the run must have ended when
    its compute op ends, the op after it must start after it, and no two runs may join
    the same compute op."""
    changed = True
    while changed:
        changed = False
        ends = {k: (j, i) for j, (k, i) in units.items()}
        used: set[int] = set()
        for j in sorted(units):
            k, i = units[j]
            if j == 0:
                prev_ok = True
            elif j - 1 in ends:
                prev_ok = ends[j - 1][1] < i
            else:
                prev_ok = first_wait.get(sops[j - 1].id, len(cops)) <= i
            nxt_ok = k + 1 == len(sops) or k + 1 in units or any(pos.get(d, -1) > i for d in sops[k + 1].deps)
            if not (prev_ok and nxt_ok) or i in used:
                del units[j]
                changed = True
                break
            used.add(i)
