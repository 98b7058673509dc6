"""``stepsim explain A B`` (simulator/results/explain.py): a step's causes add up to its time,
and two steps' differences by cause add up to the difference of their times (issue 43)."""

from __future__ import annotations

import itertools
import json

import pytest

from simulator import simulate
from simulator.cli.app import main
from simulator.results.explain import CLASSES, causes, explain
from simulator.scenario.loading import load_scenario
from simulator.scenario.serialise import scenario_to_dict

#: Built-ins that simulate in about a second (the TPU v5p one takes a minute: benchmarks/).
FAST = [
    "quickstart",
    "schedules-llama3-8b-16xh100",
    "llama3-70b-64xh100",
    "deepseek-v3-2304xgb200",
    "kimi-k2-4096xh800",
    "deepseek-v3-2048xh800",
]


@pytest.fixture(scope="module")
def runs():
    return {name: simulate(name) for name in FAST}


def test_causes_add_up_to_the_step(runs):
    for name, res in runs.items():
        c = causes(res)
        assert sum(c.values()) == pytest.approx(res.summary["step_time_s"], rel=1e-9), name
        assert all(v >= 0 for v in c.values()), name
        assert set(k for k in c if k.startswith("compute: ")) == {f"compute: {k}" for k in CLASSES}


def test_every_pair_of_built_ins_is_explained_exactly(runs):
    each = {name: causes(res) for name, res in runs.items()}
    for a, b in itertools.permutations(FAST, 2):
        rows = explain(each[a], each[b])
        diff = runs[b].summary["step_time_s"] - runs[a].summary["step_time_s"]
        assert sum(r[3] for r in rows) == pytest.approx(diff, rel=1e-9, abs=1e-12), (a, b)


def test_moe_steps_show_their_expert_and_moe_kernels(runs):
    c = causes(runs["deepseek-v3-2304xgb200"])
    assert c["compute: expert GEMMs"] > 0 and c["compute: MoE kernels"] > 0 and c["exposed ep"] > 0
    assert causes(runs["quickstart"])["compute: expert GEMMs"] == 0


def test_a_slower_nic_moves_only_idle_time():
    """The same step with a quarter of the NIC bandwidth: the compute by class is unchanged
    and the difference is all bubble and exposed communication."""
    m = scenario_to_dict(load_scenario("quickstart"))
    slow = json.loads(json.dumps(m))
    slow["cluster"]["network"]["nic_bw_bytes_per_s"] /= 4
    rows = explain(causes(simulate(m)), causes(simulate(slow)))
    for k, _, _, d in rows:
        if k.startswith("compute: "):
            assert d == pytest.approx(0.0, abs=1e-9), k
    assert any(k.startswith(("exposed", "bubble")) and abs(d) > 1e-4 for k, _, _, d in rows)


def test_the_command_writes_the_table_and_the_waterfall(tmp_path, capsys):
    out = tmp_path / "ex"
    assert main(["explain", "quickstart", "schedules-llama3-8b-16xh100", "--out", str(out), "--html"]) == 0
    text = capsys.readouterr().out
    assert "bubble" in text and "step" in text and "explain.html" in text
    page = (out / "explain.html").read_text()
    assert '"type":"waterfall"' in page and "Why " in page
    doc = json.loads((out / "explain.json").read_text())
    steps = doc["step_time_s"]
    assert sum(c["delta_s"] for c in doc["causes"]) == pytest.approx(steps["b"] - steps["a"], rel=1e-9)
    assert (out / "explain.png").stat().st_size > 10_000 and (out / "explain.csv").exists()
    assert main(["explain", "quickstart", "no-such-scenario"]) == 2
    assert main(["explain", "quickstart", "quickstart", "--html"]) == 2  # --html needs --out
    # a re-run without --html leaves no stale page behind
    assert main(["explain", "quickstart", "schedules-llama3-8b-16xh100", "--out", str(out)]) == 0
    assert not (out / "explain.html").exists()


def test_compare_explains_every_schedule_against_the_first():
    from simulator.results.explain import explain_pairs
    from simulator.studies.compare import compare_schedules

    table, results = compare_schedules("schedules-llama3-8b-16xh100", ["1f1b", "zb-h1", "dualpipe"])
    pairs = explain_pairs(results)
    assert set(pairs["schedule"]) == {"zb-h1", "dualpipe"} and set(pairs["against"]) == {"1f1b"}
    steps = table.set_index("schedule")["step_time_s"]
    for name, part in pairs.groupby("schedule"):
        assert part["delta_s"].sum() == pytest.approx(steps[name] - steps["1f1b"], rel=1e-9)
