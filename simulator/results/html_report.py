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
:func:`~simulator.results.html_data.require_plotly` raises :class:`ReportError` saying so. The colours are those of
the PNG figures (:mod:`simulator.results.plots`).

A report is drawn from a :class:`~simulator.results.html_data.RunData`: built from a
:class:`~simulator.results.result.Result` (:func:`~simulator.results.html_data.run_data`) or
read back from a ``stepsim run --out`` directory
(:func:`~simulator.results.html_data.load_run_dir`). This module lays out the page and draws
the memory and exposed-communication figures; the timeline is
:mod:`simulator.results.html_timeline`'s.
"""

from __future__ import annotations

import html
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.results.html_data import RunData, exposed_by_axis_stage, load_run_dir, require_plotly, run_data
from simulator.results.html_timeline import axis_colour, time_unit, timeline_with_bars
from simulator.results.plots import (
    AXIS_LABELS,
    CATEGORY_COLOURS,
    HBM_COLOUR,
    PHASE_COLOURS,
    colour_for,
    curve_colours,
)
from simulator.results.report import idle_label
from workloads.trace.ops import MEMORY_CATEGORIES


def memory_figure(data: RunData):
    """Memory in use over the step: the total per pipeline stage (one line per
    simulated device) with the chip's HBM, and the breakdown by category of the stage
    that peaks."""
    go = require_plotly()
    from plotly.subplots import make_subplots

    s = data.summary
    step = float(s["step_time_s"])
    k, unit = time_unit(step)
    mem = data.memory
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.6, 0.4],
        horizontal_spacing=0.07,
        subplot_titles=("memory in use per pipeline stage", f"breakdown, stage {s.get('peak_memory_stage', 0)}"),
    )
    groups = list(mem.groupby("rank", sort=True))
    # the PNG figure's curve colours: distinct hues for a few stages, a colour map for many
    for (rank, df), colour in zip(groups, curve_colours(len(groups))):
        t = np.append(df["time_s"].to_numpy() * k, step * k)
        tot = df["total"].to_numpy() / 1e9
        fig.add_trace(
            go.Scatter(
                x=t,
                y=np.append(tot, tot[-1]),
                mode="lines",
                line=dict(shape="hv", width=1.5, color=colour),
                name=data.labels.get(rank, f"device {rank}"),
                hovertemplate="%{y:.2f} GB at %{x:.4g} " + unit + "<extra>%{fullData.name}</extra>",
            ),
            row=1,
            col=1,
        )
    hbm = float(s["hbm_bytes"]) / 1e9
    for col in (1, 2):
        fig.add_hline(
            y=hbm,
            line=dict(color=HBM_COLOUR, dash="dash", width=1),
            row=1,
            col=col,
            annotation_text=f"HBM {hbm:.0f} GB" if col == 1 else None,
        )
    stage = s.get("peak_memory_stage", 0)
    df = mem[mem["stage"] == stage]
    df = df[df["rank"] == df["rank"].min()]
    t = np.append(df["time_s"].to_numpy() * k, step * k)
    # the colours of simulator.results.plots.plot_memory's stack
    spare: dict = {}
    for c in MEMORY_CATEGORIES:
        v = df[c].to_numpy() / 1e9
        fig.add_trace(
            go.Scatter(
                x=t,
                y=np.append(v, v[-1]) if len(v) else v,
                mode="lines",
                stackgroup="mem",
                line=dict(shape="hv", width=0.5, color=colour_for(c, CATEGORY_COLOURS, spare)),
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
    k, unit = time_unit(step)
    lay = s.get("layout", {}) or {}
    cards = [
        _card("step time", f"{step * k:.4g} {unit}"),
        _card("tokens / s", f"{s.get('tokens_per_s', 0):,.0f}"),
        _card("MFU", f"{100 * s['mfu']:.1f} %"),
        _card("HFU", f"{100 * s.get('hfu', 0):.1f} %"),
        _card(idle_label(s), f"{100 * s['bubble_fraction']:.1f} %"),
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
        _card("devices", f"{s.get('devices', 0):,}" + _placement_text(s.get("placement"))),
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


def _placement_text(place) -> str:
    """`` · 64/72 a domain, 288 idle`` for a summary's placement (switched networks)."""
    if not place:
        return ""
    idle = f", {place['spare_devices']:,} idle" if place.get("spare_devices") else ""
    return f" · {place['devices_per_domain']}/{place['domain_capacity']} a domain{idle}"


