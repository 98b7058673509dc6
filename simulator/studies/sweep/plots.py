"""Plots of a sweep's table (``DIR/results.parquet``).

* :func:`plot_metric`: a metric (step time, MFU, ...) against one axis, one line per
  layout — every combination of the other axes (or of ``hue``) is its own line;
* :func:`plot_heatmap`: a metric over two axes; when other axes vary too, each cell
  shows the best value over them (lowest step time / memory, highest MFU / throughput);
* :func:`plot_memory`: peak memory against one axis, one line per layout, with the
  chip's memory (``hbm_bytes``) drawn as a line;
* :func:`plot_sweep`: the lot, for a sweep directory, saved as PNG and SVG.

Only rows with ``status == "ok"`` are drawn. Axis values that are not numbers are
placed in order of first appearance. Axes are labelled in words with their unit
(:func:`axis_label`; byte and byte-per-second axes in GB and GB/s); ticks sit at the
swept values when there are few (on a base-2 scale for powers of two spanning 8x or
more), and at whole numbers for an axis of whole numbers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator, NullLocator

from simulator.errors import ReportError
from simulator.results.plots import new_figure
from simulator.studies.sweep.rows import META_FILE, PARQUET_FILE

HIGHER_IS_BETTER = ("mfu", "hfu", "tokens_per_s", "model_tflops_per_device")
LABELS = {
    "step_time_s": "step time (s)",
    "mfu": "MFU",
    "hfu": "HFU",
    "tokens_per_s": "tokens / s",
    "peak_memory_bytes": "peak memory (GB)",
    "bubble_fraction": "pipeline bubble",
    "exposed_comm_fraction": "exposed communication",
    "model_tflops_per_device": "model TFLOP/s per device",
}
FORMATS = ("png", "svg")
#: Sweep axes (dotted scenario keys) in words.
AXIS_WORDS = {
    "parallel.tp": "tensor-parallel size (tp)",
    "parallel.pp": "pipeline stages (pp)",
    "parallel.dp": "data-parallel replicas (dp)",
    "parallel.cp": "context-parallel size (cp)",
    "parallel.ep": "expert-parallel size (ep)",
    "parallel.etp": "expert tensor-parallel size (etp)",
    "parallel.vpp": "virtual stages per device (vpp)",
    "parallel.zero": "ZeRO stage",
    "parallel.sequence_parallel": "sequence parallelism",
    "training.micro_batch_size": "micro-batch size (sequences)",
    "training.global_batch_size": "global batch (sequences)",
    "training.seq_len": "sequence length (tokens)",
    "training.recompute": "activation recomputation",
    "training.dtype": "number format",
    "training.balance": "MoE load balancing",
    "schedule": "pipeline schedule",
    "model": "model",
    "model.preset": "model",
    "model.layers": "layers",
    "cluster": "cluster",
    "cluster.preset": "cluster",
    "cluster.devices": "devices",
    "cluster.network": "network",
}
_WORD_FIXES = {"bw": "bandwidth", "nic": "NIC", "hbm": "HBM", "tp": "TP", "dp": "DP", "pp": "PP", "ep": "EP"}
_UNITS = (("_bytes_per_s", 1e-9, "GB/s"), ("_bytes", 1e-9, "GB"), ("_flops_per_s", 1e-12, "TFLOP/s"), ("_s", 1.0, "s"))


def _unit(col: str) -> tuple[float, str]:
    """Scale and unit of a column named with its unit (``*_bytes_per_s`` -> GB/s, ...)."""
    for suffix, scale, unit in _UNITS:
        if col.endswith(suffix):
            return scale, unit
    return 1.0, ""


def axis_label(col: str) -> str:
    """A sweep axis in words: ``parallel.pp`` -> "pipeline stages (pp)",
    ``cluster.network.nic_bw_bytes_per_s`` -> "NIC bandwidth (GB/s)"."""
    if col in AXIS_WORDS:
        return AXIS_WORDS[col]
    if col in LABELS:
        return LABELS[col]
    leaf = str(col).split(".")[-1]
    _, unit = _unit(leaf)
    for suffix, _, u in _UNITS:
        if u == unit and leaf.endswith(suffix):
            leaf = leaf[: -len(suffix)]
            break
    words = " ".join(_WORD_FIXES.get(w, w) for w in leaf.split("_") if w)
    return f"{words} ({unit})" if unit else words


def _short(col: str) -> str:
    """A column's last dotted part, for legend entries (``parallel.tp=2``  -> ``tp=2``)."""
    return str(col).split(".")[-1]


class PlotError(ReportError):
    """A plot that cannot be drawn from this table (unknown column, nothing to draw)."""


