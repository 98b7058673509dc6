"""A validation case file runs as the scenario it holds (``stepsim run CASE``): the timeline
behind a row of ``stepsim validate`` can be reproduced from the command line."""

import json

import pytest
import yaml

from simulator.cli.app import main
from simulator.scenario.loading import load_scenario
from simulator.scenario.schema import ScenarioError
from simulator.studies.validate.cases import SUITE_DIR, load_case
from simulator.studies.validate.run import run_case

CASE = SUITE_DIR / "memory" / "zero2019-7.5b-64gpu-stage1.yaml"


def test_stepsim_run_on_a_case_file_gives_the_validated_figure(capsys):
    assert main(["run", str(CASE), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    validated = run_case(load_case(CASE))
    assert validated.case.metric == "model_state_bytes"
    assert summary["peak_model_state_bytes"] == validated.simulated
    assert summary["name"] == load_case(CASE).name


def test_only_a_case_file_may_carry_the_case_keys(tmp_path):
    data = yaml.safe_load(CASE.read_text())
    del data["published"]  # assumptions alone make it neither a case nor a scenario
    path = tmp_path / "stray.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ScenarioError, match="assumptions"):
        load_scenario(path)
