"""The ``torus`` collective: dimension by dimension over the axes a group spans, on
all axes at once (see :mod:`simulator.network.collectives` for the cost model)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from simulator.network.phases import Transfer
from simulator.network.plans import CollectiveError, Phase, bundle, merge_parallel, torus_grid

if TYPE_CHECKING:  # pragma: no cover
    from topologies.topology import Topology


def line_transfers(line: Sequence[int], chunk: float, gather: bool) -> list[Transfer]:
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


def axis_phase(op: str, lines: Sequence[Sequence[int]], ring: bool, data: float) -> Phase:
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
            transfers += line_transfers(line, chunk, gather=(op == "all-gather"))
    compute = (m - 1) * chunk if op == "reduce-scatter" else 0.0
    return Phase(bundle(transfers), m - 1, compute)


def torus_phases(op: str, members: Sequence[int], size: float, topo: Topology) -> list[Phase]:
    grid = torus_grid(members, topo)
    if grid is None:
        raise CollectiveError(
            "torus algorithm needs a group that is a box (or an evenly spaced grid) of one pod's torus"
        )
    pod = topo.pod_of(members[0])
    shape, wrap = topo.torus_shape, topo.torus_wrap
    assert shape is not None and wrap is not None  # a torus (torus_grid checked it)
    axes = [a for a, v in enumerate(grid) if len(v) > 1]

    lines: dict[int, list[list[int]]] = {}  # axis -> its lines (every stage of every share reads them)

    def lines_along(a: int) -> list[list[int]]:
        if a in lines:
            return lines[a]
        others = [grid[b] if b != a else grid[b][:1] for b in range(len(grid))]
        out = []
        for base in grid_product(others):
            line = []
            for v in grid[a]:
                c = list(base)
                c[a] = v
                line.append(topo.device_at(c, pod))
            out.append(line)
        lines[a] = out
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
        return axis_phase("reduce-scatter", lines_along(order[j]), is_ring(order[j]), data)

    def ag_stage(order: list[int], j: int) -> Phase:
        data = share / math.prod(len(grid[a]) for a in order[:j])
        return axis_phase("all-gather", lines_along(order[j]), is_ring(order[j]), data)

    rs = merge_parallel([[rs_stage(o, j) for j in range(d)] for o in orders])
    ag = merge_parallel([[ag_stage(o, j) for j in reversed(range(d))] for o in orders])
    if op == "all-reduce":
        return rs + ag
    if op == "reduce-scatter":
        return rs
    return ag


def grid_product(ranges: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for r in ranges:
        out = [t + (v,) for t in out for v in r]
    return out


# ---- closed forms on one pod's torus (simulator.studies.search.network_model) ----------------
# (seconds per byte, latency seconds) of a collective alone on the torus; ``coords``: per axis,
# the members' coordinates (numpy arrays); ``bw`` per link and direction, ``hop_s`` per link.


def torus_box_time(
    op: str, extents: Sequence[int], shape: Sequence[int], wrap: Sequence[bool], bw: float, hop_s: float
) -> tuple[float, float]:
    """:func:`torus_phases` on a group that is a box of ``extents``: one share of ``1/d`` per
    axis, share ``i`` taking the axes in the order rotated by ``i``; stage ``j`` of every share
    runs at once (the max over shares); a wrapped axis the group covers is a bidirectional ring,
    any other a line at half that bandwidth."""
    f = 2 if op == "all-reduce" else 1
    axes = [(e, 2 if (w and e == e_full and e_full > 2) else 1) for e, e_full, w in zip(extents, shape, wrap) if e > 1]
    d = len(axes)
    orders = [axes[i:] + axes[:i] for i in range(d)]
    per_byte, steps = 0.0, 0
    for j in range(d):
        per_byte += max((o[j][0] - 1) / o[j][0] / d / math.prod(e for e, _ in o[:j]) / (bw * o[j][1]) for o in orders)
        steps += max(o[j][0] - 1 for o in orders)
    return f * per_byte, f * steps * hop_s


def torus_a2a_time(coords: Sequence, extents: Sequence[int], n: int, shape, wrap, bw: float, hop_s: float):
    """A direct all-to-all of ``n`` members on the torus, bounded by its busiest link: along an
    axis of ``e`` members each line carries an all-to-all of ``S/e`` per pair, whose busiest link
    carries ``floor(e/2) ceil(e/2)`` messages on a line and ``sum(d < e/2) + e/4`` on a wrapped
    ring (shortest paths, ties split); the bounding extent stands for twin groups filling gaps."""
    worst = 0.0
    for c, e_full, w in zip(coords, shape, wrap):
        e = int(c.max() - c.min() + 1)
        if e <= 1:
            continue
        if w and e == e_full and e_full > 2:
            load = sum(range(1, (e + 1) // 2)) + (e / 4 if e % 2 == 0 else 0.0)
        else:
            load = (e // 2) * ((e + 1) // 2)
        worst = max(worst, load / e)
    span = math.prod(int(c.max() - c.min() + 1) for c in coords)
    return worst * span / n / bw, hop_s * max(1, sum(extents) - len(extents))


def torus_ring_time(op: str, coords: Sequence, next_coords: Sequence, n: int, shape, wrap, bw: float, hop_s: float):
    """A ring in group order on the torus (a group that is not a box): each neighbour transfer
    takes the mean hop count between ring neighbours (twin groups interleave on the same links)."""
    f = 2 if op == "all-reduce" else 1
    worst = 0.0
    for ca, cb, e, w in zip(coords, next_coords, shape, wrap):
        d = np.abs(ca - cb)
        d = np.minimum(d, e - d) if (w and e > 2) else d
        worst = max(worst, float(d.sum()) / n)
    return f * (n - 1) / n * max(worst, 1.0) / bw, f * (n - 1) * hop_s * max(worst, 1.0)
