"""Building blocks of collective plans: :class:`Phase`, :class:`CollectivePlan`, the
phase combinators (bundling, merging parallel sub-plans, pipelining) and the group
structure the algorithms split on (domains, torus grids). Pure functions, no simpy."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from simulator.errors import NetworkError
from simulator.network.phases import Transfer

if TYPE_CHECKING:  # pragma: no cover
    from topologies.topology import Topology

#: Ops whose ring phases reduce or gather (the ring family's ops).
REDUCING = ("all-reduce", "all-gather", "reduce-scatter")
#: Groups of at most this many members are split by domain in plain Python.
FEW_MEMBERS = 256


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


def bundle(transfers: Iterable[Transfer]) -> tuple[Transfer, ...]:
    """Merge identical (src, dst, size) transfers into one of summed weight; drop no-ops."""
    live = [t for t in transfers if t.src != t.dst and t.size_bytes > 0]
    if len({(t.src, t.dst, t.size_bytes) for t in live}) == len(live) and all(t.incidence is None for t in live):
        return tuple(live)  # nothing to merge (a ring, a tree)
    merged: dict[tuple[int, int, float], int] = {}
    for t in live:
        key = (t.src, t.dst, t.size_bytes)
        merged[key] = merged.get(key, 0) + t.weight
    return tuple(Transfer(s, d, b, w) for (s, d, b), w in merged.items())


def merge_parallel(phase_lists: Sequence[Sequence[Phase]]) -> list[Phase]:
    """i-th phases of several independent sub-plans merged into one phase each."""
    out = []
    for i in range(max((len(p) for p in phase_lists), default=0)):
        parts = [p[i] for p in phase_lists if i < len(p)]
        out.append(
            Phase(
                bundle(t for ph in parts for t in ph.transfers),
                max(ph.steps for ph in parts),
                max(ph.compute_bytes for ph in parts),
                any(ph.in_network for ph in parts),
            )
        )
    return out


def as_pipeline(phases: Sequence[Phase]) -> list[Phase]:
    """Phases run as one pipeline: all their transfers flow at once (chunks of the buffer
    stream through every stage), so the pipeline lasts as long as its slowest stage under
    max-min sharing; stages on the same links share them. The latencies of all stages
    are paid once each (pipeline fill): ``steps`` is their sum."""
    phases = list(phases)
    if len(phases) <= 1:
        return phases
    return [
        Phase(
            bundle(t for ph in phases for t in ph.transfers),
            sum(ph.steps for ph in phases),
            sum(ph.compute_bytes for ph in phases),
            any(ph.in_network for ph in phases),
        )
    ]


def split_by_domain(group: Sequence[int], topo: Topology, by_pod: bool = False) -> list[list[int]]:
    """Members grouped by domain (or pod), domains in order of first appearance."""
    keys = topo.domains_of(group, by_pod=by_pod)
    if keys.size <= FEW_MEMBERS:
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


def equal_split(parts: list[list[int]]) -> bool:
    return len({len(p) for p in parts}) == 1


def torus_grid(group: Sequence[int], topo: Topology) -> list[tuple[int, ...]] | None:
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
        values = sorted({int(c[a]) for c in coords})
        step = values[1] - values[0] if len(values) > 1 else 1
        if values != list(range(values[0], values[0] + step * len(values), step)):
            return None
        grid.append(tuple(values))
    if math.prod(len(v) for v in grid) != len(set(group)):
        return None
    return grid
