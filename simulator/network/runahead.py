"""Run-ahead chains: a big link-sharing component's completions computed in advance.

An expert all-to-all whose traffic shares links with other flows (torus rows that its
groups cut across, a gather beside it) is one link-sharing component of thousands of
flows in :class:`~simulator.network.flows.FlowNetwork`. Each of its completion instants
removes a few flows and re-solves the survivors, whose split and rates the rate memo
(:mod:`simulator.network.ratememo`) holds from the last time the same flows survived; the
flow-by-flow path still pays, at each instant, a simpy wake-up, the link index and byte
counts of the flows done, and the survivors' state arrays.

While nothing arrives on its links, the component's evolution is a pure function of its
state. :func:`chain_ahead` repeats the flow-by-flow arithmetic (the same IEEE operations
in the same order on the same values) instant after instant: the survivors' split and
rates come from the memo where they are many, else they are found among the survivors
(:func:`~simulator.network.components.components_among`) and solved by the network's own
solvers (``FlowNetwork._solve``). :class:`RunAheads` holds the component as a *chain*: its
flows leave the link index, and timers fire only at the instants where one of its phases
may finish and at its last instant, which completes its last flows or splits the
survivors into several components (lone flows among them): those that complete all their
flows ahead (a split's end game) then run as one chain of several *parts*, each other one as
a chain of its own. A phase arriving on a link a chain still uses returns the survivors of
the parts on its links to the flow-by-flow path at once with the state they have (the
instants up to now committed: bytes, completions, phase events); a chain's other parts run
on. Link bytes are added flow by flow in the flow-by-flow path's order, so the results are
the same bits.

An instant changes the rates of few survivors (under 1 % on the TPU v5p built-in's
all-to-alls), so :func:`chain_ahead` keeps the state over all the component's flows and
touches only the flows completed and those whose rate changes; a :class:`PathMemo` holds,
per start and sequence of completions, which rates changed, so a repeated collective asks
neither the rate memo nor the solvers again. A chain starts where the
flow-by-flow path splits a component of at least ``MEMO_MIN_FLOWS`` flows from the memo,
and takes instants ahead only up to twice its start time, where a timer set at the start
lands on the instant exactly (``a + (t - a) == t`` for ``t <= 2 a``).
:data:`RUN_AHEAD` turns this off.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import deque
from functools import partial
from itertools import repeat

import numpy as np

from simulator.network.components import components_among
from simulator.network.maxmin import DONE_RTOL
from simulator.network.phases import distinct_links
from simulator.network.ratememo import MEMO_MIN_FLOWS

#: Whether big components run ahead (read when a network is made).
RUN_AHEAD = True
#: Chains of fewer instants than this are left to the flow-by-flow path (but for one
#: instant where every flow completes).
_MIN_INSTANTS = 2
#: Marks a chain's flows in the slots' batch column (not free, in no batch of the heap).
_IN_CHAIN = -3
#: Whether chains ask a :class:`PathMemo` before solving their survivors (read when a
#: network is made).
PATH_MEMO = True
#: Roots and edges a :class:`PathMemo` holds before it starts again.
_PATH_MEMO_MAX = 1 << 16
_INF = float("inf")


class Instant:
    """One completion instant of a chain: at ``t_s`` the flows in slots ``done`` complete and
    the survivors ``sl`` (in arrival order; ``n_left`` of them) continue with segment start
    ``t0``, bytes left per unit flow ``rem`` at it, ``rate`` per unit flow and completion time
    ``end``. A chain's last instant may split its survivors into several components: ``lens``
    their sizes (``sl`` and the state hold them back to back, each in arrival order); else
    None. The survivors' state is given at once (``state``) or rebuilt, when first asked for,
    from ``snap``: the chain's :class:`_Log` and this instant's place in it."""

    __slots__ = ("t_s", "done", "n_left", "lens", "_state", "_snap")

    def __init__(self, t_s: float, done, n_left: int, state=None, snap=None, lens: tuple | None = None) -> None:
        self.t_s, self.done, self.n_left, self.lens = t_s, done, n_left, lens
        self._state, self._snap = state, snap

    def survivors(self) -> tuple:
        """``(sl, t0, rem, rate, end)`` of the flows left after the instant."""
        if self._state is None:
            snap = self._snap
            assert snap is not None  # one of state and snap is given
            self._state = snap[0].state(snap[1])
            self._snap = None
        return self._state

    sl = property(lambda self: self.survivors()[0])
    t0 = property(lambda self: self.survivors()[1])
    rem = property(lambda self: self.survivors()[2])
    rate = property(lambda self: self.survivors()[3])
    end = property(lambda self: self.survivors()[4])


class _Log:
    """A chain's start (slots, ``t0``, ``rem``, ``rate``, ``end`` over all its flows) and, per
    instant, the positions completed and those whose state changed with their new ``t0``,
    ``rem``, ``rate`` and ``end``: the survivors' state after any instant, replayed on demand."""

    __slots__ = ("sl", "start", "steps")

    def __init__(self, sl, t0, rem, rate, end) -> None:
        self.sl, self.start, self.steps = sl, (t0.copy(), rem.copy(), rate.copy(), end.copy()), []

    def state(self, k: int) -> tuple:
        """``(sl, t0, rem, rate, end)`` of the survivors after instant ``k``."""
        t0, rem, rate, end = (a.copy() for a in self.start)
        for due, at, t, left, r, e in self.steps[: k + 1]:
            t0[due] = _INF
            t0[at], rem[at], rate[at], end[at] = t, left, r, e
        live = np.flatnonzero(t0 != _INF)
        return self.sl.take(live), t0.take(live), rem.take(live), rate.take(live), end.take(live)


class PathMemo:
    """What a chain's instants did the last time the same component took the same path: keyed
    by the component's flow identities and rates at its start (a root) and then, instant after
    instant, by the positions of the flows completed (an edge from the node reached so far),
    the positions whose rate changed and their new rates, or a split. The survivors after each
    instant are the start's less the flows completed on the path, so the same path gives the
    survivors the same split and rates (:class:`~simulator.network.ratememo.RateMemo`), and the
    same old rates: the changes are those bits again. Starts again when full."""

    def __init__(self, capacity: int = _PATH_MEMO_MAX) -> None:
        self._max = capacity
        self._roots: dict[bytes, int] = {}
        self._edges: dict[tuple, tuple] = {}  # (node, positions completed) -> (node, changes)
        self.hits = 0
        self.misses = 0

    def root(self, fid: np.ndarray, rate: np.ndarray) -> int:
        key = fid.tobytes() + rate.tobytes()
        node = self._roots.get(key)
        if node is None:
            if len(self._edges) + len(self._roots) >= self._max:
                self._roots.clear()
                self._edges.clear()
            node = self._roots[key] = -1 - len(self._roots)
        return node

    def get(self, node: int, done: np.ndarray) -> tuple | None:
        hit = self._edges.get((node, done.tobytes()))
        if hit is None:
            self.misses += 1
        else:
            self.hits += 1
        return hit

    def keep(self, node: int, done: np.ndarray, value: tuple) -> None:
        self._edges[(node, done.tobytes())] = value


def chain_ahead(sl, fid, t0, rem, rate, end, split_of, limit_s: float, memo: PathMemo | None = None) -> list:
    """The :class:`Instant` list of one component (slots ``sl`` with identities ``fid`` and
    state ``t0``, ``rem``, ``rate``, ``end``) left alone, as far as every instant is at most
    ``limit_s`` and ``split_of`` (survivors' identities and slots -> ``(positions, lens,
    n_singles, rates)`` as :meth:`~simulator.network.ratememo.RateMemo.split` gives them, or
    None) splits its survivors (``memo``: what the same path did before, asked first). An
    instant that splits the survivors into several components (lone flows among them), or
    leaves none, is the last.

    Each instant repeats the flow-by-flow path: the flows due with the earliest completion
    (within :data:`DONE_RTOL` of their segment) complete, and the survivors whose rate
    changes are advanced to the instant at the old rate. The state is kept over all the
    component's flows (those completed with infinite ``t0`` and ``end``), so an instant costs
    a few passes and the work of the flows that complete or change rate."""
    out: list[Instant] = []
    with np.errstate(invalid="ignore"):  # inf - inf for the flows completed
        _run_ahead(out, sl, fid, t0, rem, rate, end, split_of, limit_s, memo)
    return out


