"""Link-sharing components of a flow network's active flows, found on arrays.

:class:`simulator.network.flows.FlowNetwork` re-solves, at each instant where flows
arrive or complete, the components of flows that share links with the changed ones.
It finds them by a breadth-first search over its ``link -> flows`` sets, which is quick
for the usual small components but costs Python set operations per flow and link
when one component holds thousands of flows (an all-to-all whose traffic crosses
scale-up domains, sharing NIC and spine links): then every completion walks the whole
component again. :func:`components_of` gives the same answer from the padded link
table with one sparse connected-components pass, and :func:`bounded_search` runs the
search only while it stays small, so that callers switch to the array pass for large
components.

Both return the components in the same canonical form (each in arrival order, in
order of their first flow's arrival; lone flows apart, in arrival order), so which
one found them never shows in the rates solved from them.
"""

from __future__ import annotations

import itertools

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

__all__ = [
    "SEARCH_BUDGET",
    "active_slots",
    "beyond_search",
    "bounded_search",
    "canonical",
    "components_among",
    "components_of",
    "remembered_components",
]

#: Flows a breadth-first search may gather before the array pass takes over.
SEARCH_BUDGET = 256
#: :func:`components_among` searches sets of at most this many flows (scipy's per-call
#: cost is larger below it).
SEARCH_AMONG = 64


def canonical(comps: list, singles: list, seq: np.ndarray) -> tuple[list[list[int]], list[int]]:
    """``(comps, singles)`` in canonical order: each component sorted by ``seq`` (arrival),
    the components by their first flow's ``seq``, the lone flows by ``seq``."""
    out = []
    for comp in comps:
        arr = np.asarray(comp, dtype=np.int64)
        out.append(arr[np.argsort(seq[arr], kind="stable")].tolist())
    if len(out) > 1:
        firsts = seq[[c[0] for c in out]]
        out = [out[i] for i in np.argsort(firsts, kind="stable").tolist()]
    if len(singles) > 1:
        arr = np.asarray(singles, dtype=np.int64)
        singles = arr[np.argsort(seq[arr], kind="stable")].tolist()
    return out, singles


def beyond_search(prep) -> bool:
    """Whether one of a phase's own link-sharing components (``prep.by_link``, big phases)
    holds more than :data:`SEARCH_BUDGET` flows: every flow of a phase just arrived is
    active and reached from its links, so :func:`bounded_search` from them gives up."""
    return prep.by_link is not None and any(c.shape[0] > SEARCH_BUDGET for c in prep.by_link[2][0])


def bounded_search(
    link_flows: dict, links: list, seeds: list[int], budget: int = SEARCH_BUDGET
) -> tuple[list, list] | None:
    """Components of the active flows on ``seeds`` (links) by breadth-first search over
    ``link_flows`` (link -> set of active slots), unordered; ``None`` as soon as the
    flows gathered exceed ``budget`` (a large component: use :func:`components_of`)."""
    lf = link_flows
    seen_links: set[int] = set()
    seen: set[int] = set()
    comps, singles = [], []
    for l0 in seeds:
        if l0 in seen_links:
            continue
        fl = lf.get(l0)
        if fl is None:
            continue
        if len(fl) == 1:
            (f,) = fl
            lks = links[f]
            if all(len(lf[x]) == 1 for x in lks):
                seen.add(f)
                seen_links.update(lks)
                singles.append(f)
                continue
        seen_links.add(l0)
        stack = [l0]
        comp: list[int] = []
        while stack:
            new = lf[stack.pop()] - seen
            if new:
                seen |= new
                comp.extend(new)
                if len(seen) > budget:
                    return None
                cand = set(itertools.chain.from_iterable(map(links.__getitem__, new)))
                cand -= seen_links
                seen_links |= cand
                stack.extend(cand)
        comps.append(comp)
    return comps, singles


def active_slots(batch: np.ndarray, n_slots: int) -> np.ndarray:
    """The slots of the active flows among the first ``n_slots``: ``batch`` marks free slots
    with -1 and flows held apart (:mod:`simulator.network.runahead`, on links no other flow
    uses) below -2."""
    return np.flatnonzero((batch[:n_slots] >= -2) & (batch[:n_slots] != -1))


def components_of(
    tab: np.ndarray,
    batch: np.ndarray,
    n_slots: int,
    n_links: int,
    seeds: list[int],
    seq: np.ndarray,
    active: np.ndarray | None = None,
) -> tuple[list[list[int]], list[int]]:
    """Components of the active flows on ``seeds`` (links), in canonical order (see
    :func:`canonical`), from the padded link table ``tab`` (slot -> links, -1 padding)
    of the first ``n_slots`` slots (the active ones: :func:`active_slots`, or ``active``)."""
    if active is None:
        active = active_slots(batch, n_slots)
    n = active.shape[0]
    sub = tab[active]
    mask = sub >= 0
    flat = sub[mask].astype(np.int64)
    size = n + n_links
    # flow rows in CSR form as they stand (entries grouped by flow); link rows empty
    indptr = np.empty(size + 1, dtype=np.int64)
    indptr[0] = 0
    np.cumsum(mask.sum(axis=1), out=indptr[1 : n + 1])
    indptr[n + 1 :] = indptr[n]
    # float64 data: the dtype scipy's graph routines use (no converted copy)
    graph = sp.csr_matrix((np.ones(flat.shape[0]), n + flat, indptr), shape=(size, size))
    _, labels = connected_components(graph, directed=False)
    flow_labels = labels[:n]
    wanted = np.zeros(labels.max() + 1, dtype=bool)
    wanted[labels[n + np.asarray(seeds, dtype=np.int64)]] = True
    pick = np.flatnonzero(wanted[flow_labels])
    if pick.shape[0] == 0:
        return [], []
    return _grouped(active[pick], flow_labels[pick], seq)


