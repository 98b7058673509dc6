"""Exporters and plots: the idle spans the engine attributes reach the outputs."""

import json

import pytest

from simulator import simulate
from simulator.results.export import chrome_trace, write_chrome_trace
from workloads.trace.ops import MEMORY_CATEGORIES, STREAMS


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
    json.dumps(events)  # serialisable
    idle = [e for e in events if e.get("cat") == "idle"]
    bubble_us = sum(e["dur"] for e in idle if e["name"] == "bubble")
    expected_us = sum(d["bubble"] for d in pipelined.raw.idle.values()) * 1e6
    assert bubble_us == pytest.approx(expected_us, rel=1e-9)
    assert any(e["name"] == "exposed comm" for e in idle)
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") != "idle"]
    assert len(ops) == len(pipelined.events)


def _drawn_bars(fig):
    """(row, x0, x1, style, full) of every rectangle of the timeline's bar patches; ``full``: the
    piece fills its row's bar height (0.8)."""
    from matplotlib.patches import PathPatch

    out = []
    for p in fig.axes[0].patches:
        if not isinstance(p, PathPatch):
            continue
        v = p.get_path().vertices.reshape(-1, 5, 2)
        style = "bubble" if p.get_hatch() else tuple(p.get_facecolor())
        out += [
            (int(round((a[0, 1] + a[1, 1]) / 2)), a[0, 0], a[2, 0], style, abs(a[1, 1] - a[0, 1]) > 0.8 - 1e-9)
            for a in v
        ]
    return out


def test_timeline_draws_every_bar(pipelined, tmp_path):
    from matplotlib.colors import to_rgba

    from simulator.results.plots import AXIS_COLOURS, PHASE_COLOURS, _time_unit
    from simulator.results.report import stage_labels

    fig = pipelined.plot_timeline(max_ranks=64)
    drawn = _drawn_bars(fig)
    assert drawn
    rows, rank = {}, None
    label_rank = {v: r for r, v in stage_labels(pipelined).items()}
    for y, t in enumerate(fig.axes[0].get_yticklabels()):
        text = t.get_text()
        if text in label_rank:
            rank = label_rank[text]
            rows[(rank, "compute")] = y
        else:
            rows[(rank, text.removesuffix(" comm"))] = y
    k, _ = _time_unit(pipelined.summary["step_time_s"])
    full: dict = {}
    for y, x0, x1, style, whole in drawn:
        if whole:
            full.setdefault((y, style), []).append((x0, x1))
    ev = pipelined.events
    want = [
        (rows[(r, s)], a * k, b * k, tuple(to_rgba(PHASE_COLOURS[ph] if s == "compute" else AXIS_COLOURS[ax or s])))
        for r, s, ph, ax, a, b in zip(ev["rank"], ev["stream"], ev["phase"], ev["axis"], ev["start_s"], ev["end_s"])
        if b > a
    ]
    want += [
        (rows[(r, "compute")], a * k, b * k, "bubble") for r, a, b, c, _ in pipelined.raw.idle_spans if c == "bubble"
    ]
    # a pixel of the laid-out axes at the timeline's 130 dpi (the bins of pixels.bin_shares)
    ax = fig.axes[0]
    px = ax.get_xlim()[1] / (ax.get_position().width * fig.get_figwidth() * 130)
    wide = [w for w in want if w[2] - w[1] >= 3 * px]
    assert len(wide) > 50
    for y, a, b, style in wide:  # each op or bubble three pixels wide fills its row but for a pixel at each end
        assert any(x0 <= a + px + 1e-9 and b - px - 1e-9 <= x1 for x0, x1 in full[(y, style)]), (y, a, b, style)
    fig.savefig(tmp_path / "t.png")


def test_bin_shares_show_a_mix_of_short_ops_at_its_density():
    """Ops shorter than a pixel that repeat every 1.3 pixels, two thirds of each period in one
    colour and a third in another: every pixel shows both, the first at the bottom (a pixel holds
    0.77 of a period: 0.5-0.9 of the height), the second on top, two thirds and a third of the area
    over the run (drawn one by one, the beat between the period and the pixels painted wide
    bands of either colour: docs/formats.md); a bar wider than a pixel is drawn whole; an
    uncovered stretch stays empty; a row busy a third of the time is a third high."""
    import numpy as np

    from simulator.results.pixels import SHARE_LEVELS, bin_shares

    period, n = 1.3, 600
    t = np.arange(n) * period
    end = n * period
    a = (np.concatenate([t, [900.0]]), np.concatenate([t + 2 * period / 3, [950.0]]), np.zeros(n + 1))
    b = (t + 2 * period / 3, t + period, np.zeros(n))
    c = (t, t + period / 3, np.ones(n))  # row 1: busy a third of the time
    (x0, x1, y, b0, b1), (o0, o1, oy, ob0, ob1), (c0, c1, _, cb0, cb1) = bin_shares([a, b, c], 2, 0.0, 1000.0, 1000)
    inside, o_in = (x1 <= end - 1) & (x0 >= 1) & (y == 0), (o1 <= end - 1) & (o0 >= 1)
    width = float(np.sum((x1 - x0)[inside]))
    assert width == float(np.sum((o1 - o0)[o_in])) > end - 4
    assert abs(float(np.sum(((b1 - b0) * (x1 - x0))[inside])) / width - 2 / 3) < 1 / SHARE_LEVELS
    assert abs(float(np.sum(((ob1 - ob0) * (o1 - o0))[o_in])) / width - 1 / 3) < 1 / SHARE_LEVELS
    assert np.all(b0[inside] == 0) and np.all((b1 - b0)[inside] >= 0.5) and np.all(ob0[o_in] > 0)
    assert list(zip(x0[x0 >= 800], x1[x0 >= 800], b0[x0 >= 800], b1[x0 >= 800])) == [(900.0, 950.0, 0.0, 1.0)]
    assert not np.any((x0 >= end + 1) & (x1 <= 899))
    c_in = (c1 <= end - 1) & (c0 >= 1)
    assert (
        abs(float(np.sum(((cb1 - cb0) * (c1 - c0))[c_in])) / float(np.sum((c1 - c0)[c_in])) - 1 / 3) < 1 / SHARE_LEVELS
    )


