"""Isolated phases: a phase alone on its links runs from its precomputed evolution.

Most collective phases run on links nobody else is using for their whole life (a
ring inside one NVLink domain, an all-to-all on a stage's own nodes). How such a
phase evolves -- its rates, the instants its flows finish, the bytes it leaves on
each link -- is a pure function of the phase, computed once per prepared phase
(:func:`isolated_evolution`). A phase found alone on its links at arrival is
therefore *reserved*: its links are marked, one timer fires its completion, and none
of its flows enters the incremental machinery of :class:`~simulator.network.flows.FlowNetwork`.
If another flow later arrives on a reserved link, the phase is *materialised* first:
its unfinished flows enter the flow arrays with the state the cached evolution gives
for that instant (remaining bytes, rate, segment start), and the normal recomputation
takes over. The result is the one the flow-by-flow path computes (same arithmetic,
offsets rounded once more); ``FlowNetwork(..., reserve_isolated=False)`` turns the
fast path off.

A big phase (one with its own link-sharing components, ``PreparedPhase.by_link``) is
reserved component by component: traffic arriving on some of its links materialises
only the components that hold those links, and the others stay reserved, their bytes
and their finish taken from the same evolution (components share no link, so each one
evolves alone whatever happens to the others). A big phase that arrives on links some
flows use is reserved the same way, its busy components materialised at once. So a
ZeRO-3 gather stage of thousands of one-link flows hands the flow-by-flow path only the
flows on the links an all-to-all crosses, and a send that meets one component of an
all-to-all does not materialise the others. :data:`SPLIT_BY_COMPONENT` turns this off
(the whole phase materialises, as for small phases).

:class:`Reservations` is the part of :class:`~simulator.network.flows.FlowNetwork`
that reserves, completes and materialises such phases.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import partial

import numpy as np
import simpy

from simulator.network.maxmin import DONE_RTOL, fill_arrays
from simulator.network.phases import _PREPARED_MAX, PreparedPhase

#: A phase whose isolated evolution has more distinct completion instants than this
#: is not reserved (its evolution costs more to precompute than the flow-by-flow
#: path, which re-solves only the components that change).
_ISOLATED_MAX_SEGMENTS = 64
#: Phases of at most this many links are checked against the reserved links one link at a
#: time (numpy's per-call cost is larger below it).
_FEW_LINKS = 16
#: Whether big phases are reserved and materialised component by component (see the
#: module doc); read when a network is made. False: a reserved phase materialises whole.
SPLIT_BY_COMPONENT = True


@dataclass(frozen=True)
class IsolatedEvolution:
    """How a prepared phase evolves when it is alone on its links.

    Offsets are seconds after the phase's flows enter the network. Segment ``i``
    starts at ``seg_start[i]``; the flows (indices into the phase) still running
    then are ``seg_flows[i]``, with ``seg_rem[i]`` bytes left per unit flow and rate
    ``seg_rate[i]`` per unit flow until the next segment starts.
    """

    duration_s: float  # until the last flow completes
    links: np.ndarray  # distinct links of the phase (int64)
    link_list: list  # the same, as Python ints
    link_bytes: np.ndarray  # bytes the whole phase puts on each of them
    seg_start: list
    seg_flows: list
    seg_rem: list
    seg_rate: list


def isolated_evolution(
    prep: PreparedPhase, capacity: np.ndarray, max_segments: int = _ISOLATED_MAX_SEGMENTS
) -> IsolatedEvolution | None:
    """The :class:`IsolatedEvolution` evolution of ``prep`` on links of ``capacity`` (bytes/s,
    calibrated), or None when it has more than ``max_segments`` completion instants.

    Progressive filling of the flows still running (:func:`fill_arrays`), advanced to
    the earliest completion; flows within :data:`DONE_RTOL` of it complete with it, as
    in :class:`FlowNetwork`.
    """
    table = prep.table
    mask = table >= 0
    owner_all = np.nonzero(mask)[0]
    flat_all = table[mask].astype(np.int64)
    mult_all = prep.mtable[mask] if prep.mtable is not None else np.ones(flat_all.shape[0])
    uniq, local_all = np.unique(flat_all, return_inverse=True)
    local_all = local_all.reshape(-1)
    cap = capacity[uniq]
    w_all = prep.weights
    moved = w_all * prep.sizes
    link_bytes = np.bincount(local_all, moved[owner_all] * mult_all, minlength=uniq.shape[0])
    alive = np.arange(table.shape[0])
    rem = prep.sizes.copy()
    t = 0.0
    starts, flows, rems, rates_seg = [], [], [], []
    while alive.shape[0]:
        if len(starts) == max_segments:
            return None
        keep = np.isin(owner_all, alive) if alive.shape[0] < table.shape[0] else np.ones(owner_all.shape[0], dtype=bool)
        # owners renumbered 0..len(alive)-1 in alive order (alive is increasing)
        owner = np.searchsorted(alive, owner_all[keep])
        rates = fill_arrays(owner, local_all[keep], mult_all[keep], w_all[alive], cap)
        starts.append(t)
        flows.append(alive)
        rems.append(rem)
        rates_seg.append(rates)
        end = t + rem / rates
        first = float(end.min())
        done = end <= first + DONE_RTOL * (end - t)
        rem = np.maximum(rem[~done] - rates[~done] * (first - t), 0.0)
        alive = alive[~done]
        t = first
    return IsolatedEvolution(t, uniq, uniq.tolist(), link_bytes, starts, flows, rems, rates_seg)


@dataclass(frozen=True)
class ComponentSplit:
    """A big phase's own link-sharing components, aligned with its :class:`IsolatedEvolution`.

    ``flow_comp[f]`` is flow f's component (the multi-flow components of
    ``PreparedPhase.by_link`` first, then one per lone flow); ``link_comp[j]`` that of
    the evolution's distinct link ``links[j]``; ``comp_fin[c]`` the offset (after the
    flows enter the network) at which component c's last flow finishes.
    """

    n_comp: int
    flow_comp: np.ndarray
    link_comp: np.ndarray
    comp_fin: np.ndarray


def component_split(prep: PreparedPhase, iso: IsolatedEvolution) -> ComponentSplit:
    """The :class:`ComponentSplit` of a big phase (one with ``by_link``) and its evolution."""
    assert prep.by_link is not None
    comps, single = prep.by_link[2]
    k = len(prep.links)
    flow_comp = np.empty(k, dtype=np.int64)
    for c, idx in enumerate(comps):
        flow_comp[idx] = c
    flow_comp[single] = len(comps) + np.arange(single.shape[0])
    n_comp = len(comps) + int(single.shape[0])
    fin = np.full(k, iso.duration_s)  # alive in the last segment: the phase's end
    for i in range(1, len(iso.seg_start)):  # alive in segment i - 1, not in i: its start
        gone = np.setdiff1d(iso.seg_flows[i - 1], iso.seg_flows[i], assume_unique=True)
        fin[gone] = iso.seg_start[i]
    comp_fin = np.zeros(n_comp)
    np.maximum.at(comp_fin, flow_comp, fin)
    mask = prep.table >= 0
    link_comp = np.empty(iso.links.shape[0], dtype=np.int64)
    link_comp[np.searchsorted(iso.links, prep.table[mask])] = flow_comp[np.nonzero(mask)[0]]
    return ComponentSplit(n_comp, flow_comp, link_comp, comp_fin)


class _Held:
    """A reserved phase: its prepared form and evolution, the arrival of its flows, the
    token and timer of its (remaining) reservation and, once split, which of its own
    components are still reserved (``left``; None: all of them)."""

    __slots__ = ("prep", "iso", "t_arr", "token", "timer", "finish", "left")

    def __init__(self, prep, iso, t_arr, token, timer, finish) -> None:
        self.prep, self.iso, self.t_arr = prep, iso, t_arr
        self.token, self.timer, self.finish = token, timer, finish
        self.left: np.ndarray | None = None


class Reservations:
    """Reserved (isolated) phases of a :class:`~simulator.network.flows.FlowNetwork` (a part of
    it, held as ``net``: it uses the network's simpy environment, stats, flow slots and phase
    events)."""

    def __init__(self, net) -> None:
        self.net = net  # the flow network: its environment, stats, phases and other half

    def _init_reservations(self, reserve_isolated: bool) -> None:
        self._reserve = bool(reserve_isolated)
        self._split = SPLIT_BY_COMPONENT
        # link -> id of the reserved phase on it (a link holds at most one), -1 for none; an
        # array, as a ZeRO-3 gather stage reserves ~12,000 links at once; and how many are held
        self._reserved_on = np.full(self.net.n_links, -1, dtype=np.int64)
        self._n_reserved_links = 0
        self._reserved: dict[int, _Held] = {}  # phase id -> its reservation
        self._next_token = 0
        self._isolation_of: dict[int, tuple] = {}  # id(prepared) -> (it, links, list, iso)
        self._splits: dict[int, tuple] = {}  # id(prepared) -> (it, ComponentSplit)

    # Link sets against the link -> flows index: set operations on dict views walk the
    # smaller side (a ZeRO-3 gather stage has ~12,000 links, the index often far fewer entries).

    def _free_of_flows(self, link_set: frozenset) -> bool:
        """Whether no flow of the flow-by-flow path (or of a chain running ahead,
        :meth:`~simulator.network.runahead.RunAheads.clear`) is on any of these links now."""
        self.net.slots._flush()
        return self.net.slots._link_flows.keys().isdisjoint(link_set) and self.net.ahead.clear(link_set, False)

    def _free_of_reservations(self, prep: PreparedPhase) -> bool:
        """Whether no reserved phase holds any of the links of ``prep``."""
        if not self._n_reserved_links:
            return True
        link_list = self.isolation(prep)[1]
        if len(link_list) <= _FEW_LINKS:
            item = self._reserved_on.item
            return all(item(lk) < 0 for lk in link_list)
        return not (self._reserved_on[self._link_array(prep)] >= 0).any()

    def reserved_on(self, prep: PreparedPhase) -> list[tuple[int, list[int]]]:
        """``(reserved phase, the links of ``prep`` it holds, increasing)`` for each reserved
        phase on a link of ``prep``, in phase order."""
        if not self._n_reserved_links:
            return []
        link_list = self.isolation(prep)[1]
        if len(link_list) <= _FEW_LINKS:
            item = self._reserved_on.item
            if all(item(lk) < 0 for lk in link_list):
                return []
        links = self._link_array(prep)
        held = self._reserved_on[links]
        on = held >= 0
        if not on.any():
            return []
        links, held = links[on], held[on]
        order = np.argsort(held, kind="stable")  # by phase, then link (links increase)
        links, held = links[order].tolist(), held[order].tolist()
        out: list[tuple[int, list[int]]] = []
        for lk, pid in zip(links, held):
            if not out or out[-1][0] != pid:
                out.append((pid, []))
            out[-1][1].append(lk)
        return out

    def _link_array(self, prep: PreparedPhase) -> np.ndarray:
        """The distinct links of ``prep`` (increasing), as an array."""
        self.isolation(prep)
        return self._isolation_of[id(prep)][4]

    def isolation(self, prep: PreparedPhase) -> tuple:
        """``(distinct links as a set, as a sorted list, isolated evolution or None)`` of
        a prepared phase, cached."""
        hit = self._isolation_of.get(id(prep))
        if hit is not None and hit[0] is prep:
            return hit[1:4]
        iso = isolated_evolution(prep, self.net.capacity)
        if iso is not None:
            link_list = iso.link_list
        else:
            link_list = np.unique(prep.table[prep.table >= 0]).tolist()
        link_set = frozenset(link_list)
        if len(self._isolation_of) >= _PREPARED_MAX:
            self._isolation_of.clear()
        link_arr = iso.links if iso is not None else np.array(link_list, dtype=np.int64)
        self._isolation_of[id(prep)] = (prep, link_set, link_list, iso, link_arr)
        return link_set, link_list, iso

    def _split_of(self, prep: PreparedPhase, iso: IsolatedEvolution) -> ComponentSplit:
        """:func:`component_split` of a big phase, cached."""
        hit = self._splits.get(id(prep))
        if hit is not None and hit[0] is prep:
            return hit[1]
        split = component_split(prep, iso)
        if len(self._splits) >= _PREPARED_MAX:
            self._splits.clear()
        self._splits[id(prep)] = (prep, split)
        return split

    def _reserve_phase(
        self, pid: int, prep: PreparedPhase, iso: IsolatedEvolution, latency_s: float = 0.0
    ) -> simpy.Event:
        """Run a phase alone on its links: one timer for its cached evolution. With
        ``latency_s`` the reservation starts now and the flows enter the links (in the
        evolution's terms) that much later."""
        self._reserved_on[iso.links] = pid
        self._n_reserved_links += iso.links.shape[0]
        token = self._next_token = self._next_token + 1
        timer = self.net.env.timeout(latency_s + iso.duration_s)
        finish = partial(self._finish_reserved, pid, token)
        timer.callbacks.append(finish)
        self._reserved[pid] = _Held(prep, iso, self.net.env.now + latency_s, token, timer, finish)
        self.net.stats.reserved_phases += 1
        self.net.slots._n_active += len(prep.links)
        if self.net.slots._n_active > self.net.stats.max_concurrent_flows:
            self.net.stats.max_concurrent_flows = self.net.slots._n_active
        return timer

    def _reserve_apart(self, pid: int, prep: PreparedPhase, iso: IsolatedEvolution, busy: list) -> bool:
        """A big phase arriving on links some flows use (``busy``): reserve it and
        materialise at once the components that cross them. False (nothing done) where
        that is every component, or the phase cannot be split."""
        if not self._split or prep.by_link is None:
            return False
        split = self._split_of(prep, iso)
        hit = np.unique(split.link_comp[np.searchsorted(iso.links, busy)])
        if hit.shape[0] == split.n_comp:
            return False
        self._reserve_phase(pid, prep, iso)
        self._materialise(pid, busy)
        return True

    def _finish_reserved(self, pid: int, token: int, _ev=None) -> None:
        """A reserved phase's timer: it completes (what is left of it reserved), unless it
        was materialised since (and perhaps reserved again, under another token)."""
        held = self._reserved.get(pid)
        if held is None or held.token != token:
            return
        if held.left is None:
            iso = self._unreserve(pid)[1]
            self._retire(pid, iso)
            return
        # the components still reserved: their links' bytes, then the phase's count
        del self._reserved[pid]
        split = self._split_of(held.prep, held.iso)
        on = held.left[split.link_comp]
        self._reserved_on[held.iso.links[on]] = -1
        self._n_reserved_links -= int(np.count_nonzero(on))
        self.net.stats.link_bytes[held.iso.links[on]] += held.iso.link_bytes[on]
        n_rest = int(np.count_nonzero(held.left[split.flow_comp]))
        self.net.slots._n_active -= n_rest
        self._count_done(pid, n_rest)

    def _count_done(self, pid: int, n: int) -> None:
        """``n`` more flows of phase ``pid`` are done; fire its event when none is left."""
        left = self.net._phase_left
        rest = left[pid] - n
        if rest:
            left[pid] = rest
        else:
            self.net.slots._release([], [pid])

    def _unreserve(self, pid: int) -> tuple:
        """Drop phase ``pid``'s (unsplit) reservation: ``(prepared, IsolatedEvolution,
        arrival, timer, its callback)``."""
        held = self._reserved.pop(pid)
        self._reserved_on[held.iso.links] = -1
        self._n_reserved_links -= held.iso.links.shape[0]
        self.net.slots._n_active -= len(held.prep.links)
        return held.prep, held.iso, held.t_arr, held.timer, held.finish

    def _retire(self, pid: int, iso: IsolatedEvolution) -> None:
        """A reserved phase has completed: count its bytes, fire its event."""
        self.net.stats.link_bytes[iso.links] += iso.link_bytes
        self.net.slots._release([], [pid])

    def _detach_event(self, pid: int, held: _Held) -> None:
        """The phase's event is no longer its reservation's timer: a new event, with the
        timer's waiters (the timer keeps only its own callback)."""
        timer, finish = held.timer, held.finish
        if self.net._phase_event[pid] is timer:
            done = self.net._phase_event[pid] = self.net.env.event()
            done.callbacks = [cb for cb in timer.callbacks if cb is not finish]
            timer.callbacks = [finish]

    def _materialise(self, pid: int, links: list | None = None) -> None:
        """Hand a reserved phase to the flow-by-flow path: its unfinished flows enter
        the network with the state its isolated evolution has reached now. With
        ``links`` (reserved by it), a big phase hands over only the components that
        hold them (:meth:`_materialise_part`)."""
        held = self._reserved[pid]
        splittable = self._split and held.prep.by_link is not None and self.net.env.now >= held.t_arr
        if splittable and (held.left is not None or links is not None) and self._materialise_part(pid, held, links):
            return
        prep, iso, t_arr, timer, finish = self._unreserve(pid)
        k = len(prep.links)
        tau = self.net.env.now - t_arr
        if tau >= iso.duration_s:  # due at this very instant
            self._retire(pid, iso)
            return
        self._detach_event(pid, held)
        if tau < 0.0:  # still in its latency: arrive as usual
            self.net.env.timeout(-tau).callbacks.append(partial(self.net._arrive, pid, prep))
            return
        i = bisect.bisect_right(iso.seg_start, tau) - 1
        alive = iso.seg_flows[i]
        if alive.shape[0] < k:  # count the bytes of the flows done
            done = np.ones(k, dtype=bool)
            done[alive] = False
            self._count_bytes(prep, np.flatnonzero(done))
        self.net._phase_left[pid] = alive.shape[0]
        self._enter(pid, prep, iso, i, alive, t_arr)

    def _materialise_part(self, pid: int, held: _Held, links: list | None) -> bool:
        """:meth:`_materialise` of the components of a reserved big phase that hold
        ``links`` (None: all those still reserved); the others stay reserved, their
        timer moved to the last one's finish. False (nothing done) where that is the
        whole phase, never split: it materialises whole."""
        prep, iso, t_arr = held.prep, held.iso, held.t_arr
        split = self._split_of(prep, iso)
        left = held.left if held.left is not None else np.ones(split.n_comp, dtype=bool)
        if links is None:
            take = left
        else:
            take = np.zeros(split.n_comp, dtype=bool)
            take[split.link_comp[np.searchsorted(iso.links, links)]] = True
            take &= left
        rest = left & ~take
        if held.left is None and not rest.any():
            return False
        self.net.stats.split_materialisations += 1
        gone = take[split.link_comp]
        self._reserved_on[iso.links[gone]] = -1
        self._n_reserved_links -= int(np.count_nonzero(gone))
        flows = np.flatnonzero(take[split.flow_comp])
        self.net.slots._n_active -= flows.shape[0]
        self._detach_event(pid, held)
        if rest.any():
            end = float(split.comp_fin[rest].max())
            if end != float(split.comp_fin[left].max()):  # the last one materialised: an earlier timer
                token = self._next_token = self._next_token + 1
                timer = self.net.env.timeout(max(t_arr + end - self.net.env.now, 0.0))
                held.token, held.timer = token, timer
                held.finish = partial(self._finish_reserved, pid, token)
                timer.callbacks.append(held.finish)
            held.left = rest
        else:
            del self._reserved[pid]
        tau = self.net.env.now - t_arr
        i = bisect.bisect_right(iso.seg_start, tau) - 1
        alive = iso.seg_flows[i]
        mine = take[split.flow_comp[alive]]
        alive = alive[mine]
        done = np.setdiff1d(flows, alive, assume_unique=True)
        if done.shape[0]:
            self._count_bytes(prep, done)
        if alive.shape[0] == 0:
            if done.shape[0]:
                self._count_done(pid, done.shape[0])
            return True
        self.net._phase_left[pid] -= done.shape[0]
        self._enter(pid, prep, iso, i, alive, t_arr, mine)
        return True

    def _count_bytes(self, prep: PreparedPhase, rows: np.ndarray) -> None:
        """Add the bytes of a phase's finished flows ``rows`` to the network's link counts."""
        sub = prep.table[rows]
        mask = sub >= 0
        moved = (prep.weights[rows] * prep.sizes[rows])[np.nonzero(mask)[0]]
        if prep.mtable is not None:
            moved = moved * prep.mtable[rows][mask]
        np.add.at(self.net.stats.link_bytes, sub[mask].astype(np.int64), moved)

    def _enter(
        self,
        pid: int,
        prep: PreparedPhase,
        iso: IsolatedEvolution,
        i: int,
        alive: np.ndarray,
        t_arr: float,
        pick: np.ndarray | None = None,
    ) -> None:
        """Flows ``alive`` of a phase (in segment ``i`` of its evolution, at positions
        ``pick`` of that segment's flows; None: all of them) enter the flow arrays with the
        state the evolution gives."""
        k = len(prep.links)
        if alive.shape[0] < k:  # the phase of the flows still running
            al = alive.tolist()
            whole = self.net.slots._flow_ids(prep)
            prep = PreparedPhase(
                len(al),
                int(prep.weights[alive].sum()),
                prep.latency_s,
                [prep.links[j] for j in al],
                prep.sizes[alive],
                prep.weights[alive],
                prep.table[alive],
                None,
                None if prep.mults is None else [prep.mults[j] for j in al],
                None if prep.mtable is None else prep.mtable[alive],
            )
            self.net.slots._flow_ids(prep, whole[alive])
        sl = self.net.slots._insert(pid, prep)
        t0 = t_arr + iso.seg_start[i]
        rem, rate = iso.seg_rem[i], iso.seg_rate[i]
        if pick is not None:
            rem, rate = rem[pick], rate[pick]
        self.net.slots._rem[sl] = rem
        self.net.slots._t0[sl] = t0
        self.net.slots._rate[sl] = rate
        self.net.slots._end[sl] = t0 + rem / rate
