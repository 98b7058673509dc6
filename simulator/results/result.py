"""Results of one simulated step: tables, the summary record, exporters.

``Result.summary`` is the flat record documented in ``shared/scenario.md``
(``schema_version`` 1); ``Result.events``, ``Result.memory``, ``Result.per_stage``
and ``Result.idle`` are pandas DataFrames (``docs/formats.md``), built on first
use from the engine's records: a run that only reads the summary never imports
pandas. ``Result.write(out_dir)`` writes every artefact ``stepsim run`` promises.

The tables are held as :class:`Columns` (numpy arrays by column name); the
exporters and plots read those directly (:meth:`Result.table`).
"""

from __future__ import annotations

import gc
import json
import math
from contextlib import contextmanager
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from workloads.trace.ops import MEMORY_CATEGORIES

if TYPE_CHECKING:  # pragma: no cover - annotations only (engine and pandas are heavy imports)
    import pandas as pd

    from simulator.engine.loop import RawRun
    from simulator.scenario.resolved import Scenario
    from topologies.topology import Topology
    from workloads.trace.ops import Trace

SCHEMA_VERSION = 1

EVENT_COLUMNS = [
    "rank",
    "stage",
    "stream",
    "name",
    "kind",
    "phase",
    "mb",
    "chunk",
    "layer",
    "start_s",
    "end_s",
    "duration_s",
    "flops",
    "bytes",
    "size_bytes",
    "coll",
    "axis",
]
MEMORY_COLUMNS = ["rank", "stage", "time_s", *MEMORY_CATEGORIES, "total"]
IDLE_COLUMNS = ["rank", "stage", "start_s", "end_s", "duration_s", "cause", "waiting_for"]
PER_STAGE_COLUMNS = ["stage", "bubble_s", "exposed_comm_s", "peak_memory_bytes", "compute_s", "offload_wait_s"]

#: Every file :meth:`Result.write` may write: those it does not write in a call are removed
#: from the folder (``report.html``: ``stepsim run --html`` and ``stepsim report --html``
#: write it beside them, from the same run).
RUN_OUTPUTS = (
    "summary.json",
    "scenario.json",
    "trace.json",
    "events.csv",
    "events.parquet",
    "memory.csv",
    "idle.csv",
    "links.csv",
    "links.parquet",
    "timeline.png",
    "memory.png",
    "links.png",
    "report.html",
)

#: A table as numpy arrays by column name, in column order (int64, float64, or object
#: arrays of ``str`` for text): what the CSV writer, the Chrome trace and the plots read.
Columns = dict[str, np.ndarray]


class Result:
    """One simulated step.

    Attributes: ``summary`` (the summary record), ``scenario`` (the resolved
    :class:`~simulator.scenario.resolved.Scenario`), ``notes`` (what the trace builder
    adjusted), ``raw`` (the engine's :class:`~simulator.engine.loop.RawRun`: op records,
    idle spans, memory changes), ``trace`` (the :class:`~workloads.trace.ops.Trace` run),
    ``topology`` (the network simulated); and the tables ``events``, ``memory``,
    ``per_stage`` (built once, on first use) and ``idle`` (built on each use from
    ``raw.idle_spans``).

    Every attribute is a constructor parameter and is declared in ``__slots__``: nothing is
    attached from outside. ``raw``, ``trace`` and ``topology`` are ``None`` for a result
    rebuilt from its tables alone (``events``, ``memory``, ``per_stage`` given as frames, or
    ``columns``: table name -> :data:`Columns`); the tables, figures and exports that need
    them then show what the tables hold (no idle spans without ``raw``, one device per
    simulated rank without ``trace``).
    """

    __slots__ = ("summary", "scenario", "notes", "raw", "trace", "topology", "_columns", "_frames")

    def __init__(
        self,
        summary: dict[str, Any],
        events: pd.DataFrame | None = None,
        memory: pd.DataFrame | None = None,
        per_stage: pd.DataFrame | None = None,
        scenario: Scenario | None = None,
        notes: list[str] | None = None,
        raw: RawRun | None = None,
        trace: Trace | None = None,
        topology: Topology | None = None,
        columns: dict[str, Columns] | None = None,
    ):
        self.summary = summary
        self.scenario = scenario
        self.notes = list(notes or [])
        self.raw = raw
        self.trace = trace
        self.topology = topology
        #: table name -> its columns (built from ``raw`` on first use when absent)
        self._columns: dict[str, Columns] = dict(columns or {})
        #: table name -> its DataFrame (built from the columns on first use, or given)
        self._frames: dict[str, pd.DataFrame] = {}
        for name, frame in (("events", events), ("memory", memory), ("per_stage", per_stage)):
            if frame is not None:
                self._set_frame(name, frame)

    def __copy__(self):
        new = Result.__new__(Result)
        for k in self.__slots__:
            setattr(new, k, getattr(self, k))
        new._columns, new._frames = dict(self._columns), dict(self._frames)
        return new

    def __repr__(self) -> str:
        s = self.summary
        return (
            f"<Result {s.get('name')!r}: step {s.get('step_time_s')} s, mfu {s.get('mfu')}, "
            f"{s.get('simulated_ranks')} simulated ranks>"
        )

    # ---- tables ----------------------------------------------------------------
    def table(self, name: str) -> Columns:
        """The columns of table ``name`` (``events``, ``memory``, ``per_stage``, ``idle``)
        as numpy arrays, without pandas. Once the table has been read as a DataFrame, the
        frame is the table (edits to it reach the files :meth:`write` writes).

        A step skipped ahead through its steady state (``simulate(..., steady_state=True)``,
        ``summary["steady_state"]`` set) has the per-stage table only: the op-level tables
        raise a ``KeyError`` that says so."""
        if name in ("events", "memory", "idle") and self.summary.get("steady_state") and name not in self._frames:
            raise KeyError(
                f"{name}: this step was skipped ahead from a shorter run whose steady phase repeats "
                f"(micro-batches {self.summary['steady_state']['micro_batches_simulated']}), which "
                "gives the summary and the per-stage table; simulate it with steady_state=False "
                "for the op-level tables"
            )
        if name == "idle":
            return idle_columns(getattr(self.raw, "idle_spans", ()), self._layout())
        if name in self._frames:
            frame = self._frames[name]
            return {c: frame[c].to_numpy() for c in frame.columns}
        if name not in self._columns:
            if name == "events":
                self._columns[name] = event_columns(self.raw, self._layout())
            else:
                raise KeyError(f"{name}: no such table (not given and not derivable)")
        return self._columns[name]

    def _frame(self, name: str) -> pd.DataFrame:
        if name not in self._frames:
            import pandas as pd

            self._frames[name] = pd.DataFrame(self.table(name))
        return self._frames[name]

    def _set_frame(self, name: str, frame: pd.DataFrame) -> None:
        self._frames[name] = frame
        self._columns.pop(name, None)

    @property
    def events(self) -> pd.DataFrame:
        """One row per executed op (``docs/formats.md``, "Events table")."""
        return self._frame("events")

    @events.setter
    def events(self, frame: pd.DataFrame) -> None:
        self._set_frame("events", frame)

    @property
    def memory(self) -> pd.DataFrame:
        """Memory in use per simulated device over time (``docs/formats.md``, "Memory table")."""
        return self._frame("memory")

    @memory.setter
    def memory(self, frame: pd.DataFrame) -> None:
        self._set_frame("memory", frame)

    @property
    def per_stage(self) -> pd.DataFrame:
        """Per pipeline stage: mean bubble, exposed communication, compute and offload wait
        over its simulated devices, their peak memory, and the bubble and exposed fractions."""
        return self._frame("per_stage")

    @per_stage.setter
    def per_stage(self, frame: pd.DataFrame) -> None:
        self._set_frame("per_stage", frame)

    @property
    def idle(self) -> pd.DataFrame:
        """The idle spans of the compute streams (:func:`idle_columns`)."""
        import pandas as pd

        return pd.DataFrame(self.table("idle"))

    def _layout(self):
        return self.scenario.layout if self.scenario is not None else None

    # ---- exporters -------------------------------------------------------------
    def summary_json(self) -> str:
        return json.dumps(_jsonable(self.summary), indent=2, sort_keys=False) + "\n"

    def write(self, out_dir, plots: bool = True, parallel: bool | None = None) -> dict[str, Path]:
        """Write summary.json, scenario.json, trace.json, events.csv, events.parquet,
        memory.csv, idle.csv, links.csv, links.parquet, timeline.png, memory.png and
        links.png into ``out_dir`` (what ``stepsim report`` reads back); returns the paths.
        The links files need the run itself (:meth:`links_table`).

        ``parallel``: render the figures in a forked child while this process writes the
        rest (:mod:`simulator.results.beside`); ``None`` (the default) does so where that
        is safe and gains something (:func:`~simulator.results.beside.can_fork`), False
        never. The files are the same either way.

        The files are written into a staging folder and moved into ``out_dir`` only once all
        are written (:func:`simulator.results.outdir.staged_dir`); the files of
        :data:`RUN_OUTPUTS` already in ``out_dir`` that this call does not write (the
        figures, with ``plots=False``) are removed. A failure leaves ``out_dir`` as it was."""
        from simulator.results.outdir import staged_dir

        with staged_dir(out_dir, RUN_OUTPUTS, flag="out_dir") as tmp:
            paths = self._write_into(tmp, plots, parallel)
        return {k: Path(out_dir) / p.name for k, p in paths.items()}

    def _write_into(self, out: Path, plots: bool, parallel: bool | None) -> dict[str, Path]:
        from simulator.results import export

        paths = {
            "summary": out / "summary.json",
            "trace": out / "trace.json",
            "events_csv": out / "events.csv",
            "events_parquet": out / "events.parquet",
            "memory_csv": out / "memory.csv",
            "idle_csv": out / "idle.csv",
        }
        figures = {"timeline": out / "timeline.png", "memory_plot": out / "memory.png"} if plots else {}
        if figures and self._has_links():
            figures["links_plot"] = out / "links.png"
        # Writing allocates millions of short-lived strings and no reference cycles: the
        # cyclic collector would only walk the run's records again and again (a child
        # forked for the figures inherits the pause).
        with _gc_paused():
            # built once, before forking: the figures, the trace and the tables all read them
            # (the links table plans each collective shape once: a fraction of the figures'
            # time, which a child building its own would add to the CPU a run takes)
            events = self.table("events")
            links = self.links_table()  # None without the run itself (see links_table)
            beside = None
            if figures and parallel is not False:
                from simulator.results.beside import Beside, can_fork

                if can_fork():
                    beside = Beside(lambda: self._write_figures(figures))
            try:
                paths["summary"].write_text(self.summary_json())
                if self.scenario is not None:
                    from simulator.scenario.serialise import scenario_to_dict

                    paths["scenario"] = out / "scenario.json"
                    text = json.dumps(_jsonable(scenario_to_dict(self.scenario)), indent=2) + "\n"
                    paths["scenario"].write_text(text)
                export.write_chrome_trace(self, paths["trace"])
                export.write_csv(events, paths["events_csv"])
                export.write_events_parquet(events, paths["events_parquet"])  # key-value metadata stepsim_version
                export.write_csv(self.table("memory"), paths["memory_csv"])
                export.write_csv(self.table("idle"), paths["idle_csv"])
                if links is not None:
                    paths["links_csv"], paths["links_parquet"] = out / "links.csv", out / "links.parquet"
                    export.write_csv(links, paths["links_csv"])
                    export.write_events_parquet(links, paths["links_parquet"])  # any columns, no pandas
                if beside is not None:
                    beside.wait()
                    beside = None
                elif figures:
                    self._write_figures(figures)
            finally:
                if beside is not None:  # left early: the figures are not wanted
                    beside.stop()
        paths.update(figures)
        return paths

    def _write_figures(self, figures: dict[str, Path]) -> None:
        from simulator.results import plots as plotmod

        plotmod.plot_timeline(self, figures["timeline"])
        plotmod.plot_memory(self, figures["memory_plot"])
        if "links_plot" in figures:
            from simulator.results.links_plot import plot_links

            plot_links(self, self.links_table(), figures["links_plot"])

    def _has_links(self) -> bool:
        """Whether :meth:`links_table` has a table to build: the run itself is here."""
        if self.raw is None or self.trace is None or self.topology is None or self.scenario is None:
            return False
        return not self.summary.get("steady_state")

    def links_table(self) -> Columns | None:
        """The links table (:func:`~simulator.results.links.link_columns`, built once), or
        None for a result without the run itself (rebuilt from its tables, or skipped ahead
        through its steady state)."""
        if not self._has_links():
            return None
        if "links" not in self._columns:
            from simulator.results.links import link_columns

            self._columns["links"] = link_columns(self)
        return self._columns["links"]

    def to_chrome_trace(self, path) -> None:
        from simulator.results import export

        export.write_chrome_trace(self, path)

    def plot_timeline(self, path=None, **kw):
        from simulator.results import plots as plotmod

        return plotmod.plot_timeline(self, path, **kw)

    def plot_memory(self, path=None, **kw):
        from simulator.results import plots as plotmod

        return plotmod.plot_memory(self, path, **kw)

    def text_summary(self) -> str:
        from simulator.results.report import format_summary

        return format_summary(self)


