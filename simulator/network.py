"""Flow-level network: point-to-point transfers sharing link bandwidth max-min fairly.

Two layers, in the style of Estee's ``netmodels``:

* :func:`maxmin_rates` -- the bandwidth-sharing maths, a pure numpy function of an
  incidence matrix (flows x links) and link capacities;
* :class:`FlowNetwork` -- the simpy side, which only decides *when* to recompute:
  whenever the set of in-flight flows changes (a phase arrives, flows complete).

Between two changes every flow moves at a constant rate, so progress is advanced
exactly (``remaining -= rate * dt``) and the next completion time is known in
advance; a wake-up is scheduled for it and carries a generation number so that a
wake-up made stale by a later change is ignored.

Bundling: a :class:`Transfer` of ``weight`` w stands for w identical parallel
transfers on the same path (the twins of a symmetric collective). It is one row of
the incidence matrix, but loads its links w times.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
import scipy.sparse as sp
import simpy

from .netcal import NetCalibration

if TYPE_CHECKING:  # pragma: no cover
    from topologies.topology import Topology

#: Links whose fair share is within this relative distance of the bottleneck level
#: saturate together (progressive filling).
BOTTLENECK_RTOL = 1e-9
#: A flow is complete when its remaining bytes are below this fraction of its size
#: (floating-point residue of ``remaining -= rate * dt``).
DONE_RTOL = 1e-9


class NetworkError(ValueError):
    """Bad input to the network model (a transfer, a capacity, a weight)."""


# ---------------------------------------------------------------------------
# The maths
# ---------------------------------------------------------------------------

def maxmin_rates(incidence: sp.spmatrix, capacity: np.ndarray,
                 weights: Optional[np.ndarray] = None) -> np.ndarray:
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
    loop repeats. Iterations = number of distinct bottleneck levels; each is a
    few vectorised gathers and bincounts over the entries of the flows it fixes
    (symmetric collectives have one or two levels; heterogeneous mixes of a few
    thousand flows can have ~100, about 0.1 ms each).

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
    rates = np.full(n_flows, np.inf)
    if n_flows == 0:
        return rates
    at = a.T.tocsr()                       # links x flows
    lens = np.diff(a.indptr)
    active = lens > 0                      # flows that cross at least one link
    remaining = cap.copy()
    wa = np.where(active, w, 0.0)
    demand = at @ wa                       # unfixed weight on each link
    # stored entries of unfixed flows on each link (an exact integer count)
    count = np.bincount(a.indices, np.repeat(active, lens).astype(float), minlength=n_links)
    share = np.empty(n_links)
    n_active = int(active.sum())
    while n_active:
        used = count > 0
        share.fill(np.inf)
        np.divide(remaining, demand, out=share, where=used)
        level = share.min()
        saturated = np.flatnonzero(share <= level * (1.0 + BOTTLENECK_RTOL))
        flows, _, _ = _gather_rows(at, saturated)
        hit = np.zeros(n_flows, dtype=bool)
        hit[flows] = True
        hit &= active
        fixed = np.flatnonzero(hit)
        rates[fixed] = level
        active[fixed] = False
        n_active -= fixed.shape[0]
        links, owner, mult = _gather_rows(a, fixed)
        delta = np.bincount(links, w[owner] * mult, minlength=n_links)
        demand -= delta
        remaining -= delta * level     # every newly fixed flow runs at ``level``
        count -= np.bincount(links, minlength=n_links)
        np.maximum(remaining, 0.0, out=remaining)
    return rates


def _gather_rows(m: sp.csr_matrix, rows: np.ndarray):
    """Column indices, owning row and value of every stored entry of ``m[rows]``."""
    starts = m.indptr[rows]
    lens = m.indptr[rows + 1] - starts
    total = int(lens.sum())
    ends = np.cumsum(lens)
    pos = np.repeat(starts - (ends - lens), lens) + np.arange(total)
    return m.indices[pos], np.repeat(rows, lens), m.data[pos]


# ---------------------------------------------------------------------------
# The simpy side
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Transfer:
    """``size_bytes`` from device ``src`` to device ``dst``.

    ``weight`` = that many identical parallel transfers on the same path (bundled
    into one flow; each of them carries ``size_bytes``).
    """

    src: int
    dst: int
    size_bytes: float
    weight: int = 1


@dataclass
class NetworkStats:
    """Counters of a :class:`FlowNetwork`.

    ``link_bytes[l]`` is the number of bytes carried by directed link ``l``;
    divide by ``link_capacity * elapsed`` (see :meth:`utilisation`) for its
    average utilisation.
    """

    link_bytes: np.ndarray
    recomputations: int = 0
    flows_started: int = 0          # rows (bundled transfers)
    unit_flows_started: int = 0     # sum of weights
    phases_started: int = 0
    max_concurrent_flows: int = 0
    link_capacity: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def utilisation(self, elapsed_s: float) -> np.ndarray:
        """Average fraction of (calibrated) capacity used on each link over ``elapsed_s``."""
        if not elapsed_s > 0:
            raise NetworkError(f"elapsed_s must be > 0, got {elapsed_s!r}")
        return self.link_bytes / (self.link_capacity * elapsed_s)


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

    def __init__(self, env: simpy.Environment, topo: "Topology",
                 calibration: Optional[NetCalibration] = None) -> None:
        self.env = env
        self.topo = topo
        self.calibration = calibration if calibration is not None else NetCalibration()
        kinds = tuple(topo.link_kind)
        eff = np.array([self.calibration.efficiency_of(k) for k in kinds], dtype=float)
        self.capacity = np.asarray(topo.link_capacity, dtype=float) * eff
        if self.capacity.size and not np.all(self.capacity > 0):
            bad = int(np.argmin(self.capacity))
            raise NetworkError(f"link {bad} has capacity {self.capacity[bad]!r}; must be > 0")
        self.link_latency = np.asarray(topo.link_latency, dtype=float)
        self.link_overhead = np.array([self.calibration.overhead_of(k) for k in kinds], dtype=float)
        self.n_links = self.capacity.shape[0]
        self.stats = NetworkStats(link_bytes=np.zeros(self.n_links), link_capacity=self.capacity)
        # in-flight flows (rows of _a)
        self._a = sp.csr_matrix((0, self.n_links))
        self._remaining = np.zeros(0)
        self._size = np.zeros(0)
        self._weight = np.zeros(0)
        self._phase = np.zeros(0, dtype=np.int64)
        self._rates = np.zeros(0)
        self._load = np.zeros(self.n_links)          # bytes/s on each link
        self._due = np.zeros(0, dtype=bool)
        self._last_t = env.now
        self._gen = 0
        self._update_pending = False
        self._phase_ids = itertools.count()
        self._phase_left: dict[int, int] = {}
        self._phase_event: dict[int, simpy.Event] = {}
        self._phase_tag: dict[int, str] = {}

    # -- public ------------------------------------------------------------

    @property
    def active_flows(self) -> int:
        return int(self._remaining.shape[0])

    def _phase_arrays(self, transfers: Sequence[Transfer]):
        """Validated (src, dst, size, weight) arrays of the network transfers of a phase."""
        n = len(transfers)
        src = np.fromiter((t.src for t in transfers), dtype=np.int64, count=n)
        dst = np.fromiter((t.dst for t in transfers), dtype=np.int64, count=n)
        size = np.fromiter((t.size_bytes for t in transfers), dtype=float, count=n)
        weight = np.fromiter((t.weight for t in transfers), dtype=float, count=n)
        bad = ~((size >= 0) & np.isfinite(size))
        if bad.any():
            raise NetworkError(f"transfer {transfers[int(np.argmax(bad))]}: size_bytes must be "
                               "finite and >= 0")
        bad = ~((weight >= 1) & (weight == np.floor(weight)))
        if bad.any():
            raise NetworkError(f"transfer {transfers[int(np.argmax(bad))]}: weight must be an "
                               "integer >= 1")
        n_dev = self.topo.n_devices
        bad = (src < 0) | (src >= n_dev) | (dst < 0) | (dst >= n_dev)
        if bad.any():
            raise NetworkError(f"transfer {transfers[int(np.argmax(bad))]}: devices must be in "
                               f"[0, {n_dev})")
        keep = (src != dst) & (size > 0)
        return src[keep], dst[keep], size[keep], weight[keep]

    def _rows(self, src: np.ndarray, dst: np.ndarray):
        """Incidence rows of routes ``src -> dst`` and each route's latency and overhead."""
        route = self.topo.route
        routes = [route(s, d) for s, d in zip(src.tolist(), dst.tolist())]
        lens = np.fromiter(map(len, routes), dtype=np.int64, count=len(routes))
        indptr = np.zeros(len(routes) + 1, dtype=np.int64)
        np.cumsum(lens, out=indptr[1:])
        indices = np.fromiter(itertools.chain.from_iterable(routes), dtype=np.int64,
                              count=int(indptr[-1]))
        rows = sp.csr_matrix((np.ones(indices.shape[0]), indices, indptr),
                             shape=(len(routes), self.n_links))
        starts = indptr[:-1]
        latency = np.add.reduceat(self.link_latency[indices], starts)
        overhead = np.maximum.reduceat(self.link_overhead[indices], starts)
        return rows, latency, overhead

    def phase_latency_s(self, transfers: Sequence[Transfer], steps: int = 1) -> float:
        """``steps`` x (largest path latency + largest per-step overhead) of ``transfers``.

        Transfers with ``src == dst`` or zero bytes do not count.
        """
        src, dst, _, _ = self._phase_arrays(transfers)
        if src.size == 0:
            return 0.0
        _, latency, overhead = self._rows(src, dst)
        return steps * (float(latency.max()) + float(overhead.max()))

    def transfer(self, transfers: Sequence[Transfer], steps: int = 1, tag: str = "") -> simpy.Event:
        """Start a phase; the returned event fires when its last transfer completes.

        All transfers start together after the phase latency (see
        :meth:`phase_latency_s`) and then share bandwidth with every other
        in-flight flow. Transfers with ``src == dst`` or zero bytes are free. A
        phase with no network transfer completes at once.

        Raises
        ------
        NetworkError
            On ``steps < 1``, a negative size, a weight < 1 or an unknown device.
        """
        if not (isinstance(steps, (int, np.integer)) and steps >= 1):
            raise NetworkError(f"steps must be an integer >= 1, got {steps!r}")
        src, dst, sizes, weights = self._phase_arrays(transfers)
        done = self.env.event()
        self.stats.phases_started += 1
        if src.size == 0:
            done.succeed()
            return done
        rows, latency, overhead = self._rows(src, dst)
        delay = steps * (float(latency.max()) + float(overhead.max()))
        pid = next(self._phase_ids)
        self._phase_event[pid] = done
        self._phase_tag[pid] = tag
        self.stats.flows_started += int(src.size)
        self.stats.unit_flows_started += int(weights.sum())
        timer = self.env.timeout(delay)
        timer.callbacks.append(lambda _ev: self._arrive(pid, rows, sizes, weights))
        return done

    # -- event handling ------------------------------------------------------

    def _advance(self) -> None:
        """Move every flow forward to ``env.now`` at its current rate."""
        dt = self.env.now - self._last_t
        if dt > 0 and self._remaining.shape[0]:
            self._remaining -= self._rates * dt
            self.stats.link_bytes += self._load * dt
        self._last_t = self.env.now

    def _arrive(self, pid: int, rows: sp.csr_matrix, sizes: np.ndarray, weights: np.ndarray) -> None:
        self._advance()
        n = sizes.shape[0]
        self._a = sp.vstack([self._a, rows], format="csr")
        self._remaining = np.concatenate([self._remaining, sizes])
        self._size = np.concatenate([self._size, sizes])
        self._weight = np.concatenate([self._weight, weights])
        self._phase = np.concatenate([self._phase, np.full(n, pid, dtype=np.int64)])
        self._rates = np.concatenate([self._rates, np.zeros(n)])
        self._due = np.zeros(self._remaining.shape[0], dtype=bool)
        self._phase_left[pid] = n
        self.stats.max_concurrent_flows = max(self.stats.max_concurrent_flows,
                                              self._remaining.shape[0])
        self._changed()

    def _changed(self) -> None:
        """The flow set changed: stale the pending wake-up, recompute once at this instant."""
        self._gen += 1
        if not self._update_pending:
            self._update_pending = True
            self.env.timeout(0).callbacks.append(self._update)

    def _update(self, _ev=None) -> None:
        self._update_pending = False
        self._advance()
        if self._remaining.shape[0] == 0:
            self._load = np.zeros(self.n_links)
            return
        self._rates = maxmin_rates(self._a, self.capacity, self._weight)
        self._load = self._a.T @ (self._weight * self._rates)
        self.stats.recomputations += 1
        left = np.maximum(self._remaining, 0.0)
        finish = left / self._rates
        dt = float(finish.min())
        self._due = finish <= dt * (1.0 + DONE_RTOL)
        self._gen += 1
        gen = self._gen
        self.env.timeout(dt).callbacks.append(lambda _ev: self._wake(gen))

    def _wake(self, gen: int) -> None:
        if gen != self._gen:
            return
        self._advance()
        done = self._due | (self._remaining <= self._size * DONE_RTOL)
        keep = ~done
        finished = self._phase[done]
        self._a = self._a[keep]
        self._remaining = self._remaining[keep]
        self._size = self._size[keep]
        self._weight = self._weight[keep]
        self._phase = self._phase[keep]
        self._rates = self._rates[keep]
        self._due = np.zeros(self._remaining.shape[0], dtype=bool)
        pids, counts = np.unique(finished, return_counts=True)
        for pid, count in zip(pids.tolist(), counts.tolist()):
            left = self._phase_left[pid] - count
            if left:
                self._phase_left[pid] = left
            else:
                del self._phase_left[pid]
                del self._phase_tag[pid]
                self._phase_event.pop(pid).succeed()
        self._changed()
