"""A one-screen human summary of a result, for the terminal."""

from __future__ import annotations


def _b(x: float) -> str:
    return f"{x / 1e9:,.1f} GB"


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
        f"  pipeline bubble    {100 * s['bubble_fraction']:.1f} % of the step",
        f"  exposed comm       {100 * s['exposed_comm_fraction']:.1f} % of the step",
        f"  peak memory        {_b(s['peak_memory_bytes'])} of {_b(s['hbm_bytes'])}"
        f"  (stage {s.get('peak_memory_stage')})" + ("   ** OUT OF MEMORY **" if s["oom"] else ""),
        "    " + "  ".join(f"{k} {_b(v)}" for k, v in s["memory_breakdown_bytes"].items()),
    ]
    for n in s.get("notes", []):
        lines.append(f"  note: {n}")
    wall = f"{s['sim_wall_s']:.2f} s" if s.get("sim_wall_s") is not None else "(wall time not recorded)"
    lines.append(f"  simulated in {wall} ({s['simulated_ranks']} ranks, {s['events_processed']:,} ops)")
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
    """What simulated rank ``rank`` stands for, in words: ``"stage 3: device 384, standing
    for 128 devices (ranks 384–511)"`` in the representative mode (``weight`` devices,
    those of its pipeline stage), ``"stage 0: device 5"`` when every device is simulated.
    ``layout`` may be None (then only the rank is known)."""
    if layout is None:
        return f"device {rank}" + (f", standing for {weight} devices" if weight > 1 else "")
    stage = layout.stage_of(int(rank))
    head = f"stage {stage}: device {rank}"
    if weight <= 1:
        return head
    members = layout.stage_ranks(stage)
    if len(members) == weight:
        return f"{head}, standing for {weight} devices (ranks {compact_ranks(members)})"
    return f"{head}, standing for {weight} devices"
