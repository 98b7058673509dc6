"""A one-screen human summary of a result, for the terminal."""

from __future__ import annotations


def _b(x: float) -> str:
    return f"{x / 1e9:,.1f} GB"


def idle_label(summary: dict) -> str:
    """What the summary's bubble is: a pipeline bubble with pp > 1; with pp = 1 no stage waits on
    another, and the same idle (nothing of the rank's own in flight, docs/design.md) is a device
    waiting for peers that reach a collective later (groups split unlike one another)."""
    return "pipeline bubble" if (summary.get("layout") or {}).get("pp", 1) > 1 else "waiting on peers"


def format_summary(result) -> str:
    s = result.summary
    lay = s.get("layout", {})
    lines = [
        f"stepsim  {s['name']}",
        f"  devices {s['devices']:,}   layout tp{lay.get('tp')} cp{lay.get('cp')} pp{lay.get('pp')} dp{lay.get('dp')}"
        f" ep{lay.get('ep')} vpp{lay.get('vpp')} zero{lay.get('zero')}   schedule {s.get('schedule')}"
        f"   micro-batches {s.get('micro_batches')}",
        f"  parameters {s['parameters'] / 1e9:,.2f} B (active {s['active_parameters'] / 1e9:,.2f} B)",
        "",
        f"  step time          {s['step_time_s']:.4f} s      tokens/s {s['tokens_per_s']:,.0f}",
        f"  MFU                {100 * s['mfu']:.1f} %        HFU {100 * s['hfu']:.1f} %"
        f"     {s['model_tflops_per_device']:.0f} model TFLOP/s per device",
        f"  {idle_label(s):18s} {100 * s['bubble_fraction']:.1f} % of the step",
        f"  exposed comm       {100 * s['exposed_comm_fraction']:.1f} % of the step",
        f"  peak memory        {_b(s['peak_memory_bytes'])} of {_b(s['hbm_bytes'])}"
        f"  (stage {s.get('peak_memory_stage')})"
        + (f", {_b(s['reserved_memory_bytes'])} reserved" if s.get("reserved_memory_bytes") is not None else "")
        + ("   ** OUT OF MEMORY **" if s["oom"] else ""),
        "    " + "  ".join(f"{k} {_b(v)}" for k, v in s["memory_breakdown_bytes"].items()),
    ]
    terms = s.get("moe_terms_s")
    if terms:  # per MoE layer and micro-batch (simulator.results.moe_terms)
        parts = [f"{k.replace('_', ' ')} {1e3 * v:.3f} ms" for k, v in terms.items()]
        lines.append("  MoE layer, per micro-batch")
        lines += ["    " + "  ".join(parts[i : i + 4]) for i in range(0, len(parts), 4)]
    for n in s.get("notes", []):
        lines.append(f"  note: {n}")
    wall = f"{s['sim_wall_s']:.2f} s" if s.get("sim_wall_s") is not None else "(wall time not recorded)"
    lines.append(f"  simulated in {wall} ({s['simulated_ranks']} ranks, {s['events_processed']:,} ops)")
    steady = s.get("steady_state")
    if steady:  # simulator.steady
        lines.append(
            f"  steady state: {steady['micro_batches_simulated'][-1]} of {s.get('micro_batches')} micro-batches "
            f"simulated, the rest repeat a period of {steady['period_micro_batches']} exactly "
            "(run --full: every one)"
        )
    return "\n".join(lines)


# ---- which devices a simulated rank stands for ------------------------------------------


def compact_ranks(ranks) -> str:
    """A set of device ranks in few words: ``"384–511"``, ``"3, 11, …, 251 (every 8th)"``,
    ``"0–3, 16–19, …, 112–115 (8 blocks of 4, every 16)"``, or the first few and a count."""
    rs = sorted(set(int(r) for r in ranks))
    if not rs:
        return "none"
    runs: list[list[int]] = [[rs[0], rs[0]]]
    for r in rs[1:]:
        if r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])

    def run(a, b):
        return f"{a}" if a == b else f"{a}–{b}"

    if len(runs) == 1:
        return run(*runs[0])
    if len(runs) <= 3:
        return ", ".join(run(*x) for x in runs)
    length = {b - a for a, b in runs}
    gaps = {runs[i + 1][0] - runs[i][0] for i in range(len(runs) - 1)}
    if len(length) == 1 and len(gaps) == 1:
        n, gap = runs[0][1] - runs[0][0] + 1, gaps.pop()
        first, last = run(*runs[0]), run(*runs[-1])
        second = run(*runs[1])
        if n == 1:
            return f"{first}, {second}, …, {last} (every {gap}{_ordinal_suffix(gap)})"
        return f"{first}, {second}, …, {last} ({len(runs)} blocks of {n}, every {gap})"
    return ", ".join(run(*x) for x in runs[:3]) + f", … ({len(rs)} devices)"


def _ordinal_suffix(n: int) -> str:
    if 10 <= n % 100 <= 20:
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


def stands_for(layout, rank: int, weight: int = 1) -> str:
    """Which devices simulated rank ``rank`` stands for, in words, beside its
    :func:`stage_label`: ``"standing for 128 devices: ranks 384–511"`` in the representative
    mode (``weight`` devices, those of its pipeline stage), ``""`` when it stands for itself
    alone. ``layout`` may be None (then only the count is known)."""
    if weight <= 1:
        return ""
    text = f"standing for {weight} devices"
    if layout is None:
        return text
    members = layout.stage_ranks(layout.stage_of(int(rank)))
    return f"{text}: ranks {compact_ranks(members)}" if len(members) == weight else text


def stage_label(layout, rank: int, weight: int = 1) -> str:
    """The one name of simulated rank ``rank`` in every output: its rows of the PNG and HTML
    timelines, its curve of the memory figures and its process in the Perfetto trace.
    ``"stage 3 (device 384, ×128)"``: the pipeline stage, the device simulated and, in the
    representative mode, how many devices it stands for (those of its stage; the trace's
    process labels list them, :func:`stands_for`); ``"stage 1 (device 13)"`` when every
    device is simulated; ``"device 13"`` without a layout."""
    head = f"device {int(rank)}" + (f", ×{int(weight)}" if weight > 1 else "")
    if layout is None:
        return head if weight <= 1 else f"device {int(rank)} (×{int(weight)})"
    return f"stage {layout.stage_of(int(rank))} ({head})"


def rank_weight(layout, rank: int, weights: dict, exact: bool) -> int:
    """How many devices simulated rank ``rank`` stands for: the trace's ``weights`` when
    recorded, else (representative mode) the devices of its stage, else 1."""
    if rank in weights:
        return int(weights[rank])
    if layout is None or exact:
        return 1
    return len(layout.stage_ranks(layout.stage_of(int(rank))))


def stage_labels(result, ranks=None) -> dict:
    """rank -> :func:`stage_label` of each simulated rank of ``result`` (or of ``ranks``)."""
    layout = result.scenario.layout if result.scenario is not None else None
    weights = (result.trace.weight if result.trace is not None else None) or {}
    exact = bool(result.summary.get("exact", False))
    if ranks is None:
        import numpy as np

        # the tables' columns, not their DataFrames: no pandas for the figures of a run
        found = (np.unique(result.table(t)["rank"]).tolist() for t in ("events", "memory"))
        ranks = sorted(set().union(*found))
    return {int(r): stage_label(layout, int(r), rank_weight(layout, int(r), weights, exact)) for r in ranks}
