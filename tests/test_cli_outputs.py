"""The command line's outputs and flags (issue 41): folders written whole or not at all, output
paths checked before simulating, numeric flags finite and in range, work estimates refused
before work starts, clean messages for unusable executors, matplotlib backends and
terminal encodings, and the sweep's messages."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import scenario

from simulator.cli.app import main
from simulator.results.outdir import STAGING_PREFIX, OutputPathError, check_output_file, staged_dir

ROOT = Path(__file__).resolve().parent.parent
QUICK = scenario()  # 8 devices, a fraction of a second


def _write(tmp_path: Path, data: dict, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return p


def _staging(where: Path) -> list[Path]:
    return [p for p in where.rglob("*") if p.name.startswith(STAGING_PREFIX)]


def _no_simulation(monkeypatch):
    """Make simulating fail loudly: a check that must come first is then seen to."""
    import simulator

    def boom(*a, **k):
        raise AssertionError("simulated although an output path was bad")

    monkeypatch.setattr(simulator, "simulate", boom)


# ---- the staging folder ---------------------------------------------------------------------


def test_staged_dir_new_folder_appears_whole(tmp_path):
    dest = tmp_path / "a" / "b"
    with staged_dir(dest, ("x.txt",)) as tmp:
        (tmp / "x.txt").write_text("1")
        assert not dest.exists()  # nothing under the final name while writing
        assert tmp.name.startswith(STAGING_PREFIX) and tmp.parent == tmp_path
    assert (dest / "x.txt").read_text() == "1"
    assert not _staging(tmp_path)


def test_staged_dir_merge_removes_stale_outputs_and_keeps_foreign_files(tmp_path):
    dest = tmp_path / "d"
    dest.mkdir()
    for name in ("summary.json", "timeline.png", "notes.txt"):
        (dest / name).write_text("old")
    with staged_dir(dest, ("summary.json", "timeline.png", "memory.png")) as tmp:
        (tmp / "summary.json").write_text("new")
    assert sorted(p.name for p in dest.iterdir()) == ["notes.txt", "summary.json"]
    assert (dest / "summary.json").read_text() == "new" and (dest / "notes.txt").read_text() == "old"
    assert not _staging(tmp_path)


def test_staged_dir_failure_leaves_previous_contents(tmp_path):
    dest = tmp_path / "d"
    dest.mkdir()
    (dest / "summary.json").write_text("old")
    with pytest.raises(KeyboardInterrupt), staged_dir(dest, ("summary.json", "trace.json")) as tmp:
        (tmp / "summary.json").write_text("new")
        (tmp / "trace.json").write_text("[{")
        raise KeyboardInterrupt
    assert [p.name for p in dest.iterdir()] == ["summary.json"]
    assert (dest / "summary.json").read_text() == "old"
    assert not _staging(tmp_path)


def test_staged_dir_names_flag_and_path_on_a_write_error(tmp_path):
    with pytest.raises(OutputPathError) as e, staged_dir(tmp_path / "d", flag="--out"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert str(e.value).startswith("--out: ") and str(tmp_path / "d") in str(e.value)
    assert "No space left" in str(e.value) and not (tmp_path / "d").exists()


def test_staging_left_by_a_killed_process_is_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = tmp_path / f"{STAGING_PREFIX}{int(dead.stdout)}-d"
    left.mkdir()
    (left / "summary.json").write_text("half")
    with staged_dir(tmp_path / "d") as tmp:
        (tmp / "summary.json").write_text("whole")
    assert not left.exists() and (tmp_path / "d" / "summary.json").read_text() == "whole"


@pytest.mark.parametrize(
    "target, words",
    [("/dev/full", "not a regular file"), ("missing/x.json", "no folder missing"), (".", "is a folder")],
)
def test_check_output_file_refusals(tmp_path, monkeypatch, target, words):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputPathError, match=words) as e:
        check_output_file(target, "--perfetto")
    assert e.value.field == "--perfetto" and target in str(e.value)


# ---- stepsim run --out ------------------------------------------------------------------------


def test_rerun_with_no_plots_leaves_no_old_figures(tmp_path, capsys):
    sc, out = _write(tmp_path, QUICK), tmp_path / "out"
    assert main(["run", str(sc), "--out", str(out)]) == 0
    assert (out / "timeline.png").exists() and (out / "memory.png").exists()
    (out / "mine.txt").write_text("not stepsim's")
    assert main(["run", str(sc), "--out", str(out), "--no-plots"]) == 0
    names = {p.name for p in out.iterdir()}
    assert "timeline.png" not in names and "memory.png" not in names
    assert {"summary.json", "trace.json", "events.csv", "mine.txt"} <= names
    assert not _staging(tmp_path)


def test_failed_write_leaves_previous_run_untouched(tmp_path, capsys, monkeypatch):
    sc, out = _write(tmp_path, QUICK), tmp_path / "out"
    assert main(["run", str(sc), "--out", str(out), "--no-plots"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    from simulator.results import export

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(export, "write_csv", full)
    capsys.readouterr()
    assert main(["run", str(sc), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("stepsim: error: --out: ") and str(out) in err and "No space left" in err
    assert "\n" not in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not _staging(tmp_path)


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--out", "FILE"], "--out: FILE: exists and is a file"),
        (["--out", "FILE/sub"], "--out: FILE/sub: FILE is not a folder"),
        (["--out", "/dev/full"], "--out: /dev/full: exists and is not a folder"),
        (["--perfetto", "/dev/full"], "--perfetto: /dev/full: is not a regular file"),
        (["--out", "o", "--perfetto", "nodir/t.json"], "--perfetto: nodir/t.json: no folder nodir"),
        (["--perfetto", "."], "--perfetto: .: is a folder"),
        (["--out", "new", "--perfetto", "new"], "--perfetto: new is the --out folder"),
    ],
)
def test_output_paths_refused_before_simulating(tmp_path, capsys, monkeypatch, extra, words):
    sc = _write(tmp_path, QUICK)
    (tmp_path / "FILE").write_text("a file")
    monkeypatch.chdir(tmp_path)
    _no_simulation(monkeypatch)
    assert main(["run", str(sc), *extra]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    if extra[-1] == "nodir/t.json":
        assert not (tmp_path / "o").exists()  # --out is not written when --perfetto is refused


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_read_only_folder_refused(tmp_path, capsys, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    _no_simulation(monkeypatch)
    try:
        assert main(["run", str(_write(tmp_path, QUICK)), "--out", str(ro / "x")]) == 2
    finally:
        ro.chmod(0o700)
    assert "permission denied" in capsys.readouterr().err


def test_perfetto_inside_the_new_out_folder_is_allowed(tmp_path, capsys):
    sc, out = _write(tmp_path, QUICK), tmp_path / "new"
    assert main(["run", str(sc), "--out", str(out), "--no-plots", "--perfetto", str(out / "t.json.gz")]) == 0
    assert (out / "t.json.gz").read_bytes()[:2] == b"\x1f\x8b" and (out / "summary.json").exists()
    assert not _staging(tmp_path)


def test_compare_out_naming_a_file_refused_before_simulating(tmp_path, capsys, monkeypatch):
    (tmp_path / "f").write_text("x")
    from simulator.studies import compare

    monkeypatch.setattr(compare, "compare_schedules", lambda *a, **k: pytest.fail("simulated"))
    assert main(["compare", str(_write(tmp_path, QUICK)), "--out", str(tmp_path / "f")]) == 2
    assert "--out: " in capsys.readouterr().err


@pytest.mark.parametrize("command", ["sweep", "search"])
def test_sweep_and_search_out_naming_a_file_refused_before_work(tmp_path, capsys, command):
    (tmp_path / "f").write_text("x")
    source = str(_sweep_file(tmp_path)) if command == "sweep" else str(_write(tmp_path, QUICK))
    assert main([command, source, "--out", str(tmp_path / "f"), "--jobs", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"--out: {tmp_path / 'f'}: exists and is a file" in err and "Errno" not in err
    assert (tmp_path / "f").read_text() == "x"


# ---- stepsim report ---------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["NaN", "Infinity"])
def test_report_refuses_a_summary_with_non_finite_figures(tmp_path, capsys, bad):
    out = tmp_path / "out"
    assert main(["run", str(_write(tmp_path, QUICK)), "--out", str(out), "--no-plots"]) == 0
    text = (out / "summary.json").read_text()
    doc = json.loads(text)
    text = text.replace(f'"step_time_s": {json.dumps(doc["step_time_s"])}', f'"step_time_s": {bad}', 1)
    (out / "summary.json").write_text(text)
    capsys.readouterr()
    assert main(["report", str(out)]) == 2
    err = capsys.readouterr().err
    assert "summary.json" in err and "step_time_s" in err and "Traceback" not in err


# ---- numeric flags ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["validate", "--max-error", "nan"], "--max-error"),
        (["validate", "--max-error", "-1"], "--max-error"),
        (["validate", "--max-error", "inf"], "--max-error"),
        (["validate", "--jobs", "0"], "--jobs"),
        (["sweep", "x.yaml", "--out", "o", "--jobs", "100000"], "--jobs"),
        (["search", "quickstart", "--max-tp", "0"], "--max-tp"),
        (["search", "quickstart", "--top", "-1"], "--top"),
        (["search", "quickstart", "--max-candidates", "1e3"], "--max-candidates"),
        (["compare", "quickstart", "--vpp", "0"], "--vpp"),
        (["collective", "all-reduce", "--cluster", "dgx-h100", "--devices", "0"], "--devices"),
        (["collective", "all-reduce", "--cluster", "dgx-h100", "--devices", "10000000"], "--devices"),
        (["topology", "dgx-h100", "--devices", "-8"], "--devices"),
        (["calibrate", "--devices", "nan"], "--devices"),
    ],
)
def test_numeric_flags_finite_and_in_range(capsys, argv, flag):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and "Traceback" not in err


def test_device_flags_allow_the_largest_cluster_a_scenario_may_have():
    from simulator.cli.common import MAX_DEVICES_FLAG
    from simulator.scenario.checks import MAX_DEVICES

    assert MAX_DEVICES_FLAG == MAX_DEVICES


def test_estimate_margin_must_be_finite(capsys):
    assert main(["search", "quickstart", "--estimate-margin", "inf"]) == 2
    assert "--estimate-margin" in capsys.readouterr().err


def test_collective_work_refused_before_work_starts(capsys):
    t0 = time.perf_counter()
    assert main(["collective", "all-to-all", "--cluster", "dgx-h100", "--devices", "100000"]) == 2
    assert main(["collective", "all-to-all", "--cluster", "dgx-h100", "--devices", "2048"]) == 2
    assert main(["collective", "all-reduce", "--cluster", "dgx-h100", "--max-bytes", "2P"]) == 2
    assert time.perf_counter() - t0 < 5  # nothing built, nothing simulated
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("stepsim: error: --devices: an all-to-all over 100,000 devices")
    assert err[1].startswith("stepsim: error: --devices: all-to-all over 2,048 devices at 31 message sizes")
    assert "--max-bytes" in err[2] or "--min-bytes/--max-bytes" in err[2]
    # the same all-to-all over fewer sizes is within the budget
    assert main(["collective", "all-to-all", "--cluster", "dgx-h100", "--devices", "16", "--max-bytes", "1K"]) == 0


# ---- internal errors that are not -------------------------------------------------------------


def _sweep_file(tmp_path: Path, **extra) -> Path:
    spec = {"base": QUICK, "grid": {"schedule": ["1f1b", "gpipe"]}, **extra}
    return _write(tmp_path, spec, "sweep.yaml")


@pytest.mark.parametrize(
    "spec, words",
    [
        ("os:system", "calling os:system() failed"),
        ("concurrent.futures:Executor", "not a usable concurrent.futures.Executor"),
        ("os:sep", "not a callable"),
    ],
)
def test_executor_that_is_not_one_is_refused(tmp_path, capsys, spec, words):
    assert main(["sweep", str(_sweep_file(tmp_path)), "--out", str(tmp_path / "o"), "--executor", spec]) == 2
    err = capsys.readouterr().err
    assert "--executor: " in err and words in err and "internal error" not in err


@pytest.mark.parametrize("value, traceback", [("0", False), ("false", False), ("", False), ("1", True), ("yes", True)])
def test_stepsim_debug_needs_a_true_value(capsys, monkeypatch, value, traceback):
    from simulator.cli import app

    def bug(args):
        raise RuntimeError("a bug")

    monkeypatch.setenv("STEPSIM_DEBUG", value)
    monkeypatch.setattr(app, "cmd_presets", bug)
    assert main(["presets"]) == 1
    err = capsys.readouterr().err
    assert ("Traceback" in err) is traceback


def _subprocess(argv, tmp_path, **env):
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    full.pop("STEPSIM_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "simulator.cli", *argv], capture_output=True, cwd=tmp_path, env=full, timeout=120
    )


def test_bogus_mplbackend_falls_back_to_agg(tmp_path):
    r = _subprocess(["run", str(_write(tmp_path, QUICK)), "--out", "o"], tmp_path, MPLBACKEND="bogus")
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "MPLBACKEND='bogus'" in err and "Agg" in err and "Traceback" not in err
    assert (tmp_path / "o" / "timeline.png").stat().st_size > 0


def test_ascii_terminal_and_a_non_ascii_name(tmp_path):
    sc = _write(tmp_path, {**QUICK, "name": "Qüick ✓ 模型"})
    r = _subprocess(["run", str(sc)], tmp_path, PYTHONIOENCODING="ascii")
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode("ascii")  # every byte ASCII
    assert "Q\\xfcick \\u2713" in out


# ---- sweep messages ---------------------------------------------------------------------------


def test_sweep_keeping_no_case_says_so_and_writes_nothing(tmp_path, capsys):
    sw = _sweep_file(tmp_path, where="parallel.tp > 64")
    assert main(["sweep", str(sw), "--out", str(tmp_path / "o"), "--jobs", "1", "--no-progress"]) == 2
    cap = capsys.readouterr()
    assert "where: keeps none of the sweep's 2 cases" in cap.err and "wrote" not in cap.out
    assert not (tmp_path / "o").exists()


def test_resumed_sweep_says_it_reused_the_rows(tmp_path, capsys):
    sw, out = _sweep_file(tmp_path), tmp_path / "o"
    argv = ["sweep", str(sw), "--out", str(out), "--jobs", "1", "--no-progress"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "2 cases, 2 ok" in first and "reused" not in first
    assert main(argv) == 0
    assert "2 cases (0 run now, 2 reused from" in capsys.readouterr().out


# ---- stdout ------------------------------------------------------------------------------------


def test_stdout_on_a_full_disk_is_named(tmp_path):
    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [sys.executable, "-m", "simulator.cli", "presets", "--json"],
            stdout=full,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=60,
        )
    assert r.returncode == 2
    assert r.stderr.decode().strip() == "stepsim: error: stdout: cannot write: No space left on device"


def test_stdout_closed_by_its_reader_ends_quietly(capsys, monkeypatch):
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone, as after `| head -1`
    with open(write_end, "w") as stream:
        monkeypatch.setattr(sys, "stdout", stream)
        assert main(["presets", "--json"]) == 0
        monkeypatch.undo()
    assert capsys.readouterr().err == ""
