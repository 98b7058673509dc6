"""Pipeline schedules: invariants, published bubble closed forms, activation peaks."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.schedule_timing import run_schedule, simulate
from workloads.schedules import (
    SCHEDULES,
    Action,
    ScheduleError,
    all_forward_first,
    chunk_owner,
    in_flight_profile,
    local_chunks,
    micro_batch_direction,
    micro_batch_path,
    model_chunk,
    model_chunks,
    peak_in_flight,
    schedule,
    validate_schedule_args,
    weight_copies,
)

UNIT = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}


def all_steps(name, pp, m, vpp=1):
    return [schedule(name, r, pp, m, vpp) for r in range(pp)]


def valid_cases():
    """A spread of valid (name, pp, m, vpp), edge cases included."""
    out = []
    for pp in (1, 2, 3, 4, 8):
        for m in (1, 2, 3, pp, pp + 1, 2 * pp, 3 * pp + 1):
            out += [("gpipe", pp, m, 1), ("1f1b", pp, m, 1), ("zb-h1", pp, m, 1)]
    for pp in (2, 3, 4, 8):
        for v in (2, 3, 4):
            for m in (pp, 2 * pp, 3 * pp):
                out.append(("interleaved-1f1b", pp, m, v))
    for pp in (2, 4, 6, 8):
        for m in (2 * pp, 2 * pp + 2, 4 * pp):
            out.append(("dualpipe", pp, m, 1))
    return sorted(set(out))


@st.composite
def cases(draw):
    name = draw(st.sampled_from(SCHEDULES))
    if name == "interleaved-1f1b":
        pp = draw(st.integers(2, 6))
        return name, pp, pp * draw(st.integers(1, 4)), draw(st.integers(2, 4))
    if name == "dualpipe":
        pp = 2 * draw(st.integers(1, 4))
        return name, pp, 2 * draw(st.integers(pp, pp + 6)), 1
    return name, draw(st.integers(1, 8)), draw(st.integers(1, 20)), 1


# ---------------------------------------------------------------------------
# Invariants
# ---------------------------------------------------------------------------
def check_invariants(name, pp, m, vpp):
    steps = all_steps(name, pp, m, vpp)
    expected_units = Counter()  # (rank, local chunk) -> micro-batches that visit it
    for j in range(m):
        path = micro_batch_path(name, j, m, pp, vpp)
        assert len(path) == model_chunks(name, pp, vpp)
        for rc in path:
            expected_units[(rc, j)] += 1
    assert all(c == 1 for c in expected_units.values()), "a micro-batch visits a chunk twice"
    for r, rank_steps in enumerate(steps):
        seen = Counter((a.op, a.mb, a.chunk) for s in rank_steps for a in s)
        assert all(c == 1 for c in seen.values()), f"rank {r}: an action appears twice"
        units = {(j, c) for ((rr, c), j) in expected_units if rr == r}
        assert {(j, c) for (op, j, c) in seen if op == "F"} == units
        for j, c in units:
            full = ("B", j, c) in seen
            split = ("I", j, c) in seen and ("W", j, c) in seen
            assert full != split, f"rank {r} {j}.{c}: needs exactly one B or one I+W"
            assert not full or (("I", j, c) not in seen and ("W", j, c) not in seen)
        assert len(seen) == sum(2 if ("B", j, c) in seen else 3 for j, c in units)
        # program order: backward after its forward, W after its I
        index = {}
        for i, s in enumerate(rank_steps):
            for a in s:
                index[(a.op, a.mb, a.chunk)] = i
        for (op, j, c), i in index.items():
            if op in ("B", "I"):
                assert i > index[("F", j, c)]
            if op == "W":
                assert i > index[("I", j, c)]
        # pairs are only DualPipe's (F, B) of opposite directions
        for s in rank_steps:
            assert 1 <= len(s) <= 2
            if len(s) == 2:
                assert name == "dualpipe"
                f, b = s
                assert f.op == "F" and b.op == "B" and f.chunk != b.chunk
        profile = in_flight_profile(rank_steps)
        assert min(profile) >= 0 and profile[-1] == 0
    # runs to completion (raises on deadlock), with and without the aux-loss constraint
    t = run_schedule(steps, UNIT, m, name=name, vpp=vpp)
    assert t.makespan > 0 and 0 <= t.bubble_fraction < 1
    for timed in t.ranks:
        starts = [x.start for x in timed]
        assert starts == sorted(starts)
    afa = [all_forward_first(s) for s in steps]
    run_schedule(afa, UNIT, m, name=name, vpp=vpp)
    return t


@pytest.mark.parametrize("name,pp,m,vpp", valid_cases())
def test_invariants(name, pp, m, vpp):
    check_invariants(name, pp, m, vpp)


@settings(max_examples=120, deadline=None)
@given(cases())
def test_invariants_hypothesis(case):
    check_invariants(*case)


@settings(max_examples=60, deadline=None)
@given(cases(), st.sampled_from(["sum", "max"]))
def test_timed_dependencies_hold(case, pair_cost):
    """Check the executor's output against the dependency rules directly."""
    name, pp, m, vpp = case
    t = simulate(name, pp, m, {"F": 1.0, "B": 2.5, "I": 1.5, "W": 1.0}, vpp=vpp, pair_cost=pair_cost)
    at = {}
    for r, timed in enumerate(t.ranks):
        for prev, x in zip(timed, timed[1:]):
            paired = (x.start, x.end) == (prev.start, prev.end) and x.end > x.start
            assert paired or x.start >= prev.end  # in order, one step at a time
        for x in timed:
            at[(x.action.op, x.action.mb, r, x.action.chunk)] = x
    for j in range(m):
        path = micro_batch_path(name, j, m, pp, vpp)
        for s, (r, c) in enumerate(path):
            f = at[("F", j, r, c)]
            if s:
                assert f.start >= at[("F", j, *path[s - 1])].end
            g = at.get(("B", j, r, c)) or at[("I", j, r, c)]
            assert g.start >= f.end
            if s + 1 < len(path):
                nr, nc = path[s + 1]
                assert g.start >= (at.get(("B", j, nr, nc)) or at[("I", j, nr, nc)]).end
            if ("W", j, r, c) in at:
                assert at[("W", j, r, c)].start >= g.end


