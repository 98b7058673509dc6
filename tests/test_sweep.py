"""Sweeps: spec parsing, crash-safe resumption (a real kill), failed rows, local vs Dask, plots, CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import yaml
from helpers import scenario

from simulator.scenario.schema import ScenarioError
from simulator.studies.sweep import sweep
from simulator.studies.sweep.cases import expand
from simulator.studies.sweep.rows import RowStore
from simulator.studies.sweep.spec import eval_where, load_sweep, set_dotted


def _base():
    b = scenario()
    b["parallel"] = {"tp": 1}  # dp: the devices left over
    return b


def _keys(path):
    return [json.loads(line)["key"] for line in path.read_text().splitlines()]


# ---- the spec ----------------------------------------------------------------------------


def test_set_dotted_turns_presets_into_mappings_and_copies():
    base = {"model": "llama3-8b", "parallel": {"tp": 2}}
    out = set_dotted(base, "model.layers", 4)
    assert out["model"] == {"preset": "llama3-8b", "layers": 4}
    out = set_dotted(out, "cluster.network.nic_bw_bytes_per_s", 1e9)
    assert out["cluster"] == {"network": {"nic_bw_bytes_per_s": 1e9}}
    assert base == {"model": "llama3-8b", "parallel": {"tp": 2}}  # untouched
    with pytest.raises(ScenarioError, match="parallel.tp.x"):
        set_dotted(base, "parallel.tp.x", 1)


def test_grid_product_order_and_cases_crossed_with_grid():
    spec = load_sweep({"base": _base(), "grid": {"parallel.pp": [1, 2], "parallel.tp": [1, 2]}})
    assert [tuple(a.values()) for a in spec.assignments] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    spec = load_sweep(
        {"base": _base(), "cases": [{"schedule": "gpipe"}, {"schedule": "1f1b"}], "grid": {"parallel.pp": [1, 2]}}
    )
    assert spec.assignments == (
        {"schedule": "gpipe", "parallel.pp": 1},
        {"schedule": "gpipe", "parallel.pp": 2},
        {"schedule": "1f1b", "parallel.pp": 1},
        {"schedule": "1f1b", "parallel.pp": 2},
    )
    assert spec.axes == ("schedule", "parallel.pp")


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"grid": {"parallel.pp": []}}, "grid.parallel.pp"),
        ({"grid": {"parallel.pp": [1]}, "colour": 1}, "colour"),
        ({}, "grid"),
        ({"cases": [3]}, "cases[0]"),
        ({"grid": {"parallel.pp": [1]}, "where": "__import__('os')"}, "where[0]"),
        ({"grid": {"parallel.pp": [1]}, "skip_invalid": "yes"}, "skip_invalid"),
    ],
)
def test_bad_sweep_files_name_the_key(bad, field):
    with pytest.raises(ScenarioError) as err:
        load_sweep({"base": _base(), **bad})
    assert err.value.field == field


def test_where_expressions():
    env = {"parallel.tp": 2, "parallel.pp": 4, "schedule": "1f1b"}
    assert eval_where("parallel.tp * parallel.pp <= 8 and schedule in ['1f1b', 'gpipe']", env.__getitem__)
    assert not eval_where("1 < parallel.tp < 2 or not schedule == '1f1b'", env.__getitem__)
    with pytest.raises(ScenarioError, match="unknown key 'parallel.cp'"):
        eval_where("parallel.cp == 1", env.__getitem__)
    with pytest.raises(ScenarioError, match="Call not allowed"):
        eval_where("len(schedule) > 1", env.__getitem__)


def test_where_sees_resolved_presets_and_skip_invalid(tmp_path):
    base_file = tmp_path / "base.yaml"
    base_file.write_text(yaml.safe_dump(_base()))
    spec_file = tmp_path / "sub" / "s.yaml"
    spec_file.parent.mkdir()
    spec_file.write_text(
        yaml.safe_dump(
            {
                "base": "../base.yaml",
                "grid": {"parallel.pp": [1, 2, 3, 4, 8]},
                "skip_invalid": True,
                "where": ["parallel.pp <= model.layers", "cluster.devices == 8"],
            }
        )
    )
    exp = expand(load_sweep(spec_file))
    # pp=8 > 4 layers: filtered by `where`; pp=3 does not divide the 8 devices: skipped.
    assert [c.axes["parallel.pp"] for c in exp.cases] == [1, 2, 4]
    assert exp.filtered == 1
    assert len(exp.skipped) == 1 and "does not divide the 8 devices" in exp.skipped[0]["reason"]


# ---- failures and resumption ---------------------------------------------------------------


def test_invalid_scenarios_are_recorded_failed_and_the_sweep_goes_on(tmp_path):
    spec = {
        "base": _base(),
        "cases": [{"parallel.tp": 3}, {"parallel.pp": 1}, {"parallel.pp": 8}, {"training.global_batch_size": 12}],
    }
    df = sweep(spec, out=tmp_path, jobs=1)
    assert list(df["case"]) == [0, 1, 2, 3]
    assert list(df["status"]) == ["failed", "ok", "failed", "failed"]
    assert "parallel" in df.loc[0, "error"] and "does not divide" in df.loc[0, "error"]
    assert "parallel.pp" in df.loc[2, "error"]  # 8 stages for 4 layers: refused at simulation
    assert "training.global_batch_size" in df.loc[3, "error"]
    assert df.loc[1, "step_time_s"] > 0 and pd.isna(df.loc[0, "step_time_s"])
    on_disk = pd.read_csv(tmp_path / "results.csv")
    assert list(on_disk["status"]) == list(df["status"])
    # skip_invalid leaves them out instead.
    df = sweep({**spec, "skip_invalid": True}, jobs=1)
    assert list(df["parallel.pp"].fillna(0)) == [1] and len(df.attrs["skipped"]) == 3


@pytest.mark.slow
def test_killed_sweep_resumes_with_every_row_exactly_once(tmp_path):
    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            {
                "name": "killme",
                "base": _base(),
                "grid": {"parallel.pp": [1, 2, 4], "training.global_batch_size": [32, 64, 96]},
            }
        )
    )
    out = tmp_path / "out"
    rows = out / "rows.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator.cli.sweep", "sweep", str(spec_file), "--out", str(out), "--jobs", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            if rows.exists() and len(rows.read_text().splitlines()) >= 2:
                break
            time.sleep(0.01)
        assert proc.poll() is None, f"the sweep ended before it could be killed: {proc.stderr.read()!r}"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    before = rows.read_text()
    n_before = len(before.splitlines())
    assert 2 <= n_before < 9
    # A crash in the middle of a write leaves a torn line: resumption must drop it.
    with open(rows, "a") as f:
        f.write('{"case": 7, "key": "deadbeef", "stat')
    df = sweep(spec_file, out=out, jobs=1)
    assert list(df["case"]) == list(range(9))
    keys = _keys(rows)
    assert len(keys) == 9 and len(set(keys)) == 9
    assert rows.read_text().startswith(before)  # the finished rows were not run again
    assert (df["status"] == "ok").all()
    for table in (pd.read_csv(out / "results.csv"), pd.read_parquet(out / "results.parquet")):
        assert sorted(table["key"]) == sorted(keys) and list(table["case"]) == list(range(9))
    assert sorted(df["parallel.pp"].unique()) == [1, 2, 4]
    # Once more: nothing left to run, nothing appended.
    size = rows.stat().st_size
    again = sweep(spec_file, out=out, jobs=1)
    assert rows.stat().st_size == size
    pd.testing.assert_frame_equal(again, df)


def test_retry_failed_reruns_only_failed_rows(tmp_path):
    spec = {"base": _base(), "grid": {"parallel.pp": [1, 8]}}
    sweep(spec, out=tmp_path, jobs=1)
    assert len(_keys(tmp_path / "rows.jsonl")) == 2
    df = sweep(spec, out=tmp_path, jobs=1, retry_failed=True)
    keys = _keys(tmp_path / "rows.jsonl")
    assert len(keys) == 3 and len(set(keys)) == 2  # the failed row appended again, once in the table
    assert len(df) == 2 and list(df["status"]) == ["ok", "failed"]
    assert RowStore(tmp_path).load().keys() == set(keys)


# ---- executors, plots, command line ------------------------------------------------------------


@pytest.mark.slow
def test_local_processes_and_dask_give_identical_tables(tmp_path):
    distributed = pytest.importorskip("distributed")
    spec = {"name": "exec", "base": _base(), "grid": {"parallel.pp": [1, 2], "schedule": ["1f1b", "gpipe"]}}
    local = sweep(spec, out=tmp_path / "local", jobs=2)
    with (
        distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as lc,
        distributed.Client(lc) as client,
    ):
        remote = sweep(spec, out=tmp_path / "dask", client=client)
    assert (local["status"] == "ok").all() and len(local) == 4
    pd.testing.assert_frame_equal(local.drop(columns="sim_wall_s"), remote.drop(columns="sim_wall_s"))
    a = pd.read_parquet(tmp_path / "local" / "results.parquet").drop(columns="sim_wall_s")
    b = pd.read_parquet(tmp_path / "dask" / "results.parquet").drop(columns="sim_wall_s")
    pd.testing.assert_frame_equal(a, b)

    from simulator.studies.sweep.plots import plot_sweep

    paths = plot_sweep(tmp_path / "local", y="mfu")
    names = {p.name for p in paths}
    assert {
        "mfu_vs_parallel.pp.png",
        "mfu_vs_parallel.pp.svg",
        "memory_vs_parallel.pp.png",
        "heatmap_mfu_parallel.pp_schedule.svg",
    } <= names
    assert all(p.stat().st_size > 1000 for p in paths)


def test_cli_sweep_and_sweep_plot(tmp_path, capsys):
    from simulator.cli.sweep import main

    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(yaml.safe_dump({"base": _base(), "grid": {"parallel.pp": [1, 2, 3]}, "skip_invalid": True}))
    assert main(["sweep", str(spec_file), "--out", str(tmp_path / "o"), "--jobs", "1", "--plot"]) == 0
    text = capsys.readouterr().out
    assert "2 cases, 2 ok, 0 failed (1 invalid skipped)" in text
    assert (tmp_path / "o" / "plots" / "step_time_s_vs_parallel.pp.svg").exists()
    assert main(["sweep-plot", str(tmp_path / "o"), "--y", "nope"]) == 2
    assert "no column 'nope'" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"base": _base(), "grid": {"parallel.pp": 2}}))
    assert main(["sweep", str(bad), "--out", str(tmp_path / "b")]) == 2
    assert "grid.parallel.pp" in capsys.readouterr().err


# ---- exit codes and worker lifetime ----------------------------------------------------------


def test_cli_sweep_exits_4_and_counts_when_cases_fail(tmp_path, capsys):
    from simulator.cli.sweep import main

    spec_file = tmp_path / "s.yaml"
    # pp 8 over 4 layers and a batch of 12 over dp 8 both fail; pp 1 runs.
    spec_file.write_text(
        yaml.safe_dump(
            {"base": _base(), "cases": [{"parallel.pp": 8}, {"parallel.pp": 1}, {"training.global_batch_size": 12}]}
        )
    )
    assert main(["sweep", str(spec_file), "--out", str(tmp_path / "o"), "--jobs", "1"]) == 4
    cap = capsys.readouterr()
    assert "3 cases, 1 ok, 2 failed" in cap.out
    assert "2 of 3 cases failed" in cap.err and "case 0: " in cap.err and "parallel.pp" in cap.err
    # Every case failing is not a success either (it used to exit 0).
    spec_file.write_text(yaml.safe_dump({"base": _base(), "cases": [{"parallel.pp": 8}, {"parallel.tp": 3}]}))
    assert main(["sweep", str(spec_file), "--out", str(tmp_path / "all"), "--jobs", "1"]) == 4
    assert "2 of 2 cases failed" in capsys.readouterr().err
    assert main(["sweep", "--help"]) == 0
    assert "4 some cases failed" in " ".join(capsys.readouterr().out.split())


def test_cli_search_exits_4_when_a_layout_fails(tmp_path, capsys, monkeypatch):
    import simulator
    from simulator.cli.sweep import main

    sc = tmp_path / "sc.yaml"
    sc.write_text(yaml.safe_dump(scenario()))
    real = simulator.simulate

    def broken_on_pp2(mapping, *a, **kw):  # a simulator bug that only pp=2 layouts hit
        if mapping["parallel"]["pp"] == 2:
            raise RuntimeError("boom")
        return real(mapping, *a, **kw)

    monkeypatch.setattr(simulator, "simulate", broken_on_pp2)
    args = [
        "search",
        str(sc),
        "--jobs",
        "1",
        "--schedules",
        "1f1b",
        "--recompute",
        "none",
        "--max-tp",
        "1",
        "--no-progress",
    ]
    assert main(args) == 4
    cap = capsys.readouterr()
    # tp 1, 8 devices, 4 layers: pp 1, 2, 4 -> one layout each; pp 2 fails.
    assert "1 of 3 layouts failed to simulate" in cap.err and "RuntimeError: boom" in cap.err
    monkeypatch.setattr(simulator, "simulate", real)
    assert main(args) == 0


def _proc_stat(pid: int):
    """``(state, ppid, start time)`` of a process from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1]), int(fields[19])


