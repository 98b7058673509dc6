"""Random small pipeline steps, each simulated with steady-state skipping and in full: every
step the certificate accepts must match its full simulation (simulator/steady.py).

    python benchmarks/steady_fuzz.py --seed 1 --steps 40

prints one line per certified step (schedule, layout, micro-batches, the two runs, the largest
difference over the summary's numbers relative to the number or the step time) and a total.
Exit status 1 if any certified step is off by more than 1e-9.
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' small models
from helpers import BALANCED_MODEL, SEARCH_MOE, TINY_MODEL, summary_numbers  # noqa: E402

from simulator import simulate  # noqa: E402

#: 8 layers, hidden 1024 (small), 8 layers, hidden 4096 (milliseconds a layer), and a small MoE
#: of 8 layers (8 experts, top 2) run with expert parallelism where the layout allows it.
MODELS = {
    "tiny8": {**TINY_MODEL, "name": "tiny8", "layers": 8},
    "balanced": BALANCED_MODEL,
    "tmoe8": {**SEARCH_MOE, "name": "tmoe8", "layers": 8},
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    certified = bad = 0
    for _ in range(args.steps):
        sched = rng.choice(["1f1b", "zb-h1", "dualpipe", "interleaved-1f1b"])
        par = {"tp": rng.choice([1, 2]), "pp": rng.choice([2, 4]), "dp": rng.choice([1, 2, 4])}
        par["zero"] = rng.choice([0, 1, 3])
        m = rng.choice([64, 80, 96, 120])
        if sched == "interleaved-1f1b":
            par["vpp"] = 2
            m = m // par["pp"] * par["pp"]
        overlap = rng.choice([True, False])
        model = copy.deepcopy(MODELS[rng.choice(sorted(MODELS))])
        if "moe" in model:  # expert parallelism over the data-parallel ranks (and TP, as Megatron-Core folds it)
            par["ep"] = rng.choice([e for e in (1, 2, 4, 8) if (par["dp"] * par["tp"]) % e == 0])
        sc = {
            "name": "fuzz",
            "model": model,
            "cluster": {"preset": "dgx-h100", "devices": par["tp"] * par["pp"] * par["dp"]},
            "parallel": par,
            "schedule": sched,
            "training": {
                "seq_len": 1024,
                "micro_batch_size": 1,
                "global_batch_size": m * par["dp"],
                "overlap_grad_reduce": overlap,
            },
        }
        ext = simulate(sc, steady_state=True).summary
        if ext["steady_state"] is None:
            continue
        certified += 1
        full = simulate(sc).summary
        a, b = summary_numbers(full), summary_numbers(ext)
        step = full["step_time_s"]
        worst, key = max((abs(a[k] - b[k]) / max(abs(a[k]), step), k) for k in a)
        bad += worst > 1e-9
        print(
            f"{'BAD' if worst > 1e-9 else 'ok '} {sched} {par} m={m} overlap={overlap} {model['name']} "
            f"runs={ext['steady_state']['micro_batches_simulated']} period={ext['steady_state']['period_micro_batches']} "
            f"worst={worst:.1e} ({key})"
        )
    print(f"{certified} of {args.steps} steps certified, {bad} off by more than 1e-9")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
