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

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from simulator.network.alltoall import direct_a2a, hierarchical_a2a
from simulator.network.flows import FlowNetwork, Transfer
from simulator.network.plans import (
    REDUCING,
    CollectiveError,
    CollectivePlan,
    Phase,
    bundle,
    equal_split,
    split_by_domain,
    torus_grid,
)
from simulator.network.reductions import (
    halving_doubling_phases,
    hierarchical_phases,
    in_network_phases,
    rail_ring_phases,
    ring_phases,
    tree_phases,
)
from simulator.network.torus_collective import torus_phases
from workloads.enums import COLLECTIVE_OPS

if TYPE_CHECKING:  # pragma: no cover
    from topologies.topology import Topology

__all__ = [
    "ALGORITHMS",
    "OPS",
    "VALID_ALGORITHMS",
    "CollectiveError",
    "CollectivePlan",
    "Phase",
    "bus_bandwidth_factor",
    "choose_algorithm",
    "default_algorithm",
    "merged_phases",
    "plan_collective",
    "run_collective",
    "run_merged",
]

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


def _is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def default_algorithm(
    op: str,
    kind: str,
    domain_counts: Sequence[int],
    nvls: bool = False,
    sharp: bool = False,
    grid: bool = False,
    pod_counts: Sequence[int] = (),
) -> str:
    """The rule of :func:`choose_algorithm` (in the module docstring) on what it reads of a
    group: the topology's ``kind``, the group's members per scale-up domain (per pod on a
    torus: ``pod_counts``), whether the domain has NVLS and the fabric SHARP, and whether the
    group is a grid of one pod's torus. The analytic estimate
    (:class:`simulator.studies.search.network_model.NetModel`) asks the same rule."""
    _check_op(op)
    if op == "send-recv":
        return "p2p"
    if op == "broadcast":
        return "ring"
    equal = len(set(domain_counts)) == 1
    if op == "all-to-all":
        if kind == "switched" and len(domain_counts) > 1 and equal and domain_counts[0] > 1:
            return "hierarchical-a2a"
        return "direct"
    if kind == "torus":
        if grid:
            return "torus"
        if len(pod_counts) > 1 and len(set(pod_counts)) == 1:
            return "hierarchical"
        return "ring"
    if len(domain_counts) == 1:
        return "nvls" if (nvls and op == "all-reduce" and domain_counts[0] > 1) else "ring"
    if not equal:
        return "ring"
    if sharp and op == "all-reduce":
        return "sharp"
    return "rail-ring" if domain_counts[0] > 1 else "ring"


def choose_algorithm(op: str, group: Sequence[int], topo: Topology) -> str:
    """Default algorithm for ``op`` on ``group`` (rule in the module docstring,
    :func:`default_algorithm`)."""
    _check_op(op)
    group = tuple(group)
    if op in ("send-recv", "broadcast"):
        return default_algorithm(op, topo.kind, (len(group),))
    counts = [len(d) for d in split_by_domain(group, topo)]
    if topo.kind == "torus" and op != "all-to-all":
        grid = torus_grid(group, topo) is not None
        pods = [] if grid else [len(p) for p in split_by_domain(group, topo, by_pod=True)]
        return default_algorithm(op, "torus", counts, grid=grid, pod_counts=pods)
    return default_algorithm(op, topo.kind, counts, nvls=bool(topo.nvls), sharp=bool(topo.sharp))


