"""The HTML report: one self-contained page per run (or per schedule comparison).

``stepsim report DIR --html`` (and ``stepsim run ... --out DIR --html``) writes
``DIR/report.html``: the headline figures, an interactive timeline (zoom by dragging
or scrolling, hover for an op's name, start and duration; pipeline bubbles, exposed
communication and offload wait marked on each compute row), memory in use per
pipeline stage with the breakdown of the stage that peaks, exposed communication by
axis and stage, and the scenario. ``stepsim compare ... --out DIR --html`` writes
``DIR/compare.html``. The figures are drawn by plotly.js, inlined into the page
(``include_plotlyjs=True``): the file opens with no network access.

Plotly is an optional dependency (``pip install 'stepsim[report]'``); without it,
:func:`require_plotly` raises :class:`ReportError` saying so. The colours are those of
the PNG figures (:mod:`simulator.results.plots`).

A report is drawn from a :class:`RunData`: built from a :class:`~simulator.results.result.Result`
(:func:`run_data`) or read back from a ``stepsim run --out`` directory
(:func:`load_run_dir`).
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

from simulator.errors import ReportError
from simulator.results.plots import (
    AXIS_COLOURS,
    AXIS_LABELS,
    BUBBLE_EDGE,
    IDLE_COLOURS,
    PHASE_COLOURS,
    PHASE_LABELS,
    colour_for,
    idle_label,
)
from workloads.trace.ops import MEMORY_CATEGORIES, STREAMS

#: Files of a ``stepsim run --out`` directory that a report reads.
RUN_FILES = ("summary.json", "events.parquet", "events.csv", "memory.csv", "idle.csv", "scenario.json")


def require_plotly():
    """The ``plotly`` package, or a :class:`ReportError` saying how to install it."""
    try:
        import plotly  # noqa: F401
        import plotly.graph_objects as go
    except ImportError:
        raise ReportError(
            "--html: the HTML report needs the plotly package; install it with "
            "pip install 'stepsim[report]' (or pip install plotly)"
        ) from None
    return go


# ---- the data a report draws -------------------------------------------------------------


@dataclass(frozen=True)
class RunData:
    """What one run's report draws (each table as :mod:`simulator.results.result` defines it)."""

    summary: dict
    events: pd.DataFrame
    memory: pd.DataFrame
    idle: pd.DataFrame  # simulator.results.result.idle_frame
    scenario: Optional[dict]  # simulator.scenario.serialise.scenario_to_dict, None if not recorded
    labels: dict  # rank -> what the simulated rank stands for (report.stands_for)
    missing: tuple[str, ...] = ()  # files of the run directory that were not there


def run_data(result) -> RunData:
    """A :class:`RunData` from a :class:`~simulator.results.result.Result` in memory."""
    from simulator.results.report import stands_for
    from simulator.scenario.serialise import scenario_to_dict

    layout = result.scenario.layout if result.scenario is not None else None
    weight = getattr(getattr(result, "trace", None), "weight", None) or {}
    ranks = sorted(set(result.memory["rank"].tolist()) | set(result.events["rank"].tolist()))
    return RunData(
        summary=result.summary,
        events=result.events,
        memory=result.memory,
        idle=result.idle,
        scenario=scenario_to_dict(result.scenario) if result.scenario is not None else None,
        labels={r: stands_for(layout, r, int(weight.get(r, 1))) for r in ranks},
    )


