"""Private communication: ops whose network phases nothing else can ever meet.

Such an op's timing is known when it starts (its phases run alone on their links, from
their cached isolated evolution, see :mod:`simulator.network.isolated`), so the engine
runs it as a known duration (:func:`private_ops`' durations, its network counters
booked by :class:`PrivateBook`) and may move it into its rank's
compute stream (:func:`absorb`) so that a compute chain runs through it without an
event. ``Engine(..., private_phases=False)`` sends every op through the network.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from simulator.engine.lowering import Lowering
from simulator.engine.ordering import RankWindows
from simulator.network.flows import FlowNetwork
from workloads.trace.ops import Trace


def private_ops(
    trace: Trace, lowering: Lowering, sim_ranks: set, members: dict, solo: dict | None = None
) -> tuple[dict[int, tuple], PrivateBook]:
    """Communication ops whose timing is known when they start, and the book of what
    they put on the network: ``({op id: (durations, code, most flows, links now)}, book)``
    (see :class:`PrivateBook`). ``solo``, where given, receives op id -> merged phases of
    every collective with no other simulated member (the phases looked up here once, which
    the engine's stream then runs without looking them up again).

    An op qualifies when it runs in its own stream's process (a send, or a collective
    with no other simulated member), every phase of it has a cached isolated
    evolution, and no link any of its phases loads is loaded by a phase of another
    process (stream, or collective rendezvous) anywhere in the trace. Its stream runs
    one op at a time, so each of its phases is always alone on its links: the
    network would reserve it on arrival and never materialise it, and it ends
    ``steps x latency + evolution`` after it starts (see :mod:`simulator.network.flows`):
    the sum, in phase order, of ``durations``."""
    loads: list[tuple[np.ndarray, int]] = []  # (links, process number) of each (shape, process)
    procs: dict = {}  # process -> its number
    arrays: dict[int, np.ndarray] = {}  # id(phases) -> its links, as an array
    shapes: dict[int, tuple] = {}  # id(phases) -> (phases, links, info | None)
    seen: dict[tuple, tuple] = {}  # (id(phases), process) -> shape
    cand: list[tuple[int, tuple, tuple]] = []
    sim = sim_ranks
    # group -> (group, its simulated members), found by the tuple's identity (a layout hands
    # every member of a group its one tuple): an expert group of 64 ranks is not hashed per op
    by_id: dict[int, tuple] = {}
    phases_of = lowering.collective_phases
    for op in trace.ops:
        kind = op.kind
        if kind == "collective":
            group = op.group
            hit = by_id.get(id(group))
            if hit is None or hit[0] is not group:
                n = members.get(group)
                if n is None:
                    n = members[group] = sum(r in sim for r in group)
                hit = by_id[id(group)] = (group, n)
            n = hit[1]
            phases = phases_of(op)
            if n == 1:
                who = (op.rank, op.stream)
                if solo is not None:
                    solo[op.id] = phases
            else:
                who = ("rendezvous", op.key)
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
                arrays[id(phases)] = np.fromiter(hit[1], dtype=np.int64, count=len(hit[1]))
            seen[key] = hit
            loads.append((arrays[id(phases)], procs.setdefault(who, len(procs))))
        if hit[2] is not None and n == 1:
            cand.append((op.id, who, hit))
    users = _users(loads, lowering.net.n_links)
    # per shape: whether one process at most loads its links (then only its own)
    alone = {shape: bool((users[links] == 1).all()) for shape, links in arrays.items()}
    ordered = _ordered_on_shared_links(trace, cand, loads, procs, arrays, users, alone)
    return _choose(cand, alone, seen, ordered)


def _choose(cand: list, alone: dict, seen: dict, ordered: set[int]) -> tuple[dict[int, tuple], PrivateBook]:
    """:func:`private_ops`' result from its candidates ``cand`` (op id, process, shape): those
    whose every link only their own process loads (``alone``, per shape), or that ``ordered``
    holds (:func:`_ordered_on_shared_links`), with the book of what they put on the network."""
    private: dict[tuple, bool] = {}
    chosen: dict[int, tuple] = {}  # id(phases) -> shape, for the private ones
    out = {}
    for oid, who, hit in cand:
        ok = private[(id(hit[0]), who)] = alone[id(hit[0])]
        if ok or oid in ordered:
            chosen[id(hit[0])] = hit
            out[oid] = hit
    # links some phase run by the network loads (its bytes are booked as it runs)
    shared: set[int] = set()
    for key, hit in seen.items():
        if not private.get(key):
            shared.update(hit[1])
    book = PrivateBook(list(chosen.values()), shared)
    entry = {id(hit[0]): e for hit, e in zip(chosen.values(), book.entries)}
    return {oid: entry[id(hit[0])] for oid, hit in out.items()}, book


def _ordered_on_shared_links(
    trace: Trace, cand: list, loads: list, procs: dict, arrays: dict, users: np.ndarray, alone: dict
) -> set[int]:
    """The candidates (op id, process, shape) whose links other processes load too, but only
    other streams of the op's own rank, every communication op of which runs before or after
    it (:class:`~simulator.engine.ordering.RankWindows`): such an op is still alone on its
    links whenever it runs (a tensor-parallel collective beside the same rank's expert
    all-to-alls, each between two compute ops of a layer)."""
    keys: dict[tuple, list[int]] = {}  # (id(phases), process) -> its op ids, where links are shared
    for oid, who, hit in cand:
        if not alone[id(hit[0])] and isinstance(who[0], int):
            keys.setdefault((id(hit[0]), who), []).append(oid)
    if not keys:
        return set()
    name = {number: who for who, number in procs.items()}
    rank_number: dict = {}  # rank (a rendezvous: the process itself) -> a number
    owner = {  # process number -> its rank's number
        number: rank_number.setdefault(who[0] if isinstance(who[0], int) else who, len(rank_number))
        for number, who in name.items()
    }
    owners = _users([(links, owner[w]) for links, w in loads], users.shape[0])  # ranks per link
    of_rank: dict = defaultdict(list)
    for links, w in loads:
        of_rank[name[w][0]].append((links, w))
    windows = RankWindows(trace)
    mask = np.zeros(users.shape[0], dtype=bool)
    out: set[int] = set()
    for (shape, who), ids in keys.items():
        links = arrays[shape]
        if (owners[links] > 1).any():  # another rank, or a rendezvous, loads one of them
            continue
        mask[links] = True
        me = procs[who]
        streams = {name[w][1] for other, w in of_rank[who[0]] if w != me and mask[other].any()}
        mask[links] = False
        ok = windows.ordered(who[0], ids, sorted(streams))
        out.update(i for i, good in zip(ids, ok.tolist()) if good)
    return out


def _users(loads: list, n_links: int) -> np.ndarray:
    """How many processes load each link, from ``(links, process number)`` pairs (each links
    array without repeats): each process's arrays in turn, a link counted at the first of
    them that loads it (linear in the arrays' sizes, where sorting every (process, link)
    pair took a third of DeepSeek-V3's step on 2,304 GB200 with 72 classes simulated)."""
    users = np.zeros(n_links, dtype=np.int64)
    last = np.full(n_links, -1, dtype=np.int64)  # per link: the last process counted on it
    for links, w in sorted(loads, key=lambda load: load[1]):
        new = links[last[links] != w]
        last[new] = w
        users[new] += 1
    return users


class PrivateBook:
    """What the private ops put on the network, booked as their reservations would book it.

    Each distinct private shape (its phases) has a code and an entry ``(durations, code,
    most flows, links now)``: the seconds of its phases, in order (a phase without
    transfers takes none); the most flows (merged rows) one of its phases has in flight;
    and ``links now``: ``((links, bytes), ...)`` to add to ``link_bytes`` as it runs, or
    None. The engine appends the code of every private op it runs to :attr:`log`;
    :meth:`flush` adds up the counters and the link bytes of the logged ops, in log
    order, when the run ends. That gives the same sums as adding at each op: a private
    shape's links are loaded by its own process alone, one op at a time, so each link's
    additions keep their order. Shapes whose links a network-run phase also loads (or
    that share links with such a shape) add their bytes as they run instead."""

    def __init__(self, hits: list, shared: set):
        self.log: list[int] = []
        self.ops_run = 0  # private ops flushed so far
        now = [False] * len(hits)
        changed = True
        while changed:  # the shapes whose links meet bytes booked while the run goes on
            changed = False
            for c, hit in enumerate(hits):
                if not now[c] and not shared.isdisjoint(hit[1]):
                    now[c] = changed = True
                    shared.update(hit[1])
        counts, links, sizes, self.entries = [], [], [], []
        for c, hit in enumerate(hits):
            real = [(prep, iso, dur) for prep, iso, dur in hit[2] if prep is not None]
            counts.append(
                (
                    len(hit[2]),  # phases_started
                    sum(p.n_transfers for p, _, _ in real),  # flows_started
                    sum(len(p.links) for p, _, _ in real),  # flow_rows_started
                    sum(p.units for p, _, _ in real),  # unit_flows_started
                    len(real),  # reserved_phases
                )
            )
            pairs = tuple((iso.links, iso.link_bytes) for _, iso, _ in real)
            later = not now[c] and bool(pairs)
            links.append(np.concatenate([a for a, _ in pairs]) if later else np.zeros(0, dtype=np.int64))
            sizes.append(np.concatenate([b for _, b in pairs]) if later else np.zeros(0))
            most = max((len(p.links) for p, _, _ in real), default=0)
            self.entries.append((tuple(dur for _, _, dur in real), c, most, pairs if now[c] and pairs else None))
        self._counts = np.array(counts, dtype=np.int64).reshape(len(hits), 5)
        self._links, self._sizes = links, sizes

    def flush(self, net: FlowNetwork) -> None:
        """Book the logged ops' counters and deferred link bytes on ``net.stats``; empties the log."""
        self.ops_run += len(self.log)
        if not self.log:
            return
        codes = np.asarray(self.log, dtype=np.int64)
        self.log = []
        st = net.stats
        per = np.bincount(codes, minlength=len(self._counts)) @ self._counts
        st.phases_started += int(per[0])
        st.flows_started += int(per[1])
        st.flow_rows_started += int(per[2])
        st.unit_flows_started += int(per[3])
        st.reserved_phases += int(per[4])
        lens = np.array([len(a) for a in self._links], dtype=np.int64)
        n = lens[codes]
        if not n.any():
            return
        offset = np.concatenate([[0], np.cumsum(lens)[:-1]])
        # the logged ops' (link, bytes) pairs one after another, in log order
        at = np.repeat(offset[codes] - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))
        np.add.at(st.link_bytes, np.concatenate(self._links)[at], np.concatenate(self._sizes)[at])


