"""Flow-level network: point-to-point transfers sharing link bandwidth max-min fairly.

Layers, in the style of Estee's ``netmodels``:

* :mod:`simulator.network.maxmin` -- the bandwidth-sharing maths (pure functions of flows and capacities);
* :mod:`simulator.network.phases` -- :class:`Transfer` and the routing, validation
  and merging of a phase into a :class:`~simulator.network.phases.PreparedPhase`;
* :mod:`simulator.network.isolated` -- phases alone on their links, run from their
  precomputed evolution (reservations);
* :mod:`simulator.network.flowslots` -- the in-flight flows' slot arrays;
* :mod:`simulator.network.runahead` -- big components' completions computed ahead;
* :class:`FlowNetwork` (here) -- the simpy side, which only decides *when* and
  *what* to recompute.

Incremental recomputation
-------------------------
Under max-min fairness the rates of a set of flows depend only on the flows they
share links with, transitively: the *link-sharing component*. Two flows in
different components never influence each other, and max-min of the union is the
union of the per-component max-mins. So when a phase arrives or flows complete,
the network recomputes only the components that contain a changed link (found by
a breadth-first search over a link -> active-flows index); every other flow keeps
its rate, its progress reference and its completion time untouched; a completion on links
nobody else uses costs no solve at all.

Each flow stores ``(t0, remaining at t0, rate)``; its progress is only advanced when
its rate is recomputed, so its completion time ``t0 + remaining / rate`` is exact and
unaffected by unrelated events. Each solved component is pushed on a heap keyed by
its earliest completion (ties broken by a counter); the flows that share no link
with any other (a ring on a crossbar, a rail) are pushed as one group per instant
and complete one by one. A single simpy wake-up is kept for the heap's top and is
only rescheduled when the top moves earlier.

Solvers (all give the bits of solving each component alone with
:func:`~simulator.network.maxmin.fill_arrays`): a flow alone gets its tightest link; small
components go through :func:`~simulator.network.maxmin.fill_small` (plain Python), the rest of
an instant through one :func:`~simulator.network.maxmin.fill_components` call (numpy). Large
solves, and how a component's survivors split after completions, are remembered by the flows'
identities (:mod:`simulator.network.ratememo`). Updates of at most :data:`_SCALAR_SOLVE_MAX`
flows (``_recompute_scalar``, ``_complete_scalar``) repeat the vectorised arithmetic on Python
floats, the same IEEE operations in the same order, to skip numpy's per-call overhead.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import simpy

from simulator.errors import NetworkError
from simulator.network.calibration import NetCalibration
from simulator.network.components import beyond_search, bounded_search, canonical, number_links, remembered_components
from simulator.network.flowslots import FlowSlots
from simulator.network.isolated import Reservations
from simulator.network.maxmin import DONE_RTOL, fill_arrays, fill_components, fill_small
from simulator.network.phases import PhasePreparer, PreparedPhase, Transfer, distinct_links
from simulator.network.ratememo import MEMO_MIN_FLOWS, RateMemo
from simulator.network.runahead import RunAheads
from simulator.network.stats import NetworkStats

if TYPE_CHECKING:  # pragma: no cover
    from topologies.topology import Topology

__all__ = ["FlowNetwork", "NetworkError", "NetworkStats", "Transfer"]

#: Components (of two or more flows) solved at one instant are solved in plain Python
#: when they hold at most this many flows in all, else together in numpy (whose
#: per-call overhead dominates below it).
SMALL_COMPONENT = 48
#: Updates of at most this many flows in all are solved on scalars (``_recompute_scalar``:
#: the same bits; below it numpy's per-call overhead outweighs the loop over flows).
_SCALAR_SOLVE_MAX = 16
#: Small-component solutions (:meth:`FlowNetwork._fill_memo`) remembered per network.
_FILL_MEMO_MAX = 16384

_INF = float("inf")


class FlowNetwork:
    """All in-flight transfers of one simulation, sharing links max-min fairly: the phases,
    their events and the rate updates here; the in-flight flows' slot arrays in ``slots``
    (:class:`~simulator.network.flowslots.FlowSlots`) and the phases run alone on their links
    in ``reservations`` (:class:`~simulator.network.isolated.Reservations`).

    Parameters
    ----------
    env : simpy.Environment
    topo : topologies.topology.Topology
        Supplies ``route``, ``link_capacity`` (bytes/s per direction),
        ``link_latency`` (s) and ``link_kind``.
    calibration : NetCalibration, optional
        Link capacity used = ``topo.link_capacity * efficiency[kind]``; per-step
        software latency per kind. Default: line rate, no overhead.
    """

    def __init__(
        self,
        env: simpy.Environment,
        topo: Topology,
        calibration: NetCalibration | None = None,
        reserve_isolated: bool = True,
    ) -> None:
        self.env = env
        self.slots, self.reservations, self.ahead = FlowSlots(self), Reservations(self), RunAheads(self)
        self.topo = topo
        self.calibration = calibration if calibration is not None else NetCalibration()
        kinds = tuple(topo.link_kind)
        names = sorted(set(kinds))  # per kind, then spread over the links
        of_kind = np.searchsorted(np.array(names), np.array(kinds)) if kinds else np.zeros(0, dtype=np.int64)
        eff = np.array([self.calibration.efficiency_of(k) for k in names], dtype=float)[of_kind]
        self.capacity = np.asarray(topo.link_capacity, dtype=float) * eff
        if self.capacity.size and not np.all(self.capacity > 0):
            bad = int(np.argmin(self.capacity))
            raise NetworkError(f"link {bad} has capacity {self.capacity[bad]!r}; must be > 0")
        self.link_latency = np.asarray(topo.link_latency, dtype=float)
        self.link_overhead = np.array([self.calibration.overhead_of(k) for k in names], dtype=float)[of_kind]
        self.n_links = self.capacity.shape[0]
        self.stats = NetworkStats(link_bytes=np.zeros(self.n_links), link_capacity=self.capacity)
        self._cap = self.capacity.tolist()
        self._cap_pad = np.append(self.capacity, np.inf)  # index -1 (padding) -> inf
        self._link_scratch = np.full(self.n_links, -1, dtype=np.int64)  # components.number_links
        self.phases = PhasePreparer(topo, self.link_latency, self.link_overhead)
        self.slots._init_slots()
        #: Scratch memo for callers that hand the same phases again and again
        #: (:func:`simulator.network.collectives.run_collective` keeps its merged phases here).
        self.memo: dict = {}
        self._new_phases: list = []  # (prepared phase, its slots) arrived since then
        self._dirty: list[int] = []  # links of flows completed since the last update
        self._update_pending = False
        self._heap: list[tuple[float, int]] = []  # (earliest completion, batch id)
        # batch id -> (its slots, whether they complete one by one)
        self._batches: dict[int, tuple[np.ndarray | list[int], bool]] = {}
        self._next_bid = 0
        self._wake_at = _INF
        self._gen = 0
        self._phase_ids = itertools.count()
        self._phase_left: dict[int, int] = {}
        self._phase_event: dict[int, simpy.Event] = {}
        self.reservations._init_reservations(reserve_isolated)
        self._fills: dict[tuple, list] = {}  # component -> fill_small rates
        self._memo = RateMemo()  # large solves and splits by flow identities
        self._split_of: tuple | None = None  # (slots, batch) of the one component completing
        self._links_of: dict[int, tuple] = {}  # id(prepared phase) -> (it, its distinct links)

    # -- public ------------------------------------------------------------

    @property
    def active_flows(self) -> int:
        return self.slots._n_active

    @property
    def reserves_isolated(self) -> bool:
        """Whether phases alone on their links run from their cached evolution."""
        return self.reservations._reserve

    def flow_table(self) -> list[tuple[tuple[int, ...], float, float, float]]:
        """``(links, weight, rate per unit flow, bytes left now)`` of every flow in the
        network, in arrival order. Rates are those in force after the last update
        (flows that arrived at this very instant may still show rate 0)."""
        for pid in sorted(self.reservations._reserved):
            self.reservations._materialise(pid)
        self.ahead.return_all()
        return self.slots.table(self.env.now)

    def route(self, src: int, dst: int) -> tuple[tuple[int, ...], float, float]:
        """``(links, path latency, largest per-link overhead)`` of ``src -> dst`` (cached;
        a transfer's phase latency is path latency + overhead)."""
        return self.phases.route(src, dst)

    def routes(self, src, dst) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`PhasePreparer.routes <simulator.network.phases.PhasePreparer.routes>`:
        ``(links padded with -1, latency_s)`` of every ``src[i] -> dst[i]``."""
        return self.phases.routes(src, dst)

    def prepared(self, transfers: Sequence[Transfer]) -> PreparedPhase | None:
        """The validated, merged and routed form of a phase (None: nothing to send), cached."""
        return self.phases.prepare(transfers)

    def phase_latency_s(self, transfers: Sequence[Transfer], steps: int = 1) -> float:
        """``steps`` x (largest path latency + largest per-step overhead) of ``transfers``.

        Transfers with ``src == dst`` or zero bytes do not count.
        """
        prep = self.phases.prepare(transfers)
        return 0.0 if prep is None else steps * prep.latency_s

    def transfer(self, transfers: Sequence[Transfer], steps: int = 1) -> simpy.Event:
        """Start a phase; the returned event fires when its last transfer completes.

        All transfers start together after the phase latency (see
        :meth:`phase_latency_s`) and then share bandwidth with every other
        in-flight flow. Transfers with ``src == dst`` or zero bytes are free. A
        phase with no network transfer completes at once. Identical transfers
        (same ``src``, ``dst``, ``size_bytes``) become one flow of summed weight.

        Raises
        ------
        NetworkError
            On ``steps < 1``, a negative size, a weight < 1 or an unknown device.
        """
        res = self.reservations
        if not (isinstance(steps, (int, np.integer)) and steps >= 1):
            raise NetworkError(f"steps must be an integer >= 1, got {steps!r}")
        prep = self.phases.prepare(transfers)
        stats = self.stats
        stats.phases_started += 1
        if prep is None:
            done = self.env.event()
            done.succeed()
            return done
        pid = next(self._phase_ids)
        self._phase_left[pid] = len(prep.links)
        stats.flows_started += prep.n_transfers
        stats.flow_rows_started += len(prep.links)
        stats.unit_flows_started += prep.units
        latency = steps * prep.latency_s
        if res._reserve:
            # Alone on its links already: reserve them from now, through the latency.
            # The reservation's timer is the phase's event (one simpy event, not two)
            # unless the phase is materialised (see :meth:`_materialise`).
            link_set, _, iso = res.isolation(prep)
            if iso is not None and res._free_of_reservations(prep) and res._free_of_flows(link_set):
                timer = res._reserve_phase(pid, prep, iso, latency)
                self._phase_event[pid] = timer
                return timer
        done = self._phase_event[pid] = self.env.event()
        self.env.timeout(latency).callbacks.append(partial(self._arrive, pid, prep))
        return done

    # -- event handling ------------------------------------------------------

    def _arrive(self, pid: int, prep: PreparedPhase, _ev=None) -> None:
        """The phase's latency has elapsed: reserve its links if it is alone on them (a
        big phase: the components that are), else its flows enter the network
        (materialising the reserved phases, or their components, in the way)."""
        res = self.reservations
        self.ahead.arriving(prep, self._links_of)  # chains on its links return their survivors
        if res._reserve:
            link_set, _, iso = res.isolation(prep)
            for other, links in res.reserved_on(prep):
                res._materialise(other, links)
            if iso is not None:
                lf = self.slots._flushed()  # the whole link index, for the checks below
                if lf.keys().isdisjoint(link_set):
                    res._reserve_phase(pid, prep, iso)
                    return
                if res._reserve_apart(pid, prep, iso, sorted(lf.keys() & link_set)):
                    return
        self.slots._insert(pid, prep)

    def _request_update(self) -> None:
        """Recompute once at this instant, after every change made at it."""
        if not self._update_pending:
            self._update_pending = True
            self.env.timeout(0).callbacks.append(self._update)

    def _components(self, seeds: list[int], large: bool = False) -> tuple[list[list[int]], list[int]]:
        """Link-sharing components of the active flows on ``seeds`` (links; ``large``: beyond the search).

        Returns ``(components, singles)``: components of two or more flows, each in
        arrival order, in order of their first flow's arrival; and the flows that
        share no link with any other (the common case: a ring on a crossbar or a
        rail), in arrival order."""
        slots = self.slots
        # -- components: simulator/network/components.py --
        found = None if large else bounded_search(slots._link_flows, slots._links, seeds)
        if found is None:  # a large component: one array pass over every active flow
            return remembered_components(self._memo, slots, self.n_links, seeds)
        return canonical(*found, slots._seq)

    def _update(self, _ev=None) -> None:
        self._update_pending = False
        seeds = self._dirty
        self._dirty = []
        phases = self._new_phases
        self._new_phases = []
        split, self._split_of = self._split_of, None
        if split is not None and not phases and self._split_update(split, seeds):
            self._schedule_wake()
            return
        if not seeds and len(phases) == 1 and self._isolated(phases[0][0]):
            # a big phase on links nobody else uses: its own components, known in advance
            prep, sl = phases[0]
            own, single = prep.by_link[2]
            comps = [sl[c].tolist() for c in own]
            singles = sl[single].tolist()
        else:
            for prep, _ in phases:  # the links of the flows arrived (each phase's, once)
                seeds.extend(distinct_links(self._links_of, prep))
            comps, singles = self._components(seeds, any(map(beyond_search, (p for p, _ in phases))))
        if comps or singles:
            self._recompute(comps, singles)
        self.ahead.arrived(comps, singles)  # a big phase's component may run ahead at once
        self._schedule_wake()

    def _split_update(self, split: tuple, seeds: list[int]) -> bool:
        """The update after completions in one component only (``split``: its slots and
        batch): its survivors are the flows to re-solve (every other batch is link-disjoint
        from it, so the seeds reach nothing else), split into components and solved as
        the last time the same flows survived (:class:`~simulator.network.ratememo.RateMemo`),
        or found and solved and remembered. False (the caller does the general update)
        where the survivors are too few to be worth a key."""
        slots = self.slots
        sl, bid = split
        rest = sl[slots._batch[sl] == bid]  # survivors, in arrival order
        if rest.shape[0] < MEMO_MIN_FLOWS:
            return False
        fids = slots._fid[rest]
        hit = self._memo.split(fids)
        if hit is not None:
            pos, lens, n_single, rates = hit
            self._recompute_slots(rest[pos], list(lens), n_single, rates)
            self.ahead.start(rest[pos], lens, n_single)  # its next instants, where known
            return True
        comps, singles = self._components(seeds)
        rates = self._recompute(comps, singles) if comps or singles else None
        self._memo.keep_split(fids, slots._seq[rest], comps, singles, slots._seq, rates)
        return True

    def _isolated(self, prep: PreparedPhase) -> bool:
        """Whether the (big) phase just arrived is alone on every one of its links."""
        return prep.by_link is not None and self.slots._alone(prep)

    def _fill_big(self, sl: np.ndarray, w: np.ndarray, lens: list[int]) -> np.ndarray:
        """Max-min rates of components given back to back (slots ``sl``, sizes ``lens``)."""
        slots = self.slots
        sub = slots._tab[sl]
        mask = sub >= 0
        flat = sub[mask].astype(np.int64)
        owner = np.nonzero(mask)[0]
        mult = slots._mtab[sl][mask] if slots._any_mult else None
        if len(lens) == 1:
            used, local, _ = number_links(flat, None, self._link_scratch)
            return fill_arrays(owner, local, np.ones(flat.shape[0]) if mult is None else mult, w, self.capacity[used])
        comp = np.repeat(np.arange(len(lens)), lens)[owner]
        used, local, link_comp = number_links(flat, comp, self._link_scratch)
        assert link_comp is not None  # components given, components returned
        comp_start = np.searchsorted(link_comp, np.arange(len(lens) + 1))
        return fill_components(owner, local, w, self.capacity[used], link_comp, comp_start, mult)

    def _recompute(self, comps: list[list[int]], singles: list[int], rates=None) -> np.ndarray | None:
        """Solve each component alone; keep the segment of flows whose rate is unchanged.

        Each component becomes one heap entry (a batch); all single-flow components
        of this instant share one (a *group* batch, whose flows complete one by one).
        ``rates``: the rates solved (remembered), in the order of ``comps`` then
        ``singles``. Returns the rates in that order (None for a handful of flows)."""
        lens = [len(c) for c in comps]
        total = sum(lens) + len(singles)
        if total <= _SCALAR_SOLVE_MAX:
            stats = self.stats
            stats.recomputations += 1
            stats.components_solved += len(comps) + len(singles)
            stats.flows_recomputed += total
            self._recompute_scalar(comps + [singles] if singles else comps, bool(singles), self.env.now)
            return None
        sl = np.fromiter(itertools.chain(*comps, singles), dtype=np.int64, count=total)
        return self._recompute_slots(sl, lens, len(singles), rates)

    def _recompute_slots(self, sl: np.ndarray, lens: list[int], n_single: int, rates=None) -> np.ndarray:
        """:meth:`_recompute` of more than a handful of flows given as slots ``sl``: the
        components back to back (sizes ``lens``), then ``n_single`` lone flows."""
        slots = self.slots
        now = self.env.now
        stats = self.stats
        stats.recomputations += 1
        stats.components_solved += len(lens) + n_single
        stats.flows_recomputed += sl.shape[0]
        r = rates if rates is not None else self._solve(sl, lens, n_single)
        singles = n_single > 0
        if singles:
            lens = lens + [n_single]
        n_comps = len(lens)
        old = slots._rate[sl]
        t0 = slots._t0[sl]
        rem = slots._rem[sl]
        changed = r != old
        adv = changed & (old > 0.0)  # advance at the old rate up to now
        if adv.any():
            rem = np.where(adv, np.maximum(rem - old * (now - t0), 0.0), rem)
            t0 = np.where(adv, now, t0)
            slots._rem[sl] = rem
            slots._t0[sl] = t0
        # same rate: same segment, same completion time
        end = np.where(changed, t0 + rem / r, slots._end[sl])
        slots._rate[sl] = r
        slots._end[sl] = end
        b0 = self._next_bid
        self._next_bid += n_comps
        slots._batch[sl] = np.repeat(np.arange(b0, b0 + n_comps), lens)
        if n_comps == 1:
            firsts, starts = [float(end.min())], [0]
        else:
            starts = np.cumsum(lens) - lens
            firsts = np.minimum.reduceat(end, starts).tolist()  # pyright: ignore[reportArgumentType]  (int starts)
            starts = starts.tolist()
        heap, batches = self._heap, self._batches
        last = n_comps - 1
        for i, (first, start, n) in enumerate(zip(firsts, starts, lens)):
            batches[b0 + i] = (sl[start : start + n], singles and i == last)
            heapq.heappush(heap, (first, b0 + i))
        return r

    def _solve(self, sl: np.ndarray, lens: list[int], n_single: int) -> np.ndarray:
        """Max-min rates of the components in slots ``sl`` back to back (sizes ``lens``), then
        of ``n_single`` lone flows (each gets its tightest link: routes are simple paths)."""
        slots = self.slots
        pos = sum(lens)
        w = slots._w[sl]
        if not lens:
            r = np.zeros(0)
        elif pos <= SMALL_COMPONENT:
            parts: list = []
            at = 0
            wl, links = w.tolist(), slots._links
            mults = slots._mults if slots._any_mult else None
            flat = sl[:pos].tolist()
            for n in lens:
                comp = flat[at : at + n]
                parts.extend(
                    self._fill_memo(
                        [links[s] for s in comp], wl[at : at + n], None if mults is None else [mults[s] for s in comp]
                    )
                )
                at += n
            r = np.array(parts)
        else:
            r = self._fill_remembered(sl[:pos], w[:pos], lens)
        if n_single:
            single = sl[pos:]
            if slots._any_mult:
                alone = (self._cap_pad[slots._tab[single]] / (w[pos:, None] * slots._mtab[single])).min(axis=1)
            else:
                alone = self._cap_pad[slots._tab[single]].min(axis=1) / w[pos:]
            r = np.concatenate([r, alone])
        return r

    def _fill_remembered(self, sl: np.ndarray, w: np.ndarray, lens: list[int]) -> np.ndarray:
        """:meth:`_fill_big`, remembered by the flows' identities where they are many."""
        if sl.shape[0] < MEMO_MIN_FLOWS:
            return self._fill_big(sl, w, lens)
        fids, key = self.slots._fid[sl], tuple(lens)
        r = self._memo.rates(fids, key)
        if r is None:
            r = self._fill_big(sl, w, lens)
            self._memo.keep_rates(fids, key, r)
        return r

    def _fill_memo(self, flow_links: list, w: list, mults: list | None) -> list[float]:
        """:func:`fill_small` on this network's capacities, remembered per component
        (routes, weights and multiplicities, in order): the components of a repeated
        phase mix recur every micro-batch, and the rates are a pure function of them."""
        key = (tuple(flow_links), tuple(w), None if mults is None else tuple(mults))
        memo = self._fills
        hit = memo.get(key)
        if hit is None:
            if len(memo) >= _FILL_MEMO_MAX:
                memo.clear()
            hit = memo[key] = fill_small(flow_links, w, self._cap, mults)
        return hit

    def _recompute_scalar(self, comps: list[list[int]], grouped: bool, now: float) -> None:
        """:meth:`_recompute` for a handful of flows: the same arithmetic on scalars.
        With ``grouped`` the last of ``comps`` is the group of single flows."""
        slots = self.slots
        links, cap = slots._links, self._cap
        w, rem, t0, rate, end = slots._w, slots._rem, slots._t0, slots._rate, slots._end
        batch, heap, batches = slots._batch, self._heap, self._batches
        last = len(comps) - 1
        mults = slots._mults if slots._any_mult else None
        for i, comp in enumerate(comps):
            group = grouped and i == last
            if group:
                rates = [
                    min(map(cap.__getitem__, links[s])) / w.item(s)
                    if mults is None or mults[s] is None
                    else min(cap[lk] / (w.item(s) * m) for lk, m in zip(links[s], mults[s]))
                    for s in comp
                ]
            else:
                rates = self._fill_memo(
                    [links[s] for s in comp],
                    [w.item(s) for s in comp],
                    None if mults is None else [mults[s] for s in comp],
                )
            bid = self._next_bid
            self._next_bid += 1
            first = _INF
            for s, r in zip(comp, rates):
                old = rate.item(s)
                if r != old:
                    if old > 0.0:
                        start = t0.item(s)
                        left = rem.item(s) - old * (now - start)
                        rem[s] = left = left if left > 0.0 else 0.0
                        t0[s] = start = now
                    else:
                        left, start = rem.item(s), t0.item(s)
                    rate[s] = r
                    e = start + left / r
                    end[s] = e
                else:
                    e = end.item(s)
                batch[s] = bid
                if e < first:
                    first = e
            batches[bid] = (comp, group)
            heapq.heappush(heap, (first, bid))

    def _schedule_wake(self) -> None:
        """Keep one simpy wake-up at the earliest completion; only reschedule when
        that time moves earlier."""
        heap, batches = self._heap, self._batches
        while heap:
            key, bid = heap[0]
            sl, group = batches[bid]
            if not group:
                if self.slots._batch[sl[0]] == bid:  # a component is re-solved whole
                    break
                heapq.heappop(heap)
                del batches[bid]
                continue
            live, ends = self._live_of(sl, bid)  # a group loses flows one by one
            if live.shape[0] and float(ends.min()) == key:
                break
            heapq.heappop(heap)
            if live.shape[0]:
                batches[bid] = (live, True)
                heapq.heappush(heap, (float(ends.min()), bid))
            else:
                del batches[bid]
        if not heap:
            return
        t = heap[0][0]
        if t < self._wake_at:
            self._gen += 1
            self._wake_at = t
            delay = t - self.env.now
            self.env.timeout(delay if delay > 0.0 else 0.0).callbacks.append(partial(self._wake, self._gen, t))

    def _wake(self, gen: int, t: float, _ev=None) -> None:
        slots = self.slots
        if gen != self._gen:
            return
        self._wake_at = _INF
        self.stats.wakeups += 1
        heap, batches = self._heap, self._batches
        end, t0, batch = slots._end, slots._t0, slots._batch
        comps, keys, done, regroup, bids = [], [], [], [], []
        while heap and heap[0][0] <= t:
            key, bid = heapq.heappop(heap)
            sl, group = batches.pop(bid)
            if group:
                # single flows: exactly those due now; the others keep going untouched
                live, ends = self._live_of(sl, bid)
                due = ends <= t
                done.append(live[due])
                if not due.all():
                    regroup.append((live[~due], ends[~due], bid))
            elif batch[sl[0]] == bid:
                comps.append(sl)
                keys.append(key)
                bids.append(bid)
        for rest, ends, bid in regroup:
            batches[bid] = (rest, True)
            heapq.heappush(heap, (float(ends.min()), bid))
        if comps:
            # A flow completes with the earliest of its own component (within DONE_RTOL
            # of its segment). Every other flow of the component shares links with a
            # completing one (transitively), so the update below re-solves all of them.
            if len(comps) == 1:
                sl, key = np.asarray(comps[0]), keys[0]
            else:
                sl = np.concatenate(comps)
                key = np.repeat(keys, [len(c) for c in comps])
            e = end[sl]
            done.append(sl[e <= key + DONE_RTOL * (e - t0[sl])])
        if done:
            finished = done[0] if len(done) == 1 else np.concatenate(done)
            if finished.shape[0]:
                self._split_of = (np.asarray(comps[0]), bids[0]) if len(comps) == 1 else None
                slots._complete(finished)
                self._request_update()
                return
        self._schedule_wake()

    def _live_of(self, sl, bid: int) -> tuple[np.ndarray, np.ndarray]:
        """Slots of group batch ``bid`` not re-solved since, and their completion times."""
        slots = self.slots
        sl = np.asarray(sl)
        sl = sl[slots._batch[sl] == bid]
        return sl, slots._end[sl]
