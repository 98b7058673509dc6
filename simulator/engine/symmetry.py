"""Where representative mode's symmetry fails: groups of a stage that lie unlike one another.

A representative rank stands for the ranks of its stage that are not simulated, which are
taken to run the same program at the same instant (:mod:`simulator.engine.loop`). On a
switched network that holds when every group of a stage along an axis lies across the
scale-up domains in the same way. Where they do not -- expert groups straddling domains
unevenly, EP x TP neither dividing the domain size nor a multiple of it -- some groups keep
more of their traffic inside a domain than others, and the ranks not simulated would not run
as the representatives do. Where the representative's own group lies inside one domain and
others straddle two, no twin stands for the straddling ones at all: EP48 on 144 GB200 (two
NVL72 domains; groups 48, 24 + 24, 48) runs 13.8 ms in representative mode against 21.8 ms
with ``--exact``. Where the representative's group straddles too, the error is smaller: TP2
EP8 on 12-GPU H100 domains (groups 6 + 2, 4 + 4, 2 + 6), 3.216 against 3.143 ms
(``tests/test_symmetry.py``, ``tests/test_quotient.py``; README, *Known limits*).
:func:`uneven_groups` finds such axes and :func:`symmetry_note` words them for a summary's
``notes``.
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
    stride = layout.rank_of(pp=1) if layout.pp > 1 else layout.world
    for axis in AXES:
        table = layout.group_table(axis)
        if table.shape[1] < 2:
            continue
        doms = topo.domains_of(table)
        stages = (table[:, 0] // stride) % layout.pp if layout.pp > 1 else np.zeros(len(table), dtype=np.int64)
        splits: list[tuple[int, ...]] = []
        for stage in np.unique(stages).tolist():
            mine = sorted({_split(row) for row in doms[stages == stage]})
            if len(mine) > 1:
                splits.extend(s for s in mine if s not in splits)
        if splits:
            out[axis] = splits
    return out


def symmetry_note(layout: ParallelLayout, topo: Topology) -> list[str]:
    """A summary note for each axis :func:`uneven_groups` finds (none where it finds none)."""
    notes = []
    for axis, splits in uneven_groups(layout, topo).items():
        shown = ", ".join(" + ".join(map(str, s)) for s in splits[:4]) + (", ..." if len(splits) > 4 else "")
        notes.append(
            f"representative ranks: the {axis} groups of a stage straddle scale-up domains unevenly "
            f"(members per domain: {shown}), so ranks not simulated may run unlike the representatives: "
            f"the step can be far off (EP48 on 144 GB200: 13.8 ms in representative mode, 21.8 ms with --exact); "
            f"`stepsim run --exact` checks it"
        )
    return notes
