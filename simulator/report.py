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
