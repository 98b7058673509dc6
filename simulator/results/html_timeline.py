"""The HTML report's interactive timeline (plotly): a row per device's compute stream (bars
coloured by phase; idle spans marked as bubble, exposed communication or offload wait) and
below it a row per communication stream (bars coloured by axis), in the colours of the PNG
figures (:mod:`simulator.results.plots`).

Thousands of bars are drawn as one polygon per legend entry, reduced to the pixels of the
time axis as ``timeline.png`` is: each pixel's bar cut in height by the share of it each
colour fills, work at the bottom and idle spans above (:func:`~simulator.results.pixels.bin_shares`);
the page's script (:data:`_LOD_JS`) redoes the reduction for the visible range at load, after
every zoom and after a legend click.
"""

from __future__ import annotations

import json

import numpy as np

from simulator.results.html_data import RunData, require_plotly
from simulator.results.pixels import SHARE_LEVELS, bin_shares, piece_span
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
from workloads.trace.ops import STREAMS


def axis_colour(axis: str) -> str:
    """The PNG figures' colour of a communication axis; a sub-axis (``ep_inter``) takes its
    axis's colour."""
    if axis in AXIS_COLOURS:
        return AXIS_COLOURS[axis]
    return AXIS_COLOURS.get(axis.split("_")[0], AXIS_COLOURS[""])


def time_unit(step_s: float) -> tuple[float, str]:
    # the rule of the PNG figures (simulator.results.plots)
    return (1e3, "ms") if step_s < 10 else (1.0, "s")


# ---- figures -----------------------------------------------------------------------------


def _boxes(x0, x1, y0, y1):
    """Rectangles ``[x0, x1] x [y0, y1]`` as one polygon path (x, y with NaN between shapes): one
    SVG path for thousands of bars, where one element per bar would be slow to draw."""
    x0, x1, y0, y1 = (np.asarray(v, dtype=float) for v in (x0, x1, y0, y1))
    nan = np.full_like(x0, np.nan)
    xs = np.stack([x0, x0, x1, x1, nan], 1).ravel()
    ys = np.stack([y0, y1, y1, y0, nan], 1).ravel()
    return xs, ys


def _b64(a, dtype) -> str:
    import base64

    return base64.b64encode(np.ascontiguousarray(a, dtype=dtype).tobytes()).decode("ascii")