def load_results(out_dir: str | Path) -> tuple[pd.DataFrame, dict]:
    """``(table, meta)`` of a sweep directory (``results.parquet``, ``sweep.json``)."""
    d = Path(out_dir)
    p = d / PARQUET_FILE
    if not p.exists():
        raise PlotError(f"{d}: no {PARQUET_FILE}; run `stepsim sweep ... --out {d}` first")
    try:
        frame = pd.read_parquet(p)
    except (ValueError, OSError) as err:  # pyarrow's ArrowInvalid: not a Parquet file (was an internal error)
        raise PlotError(f"{p}: not the table `stepsim sweep` writes ({str(err)[:200]})") from None
    meta_path = d / META_FILE
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if "axes" not in meta:
        fixed = {"case", "status", "error", "key"}
        meta["axes"] = (
            [c for c in frame.columns[: list(frame.columns).index("status")] if c not in fixed]
            if "status" in frame.columns
            else []
        )
    return frame, meta


def _check(frame: pd.DataFrame, *cols: str | None) -> None:
    for c in cols:
        if c is not None and c not in frame.columns:
            raise PlotError(f"no column {c!r}; columns: {', '.join(map(str, frame.columns))}")


def _ok(frame: pd.DataFrame) -> pd.DataFrame:
    ok = frame[frame["status"] == "ok"] if "status" in frame.columns else frame
    if ok.empty:
        raise PlotError("no successful rows to plot")
    return ok


def _positions(values: pd.Series) -> tuple[np.ndarray, list | None]:
    """Numeric x positions (in the column's display unit), and tick labels when the
    values are categorical."""
    num = pd.to_numeric(values, errors="coerce")
    if num.notna().all():
        return num.to_numpy(dtype=float) * _unit(str(values.name))[0], None
    cats = list(dict.fromkeys(values.astype(str)))
    return np.array([cats.index(v) for v in values.astype(str)], dtype=float), cats


def _fmt(v) -> str:
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e6:
        return str(int(v))
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _hue_labels(frame: pd.DataFrame, hue: str | Sequence[str] | None) -> pd.Series:
    if hue is None or (not isinstance(hue, str) and not hue):
        return pd.Series(["all"] * len(frame), index=frame.index)
    cols = [hue] if isinstance(hue, str) else list(hue)
    return frame[cols].apply(lambda r: ", ".join(f"{_short(c)}={_fmt(v)}" for c, v in zip(cols, r)), axis=1)


def _scale(metric: str, values: np.ndarray) -> np.ndarray:
    return values / 1e9 if metric == "peak_memory_bytes" else values


def plot_metric(frame: pd.DataFrame, x: str, y: str = "step_time_s", hue=None, ax=None):
    """``y`` against axis ``x``, one line per value of ``hue`` (a column or a list of columns:
    the layout). Returns the figure."""
    _check(frame, x, y, *([hue] if isinstance(hue, str) else (hue or [])))
    ok = _ok(frame)
    fig, ax = (ax.figure, ax) if ax is not None else new_figure((7, 4.4))
    xs, cats = _positions(ok[x])
    groups = _hue_labels(ok, hue)
    for name in dict.fromkeys(groups):
        sel = (groups == name).to_numpy()
        order = np.argsort(xs[sel], kind="stable")
        ax.plot(xs[sel][order], _scale(y, ok[y].to_numpy(dtype=float)[sel][order]), marker="o", label=name)
    _finish(ax, x, LABELS.get(y, y), cats, legend=groups.nunique() > 1, xs=xs)
    return fig


def plot_memory(frame: pd.DataFrame, x: str, hue=None, ax=None):
    """Peak memory against ``x``, one line per layout, with the chip's HBM as a dashed line."""
    _check(frame, "peak_memory_bytes", "hbm_bytes")
    fig = plot_metric(frame, x, "peak_memory_bytes", hue=hue, ax=ax)
    ax = fig.axes[0]
    for i, hbm in enumerate(sorted(set(_ok(frame)["hbm_bytes"].dropna()))):
        ax.axhline(hbm / 1e9, color="crimson", ls="--", lw=1.2, label="HBM" if i == 0 else None)
    ax.legend(loc="best")
    return fig


