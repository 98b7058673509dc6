"""Flow-level network: point-to-point transfers sharing link bandwidth max-min fairly.

Two layers, in the style of Estee's ``netmodels``:

* the bandwidth-sharing maths -- :func:`maxmin_rates` (a pure function of an
  incidence matrix and link capacities) and the two solvers behind it,
  :func:`fill_arrays` (numpy, for big flow sets) and :func:`fill_small` (plain
  Python, for the handful of flows of a typical phase); both run the same
  progressive filling, in the same floating-point order, so they agree bit for bit;
* :class:`FlowNetwork` -- the simpy side, which only decides *when* and *what* to
  recompute.

Incremental recomputation
-------------------------
Under max-min fairness the rates of a set of flows depend only on the flows they
share links with, transitively: the *link-sharing component*. Two flows in
different components never influence each other, and max-min of the union is the
union of the per-component max-mins. So when a phase arrives or flows complete,
the network recomputes only the components that contain a changed link (found by
a breadth-first search over a link -> active-flows index); every other flow keeps
its rate, its progress reference and its completion time untouched. A phase on
links disjoint from all others is solved alone; a completion on links nobody else
uses costs no solve at all.

Each flow stores ``(t0, remaining at t0, rate)``; its progress is only advanced when
its rate is recomputed, so its completion time ``t0 + remaining / rate`` is exact and
unaffected by unrelated events. Each solved component is pushed on a heap keyed by
its earliest completion (ties broken by a counter); the flows that share no link
with any other (a ring on a crossbar, a rail) are pushed as one group per instant
and complete one by one. A single simpy wake-up is kept for the heap's top and is
only rescheduled when the top moves earlier.

Solvers: a flow alone gets its tightest link; a few small components go through
:func:`fill_small` (plain Python); otherwise all components of the instant go
through one :func:`fill_components` call (numpy), which fills every component's
lowest level per iteration. All three give the same bits as solving each
component alone with :func:`fill_arrays`.

Bundling: a :class:`Transfer` of ``weight`` w stands for w identical parallel
transfers on the same path (the twins of a symmetric collective); identical
transfers (same ``src``, ``dst``, ``size_bytes``) of one phase are merged into one
flow of summed weight. A flow loads its links w times.

Isolated phases: most collective phases run on links nobody else is using for
their whole life (a ring inside one NVLink domain, an all-to-all on a stage's own
nodes). How such a phase evolves -- its rates, the instants its flows finish, the
bytes it leaves on each link -- is a pure function of the phase, computed once per
prepared phase (:class:`_Isolated`). A phase found alone on its links at arrival is
therefore *reserved*: its links are marked, one timer fires its completion, and none
of its flows enters the incremental machinery above. If another flow later arrives on
a reserved link, the phase is *materialised* first: its unfinished flows enter the
flow arrays with the state the cached evolution gives for that instant (remaining
bytes, rate, segment start), and the normal recomputation takes over. The result is
the one the flow-by-flow path computes (same arithmetic, offsets rounded once more);
``FlowNetwork(..., reserve_isolated=False)`` turns the fast path off.

Multiplicities: a transfer may carry an ``incidence`` ``((link, m), ...)`` instead of
its route: it then loads link l ``w * m`` times its rate (weighted progressive
filling; all three solvers take per-entry multiplicities) and ``link_bytes`` counts
``w * m * size`` there. The engine uses it for the symmetry quotient of twin
traffic (one flow standing for itself and its twin images).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components
import simpy

from simulator.errors import NetworkError
from simulator.network.calibration import NetCalibration

if TYPE_CHECKING:  # pragma: no cover
    from topologies.topology import Topology

#: Links whose fair share is within this relative distance of the bottleneck level
#: saturate together (progressive filling).
BOTTLENECK_RTOL = 1e-9
#: A flow completes together with the earliest flow of its component when its own
#: completion time is within this fraction of its current constant-rate segment
#: (floating-point residue; symmetric flows then finish in one event).
DONE_RTOL = 1e-9
#: Components (of two or more flows) solved at one instant are solved in plain Python
#: when they hold at most this many flows in all, else together in numpy (whose
#: per-call overhead dominates below it).
SMALL_COMPONENT = 48
#: Phases (transfers) and completions (flows) up to this size are handled one flow
#: at a time; bigger ones are validated, merged, indexed and removed vectorised.
_SMALL_BATCH = 64
#: Updates touching at most this many flows use scalar (not vectorised) state access.
_SCALAR_MAX = 4

#: A phase whose isolated evolution has more distinct completion instants than this
#: is not reserved (its evolution costs more to precompute than the flow-by-flow
#: path, which re-solves only the components that change).
_ISOLATED_MAX_SEGMENTS = 64

#: Prepared (validated, merged, routed) phases cached per network.
_PREPARED_MAX = 4096
#: Small-component solutions (:meth:`FlowNetwork._fill_memo`) remembered per network.
_FILL_MEMO_MAX = 16384

_INF = float("inf")


# ---------------------------------------------------------------------------
# The maths
# ---------------------------------------------------------------------------


def maxmin_rates(incidence: sp.spmatrix, capacity: np.ndarray, weights: Optional[np.ndarray] = None) -> np.ndarray:
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
    n_flows, n_links = a.shape
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
    two; heterogeneous mixes a few dozen), each about fifteen vectorised passes over
    the entries and links. Equal, bit for bit, to :func:`fill_small` on the same
    flows in the same order.
    """
    n_flows, n_links = w.shape[0], cap.shape[0]
    rates = np.full(n_flows, np.inf)
    if owner.shape[0] == 0:
        return rates
    use = w[owner] * mult  # capacity use per unit rate, per entry
    remaining = cap.astype(float, copy=True)
    demand = np.bincount(link, use, minlength=n_links)
    count = np.bincount(link, minlength=n_links)  # entries of unfixed flows per link
    alive = np.ones(owner.shape[0], dtype=bool)
    mark = np.zeros(n_flows, dtype=bool)
    mark[owner] = True
    n_active = int(mark.sum())
    share = np.empty(n_links)
    while n_active:
        share.fill(np.inf)
        np.divide(remaining, demand, out=share, where=count > 0)
        level = share.min()
        saturated = share <= level * (1.0 + BOTTLENECK_RTOL)
        mark.fill(False)
        mark[owner[alive & saturated[link]]] = True
        fixed = np.flatnonzero(mark)
        rates[fixed] = level
        n_active -= fixed.shape[0]
        hit = alive & mark[owner]  # entries of the fixed flows, flow-major
        alive &= ~hit
        links = link[hit]
        delta = np.bincount(links, use[hit], minlength=n_links)
        demand -= delta
        remaining -= delta * level  # every newly fixed flow runs at ``level``
        count -= np.bincount(links, minlength=n_links)
        np.maximum(remaining, 0.0, out=remaining)
    return rates