def load_run_dir(path) -> RunData:
    """Read back a ``stepsim run --out`` directory. ``summary.json``, the events
    (``events.parquet`` or ``events.csv``) and ``memory.csv`` are required; without
    ``idle.csv`` or ``scenario.json`` (directories of older versions) the report says
    what it cannot show."""
    from simulator.fileio import load_json, read_text
    from simulator.results.result import IDLE_COLUMNS

    d = Path(path)
    if not d.is_dir():
        raise ReportError(f"report: {str(d)!r} is not a directory (give the --out directory of `stepsim run`)")
    need = [d / "summary.json", d / "memory.csv"]
    missing = [p.name for p in need if not p.is_file()]
    if not (d / "events.parquet").is_file() and not (d / "events.csv").is_file():
        missing.append("events.parquet (or events.csv)")
    if missing:
        raise ReportError(f"report: {d} has no {', '.join(missing)}; it should be the --out directory of `stepsim run`")
    summary = load_json(read_text(d / "summary.json"), str(d / "summary.json"))
    if not isinstance(summary, dict) or "step_time_s" not in summary:
        raise ReportError(f"report: {d / 'summary.json'} is not a stepsim summary (no step_time_s)")
    if (d / "events.parquet").is_file():
        events = pd.read_parquet(d / "events.parquet")
    else:
        events = pd.read_csv(d / "events.csv", keep_default_na=False)
    memory = pd.read_csv(d / "memory.csv")
    absent = []
    if (d / "idle.csv").is_file():
        idle = pd.read_csv(d / "idle.csv", keep_default_na=False)
    else:
        idle, absent = pd.DataFrame(columns=IDLE_COLUMNS), absent + ["idle.csv"]
    scenario = None
    if (d / "scenario.json").is_file():
        scenario = load_json(read_text(d / "scenario.json"), str(d / "scenario.json"))
    else:
        absent.append("scenario.json")
    stages = dict(zip(memory["rank"].tolist(), memory["stage"].tolist()))
    labels = _labels_from_scenario(scenario, summary, stages)
    return RunData(
        summary=summary,
        events=events,
        memory=memory,
        idle=idle,
        scenario=scenario,
        labels=labels,
        missing=tuple(absent),
    )


def _labels_from_scenario(scenario, summary, stages: dict) -> dict:
    """rank -> what it stands for; without a scenario, only its stage (``stages``) is known."""
    from simulator.results.report import stands_for

    layout = None
    if isinstance(scenario, dict):
        try:
            from simulator.scenario.loading import load_scenario

            layout = load_scenario(scenario).layout
        except (ValueError, KeyError, TypeError):
            layout = None
    if layout is None:
        return {r: f"stage {st}: device {r}" for r, st in sorted(stages.items())}
    out = {}
    for r in sorted(stages):
        w = 1
        if not summary.get("exact", True):
            w = len(layout.stage_ranks(layout.stage_of(int(r))))
        out[r] = stands_for(layout, int(r), w)
    return out


# ---- tables ------------------------------------------------------------------------------


def exposed_by_axis_stage(data: RunData) -> pd.DataFrame:
    """Exposed communication per pipeline stage (rows) and axis (columns), seconds: the
    ``exposed_comm`` idle spans, each split equally among the axes busy during it (the
    rule of :mod:`simulator.engine.accounting`), averaged over the simulated devices of a stage."""
    idle = data.idle
    exp = idle[idle["cause"] == "exposed_comm"]
    ranks_per_stage = data.memory.groupby("stage")["rank"].nunique()
    acc: dict[tuple[int, str], float] = {}
    for stage, what, dur in zip(exp["stage"].tolist(), exp["waiting_for"].tolist(), exp["duration_s"].tolist()):
        axes = [a for a in str(what).split("+") if a] or ["other"]
        for a in axes:
            acc[(int(stage), a)] = acc.get((int(stage), a), 0.0) + dur / len(axes)
    stages = sorted(ranks_per_stage.index.tolist())
    axes = sorted({a for _, a in acc})
    table = pd.DataFrame(0.0, index=pd.Index(stages, name="stage"), columns=axes)
    for (st, a), v in acc.items():
        table.loc[st, a] = v / ranks_per_stage.get(st, 1)
    return table


def axis_colour(axis: str) -> str:
    """The PNG figures' colour of a communication axis; a sub-axis (``ep_inter``) takes its
    axis's colour."""
    if axis in AXIS_COLOURS:
        return AXIS_COLOURS[axis]
    return AXIS_COLOURS.get(axis.split("_")[0], AXIS_COLOURS[""])


def _time_unit(step_s: float) -> tuple[float, str]:
    # the rule of the PNG figures (simulator.results.plots)
    return (1e3, "ms") if step_s < 10 else (1.0, "s")


# ---- figures -----------------------------------------------------------------------------


def _boxes(x0, x1, y, half=0.4):
    """Rectangles as one polygon path (x, y with NaN between shapes): one SVG path for
    thousands of bars, where one element per bar would be slow to draw."""
    x0, x1, y = (np.asarray(v, dtype=float) for v in (x0, x1, y))
    nan = np.full_like(x0, np.nan)
    xs = np.stack([x0, x0, x1, x1, nan], 1).ravel()
    ys = np.stack([y - half, y + half, y + half, y - half, nan], 1).ravel()
    return xs, ys


