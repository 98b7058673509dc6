"""The input fuzzer (issue 41) for as many examples as asked: random scenarios, sweeps, topology
files, trace files and raw scenario bytes (tests/fuzz_inputs.py), each of which must end in a
clean refusal naming the field or file, or an accepted input whose numbers are finite (a
simulated scenario: a summary within physical bounds).

    python benchmarks/fuzz_inputs.py --examples 100000 --simulate-every 100 --seed 1

splits the examples over the five kinds (scenarios get half), simulates one scenario with
plausible numbers (scaled by 1/1000 to 1000) per 100 examples on top, and prints per kind the examples run, refused, accepted and failed, the time, and
the first failures (the input and the assertion or exception). Exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import fuzz_inputs as fz  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

#: Share of the examples each kind gets.
SHARES = {"scenario": 0.5, "sweep": 0.125, "topology": 0.125, "trace": 0.125, "bytes": 0.125}
#: Scenarios with plausible numbers (tests/fuzz_inputs.plausible_scenarios), simulated: one per
#: ``--simulate-every`` examples, on top of the shares above.


def _run(kind: str, n: int, seed: int, folder: Path, show: int) -> tuple[Counter, list]:
    outcomes: Counter = Counter()
    failures: list = []
    topo, trace = (fz.small_topology(), None) if kind == "topology" else (None, None)
    if kind == "trace":
        trace = fz.small_trace()

    def one(x):
        try:
            if kind == "scenario":
                outcomes[fz.check_scenario(x)] += 1
            elif kind == "simulate":
                outcomes[fz.check_scenario(x, simulate_it=True)] += 1
            elif kind == "sweep":
                outcomes[fz.check_sweep(x)] += 1
            elif kind == "topology":
                outcomes[fz.check_topology(x, folder)] += 1
            elif kind == "trace":
                outcomes[fz.check_trace(x)] += 1
            else:
                outcomes[fz.check_scenario_bytes(x, folder)] += 1
        except Exception as err:  # noqa: BLE001 -- every failure is recorded, not raised
            outcomes["failed"] += 1
            if len(failures) < show:
                last = traceback.extract_tb(err.__traceback__)[-1]
                failures.append(
                    (repr(x)[:400], f"{type(err).__name__}: {str(err)[:300]} ({last.filename}:{last.lineno})")
                )

    strategy = {
        "scenario": fz.scenarios(),
        "simulate": fz.plausible_scenarios(),
        "sweep": fz.sweeps(),
        "topology": st.deferred(lambda: fz.topology_docs(topo)),
        "trace": st.deferred(lambda: fz.trace_docs(trace)),
        "bytes": st.binary(max_size=300) | st.text(max_size=100).map(lambda t: t.encode("utf-16")),
    }[kind]
    run = settings(
        max_examples=n,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        phases=["generate"],
    )(given(strategy)(one))
    from hypothesis import seed as hseed

    hseed(seed)(run)()
    return outcomes, failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=2000, help="examples in all (default 2000)")
    ap.add_argument(
        "--simulate-every", type=int, default=100, help="simulate one plausible scenario per N examples (0: none)"
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kinds", default=",".join(SHARES), help="comma-separated subset of " + ", ".join(SHARES))
    ap.add_argument("--show", type=int, default=5, help="failures printed per kind")
    args = ap.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    total = sum(SHARES.get(k, 0) for k in kinds) or 1
    if args.simulate_every and "scenario" in kinds:
        kinds.append("simulate")
    failed = 0
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            share = args.examples * SHARES.get(kind, 0) / total
            n = max(1, args.examples // args.simulate_every if kind == "simulate" else round(share))
            t0 = time.perf_counter()
            outcomes, failures = _run(kind, n, args.seed, Path(tmp), args.show)
            dt = time.perf_counter() - t0
            ran = sum(outcomes.values())
            print(
                f"{kind:9s} {ran:8,d} examples in {dt:8.1f} s: "
                + ", ".join(f"{k} {v:,}" for k, v in sorted(outcomes.items()))
            )
            for x, why in failures:
                print(f"    FAILED {why}\n      input: {x}")
            failed += outcomes["failed"]
    print(f"total: {time.perf_counter() - t_all:.1f} s, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
