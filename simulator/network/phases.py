"""Phase preparation: a phase's transfers validated, merged and routed once (no simpy).

A :class:`Transfer` of ``weight`` w stands for w identical parallel transfers on the
same path (the twins of a symmetric collective); identical transfers (same ``src``,
``dst``, ``size_bytes``, ``incidence``) of one phase are merged into one flow of
summed weight. A flow loads its links w times.

Multiplicities: a transfer may carry an ``incidence`` ``((link, m), ...)`` instead of
its route: it then loads link l ``w * m`` times its rate and ``link_bytes`` counts
``w * m * size`` there. The engine uses it for the symmetry quotient of twin traffic
(one flow standing for itself and its twin images).

:class:`PhasePreparer` routes device pairs (cached) and turns a phase into a
:class:`PreparedPhase` (cached by identity for tuples: the collective planner hands
the same tuple for every repetition of a phase).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from simulator.errors import NetworkError

if TYPE_CHECKING:  # pragma: no cover
    from topologies.topology import Topology

#: Phases (transfers) and completions (flows) up to this size are handled one flow
#: at a time; bigger ones are validated, merged, indexed and removed vectorised.
_SMALL_BATCH = 64
#: Prepared (validated, merged, routed) phases cached per network.
_PREPARED_MAX = 4096
#: At most this many pairs, :meth:`FlowNetwork.routes` routes them one by one (cached).
_FEW_ROUTES = 64

_INF = float("inf")


@dataclass(frozen=True)
class Transfer:
    """``size_bytes`` from device ``src`` to device ``dst``.

    ``weight`` = that many identical parallel transfers on the same path (bundled
    into one flow; each of them carries ``size_bytes``).

    ``incidence`` (optional) replaces the route as the set of links the flow loads:
    ``((link, multiplicity), ...)`` with distinct links and multiplicities > 0. The
    flow then uses ``weight * multiplicity`` times its rate on each listed link and
    nothing elsewhere (a *quotient* flow standing for itself and its twin images,
    see :mod:`simulator.engine.loop`); latency still comes from the ``src -> dst``
    route. ``None`` (default): the route, each link once.
    """

    src: int
    dst: int
    size_bytes: float
    weight: int = 1
    incidence: tuple[tuple[int, float], ...] | None = None


def _own_components(owner: np.ndarray, link: np.ndarray, n_flows: int):
    """Link-sharing components of one phase's flows: ``([index arrays of components
    of two or more flows, by first flow], index array of flows alone)``, indices in
    increasing order."""
    used, local = np.unique(link, return_inverse=True)
    n_nodes = n_flows + used.shape[0]
    graph = sp.coo_matrix((np.ones(owner.shape[0]), (owner, n_flows + local.reshape(-1))), shape=(n_nodes, n_nodes))
    _, labels = connected_components(graph, directed=False)
    labels = labels[:n_flows]
    shared = np.bincount(labels)[labels] > 1
    single = np.flatnonzero(~shared)
    flows = np.flatnonzero(shared)
    order = flows[np.argsort(labels[flows], kind="stable")]  # by label, then flow index
    bounds = np.flatnonzero(np.diff(labels[order])) + 1
    comps = sorted(np.split(order, bounds) if order.size else [], key=lambda p: int(p[0]))
    return comps, single


@dataclass(frozen=True)
class PreparedPhase:
    """A phase validated, merged and routed: one entry per flow (merged transfer)."""

    n_transfers: int  # network transfers before merging
    units: int  # sum of weights
    latency_s: float  # largest path latency + largest overhead
    links: list  # per flow: tuple of link ids
    sizes: np.ndarray  # per flow: bytes
    weights: np.ndarray  # per flow: weight
    table: np.ndarray  # per flow: link ids padded with -1 (flows x hops)
    by_link: tuple | None  # big phases: (flows sorted by link, [(link, a, b)],
    #                                      (its own components, its flows alone))
    mults: list | None = None  # per flow: multiplicities aligned with links, or
    #                                      None (each link once); None: no flow has any
    mtable: np.ndarray | None = None  # the same padded with 1.0, like ``table``


class PhasePreparer:
    """Routes and prepared phases of one topology (both cached).

    ``link_latency`` and ``link_overhead`` (s, per link) give a phase's latency:
    its largest path latency plus its largest per-link overhead.
    """

    def __init__(self, topo: Topology, link_latency: np.ndarray, link_overhead: np.ndarray) -> None:
        self.topo = topo
        self.n_links = link_latency.shape[0]
        self.link_latency = link_latency
        self.link_overhead = link_overhead
        self._lat = link_latency.tolist()
        self._ovh = link_overhead.tolist()
        self._routes: dict[tuple[int, int], tuple[tuple[int, ...], float, float]] = {}
        self._prepared: dict[int, tuple] = {}  # id(transfers tuple) -> (it, PreparedPhase)

    def routes(self, src, dst) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised :meth:`route`: ``(links, latency_s)`` of every ``src[i] ->
        dst[i]``, ``links`` an ``(n, hops)`` array padded with -1
        (:meth:`Topology.routes`) and ``latency_s`` each pair's path latency plus its
        largest per-link overhead (0 where ``src == dst``), summed link by link in
        route order as :meth:`route` does, so the two agree exactly. Few pairs go
        through :meth:`route` (cached); many are routed at once and not cached."""
        src, dst = np.asarray(src, dtype=np.int64).ravel(), np.asarray(dst, dtype=np.int64).ravel()
        if src.shape[0] <= _FEW_ROUTES:
            found = [self.route(s, d) if s != d else ((), 0.0, 0.0) for s, d in zip(src.tolist(), dst.tolist())]
            links = np.full((len(found), max((len(r[0]) for r in found), default=1) or 1), -1, dtype=np.int64)
            for i, (lk, _, _) in enumerate(found):
                links[i, : len(lk)] = lk
            return links, np.array([la + ov for _, la, ov in found], dtype=float)
        links = self.topo.routes(src, dst)
        on = links >= 0
        at = np.where(on, links, 0)
        lat = np.zeros(links.shape[0])
        ovh = np.zeros(links.shape[0])
        for h in range(links.shape[1]):
            lat = lat + np.where(on[:, h], self.link_latency[at[:, h]], 0.0)
            ovh = np.maximum(ovh, np.where(on[:, h], self.link_overhead[at[:, h]], 0.0))
        return links, lat + ovh

    def route(self, s: int, d: int) -> tuple[tuple[int, ...], float, float]:
        """(links, path latency, largest per-step overhead) of ``s -> d``, cached."""
        key = (s, d)
        info = self._routes.get(key)
        if info is None:
            links = tuple(self.topo.route(s, d))
            assert len(set(links)) == len(links), f"route {s}->{d} repeats a link: {links}"
            lat = sum(map(self._lat.__getitem__, links))
            ovh = max(map(self._ovh.__getitem__, links), default=0.0)
            info = self._routes[key] = (links, lat, ovh)
        return info

    def _check_incidence(self, t: Transfer) -> None:
        inc = t.incidence
        if inc is None:
            return
        try:
            links = [int(lk) for lk, _ in inc]
            ok = (
                bool(links)
                and all(0 <= lk < self.n_links for lk in links)
                and len(set(links)) == len(links)
                and all(0 < m < _INF for _, m in inc)
            )
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise NetworkError(
                f"transfer {t}: incidence must be ((link, multiplicity), ...) with "
                f"distinct links in [0, {self.n_links}) and multiplicities > 0"
            )

    def _merged(self, transfers: Sequence[Transfer]):
        """Validated network transfers of a phase, identical ones merged.

        Returns ``(n_transfers, {(src, dst, size, incidence): weight})`` (insertion
        order = first appearance)."""
        n_dev = self.topo.n_devices
        merged: dict[tuple, float] = {}
        n = 0
        checked: set = set()
        for t in transfers:
            size, weight, s, d = t.size_bytes, t.weight, t.src, t.dst
            inc = t.incidence
            if inc is not None and id(inc) not in checked:
                self._check_incidence(t)
                checked.add(id(inc))
            if not (0 <= size < _INF):
                raise NetworkError(f"transfer {t}: size_bytes must be finite and >= 0")
            if not (weight >= 1 and weight == int(weight)):
                raise NetworkError(f"transfer {t}: weight must be an integer >= 1")
            if not (0 <= s < n_dev and 0 <= d < n_dev):
                raise NetworkError(f"transfer {t}: devices must be in [0, {n_dev})")
            if s == d or size == 0:
                continue
            n += 1
            key = (int(s), int(d), float(size), inc)
            merged[key] = merged.get(key, 0.0) + float(weight)
        return n, merged

    def _merged_arrays(self, transfers: Sequence[Transfer]):
        """Vectorised :meth:`_merged` for big phases: ``(n_transfers, src, dst, size,
        weight)`` lists of the merged flows, in order of first appearance."""
        n = len(transfers)
        src = np.fromiter((t.src for t in transfers), dtype=np.int64, count=n)
        dst = np.fromiter((t.dst for t in transfers), dtype=np.int64, count=n)
        size = np.fromiter((t.size_bytes for t in transfers), dtype=float, count=n)
        weight = np.fromiter((t.weight for t in transfers), dtype=float, count=n)
        n_dev = self.topo.n_devices
        for bad, what in (
            (~((size >= 0) & (size < _INF)), "size_bytes must be finite and >= 0"),
            (~((weight >= 1) & (weight == np.floor(weight))), "weight must be an integer >= 1"),
            ((src < 0) | (src >= n_dev) | (dst < 0) | (dst >= n_dev), f"devices must be in [0, {n_dev})"),
        ):
            if bad.any():
                raise NetworkError(f"transfer {transfers[int(np.argmax(bad))]}: {what}")
        keep = (src != dst) & (size > 0)
        src, dst, size, weight = src[keep], dst[keep], size[keep], weight[keep]
        n_net = int(src.shape[0])
        order = np.lexsort((size, dst, src))
        key_s, key_d, key_b = src[order], dst[order], size[order]
        new = np.ones(n_net, dtype=bool)
        new[1:] = (key_s[1:] != key_s[:-1]) | (key_d[1:] != key_d[:-1]) | (key_b[1:] != key_b[:-1])
        if new.all():  # nothing to merge
            return n_net, src.tolist(), dst.tolist(), size.tolist(), weight.tolist()
        group = np.cumsum(new) - 1
        first = np.full(int(group[-1]) + 1, n_net, dtype=np.int64)
        np.minimum.at(first, group, order)
        wsum = np.bincount(group, weight[order])
        by_first = np.argsort(first, kind="stable")
        idx = first[by_first]
        return (n_net, src[idx].tolist(), dst[idx].tolist(), size[idx].tolist(), wsum[by_first].tolist())

    def prepare(self, transfers: Sequence[Transfer]) -> PreparedPhase | None:
        """Validated, merged and routed form of a phase (None: nothing to send).

        Cached by identity for tuples (immutable; the collective planner hands the
        same tuple for every repetition of a phase)."""
        cacheable = type(transfers) is tuple
        if cacheable:
            hit = self._prepared.get(id(transfers))
            if hit is not None and hit[0] is transfers:
                return hit[1]
        prep = None
        with_inc = any(t.incidence is not None for t in transfers)
        if len(transfers) <= _SMALL_BATCH or with_inc:
            n, merged = self._merged(transfers)
            if merged:
                links, sizes, weights = [], [], []
                mults: list | None = [] if with_inc else None
                lat = ovh = 0.0
                for (s, d, size, inc), w in merged.items():
                    lk, la, ov = self.route(s, d)
                    if la > lat:
                        lat = la
                    if ov > ovh:
                        ovh = ov
                    if inc is not None:
                        lk = tuple(int(x) for x, _ in inc)
                        mults.append(tuple(float(m) for _, m in inc))  # pyright: ignore[reportOptionalMemberAccess]  (with_inc)
                    elif mults is not None:
                        mults.append(None)
                    links.append(lk)
                    sizes.append(size)
                    weights.append(w)
                prep = self._prepared_from(n, links, sizes, weights, lat + ovh, mults, len(transfers) > _SMALL_BATCH)
        else:
            n, src, dst, sizes, weights = self._merged_arrays(transfers)
            if sizes:
                route = self.topo.route
                links = list(map(route, src, dst))
                lens = np.fromiter(map(len, links), dtype=np.int64, count=len(links))
                flat = np.fromiter(itertools.chain.from_iterable(links), dtype=np.int64, count=int(lens.sum()))
                starts = np.cumsum(lens) - lens
                lat = float(np.add.reduceat(self.link_latency[flat], starts).max())
                ovh = float(self.link_overhead[flat].max())
                prep = self._prepared_from(n, links, sizes, weights, lat + ovh, None, True)
        if cacheable:
            if len(self._prepared) >= _PREPARED_MAX:
                self._prepared.clear()
            self._prepared[id(transfers)] = (transfers, prep)
        return prep

    def _prepared_from(
        self, n: int, links: list, sizes: list, weights: list, latency: float, mults: list | None, big: bool
    ) -> PreparedPhase:
        """The :class:`PreparedPhase` of merged flows (``links`` per flow, distinct links);
        ``big`` phases also get their per-link index and own components."""
        k = len(links)
        lens = np.fromiter(map(len, links), dtype=np.int64, count=k)
        width = int(lens.max())
        if not big:
            table = np.full((k, width), -1, dtype=np.int32)
            for i, lk in enumerate(links):
                table[i, : len(lk)] = lk
            by_link = None
        else:
            flat = np.fromiter(itertools.chain.from_iterable(links), dtype=np.int64, count=int(lens.sum()))
            starts = np.cumsum(lens) - lens
            owner = np.repeat(np.arange(k), lens)
            table = np.full((k, width), -1, dtype=np.int32)
            table[owner, np.arange(flat.shape[0]) - np.repeat(starts, lens)] = flat
            srt = np.sort(table, axis=1)
            assert not ((srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)).any(), "a route repeats a link"
            order = np.argsort(flat, kind="stable")
            flat, owner = flat[order], owner[order]
            bounds = np.r_[0, np.flatnonzero(np.diff(flat)) + 1, flat.shape[0]].tolist()
            keys = flat[bounds[:-1]].tolist()
            groups = list(zip(keys, bounds[:-1], bounds[1:]))
            by_link = (owner, groups, _own_components(owner, flat, k))
        mtable = None
        if mults is not None:
            mtable = np.ones((k, width))
            for i, m in enumerate(mults):
                if m is not None:
                    mtable[i, : len(m)] = m
        return PreparedPhase(
            n,
            int(sum(weights)),
            latency,
            links,
            np.array(sizes, dtype=float),
            np.array(weights, dtype=float),
            table,
            by_link,
            mults,
            mtable,
        )


def distinct_links(cache: dict, prep: PreparedPhase) -> list[int]:
    """The distinct links of a prepared phase's flows, kept in ``cache`` (by the phase's id,
    at most ``_PREPARED_MAX`` phases)."""
    hit = cache.get(id(prep))
    if hit is not None and hit[0] is prep:
        return hit[1]
    table = prep.table
    out = np.unique(table[table >= 0]).tolist()
    if len(cache) >= _PREPARED_MAX:
        cache.clear()
    cache[id(prep)] = (prep, out)
    return out