def merge_bars(x0, x1, y, gap):
    """Bars of one row joined where they are at most ``gap`` apart: ``(x0, x1, y)`` of
    the joined bars, by row then time. What a screen shows where bars lie closer than a
    pixel; the page redoes it for the visible range at every zoom (:data:`_LOD_JS`)."""
    x0, x1, y = (np.asarray(v, dtype=float) for v in (x0, x1, y))
    if not len(x0):
        return x0, x1, y
    order = np.lexsort((x0, y))
    x0, x1, y = x0[order], x1[order], y[order]
    # running end within a row: rows are shifted apart so that one row's ends never reach the next
    shift = y * (float(np.max(np.abs(x1))) * 2 + 1)
    reach = np.maximum.accumulate(x1 + shift) - shift
    new = np.ones(len(x0), dtype=bool)
    new[1:] = (y[1:] != y[:-1]) | (x0[1:] - reach[:-1] > gap)
    idx = np.flatnonzero(new)
    return x0[idx], np.maximum.reduceat(x1, idx), y[idx]


def _b64(a, dtype) -> str:
    import base64

    return base64.b64encode(np.ascontiguousarray(a, dtype=dtype).tobytes()).decode("ascii")


class _Bars:
    """The bars of one timeline: plotly traces plus, for each filled group, its bars,
    which the page's script re-merges for the visible range at every zoom."""

    #: Initial merging: bars closer than 1/_PIXELS of the time axis are drawn joined.
    _PIXELS = 2000

    def __init__(self, go, fig, x_max):
        self.go, self.fig, self.x_max = go, fig, x_max
        self.groups: list[dict] = []
        self._named: set = set()

    def add(self, name, colour, x0, x1, y, hover, pattern="", rank=1000):
        """One legend entry: the filled boxes (no hover) and an invisible point at the
        middle of each box that carries its hover text."""
        go = self.go
        x0, x1, y = (np.asarray(v, dtype=float) for v in (x0, x1, y))
        order = np.lexsort((x0, y))
        x0, x1, y = x0[order], x1[order], y[order]
        hover = [hover[i] for i in order]
        xs, ys = _boxes(*merge_bars(x0, x1, y, self.x_max / self._PIXELS))
        fill = dict(fillcolor=colour)
        if pattern:
            fill = dict(
                fillcolor="rgba(255,255,255,0)", fillpattern=dict(shape=pattern, fgcolor=colour, size=6, solidity=0.35)
            )
        self.groups.append(
            {"trace": len(self.fig.data), "y": _b64(y, "<i4"), "x0": _b64(x0, "<f8"), "x1": _b64(x1, "<f8")}
        )
        # an outline in the fill colour keeps bars narrower than a pixel visible when zoomed out
        self.fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="lines",
                fill="toself",
                line=dict(width=0.5 if pattern else 1, color=colour),
                hoverinfo="skip",
                name=name,
                legendgroup=name,
                legendrank=rank,
                showlegend=name not in self._named,
                **fill,
            )
        )
        self._named.add(name)  # phases B and I are both "backward": one legend entry
        self.fig.add_trace(
            go.Scatter(
                x=(x0 + x1) / 2,
                y=y,
                mode="none",
                hovertext=hover,
                hoverinfo="text",
                name=name,
                legendgroup=name,
                showlegend=False,
                hoverlabel=dict(bgcolor=colour if not pattern else "#dddddd"),
            )
        )

    def script(self) -> str:
        """The page script (``post_script`` of plotly's ``to_html``) that keeps the bars
        merged at the resolution of the visible range."""
        return _LOD_JS.replace("__GROUPS__", json.dumps(self.groups))


