"""Where representative mode's symmetry fails: groups of a stage that lie unlike one another.

A representative rank stands for the ranks of its stage that are not simulated, which are
taken to run the same program at the same instant (:mod:`simulator.engine.loop`). On a
switched network that holds when every group of a stage along an axis lies across the
scale-up domains in the same way. Where they do not -- expert groups straddling domains
unevenly, EP x TP neither dividing the domain size nor a multiple of it -- some groups keep
more of their traffic inside a domain than others, and the ranks not simulated would not run
as the representatives do. The step waits for the slowest group (the data-parallel
synchronisation), and the slowest is the one sending the most across domains, so the
representative of each stage is taken from that group (:func:`representative_position`).
With the first rank of the stage instead, EP48 on 144 GB200 (two NVL72 domains; groups 48,
24 + 24, 48) ran 13.8 ms, as if every group stayed inside its domain, against 21.8 ms with
``--exact``; now it runs 21.8 ms, as ``--exact`` does. Where every group straddles, a gap
remains: TP2 EP8 on 12-GPU H100 domains (groups 6 + 2, 4 + 4, 2 + 6) with PP2, 3.220 against
3.143 ms (``tests/test_symmetry.py``, ``tests/test_quotient.py``; README, *Known limits*).
:func:`uneven_groups` finds such axes and :func:`symmetry_note` words them for a summary's
``notes``. The representative then stands for the faster groups too: idle and exposed time
per device are the slowest group's (EP48 above: exposed communication 53 % of the step
against 40 % averaged over every device by ``--exact``).
"""

from __future__ import annotations

import numpy as np

from topologies.topology import Topology
from workloads.layout import ParallelLayout

#: The group axes whose collectives run on the network.
AXES = ("tp", "cp", "dp_cp", "ep", "edp", "etp")


def _split(domains: np.ndarray) -> tuple[int, ...]:
    """Members per domain of one group, largest first (a group and its mirror image alike)."""
    return tuple(sorted(np.unique(domains, return_counts=True)[1].tolist(), reverse=True))


def uneven_groups(layout: ParallelLayout, topo: Topology) -> dict[str, list[tuple[int, ...]]]:
    """``{axis: the distinct splits of its groups}`` for every axis along which the groups of
    some pipeline stage do not all split over the scale-up domains alike (a split: members per
    domain, largest first). Empty for a topology without scale-up domains (a torus: its groups
    are compared by nothing here) and for a layout whose groups all split alike."""
    if topo.kind != "switched":
        return {}
    out: dict[str, list[tuple[int, ...]]] = {}
    per_stage = layout.world // layout.pp  # stages are the outermost mesh axis
    for axis in AXES:
        table = layout.group_table(axis)
        if table.shape[1] < 2:
            continue
        doms = topo.domains_of(table)
        rel = doms - doms[:, :1]
        if (rel == rel[0]).all():  # every group the image of the first: alike (the common case)
            continue
        stages = table[:, 0] // per_stage
        splits: list[tuple[int, ...]] = []
        for stage in np.unique(stages).tolist():
            mine = sorted({_split(row) for row in doms[stages == stage]})
            if len(mine) > 1:
                splits.extend(s for s in mine if s not in splits)
        if splits:
            out[axis] = splits
    return out


def _cross_share(domains: np.ndarray) -> float:
    """Share of a group's member pairs that lie in different domains (its all-to-all traffic
    across domains): ``1 - sum(n_d^2) / n^2``."""
    counts = np.unique(domains, return_counts=True)[1]
    return 1.0 - float((counts**2).sum()) / float(domains.shape[0] ** 2)


def representative_position(layout: ParallelLayout, topo: Topology) -> int:
    """Where in each stage the representative rank stands (ranks into the stage): 0 (tp = cp =
    dp = 0) unless :func:`uneven_groups` finds an axis; then the first rank of stage 0 whose
    groups along those axes send the largest share of their pairs across domains. The groups
    that keep more inside a domain run faster, and the step waits for the slowest (the data-
    parallel synchronisation), so the group with the most traffic across domains is the one
    to simulate (EP48 on 144 GB200: the group 24 + 24, rank 48)."""
    return _position(layout, topo, uneven_groups(layout, topo))


def _position(layout: ParallelLayout, topo: Topology, axes: dict) -> int:
    """:func:`representative_position` given :func:`uneven_groups`' answer ``axes``."""
    if not axes:
        return 0
    per_stage = layout.world // layout.pp
    score = np.zeros(per_stage)
    for axis in axes:
        table = layout.group_table(axis)
        rows = table[table[:, 0] < per_stage]  # stage 0's groups
        for row in rows:
            score[row] += _cross_share(topo.domains_of(row))
    return int(np.argmax(score))


def symmetry_note(layout: ParallelLayout, topo: Topology) -> list[str]:
    """A summary note for each axis :func:`uneven_groups` finds (none where it finds none)."""
    notes = []
    axes = uneven_groups(layout, topo)
    if not axes:
        return notes
    pos = _position(layout, topo, axes)
    for axis, splits in axes.items():
        shown = ", ".join(" + ".join(map(str, s)) for s in splits[:4]) + (", ..." if len(splits) > 4 else "")
        mine = layout.group_table(axis)[layout.group_index(axis)[pos]]
        notes.append(
            f"representative ranks: the {axis} groups of a stage straddle scale-up domains unevenly "
            f"(members per domain: {shown}); each stage is represented by its rank {pos}, whose group "
            f"({' + '.join(map(str, _split(topo.domains_of(mine))))}) sends the most across domains, and "
            f"the groups that keep more inside a domain are taken to run as it does; `stepsim run --exact` checks it"
        )
    return notes
