"""Where each device's step time goes: compute, exposed communication, offload wait, bubble.

For every simulated rank, from the engine's op records:

* **compute busy**: the union of its compute ops' intervals;
* **communication busy, per axis**: the union of the collectives it takes part in
  (from the moment its transfers begin: when the last simulated member of the group
  has arrived, not when this rank arrived and started waiting for the others) and of
  the point-to-point transfers it sends or receives (axis ``pp``); the axis is the
  op's ``axis`` (``tp``, ``ep_inter``, ``dp_cp``, ...), else its stream;
* **host busy**: its ``offload`` stream (host-link transfers and CPU optimizer work).

At each instant the compute stream is busy or idle. Idle time is charged as

* **exposed communication** where at least one communication axis is busy, split
  *equally* among the axes busy at that instant (two axes in flight for 1 ms charge
  0.5 ms each);
* **offload wait** where no communication is busy but the host link is;
* **bubble** where neither is.

So ``compute + exposed + offload_wait + bubble = step`` on every rank, and each
axis's exposed time is at most its busy time. Only a rank's own operations count:
a stage waiting on the pipeline is never charged another stage's collectives.

The sweep is vectorised: every interval becomes a +1 and a -1 event, events are
sorted by (rank, time), a cumulative sum per channel gives which channels are busy
on each elementary segment between consecutive event times, and ``np.bincount``
sums the segment lengths per rank and category.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np

#: Categories of idle time, as ``RawRun.idle`` keys and idle-span causes.
BUBBLE, EXPOSED, OFFLOAD_WAIT = "bubble", "exposed_comm", "offload_wait"
#: Channel numbers: compute, host link; communication axes from 2 on.
_COMPUTE, _HOST = 0, 1


@dataclass(frozen=True)
class IdleAccount:
    """Per simulated rank (row ``i`` is ``ranks[i]``), seconds of the step."""

    ranks: tuple[int, ...]
    axes: tuple[str, ...]  # communication axes, sorted; columns of the *_by_axis arrays
    step_s: float
    compute_s: np.ndarray  # (R,) compute stream busy
    exposed_s: np.ndarray  # (R,) compute idle, some communication busy
    offload_wait_s: np.ndarray  # (R,) compute idle, no communication, host link busy
    bubble_s: np.ndarray  # (R,) compute idle, nothing of this rank's in flight
    offload_busy_s: np.ndarray  # (R,) host link busy (union)
    busy_by_axis_s: np.ndarray  # (R, A) each axis busy (union)
    exposed_by_axis_s: np.ndarray  # (R, A) exposed, split equally among concurrent axes
    spans: list = field(default_factory=list)
    # idle spans (rank, start_s, end_s, cause, what): cause 'bubble' | 'exposed_comm' |
    # 'offload_wait'; what = the axes busy ('tp', 'ep_inter+ep_intra') or 'offload'

    def per_rank(self) -> dict[int, dict[str, float]]:
        """``RawRun.idle``: rank -> {'bubble', 'exposed_comm', 'offload_wait', 'compute',
        'exposed_<axis>' for every axis with exposed time}."""
        out = {}
        for i, r in enumerate(self.ranks):
            d = {
                BUBBLE: float(self.bubble_s[i]),
                EXPOSED: float(self.exposed_s[i]),
                OFFLOAD_WAIT: float(self.offload_wait_s[i]),
                "compute": float(self.compute_s[i]),
            }
            for j, a in enumerate(self.axes):
                if self.exposed_by_axis_s[i, j] > 0:
                    d["exposed_" + a] = float(self.exposed_by_axis_s[i, j])
            out[r] = d
        return out


def account(records, ranks, step_s: float) -> IdleAccount:
    """Attribute every simulated rank's step time (see the module doc).

    ``records``: the engine's :class:`~simulator.engine.loop.OpRecord` list; ``ranks``: the
    simulated ranks; ``step_s``: the step time (every record ends by then)."""
    ranks = tuple(ranks)
    return account_intervals(*busy_intervals(records, ranks), ranks, step_s)


def account_intervals(r, c, s, e, axes: tuple, ranks: tuple, step_s: float, with_spans: bool = True) -> IdleAccount:
    """:func:`account` from the busy intervals as :func:`busy_intervals` gives them (rank index,
    channel, start, end; the axes of channels 2, 3, ...): what a timeline built from another
    run's intervals (:mod:`simulator.steady`) is accounted by. ``with_spans=False`` leaves
    :attr:`IdleAccount.spans` empty (a skipped step has no op-level tables)."""
    n = len(ranks)
    t, seg_r, seg, ec, ed = _segments(r, c, s, e, n, step_s)

    def busy(k: int) -> np.ndarray:
        return np.cumsum(np.where(ec == k, ed, 0))[:-1] > 0

    comp, host = busy(_COMPUTE), busy(_HOST)
    act = [busy(j + 2) for j in range(len(axes))]
    n_act = np.sum(act, axis=0) if act else np.zeros(len(seg), dtype=np.int64)
    idle = np.where(comp, 0.0, seg)
    exposed = np.where(n_act > 0, idle, 0.0)
    quiet = idle - exposed

    def per_rank(w: np.ndarray) -> np.ndarray:
        return np.bincount(seg_r, weights=w, minlength=n)[:n]

    share = exposed / np.maximum(n_act, 1)
    busy_ax = np.zeros((n, len(axes)))
    exp_ax = np.zeros((n, len(axes)))
    for j, a_act in enumerate(act):
        busy_ax[:, j] = per_rank(np.where(a_act, seg, 0.0))
        exp_ax[:, j] = per_rank(np.where(a_act, share, 0.0))
    return IdleAccount(
        ranks=ranks,
        axes=axes,
        step_s=float(step_s),
        compute_s=per_rank(np.where(comp, seg, 0.0)),
        exposed_s=per_rank(exposed),
        offload_wait_s=per_rank(np.where(host, quiet, 0.0)),
        bubble_s=per_rank(np.where(host, 0.0, quiet)),
        offload_busy_s=per_rank(np.where(host, seg, 0.0)),
        busy_by_axis_s=busy_ax,
        exposed_by_axis_s=exp_ax,
        spans=_spans(ranks, axes, t, seg_r, seg, comp, host, act, n_act) if with_spans else [],
    )


def busy_intervals(records, ranks: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple]:
    """The busy intervals of the records, as columns ``(rank index, channel, start,
    end, axes)``: compute, host and one channel per communication axis (numbered in
    sorted-axis order after the two, so that outputs do not depend on record order);
    a send also occupies its receiver, a collective starts when its last member
    arrives; empty intervals dropped."""
    rank_ix = {r: i for i, r in enumerate(ranks)}
    n = len(records)
    # Column by column, straight into arrays; only the communication records (a quarter of
    # a MoE step's, fewer elsewhere) are looked at one by one. The order of intervals does
    # not matter: they are sorted by rank and time below, and ties only make empty segments.
    ops = list(map(attrgetter("op"), records))
    s = np.fromiter(map(attrgetter("start_s"), records), dtype=float, count=n)
    e = np.fromiter(map(attrgetter("end_s"), records), dtype=float, count=n)
    r = np.fromiter(map(rank_ix.__getitem__, map(attrgetter("rank"), ops)), dtype=np.int64, count=n)
    kinds = list(map(attrgetter("kind"), ops))
    axis_ch: dict[str, int] = {}
    comm, comm_ch = [], []  # record index and channel of every record but compute
    coll_at: list[int] = []  # collectives with a rendezvous key
    send_at, send_to = [], []  # sends to a simulated rank, and its index
    for i in [i for i, kind in enumerate(kinds) if kind != "compute"]:
        op = ops[i]
        kind = op.kind
        if kind == "host":
            c = _HOST
        else:
            a = op.axis or op.stream
            c = axis_ch.get(a)
            if c is None:
                c = axis_ch[a] = len(axis_ch) + 2
            if kind == "collective" and op.key:
                coll_at.append(i)
            elif kind == "send":
                p = rank_ix.get(op.peer)
                if p is not None:  # the receiver's side of the transfer
                    send_at.append(i)
                    send_to.append(p)
        comm.append(i)
        comm_ch.append(c)
    ch = np.zeros(n, dtype=np.int64)  # _COMPUTE
    ch[comm] = comm_ch
    if coll_at:  # transfers begin when the last member arrives: the latest start of its key
        at = np.asarray(coll_at, dtype=np.int64)
        number: dict[str, int] = {}
        key = np.fromiter(
            (number.setdefault(ops[i].key, len(number)) for i in coll_at), dtype=np.int64, count=len(coll_at)
        )
        launch = np.full(len(number), -np.inf)
        np.maximum.at(launch, key, s[at])
        s[at] = launch[key]
    if send_at:
        at = np.asarray(send_at, dtype=np.int64)
        r = np.concatenate([r, np.asarray(send_to, dtype=np.int64)])
        ch = np.concatenate([ch, ch[at]])
        s = np.concatenate([s, s[at]])
        e = np.concatenate([e, e[at]])
    axes = tuple(sorted(axis_ch))
    remap = np.arange(len(axis_ch) + 2)
    for j, a in enumerate(axes):
        remap[axis_ch[a]] = j + 2
    c = remap[ch]
    keep = e > s
    return r[keep], c[keep], s[keep], e[keep], axes


def _segments(r, c, s, e, n: int, step_s: float) -> tuple:
    """The intervals as sorted events ``(t, segment rank, segment length, event
    channel, event delta)``: +1 at each start, -1 at each end, sentinels at 0 and the
    step end so that every rank's segments tile [0, step]. Segment i is
    ``[t[i], t[i+1])`` with the state after event i; a segment spanning two ranks has
    length 0 (each rank's deltas sum to zero, so the counts restart at 0)."""
    idx = np.arange(n, dtype=np.int64)
    t = np.concatenate([s, e, np.zeros(n), np.full(n, float(step_s))])
    er = np.concatenate([r, r, idx, idx])
    ec = np.concatenate([c, c, np.full(2 * n, -1, dtype=np.int64)])
    ed = np.concatenate([np.ones(len(s), np.int64), -np.ones(len(s), np.int64), np.zeros(2 * n, np.int64)])
    order = np.lexsort((t, er))
    t, er, ec, ed = t[order], er[order], ec[order], ed[order]
    seg_r = er[:-1]
    seg = np.where(er[1:] == seg_r, np.diff(t), 0.0)
    return t, seg_r, seg, ec, ed


def _spans(ranks, axes, t, seg_r, seg, comp, host, act, n_act) -> list:
    """Maximal idle spans of one category (and one set of busy axes), per rank."""
    mask = np.zeros(len(seg), dtype=np.int64)
    for j, a_act in enumerate(act):
        mask |= a_act.astype(np.int64) << j
    # label: -1 computing, 0 bubble, 1 offload wait, 2 + axis bit mask exposed
    label = np.where(comp, -1, np.where(n_act > 0, 2 + mask, np.where(host, 1, 0)))
    live = seg > 0
    lab, rr = label[live], seg_r[live]
    t0, t1 = t[:-1][live], t[1:][live]
    if not len(lab):
        return []
    first = np.flatnonzero(np.r_[True, (lab[1:] != lab[:-1]) | (rr[1:] != rr[:-1])])
    last = np.r_[first[1:] - 1, len(lab) - 1]
    keep = lab[first] >= 0
    first, last = first[keep], last[keep]
    out = []
    names: dict[int, tuple[str, str]] = {0: (BUBBLE, ""), 1: (OFFLOAD_WAIT, "offload")}
    for ri, a, b, lb in zip(rr[first].tolist(), t0[first].tolist(), t1[last].tolist(), lab[first].tolist()):
        nm = names.get(lb)
        if nm is None:
            bits = lb - 2
            nm = names[lb] = (EXPOSED, "+".join(x for j, x in enumerate(axes) if bits >> j & 1))
        out.append((ranks[ri], a, b, nm[0], nm[1]))
    return out
