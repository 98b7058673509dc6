"""Why one step differs from another (``stepsim explain A B``): each step's time split into
causes that add up to it exactly, and the difference of two steps split the same way.

A device's step is compute-stream busy time plus its idle time, split by the idle attribution
(:mod:`simulator.engine.accounting`) into pipeline bubble, exposed communication per parallel
axis and offload wait; averaged over devices (each simulated rank weighed by the devices it
stands for) these are the summary's ``compute_time_s_mean``, ``bubble_s_mean``,
``exposed_comm_by_axis_s`` and ``offload_wait_s``, which add up to the step time. The compute
part is split further by kernel class (:func:`kernel_class`; a recomputed op's time is
``recompute``): each op's duration among its kernels by their roofline times, and each rank's
busy time in proportion to its ops' durations by class (the classes' shares of a rank then add
up to its busy time exactly, also where ops of one stream overlap).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

#: Compute classes, in the order tables and the waterfall show them.
CLASSES = (
    "attention",
    "dense GEMMs",
    "expert GEMMs",
    "MoE kernels",
    "FP8 quantisation",
    "elementwise and norms",
    "recompute",
    "optimizer",
)
#: Kernel names of the MoE layer's own kernels (workloads/moe_kernels.py) and the router GEMM.
MOE_KERNEL_PREFIXES = ("moe_", "router")


def kernel_class(k) -> str:
    """The compute class of one kernel (one of :data:`CLASSES` but ``recompute``)."""
    if k.name.startswith("optimizer"):
        return "optimizer"
    if k.kind == "gemm" and k.groups > 1:
        return "expert GEMMs"
    if k.name.startswith(MOE_KERNEL_PREFIXES):
        return "MoE kernels"
    if k.kind == "quantize":  # workloads.quantization's passes, and their backward
        return "FP8 quantisation"
    if k.kind == "attention":
        return "attention"
    if k.kind == "gemm":
        return "dense GEMMs"
    return "elementwise and norms"


def causes(result) -> dict[str, float]:
    """Seconds of ``result``'s step by cause: ``compute: <class>`` (:data:`CLASSES`), ``bubble``,
    ``exposed <axis>`` for each parallel axis, ``offload wait``; they add up to the step time
    (to rounding). Needs the run's op records: a steady-state summary has none."""
    raw, trace = result.raw, result.trace
    acc = getattr(raw, "account", None) if raw is not None else None
    if acc is None or trace is None:
        raise ValueError("explain needs a simulated step with its op records (not a steady-state summary)")
    ranks = list(acc.ranks)
    w = np.array([trace.weight[r] for r in ranks], dtype=float)
    idx = {r: i for i, r in enumerate(ranks)}
    by_class = np.zeros((len(ranks), len(CLASSES)))
    col = {c: j for j, c in enumerate(CLASSES)}
    from simulator.engine.compute import calibration_for, kernel_time_s

    sc = result.scenario
    chip, dtype = sc.cluster.chip, sc.training.dtype
    cal = calibration_for(chip, dict(sc.compute_overrides))
    times: dict = {}  # kernel -> its roofline time: an op's duration is split by its kernels'
    for rec in raw.records:
        op = rec.op
        if op.kind != "compute" or op.rank not in idx:
            continue
        dur, i = rec.end_s - rec.start_s, idx[op.rank]
        if op.recompute:
            by_class[i, col["recompute"]] += dur
            continue
        t = [
            times.get(k) if k in times else times.setdefault(k, kernel_time_s(k, chip, cal, dtype)) for k in op.kernels
        ]
        total = sum(t)
        if total <= 0:
            by_class[i, col["elementwise and norms"]] += dur
            continue
        for k, tk in zip(op.kernels, t):
            by_class[i, col[kernel_class(k)]] += dur * tk / total
    totals = by_class.sum(axis=1, keepdims=True)
    share = np.divide(by_class, totals, out=np.zeros_like(by_class), where=totals > 0)
    compute = share * acc.compute_s[:, None]  # each rank's busy time, split by class

    def mean(x) -> float:
        return float(w @ x / w.sum())

    out = {f"compute: {c}": mean(compute[:, j]) for j, c in enumerate(CLASSES)}
    out["bubble"] = mean(acc.bubble_s)
    for j, a in enumerate(acc.axes):
        out[f"exposed {a}"] = mean(acc.exposed_by_axis_s[:, j])
    out["offload wait"] = mean(acc.offload_wait_s)
    return out


