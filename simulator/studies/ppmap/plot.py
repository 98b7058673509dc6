"""The map figure (:func:`plot_map`): per model a heat map of ``ratio`` (best without PP / best)
over scale-up domain size and scale-out bandwidth, with the :data:`~simulator.studies.ppmap.spec.RATIO_CONTOUR`
contour and today's systems in a strip below.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from simulator.studies.ppmap.spec import RATIO_CONTOUR
from workloads.enums import SCHEDULES

_PLOT_VMAX = 2.0  # ratios from here up (and "PP needed") share the darkest colour


def plot_map(table: pd.DataFrame, path: str | Path, markers: Mapping[str, tuple] | None = None, title: str = ""):
    """Heat map per model of ``ratio`` (best without PP / best) over domain size (rows) and
    NIC bandwidth per GPU (columns), the 1.10 contour, today's systems as annotated cells
    in a strip below (``markers``: system label -> (domain, nic GB/s) also marks it on the
    grid). Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import LinearSegmentedColormap

    markers = dict(markers or {})
    models = list(dict.fromkeys(table["model"]))
    grid = table[table["system"] == "grid"]
    doms = sorted(grid["domain"].dropna().unique().astype(int)) if len(grid) else []
    nics = sorted(grid["nic_gbps"].dropna().unique()) if len(grid) else []
    systems = list(dict.fromkeys(table.loc[table["system"] != "grid", "system"]))
    cmap = LinearSegmentedColormap.from_list(
        "pp", ["#f7f7f7", "#fdd49e", "#fc8d59", "#d7301f", "#7f0000"]
    ).with_extremes(bad="#dddddd")
    rows = 2 if systems else 1
    fig, axes = plt.subplots(
        rows,
        len(models),
        figsize=(6.2 * len(models), 4.6 + 2.0 * (rows - 1)),
        gridspec_kw={"height_ratios": [max(len(doms), 1), 1.3][:rows]},
        squeeze=False,
    )
    for j, model in enumerate(models):
        ax = axes[0, j]
        im = _draw_grid(ax, grid[grid["model"] == model], doms, nics, cmap)
        _draw_markers(ax, markers, doms, nics)
        ax.set_xticks(range(len(nics)), [f"{w:g}" for w in nics])
        ax.set_yticks(range(len(doms)), [str(d) for d in doms])
        ax.set_xlabel("scale-out bandwidth per GPU (GB/s)")
        ax.set_ylabel("GPUs per scale-up domain")
        ax.set_title(f"{model}: best without PP / best (contour {RATIO_CONTOUR:.2f})", fontsize=10)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
        if systems:
            _draw_systems(axes[1, j], table, model, systems, cmap)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return fig


def _shown(r):
    """A ratio as drawn: "PP needed" (inf) at the top of the colour scale."""
    import numpy as np

    return _PLOT_VMAX if r is not None and np.isinf(r) else r


def _draw_grid(ax, g: pd.DataFrame, doms: list, nics: list, cmap):
    """One model's heat map of the ratio on ``ax``: a cell per (domain, NIC bandwidth), its value
    written in it (the estimate's, hatched and marked "est", where not simulated yet), the
    :data:`RATIO_CONTOUR` contour. Returns the image."""
    import matplotlib.pyplot as plt
    import numpy as np

    vmax = _PLOT_VMAX
    z = np.full((len(doms), len(nics)), np.nan)
    for _, r in g.iterrows():
        # a point screened but not simulated yet shows the estimate's ratio, marked "est"
        v = r["ratio"] if not pd.isna(r["ratio"]) else r.get("est_ratio")
        if v is not None and not pd.isna(v):
            z[doms.index(int(r["domain"])), nics.index(r["nic_gbps"])] = min(_shown(v), vmax)
    im = ax.imshow(z, cmap=cmap, vmin=1.0, vmax=vmax, origin="lower", aspect="auto")
    for _, r in g.iterrows():
        i, k = doms.index(int(r["domain"])), nics.index(r["nic_gbps"])
        sim = not pd.isna(r["ratio"])
        v = r["ratio"] if sim else r.get("est_ratio")
        txt = "—" if v is None or pd.isna(v) else ("PP\nneeded" if np.isinf(v) else f"{v:.2f}")
        if not sim and txt != "—":
            txt = f"est\n{txt}"
            ax.add_patch(plt.Rectangle((k - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", ec="0.6", lw=0))
        dark = v is not None and not pd.isna(v) and min(_shown(v), vmax) > 1.6
        ax.text(
            k,
            i,
            txt,
            ha="center",
            va="center",
            fontsize=8,
            style="normal" if sim else "italic",
            color="white" if dark else "black",
            weight="bold" if sim else "normal",
        )
    if np.isfinite(z).sum() >= 4 and len(doms) > 1 and len(nics) > 1:
        ax.contour(
            np.arange(len(nics)),
            np.arange(len(doms)),
            np.ma.masked_invalid(z),
            levels=[RATIO_CONTOUR],
            colors="k",
            linewidths=1.6,
        )
    return im


def _draw_markers(ax, markers: Mapping, doms: list, nics: list) -> None:
    """Mark today's systems (``markers``: label -> (domain, nic GB/s)) on their grid cells."""
    at: dict = {}
    for lab, (d, w) in markers.items():
        if d in doms and w in nics:
            at.setdefault((doms.index(d), nics.index(float(w))), []).append(lab)
    for (i, k), labs in at.items():
        ax.plot(k - 0.36, i + 0.3, "o", ms=7, mfc="#1f4e9c", mec="white", mew=1.2)
        ax.text(
            k - 0.28,
            i + 0.3,
            " / ".join(labs),
            color="#1f4e9c",
            fontsize=6.5,
            va="center",
            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85},
        )


def _draw_systems(sx, table: pd.DataFrame, model: str, systems: list, cmap) -> None:
    """The strip of today's systems below a model's grid: each one's ratio and best layout."""
    import numpy as np

    vmax = _PLOT_VMAX
    s = table[(table["model"] == model) & (table["system"] != "grid")].set_index("system")
    vals, texts = [], []
    for x in systems:
        r = s.loc[x] if x in s.index else None
        sim = r is not None and not pd.isna(r["ratio"])
        v = None if r is None else (r["ratio"] if sim else r.get("est_ratio"))
        ok = v is not None and not pd.isna(v)
        vals.append(min(_shown(v), vmax) if ok else np.nan)
        txt = x + "\n" + ("—" if not ok else ("est " if not sim else "") + ("PP needed" if np.isinf(v) else f"{v:.2f}"))
        if sim and isinstance(r["best_label"], str):
            parts = r["best_label"].split("-")
            label = "-" + r["best_label"] + "-"
            sched = next((x for x in sorted(SCHEDULES, key=len, reverse=True) if f"-{x}-" in label), "")
            sched = sched.replace("-1f1b", " 1f1b")
            # the schedule on a line of its own: five systems leave a cell too narrow for both
            txt += "\n" + " ".join(x for x in parts if x[:2] in ("pp", "ep")) + ("\n" + sched if sched else "")
        texts.append((txt, sim))
    sx.imshow(np.array([vals]), cmap=cmap, vmin=1.0, vmax=vmax, aspect="auto")
    for k, (txt, sim) in enumerate(texts):
        sx.text(k, 0, txt, ha="center", va="center", fontsize=7, style="normal" if sim else "italic")
    sx.set_xticks([])
    sx.set_yticks([])
    sx.set_title("today's systems, each searched on its own", fontsize=9)