# Level of detail: on load and after every zoom, each filled group is rebuilt from its bars
# in the visible range, joining bars less than half a pixel apart; at most a few thousand
# shapes are drawn, however many ops the run has. "{plot_id}" is filled in by plotly.
_LOD_JS = """
(function () {
  var gd = document.getElementById('{plot_id}');
  var groups = __GROUPS__;
  function dec(b64, T) {
    var s = atob(b64), n = s.length, u = new Uint8Array(n);
    for (var i = 0; i < n; i++) u[i] = s.charCodeAt(i);
    return new T(u.buffer);
  }
  groups.forEach(function (g) { g.y = dec(g.y, Int32Array); g.x0 = dec(g.x0, Float64Array);
                                g.x1 = dec(g.x1, Float64Array); });
  var busy = false;
  function redraw() {
    var xa = gd._fullLayout && gd._fullLayout.xaxis;
    if (!xa || busy) return;
    var lo = xa.range[0], hi = xa.range[1], gap = 0.5 * (hi - lo) / Math.max(100, xa._length || 1000);
    var xs = [], ys = [], idx = [];
    groups.forEach(function (g) {
      var X = [], Y = [], n = g.x0.length, i = 0;
      while (i < n) {
        if (g.x1[i] < lo || g.x0[i] > hi) { i++; continue; }
        var a = g.x0[i], b = g.x1[i], row = g.y[i];
        i++;
        while (i < n && g.y[i] === row && g.x0[i] - b <= gap && g.x0[i] <= hi) { if (g.x1[i] > b) b = g.x1[i]; i++; }
        X.push(a, a, b, b, NaN); Y.push(row - 0.4, row + 0.4, row + 0.4, row - 0.4, NaN);
      }
      if (!X.length) { X.push(NaN); Y.push(NaN); }   // an empty trace would drop out of the legend
      xs.push(X); ys.push(Y); idx.push(g.trace);
    });
    busy = true;
    Promise.resolve(Plotly.restyle(gd, {x: xs, y: ys}, idx)).then(function () { busy = false; },
                                                                 function () { busy = false; });
  }
  gd.on('plotly_relayout', function (ev) {
    if (ev && Object.keys(ev).some(function (k) { return k.indexOf('xaxis') === 0; })) redraw();
  });
})();
"""


def timeline_rows(data: RunData, max_ranks: int = 32, show_comm: bool = True) -> list[tuple[int, str]]:
    """``(rank, stream)`` rows of the timeline: per simulated device (the first
    ``max_ranks``) its compute row, then each communication stream it used."""
    ev = data.events
    ranks = sorted(set(ev["rank"].tolist()))[:max_ranks]
    used = set(zip(ev["rank"].tolist(), ev["stream"].tolist())) if show_comm else set()
    rows = []
    for r in ranks:
        rows.append((r, "compute"))
        rows += [(r, s) for s in STREAMS if s != "compute" and (r, s) in used]
    return rows


def timeline_figure(
    data: RunData,
    max_ranks: int = 32,
    show_comm: bool = True,
    title: Optional[str] = None,
    x_max_s: Optional[float] = None,
):
    """The step's timeline (:func:`_timeline`) as a plotly figure."""
    return _timeline(data, max_ranks, show_comm, title, x_max_s)[0]