def _run_ahead(out, sl, fid, t0, rem, rate, end, split_of, limit_s, memo) -> None:
    """:func:`chain_ahead`'s loop, appending to ``out``."""
    log = _Log(sl, t0, rem, rate, end)
    t0, rem, rate, end = t0.copy(), rem.copy(), rate.copy(), end.copy()
    n_left = sl.shape[0]
    node = memo.root(fid, rate) if memo is not None else 0
    while True:
        key = float(end.min())
        if key > limit_s:
            return
        thr = end - t0  # nan for the flows completed (inf - inf): never due again
        thr *= DONE_RTOL
        thr += key
        due = np.flatnonzero(end <= thr)
        if due.shape[0] == n_left:  # the last flows complete: nothing left to return
            out.append(Instant(key, sl.take(due), 0, (sl[:0], t0[:0], rem[:0], rate[:0], end[:0])))
            return
        hit: tuple | None = memo.get(node, due) if memo is not None else None
        if hit is None:
            live = t0 != _INF
            live[due] = False
            keep = np.flatnonzero(live)
            found = split_of(fid.take(keep), sl.take(keep))
            if found is None:
                return
            pos, lens, n_single, r = found
            if len(lens) + n_single > 1:
                hit = (None, (keep.take(pos), (*lens, *(1,) * n_single), r))
            else:
                ch = np.flatnonzero(r != rate.take(keep))
                hit = (object(), (keep.take(ch), r.take(ch)))
            if memo is not None:
                memo.keep(node, due, hit)
        nxt, change = hit[0], tuple(hit[1])
        if nxt is None:  # a split: the survivors component by component, as the rates are
            keep, parts, r = change
            old, t, left, e = rate.take(keep), t0.take(keep), rem.take(keep), end.take(keep)
            changed = r != old
            adv = changed & (old > 0.0)
            if adv.any():
                left = np.where(adv, np.maximum(left - old * (key - t), 0.0), left)
                t = np.where(adv, key, t)
            e = np.where(changed, t + left / r, e)
            out.append(Instant(key, sl.take(due), keep.shape[0], (sl.take(keep), t, left, r, e), lens=parts))
            return
        t0[due] = _INF
        end[due] = _INF
        at, r = change
        old, t, left = rate.take(at), t0.take(at), rem.take(at)
        adv = old > 0.0
        if adv.any():
            left = np.where(adv, np.maximum(left - old * (key - t), 0.0), left)
            t = np.where(adv, key, t)
            t0[at], rem[at] = t, left
        rate[at] = r
        e = end[at] = t + left / r
        log.steps.append((due, at, t, left, r, e))
        n_left -= due.shape[0]
        out.append(Instant(key, sl.take(due), n_left, snap=(log, len(log.steps) - 1)))
        node = nxt


class _Part:
    """One component of a chain: its slots and state at the chain's start, and its instants."""

    __slots__ = ("sl", "t0", "rem", "rate", "end", "instants")

    def __init__(self, sl, t0, rem, rate, end, instants) -> None:
        self.sl, self.t0, self.rem, self.rate, self.end, self.instants = sl, t0, rem, rate, end, instants


class _Chain:
    """Components running ahead: their parts (one, or several that each complete all their
    flows ahead: a split's end game), the parts' instants in time order (ties in part order)
    with each one's ``(part, index in part)`` and time, the links held at the start, how many
    instants are committed, the instants with a timer and the token of the pending one."""

    __slots__ = ("parts", "instants", "where", "times", "links", "committed", "ticks", "token")

    def __init__(self, parts: list) -> None:
        self.parts = parts
        if len(parts) == 1:
            self.instants = parts[0].instants
            self.where = None
        else:
            order = sorted((i.t_s, j, n) for j, p in enumerate(parts) for n, i in enumerate(p.instants))
            self.where = [(j, n) for _, j, n in order]
            self.instants = [parts[j].instants[n] for j, n in self.where]
        self.times = [i.t_s for i in self.instants]
        self.committed = 0
        self.token = 0

    def last(self, k: int) -> list[int]:
        """Each part's index of its last instant up to instant ``k`` (-1: none)."""
        if self.where is None:
            return [k]
        last = [-1] * len(self.parts)
        for j, n in self.where[: k + 1]:
            last[j] = n
        return last

    def states(self, k: int) -> list:
        """Each part's survivors after instant ``k`` (-1: the start) as ``(sl, t0, rem, rate,
        end, lens)``, in part order (``lens``: a split's component sizes, or None)."""
        out = []
        for p, n in zip(self.parts, self.last(k)):
            i = p if n < 0 else p.instants[n]
            out.append((i.sl, i.t0, i.rem, i.rate, i.end, None if n < 0 else p.instants[n].lens))
        return out