# ---------------------------------------------------------------------------
# Bubbles against published closed forms (free communication)
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("pp,m", [(1, 4), (2, 3), (4, 1), (4, 4), (4, 8), (8, 3), (8, 32)])
def test_bubble_gpipe_1f1b(name, pp, m):
    """Cost model F=1, B=2 per stage. Idle time per rank (p-1)(F+B) over a makespan
    of (m+p-1)(F+B): fraction (p-1)/(m+p-1) (Narayanan et al. 2021 §2.2.1)."""
    t = simulate(name, pp, m, {"F": 1, "B": 2})
    assert t.makespan == pytest.approx((m + pp - 1) * 3)
    assert t.bubble_fraction == pytest.approx((pp - 1) / (m + pp - 1))
    assert t.bubble_time == pytest.approx([(pp - 1) * 3] * pp)


@pytest.mark.parametrize(
    "pp,m,v", [(2, 2, 2), (4, 4, 2), (4, 8, 2), (4, 8, 3), (4, 12, 4), (8, 16, 2), (8, 8, 4), (3, 9, 3)]
)
def test_bubble_interleaved(pp, m, v):
    """Cost model: a full stage costs F=1, B=2, so each of the v chunks costs F/v, B/v.
    Bubble (p-1)(F+B)/v over busy m(F+B): fraction (p-1)/(v*m+p-1)
    (Narayanan et al. 2021 §2.2.2)."""
    t = simulate("interleaved-1f1b", pp, m, {"F": 1 / v, "B": 2 / v}, vpp=v)
    assert t.makespan == pytest.approx(m * 3 + (pp - 1) * 3 / v)
    assert t.bubble_fraction == pytest.approx((pp - 1) / (v * m + pp - 1))


