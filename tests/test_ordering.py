"""Windows of communication ops on their rank's compute stream (simulator.engine.ordering):
which ops provably never run at once, on hand-built traces."""

from __future__ import annotations

import math

from simulator.engine.ordering import RankWindows
from workloads.trace.ops import Op, Trace


def _trace(ops: list[Op]) -> Trace:
    return Trace(ops=ops, ranks=(0,), weight={0: 1}, static_memory={0: {}}, world=1)


def _layer() -> list[Op]:
    """c0 -> tp -> c1 -> ep -> c2 on rank 0; a dp gather with no deps that c2 waits for, and a
    send after c1 that nothing of the rank waits for."""
    return [
        Op(0, 0, "compute", "compute", "c0"),
        Op(1, 0, "tp", "collective", "tp.ag", deps=(0,)),
        Op(2, 0, "compute", "compute", "c1", deps=(1,)),
        Op(3, 0, "ep", "collective", "dispatch", deps=(2,)),
        Op(4, 0, "dp", "collective", "param_ag"),
        Op(5, 0, "compute", "compute", "c2", deps=(3, 4)),
        Op(6, 0, "pp", "send", "send.F", deps=(2,)),
    ]


def test_windows_are_the_compute_ops_around_each_op():
    win = RankWindows(_trace(_layer())).window(0)
    assert win[1] == (0, 1.0)  # after c0, before c1
    assert win[3] == (1, 2.0)
    assert win[4] == (-1, 2.0)  # no deps: from the start
    assert win[6][0] == 1 and math.isinf(win[6][1])  # nothing waits for it


def test_ops_between_other_compute_ops_are_ordered():
    w = RankWindows(_trace(_layer()))
    assert w.ordered(0, [1], ["ep"]).tolist() == [True]  # tp.ag ends before c1, dispatch starts after it
    assert w.ordered(0, [1], ["dp"]).tolist() == [False]  # the gather may run from the start
    assert w.ordered(0, [1], ["pp"]).tolist() == [True]  # the send starts after c1 ends
    assert w.ordered(0, [3], ["pp"]).tolist() == [False]  # and may still run beside dispatch


def test_a_stream_runs_its_ops_in_order():
    """The first of two ops on a stream, which nothing waits for, ends before the second starts:
    it inherits the second's bound (ZeRO-1 gathers, dense then expert, the forward waiting on
    the last)."""
    ops = [
        Op(0, 0, "dp", "collective", "dense.param_ag"),
        Op(1, 0, "dp", "collective", "expert.param_ag"),
        Op(2, 0, "compute", "compute", "c0", deps=(1,)),
        Op(3, 0, "tp", "collective", "tp.ag", deps=(2,)),
        Op(4, 0, "compute", "compute", "c1", deps=(3,)),
    ]
    w = RankWindows(_trace(ops))
    assert w.window(0)[0] == (-1, 0.0)
    assert w.ordered(0, [3], ["dp"]).tolist() == [True]
