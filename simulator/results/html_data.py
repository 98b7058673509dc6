"""What an HTML report draws: :class:`RunData`, from a :class:`~simulator.results.result.Result`
in memory (:func:`run_data`) or read back from a ``stepsim run --out`` directory
(:func:`load_run_dir`), and the table of exposed communication by axis and stage.

Plotly is an optional dependency (``pip install 'stepsim[report]'``); without it,
:func:`require_plotly` raises :class:`~simulator.errors.ReportError` saying so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from simulator.errors import ReportError


def require_plotly():
    """The ``plotly`` package, or a :class:`ReportError` saying how to install it."""
    try:
        import plotly  # noqa: F401
        import plotly.graph_objects as go
    except ImportError:
        raise ReportError(
            "--html: the HTML report needs the plotly package; install it with "
            "pip install 'stepsim[report]' (or pip install plotly)"
        ) from None
    return go


# ---- the data a report draws -------------------------------------------------------------


@dataclass(frozen=True)
class RunData:
    """What one run's report draws (each table as :mod:`simulator.results.result` defines it)."""

    summary: dict
    events: pd.DataFrame
    memory: pd.DataFrame
    idle: pd.DataFrame  # simulator.results.result.idle_columns
    scenario: dict | None  # simulator.scenario.serialise.scenario_to_dict, None if not recorded
    labels: dict  # rank -> its name in every output (report.stage_label)
    missing: tuple[str, ...] = ()  # files of the run directory that were not there
    links: pd.DataFrame | None = None  # the links table (simulator.results.links), None if not made
    links_png: bytes | None = None  # the links heat map (links.png), None if not drawn


def run_data(result) -> RunData:
    """A :class:`RunData` from a :class:`~simulator.results.result.Result` in memory (the
    links heat map is the file ``links.png`` that :meth:`Result.write` draws: not here)."""
    from simulator.results.report import stage_labels
    from simulator.scenario.serialise import scenario_to_dict

    links = result.links_table()
    return RunData(
        summary=result.summary,
        events=result.events,
        memory=result.memory,
        idle=result.idle,
        scenario=scenario_to_dict(result.scenario) if result.scenario is not None else None,
        labels=stage_labels(result),
        links=pd.DataFrame(links) if links is not None else None,
    )


# The columns of a run directory's tables the report reads (a file that lacks one, or is not a
# table, was an internal error: KeyError 'rank', ArrowInvalid).
EVENT_NEEDS = ("rank", "stream", "start_s", "end_s")
MEMORY_NEEDS = ("rank", "stage", "time_s", "total")
LINK_NEEDS = ("link", "kind", "axis", "bytes", "busy_fraction")


def _read_table(path: Path, columns, **csv_options) -> pd.DataFrame:
    """One table of a run directory; refused naming the file where it cannot be read or lacks ``columns``."""
    try:
        df = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path, **csv_options)
    except (ValueError, OSError) as err:  # pyarrow's ArrowInvalid and pandas' ParserError are ValueErrors
        raise ReportError(f"report: {path}: not a table `stepsim run --out` writes ({str(err)[:200]})") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ReportError(f"report: {path}: no column {', '.join(missing)}; it is not the table `stepsim run` writes")
    return df