@contextmanager
def _gc_paused():
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


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


def _text(values) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _stages(ranks: np.ndarray, layout) -> np.ndarray:
    """The pipeline stage of each rank (-1 without a layout), one ``stage_of`` call per distinct rank."""
    if layout is None or not len(ranks):
        return np.full(len(ranks), -1, dtype=np.int64)
    uniq, inv = np.unique(ranks, return_inverse=True)
    return np.array([layout.stage_of(int(r)) for r in uniq], dtype=np.int64)[inv]


def _order(*keys: np.ndarray) -> np.ndarray:
    """Stable sort order by ``keys`` (first key most significant); text keys sort as Python
    strings do (what pandas' ``sort_values`` does)."""
    coded = []
    for k in keys:
        if k.dtype == object:
            values = k.tolist()
            rank = {v: i for i, v in enumerate(sorted(set(values)))}  # few distinct names
            k = np.fromiter(map(rank.__getitem__, values), dtype=np.int64, count=len(values))
        coded.append(k)
    return np.lexsort(coded[::-1])


def event_columns(raw: RawRun | None, layout) -> Columns:
    """The events table (``docs/formats.md``) of the engine's records, sorted by ``rank``,
    ``start_s``, ``stream``, ``name``."""
    recs = list(raw.records) if raw is not None else []
    ops = list(map(attrgetter("op"), recs))
    flops, nbytes = [], []
    work: dict[int, tuple] = {}  # id(kernel group) -> (group, flops, bytes): groups are shared
    for op in ops:
        k = op.kernels
        w = work.get(id(k))
        if w is None or w[0] is not k:
            w = work[id(k)] = (k, op.flops, op.bytes)
        flops.append(w[1])
        nbytes.append(w[2])
    rank = np.fromiter(map(attrgetter("rank"), ops), dtype=np.int64, count=len(ops))
    start = np.fromiter(map(attrgetter("start_s"), recs), dtype=float, count=len(recs))
    end = np.fromiter(map(attrgetter("end_s"), recs), dtype=float, count=len(recs))

    def ints(attr):
        return np.fromiter(map(attrgetter(attr), ops), dtype=np.int64, count=len(ops))

    def text(attr):
        return _text(list(map(attrgetter(attr), ops)))

    cols = {
        "rank": rank,
        "stage": _stages(rank, layout),
        "stream": text("stream"),
        "name": text("name"),
        "kind": text("kind"),
        "phase": text("phase"),
        "mb": ints("mb"),
        "chunk": ints("chunk"),
        "layer": ints("layer"),
        "start_s": start,
        "end_s": end,
        "duration_s": end - start,
        "flops": np.array(flops, dtype=float),
        "bytes": np.array(nbytes, dtype=float),
        "size_bytes": np.fromiter(map(attrgetter("size_bytes"), ops), dtype=float, count=len(ops)),
        "coll": text("coll"),
        "axis": text("axis"),
    }
    order = _order(rank, start, cols["stream"], cols["name"])
    return {c: cols[c][order] for c in EVENT_COLUMNS}