def phase_info(net: FlowNetwork, phases: tuple) -> tuple:
    """``(links loaded, per-phase (prepared, evolution, seconds) or None)`` of merged
    network phases; None where a phase has no cached isolated evolution."""
    links: set[int] = set()
    info: list | None = []
    for transfers, steps, _compute in phases:
        prep = net.prepared(transfers)
        if prep is None:
            if info is not None:
                info.append((None, None, 0.0))
            continue
        arr, link_list, iso = net.reservations.isolation(prep)
        links.update(link_list)
        if iso is None:
            info = None
        elif info is not None:
            info.append((prep, iso, steps * prep.latency_s + iso.duration_s))
    return links, None if info is None else tuple(info)


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
                    if j == k:
                        gone.add(sops[j].id)
                    else:
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
    the same compute op.

    The runs are checked in order of their first op, and the first that fails is
    dropped before anything else is checked again. Dropping a run can change the
    checks of two others only: the run ending right before it (whose next op is no
    longer moved) and the runs after it, not yet checked. So the scan steps back to
    the run before, where there is one, instead of starting again from the first."""
    order = sorted(units)
    at = {j: x for x, j in enumerate(order)}
    ends = {k: (j, i) for j, (k, i) in units.items()}
    used: set[int] = set()  # compute ops joined by the runs kept so far in the scan
    n_cops, n_sops = len(cops), len(sops)
    x = 0
    while x < len(order):
        j = order[x]
        if j not in units:
            x += 1
            continue
        k, i = units[j]
        if j == 0:
            prev_ok = True
        elif j - 1 in ends:
            prev_ok = ends[j - 1][1] < i
        else:
            prev_ok = first_wait.get(sops[j - 1].id, n_cops) <= i
        nxt_ok = k + 1 == n_sops or k + 1 in units or any(pos.get(d, -1) > i for d in sops[k + 1].deps)
        if prev_ok and nxt_ok and i not in used:
            used.add(i)
            x += 1
            continue
        del units[j], ends[k]
        before = ends.get(j - 1)
        if before is not None:  # check the run ending right before this one again
            used.discard(before[1])
            x = at[before[0]]
        else:
            x += 1
