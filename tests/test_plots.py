"""Plots: no backend chosen by the library, text fit for a slide, distinct hues with legends
for whatever the engine reports, rows that name their devices, sweep axes in words."""

from __future__ import annotations

import copy
import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import TINY_MODEL, scenario
from matplotlib.colors import to_rgb
from matplotlib.text import Text

from simulator import simulate
from simulator.results.plots import (
    IDLE_COLOURS,
    MIN_FONT_PT,
    PHASE_COLOURS,
    SLIDE_WIDTH_IN,
    plot_memory,
    plot_timeline,
)

ROOT = Path(__file__).resolve().parent.parent

# Tiny model, TP2 x PP2 x DP4 on 16 H100s (Megatron rank order tp, cp, ep, dp, pp): stage 0 is
# ranks 0-1 of each of 4 data-parallel replicas, stage 1 ranks 8-9 of each.
PIPE = scenario(cluster={"devices": 16}, parallel={"tp": 2, "pp": 2, "dp": 4})


@pytest.fixture(scope="module")
def piped():
    return simulate(PIPE)


def _texts(fig) -> list[Text]:
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def _check_slide(fig, name):
    w, _ = fig.get_size_inches()
    assert w <= SLIDE_WIDTH_IN, f"{name}: {w} in wide, a 16:9 slide is {SLIDE_WIDTH_IN} in"
    small = [(t.get_text()[:30], t.get_fontsize()) for t in _texts(fig) if t.get_fontsize() < MIN_FONT_PT]
    assert not small, f"{name}: text below {MIN_FONT_PT} pt: {small[:5]}"


def _lab(colour) -> np.ndarray:
    """CIELAB (D65) of an sRGB colour: IEC 61966-2-1 linearisation, CIE 1976 L*a*b*."""
    rgb = np.array(to_rgb(colour))
    lin = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ lin
    xyz /= np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def _delta_e(a, b) -> float:
    return float(np.linalg.norm(_lab(a) - _lab(b)))


def _legend_entries(fig) -> dict[str, tuple]:
    out = {}
    for leg in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]:
        for handle, text in zip(leg.legend_handles, leg.get_texts()):
            out[text.get_text()] = (handle.get_facecolor(), handle.get_hatch())
    return out


# ---- the backend is the user's ----------------------------------------------------------------------


