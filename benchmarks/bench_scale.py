"""How the simulator's cost grows with devices, micro-batches and layers.

Runs whole-step simulations (``simulate()``) and reports, per case: simulation wall
time, ops processed, network flows started, rate recomputations, and the
simulator's own peak memory (the process's peak resident set size, which only
grows: run cases in increasing size, or one per process for exact figures;
tracemalloc is not used because it slows Python several-fold). Then fits growth exponents ``t ~ x^k`` by least squares on
log-log axes: against devices (dense and MoE), micro-batches and layers.

    python benchmarks/bench_scale.py                 # the full table (a few minutes)
    python benchmarks/bench_scale.py --quick         # smaller sizes, same shape
    python benchmarks/bench_scale.py --json out.json

Every case is a built-in scenario name or an ordinary scenario mapping printed with
``--show``, so any row can be reproduced with ``stepsim run``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import resource
import sys
import time

import numpy as np

from simulator import simulate


def dense(devices: int, pp: int = 4, gbs_per_dp: int = 8, layers: int = 32) -> dict:
    """Llama-3-8B-shaped model (layer count adjustable), TP8 inside a DGX node."""
    tp = 8
    dp = devices // (tp * pp)
    return {
        "name": f"dense-{devices}",
        "model": {"preset": "llama3-8b", "layers": layers},
        "cluster": {"preset": "dgx-h100", "devices": devices},
        "parallel": {"tp": tp, "pp": pp, "dp": dp, "zero": 1},
        "schedule": "1f1b",
        "training": {"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": gbs_per_dp * dp},
    }


def moe(devices: int, pp: int = 4, gbs_per_dp: int = 8) -> dict:
    """Mixtral-8x7B-shaped MoE with EP8 inside the data-parallel ranks, TP2."""
    tp = 2
    dp = devices // (tp * pp)
    return {
        "name": f"moe-{devices}",
        "model": "mixtral-8x7b",
        "cluster": {"preset": "dgx-h100", "devices": devices},
        "parallel": {"tp": tp, "pp": pp, "dp": dp, "ep": 8, "zero": 1},
        "schedule": "1f1b",
        "training": {"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": gbs_per_dp * dp},
    }


def run_case(label: str, sc: dict) -> dict:
    c0 = time.process_time()
    t0 = time.perf_counter()
    res = simulate(copy.deepcopy(sc) if isinstance(sc, dict) else sc)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    s = res.summary
    net = res.raw.network_stats
    return {
        "case": label,
        "devices": s["devices"],
        "micro_batches": s["micro_batches"],
        "wall_s": wall,
        "cpu_s": cpu,
        "sim_wall_s": s["sim_wall_s"],
        "ops": s["events_processed"],
        "flows": net.get("flows_started", 0),
        "recomputations": net.get("rate_recomputations", 0),
        "rss_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "step_time_s": s["step_time_s"],
        "mfu": s["mfu"],
    }


def exponent(xs, ys) -> float:
    if len(xs) < 2:
        return float("nan")
    x, y = np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float))
    return float(np.polyfit(x, y, 1)[0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (about a minute)")
    ap.add_argument("--json", help="write the rows and exponents to this file")
    ap.add_argument("--show", action="store_true", help="print each case's scenario mapping")
    ap.add_argument("--only", nargs="*", default=[], help="only the cases whose label contains one of these")
    args = ap.parse_args(argv)

    device_sizes = [64, 256, 1024] if args.quick else [64, 1024, 16384, 100000]
    # MoE: EP8 must divide dp = devices / 8, so the largest case is 98,304 (= 3 * 2**15)
    moe_sizes = [64, 256, 1024] if args.quick else [64, 1024, 16384, 98304]
    mb_sizes = [4, 8, 16] if args.quick else [8, 16, 32, 64]
    layer_sizes = [8, 16, 32] if args.quick else [16, 32, 64]
    cases = []
    if not args.quick:
        # the built-in scenarios named by issue 6's targets (under 10 s each)
        cases += [
            ("target llama3-405b 16k", "llama3-405b-16384xh100"),
            ("target deepseek-v3 2k", "deepseek-v3-2048xh800"),
            ("target kimi-k2 4k", "kimi-k2-4096xh800"),
        ]
    cases += [(f"dense devices={n}", dense(n)) for n in device_sizes]
    cases += [(f"moe devices={n}", moe(n)) for n in moe_sizes]
    cases += [(f"dense micro-batches={m}", dense(256, gbs_per_dp=m)) for m in mb_sizes]
    cases += [(f"dense layers={l}", dense(256, layers=l)) for l in layer_sizes]

    if args.only:
        cases = [(label, sc) for label, sc in cases if any(o in label for o in args.only)]
    rows = []
    print(
        f"{'case':<28}{'devices':>9}{'mb':>5}{'wall s':>9}{'cpu s':>8}{'ops':>9}{'flows':>11}{'recomp':>8}{'rss MB':>8}"
    )
    for label, sc in cases:
        if args.show:
            print(json.dumps(sc) if isinstance(sc, dict) else sc)
        r = run_case(label, sc)
        rows.append(r)
        print(
            f"{label:<28}{r['devices']:>9,}{r['micro_batches']:>5}{r['wall_s']:>9.2f}{r['cpu_s']:>8.2f}{r['ops']:>9,}{r['flows']:>11,}"
            f"{r['recomputations']:>8,}{r['rss_peak_mb']:>8.0f}"
        )
        sys.stdout.flush()

    def pick(prefix):
        return [r for r in rows if r["case"].startswith(prefix)]

    exps = {
        "wall_vs_devices_dense": exponent(
            [r["devices"] for r in pick("dense devices")], [r["wall_s"] for r in pick("dense devices")]
        ),
        "wall_vs_devices_moe": exponent(
            [r["devices"] for r in pick("moe devices")], [r["wall_s"] for r in pick("moe devices")]
        ),
        "wall_vs_micro_batches": exponent(
            [r["micro_batches"] for r in pick("dense micro")], [r["wall_s"] for r in pick("dense micro")]
        ),
        "wall_vs_layers": exponent(
            [int(r["case"].split("=")[1]) for r in pick("dense layers")], [r["wall_s"] for r in pick("dense layers")]
        ),
    }
    print()
    for k, v in exps.items():
        print(f"growth exponent {k:<26} {v:6.2f}" if math.isfinite(v) else f"{k}: n/a")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "exponents": exps}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