def events_frame(raw: RawRun, layout) -> pd.DataFrame:
    """:func:`event_columns` as a DataFrame."""
    import pandas as pd

    return pd.DataFrame(event_columns(raw, layout))


def memory_columns(raw: RawRun, trace: Trace, layout) -> Columns:
    """Memory in use per rank over time: one row per change, a column per category.

    Several changes at one instant keep a row each: a peak inside one instant (an
    allocation before a free at the same time) is real and stays visible."""
    cats = {c: j for j, c in enumerate(MEMORY_CATEGORIES)}
    by_rank: dict[int, list] = {r: [] for r in trace.ranks}
    for t, r, cat, d in raw.mem_events:
        by_rank[r].append((t, cat, d))
    parts = []
    for r in trace.ranks:
        static = trace.static_memory[r]
        ev = sorted(by_rank[r], key=lambda e: e[0])
        n = len(ev) + 1
        deltas = np.zeros((n, len(MEMORY_CATEGORIES)))
        deltas[0] = [static.get(c, 0.0) for c in MEMORY_CATEGORIES]
        if ev:
            idx = np.arange(1, n)
            deltas[idx, [cats[cat] for _, cat, _ in ev]] = [d for _, _, d in ev]
        # a running sum, in row order, of each category: the same additions as one at a time
        levels = np.cumsum(deltas, axis=0)
        times = np.array([0.0] + [t for t, _, _ in ev])
        parts.append((r, times, levels))
    rank = np.concatenate([np.full(len(t), r, dtype=np.int64) for r, t, _ in parts])
    levels = np.concatenate([lv for _, _, lv in parts])
    cols = {"rank": rank, "stage": _stages(rank, layout), "time_s": np.concatenate([t for _, t, _ in parts])}
    for j, c in enumerate(MEMORY_CATEGORIES):
        cols[c] = levels[:, j].copy()
    total = cols[MEMORY_CATEGORIES[0]].copy()
    for c in MEMORY_CATEGORIES[1:]:
        total += cols[c]  # left to right, as pandas' row sum
    cols["total"] = total
    return {c: cols[c] for c in MEMORY_COLUMNS}


def idle_columns(spans, layout) -> Columns:
    """Idle spans of each simulated device's compute stream, one row per maximal span of
    one cause (``bubble``, ``exposed_comm``, ``offload_wait``; :mod:`simulator.engine.accounting`)
    and one set of busy axes (``waiting_for``: ``tp``, ``ep_inter+ep_intra``, ``offload``;
    empty for a bubble), by rank and start."""
    spans = list(spans)
    rank = np.array([int(s[0]) for s in spans], dtype=np.int64)
    start = np.array([s[1] for s in spans], dtype=float)
    end = np.array([s[2] for s in spans], dtype=float)
    cols = {
        "rank": rank,
        "stage": _stages(rank, layout),
        "start_s": start,
        "end_s": end,
        "duration_s": end - start,
        "cause": _text([s[3] for s in spans]),
        "waiting_for": _text([s[4] or "" for s in spans]),
    }
    order = np.lexsort((start, rank))
    return {c: cols[c][order] for c in IDLE_COLUMNS}