class RunAheads:
    """The chains of a :class:`~simulator.network.flows.FlowNetwork` (a part of it, held as
    ``ahead``: it uses the network's environment, flow slots, rate memo, heap and stats)."""

    def __init__(self, net) -> None:
        self.net = net
        self._enabled = RUN_AHEAD
        self._paths = PathMemo() if PATH_MEMO else None
        self._on: dict[int, int] = {}  # link -> id of the chain holding it
        self._chains: dict[int, _Chain] = {}
        self._next_id = 0
        self._next_token = 0

    def start(self, sl: np.ndarray, lens, n_single: int) -> None:
        """The component just solved in slots ``sl`` (the whole update: ``lens`` its size,
        no lone flow) runs ahead where at least :data:`_MIN_INSTANTS` of its next instants
        are known (or one that completes every flow)."""
        if self._enabled and not n_single and len(lens) == 1:
            slots = self.net.slots
            state = (sl, slots._t0[sl], slots._rem[sl], slots._rate[sl], slots._end[sl])
            inst = self._ahead(state)
            if len(inst) >= (_MIN_INSTANTS if inst and inst[-1].n_left else 1):
                self._install([_Part(*state, inst)], True)

    def arrived(self, comps: list, singles: list) -> None:
        """After an update that solved ``comps`` and ``singles``: where it solved phases held
        back from the link index (:meth:`~simulator.network.flowslots.FlowSlots._insert`)
        as one component of at least ``MEMO_MIN_FLOWS`` flows, the component runs ahead from
        now; the flows not in a chain then enter the index."""
        slots = self.net.slots
        if slots._pending and len(comps) == 1 and not singles and len(comps[0]) >= MEMO_MIN_FLOWS:
            self.start(np.array(comps[0], dtype=np.int64), (len(comps[0]),), 0)
        slots._flush()

    def _ahead(self, state: tuple) -> list:
        """:func:`chain_ahead` of the component ``(sl, t0, rem, rate, end)`` from now."""
        net = self.net
        sl, t0, rem, rate, end = state
        return chain_ahead(sl, net.slots._fid[sl], t0, rem, rate, end, self._split, 2 * net.env.now, self._paths)

    def _split_parts(self, i: Instant) -> None:
        """The components of split instant ``i`` (now) run ahead where their instants are
        known: those that complete all their flows ahead together as one chain (a split's
        end game: one timer, one commit per tick), each other one alone; those with no
        instant known go back to the flow-by-flow path."""
        ends, back = [], []
        a = 0
        for n in i.lens or ():
            b = a + n
            state = (i.sl[a:b], i.t0[a:b], i.rem[a:b], i.rate[a:b], i.end[a:b])
            inst = self._ahead(state)
            if not inst:
                back.append((*state, None))
            elif inst[-1].n_left:
                self._install([_Part(*state, inst)], False)
            else:
                ends.append(_Part(*state, inst))
            a = b
        if ends:
            self._install(ends, False)
        self._hand_back_states(back)

    def _install(self, parts: list, indexed: bool) -> None:
        """Hold ``parts`` as one chain from now: a timer where a phase's last flow of the
        chain completes and at its last instant; its links off the link index where the
        flows are still there (``indexed``)."""
        net, slots = self.net, self.net.slots
        chain = _Chain(parts)
        chain.ticks = [0] if len(chain.instants) == 1 else self._ticks(chain)
        sl = parts[0].sl if len(parts) == 1 else np.concatenate([p.sl for p in parts])
        links = chain.links = self._links_of(sl).tolist()
        if indexed:
            deque(map(slots._link_flows.pop, links, repeat(None)), maxlen=0)  # a phase held back: none
            slots._batch[sl] = _IN_CHAIN
        cid = self._next_id = self._next_id + 1
        self._chains[cid] = chain
        self._on.update(zip(links, repeat(cid)))
        self._arm(cid, chain, net.env.now)

    def _ticks(self, chain: _Chain) -> list[int]:
        """The instants where a phase's last flow of ``chain`` completes, and the last one."""
        slots, inst = self.net.slots, chain.instants
        pids = slots._pid[np.concatenate([i.done for i in inst])]
        past = [p.instants[-1].sl for p in chain.parts]
        going = slots._pid[past[0] if len(past) == 1 else np.concatenate(past)]
        last = np.full(int(max(pids.max(), going.max(initial=0))) + 1, -1, dtype=np.int64)
        np.maximum.at(last, pids, np.repeat(np.arange(len(inst)), [i.done.shape[0] for i in inst]))
        last[going] = -1  # phases with flows past the chain finish after it
        return sorted(set(last[last >= 0].tolist()) | {len(inst) - 1})

    def _split(self, fids: np.ndarray, rest: np.ndarray) -> tuple:
        """How the survivors ``rest`` (identities ``fids``) of a component split and their
        rates, as the flow-by-flow path finds them: remembered where they are many
        (:class:`~simulator.network.ratememo.RateMemo`), else found among themselves and
        solved (and remembered where they are many)."""
        net, slots = self.net, self.net.slots
        many = fids.shape[0] >= MEMO_MIN_FLOWS
        if many:
            hit = net._memo.split(fids)
            if hit is not None:
                return hit
        comps, singles = components_among(rest, slots._tab, slots._links, slots._seq)
        lens = [len(c) for c in comps]
        order = np.fromiter(itertools.chain(*comps, singles), dtype=np.int64, count=rest.shape[0])
        rates = net._solve(order, lens, len(singles))
        seq = slots._seq[rest]
        if many:
            net._memo.keep_split(fids, seq, comps, singles, slots._seq, rates)
        return np.searchsorted(seq, slots._seq[order]), tuple(lens), len(singles), rates

    def _arm(self, cid: int, chain: _Chain, now: float) -> None:
        """Set the chain's timer at its next instant with a tick."""
        k = chain.ticks[bisect.bisect_left(chain.ticks, chain.committed)]
        token = chain.token = self._next_token = self._next_token + 1
        self.net.env.timeout(chain.times[k] - now).callbacks.append(partial(self._tick, cid, token, k))

    def _tick(self, cid: int, token: int, k: int, _ev=None) -> None:
        chain = self._chains.get(cid)
        if chain is None or chain.token != token:
            return
        self._commit(chain, k)
        if k < len(chain.instants) - 1:
            self._arm(cid, chain, self.net.env.now)
            return
        self._drop(cid, chain)
        if chain.where is not None:  # a split's end game: every flow has completed
            return
        i = chain.instants[k]
        if i.lens is None:
            self._hand_back(i.sl, i.t0, i.rem, i.rate, i.end, None)
        else:  # a split: its components run ahead where they can
            self._split_parts(i)

    def _commit(self, chain: _Chain, k: int) -> None:
        """Complete the flows of instants up to ``k`` not yet committed, as the flow-by-flow
        path does at each: their bytes on their links (flow by flow, in order), their slots
        freed and the phases they finish fired."""
        if k < chain.committed:
            return
        net, slots = self.net, self.net.slots
        inst = chain.instants[chain.committed : k + 1]
        chain.committed = k + 1
        done = np.concatenate([i.done for i in inst]) if len(inst) > 1 else inst[0].done
        sub = slots._tab[done]
        mask = sub >= 0
        rows = np.nonzero(mask)[0]
        moved = (slots._w[done] * slots._size[done])[rows]
        if slots._any_mult:
            moved = moved * slots._mtab[done][mask]
        np.add.at(net.stats.link_bytes, sub[mask].astype(np.int64), moved)
        slots._batch[done] = -1
        stats, left = net.stats, net._phase_left
        for i in inst:
            stats.instants_ahead += 1
            stats.wakeups += 1
            if i.n_left:
                stats.recomputations += 1
                stats.components_solved += 1 if i.lens is None else len(i.lens)
                stats.flows_recomputed += i.n_left
            finished = []
            for p in slots._pid[i.done].tolist():
                n = left[p] - 1
                if n:
                    left[p] = n
                else:
                    finished.append(p)
            slots._release(i.done.tolist(), finished)

    def _drop(self, cid: int, chain: _Chain) -> None:
        """Forget a chain and the links it still holds."""
        del self._chains[cid]
        on = self._on
        for lk in chain.links:
            if on.get(lk) == cid:
                del on[lk]

    def _return(self, cid: int, chain: _Chain, k: int, hit=None) -> None:
        """The survivors after instant ``k`` (-1: the start) go back to the flow-by-flow path:
        every part's, or only those of the parts marked in ``hit`` (the others continue as a
        chain of their own)."""
        self._drop(cid, chain)
        states = chain.states(k)
        if hit is None or all(hit):
            self._hand_back_states(states)
            return
        self._hand_back_states([st for st, h in zip(states, hit) if h])
        rest = [
            _Part(st[0], st[1], st[2], st[3], st[4], p.instants[n + 1 :])
            for st, h, p, n in zip(states, hit, chain.parts, chain.last(k))
            if not h and st[0].shape[0]
        ]
        if rest:
            self._install(rest, False)

    def _hand_back_states(self, states: list) -> None:
        """:meth:`_hand_back` of several components' ``(sl, t0, rem, rate, end, lens)`` at once."""
        states = [st for st in states if st[0].shape[0]]
        if len(states) == 1:
            self._hand_back(*states[0])
        elif states:
            cols = [np.concatenate([st[c] for st in states]) for c in range(5)]
            lens = [n for st in states for n in (st[5] if st[5] is not None else (st[0].shape[0],))]
            self._hand_back(cols[0], cols[1], cols[2], cols[3], cols[4], lens)

    def _hand_back(self, sl, t0, rem, rate, end, lens) -> None:
        """Flows ``sl`` with their state enter the flow-by-flow path as solved now: one batch
        on the heap per component (``lens`` their sizes back to back; None: one), the link
        index."""
        if not sl.shape[0]:
            return
        net, slots = self.net, self.net.slots
        slots._t0[sl], slots._rem[sl], slots._rate[sl], slots._end[sl] = t0, rem, rate, end
        a = 0
        for n in lens if lens is not None else (sl.shape[0],):
            b = a + n
            bid = net._next_bid
            net._next_bid += 1
            slots._batch[sl[a:b]] = bid
            net._batches[bid] = (sl[a:b], False)
            heapq.heappush(net._heap, (float(end[a:b].min()), bid))
            a = b
        sub = slots._tab[sl]
        mask = sub >= 0
        flat = sub[mask]
        owner = sl[np.nonzero(mask)[0]]
        order = np.argsort(flat, kind="stable")
        flat, owner = flat[order], owner[order]
        cut = (np.flatnonzero(np.diff(flat)) + 1).tolist()
        ow = owner.tolist()
        bounds = [0, *cut, len(ow)]
        net.slots._link_flows.update(zip(flat[[0, *cut]].tolist(), (set(ow[a:b]) for a, b in zip(bounds, bounds[1:]))))
        net._schedule_wake()

    def _links_of(self, sl: np.ndarray) -> np.ndarray:
        """The distinct links of the flows in slots ``sl``, increasing (many: marked on the
        network's scratch array over all links, which is left as found)."""
        sub = self.net.slots._tab[sl]
        flat = sub[sub >= 0]
        scratch = self.net._link_scratch
        if flat.shape[0] * 8 < scratch.shape[0]:  # few: sorting them beats a pass over all links
            return np.unique(flat).astype(np.int64)
        scratch[flat] = 0
        links = np.flatnonzero(scratch >= 0)
        scratch[links] = -1
        return links

    def arriving(self, prep, links_of: dict) -> None:
        """Phase ``prep`` enters the flow-by-flow path now: the chains on its links
        (:func:`~simulator.network.phases.distinct_links`, cached in ``links_of``) return."""
        if self._on:
            self.clear(distinct_links(links_of, prep), True)

    def clear(self, link_set, arriving: bool) -> bool:
        """Whether no chain still uses any of ``link_set`` now. The instants up to now of the
        chains that held one are committed first (their bytes before any newcomer's); with
        ``arriving`` (flows enter on these links now) a chain still using one returns its
        survivors to the flow-by-flow path."""
        on = self._on
        if not on or on.keys().isdisjoint(link_set):
            return True
        hit: dict[int, list[int]] = {}
        for lk in on.keys() & link_set:
            hit.setdefault(on[lk], []).append(lk)
        now = self.net.env.now
        free = True
        for cid in sorted(hit):
            chain = self._chains[cid]
            k = bisect.bisect_right(chain.times, now) - 1
            self._commit(chain, k)
            touched = [bool(np.isin(hit[cid], self._links_of(st[0])).any()) for st in chain.states(k)]
            if not any(touched):
                deque(map(on.__delitem__, hit[cid]), maxlen=0)
                continue
            free = False
            if arriving:
                self._return(cid, chain, k, touched)
        return free

    def return_all(self) -> None:
        """Every chain's survivors back in the flow-by-flow path, as they stand now."""
        now = self.net.env.now
        for cid in sorted(self._chains):
            chain = self._chains[cid]
            k = bisect.bisect_right(chain.times, now) - 1
            self._commit(chain, k)
            self._return(cid, chain, k)
