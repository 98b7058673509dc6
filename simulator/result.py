"""Results of one simulated step: tables, the summary record, exporters.

``Result.summary`` is the flat record documented in ``shared/scenario.md``
(``schema_version`` 1); ``Result.events`` and ``Result.memory`` are pandas
DataFrames; ``Result.write(out_dir)`` writes every artefact ``stepsim run``
promises.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.engine import RawRun
from workloads.ops import MEMORY_CATEGORIES, Trace

SCHEMA_VERSION = 1

EVENT_COLUMNS = [
    "rank", "stage", "stream", "name", "kind", "phase", "mb", "chunk", "layer",
    "start_s", "end_s", "duration_s", "flops", "bytes", "size_bytes", "coll", "axis",
]


@dataclass
class Result:
    summary: dict[str, Any]
    events: pd.DataFrame
    memory: pd.DataFrame
    per_stage: pd.DataFrame
    scenario: Any = None
    notes: list[str] = field(default_factory=list)

    # ---- exporters -------------------------------------------------------------
    def summary_json(self) -> str:
        return json.dumps(_jsonable(self.summary), indent=2, sort_keys=False) + "\n"

    def write(self, out_dir, plots: bool = True) -> dict[str, Path]:
        """Write summary.json, trace.json, events.csv, events.parquet, memory.csv,
        timeline.png and memory.png into ``out_dir``; returns the paths."""
        from simulator import export, plots as plotmod
        from simulator.parquet_io import write_parquet

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {
            "summary": out / "summary.json",
            "trace": out / "trace.json",
            "events_csv": out / "events.csv",
            "events_parquet": out / "events.parquet",
            "memory_csv": out / "memory.csv",
        }
        paths["summary"].write_text(self.summary_json())
        export.write_chrome_trace(self, paths["trace"])
        self.events.to_csv(paths["events_csv"], index=False)
        write_parquet(self.events, paths["events_parquet"])  # with key-value metadata stepsim_version
        self.memory.to_csv(paths["memory_csv"], index=False)
        if plots:
            paths["timeline"] = out / "timeline.png"
            paths["memory_plot"] = out / "memory.png"
            plotmod.plot_timeline(self, paths["timeline"])
            plotmod.plot_memory(self, paths["memory_plot"])
        return paths

    def to_chrome_trace(self, path) -> None:
        from simulator import export

        export.write_chrome_trace(self, path)

    def plot_timeline(self, path=None, **kw):
        from simulator import plots as plotmod

        return plotmod.plot_timeline(self, path, **kw)

    def plot_memory(self, path=None, **kw):
        from simulator import plots as plotmod

        return plotmod.plot_memory(self, path, **kw)

    def text_summary(self) -> str:
        from simulator.report import format_summary

        return format_summary(self)


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def events_frame(raw: RawRun, layout) -> pd.DataFrame:
    rows = []
    stage: dict[int, int] = {}
    work: dict[int, tuple] = {}      # id(kernel group) -> (it, flops, bytes): groups are shared
    for rec in raw.records:
        op = rec.op
        st = stage.get(op.rank)
        if st is None:
            st = stage[op.rank] = layout.stage_of(op.rank)
        w = work.get(id(op.kernels))
        if w is None or w[0] is not op.kernels:
            w = work[id(op.kernels)] = (op.kernels, op.flops, op.bytes)
        rows.append((
            op.rank, st, op.stream, op.name, op.kind, op.phase, op.mb, op.chunk, op.layer,
            rec.start_s, rec.end_s, rec.end_s - rec.start_s, w[1], w[2], op.size_bytes, op.coll, op.axis,
        ))
    df = pd.DataFrame(rows, columns=EVENT_COLUMNS)
    return df.sort_values(["rank", "start_s", "stream", "name"], kind="stable").reset_index(drop=True)


def memory_frame(raw: RawRun, trace: Trace, layout) -> pd.DataFrame:
    """Memory in use per rank over time: one row per change, a column per category."""
    frames = []
    by_rank: dict[int, list] = {r: [] for r in trace.ranks}
    for t, r, cat, d in raw.mem_events:
        by_rank[r].append((t, cat, d))
    for r in trace.ranks:
        static = trace.static_memory[r]
        ev = sorted(by_rank[r], key=lambda e: e[0])
        times = [0.0] + [e[0] for e in ev]
        data = {c: np.zeros(len(times)) for c in MEMORY_CATEGORIES}
        for c in MEMORY_CATEGORIES:
            data[c][0] = static.get(c, 0.0)
        for i, (t, cat, d) in enumerate(ev, start=1):
            for c in MEMORY_CATEGORIES:
                data[c][i] = data[c][i - 1]
            data[cat][i] += d
        df = pd.DataFrame({"time_s": times, **data})
        # Several changes at one instant: keep the state after all of them, but keep the
        # running maximum visible by also keeping intermediate rows (peaks inside one instant
        # are real: an alloc before a free at the same time).
        df.insert(0, "rank", r)
        df.insert(1, "stage", layout.stage_of(r))
        frames.append(df)
    out = pd.concat(frames, ignore_index=True)
    out["total"] = out[list(MEMORY_CATEGORIES)].sum(axis=1)
    return out
