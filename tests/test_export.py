"""Exporters and plots: the idle spans the engine attributes reach the outputs."""

import json

import pytest

from simulator import simulate
from simulator.export import chrome_trace


@pytest.fixture(scope="module")
def pipelined():
    # Llama-3-8B, TP2 PP4 DP2, GPipe: a quarter of the step is pipeline bubble
    return simulate("schedules-llama3-8b-16xh100")


def test_idle_spans_add_up_to_the_attributed_idle_time(pipelined):
    raw = pipelined.raw
    assert raw.idle_spans
    for rank, idle in raw.idle.items():
        for cause in ("bubble", "exposed_comm"):
            spans = sum(e - s for r, s, e, c, _ in raw.idle_spans if r == rank and c == cause)
            assert spans == pytest.approx(idle[cause], rel=1e-9, abs=1e-12)


def test_chrome_trace_shows_bubbles_and_exposed_comm(pipelined):
    events = chrome_trace(pipelined)["traceEvents"]
    json.dumps(events)                       # serialisable
    idle = [e for e in events if e.get("cat") == "idle"]
    bubble_us = sum(e["dur"] for e in idle if e["name"] == "bubble")
    expected_us = sum(d["bubble"] for d in pipelined.raw.idle.values()) * 1e6
    assert bubble_us == pytest.approx(expected_us, rel=1e-9)
    assert any(e["name"] == "exposed comm" for e in idle)
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") != "idle"]
    assert len(ops) == len(pipelined.events)


def test_timeline_draws_every_bar(pipelined, tmp_path):
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import PathPatch
    from matplotlib.path import Path

    fig = pipelined.plot_timeline(max_ranks=64)
    bars = sum(len(c.get_paths()) for c in fig.axes[0].collections if isinstance(c, PolyCollection))
    # hatched bubbles: one compound path per row, one closed rectangle per bubble
    bars += sum(int((p.get_path().codes == Path.CLOSEPOLY).sum()) for p in fig.axes[0].patches
                if isinstance(p, PathPatch))
    ev = pipelined.events
    assert bars == int((ev["duration_s"] > 0).sum()) + len(pipelined.raw.idle_spans)
    fig.savefig(tmp_path / "t.png")


def test_chrome_trace_names_idle_spans_by_their_cause(pipelined):
    import copy

    res = copy.copy(pipelined)
    res.raw = copy.copy(pipelined.raw)
    # offload_wait: the engine's; checkpoint_wait: a cause it does not have (yet)
    res.raw.idle_spans = list(pipelined.raw.idle_spans) + [(0, 0.0, 2e-6, "offload_wait", "offload"),
                                                           (0, 3e-6, 4e-6, "checkpoint_wait", "")]
    idle = [e for e in chrome_trace(res)["traceEvents"] if e.get("cat") == "idle"]
    assert {e["name"] for e in idle} == {"bubble", "exposed comm", "offload wait", "checkpoint wait"}
    for name, dur in (("offload wait", 2.0), ("checkpoint wait", 1.0)):
        new = [e for e in idle if e["name"] == name]
        assert len(new) == 1 and new[0]["dur"] == pytest.approx(dur) and new[0]["cname"] not in ("grey", "terrible")