def fill_components(
    owner: np.ndarray,
    link: np.ndarray,
    w: np.ndarray,
    cap: np.ndarray,
    link_comp: np.ndarray,
    comp_start: np.ndarray,
    mult: Optional[np.ndarray] = None,
) -> np.ndarray:
    """:func:`fill_arrays` on several independent components at once (numpy).

    Links must be numbered component by component: component c owns links
    ``comp_start[c] <= l < comp_start[c + 1]`` and ``link_comp[l] = c``; every flow's
    entries lie in its own component's links; ``mult[e]`` (default 1) is entry e's
    multiplicity, as in :func:`fill_arrays`. Each iteration fixes the lowest level *of every component* at once, so the
    result is bit for bit that of solving each component alone, in
    max-over-components-of-levels iterations instead of their sum.
    """
    n_flows, n_links = w.shape[0], cap.shape[0]
    rates = np.full(n_flows, np.inf)
    if owner.shape[0] == 0:
        return rates
    use = w[owner] if mult is None else w[owner] * mult
    remaining = cap.astype(float, copy=True)
    demand = np.bincount(link, use, minlength=n_links)
    count = np.bincount(link, minlength=n_links)
    alive = np.ones(owner.shape[0], dtype=bool)
    mark = np.zeros(n_flows, dtype=bool)
    mark[owner] = True
    n_active = int(mark.sum())
    flow_comp = np.empty(n_flows, dtype=np.int64)
    flow_comp[owner] = link_comp[link]
    share = np.empty(n_links)
    starts = comp_start[:-1]
    while n_active:
        used = count > 0
        share.fill(np.inf)
        np.divide(remaining, demand, out=share, where=used)
        level = np.minimum.reduceat(share, starts)  # per component
        level_l = level[link_comp]
        saturated = used & (share <= level_l * (1.0 + BOTTLENECK_RTOL))
        mark.fill(False)
        mark[owner[alive & saturated[link]]] = True
        fixed = np.flatnonzero(mark)
        rates[fixed] = level[flow_comp[fixed]]
        n_active -= fixed.shape[0]
        hit = alive & mark[owner]
        alive &= ~hit
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
    mults: Optional[Sequence[Optional[Sequence[float]]]] = None,
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