def _descendants(pid: int) -> dict[int, int]:
    """Every process below ``pid``: ``{pid: start time}``."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _proc_stat(int(d))
            if st is not None:
                children.setdefault(st[1], []).append(int(d))
    out, todo = {}, [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            st = _proc_stat(c)
            if st is not None:
                out[c] = st[2]
                todo.append(c)
    return out


def _still_running(procs: dict[int, int]) -> list[int]:
    """Those of ``procs`` that run (the same process: same start time; a zombie has ended)."""
    return [p for p, start in procs.items() if (st := _proc_stat(p)) is not None and st[2] == start and st[0] != "Z"]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc (Linux)")
@pytest.mark.parametrize(
    "command, sig", [("sweep", signal.SIGTERM), ("search", signal.SIGKILL)], ids=["sweep-TERM", "search-KILL"]
)
def test_killed_sweep_or_search_leaves_no_worker_running(tmp_path, command, sig):
    # Issue 14: workers of a killed `stepsim sweep` / `search` went on simulating for minutes.
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(_base()))
    if command == "sweep":
        spec = tmp_path / "sweep.yaml"
        spec.write_text(
            yaml.safe_dump(
                {
                    "base": "base.yaml",
                    "grid": {
                        "parallel.pp": [1, 2, 4],
                        "training.global_batch_size": [16, 32, 48, 64, 80, 96, 112, 128],
                    },
                }
            )
        )
        args = ["sweep", str(spec), "--out", str(tmp_path / "out")]
    else:
        args = ["search", str(base), "--out", str(tmp_path / "out")]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator.cli", *args, "--jobs", "2", "--no-progress"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    workers: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and len(workers) < 2:
            workers = _descendants(proc.pid)
            time.sleep(0.02)
        assert proc.poll() is None and len(workers) >= 2, (
            f"no workers seen before the {command} ended: {proc.stderr.read()!r}"
        )
        os.kill(proc.pid, sig)  # the parent only, as a user's `kill` or an out-of-memory killer does
        proc.wait(timeout=30)
        t0 = time.monotonic()
        while _still_running(workers) and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        left, waited_s = _still_running(workers), time.monotonic() - t0
    finally:
        for p in _still_running(workers):  # never leave them behind, even when the test fails
            os.kill(p, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
    # SIGTERM: stepsim ends with its documented exit code (128 + 15); SIGKILL: the signal's
    assert proc.returncode == (128 + sig if sig == signal.SIGTERM else -sig)
    # Each worker checks on its parent every 0.2 s (simulator/studies/workers.py); 5 s leaves room for a busy machine.
    assert not left and waited_s < 5, f"workers {left} still running {waited_s:.1f} s after the {command} was killed"


def test_sweep_tables_record_the_stepsim_version(tmp_path):
    import simulator
    from simulator.results.parquet import read_metadata

    spec = {"base": _base(), "cases": [{"parallel.pp": 1}, {"parallel.pp": 8}]}  # ok, failed
    df = sweep(spec, out=tmp_path, jobs=1)
    assert list(df.columns[:5]) == ["case", "parallel.pp", "status", "error", "stepsim_version"]
    assert list(df["status"]) == ["ok", "failed"] and list(df["stepsim_version"]) == [simulator.__version__] * 2
    assert list(pd.read_csv(tmp_path / "results.csv")["stepsim_version"]) == [simulator.__version__] * 2
    assert read_metadata(tmp_path / "results.parquet") == {"stepsim_version": simulator.__version__}
    # Rows written before the version was recorded resume with no version: the column says
    # which version ran each row, not which one rewrote the table.
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    for r in rows:
        r.pop("stepsim_version")
        (r["summary"] or {}).pop("stepsim_version", None)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    again = sweep(spec, out=tmp_path, jobs=1)
    assert again["stepsim_version"].isna().all() and list(again["status"]) == ["ok", "failed"]


# ---- any concurrent.futures.Executor, and the worker version check -----------------------------


def _thread_pool():
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=2)


def _process_pool():
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("fork"))


def _loky_pool():
    loky = pytest.importorskip("loky")
    return loky.get_reusable_executor(max_workers=1)  # a fresh interpreter per worker: one is enough


@pytest.mark.slow
@pytest.mark.parametrize("make", [_thread_pool, _process_pool, _loky_pool], ids=["threads", "processes", "loky"])
def test_any_executor_gives_the_in_process_table(tmp_path, make):
    spec = {"name": "ex", "base": _base(), "cases": [{"parallel.pp": 1}, {"parallel.pp": 2}, {"parallel.pp": 8}]}
    here = sweep(spec, jobs=1)
    ex = make()
    try:
        there = sweep(spec, out=tmp_path, executor=ex)
    finally:
        ex.shutdown(wait=True)
    assert list(there["status"]) == ["ok", "ok", "failed"]  # pp=8 > the layers' split: recorded, not raised
    pd.testing.assert_frame_equal(here.drop(columns="sim_wall_s"), there.drop(columns="sim_wall_s"))
    assert len(_keys(tmp_path / "rows.jsonl")) == 3


def test_workers_of_another_version_are_refused(tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    import simulator.version
    from simulator.studies.sweep import executors as sweep_mod

    spec = {"base": _base(), "cases": [{"parallel.pp": 1}, {"parallel.pp": 2}]}
    # every worker on another version: the first (probe) task says so, before any case runs
    with ThreadPoolExecutor(max_workers=2) as ex:
        monkeypatch.setattr(simulator.version, "__version__", "0.0.1")
        with pytest.raises(sweep_mod.WorkerVersionError, match=r"runs stepsim 0\.0\.1, this process stepsim "):
            sweep(spec, out=tmp_path / "a", executor=ex)
        monkeypatch.undo()
    assert not (tmp_path / "a" / "rows.jsonl").exists()

    # the probe lands on a current worker, a case on an old one: its row is refused, not written
    class MixedWorkers(ThreadPoolExecutor):
        def submit(self, fn, *args, **kwargs):
            if fn is sweep_mod.run_case:
                return super().submit(lambda p: {**fn(p), "stepsim_version": "0.0.1"}, *args, **kwargs)
            return super().submit(fn, *args, **kwargs)

    with (
        MixedWorkers(max_workers=1) as ex,
        pytest.raises(sweep_mod.WorkerVersionError, match="the worker that ran case 0 runs stepsim 0.0.1"),
    ):
        sweep(spec, out=tmp_path / "b", executor=ex)
    assert not (tmp_path / "b" / "rows.jsonl").exists()
    with pytest.raises(ValueError, match="either a Dask client or an executor"):
        sweep(spec, executor=object(), client=object())
    with pytest.raises(ValueError, match="expected a concurrent.futures.Executor"):
        sweep(spec, executor=object())


def test_cli_sweep_executor_flag(tmp_path, capsys):
    from simulator.cli.app import main

    sw = tmp_path / "s.yaml"
    sw.write_text(yaml.safe_dump({"base": _base(), "grid": {"parallel.pp": [1, 2]}}))
    assert (
        main(
            [
                "sweep",
                str(sw),
                "--out",
                str(tmp_path / "o"),
                "--executor",
                "concurrent.futures:ThreadPoolExecutor",
                "--jobs",
                "2",
                "--no-progress",
            ]
        )
        == 0
    )
    assert "2 cases, 2 ok" in capsys.readouterr().out
    for bad, msg in (
        ("nope", "MODULE:CALLABLE"),
        ("no_such_mod_xyz:f", "cannot import"),
        ("concurrent.futures:Nope", "has no 'Nope'"),
    ):
        assert main(["sweep", str(sw), "--out", str(tmp_path / "o"), "--executor", bad]) == 2
        assert msg in capsys.readouterr().err


def test_a_lost_worker_is_a_stepsim_error_that_says_the_rows_are_saved():
    """A worker killed mid-sweep (BrokenProcessPool) is reported as a StudyError — exit 2 with
    a one-line message saying the rows are saved and how to resume — not as an internal
    error of stepsim."""
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    from simulator.errors import StudyError
    from simulator.studies.sweep.executors import execute, worker_version

    class DyingPool:
        def submit(self, fn, *args):
            fut = Future()
            if fn is worker_version:
                fut.set_result(worker_version())
            else:
                fut.set_exception(BrokenProcessPool("a child process terminated abruptly"))
            return fut

    with pytest.raises(StudyError, match="worker process died.*rows finished so far are saved.*resume"):
        list(execute([(0, "k", {})], executor=DyingPool()))


def test_base_may_name_a_built_in_scenario(tmp_path):
    """``base: NAME`` reads the built-in scenario where no file of that name is beside the sweep
    file (as ``stepsim run NAME`` does); a file of that name wins; an unknown name still says no
    such file."""
    spec = load_sweep({"base": "quickstart", "grid": {"training.global_batch_size": [8, 16]}})
    cases = expand(spec).cases
    assert len(cases) == 2 and all(c.resolved is not None for c in cases)
    (tmp_path / "quickstart").write_text(yaml.safe_dump(_base()))
    local = tmp_path / "s.yaml"
    local.write_text(yaml.safe_dump({"base": "quickstart", "grid": {"parallel.pp": [1]}}))
    assert expand(load_sweep(local)).cases[0].scenario["model"] == _base()["model"]
    with pytest.raises(ScenarioError, match="no-such-scenario"):
        load_sweep({"base": "no-such-scenario", "grid": {"parallel.pp": [1]}})
