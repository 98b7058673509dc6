"""Running a sweep's cases: one case in a worker (:func:`run_case`) and the executors that run
many (:func:`execute`: local processes, any ``concurrent.futures`` executor, or Dask), with the
check that every worker runs this process's stepsim version (:class:`WorkerVersionError`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from concurrent.futures import as_completed
from concurrent.futures.process import BrokenProcessPool

from simulator.errors import StudyError
from simulator.scenario.schema import ScenarioError
from simulator.studies.sweep.cases import plain_json
from simulator.studies.workers import WorkerPool, process_pool
from simulator.version import __version__


def run_case(payload: tuple) -> dict:
    """Simulate one case; never raises for a bad scenario. ``payload = (index, key, mapping)``.
    Returns ``{"case", "key", "status", "error", "summary", "stepsim_version"}`` with plain
    JSON types (``stepsim_version``: the version that ran the case). A row is a summary only,
    so a long pipeline's step is skipped ahead where its steady phase provably repeats
    (``simulate(..., steady_state=True)``: the same figures to 1e-9, ``summary["steady_state"]``
    says so)."""
    index, key, mapping = payload
    from simulator import simulate

    try:
        summary = simulate(mapping, steady_state=True).summary
        row = {"case": index, "key": key, "status": "ok", "error": None, "summary": summary}
    except ScenarioError as err:
        row = {"case": index, "key": key, "status": "failed", "error": str(err), "summary": None}
    except Exception as err:  # noqa: BLE001 — one broken scenario must not stop the sweep
        row = {"case": index, "key": key, "status": "failed", "error": f"{type(err).__name__}: {err}", "summary": None}
    row["stepsim_version"] = worker_version()
    return json.loads(plain_json(row))


def worker_version() -> str:
    """The stepsim version of the process this runs in (read when called, so that a
    worker reports its own). The first task every executor of a sweep is sent."""
    from simulator import version as _version

    return _version.__version__


class WorkerVersionError(StudyError):
    """A worker runs another stepsim version than the process running the sweep."""


class WorkerLostError(StudyError):
    """A worker process died (killed, or out of memory) mid-sweep: not a bug in the sweep, and
    not lost work — the rows finished so far are saved and the same sweep resumes."""

    MESSAGE = (
        "executor: a worker process died (killed, or out of memory); the rows finished so far are saved - "
        "run the same sweep again to resume (with jobs=1 to find the case at fault)"
    )

    def __init__(self, message: str = MESSAGE, *, field: str | None = None) -> None:
        super().__init__(message, field=field)


def _check_version(version, who: str) -> None:
    if version is not None and version != __version__:
        raise WorkerVersionError(
            f"executor: {who} runs stepsim {version}, this process stepsim {__version__}; install the same "
            f"version on every worker (pip install stepsim=={__version__}) - results of two versions in one "
            "table would not compare. The rows finished so far are saved."
        )


def _failed_row(p: tuple, err: BaseException) -> dict:
    return {"case": p[0], "key": p[1], "status": "failed", "error": f"{type(err).__name__}: {err}", "summary": None}


class ExecutorError(StudyError):
    """An executor that cannot run the sweep's first task (asking a worker's stepsim version)."""


def _first_task(submit, fn) -> object:
    """``submit(fn).result()``; an executor that cannot do that much is not one to use."""
    try:
        return submit(fn).result()
    except Exception as err:  # noqa: BLE001 — the executor's own failure, before any case ran
        raise ExecutorError(
            f"executor: its first task (asking a worker's stepsim version) failed: {type(err).__name__}: {err}"
        ) from None


def default_jobs() -> int:
    from simulator.results.beside import usable_cpus

    return max(1, usable_cpus())


def execute(payloads: Sequence[tuple], client=None, jobs: int | None = None, executor=None) -> Iterator[dict]:
    """Run :func:`run_case` over ``payloads``, yielding rows as they finish (any order).

    ``executor``: any :class:`concurrent.futures.Executor` (a thread or process pool, loky's,
    Ray's, ``mpi4py.futures.MPIPoolExecutor``...; left running: its owner shuts it down);
    ``client``: a ``dask.distributed.Client``; otherwise ``jobs`` local processes (default:
    every core; ``1``: in this process). On an executor or Dask, a first task asks a worker
    for its stepsim version and every row carries the version that ran it: another version
    than this process's stops the sweep with :class:`WorkerVersionError`."""
    if client is not None and executor is not None:
        raise ValueError("executor: give either a Dask client or an executor, not both")
    if not payloads:
        return
    if executor is not None:
        if not callable(getattr(executor, "submit", None)):
            raise ValueError(
                f"executor: expected a concurrent.futures.Executor (with submit), got {type(executor).__name__}"
            )
        if not isinstance(executor, WorkerPool):  # whose workers are forks of this process
            _check_version(_first_task(executor.submit, worker_version), "a worker")
        futs = {executor.submit(run_case, p): p for p in payloads}
        try:
            for f in as_completed(futs):
                p = futs[f]
                try:
                    row = f.result()
                except BrokenProcessPool:
                    raise WorkerLostError() from None
                except Exception as err:  # noqa: BLE001 — a worker lost, a task erred: record it
                    row = _failed_row(p, err)
                _check_version(row.get("stepsim_version"), f"the worker that ran case {p[0]}")
                yield row
        finally:
            for f in futs:
                f.cancel()
        return
    if client is not None:
        from distributed import as_completed as dask_completed

        _check_version(_first_task(lambda fn: client.submit(fn, pure=False), worker_version), "a Dask worker")
        futures = client.map(run_case, list(payloads), pure=False)
        by_future = dict(zip(futures, payloads))
        try:
            for fut in dask_completed(futures):
                p = by_future.pop(fut)
                try:
                    row = fut.result()
                except Exception as err:  # noqa: BLE001 — a worker lost, a task erred: record it
                    row = _failed_row(p, err)
                fut.release()
                _check_version(row.get("stepsim_version"), f"the Dask worker that ran case {p[0]}")
                yield row
        finally:
            for fut in by_future:
                fut.cancel()
        return
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"jobs: must be >= 1, got {jobs}")
    if jobs == 1:
        for p in payloads:
            yield run_case(p)
        return
    ex = process_pool(min(jobs, len(payloads)))  # its workers end when this process dies
    try:
        futs = [ex.submit(run_case, p) for p in payloads]
        for f in as_completed(futs):
            try:
                yield f.result()
            except BrokenProcessPool:
                raise WorkerLostError() from None
    finally:
        ex.shutdown(wait=True, cancel_futures=True)
