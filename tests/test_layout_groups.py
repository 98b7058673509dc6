"""The layout's vectorised group tables equal a rank-by-rank enumeration of the
mappings in :mod:`workloads.layout`'s module doc, on a grid of layouts: every mesh
order tried, CP, folded and carved-out EP, etp 1, tp and in between."""

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


def _stage_rank(L: ParallelLayout, pp: int, pos: int) -> int:
    """The rank at position ``pos`` of stage ``pp`` (its ranks in ascending order)."""
    return sorted(r for r in range(L.world) if L.stage_of(r) == pp)[pos]


def reference_group(L: ParallelLayout, rank: int, axis: str) -> tuple[int, ...]:
    """``rank``'s group along ``axis`` by enumeration, one rank at a time."""
    c = L.coords(rank)
    if axis in ("tp", "cp", "dp", "pp"):
        return tuple(_rank(L, {**c, axis: i}) for i in range(getattr(L, axis)))
    if axis == "etp" and not L.folded:
        return reference_group(L, rank, "tp") if L.etp == L.tp else (rank,)
    if axis in ("ep", "edp", "etp") and L.folded:
        # stage positions cut into an etp x ep x edp mesh nested as `order` nests tp, ep, dp
        names = {"tp": "etp", "ep": "ep", "dp": "edp"}
        stride, strides = 1, {}
        for a in L.order:
            if a in names:
                strides[names[a]] = stride
                stride *= getattr(L, names[a])
        pos = sorted(r for r in range(L.world) if L.stage_of(r) == c["pp"]).index(rank)
        return tuple(_stage_rank(L, c["pp"], pos + (i - c[axis]) * strides[axis]) for i in range(getattr(L, axis)))
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
        same = (lambda x: x % domain == r % domain) if kind == "inter" else (lambda x: x // domain == r // domain)
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
    for tp, cp, dp, pp, ep, etp, order in itertools.product(
        [1, 2, 4], [1, 2], [1, 3, 4], [1, 2], [1, 2, 4, 8], [1, 2, 4], ORDERS
    ):
        try:
            yield ParallelLayout(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, etp=etp, order=order)
        except LayoutError:
            continue


LAYOUTS = list(_layouts())


def test_grid_covers_both_expert_mappings():
    assert any(L.folded for L in LAYOUTS) and any(not L.folded and L.ep > 1 for L in LAYOUTS)
    assert any(not L.folded and L.etp == 1 < L.tp and L.ep > 1 for L in LAYOUTS)
    assert any(L.folded and 1 < L.etp for L in LAYOUTS) and any(L.cp > 1 and L.ep > 1 for L in LAYOUTS)


@pytest.mark.parametrize(
    "L",
    LAYOUTS[::3],
    ids=lambda L: f"tp{L.tp}cp{L.cp}dp{L.dp}pp{L.pp}ep{L.ep}etp{L.etp}-{''.join(a[0] for a in L.order)}",
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


def test_bad_axis_and_rank():
    L = ParallelLayout(tp=2, dp=2)
    with pytest.raises(ValueError, match="unknown group axis"):
        L.group(0, "xp")
    with pytest.raises(IndexError):
        L.group(4, "tp")