@pytest.mark.slow
def test_library_never_switches_the_backend(tmp_path):
    """With a backend already chosen (svg standing in for a notebook's inline backend),
    importing stepsim and drawing every kind of figure leaves it in place."""
    code = f"""
import matplotlib
matplotlib.use("svg")
import simulator, simulator.results.plots, simulator.studies.compare, simulator.studies.sweep.plots, simulator.studies.validate, simulator.studies.bench
import topologies.plot
from simulator import simulate
from simulator.studies.compare import compare_schedules, plot_comparison
from topologies import build_cluster, plot_topology
assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
res = simulate({PIPE!r})
res.plot_timeline(); res.plot_memory()
simulator.studies.bench.plot_busbw([{{"size_bytes": 1, "busbw_bytes_per_s": 1e9, "algorithm": "ring"}}], r"{tmp_path / "b.png"}")
plot_topology(build_cluster(res.scenario.cluster))
print(matplotlib.get_backend())
"""
    env = {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND", "DISPLAY")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "svg"


@pytest.mark.slow
def test_cli_writes_pngs_with_no_display_and_no_backend_set(tmp_path):
    """`stepsim run` in a plain shell: no MPLBACKEND, no DISPLAY; matplotlib's own choice
    (Agg) draws the PNGs."""
    sc = tmp_path / "s.yaml"
    import yaml

    sc.write_text(yaml.safe_dump(PIPE))
    env = {k: v for k, v in os.environ.items() if k not in ("MPLBACKEND", "DISPLAY", "WAYLAND_DISPLAY")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-m", "simulator.cli", "run", str(sc), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    for name in ("timeline.png", "memory.png"):
        data = (tmp_path / "o" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


# ---- text size -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_run_figures_are_slide_sized_with_10pt_text(piped, tmp_path):
    _check_slide(plot_timeline(piped, tmp_path / "t.png"), "timeline")
    _check_slide(plot_memory(piped, tmp_path / "m.png"), "memory")


def test_compare_figure_has_10pt_text_and_a_legend(tmp_path):
    from simulator.studies.compare import compare_schedules, plot_comparison

    table, results = compare_schedules(PIPE, ["gpipe", "1f1b"])
    fig = plot_comparison(table, results, tmp_path / "compare.png")
    _check_slide(fig, "compare")
    # GPipe on 2 stages: forward, backward, optimizer and a pipeline bubble are drawn
    assert {"forward", "backward", "optimizer", "bubble"} <= set(_legend_entries(fig))


def _sweep_frame() -> pd.DataFrame:
    rows = []
    for pp, tp, nic in itertools.product([1, 2, 4, 8, 16], [1, 2], [12.5e9, 50e9]):
        rows.append(
            {
                "case": len(rows),
                "parallel.pp": pp,
                "parallel.tp": tp,
                "cluster.network.nic_bw_bytes_per_s": nic,
                "status": "ok",
                "step_time_s": 10 / pp + tp,
                "mfu": 0.3 + 0.01 * pp,
                "peak_memory_bytes": 90e9 / pp,
                "hbm_bytes": 80e9,
            }
        )
    return pd.DataFrame(rows)


def test_sweep_plots_words_integer_ticks_and_10pt_text(tmp_path):
    from simulator.studies.sweep.plots import plot_heatmap, plot_metric
    from simulator.studies.sweep.plots import plot_memory as sweep_memory

    f = _sweep_frame()
    fig = plot_metric(f, "parallel.pp", "step_time_s", hue="parallel.tp")
    ax = fig.axes[0]
    fig.savefig(tmp_path / "a.png")
    assert ax.get_xlabel() == "pipeline stages (pp)"
    assert ax.get_ylabel() == "step time (s)"
    # pp = 1..16 in powers of two: a base-2 axis ticked at each value, in whole numbers
    assert ax.get_xscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8", "16"]
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {"tp=1", "tp=2"}
    _check_slide(fig, "sweep metric")
    fig = plot_metric(f, "cluster.network.nic_bw_bytes_per_s", "mfu", hue="parallel.pp")
    ax = fig.axes[0]
    fig.savefig(tmp_path / "b.png")
    assert ax.get_xlabel() == "NIC bandwidth (GB/s)"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["12.5", "50"]  # in GB/s, not 1.25e10
    _check_slide(fig, "sweep metric (bandwidth)")
    fig = sweep_memory(f, "parallel.pp", hue="parallel.tp")
    fig.savefig(tmp_path / "c.png")
    _check_slide(fig, "sweep memory")
    fig = plot_heatmap(f, "parallel.pp", "parallel.tp", "mfu")
    fig.savefig(tmp_path / "d.png")
    assert fig.axes[0].get_ylabel() == "tensor-parallel size (tp)"
    _check_slide(fig, "sweep heatmap")


def test_topology_pictures_have_10pt_text(piped, tmp_path):
    from simulator.scenario.loading import load_scenario
    from topologies import build_cluster, plot_topology

    fig = plot_topology(build_cluster(piped.scenario.cluster), tmp_path / "sw.png")
    _check_slide(fig, "switched topology")
    torus = load_scenario(scenario(cluster={"preset": "tpu-v5p", "devices": 64}, parallel={"tp": 4, "dp": 16}))
    fig = plot_topology(build_cluster(torus.cluster), tmp_path / "torus.png")
    _check_slide(fig, "torus topology")


# ---- hues and legends ------------------------------------------------------------------------------


def test_idle_time_stands_apart_from_every_phase_colour():
    # CIE 1976 colour difference: ~2.3 is a just-noticeable difference (Sharma 2003, Digital
    # Color Imaging Handbook); the old pink exposed-comm (#F2B8B8) was 33 from the recompute
    # lilac and 49 from the optimizer purple. Idle now keeps at least 60 from every phase.
    for cause, idle in IDLE_COLOURS.items():
        for phase, colour in PHASE_COLOURS.items():
            assert _delta_e(idle, colour) >= 60, (cause, phase)


def test_timeline_legend_lists_what_is_drawn_in_distinct_colours(piped):
    fig = plot_timeline(piped)
    legend = _legend_entries(fig)
    assert {"forward", "backward", "optimizer", "bubble", "exposed comm (idle)", "tp comm"} <= set(legend)
    solid = {k: v[0] for k, v in legend.items() if not v[1]}
    for (a, ca), (b, cb) in itertools.combinations(solid.items(), 2):
        assert _delta_e(ca[:3], cb[:3]) >= 15, (a, b)


def test_a_new_idle_cause_gets_its_own_hue_and_legend_entry(piped):
    res = copy.copy(piped)
    res.raw = copy.copy(piped.raw)
    rank = min(r for r, *_ in piped.raw.idle_spans)
    # "offload_wait" has its own colour; "checkpoint_wait" stands for a cause the engine may add
    res.raw.idle_spans = list(piped.raw.idle_spans) + [
        (rank, 0.0, 1e-4, "offload_wait", "offload"),
        (rank, 2e-4, 3e-4, "checkpoint_wait", ""),
    ]
    fig = plot_timeline(res)
    legend = _legend_entries(fig)
    assert {"offload wait (idle)", "checkpoint wait (idle)"} <= set(legend)
    assert tuple(legend["offload wait (idle)"][0][:3]) == to_rgb(IDLE_COLOURS["offload_wait"])
    new = legend["checkpoint wait (idle)"][0][:3]
    for name, (colour, hatch) in legend.items():
        if name != "checkpoint wait (idle)" and not hatch:
            assert _delta_e(new, colour[:3]) >= 15, name


# ---- rows name their devices ------------------------------------------------------------------------


def test_timeline_rows_name_the_devices_they_stand_for(piped):
    from simulator.results.report import stage_labels

    # TP2 x DP4: each stage's simulated device stands for 8
    assert stage_labels(piped) == {0: "stage 0 (device 0, ×8)", 8: "stage 1 (device 8, ×8)"}
    fig = plot_timeline(piped, show_comm=False)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == [
        "stage 0 (device 0, ×8)",
        "stage 1 (device 8, ×8)",
    ]
    exact = simulate(scenario(cluster={"devices": 4}, parallel={"tp": 2, "pp": 2, "dp": 1}), exact=True)
    assert list(stage_labels(exact).values()) == [
        "stage 0 (device 0)",
        "stage 0 (device 1)",
        "stage 1 (device 2)",
        "stage 1 (device 3)",
    ]


def test_one_label_per_stage_in_every_output(piped, tmp_path):
    """The PNG timeline's rows, the memory figure's curves, the HTML timeline's rows, the HTML
    memory figure's curves and the Perfetto trace's processes name a stage alike."""
    pytest.importorskip("plotly")
    from simulator.results.export import chrome_trace
    from simulator.results.html_data import load_run_dir, run_data
    from simulator.results.html_report import memory_figure
    from simulator.results.html_timeline import timeline_with_bars

    want = ["stage 0 (device 0, ×8)", "stage 1 (device 8, ×8)"]
    png = [t.get_text() for t in plot_timeline(piped).axes[0].get_yticklabels() if t.get_text().startswith("stage")]
    mem = [t.get_text() for t in plot_memory(piped).axes[0].get_legend().get_texts()]
    html = [t for t in timeline_with_bars(run_data(piped))[0].layout.yaxis.ticktext if t.startswith("stage")]
    trace = chrome_trace(piped)["traceEvents"]
    perfetto = [e["args"]["name"] for e in trace if e.get("ph") == "M" and e["name"] == "process_name"]
    assert png == html == perfetto == want
    assert [m for m in mem if m.startswith("stage")] == want
    html_mem = [t.name for t in memory_figure(run_data(piped)).data if (t.name or "").startswith("stage")]
    assert html_mem == want
    # read back from a run directory, the report names them alike too
    piped.write(tmp_path / "run", plots=False)
    assert [load_run_dir(tmp_path / "run").labels[r] for r in (0, 8)] == want


# ---- progress bars ---------------------------------------------------------------------------------


def test_progress_true_shows_a_bar_even_off_a_terminal(capfd):
    from simulator.studies.sweep import sweep

    simulate(PIPE, progress=True)
    assert "simulating" in capfd.readouterr().err  # stderr is a pipe here, not a terminal
    simulate(PIPE, progress=None)
    assert "simulating" not in capfd.readouterr().err
    spec = {"name": "bar", "base": PIPE, "grid": {"schedule": ["1f1b"]}}
    sweep(spec, progress=True, jobs=1)
    assert "bar: 100%" in capfd.readouterr().err
    sweep(spec, progress=None, jobs=1)
    assert "bar:" not in capfd.readouterr().err


# ---- figures a slide can hold, legends clear of the data ---------------------------------------------


@pytest.fixture(scope="module")
def long_pipe():
    # 16 pipeline stages, 2 data-parallel replicas: 16 compute rows and their communication rows
    model = copy.deepcopy(TINY_MODEL)
    model["layers"] = 16
    return simulate(
        scenario(
            model=model,
            cluster={"devices": 32},
            parallel={"tp": 1, "pp": 16, "dp": 2},
            training={"global_batch_size": 32},
        )
    )


def _legend_overlaps(fig) -> list[str]:
    """Drawn data (lines, fills, bars) that a legend of ``fig`` covers, in display
    coordinates: each legend's window extent, clipped to an axes' plot area, against the
    paths of that axes' lines (as drawn: steps), collections and patches."""
    from matplotlib import cbook
    from matplotlib.path import Path as MplPath
    from matplotlib.transforms import Bbox

    fig.draw_without_rendering()
    renderer = fig._get_renderer()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    hits = []
    for leg in legends:
        box = leg.get_window_extent(renderer)
        for ax in fig.axes:
            area = Bbox.intersection(box, ax.get_window_extent(renderer))
            if area is None or area.width <= 0 or area.height <= 0:
                continue
            for line in ax.get_lines():
                x, y = line.get_data()
                style = line.get_drawstyle()
                if style in cbook.STEP_LOOKUP_MAP and style != "default":
                    x, y = cbook.STEP_LOOKUP_MAP[style](np.asarray(x, float), np.asarray(y, float))
                xy = line.get_transform().transform(np.column_stack([np.asarray(x, float), np.asarray(y, float)]))
                if MplPath(xy).intersects_bbox(area, filled=False):
                    hits.append(f"{leg.get_texts()[0].get_text()!r} legend covers line {line.get_label()!r}")
            for coll in ax.collections:
                tr = coll.get_transform()
                if any(p.transformed(tr).intersects_bbox(area) for p in coll.get_paths()):
                    hits.append(f"legend covers {type(coll).__name__}")
            for patch in ax.patches:
                if patch.get_path().transformed(patch.get_transform()).intersects_bbox(area):
                    hits.append(f"legend covers {type(patch).__name__}")
    return hits


def test_the_legend_check_sees_a_legend_over_a_line():
    from simulator.results.plots import new_figure

    fig, ax = new_figure((6, 4))
    ax.step([0, 0.1, 0.9], [0, 1, 1], where="post", label="step")  # up at x = 0.1, then flat
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left")  # over the rise at x = 0.1
    assert _legend_overlaps(fig)
    ax.legend(loc="lower right")
    assert not _legend_overlaps(fig)


def test_png_legends_cover_no_data(piped, long_pipe):
    for name, fig in [
        ("timeline", plot_timeline(piped)),
        ("memory", plot_memory(piped)),
        ("long timeline", plot_timeline(long_pipe)),
        ("long memory", plot_memory(long_pipe)),
    ]:
        assert _legend_overlaps(fig) == [], name


def test_memory_curves_have_distinct_colours_and_few_legend_entries(piped, long_pipe):
    from matplotlib.colors import to_hex

    from simulator.results.plots import HBM_COLOUR, MAX_LEGEND_CURVES

    for res, n in ((piped, 2), (long_pipe, 16)):
        fig = plot_memory(res)
        ax = fig.axes[0]
        curves = [line for line in ax.get_lines() if line.get_label() != "HBM capacity" and len(line.get_xdata()) > 2]
        colours = [to_hex(line.get_color()) for line in curves]
        assert len(curves) == n and len(set(colours)) == n, colours
        assert all(_delta_e(c, HBM_COLOUR) >= 15 for c in colours)
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        assert len(texts) <= MAX_LEGEND_CURVES + 1, texts
        _check_slide(fig, "memory")
    # 16 stages: coloured along a colour bar of the stages, the legend names the HBM line only
    assert [t.get_text() for t in plot_memory(long_pipe).axes[0].get_legend().get_texts()] == ["HBM capacity"]


def test_long_pipelines_fold_into_a_slide(long_pipe, tmp_path):
    from PIL import Image

    from simulator.results.plots import MAX_TIMELINE_ROWS
    from simulator.results.report import stage_labels

    fig = plot_timeline(long_pipe, tmp_path / "t.png")
    ticks = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(ticks) <= MAX_TIMELINE_ROWS
    # every stage's compute row, the first device's communication rows, and a note saying so
    assert [t for t in ticks if t.startswith("stage")] == list(stage_labels(long_pipe).values())
    assert "pp comm" in ticks[:4]
    assert "communication rows of the first device only" in fig.axes[0].get_title()
    w, h = Image.open(tmp_path / "t.png").size
    assert w <= 1600 and h <= 1400, (w, h)
    # every row when asked for
    assert len(plot_timeline(long_pipe, max_rows=1000).axes[0].get_yticklabels()) > 2 * 16


def test_more_devices_than_rows_show_one_per_stage():
    from simulator.results.plots import _timeline_rows

    # 64 devices, 2 per stage, each with a tp stream: one row per stage's first device
    rank = np.repeat(np.arange(64), 2)
    stream = np.array(["compute", "tp"] * 64, dtype=object)
    stages = {r: r // 2 for r in range(64)}
    rows, note = _timeline_rows(rank, stream, 64, True, 24, stages)
    assert len(rows) == 24 and rows[:2] == [(0, "compute"), (0, "tp")]
    shown = [r for r, s in rows if s == "compute"]
    assert shown[0] == 0 and shown[-1] == 62 and all(r % 2 == 0 for r in shown)
    assert "23 of 32 stages (their first device)" in note


@pytest.mark.parametrize("preset, devices", [("gb200-nvl72", 576), ("dgx-h100", 1024)])
def test_topology_boxes_and_labels_do_not_overlap(preset, devices):
    """Switched topologies are drawn as boxes side by side, one row per layer: no box over
    another, every label inside its own box, overlapping no other label, and said once."""
    from topologies import build_cluster, plot_topology
    from topologies.presets import cluster_preset

    fig = plot_topology(build_cluster(cluster_preset(preset, devices)))
    fig.draw_without_rendering()
    renderer = fig._get_renderer()
    ax = fig.axes[0]
    boxes = [p.get_window_extent(renderer) for p in ax.patches if str(p.get_gid()).startswith("node:")]
    labels = [t for t in ax.texts if t.get_gid() == "label"]
    extents = [t.get_window_extent(renderer) for t in labels]
    assert len(boxes) == len(labels) >= 10  # domains, leaf groups, spine
    for (i, a), (j, b) in itertools.combinations(enumerate(boxes), 2):
        assert not a.overlaps(b), (labels[i].get_text(), labels[j].get_text())
    for (i, a), (j, b) in itertools.combinations(enumerate(extents), 2):
        assert not a.overlaps(b), (labels[i].get_text(), labels[j].get_text())
    for text, ext in zip(labels, extents):
        assert any(box.x0 <= ext.x0 and ext.x1 <= box.x1 and box.y0 <= ext.y0 and ext.y1 <= box.y1 for box in boxes), (
            text.get_text()
        )
    names = [t.get_text() for t in labels]
    assert len(set(names)) == len(names), names
    legend = ax.get_legend().get_window_extent(renderer)
    assert not any(legend.overlaps(b) for b in boxes)
    _check_slide(fig, preset)


def test_timeline_png_shows_exposed_communication_where_it_happens(tmp_path):
    """A MoE step whose ops are narrower than a pixel (Qwen3-30B on 8 GB200: 3,072 expert
    all-to-alls in 8.6 s, 28 % of it exposed): over every stretch of 40 pixels of the compute row
    saved at 130 dpi, as ``stepsim run --out`` saves it, the share of red (exposed
    communication) pixels is the share of that stretch's time that ``idle.csv`` says was exposed,
    to 6 points. Drawn one bar at a time, the beat between the layers' period and the pixel grid
    had painted stretches red where a third of the time was (47 points off)."""
    from matplotlib.image import imread

    res = simulate(ROOT / "validation" / "nemo-perf" / "mbridge-qwen3-30b-8xgb200-mxfp8.yaml")
    fig = plot_timeline(res)
    ax, scale = fig.axes[0], 130 / fig.dpi
    fig.savefig(tmp_path / "t.png", dpi=130)
    img = imread(tmp_path / "t.png")[..., :3]
    step_ms = res.summary["step_time_s"] * 1e3
    (x0, y_top), (x1, y_bottom) = ax.transData.transform([(0, -0.4), (step_ms, 0.4)]) * scale
    height = img.shape[0]
    lo, hi = sorted((height - y_top, height - y_bottom))
    row = img[int(lo) + 2 : int(hi) - 1, int(x0) : int(x1)]
    red = (np.abs(row - np.array(to_rgb(IDLE_COLOURS["exposed_comm"]))).max(axis=2) < 0.03).mean(axis=0)
    n = len(red)
    edges = np.linspace(0.0, res.summary["step_time_s"], n + 1)
    idle = res.idle
    spans = idle[(idle["cause"] == "exposed_comm") & (idle["rank"] == 0)]
    # seconds of exposed communication before each pixel edge, from the spans' cumulative cover
    a, b = np.sort(spans["start_s"].to_numpy()), np.sort(spans["end_s"].to_numpy())
    ca, cb = np.concatenate([[0.0], np.cumsum(a)]), np.concatenate([[0.0], np.cumsum(b)])
    ia, ib = np.searchsorted(a, edges), np.searchsorted(b, edges)
    covered = (edges * ia - ca[ia]) - (edges * ib - cb[ib])
    win = 40
    for i in range(0, n - win, win):
        truth = (covered[i + win] - covered[i]) / (edges[i + win] - edges[i])
        assert abs(red[i : i + win].mean() - truth) < 0.06, (i, red[i : i + win].mean(), truth)
