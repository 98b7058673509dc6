"""Run one scenario under several pipeline schedules and compare them side by side.

``stepsim compare SCENARIO --schedules gpipe,1f1b,interleaved-1f1b,zb-h1,dualpipe``
simulates the scenario once per schedule (``interleaved-1f1b`` with
``--vpp`` virtual stages, default 2; the others with vpp 1), prints a table of
step time, MFU, bubble fraction and peak memory, and draws one figure: a
compute timeline per schedule (bubbles hatched) and bars of the three figures.
"""

from __future__ import annotations

import copy
from typing import Mapping, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from simulator.plots import PHASE_COLOURS  # noqa: E402
from simulator.schema import ScenarioError, builtin_scenarios, read_mapping  # noqa: E402
from simulator.simulate import simulate  # noqa: E402
from workloads.schedules import SCHEDULES  # noqa: E402


def compare_schedules(scenario, schedules: Sequence[str] = SCHEDULES, vpp: int = 2):
    """Simulate ``scenario`` (a path or mapping) under each schedule.

    Returns ``(table, results)``: a DataFrame with one row per schedule and the
    :class:`~simulator.result.Result` of each."""
    if isinstance(scenario, str) and scenario in builtin_scenarios():
        scenario = builtin_scenarios()[scenario]
    base = read_mapping(scenario) if not isinstance(scenario, Mapping) else copy.deepcopy(dict(scenario))
    rows, results = [], {}
    for name in schedules:
        if name not in SCHEDULES:
            raise ScenarioError("schedules", f"unknown schedule {name!r}; allowed: {', '.join(SCHEDULES)}")
        sc = copy.deepcopy(base)
        sc["schedule"] = name
        par = dict(sc.get("parallel") or {})
        par["vpp"] = vpp if name == "interleaved-1f1b" else 1
        sc["parallel"] = par
        res = simulate(sc)
        results[name] = res
        s = res.summary
        rows.append({
            "schedule": name, "vpp": par["vpp"], "step_time_s": s["step_time_s"], "mfu": s["mfu"],
            "bubble_fraction": s["bubble_fraction"], "exposed_comm_fraction": s["exposed_comm_fraction"],
            "peak_memory_bytes": s["peak_memory_bytes"],
            "peak_activation_bytes": float(res.memory["activations"].max()), "oom": s["oom"],
        })
    return pd.DataFrame(rows), results


def format_table(table: pd.DataFrame) -> str:
    lines = [f"{'schedule':<18}{'step (s)':>10}{'MFU':>8}{'bubble':>9}{'exp.comm':>10}{'peak mem':>11}{'peak act':>11}"]
    for r in table.itertuples(index=False):
        lines.append(f"{r.schedule:<18}{r.step_time_s:>10.4f}{100 * r.mfu:>7.1f}%{100 * r.bubble_fraction:>8.1f}%"
                     f"{100 * r.exposed_comm_fraction:>9.1f}%{r.peak_memory_bytes / 1e9:>9.1f}GB"
                     f"{r.peak_activation_bytes / 1e9:>9.1f}GB")
    return "\n".join(lines)


def plot_comparison(table: pd.DataFrame, results: dict, path: Optional[str] = None):
    n = len(results)
    fig = plt.figure(figsize=(15, 2.0 * n + 3.2))
    gs = fig.add_gridspec(n + 1, 3, height_ratios=[1.0] * n + [1.6])
    t_max = max(r.summary["step_time_s"] for r in results.values())
    for i, (name, res) in enumerate(results.items()):
        ax = fig.add_subplot(gs[i, :])
        ev = res.events[res.events["stream"] == "compute"]
        stages = sorted(set(ev["stage"]))
        bars: dict[tuple, list] = {}
        for row in ev.itertuples(index=False):
            if row.duration_s > 0:
                bars.setdefault((row.stage, PHASE_COLOURS.get(row.phase, "#999999")), []).append(
                    (row.start_s * 1e3, row.duration_s * 1e3))
        for (st, colour), spans in sorted(bars.items()):
            ax.broken_barh(spans, (st - 0.4, 0.8), facecolors=colour, linewidth=0)
        ax.set_xlim(0, t_max * 1e3 * 1.01)
        ax.set_yticks(stages)
        ax.set_yticklabels([f"stage {s}" for s in stages], fontsize=7)
        ax.invert_yaxis()
        s = res.summary
        ax.set_title(f"{name}: step {s['step_time_s'] * 1e3:.1f} ms, bubble {100 * s['bubble_fraction']:.1f}%, "
                     f"peak {s['peak_memory_bytes'] / 1e9:.1f} GB", fontsize=9, loc="left")
        if i == n - 1:
            ax.set_xlabel("time (ms)")
    labels = list(table["schedule"])
    for j, (col, title, scale, unit) in enumerate((
        ("step_time_s", "step time", 1e3, "ms"), ("bubble_fraction", "bubble", 100, "%"),
        ("peak_memory_bytes", "peak memory", 1e-9, "GB"),
    )):
        ax = fig.add_subplot(gs[n, j])
        ax.bar(labels, table[col] * scale, color="#4C72B0")
        if col == "peak_memory_bytes":
            ax.bar(labels, table["peak_activation_bytes"] * scale, color="#DD8452", label="activations")
            ax.legend(fontsize=7)
        ax.set_title(f"{title} ({unit})", fontsize=9)
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig
