"""The layout's vectorised group tables equal the frameworks' own rank generators, on
a grid of layouts: every mesh order tried, CP, etp 1, tp and in between, pipelines with
and without virtual stages, under both expert mappings.

* ``megatron-core``: :func:`megatron_rank_groups` re-derives, rank by rank, what
  Megatron-Core's ``generate_masked_orthogonal_rank_groups`` computes for the two
  ``RankGenerator`` objects of ``initialize_model_parallel`` (megatron/core/
  parallel_state.py, NVIDIA/Megatron-LM commit d98e8a64ddf34856e74b24714e3bedb2f5a39553,
  lines 269-370, 465-560 and 859-907): the attention generator ``tp, cp, ep=1, dp, pp``
  and the expert generator ``tp=etp, cp=1, ep, dp=edp, pp`` over the same ``order``;
  the TP, CP, DP, DP-CP and PP groups are the attention generator's ``get_ranks('tp')``
  etc., the EP, ETP and EDP groups the expert generator's ``get_ranks('ep')``,
  ``get_ranks('tp')`` and ``get_ranks('dp')``.
* ``deepspeed``: EP carved out of data parallelism (deepspeed/utils/groups.py,
  ``_get_expert_parallel_ranks``, deepspeedai/DeepSpeed commit edaa7221), enumerated
  below from the module doc of :mod:`workloads.layout`."""

from __future__ import annotations

import itertools

import pytest

from workloads.layout import GROUP_AXES, LayoutError, ParallelLayout


def _rank(L: ParallelLayout, c: dict) -> int:
    return L.rank_of(tp=c["tp"], cp=c["cp"], dp=c["dp"], pp=c["pp"])


def _dpcp_members(L: ParallelLayout, tp: int, pp: int) -> list[int]:
    """The dp*cp ranks of a (tp, pp) slice, the one of cp and dp nearer the front of
    ``order`` varying fastest."""
    mesh = [a for a in L.order if a != "ep"]
    inner, outer = ("cp", "dp") if mesh.index("cp") < mesh.index("dp") else ("dp", "cp")
    return [
        _rank(L, {"tp": tp, "pp": pp, inner: i, outer: o})
        for o in range(getattr(L, outer))
        for i in range(getattr(L, inner))
    ]


