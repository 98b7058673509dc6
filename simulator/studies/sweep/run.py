"""Parameter sweeps: many scenarios, one table, resumable after a crash.

A sweep file (YAML or JSON) names a ``base`` scenario and the axes to vary::

    name: pp-vs-nic                   # optional label
    base: ../scenarios/llama.yaml     # a scenario path (relative to this file), a built-in
                                      # scenario name (stepsim presets) or an inline mapping
    grid:                             # the product of every listed value
      parallel.pp: [1, 2, 4, 8]
      cluster.network.nic_bw_bytes_per_s: [25e9, 50e9]
    cases:                            # and/or an explicit list of cases
      - {parallel.tp: 8, schedule: 1f1b}
      - {parallel.tp: 4, schedule: interleaved-1f1b, parallel.vpp: 2}
    skip_invalid: true                # leave out cases whose layout cannot run (see below)
    where:                            # keep only the cases for which every expression holds
      - parallel.tp * parallel.pp <= 32
      - schedule != "gpipe" or parallel.pp <= 4

Axes
----
Every axis is a *dotted scenario key*: ``parallel.pp`` sets ``base["parallel"]["pp"]``.
Axes are checked against the scenario's keys (:func:`~simulator.studies.sweep.spec.scenario_key_tree`) when the sweep
is loaded: a misspelled one (``parallel.ppp``) is refused, naming the closest valid key.
A sweep of more than :data:`~simulator.studies.sweep.spec.MAX_SWEEP_CASES` cases (before ``where``) is refused before
it is expanded. Sweep files are read like scenario files (:mod:`stepsim_fileio`).
Missing intermediate mappings are created; an intermediate that is a preset name
(``model: llama3-8b``) becomes ``{preset: llama3-8b}`` so that ``model.layers`` or
``cluster.devices`` override the preset field by field, as in a scenario file. A
value may itself be a mapping or a list (stored JSON-encoded in the tables).

With only ``grid``, the cases are the product of its value lists in the order
the keys are written, the last key varying fastest. With only ``cases``, they
are the list. With both, every case is crossed with the grid (case-major).
Leave ``parallel.dp`` out of the base when varying ``tp``/``pp``/``cp``: it is
then the devices left over.

Constraints
-----------
``where`` is one expression or a list of them (all must hold). They are Python
syntax restricted to literals, dotted keys, arithmetic (``+ - * / // % **``),
comparisons (``< <= == != >= > in``, chained), ``and``/``or``/``not`` and
parentheses; nothing else (no calls, no attribute access beyond dotted keys).
A dotted key is looked up in the case's axis values, then in its scenario
mapping, then in the resolved scenario (presets expanded, so ``model.layers``
and ``cluster.devices`` work); an unknown key is an error. Cases failing a
``where`` are not part of the sweep at all. A sweep that keeps no case (``where`` and
``skip_invalid`` leave out every one) is refused before anything is written.

``skip_invalid: true`` leaves out the cases whose scenario is refused before
any simulation: it does not load (:func:`simulator.load_scenario`, e.g. a layout
that does not divide the devices) or fails the structural checks of
:func:`~simulator.studies.sweep.cases.check_scenario` (batch split, schedule rules, layers over pipeline
chunks, heads / experts over tp / ep). Without it those cases are run and
recorded as ``failed`` with their error. Skipped cases are listed in
``DataFrame.attrs["skipped"]``.

Outputs and resumption
----------------------
With ``out=DIR``, every finished case is appended to ``DIR/rows.jsonl`` (one JSON
object a line, flushed and fsynced: the source of truth), and
``DIR/results.parquet`` and ``DIR/results.csv`` are rewritten from it (write to a
temporary file, then an atomic rename) every few seconds and at the end.
``DIR/sweep.json`` records the sweep's name, axes and case count. Each case is
keyed by the SHA-256 of the canonical JSON of its resolved scenario
(``scenario_to_dict(load_scenario(mapping))``; the raw mapping for one that does
not load). Running the same sweep again reads ``rows.jsonl``, skips every key
already there (``retry_failed=True`` re-runs the failed ones) and never writes a
key twice into the tables; a torn last line left by a crash is dropped. Cases
resolving to the same scenario are run once (the first case keeps the row; the
others are listed in ``DataFrame.attrs["duplicates"]``).

Table columns: ``case`` (index in the sweep), the axis values (named by their
dotted keys), ``status`` (``ok`` | ``failed``), ``error``, ``stepsim_version`` (the
version that ran the case; ``results.parquet`` also carries the writer's version as
key-value metadata ``stepsim_version``), the summary record
flattened (nested mappings as dotted columns such as
``memory_breakdown_bytes.weights``, lists JSON-encoded), and ``key``. Rows are
sorted by ``case``, so the table does not depend on the executor.

Executors
---------
Cases run in local processes (:class:`concurrent.futures.ProcessPoolExecutor`,
``jobs`` of them, default every core; ``jobs=1`` runs them in this process), on
any :class:`concurrent.futures.Executor` given as ``executor`` (a thread pool,
loky's ``get_reusable_executor()``, Ray's, ``mpi4py.futures.MPIPoolExecutor``; the
sweep submits :func:`~simulator.studies.sweep.executors.run_case` with a picklable payload and leaves the executor
running), or on a Dask cluster when a ``dask.distributed.Client`` is given. Local
workers end when the process that started them dies, killed or not
(:mod:`simulator.studies.workers`). On an executor or Dask, a first task asks a worker for its
stepsim version, and every row carries the version that ran it: a worker running
another version than this process stops the sweep with :class:`~simulator.studies.sweep.executors.WorkerVersionError`
(rows finished before are kept).

The file formats (sweep file, ``rows.jsonl``, the tables, ``sweep.json``) are
also documented in ``docs/formats.md``; the scenario keys in ``docs/scenario.md``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from simulator.scenario.schema import ScenarioError
from simulator.studies.sweep.cases import canonical_json, expand
from simulator.studies.sweep.executors import execute
from simulator.studies.sweep.rows import META_FILE, RowStore, atomic_write, rows_frame, write_tables
from simulator.studies.sweep.spec import Case, load_sweep

TABLE_REWRITE_INTERVAL_S = 10.0  # how often the tables are rewritten from rows.jsonl while running


def run_cases(
    cases: Sequence[Case],
    axes: Sequence[str],
    out: str | Path | None = None,
    client=None,
    jobs: int | None = None,
    progress: bool | None = False,
    retry_failed: bool = False,
    desc: str = "sweep",
    executor=None,
) -> tuple[pd.DataFrame, dict[str, dict]]:
    """Run the cases not already finished in ``out`` and return ``(table, rows by key)``.
    The engine under :func:`sweep` and :func:`simulator.studies.search.search`."""
    from simulator.engine.loop import progress_bar

    tqdm = progress_bar()
    store = RowStore(out) if out is not None else None
    rows = store.load() if store is not None else {}
    if retry_failed:
        rows = {k: r for k, r in rows.items() if r.get("status") != "failed"}
    wanted = {c.key for c in cases}
    todo = [c for c in cases if c.key not in rows]
    done_before = sum(1 for k in rows if k in wanted)  # reused: finished in an earlier run
    by_key = {c.key: c for c in cases}
    # progress=True: shown (in a notebook too, where stderr is no terminal); None: only on a terminal
    bar = tqdm(
        total=len(cases),
        initial=done_before,
        desc=desc,
        unit="case",
        dynamic_ncols=True,
        disable=True if progress is False else (None if progress is None else False),
    )
    last_write = time.monotonic()
    failed = 0
    try:
        for row in execute([(c.index, c.key, c.scenario) for c in todo], client=client, jobs=jobs, executor=executor):
            c = by_key[row["key"]]
            row["axes"] = {a: c.axes.get(a) for a in c.axes}
            rows[row["key"]] = row
            if store is not None:
                store.append(row)
                if time.monotonic() - last_write > TABLE_REWRITE_INTERVAL_S:
                    write_tables(rows_frame(cases, rows, axes), store.dir)
                    last_write = time.monotonic()
            failed += row["status"] == "failed"
            bar.set_postfix(failed=failed, refresh=False)
            bar.update(1)
    finally:
        bar.close()
        frame = rows_frame(cases, rows, axes)
        if store is not None:
            write_tables(frame, store.dir)
    frame.attrs["reused"] = done_before
    return frame, rows


def sweep(
    spec_or_path: str | Path | Mapping,
    out: str | Path | None = None,
    client=None,
    jobs: int | None = None,
    progress: bool | None = False,
    retry_failed: bool = False,
    executor=None,
) -> pd.DataFrame:
    """Run a sweep (a path to a sweep file or a mapping in that format; see the module notes)
    and return its table. With ``out``, rows are saved as they finish and a second call
    resumes. ``executor``: any :class:`concurrent.futures.Executor` (workers must run this
    stepsim version: checked); ``client``: a ``dask.distributed.Client``; ``jobs``: local processes.
    ``progress``: a progress bar (``tqdm.auto``: a widget in a notebook); ``None``: only
    when stderr is a terminal.

    ``DataFrame.attrs`` holds ``skipped`` (invalid cases left out by ``skip_invalid``),
    ``filtered`` (cases removed by ``where``), ``duplicates`` and ``reused`` (cases whose
    rows an earlier run left in ``out``: not run again).

    A sweep that keeps no case (``where`` and ``skip_invalid`` leave out every one) raises a
    :class:`~simulator.scenario.schema.ScenarioError` before anything is written."""
    spec = load_sweep(spec_or_path)
    exp = expand(spec)
    if not exp.cases:  # refused before anything is written
        raise _nothing_to_run(exp)
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        meta = {
            "name": spec.name,
            "axes": list(spec.axes),
            "cases": len(exp.cases),
            "skipped": exp.skipped,
            "filtered": exp.filtered,
            "duplicates": exp.duplicates,
        }
        atomic_write(Path(out) / META_FILE, lambda p: p.write_text(canonical_json(meta)))
    frame, _ = run_cases(
        exp.cases,
        spec.axes,
        out=out,
        client=client,
        jobs=jobs,
        progress=progress,
        retry_failed=retry_failed,
        desc=spec.name,
        executor=executor,
    )
    frame.attrs.update(
        skipped=exp.skipped, filtered=exp.filtered, duplicates=exp.duplicates, axes=list(spec.axes), name=spec.name
    )
    return frame


def _nothing_to_run(exp) -> ScenarioError:
    """The error for a sweep that keeps no case: what left them out (``where``, ``skip_invalid``)."""
    total = exp.filtered + len(exp.skipped)
    if not exp.skipped:
        return ScenarioError(f"keeps none of the sweep's {total} cases; nothing to run", field="where")
    first = exp.skipped[0]["reason"]
    if not exp.filtered:
        return ScenarioError(
            f"all {total} cases of the sweep are invalid and were left out (the first: {first})", field="skip_invalid"
        )
    return ScenarioError(
        f"no case left to run: where left out {exp.filtered} and skip_invalid {len(exp.skipped)} (the first: {first})",
        field="where",
    )
