"""SIGINT and SIGTERM end a command with one line and exit 130 / 143: no traceback, no staging
folder left, the previous ``--out`` untouched, and no child process left (issue 41).

Each test starts ``stepsim`` in a subprocess of its own session, waits until it is at the
point to interrupt (writing its outputs; or its pool workers started), then sends the
signal: to the whole process group for SIGINT (as Ctrl-C does), to the parent alone for
SIGTERM (as ``kill`` does)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from simulator.cli.interrupts import EXIT_SIGINT, EXIT_SIGTERM, Interrupted, handled
from simulator.results.outdir import STAGING_PREFIX

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")

SIGNALS = [
    pytest.param(signal.SIGINT, EXIT_SIGINT, id="SIGINT"),
    pytest.param(signal.SIGTERM, EXIT_SIGTERM, id="SIGTERM"),
]


def _children(pid: int) -> set[int]:
    """Every living descendant of ``pid`` (from /proc)."""
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parent[int(d.name)] = int(fields[1])
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = {c for c, pp in parent.items() if pp == p}
        out |= kids
        todo += list(kids)
    return out


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for p in pids:
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(p)
    return alive


def _start(argv: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    env.pop("STEPSIM_DEBUG", None)
    return subprocess.Popen(
        [sys.executable, "-m", "simulator.cli", *argv],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # a process group of its own, as a shell gives a command
    )


def _wait_for(cond, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    t0 = time.monotonic()
    while not cond():
        if proc.poll() is not None:
            pytest.fail(f"ended before the point to interrupt it: {proc.returncode} {proc.stderr.read()!r}")
        if time.monotonic() - t0 > timeout_s:
            proc.kill()
            pytest.fail("never reached the point to interrupt it")
        time.sleep(0.01)


def _send(proc: subprocess.Popen, sig: int) -> set[int]:
    """Send ``sig`` (SIGINT to the group, SIGTERM to the parent); the children it had."""
    kids = _children(proc.pid)
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)
    return kids


def _check_ended(proc: subprocess.Popen, kids: set[int], code: int, sig: int) -> None:
    out, err = proc.communicate(timeout=60)
    err = err.decode()
    assert proc.returncode == code, err
    assert err.strip() == f"stepsim: {Interrupted(sig)}", err  # one line, no traceback
    deadline = time.monotonic() + 5
    while _alive(kids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(kids), "child processes left behind"


@pytest.mark.parametrize("sig, code", SIGNALS)
def test_run_interrupted_while_writing(tmp_path, sig, code):
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text('{"previous": true}')
    proc = _start(["run", "deepseek-v3-2048xh800", "--out", "out"], tmp_path)
    staging = lambda: [p for p in tmp_path.iterdir() if p.name.startswith(STAGING_PREFIX)]  # noqa: E731
    _wait_for(lambda: any(any(s.iterdir()) for s in staging()), proc)  # files being written
    kids = _send(proc, sig)
    _check_ended(proc, kids, code, sig)
    assert not staging()
    assert [p.name for p in out.iterdir()] == ["summary.json"]
    assert (out / "summary.json").read_text() == '{"previous": true}'


@pytest.mark.parametrize("sig, code", SIGNALS)
def test_sweep_interrupted_ends_its_workers(tmp_path, sig, code):
    from simulator.scenario.loading import builtin_scenarios

    base = str(builtin_scenarios()["deepseek-v3-2048xh800"])
    sweep = {"base": base, "grid": {"training.seq_len": [1024, 2048, 4096, 8192]}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep))
    proc = _start(["sweep", "s.yaml", "--out", "o", "--jobs", "2", "--no-progress"], tmp_path)
    _wait_for(lambda: len(_children(proc.pid)) >= 2, proc)  # the two workers have started
    time.sleep(0.3)  # and are simulating
    kids = _send(proc, sig)
    assert len(kids) >= 2
    _check_ended(proc, kids, code, sig)
    assert not (tmp_path / "o" / "rows.jsonl").exists() or (tmp_path / "o" / "rows.jsonl").read_text().endswith("\n")


@pytest.mark.parametrize(
    "executor", ["concurrent.futures:ThreadPoolExecutor", "concurrent.futures:ProcessPoolExecutor"]
)
def test_sweep_on_a_given_executor_does_not_wait_for_its_cases(tmp_path, executor):
    from simulator.scenario.loading import builtin_scenarios

    base = str(builtin_scenarios()["deepseek-v3-2048xh800"])
    sweep = {"base": base, "grid": {"training.seq_len": [1024, 2048, 4096, 8192]}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep))
    argv = ["sweep", "s.yaml", "--out", "o", "--jobs", "2", "--no-progress", "--executor", executor]
    proc = _start(argv, tmp_path)
    if "Process" in executor:
        _wait_for(lambda: len(_children(proc.pid)) >= 2, proc)
    else:
        _wait_for(lambda: (tmp_path / "o" / "sweep.json").exists(), proc)
    time.sleep(0.5)  # the cases are running (each takes seconds)
    t0 = time.monotonic()
    kids = _send(proc, signal.SIGTERM)
    _check_ended(proc, kids, EXIT_SIGTERM, signal.SIGTERM)
    assert time.monotonic() - t0 < 5, "waited for the running cases (each takes over 7 s)"


def test_handled_restores_the_handlers_and_maps_signals():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as e, handled():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler raises here
    assert e.value.exit_code == 143 and str(e.value) == "terminated (SIGTERM)"
    assert signal.getsignal(signal.SIGTERM) == before
    assert isinstance(e.value, KeyboardInterrupt)


def test_worker_pool_ends_its_workers_on_an_interrupt():
    from simulator.studies.workers import process_pool

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt), process_pool(2) as pool:
        futs = [pool.submit(time.sleep, 60) for _ in range(2)]
        while not all(f.running() for f in futs):
            time.sleep(0.01)
        procs = list(pool._processes.values())
        raise KeyboardInterrupt
    assert time.monotonic() - t0 < 20  # not the minute the tasks would take
    for p in procs:
        p.join(5)
        assert not p.is_alive()