#: The summary's MoE terms (``moe_terms_s``, docs/formats.md) as the report names them.
MOE_TERMS = {
    "routing": "routing (router GEMM, score and top-k, balance statistics, token counts)",
    "permutation": "permutation before the dispatch",
    "unpermutation": "unpermutation after the combine",
    "quantization": "FP8 quantisation of the experts' inputs and gradients",
    "grouped_gemm": "expert grouped GEMMs",
    "grouped_gemm_shape_loss": "of which lost to small per-expert shapes",
    "grouped_gemm_launches": "of which the GPU's overhead of per-expert GEMM launches",
    "host_exposed": "GPU waiting for the host to issue (launches, syncs)",
    "ep_comm_hidden": "expert all-to-all hidden behind compute",
}


def moe_terms_table(s: dict) -> str:
    """The MoE terms of a summary, in milliseconds per MoE layer and micro-batch ('' without)."""
    terms = s.get("moe_terms_s") or {}
    if not terms:
        return ""
    rows = [(MOE_TERMS.get(k, k), v) for k, v in terms.items()]
    body = "".join(f"<tr><td>{html.escape(name)}</td><td>{1e3 * v:.3f}</td></tr>" for name, v in rows)
    return f'<table class="t"><tr><th>term</th><th>ms per MoE layer and micro-batch</th></tr>{body}</table>'


