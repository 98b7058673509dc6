"""A map's answer checked against the code that reads it (``stepsim ppmap --recheck``).

A map's row store grows over many runs (it resumes where it stopped), and the simulator
changes between them; a row is never simulated again once stored. :func:`recheck`
re-simulates the two layouts each point's ratio compares -- the best with PP and the best
without -- exactly as the map ran them (the same scenario, the same
:func:`~simulator.studies.sweep.executors.run_case`), and sets their step times beside the
stored ones, so that a map assembled from rows of several versions says whether its answer
is still this version's. It writes ``OUT/recheck.csv`` and leaves the store as it was.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from simulator.studies.ppmap.run import _read_rows, assemble, cases_of, point_filter
from simulator.studies.ppmap.spec import SCREEN_FILE, MapSpec, load_map
from simulator.studies.search.layouts import label
from simulator.studies.sweep.executors import execute

RECHECK_CSV = "recheck.csv"

#: What a re-simulation may differ from its stored row by and still count as the same:
#: steady-state skipping reaches the full step's figures to ~1e-12 (simulator.steady).
SAME_REL = 1e-9

_KINDS = (("with PP", "best_pp"), ("without PP", "best_nopp"))


def recheck(
    spec_or_path, out: str | Path, client=None, jobs: int | None = None, executor=None, only=None
) -> pd.DataFrame:
    """Re-simulate every point's best layout with PP and without (the two its ratio
    compares; of the points the patterns ``only`` match, as :func:`run_map` takes them) and
    compare each with its stored row. Returns the table also written to
    ``OUT/recheck.csv``: one row a layout, ``stored_step_time_s`` and ``step_time_s``,
    ``rel_change`` (``step_time_s / stored - 1``) and ``same`` (within :data:`SAME_REL`)."""
    spec = spec_or_path if isinstance(spec_or_path, MapSpec) else load_map(spec_or_path)
    out = Path(out)
    table, _ = assemble(spec, out)
    screens = _read_rows(out / SCREEN_FILE)
    select = point_filter(spec, only)
    wanted = set(table.point[table.ratio.notna()]) if len(table) else set()
    cases = {
        (c.axes["point"], label(c.axes)): c
        for c in cases_of(spec, screens, lambda point: point in wanted and select(point))
    }
    picks = []
    for r in table.to_dict("records") if len(table) else []:
        if pd.isna(r.get("ratio")) or not select(r["point"]):
            continue
        for kind, col in _KINDS:
            c = cases.get((r["point"], r[f"{col}_label"]))
            if c is not None:
                picks.append((r["point"], kind, c, r[f"{col}_step_time_s"], r[f"{col}_peak_memory_bytes"]))
    payloads = [(i, c.key, c.scenario) for i, (_, _, c, _, _) in enumerate(picks)]
    got = {row["case"]: row for row in execute(payloads, client=client, jobs=jobs, executor=executor)}
    recs = []
    for i, (point, kind, c, stored_s, stored_peak) in enumerate(picks):
        row = got.get(i) or {}
        s = row.get("summary") or {}
        step = s.get("step_time_s")
        rel = None if step is None else step / stored_s - 1
        recs.append(
            {
                "point": point,
                "layout": kind,
                "label": label(c.axes),
                "stored_step_time_s": stored_s,
                "step_time_s": step,
                "rel_change": rel,
                "same": rel is not None and abs(rel) <= SAME_REL,
                "stored_peak_memory_bytes": stored_peak,
                "peak_memory_bytes": s.get("peak_memory_bytes"),
                "status": row.get("status", "failed"),
                "error": row.get("error"),
                "sim_wall_s": s.get("sim_wall_s"),
            }
        )
    df = pd.DataFrame(recs, columns=list(_COLUMNS))
    df.to_csv(out / RECHECK_CSV, index=False)
    return df


_COLUMNS = (
    "point",
    "layout",
    "label",
    "stored_step_time_s",
    "step_time_s",
    "rel_change",
    "same",
    "stored_peak_memory_bytes",
    "peak_memory_bytes",
    "status",
    "error",
    "sim_wall_s",
)
