"""`stepsim import megatron`: Megatron-LM / NeMo argument lists to scenarios, checked
against the hand-written validation cases whose source publishes the arguments."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from simulator import simulate
from simulator.cli.app import main
from simulator.interop.megatron import import_megatron
from simulator.interop.megatron_args import parse_arg_text
from simulator.scenario.loading import load_scenario
from simulator.scenario.schema import ScenarioError

DATA = Path(__file__).parent / "data" / "megatron"
CASES = Path(__file__).resolve().parent.parent / "validation" / "narayanan2021"

# What the hand-written cases assume beyond the arguments (each listed by the importer
# as an assumption): Megatron-LM of 2021 had no fused attention (the cases' own note),
# and Narayanan's Table 1 gives V = 51,200 where Megatron pads GPT-2's 50,257 tokens to
# a multiple of 128 x tp (50,304 at tp = 1; 51,200 at tp = 8).
DOCUMENTED = {"training": {"flash_attention": False}}


def _case(name: str) -> dict:
    d = yaml.safe_load((CASES / f"narayanan21-{name}.yaml").read_text())
    d.pop("published")
    d.pop("assumptions")
    return d


def _imported(name: str) -> tuple[dict, object]:
    res = import_megatron((DATA / f"narayanan21-{name}.args").read_text(), "dgx-a100", name=f"narayanan21-{name}")
    sc = res.scenario
    sc["training"].update(DOCUMENTED["training"])
    return sc, res


def _same_scenario(a, b) -> None:
    ma = dataclasses.replace(a.model, name="", source="")
    mb = dataclasses.replace(b.model, name="", source="")
    assert ma == mb
    assert (a.layout, a.training, a.schedule, a.cluster) == (b.layout, b.training, b.schedule, b.cluster)


@pytest.mark.parametrize("name", ["18.4b", "39.1b", "76.1b"])
def test_tp8_rows_import_to_the_hand_written_case(name):
    """At tp = 8, Megatron's padded GPT-2 vocabulary is Table 1's 51,200: the imported
    scenario is the hand-written one, field for field, once flash attention is off."""
    sc, res = _imported(name)
    assert res.unmapped == []
    assert any("flash_attention = true" in a for a in res.assumptions)
    assert sc["model"]["vocab"] == 51200
    _same_scenario(load_scenario(sc), load_scenario(_case(name)))


def test_imported_18b_row_simulates_to_the_same_step():
    sc, _ = _imported("18.4b")
    assert simulate(sc).summary["step_time_s"] == simulate(_case("18.4b")).summary["step_time_s"]


def test_tp1_row_differs_only_by_the_padded_vocabulary():
    """1.7B at tp = 1: Megatron pads 50,257 to 50,304 (multiple of 128), the case uses
    Table 1's 51,200; with that one documented value set, the same step time."""
    sc, res = _imported("1.7b")
    assert sc["model"]["vocab"] == 50304
    assert any("50257 padded to a multiple of 128" in a for a in res.assumptions)
    sc["model"]["vocab"] = 51200
    assert simulate(sc).summary["step_time_s"] == pytest.approx(
        simulate(_case("1.7b")).summary["step_time_s"], rel=1e-12
    )


def test_mapping_of_a_modern_moe_argument_list():
    text = """
    torchrun --nnodes 2 --nproc_per_node 8 pretrain_gpt.py \\
      --num-layers 16 --hidden-size 2048 --num-attention-heads 16 \\
      --group-query-attention --num-query-groups 4 --ffn-hidden-size 8192 --swiglu \\
      --normalization RMSNorm --disable-bias-linear --untie-embeddings-and-output-weights \\
      --vocab-size 32001 --seq-length 4096 --micro-batch-size 1 --global-batch-size 64 \\
      --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --context-parallel-size 1 \\
      --num-layers-per-virtual-pipeline-stage 4 --expert-model-parallel-size 4 --num-experts 8 \\
      --moe-router-topk 2 --moe-ffn-hidden-size 1024 --sequence-parallel --use-distributed-optimizer \\
      --recompute-granularity selective --bf16 --overlap-grad-reduce --attention-backend flash \\
      --moe-aux-loss-coeff 0.01 --moe-z-loss-coeff 1e-3 --lr 3e-4
    """
    res = import_megatron(text, "dgx-h100")
    sc = res.scenario
    assert sc["model"] == {
        "name": "megatron-import-model",
        "layers": 16,
        "hidden": 2048,
        "heads": 16,
        "kv_heads": 4,
        "ffn": "swiglu",
        "ffn_hidden": 8192,
        "norm": "rmsnorm",
        "bias": False,
        "tied_embeddings": False,
        "vocab": 32256,  # 32001 padded to a multiple of 128 x 2
        "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 1024},
    }
    assert sc["parallel"] == {
        "tp": 2,
        "pp": 2,
        "cp": 1,
        "ep": 4,
        "etp": 2,
        "vpp": 2,
        "sequence_parallel": True,
        "zero": 1,
    }
    assert sc["schedule"] == "interleaved-1f1b"
    assert sc["training"] == {
        "seq_len": 4096,
        "micro_batch_size": 1,
        "global_batch_size": 64,
        "dtype": "bf16",
        "recompute": "selective",
        "overlap_grad_reduce": True,
        "overlap_param_gather": False,  # Megatron's default: no --overlap-param-gather
        "flash_attention": True,
        "moe_token_dispatcher": "allgather",  # Megatron-Core's default dispatcher
        "moe_expert_gemm": "per-expert",  # Megatron-Core runs one GEMM per local expert
        # no --moe-router-fusion / --moe-permute-fusion: Megatron-Core's unfused ops
        "moe_router_fusion": False,
        "moe_permute_fusion": False,
        "balance": "aux-loss-local",  # Megatron's default aux_loss at a coefficient above 0
    }
    assert sc["cluster"] == {"preset": "dgx-h100", "devices": 16}
    assert res.unmapped == ["--moe-z-loss-coeff 1e-3"]
    assert res.ignored == ["--lr 3e-4"]
    load_scenario(sc)