def explain(a: Mapping[str, float], b: Mapping[str, float]) -> list[tuple[str, float, float, float]]:
    """``(cause, A seconds, B seconds, B - A)`` for every cause of either step (``causes``
    mappings), the compute classes first; the differences add up to ``step(B) - step(A)``."""
    keys = [k for k in a if k in b] + [k for k in a if k not in b] + [k for k in b if k not in a]
    rows = [(k, a.get(k, 0.0), b.get(k, 0.0), b.get(k, 0.0) - a.get(k, 0.0)) for k in keys]
    return [r for r in rows if r[1] or r[2]]


def format_table(rows, name_a: str, name_b: str) -> str:
    """The table ``stepsim explain`` prints: one line per cause, then the steps."""
    w = max([len(r[0]) for r in rows] + [12])
    lines = [f"{'cause':<{w}}  {name_a[:14]:>14}  {name_b[:14]:>14}  {'B - A':>11}"]
    for k, x, y, d in rows:
        lines.append(f"{k:<{w}}  {x * 1e3:11.3f} ms  {y * 1e3:11.3f} ms  {d * 1e3:+8.3f} ms")
    sa, sb = sum(r[1] for r in rows), sum(r[2] for r in rows)
    lines.append(f"{'step':<{w}}  {sa * 1e3:11.3f} ms  {sb * 1e3:11.3f} ms  {(sb - sa) * 1e3:+8.3f} ms")
    return "\n".join(lines)


def moved_causes(rows) -> list[tuple[str, float, float, float]]:
    """The waterfall's bars: the rows whose cause moved by a millionth of step A or more,
    largest move first (the PNG and the HTML waterfall draw the same bars)."""
    start = sum(r[1] for r in rows)
    moved = [r for r in rows if abs(r[3]) > 1e-6 * max(start, 1e-30)]
    moved.sort(key=lambda r: -abs(r[3]))
    return moved


def plot_waterfall(rows, path, name_a: str, name_b: str):
    """A waterfall from step A to step B: one bar per cause that moved, green where B gains."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    start = sum(r[1] for r in rows)
    moved = moved_causes(rows)
    fig = Figure(figsize=(9, 0.5 * len(moved) + 2.2))
    ax = fig.add_subplot()
    labels, level = [f"step {name_a}"], start
    ax.barh(0, start * 1e3, color="#888888")
    for i, (k, _, _, d) in enumerate(moved, start=1):
        left = level + min(d, 0.0)
        ax.barh(i, abs(d) * 1e3, left=left * 1e3, color="#2a9d8f" if d < 0 else "#e76f51")
        ax.text((left + abs(d)) * 1e3, i, f" {d * 1e3:+.2f} ms", va="center", fontsize=8)
        labels.append(k)
        level += d
    ax.barh(len(moved) + 1, level * 1e3, color="#444444")
    labels.append(f"step {name_b}")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    # zoom on the levels the bars walk through (the step bars run off the left edge)
    levels = np.cumsum([start] + [r[3] for r in moved])
    lo, hi = float(levels.min()), float(levels.max())
    pad = max(hi - lo, 1e-3 * hi) * 0.35
    ax.set_xlim(max(0.0, lo - pad) * 1e3, (hi + pad) * 1e3)
    ax.set_xlabel("ms per step")
    ax.set_title(f"where the step time goes\nB: {name_b}\nagainst A: {name_a}", fontsize=9, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def explain_pairs(results: Mapping):
    """Every schedule's step against the first one's, cause by cause
    (:func:`simulator.results.explain.explain`; the ``delta_s`` of a schedule add up to its step
    time less the first's): columns ``schedule``, ``against``, ``cause``, ``a_s``, ``b_s``, ``delta_s``."""
    import pandas as pd

    names = list(results)
    if not names:
        return pd.DataFrame(columns=["schedule", "against", "cause", "a_s", "b_s", "delta_s"])
    base = causes(results[names[0]])
    rows = []
    for name in names[1:]:
        for cause, a, b, d in explain(base, causes(results[name])):
            rows.append({"schedule": name, "against": names[0], "cause": cause, "a_s": a, "b_s": b, "delta_s": d})
    return pd.DataFrame(rows, columns=["schedule", "against", "cause", "a_s", "b_s", "delta_s"])
