"""Work the engine does once instead of per op gives the same figures: the busy intervals read
column by column equal the record-by-record reading (random records and a real MoE step with
pipeline sends and activation offload), a lone collective's phases looked up by
``private_ops`` are the ones the stream would look up itself (``private_phases=False``: the
same records to the bit), the ops other processes wait on, found from ``Trace.check``'s
dependency arrays, are those of the walk over every op's deps (with private ops moved into
the compute stream too), and the trace builder's all-to-all sizes, worked out once per layer,
equal the formula at every layer of an imbalanced MoE."""

from __future__ import annotations

import random
from operator import attrgetter

import numpy as np
import pytest
from helpers import rerun_engine
from test_engine_fast import SCENARIOS
from test_loop_inline import MOE

from simulator import simulate
from simulator.engine import loop
from simulator.engine.accounting import _COMPUTE, _HOST, busy_intervals
from simulator.engine.loop import Engine, OpRecord
from workloads.trace.ops import Op


def _reference(records, ranks: tuple):
    """The busy intervals read record by record (the reading before the column one)."""
    rank_ix = {r: i for i, r in enumerate(ranks)}
    axis_ch: dict[str, int] = {}
    rk, ch, st, en = [], [], [], []
    launch: dict[str, float] = {}
    for rec in records:
        op = rec.op
        rk.append(rank_ix[op.rank])
        st.append(rec.start_s)
        en.append(rec.end_s)
        if op.kind == "compute":
            ch.append(_COMPUTE)
        elif op.kind == "host":
            ch.append(_HOST)
        else:
            a = op.axis or op.stream
            ch.append(axis_ch.setdefault(a, len(axis_ch) + 2))
        if op.kind == "collective" and op.key:
            launch[op.key] = max(launch.get(op.key, -1.0), rec.start_s)
    for i, rec in enumerate(records):
        if rec.op.kind == "collective" and rec.op.key:
            st[i] = launch[rec.op.key]
    for i, rec in enumerate(records):
        if rec.op.kind == "send" and rec.op.peer in rank_ix:
            rk.append(rank_ix[rec.op.peer])
            ch.append(ch[i])
            st.append(st[i])
            en.append(en[i])
    axes = tuple(sorted(axis_ch))
    remap = {c: j + 2 for j, a in enumerate(axes) for c in [axis_ch[a]]}
    c = np.array([remap.get(x, x) for x in ch], dtype=np.int64)
    r, s, e = np.array(rk, dtype=np.int64), np.array(st, dtype=float), np.array(en, dtype=float)
    keep = e > s
    return r[keep], c[keep], s[keep], e[keep], axes


def _same(got, want) -> None:
    assert got[4] == want[4]
    for a, b in zip(got[:4], want[:4]):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def _random_records(seed: int) -> tuple[list, tuple]:
    rng = random.Random(seed)
    ranks = (0, 3, 5, 9)
    out = []
    for i in range(400):
        rank = rng.choice(ranks)
        kind = rng.choice(["compute", "compute", "collective", "send", "host"])
        axis = rng.choice(["tp", "ep", "dp_cp", ""]) if kind in ("collective", "send") else ""
        stream = {"compute": "compute", "host": "offload", "send": "pp"}.get(kind) or rng.choice(["tp", "ep", "dp"])
        key = rng.choice(["", "k1", "k2", "k3"]) if kind == "collective" else ""
        peer = rng.choice([*ranks, 7]) if kind == "send" else -1  # 7: not simulated
        start = rng.choice([0.0, 0.5, 1.0]) + rng.random()
        end = start + rng.choice([0.0, rng.random()])  # some empty
        op = Op(id=i, rank=rank, stream=stream, kind=kind, name=kind, axis=axis, key=key, peer=peer)
        out.append(OpRecord(op, start, end))
    return out, ranks


@pytest.mark.parametrize("seed", range(5))
def test_column_reading_equals_record_by_record_on_random_records(seed):
    records, ranks = _random_records(seed)
    _same(busy_intervals(records, ranks), _reference(records, ranks))


def test_column_reading_equals_record_by_record_on_a_moe_step_with_sends_and_offload():
    sc = {**MOE, "training": {**MOE["training"], "offload": {"activations": True}}}
    res = simulate(sc)
    records = res.raw.records
    kinds = set(map(attrgetter("op.kind"), records))
    assert {"compute", "collective", "send", "host"} <= kinds  # every channel kind is exercised
    ranks = tuple(res.trace.ranks)
    _same(busy_intervals(records, ranks), _reference(records, ranks))


def test_lone_collectives_run_from_private_ops_lookup_as_from_their_own():
    res = simulate(MOE)
    eng, fast = rerun_engine(res)
    lone = {op.id for op in res.trace.ops if op.kind == "collective" and eng._members_of(op) == 1}
    assert lone and set(eng._solo) == lone  # every lone collective was looked up once, up front
    slow_eng, slow = rerun_engine(res, private_phases=False)
    assert not slow_eng._solo  # ... and here the stream looks each up itself
    key = attrgetter("op.id", "start_s", "end_s")
    assert sorted(map(key, fast.records)) == sorted(map(key, slow.records))
    assert fast.step_time_s == slow.step_time_s
    assert sorted(fast.mem_events) == sorted(slow.mem_events)


def test_external_targets_from_the_dependency_arrays_equal_the_walk(monkeypatch):
    pairs, moved = [], []
    walk, absorb = Engine._external_targets, loop.absorb

    def spy(self, streams, edges=None):
        assert edges is not None  # the builder's ids are list positions
        found = walk(self, streams, edges)
        pairs.append((set(found), walk(self, streams)))  # a copy: the engine adds host-sync ops to it
        return found

    def spy_absorb(streams, known):
        moved.append(absorb(streams, known))
        return moved[-1]

    monkeypatch.setattr(Engine, "_external_targets", spy)
    monkeypatch.setattr(loop, "absorb", spy_absorb)
    for sc in (MOE, SCENARIOS["dualpipe"], SCENARIOS["tp8-interleaved"]):
        simulate(sc)
    assert any(moved)  # private ops changed process in one case
    for arrays, walked in pairs:
        assert walked and arrays == walked


def test_dispatch_bytes_once_per_layer_equal_the_formula():
    from simulator.scenario.loading import load_scenario
    from workloads.trace.shared import TraceBuilder

    load = {"distribution": "zipf", "skew": 0.5, "seed": 0}
    sc = load_scenario({**MOE, "training": {**MOE["training"], "expert_load": load, "dtype": "fp8"}})
    b = TraceBuilder(sc.workload())
    moe_layers = [l for l in range(b.model.layers) if b.model.is_moe_layer(l)]
    assert len(set(b.load_factor.values())) > 1  # the layers' sizes differ ...
    assert b.t.fp8_dispatch  # ... and a dispatch's from its combine's
    tokens = b.shard.tokens / (b.L.tp if b.L.sequence_parallel else 1)
    for _ in range(2):  # worked out, then remembered
        for l in moe_layers:
            for combine in (False, True):
                per = 1 if (b.t.fp8_dispatch and not combine) else 2
                want = tokens * b.model.moe.top_k * b.model.hidden * per * b.load_factor.get(l, 1.0)
                assert b.dispatch_bytes(combine, l) == want
