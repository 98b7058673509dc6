"""The one place the engine reaches into simpy's private state: ``_Environment.timeout_at``
(simulator/engine/loop.py) builds an event already triggered (``_ok``, ``_value``) and
pushes it on the environment's queue (``_queue``, ``_eid``) at an absolute time, because
``env.timeout(t - now)`` need not land on ``t`` in floating point. simpy is pinned to the
minor version this is written against (pyproject.toml); these tests fail if a simpy
release changes the fields it relies on."""

from __future__ import annotations

import simpy

from simulator.engine.loop import _Environment


def test_simpy_is_the_pinned_minor_version():
    major, minor = (int(x) for x in simpy.__version__.split(".")[:2])
    assert (major, minor) == (4, 1)


def test_timeout_at_fires_at_exactly_the_absolute_time():
    env = _Environment()
    # 0.1 + 0.2 != 0.3: a relative timeout from 0.1 would not land on 0.3 exactly
    fired = []

    def proc():
        yield env.timeout(0.1)
        got = yield env.timeout_at(0.3)
        fired.append((env.now, got))

    env.process(proc())
    env.run()
    assert fired == [(0.3, None)]


def test_timeout_at_orders_with_other_events_by_time_then_insertion():
    env = _Environment()
    order = []
    a = env.timeout_at(2.0)
    b = env.timeout(1.0)
    c = env.timeout_at(2.0)
    for name, ev in (("a", a), ("b", b), ("c", c)):
        ev.callbacks.append(lambda e, name=name: order.append((env.now, name)))
    env.run()
    assert order == [(1.0, "b"), (2.0, "a"), (2.0, "c")]
    assert a.ok and a.value is None and a.processed
