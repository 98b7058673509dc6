"""Max-min fair bandwidth sharing: pure functions of flows and link capacities (no simpy).

:func:`maxmin_rates` takes an incidence matrix; the solvers behind it run the same
progressive filling in the same floating-point order, so they agree bit for bit:

* :func:`fill_arrays` -- numpy, one flow set given as incidence entries;
* :func:`fill_components` -- numpy, several independent flow sets at once (each
  iteration fixes the lowest level of every component);
* :func:`fill_small` -- plain Python, for the handful of flows of a typical phase.

Every solver takes per-entry multiplicities: a flow crossing link l with
multiplicity m uses ``w * m`` times its rate there (weighted progressive filling;
the engine's symmetry quotient of twin traffic relies on it).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from simulator.errors import NetworkError

#: Links whose fair share is within this relative distance of the bottleneck level
#: saturate together (progressive filling).
BOTTLENECK_RTOL = 1e-9
#: A flow completes together with the earliest flow of its component when its own
#: completion time is within this fraction of its current constant-rate segment
#: (floating-point residue; symmetric flows then finish in one event).
DONE_RTOL = 1e-9

_INF = float("inf")


def maxmin_rates(incidence: sp.spmatrix, capacity: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Max-min fair rate of every flow, by progressive filling.

    Parameters
    ----------
    incidence : sparse matrix, shape (flows, links)
        Entry (f, l) is 1 when flow f crosses link l (0/1; a count k > 1 means the
        flow crosses the link k times and uses k times its rate there).
    capacity : array, shape (links,)
        Capacity of each link (bytes/s), >= 0.
    weights : array, shape (flows,), optional
        A flow of weight w counts as w identical flows on its path. Default 1.

    Returns
    -------
    numpy.ndarray, shape (flows,)
        Rate per unit flow. A flow that crosses no link gets ``inf``.

    Notes
    -----
    All unfixed flows grow at the same rate; link l saturates at level
    ``remaining_l / demand_l`` (``demand_l`` = weight of unfixed flows on l). The
    smallest such level fixes every unfixed flow on the links that reach it
    (within :data:`BOTTLENECK_RTOL`); their use is taken off the capacities and the
    loop repeats (see :func:`fill_arrays`).

    Raises
    ------
    NetworkError
        On mismatched shapes, negative capacity or non-positive weight.
    """
    a = sp.csr_matrix(incidence, dtype=float)
    if a.nnz and not np.all(a.data):
        a = a.copy()
        a.eliminate_zeros()
    n_flows, n_links = a.shape  # pyright: ignore[reportGeneralTypeIssues]  (a 2-d matrix)
    cap = np.asarray(capacity, dtype=float).reshape(-1)
    if cap.shape[0] != n_links:
        raise NetworkError(f"capacity has {cap.shape[0]} entries but incidence has {n_links} links")
    if np.any(~(cap >= 0)):
        raise NetworkError(f"capacity must be >= 0; got min {np.nanmin(cap) if cap.size else cap!r}")
    if weights is None:
        w = np.ones(n_flows)
    else:
        w = np.asarray(weights, dtype=float).reshape(-1)
        if w.shape[0] != n_flows:
            raise NetworkError(f"weights has {w.shape[0]} entries but incidence has {n_flows} flows")
        if np.any(~(w > 0)):
            raise NetworkError(f"weights must be > 0; got min {w.min()!r}")
    owner = np.repeat(np.arange(n_flows), np.diff(a.indptr))
    return fill_arrays(owner, a.indices.astype(np.int64), a.data, w, cap)