@pytest.mark.parametrize("costs", [dict(F=1, I=1, W=1), dict(F=2, I=2, W=1), dict(F=1, I=1, W=0.5)])
@pytest.mark.parametrize("pp,m", [(2, 2), (3, 3), (4, 4), (4, 9), (8, 8), (8, 13)])
def test_bubble_zb_h1(pp, m, costs):
    """Cost model F = I (input-grad backward), W <= F, m >= p. Qi et al. 2024 §3.1:
    ZB-H1 bubble (p-1)(T_F + T_B - T_W) with T_B the input-grad pass, i.e.
    DeepSeek-V3 Table 2's (p-1)(F+B-2W) with its B = I+W the full backward.
    With F=I=W that is a third of 1F1B's (p-1)(F+I+W)."""
    t = simulate("zb-h1", pp, m, costs)
    expected = (pp - 1) * (costs["F"] + costs["I"] - costs["W"])
    assert t.bubble_time == pytest.approx([expected] * pp)
    busy = m * (costs["F"] + costs["I"] + costs["W"])
    assert t.bubble_fraction == pytest.approx(expected / (busy + expected))


@pytest.mark.parametrize("costs", [dict(F=1, I=1, W=1), dict(F=2, I=2, W=1), dict(F=1, I=1, W=0.5)])
@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 14), (8, 16), (8, 20), (16, 32)])
def test_bubble_dualpipe(pp, m, costs):
    """Cost model F = I, B = I + W, free communication. DeepSeek-V3 Table 2:
    DualPipe bubble (PP/2-1)(F&B + B - 3W), F&B the cost of an overlapped pair.
    pair_cost='sum' (F&B = F+B, no overlap credit): every rank idles exactly that
    long. pair_cost='max' (F&B = max(F, B)): ranks run different numbers of pairs,
    and the most idle rank idles exactly that long."""
    f, w = costs["F"], costs["W"]
    b = costs["I"] + w
    for pair_cost, fb in (("sum", f + b), ("max", max(f, b))):
        t = simulate("dualpipe", pp, m, costs, pair_cost=pair_cost)
        expected = (pp // 2 - 1) * (fb + b - 3 * w)
        assert max(t.bubble_time) == pytest.approx(expected)
        if pair_cost == "sum":
            assert t.bubble_time == pytest.approx([expected] * pp)
            assert t.busy == pytest.approx([m * (f + b)] * pp)


def test_zero_bubble_beats_1f1b_beats_nothing():
    """Same work (F=I=W=1, B=2): 1F1B bubble three times ZB-H1's."""
    one = simulate("1f1b", 8, 24, UNIT)
    zb = simulate("zb-h1", 8, 24, UNIT)
    assert one.makespan - 24 * 3 == pytest.approx(3 * (zb.makespan - 24 * 3))


# ---------------------------------------------------------------------------
# Activation memory: peak in-flight micro-batch-chunks
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("pp,m", [(4, 2), (4, 4), (4, 16), (8, 64)])
def test_peak_in_flight_gpipe_1f1b_zb(pp, m):
    for r in range(pp):
        assert peak_in_flight(schedule("gpipe", r, pp, m)) == m
        # 1F1B: pp - r on rank r, bounded by pp and independent of m
        assert peak_in_flight(schedule("1f1b", r, pp, m)) == min(pp - r, m)
        # ZB-H1 keeps 1F1B's peak (activations held until W)
        assert peak_in_flight(schedule("zb-h1", r, pp, m)) == min(pp, m)


@pytest.mark.parametrize("pp,m,v", [(4, 8, 2), (4, 16, 3), (8, 16, 2), (8, 32, 4), (4, 4, 2)])
def test_peak_in_flight_interleaved(pp, m, v):
    """Rank r warms up with 2(p-r-1)+(v-1)p chunk forwards and then runs one more
    before its first backward; all v*m when m == p (Megatron runs such batches
    all-forward-first). On rank 0 that is (v+1)p-1 chunks, i.e. p(1+(p-1)/(pv))
    full stages' activations (Korthikanti et al. 2023 §4.2, Narayanan §2.2.2)."""
    for r in range(pp):
        want = v * m if m == pp else min(v * m, 2 * (pp - r - 1) + (v - 1) * pp + 1)
        assert peak_in_flight(schedule("interleaved-1f1b", r, pp, m, v)) == want
    if m > pp:
        rank0 = peak_in_flight(schedule("interleaved-1f1b", 0, pp, m, v))
        assert rank0 / v == pytest.approx(pp * (1 + (pp - 1) / (pp * v)))


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (8, 16), (8, 40)])
def test_peak_in_flight_dualpipe(pp, m):
    """DeepSeek-V3 Table 2: activation memory PP+1 (micro-batch-chunks), on every rank."""
    for r in range(pp):
        assert peak_in_flight(schedule("dualpipe", r, pp, m)) == pp + 1