def remembered_components(memo, slots, n_links: int, seeds: list[int]) -> tuple[list[list[int]], list[int]]:
    """:func:`components_of` over a flow network's ``slots``, remembered in ``memo`` (a
    :class:`~simulator.network.ratememo.RateMemo`): the components of the active flows on
    ``seeds`` are a pure function of every active flow's links (its identity), in arrival
    order, and of the seed links, so that key gives the same components as a search; kept as
    positions into that order. The flows of a step's repeated collectives pass through the
    same states micro-batch after micro-batch (the TPU v5p built-in: 52 distinct of 1,910
    searches)."""
    n_slots = len(slots._links)
    active = active_slots(slots._batch, n_slots)
    ranked = active[np.argsort(slots._seq[active])]  # arrival order (arrival numbers are distinct)
    key = (slots._fid[ranked].tobytes(), np.unique(np.asarray(seeds, dtype=np.int64)).tobytes())
    hit = memo.components(key)
    if hit is not None:
        comp_pos, single_pos = hit
        return [ranked[p].tolist() for p in comp_pos], ranked[single_pos].tolist()
    comps, singles = components_of(slots._tab, slots._batch, n_slots, n_links, seeds, slots._seq, active=active)
    at = np.empty(n_slots, dtype=np.int64)
    at[ranked] = np.arange(ranked.shape[0])
    memo.keep_components(
        key, [at[np.asarray(c, dtype=np.int64)] for c in comps], at[np.asarray(singles, dtype=np.int64)]
    )
    return comps, singles


def components_among(
    sl: np.ndarray, tab: np.ndarray, links: list, seq: np.ndarray
) -> tuple[list[list[int]], list[int]]:
    """Components of the flows in slots ``sl`` among themselves (no other flow shares their
    links), in canonical order (see :func:`canonical`): a few flows by a search over their
    routes ``links[slot]``, more by one pass over the padded link table ``tab``."""
    if sl.shape[0] <= SEARCH_AMONG:
        return canonical(*_search_among(sl.tolist(), links), seq)
    sub = tab[sl]
    mask = sub >= 0
    _, local = np.unique(sub[mask], return_inverse=True)
    n = sl.shape[0]
    size = n + int(local.max(initial=-1)) + 1
    owner = np.nonzero(mask)[0]
    graph = sp.csr_matrix((np.ones(owner.shape[0]), (owner, n + local.reshape(-1))), shape=(size, size))
    _, labels = connected_components(graph, directed=False)
    return _grouped(sl, labels[:n], seq)


def _search_among(flows: list[int], links: list) -> tuple[list, list]:
    """Components (unordered) and lone flows of ``flows`` among themselves, by depth-first
    search over a link -> flows map of their routes ``links[slot]``."""
    on: dict[int, list[int]] = {}
    for f in flows:
        for lk in links[f]:
            on.setdefault(lk, []).append(f)
    seen: set[int] = set()
    comps, singles = [], []
    for f in flows:
        if f in seen:
            continue
        seen.add(f)
        comp, stack = [f], [f]
        while stack:
            for lk in links[stack.pop()]:
                for g in on[lk]:
                    if g not in seen:
                        seen.add(g)
                        comp.append(g)
                        stack.append(g)
        if len(comp) > 1:
            comps.append(comp)
        else:
            singles.append(f)
    return comps, singles


def _grouped(slots: np.ndarray, lab: np.ndarray, seq: np.ndarray) -> tuple[list[list[int]], list[int]]:
    """Flows ``slots`` with component labels ``lab`` as canonical ``(comps, singles)``."""
    key = seq[slots]  # by component, then arrival (one key: arrival numbers are distinct)
    order = np.argsort(lab.astype(np.int64) * (int(key.max(initial=0)) + 1) + key)
    slots, lab = slots[order], lab[order]
    bounds = np.r_[0, np.flatnonzero(np.diff(lab)) + 1, lab.shape[0]]
    lens = np.diff(bounds)
    starts = bounds[:-1]
    alone = lens == 1
    singles = slots[starts[alone]]
    singles = singles[np.argsort(seq[singles], kind="stable")].tolist()
    multi = starts[~alone]
    firsts = np.argsort(seq[slots[multi]], kind="stable")
    ends = bounds[1:][~alone]
    flat, ms, es = slots.tolist(), multi.tolist(), ends.tolist()
    comps = [flat[ms[i] : es[i]] for i in firsts.tolist()]
    return comps, singles


def number_links(
    flat: np.ndarray, entry_comp: np.ndarray | None, scratch: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Local numbers of the links that entries ``flat`` cross, component by component.

    ``entry_comp[e]`` is entry e's component (None: one component); components share no
    link. Returns ``(used, local, link_comp)``: the distinct links ordered by (component,
    link) -- the order of ``np.unique(entry_comp * n_links + flat)`` --, each entry's index
    into ``used``, and each used link's component (None for one component). ``scratch``
    is a per-network int64 array of -1 over every link, left as found: one pass over the
    entries and a sort of the distinct links only, not of the entries."""
    scratch[flat] = 0 if entry_comp is None else entry_comp
    used = np.flatnonzero(scratch >= 0) if flat.shape[0] * 4 > scratch.shape[0] else np.unique(flat)
    link_comp = None
    if entry_comp is not None:
        used = used[np.argsort(scratch[used], kind="stable")]
        link_comp = scratch[used]
    scratch[used] = np.arange(used.shape[0])
    local = scratch[flat]
    scratch[used] = -1
    return used, local, link_comp
