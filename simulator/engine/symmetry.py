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
``--exact``; now it runs 21.8 ms, as ``--exact`` does. Where groups split unlike one
another -- a group's mirror image (2 + 6 against 6 + 2) counts as unlike it, even where every
group splits into the same counts -- one rank per class of :func:`rank_classes` is simulated,
each standing for the devices of its class; a mirror image is of another class, the lowering
folds into a group's collective only the twins a class-keeping shift maps it to, and it runs
the twins of groups inside one domain too (other axes' groups of the simulated ranks load
those devices' links). Refining the classes can give many (every position of a leaf group:
72 a stage for EP64 on 2,304 GB200 in NVL72 racks), and all are simulated where the trace
stays within an op limit (:func:`class_budget`; beyond it a coarser round): the lowering
plans a group's collective once whichever simulated member asks, so a class costs its rank's
compute and events rather than another copy of its group's twin traffic (that layout: about
1.4 times the CPU time of the 5 coarser classes of the splits alone, whose per-device means
are off ``--exact``). The layouts of ``tests/test_symmetry.py`` and TP2 EP8 on 12-GPU domains
with and without PP (``tests/test_quotient.py``) equal ``--exact`` to 1e-9 on every device
figure. :func:`uneven_groups` finds such axes and :func:`symmetry_note` words them for a
summary's ``notes``.
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


def _pattern(domains: np.ndarray) -> tuple[int, ...]:
    """Members per domain of one group, the domains in the order the group's members first
    reach them: a group's mirror image (8 + 4 against 4 + 8) is another pattern."""
    _, first, counts = np.unique(domains, return_index=True, return_counts=True)
    return tuple(counts[np.argsort(first)].tolist())


def uneven_groups(layout: ParallelLayout, topo: Topology) -> dict[str, list[tuple[int, ...]]]:
    """``{axis: the distinct patterns of its groups}`` for every axis along which the groups of
    some pipeline stage do not all split over the scale-up domains alike (a pattern: members
    per domain, the domains in the order the group reaches them, so that a group's mirror
    image, 8 + 4 against 4 + 8, is unlike it: TP2 EP12 on 8-GPU domains, whose expert groups
    all split 8 + 4 or 4 + 8, ran one rank per stage with the step 0.05 % and the exposed
    share 0.8 % off ``--exact``). Empty for a topology without scale-up domains (a torus: its
    groups are compared by nothing here) and for a layout whose groups all split alike."""
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
            mine = sorted({_pattern(row) for row in doms[stages == stage]})
            if len(mine) > 1:
                splits.extend(s for s in mine if s not in splits)
        if splits:
            out[axis] = splits
    return out


def _cross_share(domains: np.ndarray) -> np.ndarray:
    """Each member's share of its group outside its own domain, ``1 - n_d / n``: the share of
    its all-to-all traffic that leaves the domain over its own NIC."""
    _, inverse, counts = np.unique(domains, return_inverse=True, return_counts=True)
    return 1.0 - counts[inverse] / float(domains.shape[0])


def representative_position(layout: ParallelLayout, topo: Topology) -> int:
    """Where in each stage the representative rank stands (ranks into the stage): 0 (tp = cp =
    dp = 0) unless :func:`uneven_groups` finds an axis; then the first rank of stage 0 that
    sends the largest share of its groups' traffic across domains along those axes. Across
    domains each rank sends over its own NIC, so a group's all-to-all ends with its ranks
    that have the fewest peers in their domain, and the step waits for the slowest group (the
    data-parallel synchronisation): the rank to simulate is a minority rank of the most
    uneven split (EP48 on 144 GB200, groups 48, 24 + 24, 48: rank 48; TP4 EP64 on 72-GPU
    domains, groups 64, 8 + 56, ..., 32 + 32: rank 64, one of the 8, whose dispatch takes
    1.18 ms against 0.68 ms in 32 + 32)."""
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
    return int(np.argmax(score))  # the first of the highest