def _timeline(
    data: RunData,
    max_ranks: int = 32,
    show_comm: bool = True,
    title: Optional[str] = None,
    x_max_s: Optional[float] = None,
):
    """The step's timeline: a row per device's compute stream (bars coloured by phase;
    idle spans marked as bubble, exposed communication or offload wait) and below it a
    row per communication stream (bars coloured by axis). Zoom by dragging a box or
    scrolling; hover a bar for its name, start and duration."""
    go = require_plotly()
    s = data.summary
    step = float(s["step_time_s"])
    k, unit = _time_unit(step if x_max_s is None else x_max_s)
    rows = timeline_rows(data, max_ranks, show_comm)
    index = {row: i for i, row in enumerate(rows)}
    ev = data.events
    ev = ev[ev["duration_s"] > 0]
    y = np.array([index.get(rs, -1) for rs in zip(ev["rank"].tolist(), ev["stream"].tolist())])
    ev = ev[y >= 0]
    y = y[y >= 0]
    compute = (ev["stream"] == "compute").to_numpy()
    key = np.where(compute, "phase:" + ev["phase"].astype(str), "axis:" + ev["axis"].astype(str))
    fig = go.Figure()
    x_max = (x_max_s if x_max_s is not None else step) * k * 1.01
    bars = _Bars(go, fig, x_max)
    start, end = ev["start_s"].to_numpy() * k, ev["end_s"].to_numpy() * k
    names = ev["name"].astype(str).to_numpy()
    mbs = ev["mb"].to_numpy()
    order = [f"phase:{p}" for p in PHASE_COLOURS] + [f"axis:{a}" for a in AXIS_COLOURS]
    keys = sorted(set(key.tolist()), key=lambda x: (order.index(x) if x in order else len(order), x))
    # idle spans first, under the bars: zoomed out, a bar narrower than a pixel is drawn a pixel
    # wide, and compute drawn over idle time keeps the row's proportions
    idle = data.idle
    if len(idle):
        iy = np.array([index.get((r, "compute"), -1) for r in idle["rank"].tolist()])
        spare: dict = {}
        for cause in sorted(set(idle["cause"].tolist()), key=lambda c: (c != "bubble", c)):
            m = (idle["cause"] == cause).to_numpy() & (iy >= 0)
            if not m.any():
                continue
            # the PNG timeline's styles (simulator.results.plots): bubbles hatched grey, every other
            # cause a solid fill of its own hue
            if cause == "bubble":
                label, colour, pattern = "bubble", BUBBLE_EDGE, "/"
            else:
                label, colour, pattern = f"{idle_label(cause)} (idle)", colour_for(cause, IDLE_COLOURS, spare), ""
            sub = idle[m]
            a, b = sub["start_s"].to_numpy() * k, sub["end_s"].to_numpy() * k
            hover = [
                f"<b>{label}</b>{'' if not w else ': waiting for ' + w}<br>start {x0:.4g} {unit}, {x1 - x0:.4g} {unit}"
                for w, x0, x1 in zip(sub["waiting_for"].astype(str).tolist(), a, b)
            ]
            bars.add(label, colour, a, b, iy[m], hover, pattern=pattern, rank=2000)
    spare_keys: dict = {}
    for kk in keys:
        m = key == kk
        kind, val = kk.split(":", 1)
        if kind == "phase":
            colour, label = colour_for(val, PHASE_COLOURS, spare_keys), PHASE_LABELS.get(val, val or "other")
        else:
            colour, label = axis_colour(val), f"{AXIS_LABELS.get(val, val)} comm"
        hover = [
            f"<b>{n}</b>{'' if mb < 0 else f' · mb {mb}'}<br>{label}<br>start {a:.4g} {unit}, {b - a:.4g} {unit}"
            for n, mb, a, b in zip(names[m], mbs[m], start[m], end[m])
        ]
        bars.add(label, colour, start[m], end[m], y[m], hover)
    ticks = []
    for r, st in rows:
        ticks.append(_row_label(data, r) if st == "compute" else f"{st}")
    fig.update_layout(
        title=dict(
            text=title
            if title is not None
            else f"Timeline: step {step * k:.4g} {unit}, MFU {100 * s['mfu']:.1f}%, "
            f"bubble {100 * s['bubble_fraction']:.1f}%, exposed comm "
            f"{100 * s['exposed_comm_fraction']:.1f}%",
            x=0.01,
        ),
        height=max(260, 22 * len(rows) + 170),
        margin=dict(l=10, r=10, t=50, b=40),
        hovermode="closest",
        hoverdistance=30,
        dragmode="zoom",
        plot_bgcolor="white",
        legend=dict(orientation="h", yanchor="top", y=-0.08 if len(rows) > 12 else -0.2, x=0),
        xaxis=dict(title=f"time ({unit})", range=[0, x_max], showgrid=True, gridcolor="#eeeeee", zeroline=False),
        yaxis=dict(
            tickmode="array",
            tickvals=list(range(len(rows))),
            ticktext=ticks,
            range=[len(rows) - 0.4, -0.6],
            showgrid=False,
            zeroline=False,
            automargin=True,
        ),
    )
    return fig, bars


def _row_label(data: RunData, rank: int) -> str:
    text = data.labels.get(rank, f"device {rank}")
    # "stage 3: device 384, standing for 128 devices (ranks 384–511)" -> one row-high line
    head, _, rest = text.partition(", ")
    if "(ranks " in rest:
        return f"{head} (for {rest[rest.index('(ranks ') + 1 : -1]})"
    return head