def plot_heatmap(frame: pd.DataFrame, x: str, y: str, value: str = "mfu", ax=None):
    """``value`` over axes ``x`` and ``y``; the best value over any other varying axis per cell."""
    _check(frame, x, y, value)
    ok = _ok(frame)
    agg = "max" if value in HIGHER_IS_BETTER else "min"
    table = ok.pivot_table(index=y, columns=x, values=value, aggfunc=agg, sort=True)
    fig, ax = (ax.figure, ax) if ax is not None else new_figure((7, 4.8))
    data = _scale(value, table.to_numpy(dtype=float))
    im = ax.imshow(data, aspect="auto", origin="lower", cmap="viridis" if agg == "max" else "viridis_r")
    xlabels = [_fmt(_in_unit(x, c)) for c in table.columns]
    long = max(map(len, xlabels)) > 4
    ax.set_xticks(range(len(xlabels)), xlabels, rotation=30 if long else 0, ha="right" if long else "center")
    ax.set_yticks(range(len(table.index)), [_fmt(_in_unit(y, i)) for i in table.index])
    ax.set_xlabel(axis_label(x))
    ax.set_ylabel(axis_label(y))
    for (i, j), v in np.ndenumerate(data):
        if np.isfinite(v):
            light = im.cmap(im.norm(v))[:3]
            dark_text = sum(light) / 3 > 0.5
            ax.text(j, i, f"{v:.3g}", ha="center", va="center", color="black" if dark_text else "white")
    fig.colorbar(im, ax=ax, label=LABELS.get(value, value))
    fig.tight_layout()
    return fig


def _in_unit(col: str, v):
    """An axis value in the column's display unit (numbers only)."""
    scale = _unit(str(col))[0]
    return v * scale if scale != 1.0 and isinstance(v, (int, float, np.number)) else v


def _value_ticks(ax, xs: np.ndarray) -> None:
    """Ticks at the swept values when there are at most 12 (whole numbers printed as such);
    a base-2 scale for powers of two spanning 8x or more; otherwise whole-number ticks for
    an axis of whole numbers."""
    vals = np.unique(xs[np.isfinite(xs)])
    if not len(vals):
        return
    whole = bool(np.all(vals == np.round(vals)))
    pow2 = whole and np.all(vals > 0) and np.all(np.log2(vals) == np.round(np.log2(vals)))
    if pow2 and len(vals) >= 3 and vals.max() / vals.min() >= 8:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_locator(NullLocator())
    if len(vals) <= 12:
        ax.set_xticks(vals, [_fmt(float(v)) for v in vals])
    elif whole:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _finish(ax, x: str, ylabel: str, cats: list | None, legend: bool, xs=None) -> None:
    if cats is not None:
        ax.set_xticks(range(len(cats)), cats, rotation=30, ha="right")
    elif xs is not None:
        _value_ticks(ax, xs)
    ax.set_xlabel(axis_label(x))
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(loc="best")
    ax.figure.tight_layout()


def _save(fig, stem: Path, formats: Sequence[str]) -> list[Path]:
    """``fig`` as ``stem.<fmt>`` for each format, each written whole or not at all."""
    from simulator.results.outdir import staged_file

    paths = []
    try:
        for fmt in formats:
            p = stem.with_name(f"{stem.name}.{fmt}")
            with staged_file(p, "plots") as tmp:
                fig.savefig(tmp, dpi=120, format=fmt)
            paths.append(p)
    finally:
        plt.close(fig)
    return paths


def plot_sweep(
    out_dir: str | Path,
    x: str | None = None,
    y: str = "step_time_s",
    hue: str | None = None,
    heatmap: str | None = None,
    formats: Sequence[str] = FORMATS,
) -> list[Path]:
    """Draw a sweep directory's plots into ``DIR/plots``: ``y`` against ``x`` (default: the
    first axis) with one line per layout (``hue``; default every other axis), peak memory
    against ``x`` with the HBM line, and a heatmap of ``y`` over ``x`` and ``heatmap``
    (default: the second axis, when there is one). Returns the files written."""
    frame, meta = load_results(out_dir)
    axes = [a for a in meta.get("axes", []) if a in frame.columns]
    x = x or (axes[0] if axes else None)
    if x is None:
        raise PlotError("the sweep has no axis columns; give --x")
    _check(frame, x, y, hue, heatmap)
    others = [a for a in axes if a != x and frame[a].nunique(dropna=False) > 1]
    hue_cols = hue if hue is not None else others
    plots = Path(out_dir) / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    paths = _save(plot_metric(frame, x, y, hue=hue_cols), plots / f"{y}_vs_{x}", formats)
    if "peak_memory_bytes" in frame.columns and "hbm_bytes" in frame.columns:
        paths += _save(plot_memory(frame, x, hue=hue_cols), plots / f"memory_vs_{x}", formats)
    second = heatmap or (others[0] if others else None)
    if second is not None and second != x:
        paths += _save(plot_heatmap(frame, x, second, value=y), plots / f"heatmap_{y}_{x}_{second}", formats)
    return paths
