"""The event loop's lean paths give the old paths' figures to the bit: a collective with no
other simulated member runs in its stream's process without the ``_communicate`` /
``_collective`` / ``run_merged`` generators (``chain_ops=False`` keeps them), and the host
stream issues a whole stretch between two syncs at once (against the recurrence
``S_i = max(S_{i-1} + cost_{i-1}, end(op_{i-1}) if op_{i-1} is a sync)`` worked op by op)."""

from __future__ import annotations

from collections import defaultdict

import pytest
from helpers import rerun_engine, scenario
from test_moe import TINY_MOE

from simulator import simulate
from simulator.engine.host import launches_of
from simulator.engine.loop import Engine

#: Two stages of 8-way EP on 16 H100s with the dispatch's host sync (a sync per MoE layer in
#: forward and recomputation) and a host slow enough to bind somewhere.
MOE = scenario(
    model=dict(TINY_MOE),
    cluster={"preset": "dgx-h100", "devices": 16},
    parallel={"tp": 1, "pp": 2, "dp": 8, "ep": 8},
    training={"seq_len": 1024, "micro_batch_size": 1, "global_batch_size": 16, "host_launch_s": 20e-6},
)


@pytest.fixture(scope="module")
def moe():
    return simulate(MOE)


def _records(raw) -> list:
    return sorted((r.op.id, r.start_s, r.end_s) for r in raw.records)


def test_inline_collectives_give_the_generator_path_to_the_bit(moe, monkeypatch):
    through = []
    plain = Engine._communicate

    def spy(self, op):
        through.append(op.kind)
        return plain(self, op)

    monkeypatch.setattr(Engine, "_communicate", spy)
    eng, fast = rerun_engine(moe)
    lone = [op for op in moe.trace.ops if op.kind == "collective" and eng._members_of(op) == 1]
    assert lone  # the case exercises the inline path (or the private one) ...
    assert through.count("collective") == sum(op.kind == "collective" for op in moe.trace.ops) - len(lone)
    through.clear()
    _, slow = rerun_engine(moe, chain_ops=False, private_phases=False)
    assert through.count("collective") == sum(op.kind == "collective" for op in moe.trace.ops)  # ... the old one not
    assert _records(fast) == _records(slow)  # every op's start and end, bit for bit
    assert fast.step_time_s == slow.step_time_s
    assert sorted(fast.mem_events) == sorted(slow.mem_events)
    assert fast.network_stats == slow.network_stats
    assert fast.host_delay_by_op_s == slow.host_delay_by_op_s


def _recurrence(trace, end_time: dict, launch_s: float) -> dict:
    """Each op's host issue start, op by op in program order (simulator.engine.host's notes)."""
    out = {}
    by_rank = defaultdict(list)
    for op in trace.ops:
        by_rank[op.rank].append(op)
    for ops in by_rank.values():
        t = 0.0
        for k, op in enumerate(ops):
            if k and ops[k - 1].host_sync:
                t = max(t, end_time[ops[k - 1].id])
            out[op.id] = t
            t += launches_of(op) * launch_s
    return out


def test_host_stretches_issue_as_the_recurrence(moe):
    eng, raw = rerun_engine(moe)
    host = raw.host
    assert host is not None and any(op.host_sync for op in moe.trace.ops)
    assert raw.host_delay_s  # the host binds somewhere: its times reach the records
    want = _recurrence(moe.trace, eng.end_time, moe.scenario.training.launch_s("hopper"))
    assert host._start == want  # bit for bit, every op
    assert host.end == {i: s + launches_of(eng.ops_by_id[i]) * host.launch_s for i, s in want.items()}


def test_a_sync_stretch_waits_for_the_sync(moe):
    """The stretch after a sync starts at the sync's end where the host got there first."""
    eng, raw = rerun_engine(moe)
    host = raw.host
    ops = [op for op in moe.trace.ops if op.rank == moe.trace.ranks[0]]
    waited = [
        (ops[k].id, eng.end_time[ops[k - 1].id])
        for k in range(1, len(ops))
        if ops[k - 1].host_sync and host._start[ops[k].id] == eng.end_time[ops[k - 1].id]
    ]
    assert waited  # some stretch started exactly at its sync's end
    assert host.sync_wait_s[moe.trace.ranks[0]] > 0
