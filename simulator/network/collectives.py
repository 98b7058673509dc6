"""Collective algorithms compiled into phases of routed point-to-point transfers.

A :class:`CollectivePlan` is a sequence of :class:`Phase` objects; each phase is
one :meth:`FlowNetwork.transfer` call (all its transfers start together, the phase
ends when the last one completes). :func:`run_collective` runs the phases in order.

Size convention (nccl-tests, ``PERFORMANCE.md``): ``size_bytes`` is the buffer per
rank for all-reduce and broadcast, the total output for all-gather, the total
input for reduce-scatter, the per-rank total send buffer for all-to-all and the
message for send-recv.

Collapsing
----------
A ring collective runs ``s`` bulk-synchronous steps whose flow patterns are
identical (every rank sends one chunk to its successor). We compile them into ONE
phase of ``n`` neighbour transfers of ``s x chunk`` bytes with ``steps=s``: the
phase pays ``s`` latencies and then moves the bytes of all steps at the max-min
rate. Alone on a ring this is exactly ``s (alpha + chunk / B)``; it stays exact
whenever the contention seen by the collective is constant over its duration (it
smooths out changes of contention that would fall between two steps). The same
holds for each axis of the torus algorithm and for pipelined trees.

Algorithms (``ALGORITHMS``) and their cost alone on an idle network, with ``n``
ranks, ``S`` bytes, per-step latency ``a`` and link bandwidth ``B``:

* ``ring`` -- all-reduce ``2(n-1)(a + S/(nB))``; all-gather / reduce-scatter
  ``(n-1)(a + S/(nB))``; broadcast is a pipelined chain ``(n-1)a + S/B``.
* ``ring-bidir`` -- two rings in opposite directions, each with half the data:
  bandwidth term halved where both directions of a link are free.
* ``tree`` -- all-reduce by a double binary tree (Sanders, Speck & Traeff 2009;
  NCCL): two binary trees, each reducing then broadcasting half the buffer,
  pipelined so that reduce and broadcast traffic flow concurrently. Tree 1 is
  heap-ordered over the ranks, tree 2 its mirror (rank ``n-1-i``), so for even ``n``
  every rank is interior in at most one tree. A rank sends up to ``2S`` in total
  (``S/2`` up + ``S`` down in the tree where it is interior, ``S/2`` up as a leaf of
  the other): cost ``2 d a + 2S/B`` on a crossbar, ``d`` the tree depth. Broadcast
  by ``tree``: one heap-ordered tree rooted at ``group[0]``, pipelined:
  ``d a + 2S/B`` (a parent feeds two children).
* ``halving-doubling`` -- Rabenseifner: reduce-scatter by recursive halving
  (``log2 n`` pairwise exchanges of ``S/2, S/4, ..., S/n``) then all-gather by
  recursive doubling; on a crossbar ``2 log2(n) a + 2 (n-1)/n S/B``. For ``n`` not a
  power of two the all-reduce first folds the ``r = n - 2^k`` extra ranks into
  partners (one exchange of ``S``) and unfolds the result at the end (MPICH's
  approach); all-gather / reduce-scatter fall back to ``ring`` (the plan says so).
* ``torus`` -- dimension by dimension over the ``D`` axes the group spans (it must
  be a grid of one pod's torus: per axis an evenly spaced set of coordinates, e.g. a
  box, or every other row of a plane, which is what a mesh axis laid out with a
  stride on the torus gets), on all axes at once: the buffer is split into ``D``
  shares and share ``i`` reduce-scatters along the axes in the order rotated by ``i``
  (``i, i+1, ..., i-1``), then all-gathers back in reverse order, so that at every
  stage each axis carries one share ("How to Scale Your Model", TPU chapter: a
  collective over several axes gets the bandwidth of every axis; XLA splits the data
  the same way). The ``j``-th stages of all shares form one phase of concurrent flows
  on different axes' links; on a cube each stage's shares take equal time, otherwise
  the phase lasts as long as its slowest share. An axis that the group covers at equal
  spacing (whole, or every ``L/m``-th position) and that wraps, with ``m > 2`` members,
  is a bidirectional ring (its neighbour hops use every link of the axis once): ``(m-1)(a + d/(2mB))`` for ``d`` bytes
  per rank on that axis. Any other axis (no wrap-around, or only part of it in the
  group) is a line, run as a bidirectional chain: the link from position ``i`` to
  ``i+1`` carries the ``m-1-i`` chunks owned further right, so the busiest link
  carries ``(m-1) d / m`` and the cost is ``(m-1)(a + d/(mB))`` -- twice the
  bandwidth term of the wrapped axis, as "How to Scale Your Model" notes for
  tori without wrap-around. On a wrapped ``m^D`` cube an all-reduce costs
  ``2 D (m-1) a + 2 (1 - 1/n) S / (2 D B)``: ``D`` times the bandwidth of one axis.
  Members ``s`` positions apart on an axis exchange over ``s``-hop routes (latency
  ``s a`` per step); on a line those routes are disjoint, so the bandwidth term is
  that of adjacent members.
* ``rail-ring`` -- NCCL's ring across ``m`` domains of ``k`` members: ``k``
  channels (one per rail, i.e. per local index) of ``S/k`` each, every channel a
  ring over all ``n`` ranks that enters and leaves each domain through its own rail
  (the domain's last member hands the data to the rail's member over NVLink, NCCL's
  PXN). As flows, in one phase of ``2(n-1)`` steps (``n-1`` for all-gather /
  reduce-scatter): a ring inside each domain carrying the whole per-rank ring load
  ``2(n-1)/n S`` and a ring over the domains on each rail carrying ``1/k`` of it.
  Alone: ``2(n-1) a + 2(n-1)/n S max(1/B_dom, 1/(k B_nic))`` -- busbw is the smaller
  of the NVLink ring bandwidth and the domain's total NIC bandwidth, as nccl-tests
  measure across nodes (NVIDIA/nccl-tests #319, NVIDIA/nccl #812).
* ``hierarchical`` -- intra-domain reduce-scatter, then an all-reduce of the
  ``S/k`` shard over the ``m`` members with the same local index (rail-aligned:
  one per domain), then intra-domain all-gather; intra-domain steps use ``torus``
  when the domain's members form a torus grid, ``ring`` otherwise. All-gather runs
  rails first then intra-domain; reduce-scatter intra first then rails. Needs the
  same number ``k`` of members in every domain. On a switched cluster the stages are
  *pipelined* (chunks stream through them, NCCL-style): all their transfers form
  one phase, so the stages share the links they have in common (the intra-domain
  reduce-scatter and all-gather share NVLink) and the latencies of all stages are
  paid once each: ``(2(k-1) + 2(m-1)) a + max(2(k-1)/k S/B_dom, 2(m-1)/m S/(k B_nic))``.
  Across the pods of a torus cluster they run one after another (the DCN stage
  dominates; one phase would charge every ICI step the DCN latency).
* ``nvls`` -- NVLink SHARP all-reduce inside one NVSwitch domain (``topo.nvls``):
  every GPU pushes its buffer through ``multimem.ld_reduce`` and the reduced
  slice back with a multicast ``multimem.st``, so its link to the switch carries
  ``S (1 + 1/n)`` in each direction. Because the builders model a domain as one
  crossbar switch, that load is reproduced by ``n`` device-to-device transfers
  ``i -> i+1`` of ``S (n+1)/n`` bytes each (each uplink and each downlink then
  carries it exactly once), with ``steps=2`` (reduce, then multicast).
  Throughput is further scaled by the calibration's ``algorithm_efficiency``.
* ``sharp`` -- in-network reduction on the scale-out fabric (``topo.sharp``):
  intra-domain reduce-scatter, then each rail's members send their ``S/k`` shard
  into the switch tree once and receive the result once (modelled as above by a
  rail ring of transfers of ``S/k``: on a fat-tree it loads each NIC link and each
  leaf-spine link exactly once per direction, like the aggregation tree), then
  intra-domain all-gather; pipelined like ``hierarchical`` (NCCL's CollNet).
* ``direct`` -- all-to-all: every ordered pair exchanges ``S/n`` in one phase.
* ``hierarchical-a2a`` -- DeepSeek-style all-to-all across ``m`` domains of ``k``:
  rank ``(d, i)`` sends the ``k S/n`` bytes bound for domain ``d'`` to its rail peer
  ``(d', i)`` (IB, one rail), which forwards them over NVLink to their local
  destinations; forwarding is pipelined with the rail traffic (DeepSeek-V3 technical
  report §3.2.2: IB sending, IB-to-NVLink forwarding and NVLink receiving overlap),
  so both run in one phase of 2 steps: rail transfers of ``f k S/n`` and intra-domain
  transfers of ``m S/n`` (``S/n`` of its own plus ``(m-1) S/n`` forwarded). ``f`` is
  the plan's ``scaleout_fraction`` (default 1): under node-limited routing a token
  crosses the scale-out network once per destination node, not once per expert, so
  the rail carries ``f = (distinct nodes per token) / top_k`` of the routed copies
  while NVLink still delivers every copy. Alone: ``2 a_rail + max((m-1) f k S/(n
  B_nic), (k-1) m S/(n B_dom))`` -- the larger of the IB and NVLink times, not their
  sum.
* ``p2p`` -- send-recv, one transfer ``group[0] -> group[1]``.

Algorithm choice (:func:`choose_algorithm`), in order:

1. send-recv -> ``p2p``; broadcast -> ``ring``.
2. all-to-all -> ``hierarchical-a2a`` on a switched topology when the group spans
   several domains with the same number (> 1) of members in each; else ``direct``.
   With ``scaleout_fraction < 1`` (node-limited routing) ``hierarchical-a2a`` whenever
   the group spans several domains with the same number of members in each.
3. all-reduce / all-gather / reduce-scatter on a torus topology: ``torus`` when
   the group is a grid of the torus (whole axes, contiguous parts, or evenly
   spaced positions per axis; one pod),
   ``hierarchical`` when it spans several pods with the same number of members
   per pod, else ``ring``.
4. Other topologies: group inside one domain -> ``nvls`` if ``topo.nvls`` and
   all-reduce, else ``ring``; across domains with equal members per domain ->
   ``sharp`` if ``topo.sharp`` and all-reduce, else ``rail-ring`` when more than
   one member per domain and ``ring`` when one; unequal -> ``ring``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterable, Optional, Sequence, Union

import numpy as np

from simulator.errors import NetworkError
from simulator.network.flows import FlowNetwork, Transfer
from workloads.enums import COLLECTIVE_OPS

if TYPE_CHECKING:  # pragma: no cover
    from topologies.topology import Topology

OPS = COLLECTIVE_OPS
ALGORITHMS = (
    "ring",
    "ring-bidir",
    "tree",
    "halving-doubling",
    "torus",
    "hierarchical",
    "nvls",
    "sharp",
    "direct",
    "hierarchical-a2a",
    "p2p",
    "rail-ring",
)

_REDUCING = ("all-reduce", "all-gather", "reduce-scatter")
VALID_ALGORITHMS = {
    "all-reduce": (
        "ring",
        "ring-bidir",
        "tree",
        "halving-doubling",
        "torus",
        "hierarchical",
        "nvls",
        "sharp",
        "rail-ring",
    ),
    "all-gather": ("ring", "ring-bidir", "halving-doubling", "torus", "hierarchical", "rail-ring"),
    "reduce-scatter": ("ring", "ring-bidir", "halving-doubling", "torus", "hierarchical", "rail-ring"),
    "all-to-all": ("direct", "hierarchical-a2a"),
    "broadcast": ("ring", "tree"),
    "send-recv": ("p2p",),
}


class CollectiveError(NetworkError):
    """A collective that cannot be planned: bad op, algorithm, group or size."""


@dataclass(frozen=True)
class Phase:
    """Transfers that start together; ``steps`` latencies are paid before they flow.

    ``compute_bytes`` is the reduction work per rank in this phase (bytes reduced);
    ``in_network`` marks phases whose reduction happens in switches (their bytes
    are scaled by the calibration's ``algorithm_efficiency``).
    """

    transfers: tuple[Transfer, ...]
    steps: int = 1
    compute_bytes: float = 0.0
    in_network: bool = False


@dataclass(frozen=True)
class CollectivePlan:
    op: str
    algorithm: str
    group: tuple[int, ...]
    size_bytes: float
    phases: tuple[Phase, ...]


def bus_bandwidth_factor(op: str, n: int) -> float:
    """busbw / algbw of ``op`` on ``n`` ranks (nccl-tests ``PERFORMANCE.md``)."""
    _check_op(op)
    if n < 1:
        raise CollectiveError(f"group size must be >= 1, got {n!r}")
    if op == "all-reduce":
        return 2.0 * (n - 1) / n
    if op in ("all-gather", "reduce-scatter", "all-to-all"):
        return (n - 1) / n
    return 1.0


def _check_op(op: str) -> None:
    if op not in OPS:
        raise CollectiveError(f"unknown collective op {op!r}; allowed: {', '.join(OPS)}")


# ---------------------------------------------------------------------------
# Group structure helpers
# ---------------------------------------------------------------------------

#: Groups of at most this many members are split by domain in plain Python.
_FEW_MEMBERS = 256


def _domains(group: Sequence[int], topo: "Topology", by_pod: bool = False) -> list[list[int]]:
    """Members grouped by domain (or pod), domains in order of first appearance."""
    keys = topo.domains_of(group, by_pod=by_pod)
    if keys.size <= _FEW_MEMBERS:
        out: dict[int, list[int]] = {}
        for d, key in zip(group, keys.tolist()):
            out.setdefault(key, []).append(d)
        return list(out.values())
    _, first, which = np.unique(keys, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first, kind="stable"), kind="stable")[which.ravel()]  # by first appearance
    order = np.argsort(rank, kind="stable")  # members keep order
    members = np.asarray(group, dtype=np.int64)[order].tolist()
    bounds = np.r_[0, np.cumsum(np.bincount(rank))].tolist()
    return [members[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _equal_split(parts: list[list[int]]) -> bool:
    return len({len(p) for p in parts}) == 1


def _torus_grid(group: Sequence[int], topo: "Topology") -> Optional[list[tuple[int, ...]]]:
    """Per axis, the sorted coordinates of ``group`` if it is a *grid* of one pod's torus:
    the Cartesian product of one evenly spaced set of coordinates per axis (a box when
    every spacing is 1; e.g. every other row of a plane). ``None`` otherwise."""
    if topo.kind != "torus" or topo.torus_shape is None:
        return None
    if len({topo.pod_of(d) for d in group}) != 1:
        return None
    coords = [topo.torus_coords(d) for d in group]
    grid = []
    for a in range(len(topo.torus_shape)):
        values = tuple(sorted({c[a] for c in coords}))
        step = values[1] - values[0] if len(values) > 1 else 1
        if values != tuple(range(values[0], values[0] + step * len(values), step)):
            return None
        grid.append(values)
    if math.prod(len(v) for v in grid) != len(set(group)):
        return None
    return grid


def _is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def choose_algorithm(op: str, group: Sequence[int], topo: "Topology") -> str:
    """Default algorithm for ``op`` on ``group`` (rule in the module docstring)."""
    _check_op(op)
    group = tuple(group)
    if op == "send-recv":
        return "p2p"
    if op == "broadcast":
        return "ring"
    domains = _domains(group, topo)
    if op == "all-to-all":
        if topo.kind == "switched" and len(domains) > 1 and _equal_split(domains) and len(domains[0]) > 1:
            return "hierarchical-a2a"
        return "direct"
    if topo.kind == "torus":
        if _torus_grid(group, topo) is not None:
            return "torus"
        pods = _domains(group, topo, by_pod=True)
        if len(pods) > 1 and _equal_split(pods):
            return "hierarchical"
        return "ring"
    if len(domains) == 1:
        return "nvls" if (topo.nvls and op == "all-reduce" and len(group) > 1) else "ring"
    if not _equal_split(domains):
        return "ring"
    if topo.sharp and op == "all-reduce":
        return "sharp"
    return "rail-ring" if len(domains[0]) > 1 else "ring"


# ---------------------------------------------------------------------------
# Phase builders (pure functions of member lists and sizes)
# ---------------------------------------------------------------------------


def _bundle(transfers: Iterable[Transfer]) -> tuple[Transfer, ...]:
    """Merge identical (src, dst, size) transfers into one of summed weight; drop no-ops."""
    live = [t for t in transfers if t.src != t.dst and t.size_bytes > 0]
    if len({(t.src, t.dst, t.size_bytes) for t in live}) == len(live) and all(t.incidence is None for t in live):
        return tuple(live)  # nothing to merge (a ring, a tree)
    merged: dict[tuple[int, int, float], int] = {}
    for t in live:
        key = (t.src, t.dst, t.size_bytes)
        merged[key] = merged.get(key, 0) + t.weight
    return tuple(Transfer(s, d, b, w) for (s, d, b), w in merged.items())


def _merge_parallel(phase_lists: Sequence[Sequence[Phase]]) -> list[Phase]:
    """i-th phases of several independent sub-plans merged into one phase each."""
    out = []
    for i in range(max((len(p) for p in phase_lists), default=0)):
        parts = [p[i] for p in phase_lists if i < len(p)]
        out.append(
            Phase(
                _bundle(t for ph in parts for t in ph.transfers),
                max(ph.steps for ph in parts),
                max(ph.compute_bytes for ph in parts),
                any(ph.in_network for ph in parts),
            )
        )
    return out


def _pipelined(phases: Sequence[Phase]) -> list[Phase]:
    """Phases run as one pipeline: all their transfers flow at once (chunks of the buffer
    stream through every stage), so the pipeline lasts as long as its slowest stage under
    max-min sharing; stages on the same links share them. The latencies of all stages
    are paid once each (pipeline fill): ``steps`` is their sum."""
    phases = list(phases)
    if len(phases) <= 1:
        return phases
    return [
        Phase(
            _bundle(t for ph in phases for t in ph.transfers),
            sum(ph.steps for ph in phases),
            sum(ph.compute_bytes for ph in phases),
            any(ph.in_network for ph in phases),
        )
    ]


def _ring_load(op: str, n: int, size: float) -> tuple[int, float, float]:
    """(steps, bytes each rank sends, bytes each rank reduces) of a ring ``op`` on ``n``."""
    if op == "all-reduce":
        return 2 * (n - 1), 2 * (n - 1) * size / n, (n - 1) * size / n
    if op in ("all-gather", "reduce-scatter"):
        per_rank = (n - 1) * size / n
        return n - 1, per_rank, (per_rank if op == "reduce-scatter" else 0.0)
    raise CollectiveError(f"ring phases are not defined for {op!r}")  # pragma: no cover


def _ring(op: str, members: Sequence[int], size: float, bidir: bool = False) -> list[Phase]:
    """Collapsed ring: one phase of neighbour transfers (see module docstring)."""
    n = len(members)
    if n < 2:
        return []
    steps, per_rank, compute = _ring_load(op, n, size)
    if bidir:
        half = per_rank / 2
        transfers = [Transfer(members[i], members[(i + 1) % n], half) for i in range(n)]
        transfers += [Transfer(members[i], members[(i - 1) % n], half) for i in range(n)]
    else:
        transfers = [Transfer(members[i], members[(i + 1) % n], per_rank) for i in range(n)]
    return [Phase(_bundle(transfers), steps, compute)]


def _line_transfers(line: Sequence[int], chunk: float, gather: bool) -> list[Transfer]:
    """Bidirectional chain: link i->i+1 carries the chunks owned right of i (reduce-scatter)
    or left of i+1 (all-gather), and symmetrically leftwards."""
    m = len(line)
    out = []
    for i in range(m - 1):
        right = (i + 1) if gather else (m - 1 - i)
        left = (m - 1 - i) if gather else (i + 1)
        out.append(Transfer(line[i], line[i + 1], right * chunk))
        out.append(Transfer(line[i + 1], line[i], left * chunk))
    return out


def _axis_phase(op: str, lines: Sequence[Sequence[int]], ring: bool, data: float) -> Phase:
    """Reduce-scatter (``op='reduce-scatter'``) or all-gather of ``data`` bytes per rank
    (before scatter / after gather) along parallel lines or rings of one axis."""
    m = len(lines[0])
    chunk = data / m
    transfers: list[Transfer] = []
    for line in lines:
        if ring:
            for i in range(m):
                transfers.append(Transfer(line[i], line[(i + 1) % m], (m - 1) * chunk / 2))
                transfers.append(Transfer(line[i], line[(i - 1) % m], (m - 1) * chunk / 2))
        else:
            transfers += _line_transfers(line, chunk, gather=(op == "all-gather"))
    compute = (m - 1) * chunk if op == "reduce-scatter" else 0.0
    return Phase(_bundle(transfers), m - 1, compute)


def _torus(op: str, members: Sequence[int], size: float, topo: "Topology") -> list[Phase]:
    grid = _torus_grid(members, topo)
    if grid is None:
        raise CollectiveError(
            "torus algorithm needs a group that is a box (or an evenly spaced grid) of one pod's torus"
        )
    pod = topo.pod_of(members[0])
    shape, wrap = topo.torus_shape, topo.torus_wrap
    axes = [a for a, v in enumerate(grid) if len(v) > 1]

    def lines_along(a: int) -> list[list[int]]:
        others = [grid[b] if b != a else grid[b][:1] for b in range(len(grid))]
        out = []
        for base in _product(others):
            line = []
            for v in grid[a]:
                c = list(base)
                c[a] = v
                line.append(topo.device_at(c, pod))
            out.append(line)
        return out

    def is_ring(a: int) -> bool:
        # The members cover the wrapped axis at equal spacing, so the hops between
        # neighbours (spacing links each) use every link of the axis once per direction.
        m = len(grid[a])
        return bool(wrap[a]) and m > 2 and m * (grid[a][1] - grid[a][0]) == shape[a]

    # One share of size/D per axis, share i running the axes in the order rotated by i, so
    # that at every stage each axis carries one share ("How to Scale Your Model": a
    # collective over several axes gets bandwidth from every axis). The i-th stages of all
    # shares run as one phase (concurrent flows on different axes' links).
    d = len(axes)
    share = size / d
    orders = [axes[i:] + axes[:i] for i in range(d)]

    def rs_stage(order: list[int], j: int) -> Phase:
        data = share / math.prod(len(grid[a]) for a in order[:j])
        return _axis_phase("reduce-scatter", lines_along(order[j]), is_ring(order[j]), data)

    def ag_stage(order: list[int], j: int) -> Phase:
        data = share / math.prod(len(grid[a]) for a in order[:j])
        return _axis_phase("all-gather", lines_along(order[j]), is_ring(order[j]), data)

    rs = _merge_parallel([[rs_stage(o, j) for j in range(d)] for o in orders])
    ag = _merge_parallel([[ag_stage(o, j) for j in reversed(range(d))] for o in orders])
    if op == "all-reduce":
        return rs + ag
    if op == "reduce-scatter":
        return rs
    return ag


def _product(ranges: Sequence[range]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for r in ranges:
        out = [t + (v,) for t in out for v in r]
    return out


def _intra(op: str, members: Sequence[int], size: float, topo: "Topology") -> list[Phase]:
    """Reduce-scatter / all-gather inside one domain: torus grid if possible, else ring."""
    if len(members) > 1 and _torus_grid(members, topo) is not None:
        return _torus(op, members, size, topo)
    return _ring(op, members, size)


def _rail_ring(op: str, parts: list[list[int]], size: float) -> list[Phase]:
    """NCCL's ring across ``m`` domains of ``k`` members: ``k`` channels, one per rail.

    Channel ``c`` carries ``size/k`` around all ``n = m k`` ranks: in each domain it enters
    at member ``c`` (from rail ``c``), runs ``c, c+1, ..., c-1`` over NVLink, and the last
    member hands its data over NVLink to member ``c`` (PXN), whose NIC sends it on rail
    ``c`` to member ``c`` of the next domain. Every channel thus crosses each intra-domain
    link ``i -> i+1`` once and each rail link once: as flows, one intra-domain ring per
    domain carrying the full ring load (``2(n-1)/n S`` per rank for an all-reduce) and one
    ring per rail over the domains carrying ``1/k`` of it, all in one phase of ``2(n-1)``
    steps (``n-1`` for all-gather / reduce-scatter)."""
    if not _equal_split(parts):
        raise CollectiveError(
            f"rail-ring needs the same number of members in every domain; got {[len(p) for p in parts]}"
        )
    m, k = len(parts), len(parts[0])
    n = m * k
    if n < 2:
        return []
    steps, per_rank, compute = _ring_load(op, n, size)
    transfers = []
    if k > 1:
        for dom in parts:
            transfers += [Transfer(dom[i], dom[(i + 1) % k], per_rank) for i in range(k)]
    if m > 1:
        for c in range(k):
            transfers += [Transfer(parts[d][c], parts[(d + 1) % m][c], per_rank / k) for d in range(m)]
    return [Phase(_bundle(transfers), steps, compute)]


def _hierarchical(
    op: str, parts: list[list[int]], size: float, topo: "Topology", inter: str = "ring", pipelined: bool = False
) -> list[Phase]:
    if not _equal_split(parts):
        raise CollectiveError(
            f"hierarchical algorithms need the same number of members in every domain; got {[len(p) for p in parts]}"
        )
    k = len(parts[0])
    rails = [[p[j] for p in parts] for j in range(k)]
    shard = size / k

    def intra(kind: str) -> list[Phase]:
        return _merge_parallel([_intra(kind, p, size, topo) for p in parts])

    def across(kind: str, total: float) -> list[Phase]:
        if inter == "sharp":
            return _merge_parallel([_in_network(r, total, steps=1) for r in rails])
        return _merge_parallel([_ring(kind, r, total) for r in rails])

    if op == "all-reduce":
        phases = intra("reduce-scatter") + across("all-reduce", shard) + intra("all-gather")
    elif op == "all-gather":
        phases = across("all-gather", shard) + intra("all-gather")
    else:
        phases = intra("reduce-scatter") + across("reduce-scatter", shard)
    return _pipelined(phases) if pipelined else phases


def _in_network(members: Sequence[int], size: float, steps: int) -> list[Phase]:
    """In-switch reduction: each member's link(s) into the switch tree carry ``size``
    once per direction, reproduced by a ring of transfers (module docstring)."""
    n = len(members)
    if n < 2:
        return []
    transfers = [Transfer(members[i], members[(i + 1) % n], size) for i in range(n)]
    return [Phase(_bundle(transfers), steps, 0.0, in_network=True)]


def _heap_tree_edges(order: Sequence[int]) -> tuple[list[tuple[int, int]], int]:
    """(parent, child) edges of the heap-ordered binary tree over ``order``, and its depth."""
    edges = [(order[(i - 1) // 2], order[i]) for i in range(1, len(order))]
    depth = int(math.floor(math.log2(len(order)))) if order else 0
    return edges, depth


def _tree(op: str, members: Sequence[int], size: float) -> list[Phase]:
    n = len(members)
    if n < 2:
        return []
    if op == "broadcast":
        edges, depth = _heap_tree_edges(members)
        return [Phase(_bundle(Transfer(p, c, size) for p, c in edges), depth)]
    half = size / 2
    transfers = []
    depth = 0
    for order in (list(members), list(reversed(members))):
        edges, d = _heap_tree_edges(order)
        depth = max(depth, d)
        for p, c in edges:
            transfers.append(Transfer(c, p, half))  # reduce up
            transfers.append(Transfer(p, c, half))  # broadcast down
    return [Phase(_bundle(transfers), 2 * depth, size)]


def _halving_doubling(op: str, members: Sequence[int], size: float) -> list[Phase]:
    n = len(members)
    p = 1 << (n.bit_length() - 1)
    core = list(members[:p])
    extra = list(members[p:])
    k = p.bit_length() - 1
    rs, ag = [], []
    for j in range(1, k + 1):
        dist = p >> j
        amount = size / (1 << j)
        pairs = [Transfer(core[i], core[i ^ dist], amount) for i in range(p)]
        rs.append(Phase(_bundle(pairs), 1, amount))
    for j in range(k, 0, -1):
        dist = p >> j
        amount = size / (1 << j)
        ag.append(Phase(_bundle(Transfer(core[i], core[i ^ dist], amount) for i in range(p)), 1))
    if op == "reduce-scatter":
        return rs
    if op == "all-gather":
        return ag
    fold = [Phase(_bundle(Transfer(extra[i], core[i], size) for i in range(len(extra))), 1, size)]
    unfold = [Phase(_bundle(Transfer(core[i], extra[i], size) for i in range(len(extra))), 1)]
    return (fold if extra else []) + rs + ag + (unfold if extra else [])


def _direct_a2a(members: Sequence[int], size: float) -> list[Phase]:
    n = len(members)
    if n < 2:
        return []
    chunk = size / n
    return [Phase(tuple(Transfer(s, d, chunk) for s in members for d in members if s != d), 1)]


def _hierarchical_a2a(parts: list[list[int]], size: float, scaleout_fraction: float = 1.0) -> list[Phase]:
    """Rail hop and NVLink fan-out as one pipelined phase (module docstring); the rail
    carries ``scaleout_fraction`` of the ``k S/n`` routed copies bound for each domain."""
    if not _equal_split(parts):
        raise CollectiveError(
            f"hierarchical-a2a needs the same number of members in every domain; got {[len(p) for p in parts]}"
        )
    m, k = len(parts), len(parts[0])
    n = m * k
    if m == 1:
        return _direct_a2a(parts[0], size)
    chunk = size / n
    rail = scaleout_fraction * k * chunk
    transfers = []
    for d, dom in enumerate(parts):
        for i, src in enumerate(dom):
            for d2 in range(m):
                if d2 != d:
                    transfers.append(Transfer(src, parts[d2][i], rail))  # rail
            for j, dst in enumerate(dom):
                if j != i:
                    transfers.append(Transfer(src, dst, m * chunk))  # own + forwarded
    return [Phase(tuple(transfers), 2)]


# ---------------------------------------------------------------------------
# Planning and running
# ---------------------------------------------------------------------------


def plan_collective(
    op: str,
    group: Sequence[int],
    size_bytes: float,
    topo: "Topology",
    algorithm: Optional[str] = None,
    scaleout_fraction: float = 1.0,
) -> CollectivePlan:
    """Compile ``op`` over ``group`` (ranks in order) into phases of routed transfers.

    ``scaleout_fraction`` (all-to-all only, ``0 < f <= 1``): the share of the routed
    copies that cross between domains under node-limited routing (see
    ``hierarchical-a2a`` in the module docstring); below 1 it implies that algorithm.

    Raises
    ------
    CollectiveError
        Unknown op or algorithm, an algorithm that does not apply to ``op`` or to
        this group/topology, a repeated or unknown device, a negative size, a
        ``scaleout_fraction`` outside (0, 1] or below 1 for anything but a
        ``hierarchical-a2a`` all-to-all.
    """
    _check_op(op)
    group = tuple(int(d) for d in group)
    if not group:
        raise CollectiveError("group is empty")
    if len(set(group)) != len(group):
        raise CollectiveError(f"group repeats a device: {group}")
    for d in group:
        if not 0 <= d < topo.n_devices:
            raise CollectiveError(f"device {d} is not in the topology (0..{topo.n_devices - 1})")
    if not (size_bytes >= 0) or size_bytes == float("inf"):
        raise CollectiveError(f"size_bytes must be finite and >= 0, got {size_bytes!r}")
    if not (0.0 < scaleout_fraction <= 1.0):
        raise CollectiveError(f"scaleout_fraction must be in (0, 1], got {scaleout_fraction!r}")
    node_limited = scaleout_fraction < 1.0
    if node_limited and op != "all-to-all":
        raise CollectiveError(f"scaleout_fraction < 1 applies to all-to-all only, not {op!r}")
    if algorithm is None:
        algorithm = choose_algorithm(op, group, topo)
        if node_limited:
            domains = _domains(group, topo)
            if len(domains) > 1 and _equal_split(domains):
                algorithm = "hierarchical-a2a"
    if node_limited and algorithm != "hierarchical-a2a" and len(_domains(group, topo)) > 1:
        raise CollectiveError(
            f"scaleout_fraction < 1 (node-limited routing) needs the hierarchical-a2a algorithm, not {algorithm!r}"
        )
    if algorithm not in ALGORITHMS:
        raise CollectiveError(f"unknown algorithm {algorithm!r}; allowed: {', '.join(ALGORITHMS)}")
    if algorithm not in VALID_ALGORITHMS[op]:
        raise CollectiveError(
            f"algorithm {algorithm!r} does not implement {op!r}; allowed: {', '.join(VALID_ALGORITHMS[op])}"
        )
    n = len(group)
    size = float(size_bytes)
    if op == "send-recv":
        if n != 2:
            raise CollectiveError(f"send-recv needs a group of 2 (src, dst), got {n}")
        phases = [Phase((Transfer(group[0], group[1], size),), 1)] if size > 0 else []
        return CollectivePlan(op, algorithm, group, size, tuple(phases))
    if n == 1 or size == 0:
        return CollectivePlan(op, algorithm, group, size, ())

    if algorithm == "ring":
        phases = (
            _ring(op, group, size)
            if op in _REDUCING
            else [Phase(_bundle(Transfer(group[i], group[i + 1], size) for i in range(n - 1)), n - 1)]
        )
    elif algorithm == "ring-bidir":
        phases = _ring(op, group, size, bidir=True)
    elif algorithm == "tree":
        phases = _tree(op, group, size)
    elif algorithm == "halving-doubling":
        if op != "all-reduce" and not _is_pow2(n):
            algorithm = "ring"  # documented fallback
            phases = _ring(op, group, size)
        else:
            phases = _halving_doubling(op, group, size)
    elif algorithm == "torus":
        phases = _torus(op, group, size, topo)
    elif algorithm == "hierarchical":
        by_pod = topo.kind == "torus"
        phases = _hierarchical(op, _domains(group, topo, by_pod=by_pod), size, topo, pipelined=not by_pod)
    elif algorithm == "rail-ring":
        phases = _rail_ring(op, _domains(group, topo), size)
    elif algorithm == "nvls":
        if not topo.nvls:
            raise CollectiveError("nvls needs a topology with NVLink SHARP (topo.nvls)")
        if len(_domains(group, topo)) != 1:
            raise CollectiveError("nvls needs a group inside one NVLink domain")
        phases = _in_network(group, size * (n + 1) / n, steps=2)
    elif algorithm == "sharp":
        if not topo.sharp:
            raise CollectiveError("sharp needs a topology with in-network reduction (topo.sharp)")
        phases = _hierarchical(op, _domains(group, topo), size, topo, inter="sharp", pipelined=True)
    elif algorithm == "direct":
        phases = _direct_a2a(group, size)
    elif algorithm == "hierarchical-a2a":
        phases = _hierarchical_a2a(_domains(group, topo), size, scaleout_fraction)
    else:  # p2p for anything but send-recv is rejected by VALID_ALGORITHMS
        raise CollectiveError(f"algorithm {algorithm!r} cannot run {op!r}")  # pragma: no cover
    return CollectivePlan(op, algorithm, group, size, tuple(phases))


def run_collective(
    network: FlowNetwork,
    plan: Union[CollectivePlan, Sequence[CollectivePlan]],
    reduction_bytes_per_s: Optional[float] = None,
):
    """simpy process body: run the phases of ``plan`` one after another.

    Several plans (twin groups issued at the same instant by symmetric ranks) run
    their i-th phases merged into one :meth:`FlowNetwork.transfer` call. With
    ``reduction_bytes_per_s``, each phase is followed by its ``compute_bytes`` of
    reduction at that rate (default: reduction is free, overlapped with transfer).

    Use as ``env.process(run_collective(network, plan))``.
    """
    plans = [plan] if isinstance(plan, CollectivePlan) else list(plan)
    if reduction_bytes_per_s is not None and not reduction_bytes_per_s > 0:
        raise CollectiveError(f"reduction_bytes_per_s must be > 0, got {reduction_bytes_per_s!r}")
    yield from run_merged(network, merged_phases(network, plans), reduction_bytes_per_s)


def merged_phases(network: FlowNetwork, plans: Sequence[CollectivePlan]) -> tuple:
    """``((transfers, steps, compute_bytes), ...)``: the phases of ``plans`` as
    :func:`run_collective` hands them to ``network`` (see :func:`_merged_phase`);
    callers that run the same plans again and again keep this and call
    :func:`run_merged`."""
    n_phases = max((len(p.phases) for p in plans), default=0)
    return tuple(_merged_phase(network, plans, i) for i in range(n_phases))


def run_merged(network: FlowNetwork, phases: Sequence[tuple], reduction_bytes_per_s: Optional[float] = None):
    """simpy process body: run :func:`merged_phases` one after another."""
    for transfers, steps, compute in phases:
        yield network.transfer(transfers, steps)
        if reduction_bytes_per_s is not None and compute > 0:
            yield network.env.timeout(compute / reduction_bytes_per_s)


#: Merged phases remembered per network (``FlowNetwork.memo``) before it is cleared.
_MERGED_CACHE_MAX = 4096


def _merged_phase(network: FlowNetwork, plans: Sequence[CollectivePlan], i: int):
    """``(transfers, steps, compute_bytes)`` of the i-th phases of ``plans`` run as
    one network phase. ``transfers`` is one tuple per (plans, i) and network, so that
    :meth:`FlowNetwork.transfer` reuses its routed form for every repetition.

    Remembered in ``network.memo`` under the plans' ids: plans are immutable, so
    identity fixes content, and the entry keeps the plans alive so that their ids
    cannot be reused while it lives."""
    cache = network.memo
    key = ("collective-phase", tuple(map(id, plans)), i)
    hit = cache.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], plans)):
        return hit[1]
    cal = network.calibration
    parts: list = []
    steps, compute = 1, 0.0
    for p in plans:
        if i >= len(p.phases):
            continue
        ph = p.phases[i]
        steps = max(steps, ph.steps)
        compute = max(compute, ph.compute_bytes)
        scale = 1.0 / cal.algorithm_efficiency_of(p.algorithm) if ph.in_network else 1.0
        if scale == 1.0:
            parts.append(ph.transfers)
        else:
            parts.append(tuple(replace(t, size_bytes=t.size_bytes * scale) for t in ph.transfers))
    transfers = parts[0] if len(parts) == 1 else tuple(t for part in parts for t in part)
    out = (transfers, steps, compute)
    if len(cache) >= _MERGED_CACHE_MAX:
        cache.clear()
    cache[key] = (tuple(plans), out)
    return out
