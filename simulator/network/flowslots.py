"""The in-flight flows of a :class:`~simulator.network.flows.FlowNetwork`, in slots.

Flows live in slots of numpy arrays (grown by doubling, reused through a free
list); their routes also as tuples, for the link -> flows index and the small
solver. :class:`FlowSlots` (a part of the network, held as its ``slots``) inserts a prepared phase's
flows, removes completed ones (counting their bytes on each link) and fires the
events of the phases that finish.
"""

from __future__ import annotations

import itertools
from collections import deque

import numpy as np

from simulator.network.components import beyond_search
from simulator.network.phases import _PREPARED_MAX, _SMALL_BATCH, PreparedPhase
from simulator.network.runahead import _IN_CHAIN

#: Updates touching at most this many flows use scalar (not vectorised) state access.
_SCALAR_MAX = 4

_INF = float("inf")


class FlowSlots:
    """Slot storage of in-flight flows (a part of a :class:`~simulator.network.flows.FlowNetwork`,
    held as ``net``)."""

    def __init__(self, net) -> None:
        self.net = net  # the flow network: its environment, stats, phases and other half

    def _init_slots(self) -> None:
        self._links: list[tuple[int, ...]] = []  # per slot ever used
        self._mults: list = []  # per slot: multiplicities aligned with _links, or None
        self._any_mult = False  # whether any flow with multiplicities was seen
        self._cap_slots = 0
        self._w = np.zeros(0)
        self._size = np.zeros(0)
        self._rem = np.zeros(0)  # bytes left at time _t0
        self._t0 = np.zeros(0)
        self._rate = np.zeros(0)  # per unit flow; 0 until first solved
        self._end = np.zeros(0)  # completion time at the current rate
        self._seq = np.zeros(0, dtype=np.int64)  # arrival order: canonical order
        self._batch = np.zeros(0, dtype=np.int64)  # component solved in; -1 free
        self._pid = np.zeros(0, dtype=np.int64)
        self._fid = np.zeros(0, dtype=np.int64)  # flow identity (:meth:`_flow_ids`)
        self._tab = np.full((0, 1), -1, dtype=np.int32)  # links, padded with -1
        self._mtab = np.ones((0, 1))  # their multiplicities, padded with 1 (once _any_mult)
        self._free: list[int] = []
        self._n_active = 0
        self._next_seq = 0
        self._link_flows: dict[int, set[int]] = {}  # link -> active slots on it
        self._pending: list[tuple] = []  # big phases' (prep, slots, sl) not yet in the index
        self._fid_of: dict[tuple, int] = {}  # (links, weight, multiplicities) -> flow identity
        self._fids: dict[int, tuple] = {}  # id(prepared phase) -> (it, its flows' identities)
        self._groups_of: dict[int, tuple] = {}  # id(prepared phase) -> (it, :meth:`_link_groups`)

    def _grow(self, need: int, width: int) -> None:
        """Room for ``need`` slots and routes of ``width`` hops."""
        cap = self._cap_slots
        if need > cap:
            cap = max(need, 2 * cap, 64)
            for name in ("_w", "_size", "_rem", "_t0", "_rate", "_end", "_seq", "_batch", "_pid", "_fid"):
                old = getattr(self, name)
                arr = np.zeros(cap, dtype=old.dtype)
                arr[: old.shape[0]] = old
                setattr(self, name, arr)
            self._batch[self._cap_slots :] = -1
            self._cap_slots = cap
        tab = self._tab
        if tab.shape[0] < cap or tab.shape[1] < width:
            new = np.full((cap, max(width, tab.shape[1])), -1, dtype=np.int32)
            new[: tab.shape[0], : tab.shape[1]] = tab
            self._tab = new
            if self._any_mult:
                mt = self._mtab
                newm = np.ones(new.shape)
                newm[: mt.shape[0], : mt.shape[1]] = mt
                self._mtab = newm

    def table(self, now: float) -> list[tuple[tuple[int, ...], float, float, float]]:
        """``(links, weight, rate per unit flow, bytes left at now)`` of every flow in its slot,
        in arrival order (:meth:`~simulator.network.flows.FlowNetwork.flow_table`)."""
        hw = len(self._links)
        live = np.flatnonzero(self._batch[:hw] != -1)
        live = live[np.argsort(self._seq[live], kind="stable")]
        out = []
        for s in live.tolist():
            r = float(self._rate[s])
            left = float(self._rem[s] - r * (now - self._t0[s])) if r > 0.0 else float(self._rem[s])
            out.append((self._links[s], float(self._w[s]), r, max(left, 0.0)))
        return out

    def _insert(self, pid: int, prep: PreparedPhase) -> np.ndarray:
        """A phase's flows enter the flow arrays (rate to be solved); returns their
        slots."""
        k = len(prep.links)
        if prep.mults is not None and not self._any_mult:
            self._any_mult = True
            self._mtab = np.ones(self._tab.shape)
        slots = self._take_slots(prep)
        self._grow(len(self._links), prep.table.shape[1])
        sl = np.array(slots, dtype=np.int64)
        self._write_rows(pid, prep, slots, sl)
        if prep.by_link is not None and self.net.ahead._enabled and beyond_search(prep):
            self._pending.append((prep, slots, sl))  # maybe a chain at the update: never indexed
        else:
            self._index_links(prep, slots, sl)
        self.net._new_phases.append((prep, sl))
        self._n_active += k
        if self._n_active > self.net.stats.max_concurrent_flows:
            self.net.stats.max_concurrent_flows = self._n_active
        self.net._request_update()
        return sl

    def _take_slots(self, prep: PreparedPhase) -> list[int]:
        """Slots for a phase's flows, free ones first (last freed first), with their
        routes and multiplicities recorded."""
        links = prep.links
        k = len(links)
        free = self._free
        reuse = min(k, len(free))
        pm = prep.mults
        if reuse:
            slots = free[len(free) - reuse :]
            del free[len(free) - reuse :]
            slots.reverse()
            deque(map(self._links.__setitem__, slots, links), maxlen=0)
            if self._any_mult:
                deque(map(self._mults.__setitem__, slots, itertools.repeat(None) if pm is None else pm), maxlen=0)
        else:
            slots = []
        if reuse < k:
            hw = len(self._links)
            slots.extend(range(hw, hw + k - reuse))
            self._links.extend(links[reuse:])
            self._mults.extend(itertools.repeat(None, k - reuse) if pm is None else pm[reuse:])
        return slots

    def _write_rows(self, pid: int, prep: PreparedPhase, slots: list[int], sl: np.ndarray) -> None:
        """The flows' state at arrival (whole size left, no rate yet) and their link
        tables, in ``slots`` (a list) / ``sl`` (the same as an array)."""
        now = self.net.env.now
        k = len(slots)
        if k <= 2:  # scalar twin of the branch below (same values)
            w, size, rem, t0, rate = self._w, self._size, self._rem, self._t0, self._rate
            end, seq, batch, pids = self._end, self._seq, self._batch, self._pid
            q = self._next_seq
            for s, ws, bs in zip(slots, prep.weights.tolist(), prep.sizes.tolist()):
                w[s] = ws
                size[s] = rem[s] = bs
                t0[s] = now
                rate[s] = 0.0
                end[s] = _INF
                seq[s] = q
                q += 1
                batch[s] = -2
                pids[s] = pid
        else:
            self._w[sl] = prep.weights
            self._size[sl] = prep.sizes
            self._rem[sl] = prep.sizes
            self._t0[sl] = now
            self._rate[sl] = 0.0
            self._end[sl] = _INF
            self._seq[sl] = np.arange(self._next_seq, self._next_seq + k)
            self._batch[sl] = -2
            self._pid[sl] = pid
        self._fid[sl] = self._flow_ids(prep)
        self._next_seq += k
        width = prep.table.shape[1]
        self._tab[sl, :width] = prep.table
        if width < self._tab.shape[1]:
            self._tab[sl, width:] = -1
        if self._any_mult:
            if prep.mtable is None:
                self._mtab[sl] = 1.0
            else:
                self._mtab[sl, :width] = prep.mtable
                if width < self._mtab.shape[1]:
                    self._mtab[sl, width:] = 1.0

    def _flow_ids(self, prep: PreparedPhase, ids=None) -> np.ndarray:
        """The identity of each flow of ``prep``: one integer per distinct (links, weight,
        multiplicities), the whole input of the rate solvers for that flow, so two
        component states with the same identities in the same order have the same max-min
        rates (:mod:`simulator.network.ratememo`). Cached per prepared phase; ``ids`` gives
        them (a materialised phase's, taken from its whole phase's)."""
        hit = self._fids.get(id(prep))
        if hit is not None and hit[0] is prep:
            return hit[1]
        if ids is None:
            of = self._fid_of
            mults = prep.mults if prep.mults is not None else itertools.repeat(None)
            ids = np.fromiter(
                (of.setdefault(key, len(of)) for key in zip(prep.links, prep.weights.tolist(), mults)),
                dtype=np.int64,
                count=len(prep.links),
            )
        if len(self._fids) >= _PREPARED_MAX:
            self._fids.clear()
        self._fids[id(prep)] = (prep, ids)
        return ids

    def _flush(self) -> None:
        """The flows of the big phases held back from the link index (:meth:`_insert`) enter
        it, but for those that run ahead in a chain since (:mod:`simulator.network.runahead`).
        Whatever reads the index calls this first."""
        pending, self._pending = self._pending, []
        for prep, slots, sl in pending:
            free = self._batch[sl] != _IN_CHAIN
            if free.all():
                self._index_links(prep, slots, sl)
                continue
            lf = self._link_flows
            for s in sl[free].tolist():
                for lk in self._links[s]:
                    lf.setdefault(lk, set()).add(s)

    def _alone(self, prep: PreparedPhase) -> bool:
        """Whether big phase ``prep``, just inserted, is alone on every one of its links: held
        back from the index (the only phase held back), no indexed flow on them; else each
        link's flows are the phase's own."""
        assert prep.by_link is not None
        lf = self._link_flows
        if self._pending:
            return (
                len(self._pending) == 1
                and self._pending[0][0] is prep
                and lf.keys().isdisjoint(lk for lk, _, _ in prep.by_link[1])
            )
        return all(len(lf[lk]) == b - a for lk, a, b in prep.by_link[1])

    def _flushed(self) -> dict[int, set[int]]:
        """The link -> flows index, with every phase held back in it (:meth:`_flush`)."""
        self._flush()
        return self._link_flows

    def _index_links(self, prep: PreparedPhase, slots: list[int], sl: np.ndarray) -> None:
        """Add the flows in ``slots`` to the link -> flows index."""
        lf = self._link_flows
        if prep.by_link is None:
            for s, lks in zip(slots, prep.links):
                for lk in lks:
                    fl = lf.get(lk)
                    if fl is None:
                        lf[lk] = {s}
                    else:
                        fl.add(s)
        else:
            owner, groups, _ = prep.by_link
            lone_links, lone_at, shared = self._link_groups(prep)
            # links one flow of the phase crosses (most of a big phase's), not yet in the
            # index: one set each, made without a Python loop
            there = np.fromiter(map(lf.__contains__, lone_links), dtype=bool, count=len(lone_links))
            mine = sl[owner[lone_at]]
            if there.any():
                fresh = ~there
                for lk, s in zip(np.asarray(lone_links)[there].tolist(), mine[there].tolist()):
                    lf[lk].add(s)
                lf.update(zip(np.asarray(lone_links)[fresh].tolist(), map(set, zip(mine[fresh].tolist()))))
            else:
                lf.update(zip(lone_links, map(set, zip(mine.tolist()))))
            if shared:
                members = sl[owner].tolist()
                for lk, a, b in shared:
                    fl = lf.get(lk)
                    if fl is None:
                        lf[lk] = set(members[a:b])
                    else:
                        fl.update(members[a:b])

    def _link_groups(self, prep: PreparedPhase) -> tuple[list[int], np.ndarray, list]:
        """A big phase's per-link groups (``prep.by_link``) split into the links one of its
        flows crosses (the links, and each one's position in the flows sorted by link) and
        the groups ``(link, a, b)`` of links several of its flows share; cached per phase."""
        hit = self._groups_of.get(id(prep))
        if hit is not None and hit[0] is prep:
            return hit[1]
        assert prep.by_link is not None
        groups = prep.by_link[1]
        lone = [(lk, a) for lk, a, b in groups if b - a == 1]
        out = (
            [lk for lk, _ in lone],
            np.array([a for _, a in lone], dtype=np.int64),
            [g for g in groups if g[2] - g[1] > 1],
        )
        if len(self._groups_of) >= _PREPARED_MAX:
            self._groups_of.clear()
        self._groups_of[id(prep)] = (prep, out)
        return out

    def _complete(self, done: np.ndarray) -> None:
        """Remove finished flows, count their bytes, fire finished phases."""
        if len(done) <= _SCALAR_MAX:
            self._complete_scalar(done if isinstance(done, list) else done.tolist())
            return
        dl = done.tolist()
        moved = self._w[done] * self._size[done]
        if len(dl) <= _SMALL_BATCH:
            at: list[int] = []
            amounts: list[float] = []
            for s, m in zip(dl, moved.tolist()):
                self._detach(s, m, at, amounts)
            np.add.at(self.net.stats.link_bytes, at, amounts)  # in order: the same sums
        else:
            lf, dirty, link_bytes = self._link_flows, self.net._dirty, self.net.stats.link_bytes
            sub = self._tab[done]
            mask = sub >= 0
            flat = sub[mask].astype(np.int64)
            rows = np.nonzero(mask)[0]
            if not self._any_mult:
                np.add.at(link_bytes, flat, moved[rows])
            else:
                np.add.at(link_bytes, flat, moved[rows] * self._mtab[done][mask])
            order = np.argsort(flat, kind="stable")
            flat, owner = flat[order], done[rows[order]]
            bounds = np.r_[0, np.flatnonzero(np.diff(flat)) + 1, flat.shape[0]]
            starts = bounds[:-1]
            lks = flat[starts]
            # A link all of whose flows complete now (most of them: a big phase's flows
            # share links with few others and finish together) leaves the index whole;
            # only the links that keep flows are updated flow by flow (and are dirty).
            on = np.fromiter(map(len, map(lf.__getitem__, lks.tolist())), dtype=np.int64, count=lks.shape[0])
            emptied = on == np.diff(bounds)
            deque(map(lf.__delitem__, lks[emptied].tolist()), maxlen=0)
            keep = np.flatnonzero(~emptied)
            if keep.shape[0]:
                owners = owner.tolist()
                bl = bounds.tolist()
                for i, lk in zip(keep.tolist(), lks[keep].tolist()):
                    fl = lf[lk]
                    fl.difference_update(owners[bl[i] : bl[i + 1]])
                    if fl:
                        dirty.append(lk)
                    else:  # a route crossing the link twice counted it twice
                        del lf[lk]
        self._batch[done] = -1
        left = self.net._phase_left
        finished = []
        if len(dl) <= _SMALL_BATCH:
            for p in self._pid[done].tolist():
                n = left[p] - 1
                if n:
                    left[p] = n
                else:
                    finished.append(p)
        else:
            pids, counts = np.unique(self._pid[done], return_counts=True)
            for p, c in zip(pids.tolist(), counts.tolist()):
                n = left[p] - c
                if n:
                    left[p] = n
                else:
                    finished.append(p)
        self._release(dl, finished)

    def _detach(self, s: int, moved: float, at: list, amounts: list) -> None:
        """Take flow slot ``s`` off the link index (links it shared become dirty: their
        other flows are re-solved) and list its ``moved`` bytes for each of its links
        (times the link's multiplicity) in ``at`` / ``amounts``, for the caller to add to
        ``stats.link_bytes`` in that order."""
        lf, dirty = self._link_flows, self.net._dirty
        links = self._links[s]
        for lk in links:
            fl = lf[lk]
            fl.discard(s)
            if fl:
                dirty.append(lk)
            else:
                del lf[lk]
        at.extend(links)
        ms = self._mults[s] if self._any_mult else None
        if ms is None:
            amounts.extend(itertools.repeat(moved, len(links)))
        else:
            amounts.extend([moved * m for m in ms])

    def _complete_scalar(self, done: list[int]) -> None:
        """:meth:`_complete` for a handful of flows."""
        w, size, batch, pids = self._w, self._size, self._batch, self._pid
        left = self.net._phase_left
        finished = []
        at: list[int] = []
        amounts: list[float] = []
        for s in done:
            self._detach(s, w.item(s) * size.item(s), at, amounts)
            batch[s] = -1
            p = pids.item(s)
            n = left[p] - 1
            if n:
                left[p] = n
            else:
                finished.append(p)
        np.add.at(self.net.stats.link_bytes, at, amounts)  # in order: the same sums
        self._release(done, finished)

    def _release(self, slots, finished: list[int]) -> None:
        """Return completed flows' slots to the free list and fire the events of the
        phases that ``finished`` (in phase order, for determinism)."""
        self._free.extend(reversed(slots))
        self._n_active -= len(slots)
        left = self.net._phase_left
        for p in sorted(finished):
            del left[p]
            ev = self.net._phase_event.pop(p)
            if not ev.triggered:  # a reservation's timer fires by itself
                ev.succeed()