def test_nemo_overrides_and_swiglu_default_width():
    text = (
        "trainer.num_nodes=1 trainer.devices=8 trainer.precision=bf16-mixed model.num_layers=4 "
        "model.hidden_size=4096 model.num_attention_heads=32 model.encoder_seq_length=2048 "
        "model.micro_batch_size=1 model.global_batch_size=8 model.tensor_model_parallel_size=2 "
        "model.sequence_parallel=True model.activation=fast-swiglu --swiglu --vocab-size 32000"
    )
    res = import_megatron(text, "dgx-h100")
    sc = res.scenario
    assert sc["model"]["ffn_hidden"] == 10880  # int(4 * 4096 * 2 / 3 / 64) * 64, Megatron's --swiglu default
    assert sc["parallel"]["tp"] == 2 and sc["parallel"]["sequence_parallel"] is True
    assert sc["cluster"]["devices"] == 8 and sc["training"]["dtype"] == "bf16"
    assert "--activation fast-swiglu" in res.unmapped


def test_argument_file_parsing():
    args = parse_arg_text("# comment\npython -u pretrain_gpt.py --a 1 \\\n  --flag --b=x --c 1 2\n")
    assert args == {"a": "1", "flag": None, "b": "x", "c": "1 2"}


def test_missing_devices_and_vocab_are_named():
    with pytest.raises(ScenarioError, match="--devices"):
        import_megatron(
            "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 8 "
            "--micro-batch-size 1 --vocab-size 100",
            "dgx-h100",
        )
    with pytest.raises(ScenarioError, match="--vocab-size"):
        import_megatron(
            "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 8 --micro-batch-size 1 --num-gpus 8",
            "dgx-h100",
        )
    # --data-parallel-size gives the devices: tp * pp * cp * dp
    res = import_megatron(
        "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 8 --micro-batch-size 1"
        " --vocab-size 128 --tensor-model-parallel-size 2 --data-parallel-size 4",
        "dgx-h100",
    )
    assert res.scenario["cluster"]["devices"] == 8


def test_cli_writes_yaml_with_the_lists(tmp_path, capsys):
    out = tmp_path / "s.yaml"
    args = tmp_path / "a.args"
    args.write_text((DATA / "narayanan21-18.4b.args").read_text() + " --moe-z-loss-coeff 0.001\n")
    assert main(["import", "megatron", str(args), "--cluster", "dgx-a100", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "not mapped (check by hand): --moe-z-loss-coeff 0.001" in printed
    text = out.read_text()
    assert text.startswith("# Imported by `stepsim import megatron`")
    assert (
        "#   --moe-z-loss-coeff 0.001" in text and "# Ignored (no effect on the time of one step): --data-path" in text
    )
    assert main(["run", str(out), "--json"]) == 0
    assert main(["import", "megatron", str(args), "--cluster", "no-such-cluster"]) == 2
    assert "cluster" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, expected",
    [
        ("", {}),
        ("--cuda-graph-impl local", {"cuda_graphs": "per-layer"}),
        ("--cuda-graph-impl transformer_engine", {"cuda_graphs": "per-layer"}),
        ("--enable-cuda-graph", {"cuda_graphs": "per-layer"}),
        (
            "--cuda-graph-impl full_iteration --moe-pad-expert-input-to-capacity",
            {"cuda_graphs": "full", "moe_host_sync": False},
        ),
        ("--moe-shared-expert-overlap", {"moe_shared_expert_overlap": True}),
        ("--tp-comm-overlap", {"tp_comm_overlap": True}),
    ],
)
def test_host_side_arguments_round_trip(extra, expected):
    """The host-side arguments land on their scenario keys, the scenario loads with them and
    a missing argument leaves Megatron's default (eager, dropless with a host sync, no
    shared-expert or TP communication overlap)."""
    text = (
        "pretrain_gpt.py --num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 1024 --vocab-size 32000 "
        "--micro-batch-size 1 --global-batch-size 16 --num-experts 8 --moe-router-topk 2 "
        "--moe-shared-expert-intermediate-size 4096 --expert-model-parallel-size 8 --data-parallel-size 8 "
        "--moe-token-dispatcher-type alltoall " + extra  # the shared-expert overlap and padding need it
    )
    res = import_megatron(text, "dgx-h100")
    tr = res.scenario["training"]
    for key in ("cuda_graphs", "moe_host_sync", "moe_shared_expert_overlap", "tp_comm_overlap"):
        assert tr.get(key) == expected.get(key), key
    assert not [u for u in res.unmapped if "graph" in u or "overlap" in u or "capacity" in u]
    spec = load_scenario(res.scenario).training
    assert spec.cuda_graphs == expected.get("cuda_graphs", "none")
    assert spec.moe_host_sync == expected.get("moe_host_sync", True)
    assert spec.moe_shared_expert_overlap == expected.get("moe_shared_expert_overlap", False)
    assert spec.tp_comm_overlap == expected.get("tp_comm_overlap", False)
