"""Exporters and plots: the idle spans the engine attributes reach the outputs."""

import json

import pytest

from simulator import simulate
from simulator.export import chrome_trace, write_chrome_trace
from workloads.ops import MEMORY_CATEGORIES, STREAMS


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


# ---- Perfetto traces that explain themselves ---------------------------------------------


@pytest.fixture(scope="module")
def quick():
    # Llama-3-8B, TP4 PP2 DP2 on 16 H100s, 1F1B, 16 micro-batches: one simulated rank per stage
    return simulate("quickstart")


def _slices(events):
    out = {}
    for e in events:
        if e.get("ph") == "X":
            out.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e))
    return out


def _enclosing(slices, e):
    """The op slice (not an idle span) on e's track that holds e's timestamp strictly inside."""
    return [x for s, t, x in slices.get((e["pid"], e["tid"]), []) if s < e["ts"] < t and x.get("cat") != "idle"]


@pytest.mark.slow
def test_process_names_say_which_devices_a_rank_stands_for(quick):
    events = chrome_trace(quick)["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    # TP4 x DP2 = 8 devices per stage; order tp-cp-ep-dp-pp puts stage s on ranks 8s..8s+7
    assert names == {0: "stage 0: device 0, standing for 8 devices (ranks 0–7)",
                     8: "stage 1: device 8, standing for 8 devices (ranks 8–15)"}
    exact = chrome_trace(simulate("quickstart", exact=True))["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in exact if e.get("ph") == "M" and e["name"] == "process_name"}
    assert len(names) == 16 and names[13] == "stage 1: device 13"


def test_compact_ranks_in_words():
    from simulator.report import compact_ranks

    assert compact_ranks(range(384, 512)) == "384–511"
    assert compact_ranks(range(3, 256, 8)) == "3, 11, …, 251 (every 8th)"
    assert compact_ranks([b + i for b in range(0, 128, 16) for i in range(4)]) == \
        "0–3, 16–19, …, 112–115 (8 blocks of 4, every 16)"
    assert compact_ranks([1, 2, 5, 9, 30, 31, 77]) == "1–2, 5, 9, … (7 devices)"


def test_flows_join_each_pipeline_send_to_the_op_that_waited(quick):
    events = chrome_trace(quick)["traceEvents"]
    starts = {e["id"]: e for e in events if e.get("ph") == "s"}
    ends = {e["id"]: e for e in events if e.get("ph") == "f"}
    assert set(starts) == set(ends)
    # 1F1B over PP2 with 16 micro-batches: one forward send 0->1 and one backward send 1->0 per
    # micro-batch, 2 x 16 x (pp - 1) = 32 arrows, and no other cross-device dependency
    assert len(starts) == 32
    slices = _slices(events)
    for i, s in starts.items():
        f = ends[i]
        assert (s["name"], s["cat"]) == (f["name"], f["cat"]) == ("pipeline send", "flow")
        assert f["bp"] == "e" and s["pid"] != f["pid"]
        src, dst = _enclosing(slices, s), _enclosing(slices, f)
        assert len(src) == 1 and src[0]["name"].startswith("send.") and src[0]["tid"] == STREAMS.index("pp")
        assert len(dst) == 1
        assert dst[0]["ts"] >= src[0]["ts"] + src[0]["dur"] - 1e-6       # it waited for the send to end
        assert src[0]["args"]["mb"] == s["args"]["mb"]


def test_memory_counters_per_device_and_category(quick):
    events = chrome_trace(quick)["traceEvents"]
    counters = [e for e in events if e.get("ph") == "C"]
    assert {e["pid"] for e in counters} == {0, 8}
    assert all(set(e["args"]) == set(MEMORY_CATEGORIES) for e in counters)
    peak = max(sum(e["args"].values()) for e in counters)
    assert peak == pytest.approx(quick.summary["peak_memory_bytes"] / 1e9, rel=1e-12)
    assert len(counters) == len(quick.memory)


def test_trace_file_streamed_plain_and_gzipped(quick, tmp_path):
    import gzip

    want = json.loads(json.dumps(chrome_trace(quick)))
    plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
    write_chrome_trace(quick, plain)
    quick.to_chrome_trace(packed)
    assert json.loads(plain.read_text()) == want
    with gzip.open(packed, "rt") as f:
        assert json.load(f) == want
    assert packed.stat().st_size < plain.stat().st_size / 5
