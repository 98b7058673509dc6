"""Matplotlib figures for design reviews: the step's timeline and memory curves.

Figures are drawn for a slide: at most :data:`SLIDE_WIDTH_IN` wide and no text
smaller than :data:`MIN_FONT_PT` at the size they are saved at. Library code never
picks a backend: figures come from :func:`new_figure` (pyplot with whatever backend
matplotlib chose — Agg on a machine without a display, the inline backend in a
notebook), are saved and closed when a path is given, and returned either way.
"""

from __future__ import annotations

import io

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, PathPatch
from matplotlib.path import Path

from simulator.results.pixels import bin_shares, piece_span
from simulator.results.report import stage_labels

#: No text below this size (points, at the saved size).
MIN_FONT_PT = 10
#: Width of a 16:9 slide (PowerPoint's and Google Slides' default, 13.333 x 7.5 in):
#: a figure no wider than this goes on a slide at its own size, text unscaled.
SLIDE_WIDTH_IN = 13.333

PHASE_COLOURS = {
    # Tableau 10/20 hues. Recompute is a forward pass run again (a light forward blue);
    # weight-grad is part of the backward (a light backward green); the optimizer is near-black,
    # which no mix of thin red idle slivers with blue and green bars looks like.
    "F": "#4E79A7",
    "B": "#59A14F",
    "I": "#59A14F",
    "W": "#8CD17D",
    "R": "#A0CBE8",
    "opt": "#3A3A3A",
}
PHASE_LABELS = {
    "F": "forward",
    "B": "backward",
    "I": "backward",
    "W": "weight grad",
    "R": "recompute",
    "opt": "optimizer",
}
AXIS_COLOURS = {
    "tp": "#EDC948",
    "cp": "#9C755F",
    "ep": "#D37295",
    "dp": "#76B7B2",
    "dp_cp": "#76B7B2",
    "edp": "#86BCB6",
    "pp": "#9467BD",
    "pp_mirror": "#C5B0D5",
    "offload": "#BAB0AC",
    "": "#BAB0AC",
}
#: Idle time on a compute row, by the engine's cause (:mod:`simulator.engine.accounting`): exposed
#: communication a saturated red, waiting for the host (offload) a saturated orange, both far
#: from every phase colour; a cause the engine adds later gets a hue of :data:`SPARE_COLOURS`
#: and its own legend entry (:func:`colour_for`, :func:`legend_handles`).
IDLE_COLOURS = {"exposed_comm": "#E15759", "offload_wait": "#FF7F0E"}
BUBBLE_EDGE = "#8A8A8A"  # hatch lines of pipeline bubbles: mid grey, apart from the near-black optimizer
#: Hues used by nothing above, handed out in order to categories without a colour of their own.
SPARE_COLOURS = ("#FF9DA7", "#17BECF", "#8C564B", "#BCBD22", "#7F7F7F", "#1F77B4")
AXIS_LABELS = {"dp_cp": "dp×cp", "pp_mirror": "pp (mirror)", "": "other"}
COMM_STREAMS = ("tp", "cp", "ep", "dp", "fsdp", "pp", "offload")


class SlideFigure(Figure):
    """A pyplot figure that a notebook shows once.

    The inline backend draws every open pyplot figure at the end of a cell, and IPython
    also draws a figure that is a cell's value: ``res.plot_timeline()`` would appear
    twice. Shown either way, this figure draws itself as a PNG and, under the inline
    backend, leaves pyplot's list of open figures, so it is not drawn again."""

    def _ipython_display_(self):
        import matplotlib
        from IPython.display import display

        buf = io.BytesIO()
        # no bbox_inches="tight" (the inline default): the layout engine already fits the
        # figure, and "tight" draws everything twice
        self.savefig(buf, format="png")
        display({"image/png": buf.getvalue(), "text/plain": repr(self)}, raw=True)
        if "inline" in matplotlib.get_backend():
            plt.close(self)


def new_figure(figsize, **subplots) -> tuple[Figure, object]:
    """``plt.subplots`` on a :class:`SlideFigure`: ``(figure, axes)``."""
    return plt.subplots(figsize=figsize, FigureClass=SlideFigure, **subplots)


