"""Start-up and output costs: everything of ``stepsim run SCENARIO --out DIR`` but the simulation.

    python benchmarks/bench_io.py                          # deepseek-v3-2048xh800, best of 3
    python benchmarks/bench_io.py --scenario quickstart --repeat 5 --json /tmp/io.json
    python benchmarks/bench_io.py --skip-run               # start-up and the in-process table only

Three parts, all in CPU seconds (user + system; on a shared machine the wall time
says more about the neighbours than about stepsim), best of ``--repeat``:

* start-up: ``python -c "import simulator"``, ``stepsim --help``, ``stepsim --version``
  (as ``python -m simulator.cli``: the console script without pyenv's shim), each a
  fresh process, beside ``python -c pass`` (the interpreter alone);
* ``stepsim run SCENARIO --out DIR`` end to end, a fresh process, in CPU seconds and in
  wall seconds (the figures are drawn in a forked child beside the tables: the wall time
  is less than the CPU time on two cores);
* in one process: ``simulate()`` (its ``sim_wall_s`` and CPU time), then each output
  of ``Result.write`` on its own: the events, memory and idle tables, the CSV and
  Parquet files, the Chrome trace, the two figures.

The script uses public names (and ``simulator.results.export``'s writers, which exist since
the speed-up of issue 17); run it with ``PYTHONPATH=/path/to/checkout`` to time another
checkout (the first line names the package imported).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _child_cpu(cmd: list[str]) -> float:
    """CPU seconds (user + system) of one run of ``cmd`` in a fresh process, started in an
    empty directory (``python -c`` and ``-m`` put the working directory first on the path:
    run from a checkout, they would import that checkout instead of ``PYTHONPATH``'s)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as cwd:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _best(f, repeat: int) -> float:
    return min(f() for _ in range(repeat))


def startup(repeat: int) -> dict[str, float]:
    py = sys.executable
    cases = {
        "python -c pass": [py, "-c", "pass"],
        "import simulator": [py, "-c", "import simulator"],
        "stepsim --help": [py, "-m", "simulator.cli", "--help"],
        "stepsim --version": [py, "-m", "simulator.cli", "--version"],
    }
    return {name: _best(lambda c=cmd: _child_cpu(c), repeat) for name, cmd in cases.items()}


def end_to_end(scenario: str, repeat: int) -> tuple[float, float]:
    """``stepsim run SCENARIO --out DIR`` in a fresh process: (CPU seconds, wall seconds),
    each the best of ``repeat`` (the CPU time counts the child that draws the figures
    beside the main process; the wall time is what the user waits)."""
    runs = []
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "simulator.cli", "run", scenario, "--out", str(Path(d) / "out")]
        for _ in range(repeat):
            t = time.perf_counter()
            cpu = _child_cpu(cmd)
            runs.append((cpu, time.perf_counter() - t))
    return min(c for c, _ in runs), min(w for _, w in runs)


def _timed(f) -> float:
    t = time.process_time()
    f()
    return time.process_time() - t


def in_process(scenario: str, repeat: int) -> dict[str, float]:
    from simulator import simulate

    out: dict[str, float] = {}
    t = time.process_time()
    res = simulate(scenario)
    out["simulate() cpu"] = time.process_time() - t
    out["simulate() sim_wall_s"] = res.summary["sim_wall_s"]
    from simulator.results import export

    new_api = hasattr(export, "write_csv")
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)

        # tables: built once per Result (the first use pays)
        if new_api:
            from simulator.results.result import event_columns

            out["events table"] = _best(lambda: _timed(lambda: event_columns(res.raw, res.scenario.layout)), repeat)
            events, memory, idle = res.table("events"), res.table("memory"), res.table("idle")
            out["idle table"] = _best(lambda: _timed(lambda: res.table("idle")), repeat)
            out["events.csv"] = _best(lambda: _timed(lambda: export.write_csv(events, d / "events.csv")), repeat)
            out["events.parquet"] = _best(
                lambda: _timed(lambda: export.write_events_parquet(events, d / "events.parquet")), repeat
            )
            out["memory.csv"] = _best(lambda: _timed(lambda: export.write_csv(memory, d / "memory.csv")), repeat)
            out["idle.csv"] = _best(lambda: _timed(lambda: export.write_csv(idle, d / "idle.csv")), repeat)
        else:
            from simulator.results.parquet import write_parquet
            from simulator.results.result import events_frame

            out["events table"] = _best(lambda: _timed(lambda: events_frame(res.raw, res.scenario.layout)), repeat)
            out["idle table"] = _best(lambda: _timed(lambda: res.idle), repeat)
            out["events.csv"] = _best(lambda: _timed(lambda: res.events.to_csv(d / "events.csv", index=False)), repeat)
            out["events.parquet"] = _best(
                lambda: _timed(lambda: write_parquet(res.events, d / "events.parquet")), repeat
            )
            out["memory.csv"] = _best(lambda: _timed(lambda: res.memory.to_csv(d / "memory.csv", index=False)), repeat)
            out["idle.csv"] = _best(lambda: _timed(lambda: res.idle.to_csv(d / "idle.csv", index=False)), repeat)
        from simulator.results import export as ex

        out["trace.json"] = _best(lambda: _timed(lambda: ex.write_chrome_trace(res, d / "trace.json")), repeat)
        out["trace.json.gz"] = _best(lambda: _timed(lambda: ex.write_chrome_trace(res, d / "trace.json.gz")), repeat)
        res.plot_timeline(d / "warm.png")  # fonts and caches loaded once per process
        out["timeline.png"] = _best(lambda: _timed(lambda: res.plot_timeline(d / "timeline.png")), repeat)
        out["memory.png"] = _best(lambda: _timed(lambda: res.plot_memory(d / "memory.png")), repeat)
        out["trace.json MB"] = (d / "trace.json").stat().st_size / 1e6
        out["trace.json.gz MB"] = (d / "trace.json.gz").stat().st_size / 1e6
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="deepseek-v3-2048xh800")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-run", action="store_true", help="leave out the end-to-end `stepsim run --out`")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    import simulator

    print(f"# simulator from {os.path.dirname(simulator.__file__)}; CPU seconds, best of {args.repeat}")
    figures: dict[str, float] = {}
    for name, s in startup(args.repeat).items():
        figures[name] = s
        print(f"{name:32s} {s:8.3f}")
    if not args.skip_run:
        cpu, wall = end_to_end(args.scenario, max(1, min(args.repeat, 2)))
        for what, s in (("", cpu), (" (wall)", wall)):
            figures[f"stepsim run {args.scenario} --out{what}"] = s
            print(f"{'stepsim run ' + args.scenario + ' --out' + what:32s} {s:8.3f}")
    for name, s in in_process(args.scenario, args.repeat).items():
        figures[name] = s
        print(f"{name:32s} {s:8.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
