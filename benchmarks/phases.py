"""CPU seconds of one ``simulate()`` call, split by phase.

    python benchmarks/phases.py deepseek-v3-2048xh800
    python benchmarks/phases.py ../shared/benchmarks/simai-moe-9216xh100.yaml
    python benchmarks/phases.py korthikanti22-1t --steady      # a validation case, skipping

The argument is a built-in scenario, a scenario file, or the name of a validation case
(``validation/**/NAME.yaml``). Each phase is the ``time.process_time`` spent inside one
function, wrapped for the call (a phase called twice, such as the trace build of a skipping
run, adds up); phases nest (the simpy loop is inside the engine's run), so they do not sum to
the total.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (module, attribute, label): the functions timed. ``simulator.engine.loop`` imports
#: ``private_ops``, ``absorb`` and ``account`` by name, so they are wrapped there.
PHASES = (
    ("workloads.trace.builder", "build_trace", "trace build"),
    ("workloads.trace.ops", "Trace.check", "trace check"),
    ("simulator.engine.loop", "private_ops", "private_ops"),
    ("simulator.engine.loop", "absorb", "absorb"),
    ("simulator.engine.loop", "Engine.run", "engine run"),
    ("simpy", "Environment.run", "simpy loop"),
    ("simulator.engine.loop", "account", "idle accounting"),
    ("simulator.steady", "_extend", "steady: extend"),
    ("simulator.steady", "certify", "steady: certify"),
)


def _wrap(times: dict, module: str, attr: str, label: str) -> None:
    owner = importlib.import_module(module)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    f = getattr(owner, name)

    @functools.wraps(f)
    def timed(*args, **kwargs):
        t = time.process_time()
        try:
            return f(*args, **kwargs)
        finally:
            times[label] = times.get(label, 0.0) + time.process_time() - t

    setattr(owner, name, timed)


def _scenario(name: str):
    if Path(name).exists():  # a scenario file (rglob takes no absolute pattern)
        return name
    cases = sorted((ROOT / "validation").rglob(f"{name}.yaml"))
    if cases:
        from simulator.studies.validate import load_case

        return load_case(cases[0]).scenario_with()
    return name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", help="built-in scenario, scenario file or validation case name")
    ap.add_argument("--steady", action="store_true", help="steady-state skipping (simulate(steady_state=True))")
    args = ap.parse_args()
    simulate_module = importlib.import_module("simulator.simulate")
    importlib.import_module("simulator.step").load_engine()  # imports outside the timed call, as sim_wall_s counts
    times: dict[str, float] = {}
    for module, attr, label in PHASES:
        _wrap(times, module, attr, label)
    sc = _scenario(args.scenario)
    t = time.process_time()
    res = simulate_module.simulate(sc, steady_state=args.steady)
    total = time.process_time() - t
    print(f"{args.scenario}: {total:.2f} CPU-s, sim_wall_s {res.summary['sim_wall_s']:.2f}")
    for _, _, label in PHASES:
        if label in times:
            print(f"  {label:<18} {times[label]:7.2f}")
    if res.summary.get("steady_state"):
        print(f"  steady_state: {res.summary['steady_state']}")


if __name__ == "__main__":
    main()
