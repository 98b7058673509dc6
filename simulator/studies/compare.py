"""Run one scenario under several pipeline schedules and compare them side by side.

``stepsim compare SCENARIO --schedules gpipe,1f1b,interleaved-1f1b,zb-h1,dualpipe``
simulates the scenario once per schedule (``interleaved-1f1b`` with
``--vpp`` virtual stages, default 2; the others with vpp 1), prints a table of
step time, MFU, bubble fraction and peak memory, and draws one figure: a
compute timeline per schedule (bubbles hatched) and bars of the three figures.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import pandas as pd

from simulator.results.explain import explain_pairs
from simulator.results.plots import (
    IDLE_COLOURS,
    PHASE_COLOURS,
    SlideFigure,
    axes_pixels,
    colour_for,
    draw_bars_by_share,
    finish,
    legend_handles,
)
from simulator.scenario.loading import builtin_scenarios, read_mapping
from simulator.scenario.schema import ScenarioError
from simulator.simulate import simulate
from workloads.pipeline import get_schedule
from workloads.schedules import SCHEDULES


def compare_schedules(scenario, schedules: Sequence[str] = SCHEDULES, vpp: int = 2):
    """Simulate ``scenario`` (a path or mapping) under each schedule.

    Returns ``(table, results)``: a DataFrame with one row per schedule and the
    :class:`~simulator.results.result.Result` of each."""
    if isinstance(scenario, str) and scenario in builtin_scenarios():
        scenario = builtin_scenarios()[scenario]
    base = read_mapping(scenario) if not isinstance(scenario, Mapping) else copy.deepcopy(dict(scenario))
    rows, results = [], {}
    for name in schedules:
        if name not in SCHEDULES:
            raise ScenarioError(f"unknown schedule {name!r}; allowed: {', '.join(SCHEDULES)}", field="schedules")
        sc = copy.deepcopy(base)
        sc["schedule"] = name
        par = dict(sc.get("parallel") or {})
        par["vpp"] = vpp if get_schedule(name).virtual_stages else 1
        sc["parallel"] = par
        res = simulate(sc)
        results[name] = res
        s = res.summary
        rows.append(
            {
                "schedule": name,
                "vpp": par["vpp"],
                "step_time_s": s["step_time_s"],
                "mfu": s["mfu"],
                "bubble_fraction": s["bubble_fraction"],
                "exposed_comm_fraction": s["exposed_comm_fraction"],
                "peak_memory_bytes": s["peak_memory_bytes"],
                "peak_activation_bytes": float(res.memory["activations"].max()),
                "oom": s["oom"],
            }
        )
    return pd.DataFrame(rows), results


def write_tables(table: pd.DataFrame, results: Mapping, out) -> None:
    """``compare.csv`` (one row per schedule) and ``compare_explain.csv`` (:func:`explain_pairs`)."""
    table.to_csv(out / "compare.csv", index=False)
    explain_pairs(results).to_csv(out / "compare_explain.csv", index=False)


def format_table(table: pd.DataFrame) -> str:
    lines = [f"{'schedule':<18}{'step (s)':>10}{'MFU':>8}{'bubble':>9}{'exp.comm':>10}{'peak mem':>11}{'peak act':>11}"]
    for r in table.itertuples(index=False):
        lines.append(
            f"{r.schedule:<18}{r.step_time_s:>10.4f}{100 * r.mfu:>7.1f}%{100 * r.bubble_fraction:>8.1f}%"
            f"{100 * r.exposed_comm_fraction:>9.1f}%{r.peak_memory_bytes / 1e9:>9.1f}GB"
            f"{r.peak_activation_bytes / 1e9:>9.1f}GB"
        )
    return "\n".join(lines)


#: Resolution of the comparison figure (``stepsim compare --out``).
COMPARE_DPI = 120


def plot_comparison(table: pd.DataFrame, results: dict, path: str | None = None):
    """Left: one compute timeline per schedule (pipeline stages as rows; bubbles hatched,
    other idle time in its cause's colour) on a shared time axis. Right: step time,
    bubble and peak memory per schedule. A legend of everything drawn. Sized for a 16:9
    slide up to five schedules. Returns the figure (saved to ``path`` if given)."""
    import matplotlib.pyplot as plt

    n = len(results)
    fig = plt.figure(figsize=(12, max(5.0, 1.25 * n + 1.0)), FigureClass=SlideFigure, layout="constrained")
    outer = fig.add_gridspec(1, 2, width_ratios=[2.6, 1])
    left = outer[0].subgridspec(n, 1)
    right = outer[1].subgridspec(3, 1)
    t_max = max(r.summary["step_time_s"] for r in results.values())
    spare: dict = {}
    phases: dict[str, str] = {}
    causes: dict[str, str | None] = {}
    first = None
    timelines: list = []  # (axes, bars by (stage, colour, kind)), drawn once the figure is laid out
    for i, (name, res) in enumerate(results.items()):
        ax = fig.add_subplot(left[i], sharex=first)
        first = first or ax
        stages = sorted(set(res.events["stage"][res.events["stream"] == "compute"]))
        timelines.append((ax, _schedule_bars(res, spare, phases, causes)))
        ax.set_xlim(0, t_max * 1e3 * 1.01)
        ax.set_ylim(max(stages) + 0.6, min(stages) - 0.6)
        ax.set_yticks(stages, [str(s) for s in stages])
        ax.set_ylabel("stage")
        s = res.summary
        ax.set_title(
            f"{name}: step {s['step_time_s'] * 1e3:.0f} ms, bubble {100 * s['bubble_fraction']:.1f}%",
            fontsize=10,
            loc="left",
            pad=2,
        )
        if i < n - 1:
            ax.tick_params(labelbottom=False)
        else:
            ax.set_xlabel("time (ms)")
    handles = legend_handles(phases, causes)
    fig.legend(handles=handles, loc="outside upper center", ncol=len(handles), frameon=False)
    _figure_panels(fig, right, table)
    for ax, bars in timelines:  # each row's pixels by share, once the figure is laid out
        draw_bars_by_share(ax, *bars, x_max=t_max * 1e3 * 1.01, n_px=axes_pixels(fig, ax, COMPARE_DPI))
    return finish(fig, path, dpi=COMPARE_DPI)


def _schedule_bars(res, spare: dict, phases: dict, causes: dict) -> tuple[list, list, list, list]:
    """One schedule's compute timeline as :func:`~simulator.results.plots.draw_bars_by_share`
    takes it (row = stage, start and width in ms, style): its compute ops by phase and its idle
    spans by cause (bubbles hatched); ``phases`` and ``causes`` get the colours used."""
    rows, x0, w, style = [], [], [], []
    ev = res.events[res.events["stream"] == "compute"]
    for stage, phase, start, dur in zip(*(ev[c].tolist() for c in ("stage", "phase", "start_s", "duration_s"))):
        if dur > 0:
            colour = phases.setdefault(phase, colour_for(phase, PHASE_COLOURS, spare))
            rows.append(stage)
            x0.append(start * 1e3)
            w.append(dur * 1e3)
            style.append((colour, "solid"))
    raw = getattr(res, "raw", None)
    if raw is not None and res.scenario is not None:
        for r, t0, t1, cause, _ in raw.idle_spans:
            colour = None if cause == "bubble" else colour_for(cause, IDLE_COLOURS, spare)
            causes.setdefault(cause, colour)
            rows.append(res.scenario.layout.stage_of(r))
            x0.append(t0 * 1e3)
            w.append((t1 - t0) * 1e3)
            style.append((colour, "bubble" if colour is None else "idle"))
    return rows, x0, w, style


def _figure_panels(fig, right, table: pd.DataFrame) -> None:
    """The right-hand panels: step time, bubble and peak memory (with activations) per schedule."""
    labels = list(table["schedule"])[::-1]
    for j, (col, title, scale) in enumerate(
        (
            ("step_time_s", "step time (ms)", 1e3),
            ("bubble_fraction", "bubble (% of step)", 100),
            ("peak_memory_bytes", "peak memory (GB)", 1e-9),
        )
    ):
        ax = fig.add_subplot(right[j])
        ax.barh(labels, table[col][::-1] * scale, color="#4E79A7", label="total")
        if col == "peak_memory_bytes":
            ax.barh(labels, table["peak_activation_bytes"][::-1] * scale, color="#F28E2B", label="activations")
            ax.legend(
                loc="upper center",
                bbox_to_anchor=(0.5, -0.18),
                ncol=2,
                frameon=False,
                columnspacing=1.0,
                handlelength=1.5,
            )
        ax.set_title(title, fontsize=10, pad=2)
