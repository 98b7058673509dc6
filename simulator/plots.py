"""Matplotlib figures for design reviews: the step's timeline and memory curves."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

PHASE_COLOURS = {
    "F": "#4C72B0", "B": "#55A868", "I": "#55A868", "W": "#8DC59B", "R": "#C7A0D9", "opt": "#8172B2",
}
AXIS_COLOURS = {
    "tp": "#DD8452", "cp": "#937860", "ep": "#C44E52", "dp": "#DA8BC3", "dp_cp": "#DA8BC3", "edp": "#E6A9D4",
    "pp": "#64B5CD", "pp_mirror": "#8FCBE0", "": "#B0B0B0",
}
COMM_STREAMS = ("tp", "cp", "ep", "dp", "fsdp", "pp", "offload")


def _time_unit(step: float) -> tuple[float, str]:
    return (1e3, "ms") if step < 10 else (1.0, "s")


def _bars(ax, spans: list, y: float, **style) -> None:
    """``(start, width)`` bars on row ``y`` as one collection, its rectangles built in
    numpy (what ``broken_barh`` draws, without its per-bar Python loop)."""
    sw = np.asarray(spans, dtype=float)
    x0, x1 = sw[:, 0], sw[:, 0] + sw[:, 1]
    y0, y1 = np.full_like(x0, y - 0.4), np.full_like(x0, y + 0.4)
    verts = np.stack([np.stack([x0, y0], 1), np.stack([x0, y1], 1),
                      np.stack([x1, y1], 1), np.stack([x1, y0], 1)], 1)
    ax.add_collection(PolyCollection(verts, **style), autolim=True)


def plot_timeline(result, path=None, max_ranks: int = 32, show_comm: bool = True):
    """Gantt chart: per simulated device a compute row (coloured by phase, idle spans
    drawn as bubbles, exposed communication or offload wait) and, below it, one row per busy
    communication stream."""
    ev = result.events
    step = result.summary["step_time_s"]
    k, unit = _time_unit(step)
    ranks = sorted(set(ev["rank"]))[:max_ranks]
    rows = []
    for r in ranks:
        rows.append((r, "compute"))
        if show_comm:
            used = set(ev.loc[(ev["rank"] == r) & (ev["stream"] != "compute"), "stream"])
            rows += [(r, s) for s in COMM_STREAMS if s in used]
    index = {row: i for i, row in enumerate(rows)}
    fig_h = max(2.5, 0.32 * len(rows) + 1.2)
    fig, ax = plt.subplots(figsize=(14, fig_h))
    # One collection per (row, style): thousands of bars stay fast to draw.
    bars: dict[tuple, list] = {}
    for rank, stream, phase, axis, start, dur in zip(
            *(ev[c].tolist() for c in ("rank", "stream", "phase", "axis", "start_s", "duration_s"))):
        y = index.get((rank, stream))
        if y is None or dur <= 0:
            continue
        colour = PHASE_COLOURS.get(phase, "#999999") if stream == "compute" else AXIS_COLOURS.get(axis, "#999999")
        bars.setdefault((y, colour, "solid"), []).append((start * k, dur * k))
    raw = getattr(result, "raw", None)
    if raw is not None:
        for r, s, e, cause, _axis in raw.idle_spans:
            if (r, "compute") in index:
                bars.setdefault((index[(r, "compute")], None, cause), []).append((s * k, (e - s) * k))
    for (y, colour, style), spans in sorted(bars.items(), key=lambda kv: (kv[0][0], str(kv[0][1]), kv[0][2])):
        if style == "solid":
            _bars(ax, spans, y, facecolors=colour, linewidth=0)
        elif style == "bubble":
            _bars(ax, spans, y, facecolors="none", edgecolors="#777777", hatch="////", linewidth=0.3)
        elif style == "offload_wait":
            _bars(ax, spans, y, facecolors="none", edgecolors="#B07A2A", hatch="....", linewidth=0.3)
        else:
            _bars(ax, spans, y, facecolors="#F2B8B8", linewidth=0)
    layout = result.scenario.layout if result.scenario is not None else None
    labels = []
    for r, s in rows:
        if s == "compute":
            st = layout.stage_of(r) if layout is not None else "?"
            labels.append(f"dev {r} · stage {st}")
        else:
            labels.append(f"  {s}")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.invert_yaxis()
    ax.set_xlim(0, step * k * 1.01)
    ax.set_xlabel(f"time ({unit})")
    s = result.summary
    ax.set_title(
        f"{s['name']}: step {s['step_time_s'] * k:.1f} {unit}, MFU {100 * s['mfu']:.1f}%, "
        f"bubble {100 * s['bubble_fraction']:.1f}%, exposed comm {100 * s['exposed_comm_fraction']:.1f}%",
        fontsize=10,
    )
    handles = [Patch(color=PHASE_COLOURS[p], label=lbl) for p, lbl in
               (("F", "forward"), ("B", "backward"), ("W", "weight grad"), ("R", "recompute"), ("opt", "optimizer"))]
    handles += [Patch(facecolor="none", edgecolor="#777777", hatch="////", label="bubble"),
                Patch(color="#F2B8B8", label="exposed comm")]
    if raw is not None and any(c == "offload_wait" for _, _, _, c, _ in raw.idle_spans):
        handles.append(Patch(facecolor="none", edgecolor="#B07A2A", hatch="....", label="offload wait"))
    handles += [Patch(color=AXIS_COLOURS[a], label=f"{a} comm") for a in ("tp", "cp", "ep", "dp", "pp")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.6 / max(1.0, fig_h - 1.2)),
              ncol=6, fontsize=7, frameon=False)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=130)
        plt.close(fig)
    return fig


def plot_memory(result, path=None, stacked_stage=None):
    """Memory in use over the step, one line per pipeline stage (the representative
    device of each), with the chip's HBM capacity; a stacked breakdown of the stage
    that peaks."""
    mem = result.memory
    s = result.summary
    step = s["step_time_s"]
    k, unit = _time_unit(step)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(14, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    for rank, df in mem.groupby("rank", sort=True):
        stage = int(df["stage"].iloc[0])
        t = list(df["time_s"] * k) + [step * k]
        y = list(df["total"] / 1e9) + [df["total"].iloc[-1] / 1e9]
        ax.step(t, y, where="post", label=f"stage {stage} (dev {rank})", linewidth=1.2)
    ax.axhline(s["hbm_bytes"] / 1e9, color="red", linestyle="--", linewidth=1, label="HBM capacity")
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("memory in use (GB)")
    ax.set_title(f"{s['name']}: memory per pipeline stage (peak {s['peak_memory_bytes'] / 1e9:.1f} GB)", fontsize=10)
    ax.set_xlim(0, step * k)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, ncol=2)
    stage = s.get("peak_memory_stage", 0) if stacked_stage is None else stacked_stage
    df = mem[mem["stage"] == stage]
    df = df[df["rank"] == df["rank"].min()]
    cats = ["weights", "gradients", "optimizer", "activations", "buffers"]
    t = list(df["time_s"] * k) + [step * k]
    ys = [list(df[c] / 1e9) + [df[c].iloc[-1] / 1e9] for c in cats]
    ax2.stackplot(t, ys, labels=cats, step="post", alpha=0.85)
    ax2.axhline(s["hbm_bytes"] / 1e9, color="red", linestyle="--", linewidth=1)
    ax2.set_xlabel(f"time ({unit})")
    ax2.set_title(f"breakdown, stage {stage}", fontsize=10)
    ax2.set_xlim(0, step * k)
    ax2.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=130)
        plt.close(fig)
    return fig
