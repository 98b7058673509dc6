"""Hostile and mistaken input (issue 14 item 5): the corpus in tests/hostile/.

tests/hostile/cases.yaml lists every case (written by tests/hostile/make_corpus.py)
with its expected outcome: exit 2 and a one-line message containing each listed
substring (the field or the file at fault) -- never a traceback (exit 1), a hang
or more than 2 GB. Every case runs through the command line in this process; the
ones marked ``subprocess`` (memory blow-ups in the past: /dev/zero, alias bombs,
``layers: 40000``, deep nesting) also run in a child process limited to 2 GB of
address space (RLIMIT_AS) and 120 s.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simulator.cli.app import main
from simulator.scenario.schema import ScenarioError

HERE = Path(__file__).resolve().parent / "hostile"
FILES = HERE / "files"
CASES = yaml.safe_load((HERE / "cases.yaml").read_text())
ROOT = HERE.parent.parent
LIMIT_AS_BYTES = 2 * 2**30
TIMEOUT_S = 120


def _argv(spec: dict, out: Path) -> list[str]:
    args = spec.get("args", ["run", "{file}"])
    file = str(FILES / spec["file"]) if "file" in spec else ""
    return [a.replace("{file}", file).replace("{dir}", str(FILES)).replace("{out}", str(out)) for a in args]


def _check(name: str, spec: dict, code: int, err: str) -> None:
    assert code == spec["exit"], f"{name}: exit {code}, expected {spec['exit']}; stderr: {err}"
    assert "Traceback" not in err, f"{name}: traceback\n{err}"
    lines = [x for x in err.strip().splitlines() if x]
    assert len(lines) == 1 and lines[0].startswith("stepsim: error:"), f"{name}: {err}"
    for s in spec["msg"]:
        assert s in lines[0], f"{name}: {s!r} not in {lines[0]!r}"


def test_corpus_is_large_and_every_case_has_an_outcome():
    assert len(CASES) >= 100
    for name, spec in CASES.items():
        assert spec["exit"] == 2 and spec["msg"], name
        assert "file" not in spec or (FILES / spec["file"]).is_file(), name


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_input_in_process(name, tmp_path, capsys, monkeypatch):
    spec = CASES[name]
    monkeypatch.chdir(tmp_path)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIMEOUT_S)
    try:
        code = main(_argv(spec, tmp_path / "out"))
    except _Hang:
        raise AssertionError(f"{name}: no answer within {TIMEOUT_S} s") from None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    _check(name, spec, code, capsys.readouterr().err)


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_AS_BYTES, LIMIT_AS_BYTES))


SUBPROCESS_CASES = [n for n, s in CASES.items() if s.get("subprocess")]


def test_some_cases_run_in_a_subprocess():
    assert len(SUBPROCESS_CASES) >= 5


@pytest.mark.slow
@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_hostile_input_under_2gb(name, tmp_path):
    spec = CASES[name]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    env.pop("STEPSIM_DEBUG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "simulator.cli", *_argv(spec, tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        preexec_fn=_limit,
        cwd=tmp_path,
        env=env,
    )
    _check(name, spec, proc.returncode, proc.stderr)


_LONG = "x" * 300  # longer than a file name may be (255 bytes on Linux file systems)


@pytest.mark.parametrize(
    "argv, named",
    [
        (["run", _LONG], "cannot read scenario file"),
        (["run", "quickstart", "--out", "{tmp}/" + _LONG], "--out"),
        (["run", "quickstart", "--trace", "{tmp}/" + _LONG], "cannot read trace file"),
        (["sweep", _LONG + ".yaml", "--out", "{tmp}/sw"], "cannot read sweep file"),
        (["report", "{tmp}/" + _LONG], "report:"),
        (["validate", "--suite", "{tmp}/" + _LONG], "--suite"),
        (["ppmap", _LONG + ".yaml", "--out", "{tmp}/pm"], "cannot read map file"),
        (["topology", "{tmp}/" + _LONG + ".json"], "File name too long"),
    ],
)
def test_a_name_longer_than_the_file_system_allows_is_refused_by_name(argv, named, tmp_path, capsys):
    """A path the operating system refuses to look up (ENAMETOOLONG) is refused like a missing
    file, naming the flag or the file it was given as -- not by the last-resort handler's bare
    "[Errno 36]"; the sweep API raises a ScenarioError naming ``base``."""
    from simulator.studies.sweep.spec import load_sweep

    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    lines = [x for x in err.strip().splitlines() if x]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("stepsim: error:"), err
    assert named in lines[0] and "[Errno" not in lines[0], lines[0]
    with pytest.raises(ScenarioError, match="File name too long"):
        load_sweep({"base": _LONG, "grid": {"training.seq_len": [1]}})
