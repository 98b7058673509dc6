"""``stepsim export megatron SCENARIO`` (simulator/interop/export_megatron.py): the launch line
of a scenario, read back by ``stepsim import megatron`` to the same scenario (issue 43)."""

from __future__ import annotations

import pytest

from simulator.cli.app import main
from simulator.interop.export_megatron import export_megatron
from simulator.interop.megatron import import_megatron
from simulator.scenario.loading import builtin_scenarios, load_scenario
from simulator.scenario.schema import ScenarioError
from simulator.scenario.serialise import scenario_to_dict

#: What a launch line does not carry: names, and stepsim's model of which activations a
#: framework keeps (training.activation_saving), which is not an argument of Megatron's.
NOT_LAUNCH = {"name", "model.name", "model.source", "training.activation_saving"}


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        elif key not in NOT_LAUNCH:
            out[key] = v
    return out


def _resolved(sc) -> dict:
    d = _flat(scenario_to_dict(sc))
    d["parallel.pipeline_layers"] = sc.layout.layers_per_chunk(sc.model.layers)  # "auto" resolved
    return d


GPU_BUILTINS = [n for n in builtin_scenarios() if load_scenario(n).cluster.chip.family != "tpu"]


@pytest.mark.parametrize("name", GPU_BUILTINS)
def test_export_then_import_gives_the_same_scenario(name):
    sc = load_scenario(name)
    if sc.schedule == "dualpipe":  # Megatron-LM has no DualPipe
        with pytest.raises(ScenarioError, match="Megatron-LM runs 1f1b and interleaved-1f1b only") as e:
            export_megatron(sc)
        assert e.value.field == "schedule"
        return
    text = export_megatron(sc)
    res = import_megatron(text, sc.cluster.name, name=sc.name)
    back = load_scenario(res.scenario)
    a, b = _resolved(sc), _resolved(back)
    assert {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)} == {}


def test_the_placement_travels_as_slurms_segment():
    text = export_megatron(load_scenario("deepseek-v3-2304xgb200"))
    assert "srun --segment=16 torchrun --nnodes 576 --nproc-per-node 4" in text


def test_the_command_prints_and_writes(tmp_path, capsys):
    out = tmp_path / "launch.sh"
    assert main(["export", "megatron", "quickstart", "--out", str(out)]) == 0
    assert "--tensor-model-parallel-size 4" in out.read_text()
    assert main(["export", "megatron", "deepseek-v3-2048xh800"]) == 2
    assert "schedule" in capsys.readouterr().err


def test_the_userbuffers_sm_counts_travel_as_the_cfg_file_in_a_comment():
    """``training.tp_comm_overlap_sms`` has no argument of its own: Megatron reads TE's ub_cfgs
    from the YAML file ``--tp-comm-overlap-cfg`` names (megatron/training/arguments.py at
    d98e8a64), so the launch line names the file and a comment gives its contents. The
    import lists the file's argument as not mapped (it reads no file)."""
    sc = load_scenario("validation/dgxc/dgxc-gpt3-175b-128xh100.yaml")
    text = export_megatron(sc)
    assert "  --tp-comm-overlap \\\n  --tp-comm-overlap-cfg tp_comm_overlap_cfg.yaml" in text
    assert "# tp_comm_overlap_cfg.yaml (training.tp_comm_overlap_sms): {fc1_dgrad: {num_sm: 2}," in text
    assert "proj_fprop: {num_sm: 24}, qkv_dgrad: {num_sm: 4}, qkv_wgrad: {num_sm: 8}}" in text
    res = import_megatron(text, sc.cluster.name, name=sc.name)
    assert "tp-comm-overlap-cfg" in " ".join(res.unmapped)
    assert load_scenario(res.scenario).training.tp_comm_overlap
