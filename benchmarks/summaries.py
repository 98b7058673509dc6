"""Snapshot and compare the summaries of every built-in scenario and validation case.

A refactor or a speed-up must not change results. This script records each
``summary.json`` figure (less the ones that describe the run rather than the step:
wall time, version, event counts) and compares two snapshots to a relative tolerance::

    python benchmarks/summaries.py snapshot /tmp/before.json            # built-in scenarios
    python benchmarks/summaries.py snapshot /tmp/before.json --validation  # ... and the suite
    python benchmarks/summaries.py compare /tmp/before.json /tmp/after.json --rtol 1e-9

To snapshot an older checkout, put it first on the path:
``PYTHONPATH=/path/to/old python benchmarks/summaries.py snapshot old.json``.
``compare`` exits 1 and lists every figure that moved when two snapshots differ.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

#: Keys that describe the simulation run, not the simulated step.
RUN_KEYS = frozenset(
    {"sim_wall_s", "stepsim_version", "events_processed", "simulated_ranks", "exact", "steady_state_try"}
)


def _scenarios() -> list[tuple[str, object]]:
    import simulator

    root = Path(simulator.__file__).parent / "scenarios"
    return [(f"scenario:{p.stem}", p) for p in sorted(root.glob("*.yaml"))]


def _cases() -> list[tuple[str, object]]:
    from simulator.studies.validate import discover

    return [(f"case:{c.name}", c) for c in discover()]


def _summary(item) -> dict:
    from simulator import simulate
    from simulator.scenario.loading import load_scenario

    if isinstance(item, Path):
        sc = load_scenario(item)
    else:
        sc = load_scenario(item.scenario_with())
    return {k: v for k, v in simulate(sc).summary.items() if k not in RUN_KEYS}


def snapshot(out: Path, validation: bool, only: list[str]) -> None:
    items = _scenarios() + (_cases() if validation else [])
    if only:
        items = [(n, i) for n, i in items if any(s in n for s in only)]
    data = {}
    for name, item in items:
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            data[name] = _summary(item)
        except Exception as err:  # noqa: BLE001 - an error is a result to compare too
            data[name] = {"error": f"{type(err).__name__}: {err}"}
        print(
            f"{name:60s} {time.perf_counter() - t0:7.2f} s wall {time.process_time() - c0:7.2f} s cpu",
            file=sys.stderr,
            flush=True,
        )
    out.write_text(json.dumps(data, indent=1, sort_keys=True))


def _diff(a, b, rtol: float, path: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'before' if k in a else 'after'}")
            else:
                _diff(a[k], b[k], rtol, f"{path}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: length {len(a)} -> {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, rtol, f"{path}[{i}]", out)
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if not (math.isclose(a, b, rel_tol=rtol, abs_tol=1e-12) or (a != a and b != b)):
            out.append(f"{path}: {a!r} -> {b!r} ({(b - a) / a if a else float('inf'):+.3e})")
    elif a != b:
        out.append(f"{path}: {a!r} -> {b!r}")


def compare(before: Path, after: Path, rtol: float) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    diffs: list[str] = []
    for name in sorted(set(a) & set(b)):
        _diff(a[name], b[name], rtol, name, diffs)
    missing = sorted(set(a) ^ set(b))
    for line in diffs:
        print(line)
    if missing:
        print("not in both:", ", ".join(missing))
    print(f"{len(set(a) & set(b))} compared, {len(diffs)} differences (rtol {rtol:g})")
    return 1 if diffs else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("snapshot")
    s.add_argument("out", type=Path)
    s.add_argument("--validation", action="store_true", help="also every validation case")
    s.add_argument("--only", nargs="*", default=[], help="names containing any of these strings")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--rtol", type=float, default=1e-9)
    args = ap.parse_args(argv)
    if args.cmd == "snapshot":
        snapshot(args.out, args.validation, args.only)
        return 0
    return compare(args.before, args.after, args.rtol)


if __name__ == "__main__":
    sys.exit(main())
