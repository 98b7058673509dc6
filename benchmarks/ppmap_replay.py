"""What the PP map's adaptive rounds would simulate, replayed on a map store without simulating.

    python benchmarks/ppmap_replay.py STORE [--family-share X] [--margin X] [--points PATTERN ...] [--json OUT]

Runs the map's own rounds (``simulator.studies.ppmap.run._run_adaptive``, with the store's
screens and today's rounds) and answers each layout they choose from the store's rows
(``STORE/sims/rows.jsonl``) instead of simulating it. Prints how many layouts the rounds
choose, what their stored simulations cost (``sim_wall_s``), which chosen layouts the store
lacks (they would be simulated: their cost is unknown), and each point's best layout with PP
and without with its step time, so that a change to the rounds (``--family-share``: the
first round's :data:`~simulator.studies.search.rounds.FAMILY_SAMPLE_SHARE`; ``--margin``: the
map's ``estimate_margin``) can be measured
against the rounds that filled the store: the same bests for fewer seconds of simulation.

The rounds compare traces to drop layouts that simulate identically
(``_MapDedupe``); fingerprints missing from ``STORE/sims/fingerprints.jsonl`` are computed and
appended there (a trace build each), so replay a copy of a committed store.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import Counter
from pathlib import Path

from simulator.studies.ppmap import run as map_run
from simulator.studies.ppmap.spec import SCREEN_FILE, load_map
from simulator.studies.search import rounds
from simulator.studies.search.layouts import label


def replay(store: Path, only=None, margin: float | None = None) -> dict:
    """``{"chosen": [...], "missing": [...], "cost_s": {point: s}, "best": {point|pp: (s, label)}}``
    of the map's rounds replayed on ``store``."""
    spec = load_map(store / "ppmap.yaml")
    if margin is not None:
        spec = dataclasses.replace(spec, bounds=dataclasses.replace(spec.bounds, estimate_margin=margin))
    screens = {}
    for line in (store / SCREEN_FILE).read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        screens[rec["key"]] = rec
    cases = map_run.cases_of(spec, screens, map_run.point_filter(spec, only))
    rows = map_run._read_rows(store / "sims" / "rows.jsonl")
    chosen, missing = [], []

    def answer(batch: list) -> dict:
        out = {}
        for c in batch:
            row = rows.get(c.key)
            if row is None:
                missing.append(c)
                out[c.key] = {"status": "failed", "error": "not in the store"}
            else:
                chosen.append(c)
                out[c.key] = row
        point = batch[0].axes["point"] if batch else "-"
        print(f"  {point}: {len(chosen)} chosen, {len(missing)} missing", file=sys.stderr, flush=True)
        return out

    map_run._run_adaptive(spec, screens, cases, answer, 2, None, store / "sims")
    cost: Counter = Counter()
    best: dict = {}
    for c in chosen:
        row = rows[c.key]
        s = row.get("summary") or {}
        cost[c.axes["point"]] += s.get("sim_wall_s") or 0.0
        if row.get("status") != "ok" or s.get("oom") or not s.get("step_time_s"):
            continue
        k = f"{c.axes['point']}|{'pp' if c.axes['pp'] > 1 else 'nopp'}"
        if k not in best or s["step_time_s"] < best[k][0]:
            best[k] = (s["step_time_s"], label(c.axes))
    return {
        "chosen": [label(c.axes) + " @ " + c.axes["point"] for c in chosen],
        "missing": [label(c.axes) + " @ " + c.axes["point"] for c in missing],
        "cost_s": dict(cost),
        "best": best,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store", type=Path)
    ap.add_argument("--family-share", type=float, default=None, help="FAMILY_SAMPLE_SHARE for the replay")
    ap.add_argument("--margin", type=float, default=None, help="the map's estimate_margin for the replay")
    ap.add_argument("--points", nargs="*", default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.family_share is not None:
        rounds.FAMILY_SAMPLE_SHARE = args.family_share
    t0 = time.process_time()
    out = replay(args.store, args.points, args.margin)
    margin = "the map's" if args.margin is None else args.margin
    print(
        f"family share {rounds.FAMILY_SAMPLE_SHARE}, margin {margin}: {len(out['chosen'])} layouts from the store, "
        f"{sum(out['cost_s'].values()):.0f} s of stored simulation; {len(out['missing'])} not in the store; "
        f"replayed in {time.process_time() - t0:.0f} CPU-s"
    )
    for m in out["missing"]:
        print("  not in the store:", m)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