def memory_figure(data: RunData):
    """Memory in use over the step: the total per pipeline stage (one line per
    simulated device) with the chip's HBM, and the breakdown by category of the stage
    that peaks."""
    go = require_plotly()
    from plotly.subplots import make_subplots
    import matplotlib.colors

    s = data.summary
    step = float(s["step_time_s"])
    k, unit = _time_unit(step)
    mem = data.memory
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.6, 0.4],
        horizontal_spacing=0.07,
        subplot_titles=("memory in use per pipeline stage", f"breakdown, stage {s.get('peak_memory_stage', 0)}"),
    )
    for rank, df in mem.groupby("rank", sort=True):
        t = np.append(df["time_s"].to_numpy() * k, step * k)
        tot = df["total"].to_numpy() / 1e9
        fig.add_trace(
            go.Scatter(
                x=t,
                y=np.append(tot, tot[-1]),
                mode="lines",
                line=dict(shape="hv", width=1.5),
                name=f"stage {int(df['stage'].iloc[0])} (device {rank})",
                hovertemplate="%{y:.2f} GB at %{x:.4g} " + unit + "<extra>%{fullData.name}</extra>",
            ),
            row=1,
            col=1,
        )
    hbm = float(s["hbm_bytes"]) / 1e9
    for col in (1, 2):
        fig.add_hline(
            y=hbm,
            line=dict(color="red", dash="dash", width=1),
            row=1,
            col=col,
            annotation_text=f"HBM {hbm:.0f} GB" if col == 1 else None,
        )
    stage = s.get("peak_memory_stage", 0)
    df = mem[mem["stage"] == stage]
    df = df[df["rank"] == df["rank"].min()]
    t = np.append(df["time_s"].to_numpy() * k, step * k)
    # the colours of simulator.results.plots.plot_memory's stack (matplotlib's default cycle)
    cycle = [matplotlib.colors.to_hex(c) for c in matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]]
    for i, c in enumerate(MEMORY_CATEGORIES):
        v = df[c].to_numpy() / 1e9
        fig.add_trace(
            go.Scatter(
                x=t,
                y=np.append(v, v[-1]) if len(v) else v,
                mode="lines",
                stackgroup="mem",
                line=dict(shape="hv", width=0.5, color=cycle[i % len(cycle)]),
                name=c,
                hovertemplate="%{y:.2f} GB<extra>" + c + "</extra>",
            ),
            row=1,
            col=2,
        )
    fig.update_xaxes(title_text=f"time ({unit})", range=[0, step * k])
    fig.update_yaxes(title_text="GB", rangemode="tozero", row=1, col=1)
    fig.update_layout(
        height=420,
        margin=dict(l=10, r=10, t=40, b=40),
        plot_bgcolor="white",
        legend=dict(orientation="h", yanchor="top", y=-0.18, x=0),
        hovermode="closest",
    )
    return fig


def exposed_figure(data: RunData, table: pd.DataFrame):
    """Exposed communication per stage, stacked by axis (milliseconds)."""
    go = require_plotly()
    fig = go.Figure()
    stages = [f"stage {s}" for s in table.index]
    for a in table.columns:
        fig.add_trace(
            go.Bar(
                y=stages,
                x=table[a].to_numpy() * 1e3,
                name=AXIS_LABELS.get(a, a),
                orientation="h",
                marker_color=axis_colour(a),
                hovertemplate="%{y}: %{x:.3f} ms<extra>" + a + "</extra>",
            )
        )
    fig.update_layout(
        barmode="stack",
        height=max(220, 28 * len(stages) + 120),
        plot_bgcolor="white",
        margin=dict(l=10, r=10, t=30, b=40),
        xaxis=dict(title="exposed communication (ms)"),
        yaxis=dict(autorange="reversed"),
        legend=dict(orientation="h", y=-0.25, x=0),
    )
    return fig


# ---- the page ----------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif; margin: 0 auto; max-width: 1400px;
       padding: 16px 24px; color: #222; }