def load_run_dir(path) -> RunData:
    """Read back a ``stepsim run --out`` directory. ``summary.json``, the events
    (``events.parquet`` or ``events.csv``) and ``memory.csv`` are required; without
    ``idle.csv`` or ``scenario.json`` (directories of older versions) the report says
    what it cannot show."""
    from simulator.results.result import IDLE_COLUMNS
    from stepsim_fileio import load_json, read_text

    d = Path(path)
    try:
        is_dir = d.is_dir()
    except OSError as err:  # a name the file system refuses (too long)
        raise ReportError(f"report: {str(d)!r}: {err.strerror or err}") from None
    if not is_dir:
        raise ReportError(f"report: {str(d)!r} is not a directory (give the --out directory of `stepsim run`)")
    need = [d / "summary.json", d / "memory.csv"]
    missing = [p.name for p in need if not p.is_file()]
    if not (d / "events.parquet").is_file() and not (d / "events.csv").is_file():
        missing.append("events.parquet (or events.csv)")
    if missing:
        raise ReportError(f"report: {d} has no {', '.join(missing)}; it should be the --out directory of `stepsim run`")
    summary = load_json(read_text(d / "summary.json"), str(d / "summary.json"))
    if not isinstance(summary, dict) or "step_time_s" not in summary:
        raise ReportError(f"report: {d / 'summary.json'} is not a stepsim summary (no step_time_s)")
    if (d / "events.parquet").is_file():
        events = _read_table(d / "events.parquet", EVENT_NEEDS)
    else:
        events = _read_table(d / "events.csv", EVENT_NEEDS, keep_default_na=False)
    memory = _read_table(d / "memory.csv", MEMORY_NEEDS)
    absent = []
    if (d / "idle.csv").is_file():
        idle = _read_table(d / "idle.csv", (), keep_default_na=False)
    else:
        idle, absent = pd.DataFrame(columns=IDLE_COLUMNS), absent + ["idle.csv"]
    scenario = None
    if (d / "scenario.json").is_file():
        scenario = load_json(read_text(d / "scenario.json"), str(d / "scenario.json"))
    else:
        absent.append("scenario.json")
    stages = dict(zip(memory["rank"].tolist(), memory["stage"].tolist()))
    labels = _labels_from_scenario(scenario, summary, stages)
    links = _read_table(d / "links.csv", LINK_NEEDS, keep_default_na=False) if (d / "links.csv").is_file() else None
    return RunData(
        summary=summary,
        events=events,
        memory=memory,
        idle=idle,
        scenario=scenario,
        labels=labels,
        missing=tuple(absent),
        links=links,
        links_png=(d / "links.png").read_bytes() if (d / "links.png").is_file() else None,
    )


def _labels_from_scenario(scenario, summary, stages: dict) -> dict:
    """rank -> its name (:func:`~simulator.results.report.stage_label`); without a scenario,
    only its stage (``stages``) is known."""
    from simulator.results.report import rank_weight, stage_label

    layout = None
    if isinstance(scenario, dict):
        try:
            from simulator.scenario.loading import load_scenario

            layout = load_scenario(scenario).layout
        except (ValueError, KeyError, TypeError):
            layout = None
    if layout is None:
        return {r: f"stage {st} (device {r})" for r, st in sorted(stages.items())}
    exact = bool(summary.get("exact", True))
    return {r: stage_label(layout, int(r), rank_weight(layout, int(r), {}, exact)) for r in sorted(stages)}


# ---- tables ------------------------------------------------------------------------------


def exposed_by_axis_stage(data: RunData) -> pd.DataFrame:
    """Exposed communication per pipeline stage (rows) and axis (columns), seconds: the
    ``exposed_comm`` idle spans, each split equally among the axes busy during it (the
    rule of :mod:`simulator.engine.accounting`), averaged over the simulated devices of a stage."""
    idle = data.idle
    exp = idle[idle["cause"] == "exposed_comm"]
    ranks_per_stage = data.memory.groupby("stage")["rank"].nunique()
    acc: dict[tuple[int, str], float] = {}
    for stage, what, dur in zip(exp["stage"].tolist(), exp["waiting_for"].tolist(), exp["duration_s"].tolist()):
        axes = [a for a in str(what).split("+") if a] or ["other"]
        for a in axes:
            acc[(int(stage), a)] = acc.get((int(stage), a), 0.0) + dur / len(axes)
    stages = sorted(ranks_per_stage.index.tolist())
    axes = sorted({a for _, a in acc})
    table = pd.DataFrame(0.0, index=pd.Index(stages, name="stage"), columns=axes)
    for (st, a), v in acc.items():
        table.loc[st, a] = v / ranks_per_stage.get(st, 1)
    return table