def finish(fig: Figure, path=None, dpi: int = 130, **savefig) -> Figure:
    """Save ``fig`` to ``path`` (then close it: a script that writes files does not pile up
    open figures) and return it."""
    if path is not None:
        fig.savefig(path, dpi=dpi, **savefig)
        plt.close(fig)
    return fig


def colour_for(key, table: dict, assigned: dict) -> str:
    """``table[key]``, or the next spare hue (fixed for the figure via ``assigned``)."""
    if key in table:
        return table[key]
    if key not in assigned:
        used = set(table.values()) | set(assigned.values())
        free = [c for c in SPARE_COLOURS if c not in used] or list(SPARE_COLOURS)
        assigned[key] = free[0]
    return assigned[key]


def idle_label(cause: str) -> str:
    return cause.replace("_", " ")


def legend_handles(phases: dict, causes: dict, axes: dict = None) -> list[Patch]:
    """Legend entries for what a timeline drew: compute ``phases`` (phase -> colour, in
    :data:`PHASE_COLOURS` order, then any other), idle ``causes`` (cause -> colour, None =
    hatched bubble) and communication ``axes`` (axis -> colour). Phases sharing a label
    (B and I) get one entry."""
    if axes is None:
        axes = {}
    order = list(PHASE_COLOURS)
    out, seen = [], set()
    for p in sorted(phases, key=lambda p: (order.index(p) if p in order else len(order), str(p))):
        label = PHASE_LABELS.get(p, str(p))
        if label not in seen:
            seen.add(label)
            out.append(Patch(color=phases[p], label=label))
    for cause in sorted(causes, key=lambda c: (c != "bubble", c)):
        colour = causes[cause]
        out.append(
            Patch(facecolor="none", edgecolor=BUBBLE_EDGE, hatch="////", label="bubble")
            if colour is None
            else Patch(color=colour, label=f"{idle_label(cause)} (idle)")
        )
    out += [Patch(color=c, label=f"{AXIS_LABELS.get(a, a)} comm") for a, c in axes.items()]
    return out


def _time_unit(step: float) -> tuple[float, str]:
    return (1e3, "ms") if step < 10 else (1.0, "s")


def _rectangles(x0: np.ndarray, x1: np.ndarray, y0: np.ndarray, y1: np.ndarray) -> np.ndarray:
    """Bars ``[x0, x1] x [y0, y1]`` as closed rectangle polygons."""
    return np.stack(
        [
            np.stack([x0, y0], 1),
            np.stack([x0, y1], 1),
            np.stack([x1, y1], 1),
            np.stack([x1, y0], 1),
            np.stack([x0, y0], 1),
        ],
        1,
    )


def _bar_path(ax, x0: np.ndarray, x1: np.ndarray, y0: np.ndarray, y1: np.ndarray, **style) -> None:
    """Bars as one compound path of rectangles, built in numpy: one artist however many
    bars (a collection makes a Path object per bar, seconds for a hundred thousand, and
    Agg hatches each path of a collection on its own). Every rectangle is drawn in the same
    winding, so overlapping bars fill their union."""
    if not len(x0):
        return
    verts = _rectangles(x0, x1, y0, y1)
    codes = np.tile(
        np.array([Path.MOVETO, Path.LINETO, Path.LINETO, Path.LINETO, Path.CLOSEPOLY], dtype=Path.code_type), len(x0)
    )
    # Bars lie inside the axes: leaving them out of the layout, and giving the data limits as
    # two corners, spares matplotlib the extent of every bar.
    # snap: edges on whole pixels, in full colour, not pale antialiased slivers (the timelines'
    # pieces are whole pixels of pixels.bin_shares already)
    ax.add_artist(PathPatch(Path(verts.reshape(-1, 2), codes), in_layout=False, snap=True, **style))
    ax.update_datalim([(x0.min(), y0.min()), (x1.max(), y1.max())])


def axes_pixels(fig, ax, dpi: float) -> int:
    """The pixels across ``ax`` in ``fig`` laid out and saved at ``dpi`` (the layout is run here;
    bars drawn afterwards with ``in_layout=False`` do not change it)."""
    engine = fig.get_layout_engine()
    if engine is not None:
        engine.execute(fig)
    return max(1, round(ax.get_position().width * fig.get_figwidth() * dpi))


def _first_seen(values: list) -> list:
    """The distinct values of ``values`` in the order they first appear."""
    return list(dict.fromkeys(values))


#: Most rows a PNG timeline draws (a slide holds about this many 10-pt rows); longer
#: pipelines are folded (:func:`_timeline_rows`), report.html and the trace keep every row.
MAX_TIMELINE_ROWS = 24


def plot_timeline(
    result,
    path=None,
    max_ranks: int = 32,
    show_comm: bool = True,
    dpi: int = 130,
    max_rows: int = MAX_TIMELINE_ROWS,
):
    """Gantt chart: per simulated device a compute row (coloured by phase, idle spans
    drawn as bubbles (hatched) or in the colour of their cause: exposed communication,
    offload wait, ...) and, below it, one row per busy communication stream. Each compute
    row names the devices it stands for. At most ``max_rows`` rows: a longer pipeline shows
    every stage's compute row but the communication rows of its first device only, and more
    devices than rows are sampled evenly (:func:`_timeline_rows`; the figure says so). Each
    pixel of a row (at ``dpi``) is cut in height by the share of it each kind of bar fills
    (:func:`~simulator.results.pixels.bin_shares`), so ops shorter than a pixel show at their
    density. Returns the figure (saved to ``path`` if given)."""
    ev = result.table("events")
    step = result.summary["step_time_s"]
    k, unit = _time_unit(step)
    rank_col, stream_col = np.asarray(ev["rank"]), np.asarray(ev["stream"], dtype=object)
    stages = dict(zip(rank_col.tolist(), np.asarray(ev["stage"]).tolist())) if "stage" in ev else {}
    rows, folded = _timeline_rows(rank_col, stream_col, max_ranks, show_comm, max_rows, stages)
    index = {row: i for i, row in enumerate(rows)}
    bars, phases, axes_used, causes = _timeline_bars(ev, rank_col, stream_col, index, k, result.raw)
    width_in = 12
    fig, ax = new_figure((width_in, max(3.0, 0.3 * len(rows) + 2.2 + 0.2 * bool(folded))), layout="constrained")
    x_max = step * k * 1.01
    names = stage_labels(result)
    labels = [names.get(r, f"device {r}") if s == "compute" else f"{s} comm" for r, s in rows]
    ax.set_yticks(range(len(rows)), labels)
    for tick, (_, s) in zip(ax.get_yticklabels(), rows):
        if s != "compute":
            tick.set_color("#555555")
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.invert_yaxis()
    ax.set_xlim(0, x_max)
    ax.set_xlabel(f"time ({unit})")
    s = result.summary
    ax.set_title(
        f"{s['name']}: step {s['step_time_s'] * k:.1f} {unit}, MFU {100 * s['mfu']:.1f}%, "
        f"bubble {100 * s['bubble_fraction']:.1f}%, exposed comm {100 * s['exposed_comm_fraction']:.1f}%"
        + (f", offload wait {100 * s['offload_wait_fraction']:.1f}%" if s.get("offload_wait_fraction") else "")
        + (f"\n{folded}" if folded else ""),
        fontsize=11,
    )
    order = list(AXIS_COLOURS)
    handles = legend_handles(
        phases,
        causes,
        dict(
            sorted(axes_used.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), str(kv[0])))
        ),
    )
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=min(6, len(handles)), frameon=False)
    draw_bars_by_share(ax, *bars, x_max=x_max, n_px=axes_pixels(fig, ax, dpi))
    return finish(fig, path, dpi=dpi)


def _timeline_rows(
    rank_col, stream_col, max_ranks: int, show_comm: bool, max_rows: int = MAX_TIMELINE_ROWS, stages=None
) -> tuple[list[tuple[int, str]], str]:
    """``(rank, stream)`` rows: per simulated device (the first ``max_ranks``) its compute
    row, then each communication stream it used (those of :data:`COMM_STREAMS` first); and
    a note, empty unless the rows were folded to fit ``max_rows``: then only the first
    device keeps its communication rows, and if the compute rows are still too many, the
    first device of each pipeline stage (``stages``: rank -> stage) is drawn, of an even
    sample of the stages (the first and the last among them) if need be."""
    ranks = sorted(set(rank_col.tolist()))[:max_ranks]
    used_by_rank: dict = {}
    if show_comm:
        comm = stream_col != "compute"
        for r, s in set(zip(rank_col[comm].tolist(), stream_col[comm].tolist())):
            used_by_rank.setdefault(r, set()).add(s)

    def comm_rows(r):
        used = used_by_rank.get(r, set())
        return [(r, s) for s in COMM_STREAMS if s in used] + [(r, s) for s in sorted(used - set(COMM_STREAMS))]

    full = [row for r in ranks for row in [(r, "compute")] + comm_rows(r)]
    if len(full) <= max_rows or not ranks:
        return full, ""
    first = comm_rows(ranks[0])
    room = max(1, max_rows - len(first))
    shown, note = ranks, []
    if len(ranks) > room:
        stages = stages or {}
        heads = list({stages.get(r, r): r for r in reversed(ranks)}.values())[::-1]  # first rank per stage
        shown = heads
        if len(heads) > room:
            pick = np.unique(np.round(np.linspace(0, len(heads) - 1, room)).astype(int))
            shown = [heads[i] for i in pick]
        one = len(heads) == len(ranks)
        if len(shown) < len(heads):
            note.append(f"{len(shown)} of {len(heads)} " + ("devices" if one else "stages (their first device)"))
        else:
            note.append("one row per stage (its first device)")
    rows = [(shown[0], "compute")] + first + [(r, "compute") for r in shown[1:]]
    if first:
        note.append("communication rows of the first device only")
    return rows, "; ".join(note) + " (report.html and trace.json have every row)"


def _timeline_bars(ev, rank_col, stream_col, index: dict, k: float, raw):
    """Each bar's row, start, width and style (colour, solid / idle / bubble): the ops of the
    shown rows, then the idle spans of ``raw`` (when given) on compute rows; and the colours
    used, by phase, axis and idle cause, for the legend."""
    spare: dict = {}
    start, dur = np.asarray(ev["start_s"], dtype=float), np.asarray(ev["duration_s"], dtype=float)
    y = np.array([index.get(rs, -1) for rs in zip(rank_col.tolist(), stream_col.tolist())], dtype=np.int64)
    keep = (y >= 0) & (dur > 0)
    is_compute = stream_col[keep] == "compute"
    axis_col = np.asarray(ev["axis"], dtype=object)[keep]
    # compute ops are coloured by phase; communication by axis (the offload stream's copies
    # have none: by stream)
    key = np.where(
        is_compute, np.asarray(ev["phase"], dtype=object)[keep], np.where(axis_col != "", axis_col, stream_col[keep])
    )
    phases, axes_used, causes = {}, {}, {}
    for c, kk in _first_seen(list(zip(is_compute.tolist(), key.tolist()))):
        if c:
            phases.setdefault(kk, colour_for(kk, PHASE_COLOURS, spare))
        else:
            axes_used.setdefault(kk, colour_for(kk, AXIS_COLOURS, spare))
    colour = [phases[kk] if c else axes_used[kk] for c, kk in zip(is_compute.tolist(), key.tolist())]
    bar_y, bar_x0, bar_w = y[keep].tolist(), (start[keep] * k).tolist(), (dur[keep] * k).tolist()
    bar_style = [(c, "solid") for c in colour]
    if raw is not None:
        for r, s0, e0, cause, _axis in raw.idle_spans:
            if (r, "compute") in index:
                if cause == "bubble":
                    style, c = "bubble", None
                else:
                    style, c = "idle", colour_for(cause, IDLE_COLOURS, spare)
                causes.setdefault(cause, c)
                bar_y.append(index[(r, "compute")])
                bar_x0.append(s0 * k)
                bar_w.append((e0 - s0) * k)
                bar_style.append((c, style))
    return (bar_y, bar_x0, bar_w, bar_style), phases, axes_used, causes


def draw_bars_by_share(ax, bar_y, bar_x0, bar_w, bar_style, x_max: float, n_px: int) -> None:
    """Bars on rows ``bar_y`` (row indices, drawn 0.8 high on an inverted y axis) from ``bar_x0``
    for ``bar_w``, in styles ``(colour, "solid" | "idle" | "bubble")``, as one path per style (a
    colour, or the hatched bubble) at the ``n_px`` pixels of ``[0, x_max]``, each pixel's bar cut in
    height by the share of it each style fills (:func:`~simulator.results.pixels.bin_shares`): work
    at the bottom, idle spans above it. Draw it last: :func:`axes_pixels` needs the laid-out axes."""
    kind_order = {"solid": 0, "idle": 1, "bubble": 2}
    styles = sorted(set(bar_style), key=lambda cs: (kind_order[cs[1]], str(cs[0])))
    code = {cs: i for i, cs in enumerate(styles)}
    sid = np.array([code[cs] for cs in bar_style], dtype=np.int64)
    bx0 = np.array(bar_x0, dtype=float)
    bx1, by = bx0 + np.array(bar_w, dtype=float), np.array(bar_y, dtype=np.int64)
    groups = [(bx0[sid == i], bx1[sid == i], by[sid == i]) for i in range(len(styles))]
    n_rows = int(by.max()) + 1 if len(by) else 0
    for (c, style), (x0, x1, y, b0, b1) in zip(styles, bin_shares(groups, n_rows, 0.0, x_max, n_px)):
        y0, y1 = piece_span(y, b0, b1)
        if style == "bubble":
            _bar_path(ax, x0, x1, y0, y1, hatch="////", facecolor="none", edgecolor=BUBBLE_EDGE, linewidth=0)
        else:
            _bar_path(ax, x0, x1, y0, y1, facecolor=c, linewidth=0)


#: Up to this many memory curves get a legend entry each, in the hues of :data:`STAGE_HUES`;
#: more are coloured along :data:`STAGE_COLORMAP` by stage, with a colour bar for a key.
MAX_LEGEND_CURVES = 8
#: Tableau 10 without its red (the HBM capacity line is red): distinct hues for a few stages.
STAGE_HUES = ("#4E79A7", "#F28E2B", "#59A14F", "#B07AA1", "#76B7B2", "#EDC948", "#9C755F", "#FF9DA7")
#: A perceptually uniform map with no red: stage 0 dark blue to the last stage yellow.
STAGE_COLORMAP = "viridis"
#: Memory categories' colours in the breakdown (the order of workloads.trace.ops.MEMORY_CATEGORIES).
CATEGORY_COLOURS = {
    "weights": "#4E79A7",
    "gradients": "#F28E2B",
    "optimizer": "#59A14F",
    "activations": "#B07AA1",
    "buffers": "#BAB0AC",
}
HBM_COLOUR = "#D62728"


def curve_colours(n: int) -> list[str]:
    """``n`` distinct colours for curves in stage order: :data:`STAGE_HUES` for up to
    :data:`MAX_LEGEND_CURVES`, else ``n`` evenly spaced values of :data:`STAGE_COLORMAP`
    (its last 15 % left out: pale yellow on white)."""
    import matplotlib
    from matplotlib.colors import to_hex

    if n <= MAX_LEGEND_CURVES:
        return list(STAGE_HUES[:n])
    cmap = matplotlib.colormaps[STAGE_COLORMAP]
    return [to_hex(cmap(v)) for v in np.linspace(0.0, 0.85, n)]