def fill_arrays(owner: np.ndarray, link: np.ndarray, mult: np.ndarray, w: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Progressive filling on a flow set given as incidence entries (numpy).

    Parameters
    ----------
    owner, link, mult : arrays, shape (entries,)
        Entry e says flow ``owner[e]`` crosses link ``link[e]`` ``mult[e]`` times.
        Entries must be grouped by flow in increasing flow order (CSR order).
    w : array, shape (flows,)
        Weight of each flow (> 0).
    cap : array, shape (links,)
        Capacity of each link indexed by ``link`` (>= 0).

    Returns
    -------
    numpy.ndarray, shape (flows,)
        Rate per unit flow; ``inf`` for a flow with no entry.

    Notes
    -----
    One iteration per distinct bottleneck level (symmetric collectives have one or
    two; an all-to-all over a torus a few hundred), each a few vectorised passes over
    the links plus work on the entries of the flows it fixes (:func:`_fill`). Equal,
    bit for bit, to :func:`fill_small` on the same flows in the same order.
    """
    if owner.shape[0] == 0:
        return np.full(w.shape[0], np.inf)
    return _fill(owner, link, w[owner] * mult, cap, w.shape[0])


def fill_components(
    owner: np.ndarray,
    link: np.ndarray,
    w: np.ndarray,
    cap: np.ndarray,
    link_comp: np.ndarray,
    comp_start: np.ndarray,
    mult: np.ndarray | None = None,
) -> np.ndarray:
    """:func:`fill_arrays` on several independent components at once (numpy).

    Links must be numbered component by component: component c owns links
    ``comp_start[c] <= l < comp_start[c + 1]`` and ``link_comp[l] = c``; every flow's
    entries lie in its own component's links; ``mult[e]`` (default 1) is entry e's
    multiplicity, as in :func:`fill_arrays`. Each iteration fixes the lowest level *of every component* at once, so the
    result is bit for bit that of solving each component alone, in
    max-over-components-of-levels iterations instead of their sum.
    """
    if owner.shape[0] == 0:
        return np.full(w.shape[0], np.inf)
    use = w[owner] if mult is None else w[owner] * mult
    return _fill(owner, link, use, cap, w.shape[0], link_comp, comp_start[:-1])


def _ranges(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(starts[i], stops[i])`` over i, in order."""
    lens = stops - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lens)
    return np.repeat(starts - (ends - lens), lens) + np.arange(total)


def _fill(
    owner: np.ndarray,
    link: np.ndarray,
    use: np.ndarray,
    cap: np.ndarray,
    n_flows: int,
    link_comp: np.ndarray | None = None,
    starts: np.ndarray | None = None,
) -> np.ndarray:
    """Progressive filling of :func:`fill_arrays` (one component: ``link_comp`` None) and
    :func:`fill_components` (``link_comp[l]`` link l's component, ``starts`` each
    component's first link): ``use[e]`` is entry e's capacity use per unit rate.

    Each iteration finds the bottleneck links in one pass over the links, then touches
    only the entries of what it fixes: the entries on those links (a link index built
    once, ``by_link``) and the entries of the flows fixed (contiguous, as entries are
    grouped by flow). A link saturates once (its flows are all fixed then), so the
    entries cost O(entries) in all, not O(entries) per level. The arithmetic -- which
    entries are summed into each link's demand and remaining capacity, in which order
    -- is that of one pass over all entries in entry order, so the bits are those of
    :func:`fill_small`."""
    n_links = cap.shape[0]
    rates = np.full(n_flows, np.inf)
    remaining = cap.astype(float, copy=True)
    demand = np.bincount(link, use, minlength=n_links)
    count = np.bincount(link, minlength=n_links)  # entries of unfixed flows per link
    # (any order of each link's entries will do; a radix sort where the link numbers fit 16 bits)
    by_link = np.argsort(link.astype(np.int16) if n_links < 2**15 else link, kind="stable")
    link_start = np.zeros(n_links + 1, dtype=np.int64)
    np.cumsum(count, out=link_start[1:])
    flow_start = np.searchsorted(owner, np.arange(n_flows + 1))
    done = np.zeros(n_flows, dtype=bool)
    n_active = int(np.count_nonzero(flow_start[1:] > flow_start[:-1]))
    flow_comp = None if link_comp is None else link_comp[link[flow_start[:-1].clip(max=link.shape[0] - 1)]]
    share = np.empty(n_links)
    thr = 1.0 + BOTTLENECK_RTOL
    while n_active:
        used = count > 0
        share.fill(np.inf)
        np.divide(remaining, demand, out=share, where=used)
        if link_comp is None:
            level = share.min()
            level_l = level
            sat = np.flatnonzero(share <= level * thr)
        else:
            level = np.minimum.reduceat(share, starts)  # pyright: ignore[reportArgumentType]  per component
            level_l = level[link_comp]
            sat = np.flatnonzero(used & (share <= level_l * thr))
        cand = owner[by_link[_ranges(link_start[sat], link_start[sat + 1])]]
        fixed = np.unique(cand[~done[cand]])
        done[fixed] = True
        rates[fixed] = level if link_comp is None else level[flow_comp[fixed]]  # pyright: ignore[reportOptionalSubscript]
        n_active -= fixed.shape[0]
        hit = _ranges(flow_start[fixed], flow_start[fixed + 1])  # their entries, flow-major
        links = link[hit]
        delta = np.bincount(links, use[hit], minlength=n_links)
        touched = delta > 0
        demand -= delta
        np.subtract(remaining, delta * np.where(touched, level_l, 0.0), out=remaining, where=touched)
        count -= np.bincount(links, minlength=n_links)
        np.maximum(remaining, 0.0, out=remaining)
    return rates


