"""The command line: outputs, presets, bad input (exit 2, one message, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
import yaml
from helpers import scenario

from simulator.cli.app import main


def _write(tmp_path, data, name="s.yaml"):
    p = tmp_path / name
    if name.endswith(".json"):
        p.write_text(json.dumps(data))
    else:
        p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.slow
def test_run_writes_every_output(tmp_path, capsys):
    sc = _write(tmp_path, scenario(parallel={"tp": 2, "pp": 2, "dp": 2}))
    out = tmp_path / "out"
    assert main(["run", str(sc), "--out", str(out)]) == 0
    for f in ("summary.json", "trace.json", "timeline.png", "memory.png", "events.csv", "events.parquet", "memory.csv"):
        assert (out / f).stat().st_size > 0, f
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schema_version"] == 1 and summary["devices"] == 8
    # The version that wrote the outputs: in summary.json and in events.parquet's key-value metadata.
    import simulator
    from simulator.results.parquet import read_metadata

    assert summary["stepsim_version"] == simulator.__version__
    assert read_metadata(out / "events.parquet") == {"stepsim_version": simulator.__version__}
    events, events_csv = pd.read_parquet(out / "events.parquet"), pd.read_csv(out / "events.csv")
    assert list(events.columns) == list(events_csv.columns) and len(events) == len(events_csv) > 0
    assert list(events["end_s"]) == list(events_csv["end_s"])
    trace = json.loads((out / "trace.json").read_text())
    phs = {e["ph"] for e in trace["traceEvents"]}
    assert {"X", "M", "C"} <= phs
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "compute" in names
    text = capsys.readouterr().out
    assert "MFU" in text and "step time" in text


def test_reproducible_summary_json_is_byte_identical(tmp_path):
    sc = _write(tmp_path, scenario(parallel={"tp": 2, "pp": 2, "dp": 2}))
    for d in ("a", "b"):
        assert main(["run", str(sc), "--out", str(tmp_path / d), "--no-plots", "--reproducible"]) == 0
    assert (tmp_path / "a" / "summary.json").read_bytes() == (tmp_path / "b" / "summary.json").read_bytes()


def test_json_scenarios_and_builtin_names(tmp_path, capsys):
    sc = _write(tmp_path, scenario(), "s.json")
    assert main(["run", str(sc), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "tiny"


def test_presets_lists_everything(capsys):
    assert main(["presets", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for c in (
        "dgx-a100",
        "dgx-h100",
        "h800",
        "dgx-b200",
        "gb200-nvl72",
        "tpu-v4",
        "tpu-v5e",
        "tpu-v5p",
        "tpu-v6e",
        "tpu-v7",
    ):
        assert c in data["clusters"]
    for chip in ("a100", "h100", "h800", "h200", "b200", "gb200", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-v7"):
        assert chip in data["chips"]
    assert "quickstart" in data["scenarios"]
    assert main(["presets"]) == 0


def _bad(tmp_path, data, name="bad.yaml"):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


BAD_CASES = [
    ("malformed", "model: [unclosed\n", ""),
    ("unknown key", scenario(extra_key=1), "extra_key"),
    ("unknown model preset", scenario(model="gpt-9000"), "model"),
    ("unknown cluster preset", scenario(cluster={"preset": "dgx-z900"}), "cluster.preset"),
    ("wrong type", scenario(parallel={"tp": "eight"}), "parallel.tp"),
    ("layout does not fill devices", scenario(parallel={"tp": 2, "pp": 2, "dp": 3}), "parallel"),
    (
        "layers do not split",
        scenario(parallel={"tp": 1, "pp": 3, "dp": 1}, cluster={"preset": "dgx-h100", "devices": 3}),
        "parallel.pp",
    ),
    (
        "micro-batches do not divide",
        scenario(training={"seq_len": 1024, "micro_batch_size": 3, "global_batch_size": 16}),
        "training.micro_batch_size",
    ),
    ("bad schedule", scenario(schedule="2f2b"), "schedule"),
    ("bad zero", scenario(parallel={"tp": 1, "pp": 1, "dp": 8, "zero": 5}), "parallel.zero"),
    (
        "negative bandwidth",
        scenario(cluster={"preset": "dgx-h100", "devices": 8, "network": {"nic_bw_bytes_per_s": -1}}),
        "cluster.network.nic_bw_bytes_per_s",
    ),
    (
        "devices don't fit domains",
        scenario(cluster={"preset": "dgx-h100", "devices": 13}, parallel={"tp": 1, "pp": 1, "dp": 13}),
        "cluster.devices",
    ),
    ("not a mapping", "- 1\n- 2\n", ""),
]


@pytest.mark.parametrize("label,data,field", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_input_exits_2_with_one_message(tmp_path, capsys, label, data, field):
    p = _bad(tmp_path, data)
    assert main(["run", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("stepsim: error:"), err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert field in err


def test_missing_file_and_unknown_builtin(capsys):
    assert main(["run", "/nonexistent/scenario.yaml"]) == 2
    assert "built-in" in capsys.readouterr().err


def test_disconnected_network_is_refused(tmp_path, capsys):
    sc = scenario(
        cluster={"preset": "dgx-h100", "devices": 16},
        parallel={"tp": 1, "pp": 1, "dp": 16},
        perturbations=[{"link": ["d0", "p0.nvsw0"], "failed": True}, {"link": ["d0", "p0.leaf0.r0"], "failed": True}],
    )
    p = _write(tmp_path, sc)
    code = main(["run", str(p)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "perturbations" in err and "Traceback" not in err


@pytest.mark.slow
def test_console_script_entry_point(tmp_path):
    sc = _write(tmp_path, scenario())
    r = subprocess.run(
        [sys.executable, "-m", "simulator.cli", "run", str(sc), "--json"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    bad = _bad(tmp_path, scenario(parallel={"tp": 3}))
    r = subprocess.run([sys.executable, "-m", "simulator.cli", "run", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "parallel" in r.stderr


def test_resolved_scenario_round_trips(tmp_path):
    from simulator.scenario.loading import load_scenario
    from simulator.scenario.serialise import scenario_to_dict

    sc = scenario(
        parallel={"tp": 2, "pp": 2, "dp": 2},
        training={
            "seq_len": 1024,
            "micro_batch_size": 1,
            "global_batch_size": 16,
            "offload": {"optimizer": True},
            "expert_load": None,
        },
    )
    a = load_scenario(sc)
    b = load_scenario(scenario_to_dict(a))
    assert scenario_to_dict(a) == scenario_to_dict(b)
    assert b.training.offload_optimizer


def test_version_and_exit_codes_in_help(capsys):
    import simulator

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"stepsim {simulator.__version__}"
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "exit codes: 0 success, 1 internal error, 2 bad input, 3 validate --max-error exceeded, "
        "4 some cases of a sweep, search or validate failed" in text
    )


def test_docs_name_every_builtin_scenario_and_table_column():
    # docs/usage.md's list of built-in scenarios and docs/formats.md's column tables must not go stale.
    from pathlib import Path

    from simulator.results.result import EVENT_COLUMNS
    from simulator.scenario.loading import builtin_scenarios
    from workloads.trace.ops import MEMORY_CATEGORIES, STREAMS

    root = Path(__file__).resolve().parent.parent
    usage = root.joinpath("docs", "usage.md").read_text()
    assert [name for name in builtin_scenarios() if f"`{name}`" not in usage] == []
    formats = root.joinpath("docs", "formats.md").read_text()
    events = formats[formats.index("## Events table") : formats.index("## Memory table")]
    memory = formats[formats.index("## Memory table") : formats.index("## Chrome trace")]
    for col in EVENT_COLUMNS:
        assert f"`{col}`" in events, col
    for s in STREAMS:
        assert f"`{s}`" in events, s
    for col in ("rank", "stage", "time_s", *MEMORY_CATEGORIES, "total"):
        assert f"`{col}`" in memory, col
    assert "`stepsim_version`" in root.joinpath("docs", "scenario.md").read_text()


@pytest.mark.parametrize("command", ["run", "trace"])
def test_console_quick_exit_flushes_everything_first(command, tmp_path):
    # `stepsim run` / `trace` end with os._exit: the output must be complete all the same
    args = (
        ["run", "quickstart", "--json"]
        if command == "run"
        else ["trace", "quickstart", "--out", str(tmp_path / "t.json")]
    )
    p = subprocess.run([sys.executable, "-m", "simulator.cli", *args], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    if args[0] == "run":
        assert json.loads(p.stdout)["name"].startswith("quickstart")
    else:
        assert (tmp_path / "t.json").stat().st_size > 0


def test_console_quick_exit_keeps_the_exit_code_of_bad_input():
    p = subprocess.run(
        [sys.executable, "-m", "simulator.cli", "run", "no-such-scenario"], capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 2
    assert p.stderr.startswith("stepsim: error:") and "Traceback" not in p.stderr