h1 { font-size: 1.5em; margin: 0.2em 0; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 12px 0; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 8px 14px; min-width: 120px; }
.card .v { font-size: 1.35em; font-weight: 600; } .card .k { font-size: 0.8em; color: #666; }
.card.bad { border-color: #c00; background: #fff0f0; }
table.t { border-collapse: collapse; font-size: 0.9em; } table.t td, table.t th { border: 1px solid #ddd;
          padding: 3px 8px; text-align: right; } table.t th { background: #f5f5f5; }
pre { background: #f7f7f7; padding: 10px; overflow: auto; font-size: 0.85em; max-height: 480px; }
.note { color: #8a5a00; } .meta { color: #666; font-size: 0.85em; }
"""


def _card(key: str, value: str, bad: bool = False) -> str:
    return (
        f'<div class="card{" bad" if bad else ""}"><div class="v">{html.escape(value)}</div>'
        f'<div class="k">{html.escape(key)}</div></div>'
    )


def headline_cards(s: dict) -> str:
    step = float(s["step_time_s"])
    k, unit = _time_unit(step)
    lay = s.get("layout", {}) or {}
    cards = [
        _card("step time", f"{step * k:.4g} {unit}"),
        _card("tokens / s", f"{s.get('tokens_per_s', 0):,.0f}"),
        _card("MFU", f"{100 * s['mfu']:.1f} %"),
        _card("HFU", f"{100 * s.get('hfu', 0):.1f} %"),
        _card("pipeline bubble", f"{100 * s['bubble_fraction']:.1f} %"),
        _card("exposed comm", f"{100 * s['exposed_comm_fraction']:.1f} %"),
    ]
    if s.get("offload_wait_fraction"):
        cards.append(_card("offload wait", f"{100 * s['offload_wait_fraction']:.1f} %"))
    cards += [
        _card(
            "peak memory" + (" — OUT OF MEMORY" if s.get("oom") else ""),
            f"{s['peak_memory_bytes'] / 1e9:.1f} of {s['hbm_bytes'] / 1e9:.0f} GB",
            bad=bool(s.get("oom")),
        ),
        _card("devices", f"{s.get('devices', 0):,}"),
        _card(
            "layout",
            " ".join(f"{a}{lay[a]}" for a in ("tp", "cp", "pp", "dp", "ep", "vpp") if a in lay)
            + (f" zero{lay['zero']}" if "zero" in lay else ""),
        ),
        _card("schedule", f"{s.get('schedule')} · {s.get('micro_batches')} micro-batches"),
        _card(
            "parameters",
            f"{s.get('parameters', 0) / 1e9:,.2f} B"
            + (
                f" ({s['active_parameters'] / 1e9:,.1f} B active)"
                if s.get("active_parameters") not in (None, s.get("parameters"))
                else ""
            ),
        ),
    ]
    return '<div class="cards">' + "".join(cards) + "</div>"


def _table(df: pd.DataFrame, fmt, index_name: str) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in [index_name, *df.columns])
    body = "".join(
        "<tr><td>" + html.escape(str(i)) + "</td>" + "".join(f"<td>{fmt(v)}</td>" for v in row) + "</tr>"
        for i, row in zip(df.index, df.itertuples(index=False))
    )
    return f'<table class="t"><tr>{head}</tr>{body}</table>'


class _Page:
    """An HTML page holding plotly figures; plotly.js is inlined once, with the first."""

    def __init__(self, title: str):
        self.title = title
        self.parts: list[str] = []
        self._js = False

    def add(self, markup: str) -> None:
        self.parts.append(markup)

    def figure(self, fig, div_id: str, post_script: Optional[str] = None) -> None:
        import plotly.io as pio

        self.parts.append(
            pio.to_html(
                fig,
                include_plotlyjs=not self._js,
                full_html=False,
                div_id=div_id,
                post_script=post_script,
                config={"scrollZoom": True, "displaylogo": False, "responsive": True},
            )
        )
        self._js = True

    def render(self) -> str:
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(self.title)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(self.parts)
            + "\n</body></html>\n"
        )


def render_report(data: RunData, max_ranks: int = 32) -> str:
    """The report page of one run, as HTML text."""
    require_plotly()
    import yaml

    s = data.summary
    page = _Page(f"stepsim: {s.get('name')}")
    page.add(
        f"<h1>{html.escape(str(s.get('name')))}</h1>"
        f'<div class="meta">stepsim {html.escape(str(s.get("stepsim_version", "")))} · '
        f"{s.get('simulated_ranks')} simulated ranks for {s.get('devices', 0):,} devices"
        f"{' (every device)' if s.get('exact') else ' (one per pipeline stage)'} · "
        f"{s.get('events_processed', 0):,} ops</div>"
    )
    page.add(headline_cards(s))
    for n in s.get("notes", []) or []:
        page.add(f'<p class="note">note: {html.escape(str(n))}</p>')
    for f in data.missing:
        page.add(
            f'<p class="note">{html.escape(f)} was not in the run directory (written by newer stepsim '
            f"versions): {'idle time is not marked' if f == 'idle.csv' else 'the scenario is not shown'}.</p>"
        )
    page.add("<h2>Timeline</h2>")
    n_ranks = len(set(data.events["rank"].tolist()))
    if n_ranks > max_ranks:
        page.add(
            f'<p class="meta">The first {max_ranks} of {n_ranks} simulated devices are drawn; '
            "the Perfetto trace (trace.json) has them all.</p>"
        )
    page.add(
        '<p class="meta">Drag to zoom (double-click to reset), scroll to zoom, hover a bar for its name '
        "and times; click a legend entry to hide it.</p>"
    )
    fig, bars = _timeline(data, max_ranks=max_ranks)
    page.figure(fig, "timeline", bars.script())
    page.add("<h2>Memory</h2>")
    page.figure(memory_figure(data), "memory")
    page.add("<h2>Exposed communication by axis and stage</h2>")
    table = exposed_by_axis_stage(data)
    if table.size and float(table.to_numpy().sum()) > 0:
        page.figure(exposed_figure(data, table), "exposed")
        shown = table.copy()
        shown["total"] = shown.sum(axis=1)
        page.add(_table(shown * 1e3, lambda v: f"{v:.3f}", "stage \\ axis (ms)"))
    elif len(data.idle) or "idle.csv" not in data.missing:
        page.add("<p>No communication is exposed: the compute streams never wait on it.</p>")
    page.add("<h2>Scenario</h2>")
    if data.scenario is not None:
        page.add(f"<pre>{html.escape(yaml.safe_dump(data.scenario, sort_keys=False, allow_unicode=True))}</pre>")
    else:
        page.add("<p>The scenario was not recorded with this run.</p>")
    page.add(
        "<details><summary>summary.json</summary><pre>"
        + html.escape(json.dumps(s, indent=2, default=str))
        + "</pre></details>"
    )
    return page.render()


def write_report(source, path, max_ranks: int = 32) -> Path:
    """Write the report of ``source`` (a :class:`~simulator.results.result.Result`, a
    :class:`RunData` or a ``stepsim run --out`` directory) to ``path``."""
    require_plotly()
    if isinstance(source, (str, Path)):
        data = load_run_dir(source)
    elif isinstance(source, RunData):
        data = source
    else:
        data = run_data(source)
    path = Path(path)
    path.write_text(render_report(data, max_ranks=max_ranks), encoding="utf-8")
    return path


def render_compare(table: pd.DataFrame, results: dict) -> str:
    """The page of ``stepsim compare``: the table, bars of step time, bubble and peak
    memory, and each schedule's compute timeline on one time scale."""
    go = require_plotly()
    from plotly.subplots import make_subplots

    names = list(table["schedule"])
    page = _Page("stepsim compare: " + ", ".join(names))
    first = next(iter(results.values())).summary if results else {}
    page.add(f"<h1>Pipeline schedules on {html.escape(str(first.get('name', '')))}</h1>")
    shown = pd.DataFrame(
        {
            "vpp": table["vpp"].to_numpy(),
            "step (ms)": table["step_time_s"].to_numpy() * 1e3,
            "MFU (%)": table["mfu"].to_numpy() * 100,
            "bubble (%)": table["bubble_fraction"].to_numpy() * 100,
            "exposed comm (%)": table["exposed_comm_fraction"].to_numpy() * 100,
            "peak memory (GB)": table["peak_memory_bytes"].to_numpy() / 1e9,
            "peak activations (GB)": table["peak_activation_bytes"].to_numpy() / 1e9,
        },
        index=names,
    )
    page.add(_table(shown, lambda v: f"{v:.4g}" if isinstance(v, float) else str(v), "schedule"))
    fig = make_subplots(rows=1, cols=3, subplot_titles=("step time (ms)", "bubble (%)", "peak memory (GB)"))
    for col, (c, scale) in enumerate(
        (("step_time_s", 1e3), ("bubble_fraction", 100), ("peak_memory_bytes", 1e-9)), start=1
    ):
        fig.add_trace(
            go.Bar(
                x=names,
                y=table[c].to_numpy() * scale,
                marker_color=PHASE_COLOURS["F"],
                showlegend=False,
                hovertemplate="%{x}: %{y:.4g}<extra></extra>",
            ),
            row=1,
            col=col,
        )
    fig.update_layout(height=320, margin=dict(l=10, r=10, t=40, b=40), plot_bgcolor="white")
    page.figure(fig, "bars")
    t_max = max(float(r.summary["step_time_s"]) for r in results.values())
    for name, res in results.items():
        data = run_data(res)
        s = res.summary
        k, unit = _time_unit(t_max)
        page.add(f"<h2>{html.escape(name)}</h2>")
        fig, bars = _timeline(
            data,
            show_comm=False,
            x_max_s=t_max,
            title=f"{name}: step {s['step_time_s'] * k:.4g} {unit}, bubble "
            f"{100 * s['bubble_fraction']:.1f}%, peak {s['peak_memory_bytes'] / 1e9:.1f} GB",
        )
        page.figure(fig, f"timeline-{name}", bars.script())
    return page.render()


def write_compare_report(table: pd.DataFrame, results: dict, path) -> Path:
    path = Path(path)
    path.write_text(render_compare(table, results), encoding="utf-8")
    return path
