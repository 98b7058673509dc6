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
survivors into several components (lone flows among them), each of which then runs ahead
as a chain of its own. A phase arriving on a link a chain still uses returns its
survivors to the flow-by-flow path at once with the state they have (the instants up to
now committed: bytes, completions, phase events). Link bytes are added flow by flow in the
flow-by-flow path's order, so the results are the same bits. A chain starts where the
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
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Instant:
    """One completion instant of a chain: at ``t_s`` the flows in slots ``done`` complete and
    the survivors ``sl`` (in arrival order) continue with segment start ``t0``, bytes left
    per unit flow ``rem`` at it, ``rate`` per unit flow and completion time ``end``. A chain's
    last instant may split its survivors into several components: ``lens`` their sizes
    (``sl`` and the state hold them back to back, each in arrival order); else None."""

    t_s: float
    done: np.ndarray
    sl: np.ndarray
    t0: np.ndarray
    rem: np.ndarray
    rate: np.ndarray
    end: np.ndarray
    lens: tuple | None = None


def chain_ahead(sl, fid, t0, rem, rate, end, split_of, limit_s: float) -> list:
    """The :class:`Instant` list of one component (slots ``sl`` with identities ``fid`` and
    state ``t0``, ``rem``, ``rate``, ``end``) left alone, as far as every instant is at most
    ``limit_s`` and ``split_of`` (survivors' identities and slots -> ``(positions, lens,
    n_singles, rates)`` as :meth:`~simulator.network.ratememo.RateMemo.split` gives them, or
    None) splits its survivors. An instant that splits the survivors into several
    components (lone flows among them), or leaves none, is the last.

    Each instant repeats the flow-by-flow path: the flows due with the earliest completion
    (within :data:`DONE_RTOL` of their segment) complete, and the survivors whose rate
    changes are advanced to the instant at the old rate."""
    out: list[Instant] = []
    while True:
        key = float(end.min())
        if key > limit_s:
            break
        done = end <= key + DONE_RTOL * (end - t0)
        keep = np.flatnonzero(~done)
        if not keep.shape[0]:  # the last flows complete: nothing left to return
            out.append(Instant(key, sl, sl[:0], t0[:0], rem[:0], rate[:0], end[:0]))
            break
        rest = sl.take(keep)
        fids = fid.take(keep)
        hit = split_of(fids, rest)
        if hit is None:
            break
        pos, lens, n_single, r = hit
        parts = (*lens, *(1,) * n_single)
        split = len(parts) > 1
        if split:  # the survivors component by component, as the rates are
            keep, rest = keep.take(pos), rest.take(pos)
        old, t0, rem, end = rate.take(keep), t0.take(keep), rem.take(keep), end.take(keep)
        changed = r != old
        adv = changed & (old > 0.0)
        if adv.any():
            rem = np.where(adv, np.maximum(rem - old * (key - t0), 0.0), rem)
            t0 = np.where(adv, key, t0)
        end = np.where(changed, t0 + rem / r, end)
        out.append(Instant(key, sl[done], rest, t0, rem, r, end, parts if split else None))
        if split:
            break
        sl, fid, rate = rest, fids, r
    return out


class _Chain:
    """A component running ahead: its starting slots, its instants (and their times), the
    links it held at the start, how many instants are committed, the instants with a timer
    and the token of the pending one."""

    __slots__ = ("sl", "instants", "times", "links", "committed", "ticks", "token")

    def __init__(self, sl, instants, links, ticks) -> None:
        self.sl, self.instants, self.links, self.ticks = sl, instants, links, ticks
        self.times = [i.t_s for i in instants]
        self.committed = 0
        self.token = 0


