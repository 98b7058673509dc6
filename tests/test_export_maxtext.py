"""``stepsim export maxtext SCENARIO`` (simulator/interop/export_maxtext.py): the MaxText
configuration of a scenario, its mesh and batch checked against the scenario (issue 43)."""

from __future__ import annotations

import pytest
import yaml

from simulator.cli.app import main
from simulator.interop.export_maxtext import export_maxtext
from simulator.scenario.loading import load_scenario
from simulator.scenario.schema import ScenarioError


def _cfg(sc) -> dict:
    return yaml.safe_load(export_maxtext(sc))


@pytest.mark.parametrize(
    "scenario",
    [
        "deepseek-v3-2048xtpu-v5p",
        {
            "model": "llama3-8b",
            "cluster": {"preset": "tpu-v6e", "devices": 512},
            "parallel": {"tp": 4, "dp": 128, "zero": 3},
            "training": {"global_batch_size": 512, "dtype": "bf16"},
        },
    ],
)
def test_the_mesh_covers_the_devices_and_the_batch_is_the_scenarios(scenario):
    sc = load_scenario(scenario)
    cfg = _cfg(sc)
    mesh = 1
    for k, v in cfg.items():
        if k.endswith("_parallelism"):
            mesh *= v
    assert mesh == sc.layout.world
    assert cfg["per_device_batch_size"] * sc.layout.world * cfg["gradient_accumulation_steps"] == pytest.approx(
        sc.training.global_batch_size
    )
    assert cfg["base_num_decoder_layers"] == sc.model.layers and cfg["max_target_length"] == sc.training.seq_len
    if sc.model.moe is not None:
        assert cfg["ici_expert_parallelism"] == sc.layout.ep and cfg["num_experts"] == sc.model.moe.experts


def test_what_maxtext_cannot_run_is_refused(capsys):
    with pytest.raises(ScenarioError, match="MaxText's pipeline") as e:
        export_maxtext(load_scenario("deepseek-v3-2048xh800"))
    assert e.value.field == "schedule"
    assert main(["export", "maxtext", "deepseek-v3-2048xtpu-v5p"]) == 0
    assert "ici_expert_parallelism: 64" in capsys.readouterr().out