def links_section(data: RunData, top: int = 10) -> str:
    """The links heat map (links.png, inlined) and the ``top`` busiest links of the links
    table (``axis == "all"``); empty without a links table."""
    if data.links is None:
        return ""
    parts = [
        '<p class="meta">Busy fraction: the union of the spans of the collectives and sends that '
        "load a link, over the step time (an upper bound: a flow may end before its collective). "
        "links.csv has every loaded link by axis.</p>"
    ]
    if data.links_png is not None:
        import base64

        src = base64.b64encode(data.links_png).decode()
        parts.append(
            f'<img id="links-map" alt="links heat map" style="max-width:100%" src="data:image/png;base64,{src}">'
        )
    t = data.links[data.links["axis"] == "all"].sort_values(["busy_fraction", "bytes"], ascending=False).head(top)
    rows = "".join(
        f"<tr><td>{html.escape(str(a))} → {html.escape(str(b))}</td><td>{html.escape(str(k))}</td>"
        f"<td>{100 * f:.1f}</td><td>{n / 1e9:.3f}</td><td>{int(p)}</td></tr>"
        for a, b, k, f, n, p in zip(t["src"], t["dst"], t["kind"], t["busy_fraction"], t["bytes"], t["peak_flows"])
    )
    parts.append(
        '<table class="t" id="links-top"><tr><th>link</th><th>kind</th><th>busy %</th><th>GB</th>'
        f"<th>peak flows</th></tr>{rows}</table>"
    )
    return "".join(parts)


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

    def figure(self, fig, div_id: str, post_script: str | None = None) -> None:
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
    fig, bars = timeline_with_bars(data, max_ranks=max_ranks)
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
    moe = moe_terms_table(s)
    if moe:
        page.add("<h2>Around the experts</h2>")
        page.add(
            '<p class="meta">Per MoE layer and micro-batch, averaged over the simulated devices '
            "(summary.json <code>moe_terms_s</code>; sources in docs/moe.md).</p>"
        )
        page.add(moe)
    links = links_section(data)
    if links:
        page.add("<h2>Links</h2>")
        page.add(links)
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
    :class:`RunData` or a ``stepsim run --out`` directory) to ``path``. A Result's or
    RunData's page shows the links heat map ``links.png`` of the folder it is written into,
    where there is one (``stepsim run --out DIR --html``)."""
    require_plotly()
    if isinstance(source, (str, Path)):
        data = load_run_dir(source)
    elif isinstance(source, RunData):
        data = source
    else:
        data = run_data(source)
    path = Path(path)
    beside = path.parent / "links.png"  # written into a run folder: its heat map shows too
    if data.links is not None and data.links_png is None and beside.is_file():
        data = replace(data, links_png=beside.read_bytes())
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
    if len(results) > 1:  # where each schedule's step goes against the first (stepsim explain)
        from simulator.results.explain import explain_pairs

        pairs = explain_pairs(results)
        why = pairs.pivot_table(index="cause", columns="schedule", values="delta_s", aggfunc="sum", sort=False)
        why = why.fillna(0.0)  # a cause one schedule does not have
        page.add(f"<h2>Against {html.escape(names[0])}: the difference in ms, cause by cause</h2>")
        page.add(_table(why * 1e3, lambda v: f"{v:+.3f}" if isinstance(v, float) else str(v), "cause"))
        for name, part in pairs.groupby("schedule", sort=False):
            rows = list(zip(part["cause"], part["a_s"], part["b_s"], part["delta_s"]))
            page.figure(waterfall_figure(rows, names[0], str(name)), f"explain-{name}")
    t_max = max(float(r.summary["step_time_s"]) for r in results.values())
    for name, res in results.items():
        data = run_data(res)
        s = res.summary
        k, unit = time_unit(t_max)
        page.add(f"<h2>{html.escape(name)}</h2>")
        fig, bars = timeline_with_bars(
            data,
            show_comm=False,
            x_max_s=t_max,
            title=f"{name}: step {s['step_time_s'] * k:.4g} {unit}, bubble "
            f"{100 * s['bubble_fraction']:.1f}%, peak {s['peak_memory_bytes'] / 1e9:.1f} GB",
        )
        page.figure(fig, f"timeline-{name}", bars.script())
    return page.render()


def waterfall_figure(rows, name_a: str, name_b: str):
    """The plotly waterfall of ``stepsim explain``'s rows: step A, one bar per cause that
    moved (:func:`simulator.results.explain.moved_causes`, the PNG's bars), step B; hover
    gives each cause's time in A and B."""
    go = require_plotly()
    from simulator.results.explain import moved_causes

    moved = moved_causes(rows)
    start, end = sum(r[1] for r in rows), sum(r[2] for r in rows)
    labels = [f"step {name_a}", *(r[0] for r in moved), f"step {name_b}"]
    fig = go.Figure(
        go.Waterfall(
            orientation="v",
            measure=["absolute", *("relative" for _ in moved), "total"],
            x=labels,
            y=[start * 1e3, *(r[3] * 1e3 for r in moved), 0.0],
            text=[f"{start * 1e3:.4g} ms", *(f"{r[3] * 1e3:+.3g} ms" for r in moved), f"{end * 1e3:.4g} ms"],
            customdata=[[start * 1e3, start * 1e3], *([r[1] * 1e3, r[2] * 1e3] for r in moved), [end * 1e3] * 2],
            hovertemplate="%{x}: A %{customdata[0]:.4g} ms, B %{customdata[1]:.4g} ms<extra></extra>",
            decreasing={"marker": {"color": "#2a9d8f"}},  # B gains: the PNG's colours
            increasing={"marker": {"color": "#e76f51"}},
            totals={"marker": {"color": "#444444"}},
            connector={"line": {"color": "#888888", "width": 1}},
        )
    )
    levels = np.cumsum([start, *(r[3] for r in moved)])
    lo, hi = float(levels.min()), float(levels.max())
    pad = max(hi - lo, 1e-3 * hi) * 0.35  # zoom on the levels the bars walk through, as the PNG
    fig.update_layout(
        title=f"where the step time goes: B {name_b} against A {name_a}",
        yaxis={"title": "ms per step", "range": [max(0.0, lo - pad) * 1e3, (hi + pad) * 1e3]},
        height=420,
        margin=dict(l=60, r=20, t=50, b=120),
        plot_bgcolor="white",
        showlegend=False,
    )
    return fig


def render_explain(rows, name_a: str, name_b: str) -> str:
    """The page of ``stepsim explain A B --out DIR --html``: the waterfall and the table of
    causes (ms in A and B and their difference, which add up to the steps')."""
    page = _Page(f"stepsim explain: {name_b} against {name_a}")
    page.add(f"<h1>Why {html.escape(name_b)} differs from {html.escape(name_a)}</h1>")
    page.figure(waterfall_figure(rows, name_a, name_b), "explain")
    table = pd.DataFrame(
        {
            "A (ms)": [r[1] * 1e3 for r in rows],
            "B (ms)": [r[2] * 1e3 for r in rows],
            "B - A (ms)": [r[3] * 1e3 for r in rows],
        },
        index=[r[0] for r in rows],
    )
    table.loc["step"] = table.sum()
    page.add(_table(table, lambda v: f"{v:.4f}", "cause"))
    return page.render()


def write_compare_report(table: pd.DataFrame, results: dict, path) -> Path:
    path = Path(path)
    path.write_text(render_compare(table, results), encoding="utf-8")
    return path