def plot_memory(result, path=None, stacked_stage=None):
    """Memory in use over the step, one line per pipeline stage (the representative
    device of each), with the chip's HBM capacity; a stacked breakdown of the stage
    that peaks. Legends sit below the axes, clear of the data: up to
    :data:`MAX_LEGEND_CURVES` curves are named there, more are coloured by stage along a
    colour bar. Returns the figure (saved to ``path`` if given)."""
    from workloads.trace.ops import MEMORY_CATEGORIES

    mem = result.table("memory")
    s = result.summary
    step = s["step_time_s"]
    k, unit = _time_unit(step)
    fig, (ax, ax2) = new_figure((12, 5.0), ncols=2, width_ratios=[3, 2], layout="constrained")
    rank = np.asarray(mem["rank"])
    time_s, total = np.asarray(mem["time_s"], dtype=float), np.asarray(mem["total"], dtype=float)
    ranks = sorted(set(rank.tolist()))
    names = stage_labels(result)
    colours = curve_colours(len(ranks))
    many = len(ranks) > MAX_LEGEND_CURVES
    for r, colour in zip(ranks, colours):
        m = rank == r
        t = np.append(time_s[m] * k, step * k)
        y = np.append(total[m] / 1e9, total[m][-1] / 1e9)
        ax.step(t, y, where="post", label=names.get(int(r), f"device {r}"), linewidth=1.4, color=colour)
    hbm = s["hbm_bytes"] / 1e9
    ax.axhline(hbm, color=HBM_COLOUR, linestyle="--", linewidth=1.2, label="HBM capacity")
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("memory in use (GB)")
    ax.set_title(
        f"{s['name']}: memory per pipeline stage (peak {s['peak_memory_bytes'] / 1e9:.1f} GB)", fontsize=11, loc="left"
    )
    ax.set_xlim(0, step * k)
    top = max(hbm, float(total.max()) / 1e9 if len(total) else 0.0) * 1.1
    ax.set_ylim(0, top)
    if many:
        _stage_colour_bar(fig, ax, result, ranks)
        handles = [h for h in ax.get_legend_handles_labels()[0] if h.get_label() == "HBM capacity"]
    else:
        handles = ax.get_legend_handles_labels()[0]
    ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(0, -0.13),
        ncol=min(3, len(handles)),
        frameon=False,
        borderaxespad=0,
    )
    stage = s.get("peak_memory_stage", 0) if stacked_stage is None else stacked_stage
    in_stage = np.asarray(mem["stage"]) == stage
    m = in_stage & (rank == rank[in_stage].min())
    cats = [c for c in MEMORY_CATEGORIES if c in mem]
    t = np.append(time_s[m] * k, step * k)
    ys = [
        np.append(np.asarray(mem[c], dtype=float)[m] / 1e9, np.asarray(mem[c], dtype=float)[m][-1] / 1e9) for c in cats
    ]
    spare: dict = {}
    ax2.stackplot(
        t, ys, labels=cats, step="post", alpha=0.85, colors=[colour_for(c, CATEGORY_COLOURS, spare) for c in cats]
    )
    ax2.axhline(hbm, color=HBM_COLOUR, linestyle="--", linewidth=1.2)
    ax2.set_xlabel(f"time ({unit})")
    ax2.set_title(
        f"breakdown, {names.get(int(rank[m][0]), f'stage {stage}') if m.any() else f'stage {stage}'}", fontsize=11
    )
    ax2.set_xlim(0, step * k)
    ax2.set_ylim(0, top)
    ax2.legend(loc="upper left", bbox_to_anchor=(0, -0.13), ncol=3, frameon=False, borderaxespad=0)
    return finish(fig, path)


def _stage_colour_bar(fig, ax, result, ranks) -> None:
    """The key of many memory curves: a colour bar of the stages beside ``ax``."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import BoundaryNorm, ListedColormap

    layout = result.scenario.layout if result.scenario is not None else None
    stages = [layout.stage_of(int(r)) if layout is not None else int(r) for r in ranks]
    n = len(ranks)
    cmap = ListedColormap(curve_colours(n))
    sm = ScalarMappable(norm=BoundaryNorm(np.arange(n + 1) - 0.5, n), cmap=cmap)
    bar = fig.colorbar(sm, ax=ax, pad=0.01, fraction=0.04)
    step = max(1, int(np.ceil(n / 16)))
    ticks = list(range(0, n, step))
    bar.set_ticks(ticks, labels=[str(stages[i]) for i in ticks])
    bar.set_label("pipeline stage" if layout is not None else "device", fontsize=MIN_FONT_PT)