def plan_collective(
    op: str,
    group: Sequence[int],
    size_bytes: float,
    topo: Topology,
    algorithm: str | None = None,
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
    group = _checked_group(group, topo)
    if not (size_bytes >= 0) or size_bytes == float("inf"):
        raise CollectiveError(f"size_bytes must be finite and >= 0, got {size_bytes!r}")
    algorithm = _resolved_algorithm(op, group, topo, algorithm, scaleout_fraction)
    n = len(group)
    size = float(size_bytes)
    if op == "send-recv":
        if n != 2:
            raise CollectiveError(f"send-recv needs a group of 2 (src, dst), got {n}")
        phases = [Phase((Transfer(group[0], group[1], size),), 1)] if size > 0 else []
        return CollectivePlan(op, algorithm, group, size, tuple(phases))
    if n == 1 or size == 0:
        return CollectivePlan(op, algorithm, group, size, ())
    if algorithm == "halving-doubling" and op != "all-reduce" and not _is_pow2(n):
        algorithm = "ring"  # documented fallback
    phases = _algorithm_phases(op, algorithm, group, size, topo, scaleout_fraction)
    return CollectivePlan(op, algorithm, group, size, tuple(phases))


def _checked_group(group: Sequence[int], topo: Topology) -> tuple[int, ...]:
    """``group`` as a tuple of ints, checked non-empty, without repeats, on ``topo``."""
    group = tuple(int(d) for d in group)
    if not group:
        raise CollectiveError("group is empty")
    if len(set(group)) != len(group):
        raise CollectiveError(f"group repeats a device: {group}")
    for d in group:
        if not 0 <= d < topo.n_devices:
            raise CollectiveError(f"device {d} is not in the topology (0..{topo.n_devices - 1})")
    return group


def _resolved_algorithm(
    op: str, group: tuple[int, ...], topo: Topology, algorithm: str | None, scaleout_fraction: float
) -> str:
    """The algorithm :func:`plan_collective` runs: ``algorithm``, or the default
    (``hierarchical-a2a`` under node-limited routing across equal domains), checked
    against ``op`` and ``scaleout_fraction``."""
    if not (0.0 < scaleout_fraction <= 1.0):
        raise CollectiveError(f"scaleout_fraction must be in (0, 1], got {scaleout_fraction!r}")
    node_limited = scaleout_fraction < 1.0
    if node_limited and op != "all-to-all":
        raise CollectiveError(f"scaleout_fraction < 1 applies to all-to-all only, not {op!r}")
    if algorithm is None:
        algorithm = choose_algorithm(op, group, topo)
        if node_limited:
            domains = split_by_domain(group, topo)
            if len(domains) > 1 and equal_split(domains):
                algorithm = "hierarchical-a2a"
    if node_limited and algorithm != "hierarchical-a2a" and len(split_by_domain(group, topo)) > 1:
        raise CollectiveError(
            f"scaleout_fraction < 1 (node-limited routing) needs the hierarchical-a2a algorithm, not {algorithm!r}"
        )
    if algorithm not in ALGORITHMS:
        raise CollectiveError(f"unknown algorithm {algorithm!r}; allowed: {', '.join(ALGORITHMS)}")
    if algorithm not in VALID_ALGORITHMS[op]:
        raise CollectiveError(
            f"algorithm {algorithm!r} does not implement {op!r}; allowed: {', '.join(VALID_ALGORITHMS[op])}"
        )
    return algorithm


def _algorithm_phases(
    op: str, algorithm: str, group: tuple[int, ...], size: float, topo: Topology, scaleout_fraction: float
) -> list[Phase]:
    """The phases of ``algorithm`` running ``op`` over ``group`` (two or more members,
    ``size > 0``)."""
    n = len(group)
    if algorithm == "ring":
        if op in REDUCING:
            return ring_phases(op, group, size)
        return [Phase(bundle(Transfer(group[i], group[i + 1], size) for i in range(n - 1)), n - 1)]
    if algorithm == "ring-bidir":
        return ring_phases(op, group, size, bidir=True)
    if algorithm == "tree":
        return tree_phases(op, group, size)
    if algorithm == "halving-doubling":
        return halving_doubling_phases(op, group, size)
    if algorithm == "torus":
        return torus_phases(op, group, size, topo)
    if algorithm == "hierarchical":
        by_pod = topo.kind == "torus"
        return hierarchical_phases(op, split_by_domain(group, topo, by_pod=by_pod), size, topo, pipelined=not by_pod)
    if algorithm == "rail-ring":
        return rail_ring_phases(op, split_by_domain(group, topo), size)
    if algorithm in ("nvls", "sharp"):
        return _in_switch_phases(op, algorithm, group, size, topo)
    if algorithm == "direct":
        return direct_a2a(group, size)
    if algorithm == "hierarchical-a2a":
        return hierarchical_a2a(split_by_domain(group, topo), size, scaleout_fraction)
    # p2p for anything but send-recv is rejected by VALID_ALGORITHMS
    raise CollectiveError(f"algorithm {algorithm!r} cannot run {op!r}")  # pragma: no cover


def _in_switch_phases(op: str, algorithm: str, group: tuple[int, ...], size: float, topo: Topology) -> list[Phase]:
    """The phases of the in-network reductions: ``nvls`` (NVLink SHARP inside one domain)
    and ``sharp`` (the scale-out fabric's, between domains)."""
    if algorithm == "nvls":
        if not topo.nvls:
            raise CollectiveError("nvls needs a topology with NVLink SHARP (topo.nvls)")
        if len(split_by_domain(group, topo)) != 1:
            raise CollectiveError("nvls needs a group inside one NVLink domain")
        n = len(group)
        return in_network_phases(group, size * (n + 1) / n, steps=2)
    if not topo.sharp:
        raise CollectiveError("sharp needs a topology with in-network reduction (topo.sharp)")
    return hierarchical_phases(op, split_by_domain(group, topo), size, topo, inter="sharp", pipelined=True)


def run_collective(
    network: FlowNetwork,
    plan: CollectivePlan | Sequence[CollectivePlan],
    reduction_bytes_per_s: float | None = None,
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


def run_merged(network: FlowNetwork, phases: Sequence[tuple], reduction_bytes_per_s: float | None = None):
    """simpy process body: run :func:`merged_phases` one after another."""
    for transfers, steps, compute in phases:
        yield network.transfer(transfers, steps)
        if reduction_bytes_per_s is not None and compute > 0:
            yield network.env.timeout(compute / reduction_bytes_per_s)


#: Algorithms of all-to-alls, whose transfers run at the calibration's ``a2a_efficiency``.
A2A_ALGORITHMS = ("direct", "hierarchical-a2a")


def _a2a_scaled(network: FlowNetwork, transfers: tuple) -> tuple:
    """An all-to-all's ``transfers`` with each size divided by the calibration's
    ``a2a_efficiency`` of the least efficient kind of link it loads (its incidence, else its
    route): the share of a link's bulk rate that all-to-all kernels reach."""
    cal, kind = network.calibration, network.topo.link_kind
    out = []
    for t in transfers:
        if t.src == t.dst or t.size_bytes <= 0:
            out.append(t)
            continue
        links = [lk for lk, _ in t.incidence] if t.incidence is not None else network.route(t.src, t.dst)[0]
        eff = min((cal.a2a_efficiency_of(kind[lk]) for lk in links), default=1.0)
        out.append(t if eff == 1.0 else replace(t, size_bytes=t.size_bytes / eff))
    return tuple(out)


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
        if p.algorithm in A2A_ALGORITHMS and cal.a2a_efficiency:
            parts.append(_a2a_scaled(network, ph.transfers))
        elif scale == 1.0:
            parts.append(ph.transfers)
        else:
            parts.append(tuple(replace(t, size_bytes=t.size_bytes * scale) for t in ph.transfers))
    transfers = parts[0] if len(parts) == 1 else tuple(t for part in parts for t in part)
    out = (transfers, steps, compute)
    if len(cache) >= _MERGED_CACHE_MAX:
        cache.clear()
    cache[key] = (tuple(plans), out)
    return out