def fill_small(
    flow_links: Sequence[Sequence[int]],
    w: Sequence[float],
    cap: Sequence[float],
    mults: Sequence[Sequence[float] | None] | None = None,
) -> list[float]:
    """Progressive filling in plain Python, for a few flows.

    ``flow_links[f]`` lists the links of flow f (a link listed k times is crossed k
    times), ``w[f]`` its weight, ``cap[l]`` the capacity of link l (any indexable);
    ``mults[f]`` (optional, or None for a flow) the multiplicity of each of its
    links, aligned with ``flow_links[f]`` (default 1: the flow uses ``w[f] * m``
    times its rate on a link of multiplicity ``m``). Returns the rate per unit flow
    (``inf`` for a flow with no link). Same operations in the same order as
    :func:`fill_arrays`, hence the same bits.
    """
    rem: dict[int, float] = {}
    dem: dict[int, float] = {}
    cnt: dict[int, int] = {}
    on: dict[int, list[int]] = {}
    n = len(flow_links)
    rates = [_INF] * n
    fixed = [True] * n
    left = 0
    # capacity use per unit rate on each link: w[i], or w[i] * m with multiplicities
    uses: list = (
        [None] * n if mults is None else [None if m is None else [wi * x for x in m] for wi, m in zip(w, mults)]
    )
    for i, links in enumerate(flow_links):
        if links:
            fixed[i] = False
            left += 1
        ui = uses[i]
        for lk, u in zip(links, ui) if ui is not None else zip(links, itertools.repeat(w[i])):
            if lk in dem:
                dem[lk] += u
                cnt[lk] += 1
                on[lk].append(i)
            else:
                dem[lk] = u
                cnt[lk] = 1
                rem[lk] = float(cap[lk])
                on[lk] = [i]
    while left:
        shares = {lk: rem[lk] / d for lk, d in dem.items() if cnt[lk]}
        level = min(shares.values())
        thr = level * (1.0 + BOTTLENECK_RTOL)
        newly = sorted({i for lk, s in shares.items() if s <= thr for i in on[lk] if not fixed[i]})
        delta: dict[int, float] = {}
        for i in newly:
            rates[i] = level
            fixed[i] = True
            ui = uses[i]
            for lk, u in zip(flow_links[i], ui) if ui is not None else zip(flow_links[i], itertools.repeat(w[i])):
                delta[lk] = delta.get(lk, 0.0) + u
                cnt[lk] -= 1
        left -= len(newly)
        for lk, d in delta.items():
            dem[lk] -= d
            r = rem[lk] - d * level
            rem[lk] = r if r > 0.0 else 0.0
    return rates
