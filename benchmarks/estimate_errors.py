"""The search's analytic estimate against the PP map's stored simulations.

    python benchmarks/estimate_errors.py [OUT.csv] [POINT-SUBSTRING]

Recomputes the step-time estimate (``simulator.studies.search.estimate``) of every layout the
committed map store (``docs/results/ppmap``) simulated without error, with today's code, and
prints ``est / simulated - 1`` by model and family (schedule, PP or not, ZeRO stage): the
adaptive rounds allow each family its largest overestimate plus ``estimate_margin``, so the
overestimates decide how many layouts a map point or ``stepsim search`` simulates. OUT.csv
(optional) gets one row per layout with the stored and today's estimate.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.scenario.loading import load_scenario
from simulator.studies.ppmap.spec import load_map, points
from simulator.studies.search.estimate import estimate_step_time
from simulator.studies.search.layouts import candidate_mapping
from simulator.studies.search.network_model import net_model_for

MAP = Path(__file__).resolve().parent.parent / "docs" / "results" / "ppmap"


def main(out: str | None = None, only: str | None = None) -> pd.DataFrame:
    pts = {p["id"]: p for p in points(load_map(MAP / "ppmap.yaml"))}
    chosen = {}
    for line in (MAP / "screen.jsonl").read_text().splitlines():
        s = json.loads(line)
        chosen[s["key"]] = {c["label"]: c for c in s["chosen"]}
    c = pd.read_csv(MAP / "candidates.csv")
    sims = c[c.step_time_s.notna() & (c.status == "ok")]
    if only:
        sims = sims[sims.point.str.contains(only, regex=False)]
    nets: dict = {}
    rows = []
    t0 = time.process_time()
    for r in sims.itertuples():
        p = chosen.get(r.point, {}).get(r.label)
        if p is None:
            continue
        sc = load_scenario(candidate_mapping(pts[r.point]["scenario"], p, r.point))
        est = estimate_step_time(sc, net_model_for(nets.setdefault(r.point, {}), sc))["step_time_s"]
        rows.append(
            {
                "point": r.point,
                "label": r.label,
                "family": f"{r.schedule}{'-nopp' if r.pp == 1 else ''}-z{r.zero}",
                "stored_est": r.est_step_time_s,
                "est": est,
                "sim": r.step_time_s,
            }
        )
    d = pd.DataFrame(rows)
    d["error"] = d.est / d.sim - 1
    d["model"] = d.point.str.split("/").str[0]
    if out:
        d.to_csv(out, index=False)
    print(f"{len(d)} layouts, {time.process_time() - t0:.0f} CPU-s")
    print(d.groupby(["model", "family"]).error.describe()[["count", "min", "50%", "max"]].round(3).to_string())
    print(f"median |error| {np.median(np.abs(d.error)):.4f}; beyond +5 %: {(d.error > 0.05).sum()}")
    return d


if __name__ == "__main__":
    main(*sys.argv[1:3])
