"""A sweep's outputs: the append-only row store ``rows.jsonl`` (:class:`RowStore`, the source of
truth that makes a sweep resumable), the table built from its rows (:func:`rows_frame`) and the
Parquet / CSV tables rewritten from it atomically (:func:`write_tables`).
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from simulator.results.parquet import write_parquet
from simulator.studies.sweep.cases import canonical_json, plain_json
from simulator.studies.sweep.spec import Case

ROWS_FILE, PARQUET_FILE, CSV_FILE, META_FILE = "rows.jsonl", "results.parquet", "results.csv", "sweep.json"


# ---- the row store ---------------------------------------------------------------------------


#: Serialises the row files' reads and appends within a process: a map runs several points'
#: rounds at once in threads, and a read that met another thread's half-written line would
#: cut it off as torn.
_ROWS_LOCK = threading.Lock()


class RowStore:
    """``DIR/rows.jsonl``: one finished case a line, appended, flushed and fsynced."""

    def __init__(self, out: str | Path):
        self.dir = Path(out)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / ROWS_FILE

    def load(self) -> dict[str, dict]:
        """Rows by key (the last line of a key wins). A torn last line is cut off the file."""
        with _ROWS_LOCK:
            return self._load()

    def _load(self) -> dict[str, dict]:
        rows: dict[str, dict] = {}
        if not self.path.exists():
            return rows
        data = self.path.read_bytes()
        good_end = 0
        pos = 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            if nl < 0:
                break  # no newline: a torn write
            line = data[pos:nl]
            pos = nl + 1
            if not line.strip():
                good_end = pos
                continue
            try:
                row = json.loads(line)
            except ValueError:
                break  # a torn write followed by nothing we can trust
            if isinstance(row, dict) and "key" in row:
                rows[row["key"]] = row
            good_end = pos
        if good_end < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(good_end)
                f.flush()
                os.fsync(f.fileno())
        return rows

    def append(self, row: dict) -> None:
        line = plain_json(row) + "\n"
        with _ROWS_LOCK, open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{threading.get_ident()}")
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_tables(frame: pd.DataFrame, out: str | Path) -> dict[str, Path]:
    """Write ``results.parquet`` (with the key-value metadata ``stepsim_version``) and
    ``results.csv`` atomically."""
    out = Path(out)
    paths = {"parquet": out / PARQUET_FILE, "csv": out / CSV_FILE}
    atomic_write(paths["parquet"], lambda p: write_parquet(_parquet_safe(frame), p))
    atomic_write(paths["csv"], lambda p: frame.to_csv(p, index=False))
    return paths


def _parquet_safe(frame: pd.DataFrame) -> pd.DataFrame:
    """Object columns mixing types (e.g. a str axis beside numbers) become JSON strings."""
    out = frame.copy()
    for c in out.columns:
        if out[c].dtype != object:
            continue
        kinds = {type(v) for v in out[c] if v is not None and not (isinstance(v, float) and math.isnan(v))}
        mixed = len(kinds) > 1 and bool(kinds - {int, float})
        if mixed or kinds & {dict, list}:
            out[c] = [None if v is None else (v if isinstance(v, str) else canonical_json(v)) for v in out[c]]
    return out


# ---- the table -------------------------------------------------------------------------------


def flatten(summary: Mapping | None, prefix: str = "") -> dict:
    """A summary record as flat columns: nested mappings dotted, lists JSON-encoded."""
    out: dict = {}
    for k, v in (summary or {}).items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, name + "."))
        elif isinstance(v, (list, tuple)):
            out[name] = canonical_json(list(v))
        else:
            out[name] = v
    return out


def _axis_value(v):
    return v if v is None or isinstance(v, (bool, int, float, str)) else canonical_json(v)


def rows_frame(cases: Sequence[Case], rows: Mapping[str, dict], axes: Sequence[str]) -> pd.DataFrame:
    """The result table: one row per case with a finished row, sorted by case index."""
    records = []
    for c in cases:
        row = rows.get(c.key)
        if row is None:
            continue
        rec = {"case": c.index}
        for a in axes:
            rec[a] = _axis_value(c.axes.get(a))
        rec["status"] = row["status"]
        rec["error"] = row.get("error")
        # The version that ran the case (a resumed sweep may mix versions); None for rows
        # written before stepsim recorded it.
        rec["stepsim_version"] = row.get("stepsim_version", (row.get("summary") or {}).get("stepsim_version"))
        for k, v in flatten(row.get("summary")).items():
            rec.setdefault(k, v)
        rec["key"] = c.key
        records.append(rec)
    cols: dict[str, None] = dict.fromkeys(["case", *axes, "status", "error", "stepsim_version"])
    for r in records:
        for k in r:
            cols.setdefault(k, None)
    cols.pop("key", None)
    cols["key"] = None
    frame = pd.DataFrame.from_records(records, columns=list(cols))
    return frame.sort_values("case", kind="stable").reset_index(drop=True)
