"""The validation results as tables and figures: error statistics overall, per chip
family and per model kind (MoE or dense), the printed table, the CSV and the parity plot."""

from __future__ import annotations

import csv
import statistics
from collections.abc import Sequence
from pathlib import Path

from simulator.studies.validate.cases import BOOLEAN_METRICS, CaseResult


def error_stats(results: Sequence[CaseResult]) -> tuple[float, float, str]:
    """(median |error|, worst |error|, name of the worst case)."""
    if not results:
        return float("nan"), float("nan"), ""
    errs = [abs(r.error) for r in results]
    worst = max(results, key=lambda r: abs(r.error))
    return statistics.median(errs), abs(worst.error), worst.case.name


def family_stats(results: Sequence[CaseResult], timing_only: bool = True) -> dict:
    """Per chip family: ``{family: (cases, median |error|, worst |error|, worst case)}``,
    over the speed metrics only by default (memory figures and expected-OOM verdicts are
    left out: their errors are 0 or of another kind), families in the order of
    :data:`FAMILY_ORDER`."""
    sel = [r for r in results if r.is_timing or not timing_only]
    fams = sorted({r.family for r in sel}, key=_family_key)
    out = {}
    for fam in fams:
        rs = [r for r in sel if r.family == fam]
        med, worst, name = error_stats(rs)
        out[fam] = (len(rs), med, worst, name)
    return out


#: Model kinds in the order tables list them: ``moe`` (the model has experts), ``dense``.
KIND_ORDER = ("moe", "dense")


def kind_stats(results: Sequence[CaseResult]) -> dict:
    """Per model kind, over the speed metrics only: ``{kind: (cases, median |error|, median
    speed-signed error)}`` (:attr:`CaseResult.speed_error`: positive = the simulation is faster
    than published, for time and throughput metrics alike), kinds in :data:`KIND_ORDER`, a kind
    without speed cases left out."""
    out = {}
    for kind in KIND_ORDER:
        rs = [r for r in results if r.is_timing and r.kind == kind]
        if rs:
            out[kind] = (
                len(rs),
                statistics.median(abs(r.error) for r in rs),
                statistics.median(r.speed_error for r in rs),
            )
    return out


#: Chip families in the order tables and plots list them (oldest first).
FAMILY_ORDER = ("ampere", "hopper", "blackwell", "tpu")


def _family_key(fam: str):
    return (FAMILY_ORDER.index(fam) if fam in FAMILY_ORDER else len(FAMILY_ORDER), fam)


def format_table(results: Sequence[CaseResult]) -> str:
    """The human table: case, metric, published, simulated, error, simulated peak
    memory (``OOM`` when it does not fit), wall time; under it the medians overall, per chip
    family and per model kind (:func:`kind_stats`); the cases that fail on memory last."""
    w = max([len("case")] + [len(r.case.name) for r in results])
    lines = [
        f"{'case':<{w}}  {'metric':<22} {'published':>10} {'simulated':>10} {'error':>8} {'peak GB':>8} "
        f"{'':>3} {'sim s':>7}"
    ]
    for r in results:
        lines.append(
            f"{r.case.name:<{w}}  {r.case.metric:<22} {_fmt(r.case.published):>10} {_fmt(r.simulated):>10} "
            f"{r.error:>+8.1%} {r.peak_memory_bytes / 1e9:>8.1f} {'OOM' if r.oom else '':>3} "
            f"{r.sim_wall_s:>7.1f}"
        )
    med, worst, name = error_stats(results)
    lines.append(f"{len(results)} cases; median |error| {med:.1%}; worst |error| {worst:.1%} ({name})")
    timing = [r for r in results if r.is_timing]
    if timing and len(timing) < len(results):
        med, worst, name = error_stats(timing)
        lines.append(f"{len(timing)} speed cases; median |error| {med:.1%}; worst |error| {worst:.1%} ({name})")
    for fam, (n, med, worst, name) in family_stats(results).items():
        lines.append(f"  {fam or '?'}: {n} speed cases; median |error| {med:.1%}; worst {worst:.1%} ({name})")
    for kind, (n, med, signed) in kind_stats(results).items():
        lines.append(
            f"  {kind}: {n} speed cases; median |error| {med:.1%}; median speed-signed error {signed:+.1%}"
            " (+ = simulation faster)"
        )
    failed = [r for r in results if r.failure]
    for r in failed:
        lines.append(f"FAILED {r.case.name}: {r.failure}")
    return "\n".join(lines)