# ---------------------------------------------------------------------------
# The simpy side
# ---------------------------------------------------------------------------


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
    incidence: Optional[tuple[tuple[int, float], ...]] = None


@dataclass
class NetworkStats:
    """Counters of a :class:`FlowNetwork`.

    ``link_bytes[l]`` is the number of bytes carried by directed link ``l`` by the
    flows completed so far (a flow's bytes are counted when it completes); divide
    by ``link_capacity * elapsed`` (see :meth:`utilisation`) for its average
    utilisation.

    ``flows_started`` counts network transfers handed to ``transfer`` (after
    dropping local and empty ones), ``flow_rows_started`` the flows they became
    after merging identical transfers, ``unit_flows_started`` the sum of weights.
    ``recomputations`` counts instants at which some rates were recomputed,
    ``components_solved`` the max-min problems solved then and
    ``flows_recomputed`` the flows in them; ``wakeups`` counts completion events;
    ``reserved_phases`` the phases run alone on their links from their cached
    evolution (some of them later materialised into flows).
    """

    link_bytes: np.ndarray
    recomputations: int = 0
    flows_started: int = 0  # network transfers (before merging identical ones)
    unit_flows_started: int = 0  # sum of weights
    phases_started: int = 0
    max_concurrent_flows: int = 0  # flows (merged rows) in flight at once
    link_capacity: np.ndarray = field(default_factory=lambda: np.zeros(0))
    flow_rows_started: int = 0
    components_solved: int = 0
    flows_recomputed: int = 0
    wakeups: int = 0
    reserved_phases: int = 0  # phases run alone on their links (cached evolution)

    def utilisation(self, elapsed_s: float) -> np.ndarray:
        """Average fraction of (calibrated) capacity used on each link over ``elapsed_s``."""
        if not elapsed_s > 0:
            raise NetworkError(f"elapsed_s must be > 0, got {elapsed_s!r}")
        return self.link_bytes / (self.link_capacity * elapsed_s)


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
class _Prepared:
    """A phase validated, merged and routed: one entry per flow (merged transfer)."""

    n_transfers: int  # network transfers before merging
    units: int  # sum of weights
    latency_s: float  # largest path latency + largest overhead
    links: list  # per flow: tuple of link ids
    sizes: np.ndarray  # per flow: bytes
    weights: np.ndarray  # per flow: weight
    table: np.ndarray  # per flow: link ids padded with -1 (flows x hops)
    by_link: Optional[tuple]  # big phases: (flows sorted by link, [(link, a, b)],
    #                                      (its own components, its flows alone))
    mults: Optional[list] = None  # per flow: multiplicities aligned with links, or
    #                                      None (each link once); None: no flow has any
    mtable: Optional[np.ndarray] = None  # the same padded with 1.0, like ``table``