def megatron_rank_groups(sizes: dict, order: tuple, token: str) -> list[list[int]]:
    """Megatron-Core's rank groups for ``token`` (e.g. ``"dp-cp"``), re-derived: a rank
    is the mixed-radix number of its coordinates in ``order`` (innermost first); a group
    fixes the coordinates not in ``token`` (numbered by the group index over those
    axes) and runs over the others (numbered by the position in the group)."""
    shape = [sizes[a] for a in order]
    stride = [1]
    for n in shape:
        stride.append(stride[-1] * n)
    inside = [i for i, a in enumerate(order) if a in token.split("-")]
    outside = [i for i in range(len(order)) if i not in inside]

    def digits(index, axes):
        out = []
        for i in axes:
            out.append(index % shape[i])
            index //= shape[i]
        return out

    size = 1
    for i in inside:
        size *= shape[i]
    groups = []
    for g in range(stride[-1] // size):
        base = sum(d * stride[i] for d, i in zip(digits(g, outside), outside))
        groups.append([base + sum(d * stride[i] for d, i in zip(digits(k, inside), inside)) for k in range(size)])
    return groups


def megatron_groups(L: ParallelLayout, axis: str) -> list[list[int]]:
    """``axis``'s groups as Megatron-Core's two rank generators give them."""
    attention = {"tp": L.tp, "cp": L.cp, "ep": 1, "dp": L.dp, "pp": L.pp}
    edp = L.world // (L.etp * L.ep * L.pp)  # expert_data_parallel_size
    expert = {"tp": L.etp, "cp": 1, "ep": L.ep, "dp": edp, "pp": L.pp}
    if axis in ("ep", "etp", "edp"):
        return megatron_rank_groups(expert, L.order, {"ep": "ep", "etp": "tp", "edp": "dp"}[axis])
    return megatron_rank_groups(attention, L.order, {"dp_cp": "dp-cp"}.get(axis, axis))


def reference_group(L: ParallelLayout, rank: int, axis: str) -> tuple[int, ...]:
    """``rank``'s group along ``axis`` by enumeration, one rank at a time."""
    if L.expert_mapping == "megatron-core":
        return tuple(next(g for g in megatron_groups(L, axis) if rank in g))
    c = L.coords(rank)
    if axis in ("tp", "cp", "dp", "pp"):
        return tuple(_rank(L, {**c, axis: i}) for i in range(getattr(L, axis)))
    if axis == "etp":
        return reference_group(L, rank, "tp") if L.etp == L.tp else (rank,)
    members = _dpcp_members(L, c["tp"], c["pp"])
    if axis == "dp_cp":
        return tuple(members)
    if axis == "ep":
        return tuple(members[c["edp"] * L.ep : (c["edp"] + 1) * L.ep])
    if axis == "edp":
        if L.etp == L.tp:
            return tuple(members[c["ep"] :: L.ep])
        return tuple(sorted(r for t in range(L.tp) for r in _dpcp_members(L, t, c["pp"])[c["ep"] :: L.ep]))
    raise AssertionError(axis)


def reference_groups(L: ParallelLayout, axis: str, stage) -> list[tuple[int, ...]]:
    ranks = range(L.world) if stage is None else [r for r in range(L.world) if L.stage_of(r) == stage]
    return sorted({reference_group(L, r, axis) for r in ranks}, key=min)


def reference_ep_subgroups(L: ParallelLayout, kind: str, stage: int, domain: int) -> list[tuple[int, ...]]:
    out = set()
    for r in (r for r in range(L.world) if L.stage_of(r) == stage):
        g = reference_group(L, r, "ep")
        same = (
            (lambda x, r=r: x % domain == r % domain)
            if kind == "inter"
            else (lambda x, r=r: x // domain == r // domain)
        )
        out.add(tuple(x for x in g if same(x)))
    return sorted(out, key=min)


ORDERS = [
    ("tp", "cp", "ep", "dp", "pp"),
    ("tp", "ep", "cp", "dp", "pp"),
    ("pp", "dp", "ep", "cp", "tp"),
    ("tp", "pp", "dp", "ep", "cp"),
    ("cp", "tp", "dp", "ep", "pp"),
]


def _layouts():
    grid = itertools.product(
        [1, 2, 4], [1, 2], [1, 3, 4], [1, 2], [1, 2, 4, 8], [1, 2, 4], ORDERS, ("megatron-core", "deepspeed")
    )
    for tp, cp, dp, pp, ep, etp, order, mapping in grid:
        try:
            vpp = 2 if pp > 1 and (tp + dp) % 2 else 1
            yield ParallelLayout(
                tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, etp=etp, vpp=vpp, order=order, expert_mapping=mapping
            )
        except LayoutError:
            continue


LAYOUTS = list(_layouts())
MEGATRON = [L for L in LAYOUTS if L.expert_mapping == "megatron-core"]


def test_grid_covers_both_expert_mappings():
    assert any(L.folded for L in LAYOUTS) and any(not L.folded and L.ep > 1 for L in LAYOUTS)
    assert any(not L.folded and L.etp == 1 < L.tp and L.ep > 1 for L in LAYOUTS)  # deepspeed, etp 1
    assert any(L.folded and 1 < L.etp < L.tp for L in MEGATRON) and any(L.cp > 1 and L.ep > 1 for L in LAYOUTS)
    assert any(L.vpp > 1 and L.ep > 1 and L.etp < L.tp for L in MEGATRON)


# At least 30 layouts Megatron-Core accepts, with etp < tp, cp > 1 and virtual stages among them.
MEGATRON_CASES = [L for L in MEGATRON if L.ep > 1 and (L.etp < L.tp or L.cp > 1 or L.vpp > 1)][::4]


def test_megatron_cases_cover_what_the_issue_names():
    assert len(MEGATRON_CASES) >= 30
    assert any(L.etp < L.tp for L in MEGATRON_CASES) and any(L.cp > 1 for L in MEGATRON_CASES)
    assert any(L.vpp > 1 for L in MEGATRON_CASES) and any(L.order[-1] != "pp" for L in MEGATRON_CASES)


@pytest.mark.parametrize(
    "L",
    MEGATRON_CASES,
    ids=lambda L: f"tp{L.tp}cp{L.cp}dp{L.dp}pp{L.pp}vpp{L.vpp}ep{L.ep}etp{L.etp}-{''.join(a[0] for a in L.order)}",
)
def test_groups_equal_megatron_core_rank_generators(L):
    # Every group table, row for row, equals the list Megatron-Core builds, and the expert
    # generator's pipeline groups equal the attention generator's (Megatron-Core asserts it).
    for axis in ("tp", "cp", "dp", "dp_cp", "pp", "ep", "etp", "edp"):
        expected = sorted(megatron_groups(L, axis), key=min)
        assert [list(g) for g in L.groups(axis)] == expected, axis
    edp = L.world // (L.etp * L.ep * L.pp)
    expert = {"tp": L.etp, "cp": 1, "ep": L.ep, "dp": edp, "pp": L.pp}
    assert megatron_rank_groups(expert, L.order, "pp") == megatron_groups(L, "pp")


def test_megatron_core_refuses_what_it_refuses():
    # parallel_state.py (d98e8a64), initialize_model_parallel: pp not last needs edp == dp.
    with pytest.raises(LayoutError) as e:
        ParallelLayout(tp=2, dp=4, pp=2, ep=4, order=("tp", "pp", "cp", "ep", "dp"))
    assert e.value.field == "parallel.order"
    # ... and expert pipeline groups equal to the attention's ("Pipeline parallel groups are
    # expected to be the same for Non-Expert and Expert part"): etp 1 under tp 2 moves pp.
    with pytest.raises(LayoutError) as e:
        ParallelLayout(tp=2, dp=4, pp=2, ep=2, etp=1, order=("tp", "pp", "cp", "ep", "dp"))
    assert e.value.field == "parallel.order"
    ok = ParallelLayout(tp=2, cp=2, dp=2, pp=2, ep=2, etp=2, order=("tp", "pp", "cp", "ep", "dp"))
    assert ok.edp == ok.dp and ok.group(0, "pp") == (0, 2)


@pytest.mark.parametrize(
    "L",
    LAYOUTS[::3],
    ids=lambda L: (
        f"tp{L.tp}cp{L.cp}dp{L.dp}pp{L.pp}ep{L.ep}etp{L.etp}-{''.join(a[0] for a in L.order)}-{L.expert_mapping[0]}"
    ),
)
def test_groups_equal_rank_by_rank_enumeration(L):
    for axis in GROUP_AXES:
        for r in range(L.world):
            assert L.group(r, axis) == reference_group(L, r, axis), (axis, r)
        for stage in [None, *range(L.pp)]:
            assert L.groups(axis, stage) == reference_groups(L, axis, stage), (axis, stage)
    for domain in (2, 4):
        for kind in ("inter", "intra"):
            for stage in range(L.pp):
                assert L.ep_subgroups(kind, stage, domain) == reference_ep_subgroups(L, kind, stage, domain)


def test_group_table_rows_and_index():
    L = ParallelLayout(tp=2, cp=2, dp=4, pp=2, ep=4, etp=1)
    for axis in GROUP_AXES:
        table, index = L.group_table(axis), L.group_index(axis)
        assert sorted(table.ravel().tolist()) == list(range(L.world))  # a partition
        assert (table.min(axis=1)[1:] > table.min(axis=1)[:-1]).all()  # by first rank
        for r in range(L.world):
            assert tuple(table[index[r]].tolist()) == L.group(r, axis)


def test_the_ranks_of_a_group_share_one_tuple():
    """A group is held once however many of its ranks ask: a copy per rank held a world-sized
    tuple for each rank of a world-wide data-parallel group (2,304 ranks: 380 MB for three axes
    of one layout), and the PP map, simulating hundreds of layouts in one process, grew to 8 GB."""
    L = ParallelLayout(tp=1, dp=64, pp=1, ep=8)
    for axis in ("dp", "dp_cp", "edp", "ep"):
        first = {}
        for r in range(L.world):
            g = L.group(r, axis)
            assert first.setdefault(g[0], g) is g, (axis, r)


def test_bad_axis_and_rank():
    L = ParallelLayout(tp=2, dp=2)
    with pytest.raises(ValueError, match="unknown group axis"):
        L.group(0, "xp")
    with pytest.raises(IndexError):
        L.group(4, "tp")