def rank_classes(layout: ParallelLayout, topo: Topology, max_classes: int | None = None) -> np.ndarray | None:
    """The class of each rank (an array over ranks; ``None`` where :func:`uneven_groups` finds
    no axis): ranks of one pipeline stage whose position in it (ranks into the stage) has
    the same groups' splits over the scale-up domains (members per domain, largest first)
    along every uneven axis, in every stage, start in one class, and the classes are refined
    until stable (:func:`_refine`). Representative mode then simulates one rank per class
    and stage (:func:`class_ranks`) instead of one per stage, each standing for the ranks of
    its class: EP48 on 144 GB200 (groups 48, 24 + 24, 48) has six classes per stage, the 24
    ranks each of 0-23, 24-47, ..., 120-143 (mirror images apart). Class ids ascend with the
    first rank of each class.

    ``max_classes``: the refinement stops at its finest round with at most that many classes
    (``None`` where the splits alone give more): the budget :func:`class_budget` sets. Each
    round only splits classes, so the same budget, or the count it gave, finds the same
    round again. Computed once per layout, topology and budget (the trace, the lowering and
    the summary's note ask alike)."""
    of = _last_classes.get("of")
    if of is None or of[0] is not layout or of[1] is not topo:  # forget the previous layout's
        _last_classes.clear()
        _last_classes["of"] = (layout, topo)
    if max_classes not in _last_classes:
        _last_classes[max_classes] = _rank_classes(layout, topo, max_classes)
    return _last_classes[max_classes]


#: The last layout and topology :func:`rank_classes` classified (``"of"``) and its answer per
#: budget: one layout's at a time, so a long search or map holds no earlier topology.
_last_classes: dict = {}


def _rank_classes(layout: ParallelLayout, topo: Topology, max_classes: int | None) -> np.ndarray | None:
    """:func:`rank_classes`, computed."""
    axes = uneven_groups(layout, topo)
    if not axes:
        return None
    base = np.array([layout.rank_of(pp=s) for s in range(layout.pp)], dtype=np.int64)
    positions = np.array(layout.stage_ranks(0), dtype=np.int64) - base[0]
    sig: dict[int, tuple] = {int(p): () for p in positions.tolist()}
    for axis in axes:
        table = layout.group_table(axis)
        index = layout.group_index(axis)
        splits = [_split(row) for row in topo.domains_of(table)]
        for p in sig:
            sig[p] += tuple(splits[index[int(b) + p]] for b in base.tolist())
    ids: dict[tuple, int] = {}
    of_position = np.array([ids.setdefault(sig[p], len(ids)) for p in sorted(sig)], dtype=np.int64)
    if max_classes is not None and layout.pp * len(ids) > max_classes:
        return None
    out = np.empty(layout.world, dtype=np.int64)
    for s, b in enumerate(base.tolist()):
        out[b + np.sort(positions)] = s * len(ids) + of_position
    out = _refine(layout, topo, out, max_classes)
    first = np.unique(out, return_index=True)[1]  # numbered in the order of their first ranks
    order = np.empty(first.size, dtype=np.int64)
    order[np.argsort(first)] = np.arange(first.size)
    return order[np.unique(out, return_inverse=True)[1].ravel()]


#: The most trace ops (``estimated_ops``) a representative run with one rank per class may
#: simulate. Such runs hold more per op than a step's op limit assumes (1 KB,
#: ``checks.BYTES_PER_ESTIMATED_OP``): 2.1 KB measured for DeepSeek-V3 TP4 PP4 VPP4 EP64 on
#: 2,304 H100 in 72-GPU domains (20 ranks, 1.06 M ops, 2.2 GB resident) and over 3.6 KB for
#: TP2 PP4 VPP4 EP64 with ZeRO-3 on the same cluster (288 ranks of a 20-micro-batch run, 2.38 M
#: ops, past 8.7 GB when stopped), so 1.5 M ops keeps them within about 3-6 GB.
MAX_CLASS_OPS = 1_500_000