def test_chrome_trace_names_idle_spans_by_their_cause(pipelined):
    import copy

    res = copy.copy(pipelined)
    res.raw = copy.copy(pipelined.raw)
    # offload_wait: the engine's; checkpoint_wait: a cause it does not have (yet)
    res.raw.idle_spans = list(pipelined.raw.idle_spans) + [
        (0, 0.0, 2e-6, "offload_wait", "offload"),
        (0, 3e-6, 4e-6, "checkpoint_wait", ""),
    ]
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
    labels = {e["pid"]: e["args"]["labels"] for e in events if e.get("ph") == "M" and e["name"] == "process_labels"}
    # TP4 x DP2 = 8 devices per stage; order tp-cp-ep-dp-pp puts stage s on ranks 8s..8s+7
    assert names == {0: "stage 0 (device 0, ×8)", 8: "stage 1 (device 8, ×8)"}
    assert labels == {
        0: "standing for 8 devices: ranks 0–7",
        8: "standing for 8 devices: ranks 8–15",
    }
    exact = chrome_trace(simulate("quickstart", exact=True))["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in exact if e.get("ph") == "M" and e["name"] == "process_name"}
    assert len(names) == 16 and names[13] == "stage 1 (device 13)"
    assert not [e for e in exact if e.get("name") == "process_labels"]


def test_compact_ranks_in_words():
    from simulator.results.report import compact_ranks

    assert compact_ranks(range(384, 512)) == "384–511"
    assert compact_ranks(range(3, 256, 8)) == "3, 11, …, 251 (every 8th)"
    assert (
        compact_ranks([b + i for b in range(0, 128, 16) for i in range(4)])
        == "0–3, 16–19, …, 112–115 (8 blocks of 4, every 16)"
    )
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
        assert dst[0]["ts"] >= src[0]["ts"] + src[0]["dur"] - 1e-6  # it waited for the send to end
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


# ---- tables written from columns, without pandas -------------------------------------------------


def test_csv_files_are_what_pandas_writes(pipelined, tmp_path):
    import numpy as np
    import pandas as pd

    from simulator.results.export import write_csv

    for name in ("events", "memory", "idle", "per_stage"):
        cols = pipelined.table(name)
        write_csv(cols, tmp_path / f"{name}.csv")
        pd.DataFrame(cols).to_csv(tmp_path / f"{name}.pandas.csv", index=False)
        assert (tmp_path / f"{name}.csv").read_bytes() == (tmp_path / f"{name}.pandas.csv").read_bytes(), name
    text = np.empty(6, dtype=object)
    text[:] = ["plain", "a,b", 'say "hi"', "two\nlines", "", "µs–ms"]
    odd = {
        "text": text,
        "x": np.array([0.1 + 0.2, np.nan, 1e-5, -0.0, 1e16, 123.0]),
        "n": np.array([-1, 0, 2**40, 3, 4, 5]),
        "flag": np.array([True, False, True, True, False, False]),
    }
    write_csv(odd, tmp_path / "odd.csv")
    pd.DataFrame(odd).to_csv(tmp_path / "odd.pandas.csv", index=False)
    assert (tmp_path / "odd.csv").read_bytes() == (tmp_path / "odd.pandas.csv").read_bytes()


def test_events_parquet_reads_back_as_the_events_frame(pipelined, tmp_path):
    import pandas as pd

    from simulator.results.export import write_events_parquet
    from simulator.results.parquet import read_metadata

    write_events_parquet(pipelined.table("events"), tmp_path / "e.parquet")
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "e.parquet"), pipelined.events, check_exact=True)
    assert read_metadata(tmp_path / "e.parquet")["stepsim_version"] == pipelined.summary["stepsim_version"]


def test_result_declares_what_it_carries_and_builds_tables_once(pipelined):
    import copy

    from simulator import Result

    assert {"summary", "scenario", "notes", "raw", "trace", "topology"} <= set(Result.__slots__)
    with pytest.raises(AttributeError):
        pipelined.unheard_of = 1  # no attribute is set from outside the class
    assert pipelined.events is pipelined.events and len(pipelined.events) == len(pipelined.raw.records)
    assert list(pipelined.per_stage["stage"]) == sorted(set(pipelined.events["stage"]))
    other = copy.copy(pipelined)
    other.events = pipelined.events[pipelined.events["stream"] == "compute"].reset_index(drop=True)
    assert set(other.table("events")["stream"]) == {"compute"} and len(pipelined.events) > len(other.events)


def test_edits_to_a_table_read_as_a_frame_reach_the_files(tmp_path):
    import pandas as pd

    res = simulate("quickstart")
    res.memory["buffers"] += 1.0  # the frame, edited in place
    res.write(tmp_path, plots=False)
    written = pd.read_csv(tmp_path / "memory.csv")
    assert (written["buffers"] == res.memory["buffers"]).all()
