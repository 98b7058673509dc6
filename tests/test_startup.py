"""Start-up stays light: ``import simulator``, ``stepsim --help`` / ``--version`` and a
whole ``stepsim run --out`` load neither pandas nor (until a figure is drawn) matplotlib.

Behavioural checks (which modules a fresh interpreter holds afterwards), not timings:
the timings are in ``benchmarks/bench_io.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("pandas", "matplotlib", "plotly", "simpy", "scipy", "pydantic")


def _loaded_after(code: str) -> set[str]:
    """The heavy top-level modules a fresh interpreter has loaded after running ``code``."""
    probe = code + f"\nimport sys, json\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT, env=env, timeout=300
    ).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


def test_import_simulator_loads_no_heavy_library():
    assert _loaded_after("import simulator") == set()


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_cli_help_and_version_load_no_heavy_library(flag):
    # argparse exits after printing; main() returns its code
    assert _loaded_after(f"from simulator.cli.app import main\nmain([{flag!r}])") == set()


def test_public_names_still_import_and_load_on_use():
    loaded = _loaded_after(
        "from simulator import Result, Scenario, ScenarioError, load_scenario, simulate\n"
        "import simulator\nassert simulator.simulate is simulate and callable(simulate)\n"
        "assert issubclass(ScenarioError, ValueError) and 'Scenario' in dir(simulator)"
    )
    assert "pydantic" in loaded and not loaded & {"pandas", "matplotlib"}


@pytest.mark.slow
def test_simulate_reads_the_summary_without_pandas_or_matplotlib():
    loaded = _loaded_after("from simulator import simulate\nr = simulate('quickstart')\nassert r.summary['mfu'] > 0")
    assert "simpy" in loaded and not loaded & {"pandas", "matplotlib"}


@pytest.mark.slow
def test_run_out_writes_every_file_without_pandas(tmp_path):
    out = tmp_path / "q"
    loaded = _loaded_after(
        f"from simulator.cli.app import main\nassert main(['run', 'quickstart', '--out', {str(out)!r}]) == 0"
    )
    # matplotlib is loaded where the figures are drawn: here, or in the child that
    # Result.write forks for them (simulator.results.beside)
    assert "pandas" not in loaded
    assert {p.name for p in out.iterdir()} >= {
        "summary.json",
        "scenario.json",
        "trace.json",
        "events.csv",
        "events.parquet",
        "memory.csv",
        "idle.csv",
        "timeline.png",
        "memory.png",
    }


@pytest.mark.slow
def test_tables_load_pandas_when_asked_for():
    loaded = _loaded_after(
        "from simulator import simulate\nr = simulate('quickstart')\n"
        "assert len(r.events) and len(r.memory) and len(r.per_stage) and r.idle is not None"
    )
    assert "pandas" in loaded