class RunAheads:
    """The chains of a :class:`~simulator.network.flows.FlowNetwork` (a part of it, held as
    ``ahead``: it uses the network's environment, flow slots, rate memo, heap and stats)."""

    def __init__(self, net) -> None:
        self.net = net
        self._enabled = RUN_AHEAD
        self._on: dict[int, int] = {}  # link -> id of the chain holding it
        self._chains: dict[int, _Chain] = {}
        self._next_id = 0
        self._next_token = 0

    def start(self, sl: np.ndarray, lens, n_single: int) -> None:
        """The component just solved in slots ``sl`` (the whole update: ``lens`` its size,
        no lone flow) runs ahead where its next instants are known."""
        if self._enabled and not n_single and len(lens) == 1:
            slots = self.net.slots
            self._begin(sl, slots._t0[sl], slots._rem[sl], slots._rate[sl], slots._end[sl], True)

    def _begin(self, sl, t0, rem, rate, end, indexed: bool) -> None:
        """Run component ``sl`` (state ``t0``, ``rem``, ``rate``, ``end``) ahead from now, if
        at least :data:`_MIN_INSTANTS` instants are known; else, unless it is still in the
        flow-by-flow path (``indexed``), hand it back there."""
        net, slots = self.net, self.net.slots
        now = net.env.now
        inst = chain_ahead(sl, slots._fid[sl], t0, rem, rate, end, self._split, 2 * now)
        if len(inst) < (_MIN_INSTANTS if indexed and inst and inst[-1].sl.shape[0] else 1):
            if not indexed:
                self._hand_back(sl, t0, rem, rate, end, None)
            return
        # a timer where a phase's last flow of the chain completes, and at the last instant
        ticks = [0] if len(inst) == 1 else self._ticks(inst)
        links = self._links_of(sl).tolist()
        if indexed:
            deque(map(slots._link_flows.__delitem__, links), maxlen=0)
            slots._batch[sl] = _IN_CHAIN
        cid = self._next_id = self._next_id + 1
        chain = self._chains[cid] = _Chain(sl, inst, links, ticks)
        self._on.update(zip(links, repeat(cid)))
        self._arm(cid, chain, now)

    def _ticks(self, inst: list) -> list[int]:
        """The instants where a phase's last flow among ``inst`` completes, and the last one."""
        slots = self.net.slots
        pids = slots._pid[np.concatenate([i.done for i in inst])]
        going = slots._pid[inst[-1].sl]
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
        i = chain.instants[k]
        if i.lens is None:
            self._hand_back(i.sl, i.t0, i.rem, i.rate, i.end, None)
            return
        a = 0  # a split: each component runs ahead on its own where it can
        for n in i.lens:
            b = a + n
            self._begin(i.sl[a:b], i.t0[a:b], i.rem[a:b], i.rate[a:b], i.end[a:b], False)
            a = b

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
            if i.sl.shape[0]:
                stats.recomputations += 1
                stats.components_solved += 1 if i.lens is None else len(i.lens)
                stats.flows_recomputed += i.sl.shape[0]
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

    def _return(self, cid: int, chain: _Chain, k: int) -> None:
        """The survivors after instant ``k`` (-1: the start) go back to the flow-by-flow path."""
        self._drop(cid, chain)
        if k >= 0:
            i = chain.instants[k]
            self._hand_back(i.sl, i.t0, i.rem, i.rate, i.end, i.lens)
        else:
            slots, sl = self.net.slots, chain.sl
            self._hand_back(sl, slots._t0[sl], slots._rem[sl], slots._rate[sl], slots._end[sl], None)

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
            live = self._links_of(chain.instants[k].sl if k >= 0 else chain.sl)
            if not np.isin(hit[cid], live).any():
                deque(map(on.__delitem__, hit[cid]), maxlen=0)
                continue
            free = False
            if arriving:
                self._return(cid, chain, k)
        return free

    def return_all(self) -> None:
        """Every chain's survivors back in the flow-by-flow path, as they stand now."""
        now = self.net.env.now
        for cid in sorted(self._chains):
            chain = self._chains[cid]
            k = bisect.bisect_right(chain.times, now) - 1
            self._commit(chain, k)
            self._return(cid, chain, k)
