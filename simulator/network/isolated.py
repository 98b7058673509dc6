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

:class:`Reservations` is the part of :class:`~simulator.network.flows.FlowNetwork`
that reserves, completes and materialises such phases.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from functools import partial
from itertools import repeat

import numpy as np
import simpy

from simulator.network.maxmin import DONE_RTOL, fill_arrays
from simulator.network.phases import _PREPARED_MAX, PreparedPhase

#: A phase whose isolated evolution has more distinct completion instants than this
#: is not reserved (its evolution costs more to precompute than the flow-by-flow
#: path, which re-solves only the components that change).
_ISOLATED_MAX_SEGMENTS = 64


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


class Reservations:
    """Reserved (isolated) phases of a :class:`~simulator.network.flows.FlowNetwork` (a part of
    it, held as ``net``: it uses the network's simpy environment, stats, flow slots and phase
    events)."""

    def __init__(self, net) -> None:
        self.net = net  # the flow network: its environment, stats, phases and other half

    def _init_reservations(self, reserve_isolated: bool) -> None:
        self._reserve = bool(reserve_isolated)
        # link -> id of the reserved phase on it (a link holds at most one); a dict, as
        # phases touch a handful of links and membership tests beat numpy's per-call cost
        self._reserved_on: dict[int, int] = {}
        # phase id -> (prepared, IsolatedEvolution, arrival of its flows, token, timer, finish)
        self._reserved: dict[int, tuple] = {}
        self._next_token = 0
        self._isolation_of: dict[int, tuple] = {}  # id(prepared) -> (it, links, list, iso)

    def _free_of_flows(self, link_list: list) -> bool:
        """Whether no flow of the flow-by-flow path is on any of these links."""
        return not any(map(self.net.slots._link_flows.__contains__, link_list))

    def _free_of_reservations(self, link_list: list) -> bool:
        """Whether no reserved phase holds any of these links."""
        return not any(map(self._reserved_on.__contains__, link_list))

    def isolation(self, prep: PreparedPhase) -> tuple:
        """``(distinct links as array, as list, isolated evolution or None)`` of a
        prepared phase, cached."""
        hit = self._isolation_of.get(id(prep))
        if hit is not None and hit[0] is prep:
            return hit[1:]
        iso = isolated_evolution(prep, self.net.capacity)
        if iso is not None:
            links, link_list = iso.links, iso.link_list
        else:
            links = np.unique(prep.table[prep.table >= 0]).astype(np.int64)
            link_list = links.tolist()
        if len(self._isolation_of) >= _PREPARED_MAX:
            self._isolation_of.clear()
        self._isolation_of[id(prep)] = (prep, links, link_list, iso)
        return links, link_list, iso

    def _reserve_phase(
        self, pid: int, prep: PreparedPhase, iso: IsolatedEvolution, latency_s: float = 0.0
    ) -> simpy.Event:
        """Run a phase alone on its links: one timer for its cached evolution. With
        ``latency_s`` the reservation starts now and the flows enter the links (in the
        evolution's terms) that much later."""
        self._reserved_on.update(zip(iso.link_list, repeat(pid)))
        token = self._next_token = self._next_token + 1
        timer = self.net.env.timeout(latency_s + iso.duration_s)
        finish = partial(self._finish_reserved, pid, token)
        timer.callbacks.append(finish)
        self._reserved[pid] = (prep, iso, self.net.env.now + latency_s, token, timer, finish)
        self.net.stats.reserved_phases += 1
        self.net.slots._n_active += len(prep.links)
        if self.net.slots._n_active > self.net.stats.max_concurrent_flows:
            self.net.stats.max_concurrent_flows = self.net.slots._n_active
        return timer

    def _finish_reserved(self, pid: int, token: int, _ev=None) -> None:
        """A reserved phase's timer: it completes, unless it was materialised since
        (and perhaps reserved again, under another token)."""
        entry = self._reserved.get(pid)
        if entry is None or entry[3] != token:
            return
        iso = self._unreserve(pid)[1]
        self._retire(pid, iso)

    def _unreserve(self, pid: int) -> tuple:
        """Drop phase ``pid``'s reservation: ``(prepared, IsolatedEvolution, arrival)``."""
        prep, iso, t_arr, _, timer, finish = self._reserved.pop(pid)
        deque(map(self._reserved_on.__delitem__, iso.link_list), maxlen=0)
        self.net.slots._n_active -= len(prep.links)
        return prep, iso, t_arr, timer, finish

    def _retire(self, pid: int, iso: IsolatedEvolution) -> None:
        """A reserved phase has completed: count its bytes, fire its event."""
        self.net.stats.link_bytes[iso.links] += iso.link_bytes
        self.net.slots._release([], [pid])

    def _materialise(self, pid: int) -> None:
        """Hand a reserved phase to the flow-by-flow path: its unfinished flows enter
        the network with the state its isolated evolution has reached now."""
        prep, iso, t_arr, timer, finish = self._unreserve(pid)
        k = len(prep.links)
        tau = self.net.env.now - t_arr
        if tau >= iso.duration_s:  # due at this very instant
            self._retire(pid, iso)
            return
        if self.net._phase_event[pid] is timer:  # its timer no longer ends it: a new event,
            done = self.net._phase_event[pid] = self.net.env.event()  # with the timer's waiters
            done.callbacks = [cb for cb in timer.callbacks if cb is not finish]
            timer.callbacks = [finish]
        if tau < 0.0:  # still in its latency: arrive as usual
            self.net.env.timeout(-tau).callbacks.append(partial(self.net._arrive, pid, prep))
            return
        i = bisect.bisect_right(iso.seg_start, tau) - 1
        alive = iso.seg_flows[i]
        if alive.shape[0] < k:  # count the bytes of the flows done
            done = np.ones(k, dtype=bool)
            done[alive] = False
            rows = np.flatnonzero(done)
            sub = prep.table[rows]
            mask = sub >= 0
            moved = (prep.weights[rows] * prep.sizes[rows])[np.nonzero(mask)[0]]
            if prep.mtable is not None:
                moved = moved * prep.mtable[rows][mask]
            np.add.at(self.net.stats.link_bytes, sub[mask].astype(np.int64), moved)
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
        self.net._phase_left[pid] = alive.shape[0]
        sl = self.net.slots._insert(pid, prep)
        t0 = t_arr + iso.seg_start[i]
        rem, rate = iso.seg_rem[i], iso.seg_rate[i]
        self.net.slots._rem[sl] = rem
        self.net.slots._t0[sl] = t0
        self.net.slots._rate[sl] = rate
        self.net.slots._end[sl] = t0 + rem / rate