class _Bars:
    """The bars of one timeline: plotly traces plus, for each filled group, its bars, which
    :meth:`finish` reduces to pixels (:func:`~simulator.results.pixels.bin_shares`) and the
    page's script reduces again for the visible range at every zoom. Groups stack in a pixel
    by their legend rank (ops before idle spans), then in the order they were added."""

    #: Pixels of the time axis the figure is reduced to before the page redoes it at its
    #: real width (and what a viewer without the page's script shows).
    _PIXELS = 2000

    def __init__(self, go, fig, x_max):
        self.go, self.fig, self.x_max = go, fig, x_max
        self.groups: list[dict] = []
        self._bars: list[tuple] = []
        self._named: set = set()

    def add(self, name, colour, x0, x1, y, hover, pattern="", rank=1000):
        """One legend entry: the filled boxes (no hover; drawn by :meth:`finish`) and an
        invisible point at the middle of each bar that carries its hover text."""
        go = self.go
        x0, x1, y = (np.asarray(v, dtype=float) for v in (x0, x1, y))
        order = np.lexsort((x0, y))
        x0, x1, y = x0[order], x1[order], y[order]
        hover = [hover[i] for i in order]
        fill = dict(fillcolor=colour)
        if pattern:
            fill = dict(
                fillcolor="rgba(255,255,255,0)", fillpattern=dict(shape=pattern, fgcolor=colour, size=6, solidity=0.35)
            )
        self.groups.append(
            {
                "trace": len(self.fig.data),
                "rank": rank,
                "y": _b64(y, "<i4"),
                "x0": _b64(x0, "<f8"),
                "x1": _b64(x1, "<f8"),
            }
        )
        self._bars.append((x0, x1, y))
        # boxes are whole pixels of one colour (bin_shares): no outline, which would widen them
        self.fig.add_trace(
            go.Scatter(
                x=[np.nan],
                y=[np.nan],
                mode="lines",
                fill="toself",
                line=dict(width=0, color=colour),
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

    def finish(self, n_rows: int) -> None:
        """Fill each group's trace with its boxes at :data:`_PIXELS` pixels
        (:func:`~simulator.results.pixels.bin_shares`, groups stacked as the class says)."""
        self.n_rows = n_rows
        order = sorted(range(len(self.groups)), key=lambda g: (self.groups[g]["rank"], g))
        for pos, g in enumerate(order):
            self.groups[g]["stack"] = pos
        binned = bin_shares([self._bars[g] for g in order], n_rows, 0.0, self.x_max, self._PIXELS)
        for g, (x0, x1, y, b0, b1) in zip(order, binned):
            xs, ys = _boxes(x0, x1, *piece_span(y, b0, b1)) if len(x0) else ([np.nan], [np.nan])
            self.fig.data[self.groups[g]["trace"]].update(x=xs, y=ys)

    def script(self) -> str:
        """The page script (``post_script`` of plotly's ``to_html``) that reduces the bars to
        the pixels of the visible range at load and after every zoom or legend click."""
        return (
            _LOD_JS.replace("__GROUPS__", json.dumps(self.groups))
            .replace("__ROWS__", str(self.n_rows))
            .replace("__LEVELS__", str(SHARE_LEVELS))
        )


# Level of detail: on load, after every zoom and after a legend click, each filled group is
# rebuilt from its bars in the visible range, reduced to the pixels of the axis as bin_shares
# does (each pixel's bar cut in height by the share each shown group fills, stacked by the
# groups' "stack" order, in __LEVELS__ steps); at most a few shapes per pixel column are drawn,
# however many ops the run has. "{plot_id}" is filled in by plotly.
_LOD_JS = """
(function () {
  var gd = document.getElementById('{plot_id}');
  var groups = __GROUPS__, nRows = __ROWS__, L = __LEVELS__;
  function dec(b64, T) {
    var s = atob(b64), n = s.length, u = new Uint8Array(n);
    for (var i = 0; i < n; i++) u[i] = s.charCodeAt(i);
    return new T(u.buffer);
  }
  groups.forEach(function (g) { g.y = dec(g.y, Int32Array); g.x0 = dec(g.x0, Float64Array);
                                g.x1 = dec(g.x1, Float64Array); });
  var order = groups.map(function (g, k) { return k; });
  order.sort(function (a, b) { return groups[a].stack - groups[b].stack; });
  var busy = false, again = false;
  function shown(g) { var v = gd.data[g.trace].visible; return v === undefined || v === true; }
  function redraw() {
    var xa = gd._fullLayout && gd._fullLayout.xaxis;
    if (!xa) return;
    if (busy) { again = true; return; }
    var lo = xa.range[0], hi = xa.range[1], B = Math.max(1, Math.round(xa._length || 1000));
    var w = (hi - lo) / B, G = groups.length, acc = new Float64Array(nRows * G * B);
    groups.forEach(function (g, k) {
      if (!shown(g)) return;
      for (var i = 0, n = g.x0.length; i < n; i++) {
        var a = Math.max(0, (g.x0[i] - lo) / w), b = Math.min(B, (g.x1[i] - lo) / w);
        if (!(b > a)) continue;
        var ia = Math.floor(a), ib = Math.floor(b), base = (g.y[i] * G + k) * B;
        if (ia === ib) { acc[base + ia] += b - a; continue; }
        acc[base + ia] += ia + 1 - a;
        for (var j = ia + 1; j < ib; j++) acc[base + j] += 1;
        if (ib < B) acc[base + ib] += b - ib;
      }
    });
    var X = groups.map(function () { return []; }), Y = groups.map(function () { return []; });
    var runKey = new Int32Array(G), runStart = new Int32Array(G);
    function flush(k, row, s, e, key) {
      var a = lo + s * w, b = lo + e * w;
      // pixels.piece_span: the row's bottom is row + 0.4 (the y axis is inverted)
      var y0 = row + 0.4 - 0.8 * (key % (L + 1)) / L, y1 = row + 0.4 - 0.8 * Math.floor(key / (L + 1)) / L;
      X[k].push(a, a, b, b, NaN); Y[k].push(y0, y1, y1, y0, NaN);
    }
    for (var row = 0; row < nRows; row++) {
      runKey.fill(-1);
      for (var i = 0; i <= B; i++) {
        var cum = 0;
        for (var o = 0; o < G; o++) {
          var k = order[o], key = -1;
          if (i < B) {
            var c = acc[(row * G + k) * B + i];
            var lvl = Math.round(Math.min(1, Math.max(0, c)) * L), bottom = cum;
            cum = Math.min(L, cum + lvl);
            if (cum > bottom) key = bottom * (L + 1) + cum;
          }
          if (key !== runKey[k]) {
            if (runKey[k] >= 0) flush(k, row, runStart[k], i, runKey[k]);
            runKey[k] = key; runStart[k] = i;
          }
        }
      }
    }
    var idx = groups.map(function (g) { return g.trace; });
    X.forEach(function (x) { if (!x.length) x.push(NaN); });   // an empty trace would drop out of the legend
    Y.forEach(function (y) { if (!y.length) y.push(NaN); });
    busy = true;
    function done() { busy = false; if (again) { again = false; redraw(); } }
    Promise.resolve(Plotly.restyle(gd, {x: X, y: Y}, idx)).then(done, done);
  }
  gd.on('plotly_relayout', function (ev) {
    if (ev && Object.keys(ev).some(function (k) { return k.indexOf('xaxis') === 0 || k === 'autosize'; })) redraw();
  });
  gd.on('plotly_restyle', function (ev) {
    if (ev && ev[0] && 'visible' in ev[0]) redraw();
  });
  redraw();
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


def timeline_with_bars(
    data: RunData,
    max_ranks: int = 32,
    show_comm: bool = True,
    title: str | None = None,
    x_max_s: float | None = None,
):
    """The step's timeline and its :class:`_Bars` (whose :meth:`_Bars.script` the page embeds):
    a row per device's compute stream (bars coloured by phase; idle spans marked as bubble,
    exposed communication or offload wait) and below it a row per communication stream (bars
    coloured by axis). Zoom by dragging a box or scrolling; hover a bar for its name, start
    and duration."""
    go = require_plotly()
    step = float(data.summary["step_time_s"])
    k, unit = time_unit(step if x_max_s is None else x_max_s)
    rows = timeline_rows(data, max_ranks, show_comm)
    index = {row: i for i, row in enumerate(rows)}
    fig = go.Figure()
    x_max = (x_max_s if x_max_s is not None else step) * k * 1.01
    bars = _Bars(go, fig, x_max)
    # idle spans first in the legend; in a pixel they stack above the ops (legend rank 2000)
    _add_idle_bars(bars, data.idle, index, k, unit)
    _add_op_bars(bars, data.events, index, k, unit)
    bars.finish(len(rows))
    _lay_out(fig, data, rows, title, step, k, unit, x_max)
    return fig, bars


def _add_idle_bars(bars: _Bars, idle, index: dict, k: float, unit: str) -> None:
    """The idle spans of the compute rows, one legend entry per cause, bubbles first."""
    if not len(idle):
        return
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


def _add_op_bars(bars: _Bars, ev, index: dict, k: float, unit: str) -> None:
    """The ops of the shown rows: compute coloured by phase, communication by axis, one
    legend entry each, in the order of the PNG figures' colour tables."""
    ev = ev[ev["duration_s"] > 0]
    y = np.array([index.get(rs, -1) for rs in zip(ev["rank"].tolist(), ev["stream"].tolist())])
    ev = ev[y >= 0]
    y = y[y >= 0]
    compute = (ev["stream"] == "compute").to_numpy()
    key = np.where(compute, "phase:" + ev["phase"].astype(str), "axis:" + ev["axis"].astype(str))
    start, end = ev["start_s"].to_numpy() * k, ev["end_s"].to_numpy() * k
    names = ev["name"].astype(str).to_numpy()
    mbs = ev["mb"].to_numpy()
    order = [f"phase:{p}" for p in PHASE_COLOURS] + [f"axis:{a}" for a in AXIS_COLOURS]
    keys = sorted(set(key.tolist()), key=lambda x: (order.index(x) if x in order else len(order), x))
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


def _lay_out(fig, data: RunData, rows: list, title: str | None, step: float, k: float, unit: str, x_max) -> None:
    """Title (the headline figures unless given), size, legend and the two axes."""
    s = data.summary
    ticks = []
    for r, st in rows:
        ticks.append(data.labels.get(r, f"device {r}") if st == "compute" else f"{st}")
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