@pytest.mark.parametrize(
    "name,pp,m,vpp",
    [
        ("1f1b", 4, 12, 1),
        ("zb-h1", 4, 12, 1),
        ("gpipe", 4, 12, 1),
        ("interleaved-1f1b", 4, 12, 2),
        ("dualpipe", 4, 12, 1),
    ],
)
def test_all_forward_first(name, pp, m, vpp):
    """Global aux loss: every F before any backward; in-flight grows to every
    chunk-micro-batch the rank holds (m for 1F1B); kinds keep their order."""
    for r in range(pp):
        steps = schedule(name, r, pp, m, vpp)
        out = all_forward_first(steps)
        ops = [s[0].op for s in out]
        assert all(len(s) == 1 for s in out)
        n_f = ops.count("F")
        assert set(ops[:n_f]) == {"F"} and "F" not in ops[n_f:]
        flat = [a for s in steps for a in s]
        assert [s[0] for s in out if s[0].op == "F"] == [a for a in flat if a.op == "F"]
        assert [s[0] for s in out if s[0].op != "F"] == [a for a in flat if a.op != "F"]
        held = m * local_chunks(name, vpp) if name != "dualpipe" else m
        assert peak_in_flight(out) == held
    if name == "1f1b":
        constrained = simulate(name, pp, m, {"F": 1, "B": 2}, all_forward_first=True)
        assert constrained.makespan == pytest.approx(simulate("gpipe", pp, m, {"F": 1, "B": 2}).makespan)
        assert constrained.peak_in_flight == (m,) * pp


# ---------------------------------------------------------------------------
# Golden orders (small cases, checked by hand against the papers' figures)
# ---------------------------------------------------------------------------
def ops(steps):
    return " ".join("+".join(f"{a.op}{a.mb}" + (f".{a.chunk}" if a.chunk else "") for a in s) for s in steps)