def class_budget(workload) -> int:
    """The most ranks representative mode simulates for ``workload``: as many as keep the
    trace within :data:`MAX_CLASS_OPS`, and at least one per stage. DeepSeek-V3 TP4 PP4 VPP4
    EP64 on 2,304 H100 in 72-GPU domains with 128 micro-batches refines to 288 classes, about
    15 M ops (past 12 GB resident: the PP map's 72-GPU points at 200 and 400 GB/s were killed
    by it); at about 53,000 ops a rank the budget is 28 ranks, and the 20 classes of the
    groups' splits run."""
    from workloads.trace.builder import estimated_ops

    return max(workload.layout.pp, int(MAX_CLASS_OPS // max(estimated_ops(workload, 1), 1.0)))


def leaves(topo: Topology) -> np.ndarray:
    """Each device's switch outside its domain (its NIC's leaf, or rail), -1 where none."""
    G, out = topo.graph, np.full(topo.n_devices, -1, dtype=np.int64)
    names: dict = {}
    for i, dev in enumerate(topo.devices):
        for nb, data in G[dev].items():
            if data.get("kind") == "nic":
                out[i] = names.setdefault(nb, len(names))
    return out


def _refine(layout: ParallelLayout, topo: Topology, classes: np.ndarray, max_classes: int | None = None) -> np.ndarray:
    """``classes`` refined until stable (colour refinement): two ranks
    stay of one class when, along every axis, their groups hold the same classes in the same
    relations to them (same device, same scale-up domain, same leaf switch, other), and so
    do their ranks at the same position in the other stages. With ``max_classes``, the last
    round with at most that many classes where the next would give more."""
    dom, leaf = topo.domains_of(np.arange(layout.world)), leaves(topo)[: layout.world]
    tables = [layout.group_table(axis) for axis in AXES]
    tables = [t for t in tables if t.shape[1] > 1]
    base = np.array([layout.rank_of(pp=s) for s in range(layout.pp)], dtype=np.int64)
    stage = np.searchsorted(base, np.arange(layout.world), side="right") - 1
    pos = np.arange(layout.world) - base[stage]
    n = len(np.unique(classes))
    while True:
        cols = [classes[:, None]]
        for t in tables:
            cols.append(_company(classes, t, dom, leaf)[:, None])
            cols.append(_necklace(classes, t, dom, leaf)[:, None])
        stage_cols = np.stack([classes[base[s] + pos] for s in range(layout.pp)], axis=1)
        cols.append(stage_cols)
        new = np.unique(np.concatenate(cols, axis=1), axis=0, return_inverse=True)[1].ravel()
        new = _alike_in_every_stage(new, base, pos, stage)
        m = len(np.unique(new))
        if max_classes is not None and m > max_classes:
            return classes
        classes = new.astype(np.int64)
        if m == n:  # stable
            return classes
        n = m


def _alike_in_every_stage(classes: np.ndarray, base: np.ndarray, pos: np.ndarray, stage: np.ndarray) -> np.ndarray:
    """``classes`` split so that every stage partitions its positions alike: two ranks of a
    stage stay of one class only where the ranks at their positions are of one class in every
    stage. A stable refinement is so already (its stage columns); a round that the class
    budget stops at need not be, and then :func:`class_ranks` would simulate a rank in one
    stage whose pipeline peers in the next and previous stages are not simulated (Kimi K2 TP2
    PP8 EP48 on 2,304 H100 in 32-GPU domains, a budget of 50: 36 classes, stage 3 at 11
    positions and stage 2 at 3, whose trace could not be built). Only splits classes, so the
    stable refinement is the same."""
    per_position = np.stack([classes[b + pos] for b in base.tolist()], axis=1)
    keys = np.concatenate([stage[:, None], per_position], axis=1)
    return np.unique(keys, axis=0, return_inverse=True)[1].ravel().astype(np.int64)


def _row_ids(rows: np.ndarray) -> np.ndarray:
    """An id per row of a 2-D integer array: equal rows, equal ids (column by column, each
    folded into the ids so far as one integer key: no key exceeds rows x (values + 1))."""
    ids = np.zeros(rows.shape[0], dtype=np.int64)
    for col in rows.T:
        col = col - col.min()
        ids = np.unique(ids * (int(col.max()) + 1) + col, return_inverse=True)[1].ravel()
    return ids


def _company(classes: np.ndarray, table: np.ndarray, dom: np.ndarray, leaf: np.ndarray) -> np.ndarray:
    """Each rank's group's other members as seen from it, as an id over ranks: for every class
    in the group, how many of its members share the rank's scale-up domain, how many its leaf
    switch only, and how many neither (the multiset of (class, relation) over the members;
    counted per group, domain and leaf rather than over every pair of members)."""
    G, k = table.shape
    c, d, lf = classes[table].ravel(), dom[table].ravel(), leaf[table].ravel()
    g = np.repeat(np.arange(G, dtype=np.int64), k)
    # the (group, class) pairs present, sorted by group then class
    pair = _row_ids(np.stack([g, c], axis=1))
    first = np.unique(pair, return_index=True)[1]
    pg, pc = g[first], c[first]
    per_group = np.bincount(pg, minlength=G)
    start = np.concatenate([[0], np.cumsum(per_group)[:-1]])
    # one entry per (member, class present in its group)
    width = per_group[g]
    member = np.repeat(np.arange(G * k), width)
    at = start[g][member] + np.arange(member.size) - np.repeat(np.cumsum(width) - width, width)
    cc = pc[at]
    gm, dm, lm = g[member], d[member], lf[member]

    def tally(members: list, queries: list) -> np.ndarray:
        keys = np.concatenate([np.stack(members, axis=1), np.stack(queries, axis=1)])
        ids = _row_ids(keys)
        return np.bincount(ids[: G * k], minlength=int(ids.max()) + 1)[ids[G * k :]]

    in_dom = tally([g, d, c], [gm, dm, cc])  # the rank itself among them
    in_leaf = tally([g, lf, c], [gm, lm, cc]) - tally([g, lf, d, c], [gm, lm, dm, cc])
    total = tally([g, c], [gm, cc])
    feats = np.stack([cc, in_dom - (cc == c[member]), in_leaf, total - in_dom - in_leaf], axis=1)
    out = np.empty(classes.shape[0], dtype=np.int64)
    ids = np.empty(G * k, dtype=np.int64)
    offset = 0
    for w in np.unique(per_group).tolist():  # members whose groups hold w classes
        mine = np.flatnonzero(per_group[g] == w)
        rows = feats[np.isin(member, mine)].reshape(mine.size, 4 * w)
        ids[mine] = _row_ids(rows) + offset
        offset = int(ids[mine].max()) + 1
    out[table.ravel()] = ids
    return out


def _necklace(classes: np.ndarray, table: np.ndarray, dom: np.ndarray, leaf: np.ndarray) -> np.ndarray:
    """Each rank's group's members in the group's order, as a cycle (each member's class and
    its relation to the next one), up to rotation: a ring runs one way round, so the mirror
    image of a group that straddles domains (2 + 6 against 6 + 2) is not its image, while
    the members of one group stay alike. The cycle's least rotation names it."""
    nxt = np.roll(table, -1, axis=1)
    rel = np.where(dom[table] == dom[nxt], 1, np.where(leaf[table] == leaf[nxt], 2, 3))
    seq = (classes[table] * 4 + rel).tolist()
    names: dict[tuple, int] = {}
    ids = [names.setdefault(_least_rotation(row), len(names)) for row in seq]
    out = np.empty(classes.shape[0], dtype=np.int64)
    out[table] = np.array(ids, dtype=np.int64)[:, None]
    return out


def _least_rotation(seq: list) -> tuple:
    """The lexicographically least rotation of ``seq`` (Booth's algorithm, linear time)."""
    n = len(seq)
    doubled = seq + seq
    fail = [-1] * (2 * n)
    best = 0
    for j in range(1, 2 * n):
        x = doubled[j]
        i = fail[j - best - 1]
        while i != -1 and x != doubled[best + i + 1]:
            if x < doubled[best + i + 1]:
                best = j - i - 1
            i = fail[i]
        if i == -1 and x != doubled[best + i + 1]:
            if x < doubled[best + i + 1]:
                best = j
            fail[j - best] = -1
        else:
            fail[j - best] = i + 1
    return tuple(doubled[best : best + n])


def class_ranks(layout: ParallelLayout, classes: np.ndarray) -> tuple[list[int], dict[int, int]]:
    """The simulated ranks of :func:`rank_classes`' ``classes``: the first rank of each class
    (each stage's classes in the same positions), and the devices each stands for."""
    first: dict[int, int] = {}
    for r, c in enumerate(classes.tolist()):
        first.setdefault(c, r)
    counts = np.bincount(classes)
    ranks = sorted(first.values())
    return ranks, {r: int(counts[classes[r]]) for r in ranks}


def representative_trace(workload, layout: ParallelLayout, topo: Topology, max_classes: int | None = None):
    """The trace representative mode simulates: one rank per pipeline stage (position 0) where
    every group of a stage splits over the scale-up domains alike, else one rank per class of
    :func:`rank_classes` within ``max_classes`` (default :func:`class_budget`), each weighted by
    the devices of its class (where even the splits' classes exceed the budget, one rank per
    stage at :func:`representative_position`). Steady-state skipping passes the full step's
    budget for its shorter run, so that both simulate the same ranks."""
    from dataclasses import replace

    from workloads.trace.builder import build_trace

    if not uneven_groups(layout, topo):
        return build_trace(workload)
    classes = rank_classes(layout, topo, max_classes=class_budget(workload) if max_classes is None else max_classes)
    if classes is None:
        return build_trace(workload, position=representative_position(layout, topo))
    ranks, weight = class_ranks(layout, classes)
    return replace(build_trace(workload, ranks=ranks), representative=True, weight=weight)


def symmetry_note(layout: ParallelLayout, topo: Topology, simulated: int | None = None) -> list[str]:
    """A summary note for each axis :func:`uneven_groups` finds (none where it finds none);
    ``simulated``: the ranks the trace simulates, where :func:`class_budget` held the classes
    below the refinement's own (the note then says so)."""
    axes = uneven_groups(layout, topo)
    classes = rank_classes(layout, topo)
    if not axes or classes is None:
        return []
    ranks, _ = class_ranks(layout, classes)
    if simulated is not None and simulated < len(ranks):
        coarse = rank_classes(layout, topo, max_classes=simulated)
        kept = class_ranks(layout, coarse)[0] if coarse is not None else []
        how = (
            f"{len(kept)} ranks of a coarser round of the classes are simulated"
            if coarse is not None
            else f"one rank per stage is simulated (the {simulated} at the position whose groups cross domains most)"
        )
        budget = (
            f"refined, the classes would be {len(ranks)} ranks, over the op limit of such runs ({MAX_CLASS_OPS:,} ops); {how}, "
            "so the per-device means (idle, exposed communication) may differ from `stepsim run --exact`'s"
        )
    else:
        budget = ""
    notes = []
    for axis, splits in axes.items():
        shown = ", ".join(" + ".join(map(str, s)) for s in splits[:4]) + (", ..." if len(splits) > 4 else "")
        if budget:
            notes.append(
                f"representative ranks: the {axis} groups of a stage straddle scale-up domains unevenly "
                f"(members per domain: {shown}); {budget}"
            )
            continue
        notes.append(
            f"representative ranks: the {axis} groups of a stage straddle scale-up domains unevenly "
            f"(members per domain: {shown}); {len(ranks)} ranks are simulated ({', '.join(map(str, ranks[:8]))}"
            f"{', ...' if len(ranks) > 8 else ''}), one per class of ranks whose groups lie alike, each standing "
            f"for its class; `stepsim run --exact` checks it"
        )
    return notes
