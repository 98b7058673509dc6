"""Reducing collectives (all-reduce, all-gather, reduce-scatter, broadcast) other than
the torus: ring, bidirectional ring, NCCL's rail ring, double binary tree,
halving-doubling, hierarchical (rails between domains) and in-network reduction
(NVLS, SHARP). Pure functions of member lists and sizes (cost models in
:mod:`simulator.network.collectives`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from simulator.network.phases import Transfer
from simulator.network.plans import CollectiveError, Phase, as_pipeline, bundle, equal_split, merge_parallel, torus_grid
from simulator.network.torus_collective import torus_phases

if TYPE_CHECKING:  # pragma: no cover
    from topologies.topology import Topology


def ring_load(op: str, n: int, size: float) -> tuple[int, float, float]:
    """(steps, bytes each rank sends, bytes each rank reduces) of a ring ``op`` on ``n``."""
    if op == "all-reduce":
        return 2 * (n - 1), 2 * (n - 1) * size / n, (n - 1) * size / n
    if op in ("all-gather", "reduce-scatter"):
        per_rank = (n - 1) * size / n
        return n - 1, per_rank, (per_rank if op == "reduce-scatter" else 0.0)
    raise CollectiveError(f"ring phases are not defined for {op!r}")  # pragma: no cover


def ring_phases(op: str, members: Sequence[int], size: float, bidir: bool = False) -> list[Phase]:
    """Collapsed ring: one phase of neighbour transfers (see module docstring)."""
    n = len(members)
    if n < 2:
        return []
    steps, per_rank, compute = ring_load(op, n, size)
    if bidir:
        half = per_rank / 2
        transfers = [Transfer(members[i], members[(i + 1) % n], half) for i in range(n)]
        transfers += [Transfer(members[i], members[(i - 1) % n], half) for i in range(n)]
    else:
        transfers = [Transfer(members[i], members[(i + 1) % n], per_rank) for i in range(n)]
    return [Phase(bundle(transfers), steps, compute)]


def intra_domain(op: str, members: Sequence[int], size: float, topo: Topology) -> list[Phase]:
    """Reduce-scatter / all-gather inside one domain: torus grid if possible, else ring."""
    if len(members) > 1 and torus_grid(members, topo) is not None:
        return torus_phases(op, members, size, topo)
    return ring_phases(op, members, size)


def rail_ring_phases(op: str, parts: list[list[int]], size: float) -> list[Phase]:
    """NCCL's ring across ``m`` domains of ``k`` members: ``k`` channels, one per rail.

    Channel ``c`` carries ``size/k`` around all ``n = m k`` ranks: in each domain it enters
    at member ``c`` (from rail ``c``), runs ``c, c+1, ..., c-1`` over NVLink, and the last
    member hands its data over NVLink to member ``c`` (PXN), whose NIC sends it on rail
    ``c`` to member ``c`` of the next domain. Every channel thus crosses each intra-domain
    link ``i -> i+1`` once and each rail link once: as flows, one intra-domain ring per
    domain carrying the full ring load (``2(n-1)/n S`` per rank for an all-reduce) and one
    ring per rail over the domains carrying ``1/k`` of it, all in one phase of ``2(n-1)``
    steps (``n-1`` for all-gather / reduce-scatter)."""
    if not equal_split(parts):
        raise CollectiveError(
            f"rail-ring needs the same number of members in every domain; got {[len(p) for p in parts]}"
        )
    m, k = len(parts), len(parts[0])
    n = m * k
    if n < 2:
        return []
    steps, per_rank, compute = ring_load(op, n, size)
    transfers = []
    if k > 1:
        for dom in parts:
            transfers += [Transfer(dom[i], dom[(i + 1) % k], per_rank) for i in range(k)]
    if m > 1:
        for c in range(k):
            transfers += [Transfer(parts[d][c], parts[(d + 1) % m][c], per_rank / k) for d in range(m)]
    return [Phase(bundle(transfers), steps, compute)]


def hierarchical_phases(
    op: str, parts: list[list[int]], size: float, topo: Topology, inter: str = "ring", pipelined: bool = False
) -> list[Phase]:
    if not equal_split(parts):
        raise CollectiveError(
            f"hierarchical algorithms need the same number of members in every domain; got {[len(p) for p in parts]}"
        )
    k = len(parts[0])
    rails = [[p[j] for p in parts] for j in range(k)]
    shard = size / k

    def intra(kind: str) -> list[Phase]:
        return merge_parallel([intra_domain(kind, p, size, topo) for p in parts])

    def across(kind: str, total: float) -> list[Phase]:
        if inter == "sharp":
            return merge_parallel([in_network_phases(r, total, steps=1) for r in rails])
        return merge_parallel([ring_phases(kind, r, total) for r in rails])

    if op == "all-reduce":
        phases = intra("reduce-scatter") + across("all-reduce", shard) + intra("all-gather")
    elif op == "all-gather":
        phases = across("all-gather", shard) + intra("all-gather")
    else:
        phases = intra("reduce-scatter") + across("reduce-scatter", shard)
    return as_pipeline(phases) if pipelined else phases


def in_network_phases(members: Sequence[int], size: float, steps: int) -> list[Phase]:
    """In-switch reduction: each member's link(s) into the switch tree carry ``size``
    once per direction, reproduced by a ring of transfers (module docstring)."""
    n = len(members)
    if n < 2:
        return []
    transfers = [Transfer(members[i], members[(i + 1) % n], size) for i in range(n)]
    return [Phase(bundle(transfers), steps, 0.0, in_network=True)]


def heap_tree_edges(order: Sequence[int]) -> tuple[list[tuple[int, int]], int]:
    """(parent, child) edges of the heap-ordered binary tree over ``order``, and its depth."""
    edges = [(order[(i - 1) // 2], order[i]) for i in range(1, len(order))]
    depth = int(math.floor(math.log2(len(order)))) if order else 0
    return edges, depth


def tree_phases(op: str, members: Sequence[int], size: float) -> list[Phase]:
    n = len(members)
    if n < 2:
        return []
    if op == "broadcast":
        edges, depth = heap_tree_edges(members)
        return [Phase(bundle(Transfer(p, c, size) for p, c in edges), depth)]
    half = size / 2
    transfers = []
    depth = 0
    for order in (list(members), list(reversed(members))):
        edges, d = heap_tree_edges(order)
        depth = max(depth, d)
        for p, c in edges:
            transfers.append(Transfer(c, p, half))  # reduce up
            transfers.append(Transfer(p, c, half))  # broadcast down
    return [Phase(bundle(transfers), 2 * depth, size)]


def halving_doubling_phases(op: str, members: Sequence[int], size: float) -> list[Phase]:
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
        rs.append(Phase(bundle(pairs), 1, amount))
    for j in range(k, 0, -1):
        dist = p >> j
        amount = size / (1 << j)
        ag.append(Phase(bundle(Transfer(core[i], core[i ^ dist], amount) for i in range(p)), 1))
    if op == "reduce-scatter":
        return rs
    if op == "all-gather":
        return ag
    fold = [Phase(bundle(Transfer(extra[i], core[i], size) for i in range(len(extra))), 1, size)]
    unfold = [Phase(bundle(Transfer(core[i], extra[i], size) for i in range(len(extra))), 1)]
    return (fold if extra else []) + rs + ag + (unfold if extra else [])


# ---- closed forms: one collective alone on the network (simulator.studies.search.network_model) ----
# Each returns (seconds per byte of the collective's size, latency seconds), per device and
# direction at the link bandwidths given (already scaled by their efficiencies); the tests
# (tests/test_closed_forms.py) hold each against its plan above, simulated alone.


def ring_time(op: str, n: int, bw: float, hop_s: float) -> tuple[float, float]:
    """:func:`ring_phases`: ``(n-1)/n`` of the buffer per step over ``n-1`` steps (twice for an
    all-reduce), each step a hop's latency."""
    f = 2 if op == "all-reduce" else 1
    return f * (n - 1) / n / bw, f * (n - 1) * hop_s


def nvls_time(n: int, bw: float, hop_s: float, efficiency: float) -> tuple[float, float]:
    """NVLink SHARP all-reduce inside one domain (:func:`in_network_phases`, 2 steps): each
    link carries ``S (n+1)/n`` once, at the calibration's NVLS efficiency."""
    return (n + 1) / n / (bw * efficiency), 2 * hop_s


def rail_ring_time(op: str, n: int, k: int, up_bw: float, out_bw: float, hop_s: float) -> tuple[float, float]:
    """:func:`rail_ring_phases`: NCCL's ring, one channel per rail: the whole ring load on the
    domain links and ``1/k`` of it on each NIC, at once."""
    f = 2 if op == "all-reduce" else 1
    return f * (n - 1) / n * max(1 / up_bw, 1 / (k * out_bw)), f * (n - 1) * hop_s


def sharp_time(k: int, up_bw: float, out_bw: float, hop_s: float) -> tuple[float, float]:
    """SHARP all-reduce across domains of ``k`` (:func:`in_network_phases` beside the domain
    reduce-scatter and all-gather, pipelined): the domain legs and ``S/k`` into the switch."""
    return max(2 * (k - 1) / k / up_bw, 1 / k / out_bw), (2 * (k - 1) + 1) * hop_s
