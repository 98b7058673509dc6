"""Max-min solutions remembered by the identities of the flows solved (no simpy).

The rates of a set of link-sharing components are a pure function of their flows'
routes, weights and multiplicities, in the order they are solved, and of the link
capacities (fixed per network). A flow's *identity*
(:meth:`~simulator.network.flowslots.FlowSlots._flow_ids`) is one integer per
distinct (links, weight, multiplicities), so the identities of a component's flows,
in order, key its rates exactly: the same key gives the same bits as solving again.

A step repeats its collectives layer after layer and micro-batch after micro-batch,
and a large phase (an expert all-to-all over a torus, thousands of flows) sharing
links with another passes through the same sequence of flow sets each time: every
completion leaves the survivors of the component just solved, and they split into
the same components with the same rates as the last time the same flows survived.
:class:`RateMemo` keeps both: the rates of a solve (:meth:`rates`) and, for an update
caused only by completions in one component, its survivors' split into components
with their rates (:meth:`split`), which also spares the search for the components.
"""

from __future__ import annotations

import numpy as np

#: Solutions remembered per network (each holds one float per flow solved); the memo
#: starts again when full.
RATE_MEMO_MAX = 4096
#: Component searches remembered per network (each keyed by every active flow's identity).
COMPONENT_MEMO_MAX = 1024
#: Components smaller than this (in flows) are not remembered here: the small solver
#: (``FlowNetwork._fill_memo``) remembers them, and a key costs more than a solve.
MEMO_MIN_FLOWS = 256


class RateMemo:
    """Rates and splits of solved flow sets, keyed by their flows' identities."""

    def __init__(self, capacity: int = RATE_MEMO_MAX) -> None:
        self._max = capacity
        self._rates: dict[tuple, np.ndarray] = {}
        self._splits: dict[bytes, tuple] = {}
        self._components: dict[tuple, tuple] = {}
        self.hits = 0
        self.misses = 0
        self.component_hits = 0

    def _room(self, table: dict) -> None:
        if len(table) >= self._max:
            table.clear()

    def rates(self, fids: np.ndarray, lens: tuple) -> np.ndarray | None:
        """The rates solved for components of flows ``fids`` (back to back, sizes
        ``lens``), or None."""
        hit = self._rates.get((fids.tobytes(), lens))
        if hit is None:
            self.misses += 1
        else:
            self.hits += 1
        return hit

    def keep_rates(self, fids: np.ndarray, lens: tuple, rates: np.ndarray) -> None:
        self._room(self._rates)
        self._rates[(fids.tobytes(), lens)] = rates

    def split(self, fids: np.ndarray) -> tuple | None:
        """``(positions, lens, n_singles, rates)`` remembered for survivors ``fids``
        (in arrival order): the survivors' positions component by component (components
        of two or more flows, sizes ``lens``, then the ``n_singles`` lone flows) and the
        rates in that order; or None."""
        hit = self._splits.get(fids.tobytes())
        if hit is None:
            self.misses += 1
        else:
            self.hits += 1
        return hit

    def keep_split(
        self, fids: np.ndarray, rest_seq: np.ndarray, comps: list, singles: list, seq: np.ndarray, rates
    ) -> None:
        """Remember the split of survivors (identities ``fids``, arrival numbers
        ``rest_seq``, increasing) into ``comps`` and ``singles`` (slots, arrival numbers
        ``seq[slot]``) and their ``rates``; nothing where a slot is not a survivor."""
        if rates is None:
            return
        flat = np.fromiter((s for c in comps for s in c), dtype=np.int64, count=sum(map(len, comps)))
        flat = np.concatenate([flat, np.asarray(singles, dtype=np.int64)])
        pos = np.searchsorted(rest_seq, seq[flat])
        if pos.shape[0] != rates.shape[0] or pos.shape[0] != rest_seq.shape[0] or (pos >= rest_seq.shape[0]).any():
            return
        if (rest_seq[pos] != seq[flat]).any():
            return
        self._room(self._splits)
        self._splits[fids.tobytes()] = (pos, tuple(len(c) for c in comps), len(singles), rates)

    def components(self, key: tuple) -> tuple | None:
        """``(positions of each component, positions of the lone flows)`` remembered for the
        search keyed ``key``: the identities of every active flow in arrival order and the
        seed links (:func:`~simulator.network.components.remembered_components`),
        positions into that order; or None."""
        hit = self._components.get(key)
        if hit is not None:
            self.component_hits += 1
        return hit

    def keep_components(self, key: tuple, comps: list, singles: np.ndarray) -> None:
        if len(self._components) >= COMPONENT_MEMO_MAX:
            self._components.clear()
        self._components[key] = (comps, singles)