def test_golden_orders():
    assert ops(schedule("1f1b", 0, 4, 6)) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5"
    assert ops(schedule("1f1b", 3, 4, 6)) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"
    assert ops(schedule("gpipe", 1, 4, 3)) == "F0 F1 F2 B0 B1 B2"
    # interleaved p=2, v=2, m=4: groups of p micro-batches per chunk; warm-up 2(p-1-r)+(v-1)p
    assert ops(schedule("interleaved-1f1b", 0, 2, 4, 2)) == (
        "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3"
    )
    # ZB-H1 last rank of 4 holds back 3 W's; first rank none
    assert ops(schedule("zb-h1", 3, 4, 5)) == "F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 W2 W3 W4"
    assert ops(schedule("zb-h1", 0, 4, 5)) == "F0 F1 F2 F3 I0 W0 F4 I1 W1 I2 W2 I3 W3 I4 W4"
    # DualPipe, 4 ranks, 8 micro-batches (0-3 direction 0 on chunk 0, 4-7 direction 1 on chunk 1)
    assert ops(schedule("dualpipe", 0, 4, 8)) == (
        "F0 F1 F2 F4.1 I4.1 W4.1 F5.1 F3+B5.1 F6.1+B0 B6.1 F7.1+B1 B7.1 I2 W2 I3 W3"
    )
    assert ops(schedule("dualpipe", 1, 4, 8)) == (
        "F0 F4.1 F1 F5.1 F2 B4.1 F6.1+B0 F3+B5.1 F7.1+B1 B6.1 B2 I7.1 I3 W7.1 W3"
    )
    # mirror symmetry: rank pp-1-r runs rank r's order with the directions swapped
    for pp, m in ((4, 8), (8, 20)):
        for r in range(pp):
            mirror = [
                tuple(Action(a.op, (a.mb + m // 2) % m, 1 - a.chunk) for a in s) for s in schedule("dualpipe", r, pp, m)
            ]
            assert mirror == schedule("dualpipe", pp - 1 - r, pp, m)


# ---------------------------------------------------------------------------
# Placement helpers
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name,pp,vpp", [("1f1b", 4, 1), ("interleaved-1f1b", 4, 3), ("dualpipe", 6, 1), ("gpipe", 1, 1)]
)
def test_chunk_owner_roundtrip(name, pp, vpp):
    n = model_chunks(name, pp, vpp)
    assert n == (pp if name == "dualpipe" else pp * vpp)
    owners = set()
    for k in range(n):
        for d in (0, 1) if name == "dualpipe" else (0,):
            r, c = chunk_owner(name, k, pp, vpp, direction=d)
            assert model_chunk(name, r, c, pp, vpp) == k
            owners.add((r, c))
    assert owners == {(r, c) for r in range(pp) for c in range(local_chunks(name, vpp))}


def test_placement_matches_layout():
    """Megatron placement: chunk k on rank k % pp as local chunk k // pp (as ParallelLayout documents)."""
    assert chunk_owner("interleaved-1f1b", 5, 4, 2) == (1, 1)
    assert model_chunk("interleaved-1f1b", 3, 1, 4, 2) == 7
    assert chunk_owner("dualpipe", 0, 8, 1, direction=1) == (7, 1)
    assert model_chunk("dualpipe", 2, 1, 8, 1) == 5
    with pytest.raises(IndexError):
        chunk_owner("1f1b", 4, 4, 1)


def test_directions_and_copies():
    assert [micro_batch_direction("dualpipe", j, 8) for j in range(8)] == [0] * 4 + [1] * 4
    assert {micro_batch_direction(n, j, 8) for n in SCHEDULES if n != "dualpipe" for j in range(8)} == {0}
    assert micro_batch_path("dualpipe", 5, 8, 4, 1) == ((3, 1), (2, 1), (1, 1), (0, 1))
    assert micro_batch_path("interleaved-1f1b", 0, 4, 2, 2) == ((0, 0), (1, 0), (0, 1), (1, 1))
    assert weight_copies("dualpipe") == 2
    assert [weight_copies(n) for n in SCHEDULES if n != "dualpipe"] == [1] * 4


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name,pp,m,vpp,field,needle",
    [
        ("pipedream", 4, 8, 1, "schedule", "gpipe"),
        ("1f1b", 0, 8, 1, "parallel.pp", "positive"),
        ("1f1b", 4, 0, 1, "training.global_batch_size", "positive"),
        ("1f1b", 4, 8, 2, "parallel.vpp", "vpp == 1"),
        ("gpipe", 4, 8, 2, "parallel.vpp", "vpp == 1"),
        ("zb-h1", 4, 8, 2, "parallel.vpp", "vpp == 1"),
        ("interleaved-1f1b", 4, 8, 1, "parallel.vpp", "vpp >= 2"),
        ("interleaved-1f1b", 1, 8, 2, "parallel.pp", "pp >= 2"),
        ("interleaved-1f1b", 4, 6, 2, "training.global_batch_size", "multiple of pp = 4"),
        ("dualpipe", 3, 12, 1, "parallel.pp", "even"),
        ("dualpipe", 4, 6, 1, "training.global_batch_size", "m >= 2*pp = 8"),
        ("dualpipe", 4, 9, 1, "training.global_batch_size", "even"),
        ("dualpipe", 4, 8, 2, "parallel.vpp", "vpp == 1"),
    ],
)
def test_validation_names_field(name, pp, m, vpp, field, needle):
    with pytest.raises(ScheduleError) as e:
        validate_schedule_args(name, pp, m, vpp)
    assert e.value.field == field
    assert str(e.value).startswith(field + ":") and needle in str(e.value)
    with pytest.raises(ScheduleError):
        schedule(name, 0, pp, m, vpp)


def test_bad_rank():
    with pytest.raises(IndexError):
        schedule("1f1b", 4, 4, 8)


def test_deadlock_is_reported_not_hung():
    # rank 0 wants micro-batch 0's backward before doing its forward; rank 1 waits for that forward
    steps = [[(Action("B", 0),), (Action("F", 0),)], [(Action("F", 0),), (Action("B", 0),)]]
    with pytest.raises(ScheduleError, match=r"deadlock: rank 0 .*B0\.0.*; rank 1 .*F0\.0") as e:
        run_schedule(steps, UNIT, 1)
    assert e.value.field == "schedule"
    # rank 0 runs 1F1B without warm-up, rank 1 wants both forwards first: crossed waits
    f0, f1, b0, b1 = Action("F", 0), Action("F", 1), Action("B", 0), Action("B", 1)
    steps = [[(f0,), (b0,), (f1,), (b1,)], [(f0,), (f1,), (b1,), (b0,)]]
    with pytest.raises(ScheduleError, match=r"rank 0 blocked at step 1 .*rank 1 blocked at step 1"):
        run_schedule(steps, UNIT, 2)


def test_executor_rejects_malformed_steps():
    with pytest.raises(ScheduleError, match="already ran"):
        run_schedule([[(Action("F", 0),), (Action("F", 0),), (Action("B", 0),)]], UNIT, 1)
    with pytest.raises(ScheduleError, match="outside"):
        run_schedule([[(Action("F", 3),)]], UNIT, 1)
    with pytest.raises(ScheduleError, match="never visits"):
        run_schedule([[(Action("F", 0, 1),)]], UNIT, 1)
    with pytest.raises(ValueError, match="pair_cost"):
        run_schedule([[(Action("F", 0),), (Action("B", 0),)]], UNIT, 1, pair_cost="min")
    with pytest.raises(ValueError, match="no duration"):
        run_schedule([[(Action("F", 0),), (Action("B", 0),)]], {"F": 1}, 1)


def test_pair_cost_and_default_b():
    t = simulate("dualpipe", 2, 4, {"F": 1, "I": 1, "W": 1}, pair_cost="sum")  # B defaults to I+W
    assert sum(t.busy) == pytest.approx(2 * 4 * 3)
    pairs = [x for x in t.ranks[0] if x.end - x.start == pytest.approx(3)]
    assert pairs and all(x.action.op in "FB" for x in pairs)
    t = simulate("dualpipe", 2, 4, {"F": 1, "I": 1, "W": 1}, pair_cost="max")
    assert sum(t.busy) < 2 * 4 * 3


# ---- schedules as objects (workloads.pipeline) ------------------------------------------------


def test_every_registered_schedule_implements_every_hook():
    """Each schedule of the scenario's enum is a registered PipelineSchedule that sets every
    fact and whose every method answers for a small case."""
    from workloads import enums
    from workloads.pipeline import REGISTRY, get_schedule
    from workloads.pipeline.base import FACTS, HOOKS

    assert tuple(REGISTRY) == tuple(enums.SCHEDULES)
    assert set(HOOKS) >= set(FACTS) | {"validate", "steps", "bubble_s", "steady_run", "chunk_owner"}
    for name, s in REGISTRY.items():
        assert get_schedule(name) is s and s.name == name
        for fact in FACTS:
            assert isinstance(getattr(s, fact), bool), (name, fact)
        vpp = 2 if s.virtual_stages else 1
        s.validate(4, 8, vpp)
        n, nl = s.model_chunks(4, vpp), s.local_chunks(vpp)
        assert n >= 4 and nl >= 1 and s.weight_copies() in (1, 2)
        peers = [s.weight_peer(r, 4) for r in range(4)]
        assert peers == ([None] * 4 if s.weight_copies() == 1 else [3, 2, 1, 0])
        for mb in range(8):
            d = s.micro_batch_direction(mb, 8)
            for k in range(n):
                rank, local = s.chunk_owner(k, 4, vpp, d)
                assert 0 <= rank < 4 and 0 <= local < nl
                assert s.model_chunk(rank, local, 4, vpp) == k
        for mb in (0, 7):  # the chunks of each rank a micro-batch's path passes through
            path = [s.chunk_owner(k, 4, vpp, s.micro_batch_direction(mb, 8)) for k in range(n)]
            assert all(sum(r == rank for r, _ in path) == s.chunks_per_micro_batch(vpp) for rank in range(4))
        assert [s.finish_lead(r, 4) for r in range(4)] in ([0, 1, 2, 3], [0, 1, 1, 0])
        assert len(s.steps(0, 4, 8, vpp)) > 0
        assert s.bubble_s(4, lambda k: 1.0, None) >= 0.0
        run = s.steady_run(4, vpp, False)
        assert run is None or (run[0] > 0 and run[1] > 0)


def _made_up_schedule() -> dict:
    """Every hook of a one-direction, one-chunk schedule (GPipe's order), written out."""
    from workloads.pipeline.base import Action

    return {
        "name": "made-up",
        "virtual_stages": False,
        "forwards_all_first": True,
        "bidirectional": False,
        "overlapped_pairs": False,
        "wraps_stages": False,
        "megatron_lm": False,
        "validate": lambda self, pp, m, vpp: None,
        "model_chunks": lambda self, pp, vpp: pp,
        "local_chunks": lambda self, vpp: 1,
        "weight_copies": lambda self: 1,
        "weight_peer": lambda self, rank, pp: None,
        "micro_batch_direction": lambda self, mb, m: 0,
        "chunk_owner": lambda self, k, pp, vpp, direction: (k, 0),
        "model_chunk": lambda self, rank, local, pp, vpp: rank,
        "chunks_per_micro_batch": lambda self, vpp: 1,
        "finish_lead": lambda self, rank, pp: rank,
        "steps": lambda self, rank, pp, m, vpp: (
            [(Action("F", j),) for j in range(m)] + [(Action("B", j),) for j in range(m)]
        ),
        "bubble_s": lambda self, pp, mean, pair_s: (pp - 1) * (mean("F") + mean("B")),
        "steady_run": lambda self, pp, vpp, ep: None,
    }


def test_the_made_up_schedule_has_every_hook():
    from workloads.pipeline.base import HOOKS, PipelineSchedule

    body = _made_up_schedule()
    assert set(body) == {"name", *HOOKS}
    s = type("MadeUp", (PipelineSchedule,), body)()
    assert s.steps(0, 2, 2, 1)[0][0].op == "F"


@pytest.mark.parametrize("hook", __import__("workloads.pipeline.base", fromlist=["HOOKS"]).HOOKS)
def test_a_schedule_missing_a_hook_cannot_be_made(hook):
    """A schedule that leaves out any hook (a method or a fact) is refused when it is made,
    naming the hook, instead of running another schedule's case."""
    from workloads.pipeline.base import PipelineSchedule

    body = {k: v for k, v in _made_up_schedule().items() if k != hook}
    cls = type("MadeUp", (PipelineSchedule,), body)
    with pytest.raises(TypeError, match=hook):
        cls()


def test_megatron_placement_fills_the_placement_hooks():
    from workloads.pipeline.base import MegatronPlacement, PipelineSchedule

    placement = {
        "model_chunks",
        "local_chunks",
        "weight_copies",
        "weight_peer",
        "micro_batch_direction",
        "chunk_owner",
        "model_chunk",
        "chunks_per_micro_batch",
        "finish_lead",
    }
    body = {k: v for k, v in _made_up_schedule().items() if k not in placement}
    s = type("MadeUp", (MegatronPlacement, PipelineSchedule), body)()
    assert s.chunk_owner(5, 4, 2, 0) == (1, 1) and s.model_chunk(1, 1, 4, 2) == 5


def test_an_unknown_schedule_is_refused_naming_the_field():
    from workloads.pipeline import get_schedule

    with pytest.raises(ScheduleError, match="schedule: unknown schedule 'zb-v'; expected one of gpipe") as e:
        get_schedule("zb-v")
    assert e.value.field == "schedule"