def _fmt(x: float) -> str:
    return f"{x:.4g}" if abs(x) < 1 else f"{x:.2f}" if abs(x) < 100 else f"{x:.1f}"


#: The CSV's columns; ``kind`` is ``moe`` or ``dense``, ``speed_error`` the speed-signed error
#: (:attr:`CaseResult.speed_error`; empty for memory figures and expected-OOM verdicts).
CSV_COLUMNS = (
    "case",
    "metric",
    "published",
    "simulated",
    "error",
    "source",
    "peak_memory_bytes",
    "oom",
    "family",
    "kind",
    "speed_error",
)


def write_csv(results: Sequence[CaseResult], path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in results:
            w.writerow(
                [
                    r.case.name,
                    r.case.metric,
                    repr(r.case.published),
                    repr(r.simulated),
                    repr(r.error),
                    r.case.source,
                    repr(r.peak_memory_bytes),
                    str(r.oom).lower(),
                    r.family,
                    r.kind,
                    repr(r.speed_error) if r.is_timing else "",
                ]
            )
    return p


def plot_parity(results: Sequence[CaseResult], path: str | Path, band: float = 0.10) -> Path:
    """Simulated vs published, one panel per chip family (the unit of calibration), log
    axes, a ±``band`` band, one marker per metric (each scaled by the geometric mean of its
    published values in the panel); each panel's title gives its speed cases' median and
    worst |error|. Expected-OOM verdicts (booleans) are left out."""
    rows = [
        (r.family, r.case.metric, r.case.published, r.simulated, r.error, r.is_timing)
        for r in results
        if r.case.metric not in BOOLEAN_METRICS
    ]  # log axes: numbers only
    return plot_parity_rows(rows, path, band)


def plot_parity_rows(rows, path: str | Path, band: float = 0.10) -> Path:
    """:func:`plot_parity` from plain rows ``(family, metric, published, simulated, error,
    is_timing)`` (what ``validation.csv`` holds, so the notebook can draw the committed run)."""
    import matplotlib.pyplot as plt  # no backend chosen here: Agg headless, the notebook's in a notebook
    import numpy as np
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    rows = [r for r in rows if r[2] > 0 and r[3] > 0]
    # Metrics differ by orders of magnitude (MFU ~0.5, tokens/s ~1e6): within a panel each
    # metric is divided by the geometric mean of its published values, so every metric sits
    # around 1 and the diagonal and the band keep their meaning.
    scale = {}
    for fam, m in {(r[0], r[1]) for r in rows}:
        pub = [r[2] for r in rows if r[0] == fam and r[1] == m]
        scale[fam, m] = float(np.exp(np.mean(np.log(pub))))
    rows = [(f, m, p / scale[f, m], q / scale[f, m], e, t) for f, m, p, q, e, t in rows]
    fams = sorted({r[0] for r in rows}, key=_family_key) or [""]
    metrics = sorted({r[1] for r in rows})
    markers = dict(zip(metrics, "osD^vP*X<>h"))
    fig, axes = plt.subplots(1, len(fams), figsize=(4.4 * len(fams), 4.5), squeeze=False)
    for ax, fam in zip(axes[0], fams):
        rs = [r for r in rows if r[0] == fam]
        if not rs:
            ax.text(0.5, 0.5, "no numeric metric to plot", ha="center", va="center")
            continue
        vals = [v for r in rs for v in (r[2], r[3])]
        lo, hi = min(vals) / 1.5, max(vals) * 1.5
        x = np.geomspace(lo, hi, 50)
        ax.fill_between(x, x * (1 - band), x * (1 + band), color="0.88", label=f"±{band:.0%}")
        ax.plot(x, x, color="0.4", lw=0.8)
        for m in metrics:
            sel = [r for r in rs if r[1] == m]
            if sel:
                ax.scatter([r[2] for r in sel], [r[3] for r in sel], marker=markers[m], label=m, s=30, zorder=3)
        errs = [abs(r[4]) for r in rs if r[5]]
        title = fam or "?"
        if errs:
            title += f": {len(errs)} speed cases, median |err| {np.median(errs):.1%}, worst {max(errs):.1%}"
        ax.set_title(title, fontsize=8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        for axis in (ax.xaxis, ax.yaxis):  # log axes spanning < 2 decades: no crowded minor labels
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_minor_formatter(NullFormatter())
            axis.set_major_formatter(FormatStrFormatter("%g"))
        ax.set_xlabel("published (÷ geometric mean of its metric)")
        ax.set_ylabel("simulated (same scale)")
        ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=120)
    plt.close(fig)
    return p