@dataclass(frozen=True)
class _Isolated:
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
    prep: _Prepared, capacity: np.ndarray, max_segments: int = _ISOLATED_MAX_SEGMENTS
) -> Optional[_Isolated]:
    """The :class:`_Isolated` evolution of ``prep`` on links of ``capacity`` (bytes/s,
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
    return _Isolated(t, uniq, uniq.tolist(), link_bytes, starts, flows, rems, rates_seg)


#: At most this many pairs, :meth:`FlowNetwork.routes` routes them one by one (cached).
_FEW_ROUTES = 64


class FlowNetwork:
    """All in-flight transfers of one simulation, sharing links max-min fairly.

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
        topo: "Topology",
        calibration: Optional[NetCalibration] = None,
        reserve_isolated: bool = True,
    ) -> None:
        self.env = env
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
        self._lat = self.link_latency.tolist()
        self._ovh = self.link_overhead.tolist()
        self._routes: dict[tuple[int, int], tuple[tuple[int, ...], float, float]] = {}
        # In-flight flows live in slots of numpy arrays (grown by doubling, reused
        # through a free list); their routes also as tuples, for the set index and
        # the small solver.
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
        self._tab = np.full((0, 1), -1, dtype=np.int32)  # links, padded with -1
        self._mtab = np.ones((0, 1))  # their multiplicities, padded with 1 (once _any_mult)
        self._free: list[int] = []
        self._n_active = 0
        self._next_seq = 0
        self._prepared: dict[int, tuple] = {}  # id(transfers tuple) -> (it, _Prepared)
        #: Scratch memo for callers that hand the same phases again and again
        #: (:func:`simulator.network.collectives.run_collective` keeps its merged phases here).
        self.memo: dict = {}
        self._link_flows: dict[int, set[int]] = {}  # link -> active slots on it
        self._new: list[int] = []  # slots arrived since the last update
        self._new_phases: list = []  # (prepared phase, its slots) arrived since then
        self._dirty: list[int] = []  # links of flows completed since the last update
        self._update_pending = False
        self._heap: list[tuple[float, int]] = []  # (earliest completion, batch id)
        self._batches: dict[int, np.ndarray] = {}  # batch id -> its slots
        self._next_bid = 0
        self._wake_at = _INF
        self._gen = 0
        self._phase_ids = itertools.count()
        self._phase_left: dict[int, int] = {}
        self._phase_event: dict[int, simpy.Event] = {}
        # Reserved (isolated) phases, see the module docstring.
        self._reserve = bool(reserve_isolated)
        self._reserved_on = np.full(self.n_links, -1, dtype=np.int64)  # link -> phase id
        # phase id -> (prepared, _Isolated, arrival of its flows, reservation token)
        self._reserved: dict[int, tuple] = {}
        self._next_token = 0
        self._isolation_of: dict[int, tuple] = {}  # id(prepared) -> (it, links, list, iso)
        self._fills: dict[tuple, list] = {}  # component -> fill_small rates

    # -- public ------------------------------------------------------------

    @property
    def active_flows(self) -> int:
        return self._n_active

    @property
    def reserves_isolated(self) -> bool:
        """Whether phases alone on their links run from their cached evolution."""
        return self._reserve

    def flow_table(self) -> list[tuple[tuple[int, ...], float, float, float]]:
        """``(links, weight, rate per unit flow, bytes left now)`` of every flow in the
        network, in arrival order. Rates are those in force after the last update
        (flows that arrived at this very instant may still show rate 0)."""
        for pid in sorted(self._reserved):
            self._materialise(pid)
        now = self.env.now
        hw = len(self._links)
        live = np.flatnonzero(self._batch[:hw] != -1)
        live = live[np.argsort(self._seq[live], kind="stable")]
        out = []
        for s in live.tolist():
            r = float(self._rate[s])
            left = float(self._rem[s] - r * (now - self._t0[s])) if r > 0.0 else float(self._rem[s])
            out.append((self._links[s], float(self._w[s]), r, max(left, 0.0)))
        return out

    def route(self, src: int, dst: int) -> tuple[tuple[int, ...], float, float]:
        """``(links, path latency, largest per-link overhead)`` of ``src -> dst`` (cached;
        a transfer's phase latency is path latency + overhead)."""
        return self._route(src, dst)

    def routes(self, src, dst) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised :meth:`route`: ``(links, latency_s)`` of every ``src[i] ->
        dst[i]``, ``links`` an ``(n, hops)`` array padded with -1
        (:meth:`Topology.routes`) and ``latency_s`` each pair's path latency plus its
        largest per-link overhead (0 where ``src == dst``), summed link by link in
        route order as :meth:`route` does, so the two agree exactly. Few pairs go
        through :meth:`route` (cached); many are routed at once and not cached."""
        src, dst = np.asarray(src, dtype=np.int64).ravel(), np.asarray(dst, dtype=np.int64).ravel()
        if src.shape[0] <= _FEW_ROUTES:
            found = [self._route(s, d) if s != d else ((), 0.0, 0.0) for s, d in zip(src.tolist(), dst.tolist())]
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

    def _route(self, s: int, d: int) -> tuple[tuple[int, ...], float, float]:
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

    def _prepare(self, transfers: Sequence[Transfer]) -> Optional[_Prepared]:
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
                mults: Optional[list] = [] if with_inc else None
                lat = ovh = 0.0
                for (s, d, size, inc), w in merged.items():
                    lk, la, ov = self._route(s, d)
                    if la > lat:
                        lat = la
                    if ov > ovh:
                        ovh = ov
                    if inc is not None:
                        lk = tuple(int(x) for x, _ in inc)
                        mults.append(tuple(float(m) for _, m in inc))
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
        self, n: int, links: list, sizes: list, weights: list, latency: float, mults: Optional[list], big: bool
    ) -> _Prepared:
        """The :class:`_Prepared` of merged flows (``links`` per flow, distinct links);
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
        return _Prepared(
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

    def phase_latency_s(self, transfers: Sequence[Transfer], steps: int = 1) -> float:
        """``steps`` x (largest path latency + largest per-step overhead) of ``transfers``.

        Transfers with ``src == dst`` or zero bytes do not count.
        """
        prep = self._prepare(transfers)
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
        if not (isinstance(steps, (int, np.integer)) and steps >= 1):
            raise NetworkError(f"steps must be an integer >= 1, got {steps!r}")
        prep = self._prepare(transfers)
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
        if self._reserve:
            # Alone on its links already: reserve them from now, through the latency.
            # The reservation's timer is the phase's event (one simpy event, not two)
            # unless the phase is materialised (see :meth:`_materialise`).
            links, link_list, iso = self._isolation(prep)
            if iso is not None and self._reserved_on[links].max() < 0 and self._free_of_flows(link_list):
                timer = self._reserve_phase(pid, prep, iso, latency)
                self._phase_event[pid] = timer
                return timer
        done = self._phase_event[pid] = self.env.event()
        self.env.timeout(latency).callbacks.append(partial(self._arrive, pid, prep))
        return done

    # -- event handling ------------------------------------------------------

    def _grow(self, need: int, width: int) -> None:
        """Room for ``need`` slots and routes of ``width`` hops."""
        cap = self._cap_slots
        if need > cap:
            cap = max(need, 2 * cap, 64)
            for name in ("_w", "_size", "_rem", "_t0", "_rate", "_end", "_seq", "_batch", "_pid"):
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

    def _arrive(self, pid: int, prep: "_Prepared", _ev=None) -> None:
        """The phase's latency has elapsed: reserve its links if it is alone on them,
        else its flows enter the network (materialising reserved phases in the way)."""
        if self._reserve:
            links, link_list, iso = self._isolation(prep)
            hit = self._reserved_on[links]
            if hit.max() >= 0:
                for other in sorted(set(hit[hit >= 0].tolist())):
                    self._materialise(other)
            if iso is not None and self._free_of_flows(link_list):
                self._reserve_phase(pid, prep, iso)
                return
        self._insert(pid, prep)

    def _free_of_flows(self, link_list: list) -> bool:
        """Whether no flow of the flow-by-flow path is on any of these links."""
        return not any(map(self._link_flows.__contains__, link_list))

    def _isolation(self, prep: "_Prepared") -> tuple:
        """``(distinct links as array, as list, isolated evolution or None)`` of a
        prepared phase, cached."""
        hit = self._isolation_of.get(id(prep))
        if hit is not None and hit[0] is prep:
            return hit[1:]
        iso = isolated_evolution(prep, self.capacity)
        if iso is not None:
            links, link_list = iso.links, iso.link_list
        else:
            links = np.unique(prep.table[prep.table >= 0]).astype(np.int64)
            link_list = links.tolist()
        if len(self._isolation_of) >= _PREPARED_MAX:
            self._isolation_of.clear()
        self._isolation_of[id(prep)] = (prep, links, link_list, iso)
        return links, link_list, iso

    def _reserve_phase(self, pid: int, prep: "_Prepared", iso: _Isolated, latency_s: float = 0.0) -> None:
        """Run a phase alone on its links: one timer for its cached evolution. With
        ``latency_s`` the reservation starts now and the flows enter the links (in the
        evolution's terms) that much later."""
        self._reserved_on[iso.links] = pid
        token = self._next_token = self._next_token + 1
        timer = self.env.timeout(latency_s + iso.duration_s)
        finish = partial(self._finish_reserved, pid, token)
        timer.callbacks.append(finish)
        self._reserved[pid] = (prep, iso, self.env.now + latency_s, token, timer, finish)
        self.stats.reserved_phases += 1
        self._n_active += len(prep.links)
        if self._n_active > self.stats.max_concurrent_flows:
            self.stats.max_concurrent_flows = self._n_active
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
        """Drop phase ``pid``'s reservation: ``(prepared, _Isolated, arrival)``."""
        prep, iso, t_arr, _, timer, finish = self._reserved.pop(pid)
        self._reserved_on[iso.links] = -1
        self._n_active -= len(prep.links)
        return prep, iso, t_arr, timer, finish

    def _retire(self, pid: int, iso: _Isolated) -> None:
        """A reserved phase has completed: count its bytes, fire its event."""
        self.stats.link_bytes[iso.links] += iso.link_bytes
        self._release([], [pid])

    def _materialise(self, pid: int) -> None:
        """Hand a reserved phase to the flow-by-flow path: its unfinished flows enter
        the network with the state its isolated evolution has reached now."""
        prep, iso, t_arr, timer, finish = self._unreserve(pid)
        k = len(prep.links)
        tau = self.env.now - t_arr
        if tau >= iso.duration_s:  # due at this very instant
            self._retire(pid, iso)
            return
        if self._phase_event[pid] is timer:  # its timer no longer ends it: a new event,
            done = self._phase_event[pid] = self.env.event()  # with the timer's waiters
            done.callbacks = [cb for cb in timer.callbacks if cb is not finish]
            timer.callbacks = [finish]
        if tau < 0.0:  # still in its latency: arrive as usual
            self.env.timeout(-tau).callbacks.append(partial(self._arrive, pid, prep))
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
            np.add.at(self.stats.link_bytes, sub[mask].astype(np.int64), moved)
            al = alive.tolist()
            prep = _Prepared(
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
        self._phase_left[pid] = alive.shape[0]
        sl = self._insert(pid, prep)
        t0 = t_arr + iso.seg_start[i]
        rem, rate = iso.seg_rem[i], iso.seg_rate[i]
        self._rem[sl] = rem
        self._t0[sl] = t0
        self._rate[sl] = rate
        self._end[sl] = t0 + rem / rate

    def _insert(self, pid: int, prep: "_Prepared") -> np.ndarray:
        """A phase's flows enter the flow arrays (rate to be solved); returns their
        slots."""
        now = self.env.now
        links = prep.links
        k = len(links)
        free = self._free
        reuse = min(k, len(free))
        pm = prep.mults
        if pm is not None and not self._any_mult:
            self._any_mult = True
            self._mtab = np.ones(self._tab.shape)
        if reuse:
            slots = free[len(free) - reuse :]
            del free[len(free) - reuse :]
            slots.reverse()
            for s, lk in zip(slots, links):
                self._links[s] = lk
            if self._any_mult:
                mults = self._mults
                if pm is None:
                    for s in slots:
                        mults[s] = None
                else:
                    for s, m in zip(slots, pm):
                        mults[s] = m
        else:
            slots = []
        if reuse < k:
            hw = len(self._links)
            slots.extend(range(hw, hw + k - reuse))
            self._links.extend(links[reuse:])
            self._mults.extend(itertools.repeat(None, k - reuse) if pm is None else pm[reuse:])
        width = prep.table.shape[1]
        self._grow(len(self._links), width)
        sl = np.array(slots, dtype=np.int64)
        if k <= 2:
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
        self._next_seq += k
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
        lf = self._link_flows
        if prep.by_link is None:
            for s, lks in zip(slots, links):
                for lk in lks:
                    fl = lf.get(lk)
                    if fl is None:
                        lf[lk] = {s}
                    else:
                        fl.add(s)
        else:
            owner, groups, _ = prep.by_link
            members = sl[owner].tolist()
            for lk, a, b in groups:
                fl = lf.get(lk)
                if fl is None:
                    lf[lk] = set(members[a:b])
                else:
                    fl.update(members[a:b])
        self._new.extend(slots)
        self._new_phases.append((prep, sl))
        self._n_active += k
        if self._n_active > self.stats.max_concurrent_flows:
            self.stats.max_concurrent_flows = self._n_active
        self._request_update()
        return sl

    def _request_update(self) -> None:
        """Recompute once at this instant, after every change made at it."""
        if not self._update_pending:
            self._update_pending = True
            self.env.timeout(0).callbacks.append(self._update)

    def _components(self, seeds: list[int]) -> tuple[list[list[int]], list[int]]:
        """Link-sharing components of the active flows on ``seeds`` (links).

        Returns ``(components, singles)``: components of two or more flows, each in
        arrival order, in order of their first flow's arrival; and the flows that
        share no link with any other (the common case: a ring on a crossbar or a
        rail), in arrival order."""
        lf, links, seq = self._link_flows, self._links, self._seq
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
                    cand = set(itertools.chain.from_iterable(map(links.__getitem__, new)))
                    cand -= seen_links
                    seen_links |= cand
                    stack.extend(cand)
            arr = np.array(comp, dtype=np.int64)
            comps.append(arr[np.argsort(seq[arr], kind="stable")].tolist())
        if len(comps) > 1:
            firsts = seq[[c[0] for c in comps]]
            comps = [comps[i] for i in np.argsort(firsts, kind="stable").tolist()]
        if len(singles) > 1:
            arr = np.array(singles, dtype=np.int64)
            singles = arr[np.argsort(seq[arr], kind="stable")].tolist()
        return comps, singles

    def _update(self, _ev=None) -> None:
        self._update_pending = False
        seeds = self._dirty
        self._dirty = []
        links = self._links
        phases = self._new_phases
        self._new_phases = []
        if not seeds and len(phases) == 1 and self._isolated(phases[0][0]):
            # a big phase on links nobody else uses: its own components, known in advance
            prep, sl = phases[0]
            own, single = prep.by_link[2]
            comps = [sl[c].tolist() for c in own]
            singles = sl[single].tolist()
            self._new = []
        else:
            for s in self._new:
                seeds.extend(links[s])
            self._new = []
            comps, singles = self._components(seeds)
        if comps or singles:
            self._recompute(comps, singles)
        self._schedule_wake()

    def _isolated(self, prep: "_Prepared") -> bool:
        """Whether the (big) phase just arrived is alone on every one of its links."""
        if prep.by_link is None:
            return False
        lf = self._link_flows
        return all(len(lf[lk]) == b - a for lk, a, b in prep.by_link[1])

    def _fill_big(self, sl: np.ndarray, w: np.ndarray, lens: list[int]) -> np.ndarray:
        """Max-min rates of components given back to back (slots ``sl``, sizes ``lens``)."""
        sub = self._tab[sl]
        mask = sub >= 0
        flat = sub[mask].astype(np.int64)
        owner = np.nonzero(mask)[0]
        mult = self._mtab[sl][mask] if self._any_mult else None
        if len(lens) == 1:
            used, local = np.unique(flat, return_inverse=True)
            return fill_arrays(
                owner, local.reshape(-1), np.ones(flat.shape[0]) if mult is None else mult, w, self.capacity[used]
            )
        comp = np.repeat(np.arange(len(lens)), lens)[owner]
        used, local = np.unique(comp * self.n_links + flat, return_inverse=True)
        link_comp = used // self.n_links
        comp_start = np.searchsorted(link_comp, np.arange(len(lens) + 1))
        return fill_components(
            owner, local.reshape(-1), w, self.capacity[used % self.n_links], link_comp, comp_start, mult
        )

    def _recompute(self, comps: list[list[int]], singles: list[int]) -> None:
        """Solve each component alone; keep the segment of flows whose rate is unchanged.

        Each component becomes one heap entry (a batch); all single-flow components
        of this instant share one (a *group* batch, whose flows complete one by one)."""
        now = self.env.now
        stats = self.stats
        stats.recomputations += 1
        stats.components_solved += len(comps) + len(singles)
        lens = [len(c) for c in comps]
        if singles:
            comps = comps + [singles]
            lens.append(len(singles))
        total = sum(lens)
        stats.flows_recomputed += total
        if total <= _SCALAR_MAX:
            self._recompute_scalar(comps, bool(singles), now)
            return
        sl = np.fromiter(itertools.chain.from_iterable(comps), dtype=np.int64, count=total)
        w = self._w[sl]
        wl = w.tolist()
        links = self._links
        n_multi = len(comps) - bool(singles)
        pos = sum(lens[:n_multi])
        if n_multi == 0:
            r = np.zeros(0)
        elif pos <= SMALL_COMPONENT:
            parts: list = []
            at = 0
            mults = self._mults if self._any_mult else None
            for comp, n in zip(comps[:n_multi], lens):
                parts.extend(
                    self._fill_memo(
                        [links[s] for s in comp], wl[at : at + n], None if mults is None else [mults[s] for s in comp]
                    )
                )
                at += n
            r = np.array(parts)
        else:
            r = self._fill_big(sl[:pos], w[:pos], lens[:n_multi])
        if singles:  # alone on their links: the tightest one (routes are simple paths)
            single = sl[pos:]
            if self._any_mult:
                alone = (self._cap_pad[self._tab[single]] / (w[pos:, None] * self._mtab[single])).min(axis=1)
            else:
                alone = self._cap_pad[self._tab[single]].min(axis=1) / w[pos:]
            r = np.concatenate([r, alone])
        old = self._rate[sl]
        t0 = self._t0[sl]
        rem = self._rem[sl]
        changed = r != old
        adv = changed & (old > 0.0)  # advance at the old rate up to now
        if adv.any():
            rem = np.where(adv, np.maximum(rem - old * (now - t0), 0.0), rem)
            t0 = np.where(adv, now, t0)
            self._rem[sl] = rem
            self._t0[sl] = t0
        # same rate: same segment, same completion time
        end = np.where(changed, t0 + rem / r, self._end[sl])
        self._rate[sl] = r
        self._end[sl] = end
        b0 = self._next_bid
        self._next_bid += len(comps)
        self._batch[sl] = np.repeat(np.arange(b0, b0 + len(comps)), lens)
        if len(comps) == 1:
            firsts, starts = [float(end.min())], [0]
        else:
            starts = np.cumsum(lens) - lens
            firsts = np.minimum.reduceat(end, starts).tolist()
            starts = starts.tolist()
        heap, batches = self._heap, self._batches
        last = len(comps) - 1
        for i, (first, start, n) in enumerate(zip(firsts, starts, lens)):
            batches[b0 + i] = (sl[start : start + n], bool(singles) and i == last)
            heapq.heappush(heap, (first, b0 + i))

    def _fill_memo(self, flow_links: list, w: list, mults: Optional[list]) -> list[float]:
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
        links, cap = self._links, self._cap
        w, rem, t0, rate, end = self._w, self._rem, self._t0, self._rate, self._end
        batch, heap, batches = self._batch, self._heap, self._batches
        last = len(comps) - 1
        mults = self._mults if self._any_mult else None
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

    def _live(self, bid: int) -> tuple[np.ndarray, np.ndarray]:
        return self._live_of(self._batches[bid][0], bid)

    def _schedule_wake(self) -> None:
        """Keep one simpy wake-up at the earliest completion; only reschedule when
        that time moves earlier."""
        heap, batches = self._heap, self._batches
        while heap:
            key, bid = heap[0]
            sl, group = batches[bid]
            if not group:
                if self._batch[sl[0]] == bid:  # a component is re-solved whole
                    break
                heapq.heappop(heap)
                del batches[bid]
                continue
            live, ends = self._live(bid)  # a group loses flows one by one
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
        if gen != self._gen:
            return
        self._wake_at = _INF
        self.stats.wakeups += 1
        heap, batches = self._heap, self._batches
        end, t0, batch = self._end, self._t0, self._batch
        comps, keys, done, regroup = [], [], [], []
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
                self._complete(finished)
                self._request_update()
                return
        self._schedule_wake()

    def _live_of(self, sl, bid: int) -> tuple[np.ndarray, np.ndarray]:
        """Slots of group batch ``bid`` not re-solved since, and their completion times."""
        sl = np.asarray(sl)
        sl = sl[self._batch[sl] == bid]
        return sl, self._end[sl]

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
            np.add.at(self.stats.link_bytes, at, amounts)  # in order: the same sums
        else:
            lf, dirty, link_bytes = self._link_flows, self._dirty, self.stats.link_bytes
            sub = self._tab[done]
            mask = sub >= 0
            flat = sub[mask].astype(np.int64)
            rows = np.nonzero(mask)[0]
            if not self._any_mult:
                np.add.at(link_bytes, flat, moved[rows])
            else:
                np.add.at(link_bytes, flat, moved[rows] * self._mtab[done][mask])
            order = np.argsort(flat, kind="stable")
            flat, owner = flat[order], done[rows[order]].tolist()
            bounds = np.r_[0, np.flatnonzero(np.diff(flat)) + 1, flat.shape[0]].tolist()
            for lk, a, b in zip(flat[bounds[:-1]].tolist(), bounds[:-1], bounds[1:]):
                fl = lf[lk]
                fl.difference_update(owner[a:b])
                if fl:
                    dirty.append(lk)
                else:
                    del lf[lk]
        self._batch[done] = -1
        left = self._phase_left
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
        lf, dirty = self._link_flows, self._dirty
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
        left = self._phase_left
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
        np.add.at(self.stats.link_bytes, at, amounts)  # in order: the same sums
        self._release(done, finished)

    def _release(self, slots, finished: list[int]) -> None:
        """Return completed flows' slots to the free list and fire the events of the
        phases that ``finished`` (in phase order, for determinism)."""
        self._free.extend(reversed(slots))
        self._n_active -= len(slots)
        left = self._phase_left
        for p in sorted(finished):
            del left[p]
            ev = self._phase_event.pop(p)
            if not ev.triggered:  # a reservation's timer fires by itself
                ev.succeed()
