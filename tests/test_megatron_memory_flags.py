"""``stepsim import megatron`` maps Megatron-LM's memory flags (issue 40) and ``stepsim export
megatron`` writes them back (simulator/interop/megatron_memory.py, export_megatron.py).

Megatron semantics from NVIDIA/Megatron-LM at d98e8a64ddf34856e74b24714e3bedb2f5a39553:
megatron/training/arguments.py (the precision-aware optimizer's arguments and choices; the
asserts on --distribute-saved-activations; --bf16 keeping BF16 main gradients when
--main-grads-dtype is bf16), megatron/core/transformer/transformer_config.py
(moe_router_dtype fp32 / fp64, moe_expert_capacity_factor with a negative factor read as
none, moe_pad_expert_input_to_capacity needing a factor), megatron/core/optimizer/
optimizer_config.py and distrib_optimizer.py (store_param_remainders: an FP32 master kept as
16-bit remainders beside BF16 weights).
"""

from __future__ import annotations

import pytest

from simulator.interop.export_megatron import export_megatron
from simulator.interop.megatron import import_megatron
from simulator.interop.megatron_args import MAPPED
from simulator.scenario.loading import load_scenario
from simulator.scenario.schema import ScenarioError

MOE = (
    "pretrain_gpt.py --num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 1024 "
    "--vocab-size 32000 --micro-batch-size 1 --global-batch-size 16 --num-experts 8 --moe-router-topk 2 "
    "--expert-model-parallel-size 8 --data-parallel-size 8 --use-distributed-optimizer --bf16 "
    "--moe-token-dispatcher-type alltoall "  # padding to capacity is the alltoall dispatcher's
)
DENSE = (
    "pretrain_gpt.py --num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 1024 "
    "--vocab-size 32000 --micro-batch-size 1 --global-batch-size 16 --tensor-model-parallel-size 2 "
    "--data-parallel-size 4 --use-distributed-optimizer --bf16 "
)
FULL = "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "


def _training(text: str) -> dict:
    res = import_megatron(text, "dgx-h100")
    load_scenario(res.scenario)  # the scenario loads with the keys written
    return res.scenario["training"]


def _mapped_to(text: str, arg: str) -> str:
    lines = [m for m in import_megatron(text, "dgx-h100").mapped if m.startswith(f"--{arg}")]
    assert len(lines) == 1, lines
    key = lines[0].split(" -> ")[1].split(" ")[0]
    assert MAPPED[arg] == key  # the table docs and users read says the same key
    return lines[0]


@pytest.mark.parametrize(
    "base,extra,expected",
    [
        (DENSE, FULL + "--distribute-saved-activations", {"distribute_saved_activations": True}),
        (MOE, "--moe-router-dtype fp32", {"moe_router_dtype": "fp32"}),
        (MOE, "--moe-expert-capacity-factor 1.5", {"expert_load": {"capacity_factor": 1.5}}),
        (
            MOE,
            "--moe-expert-capacity-factor 1.25 --moe-pad-expert-input-to-capacity",
            {"expert_load": {"capacity_factor": 1.25, "pad_to_capacity": True}, "moe_host_sync": False},
        ),
        (MOE, "--moe-expert-capacity-factor -1", {}),  # Megatron reads a negative factor as none: dropless
        # the precision-aware optimizer keeps an FP32 master as 16-bit remainders beside BF16 weights
        (MOE, "--use-precision-aware-optimizer", {"master_weights": "remainder"}),
        (MOE, "--use-precision-aware-optimizer --main-params-dtype fp16", {"master_weights": "fp16"}),
        # a recipe other than delayed scaling: Megatron-Core keeps its own FP32 master
        (MOE, "--use-precision-aware-optimizer --fp8-format hybrid --fp8-recipe tensorwise", {}),
        (
            MOE,
            "--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16",
            {"master_weights": "remainder", "optimizer_state_dtype": "bf16"},
        ),
        (
            MOE,
            "--use-precision-aware-optimizer --main-params-dtype fp16 --exp-avg-dtype fp8 --exp-avg-sq-dtype fp8",
            {"master_weights": "fp16", "optimizer_state_dtype": "fp8"},
        ),
        (
            MOE,
            "--use-precision-aware-optimizer --main-grads-dtype bf16",
            {"master_weights": "remainder", "grad_dtype": "bf16"},
        ),
        (MOE, "--grad-reduce-in-bf16", {"grad_dtype": "bf16"}),
        (MOE, "--main-params-dtype fp32 --exp-avg-dtype fp32", {}),  # Megatron's defaults, no precision-aware flag
    ],
)
def test_each_flag_sets_its_key(base, extra, expected):
    tr = _training(base + extra)
    keys = ("distribute_saved_activations", "moe_router_dtype", "expert_load", "moe_host_sync")
    keys += ("master_weights", "optimizer_state_dtype", "grad_dtype")
    assert {k: tr[k] for k in keys if k in tr} == expected
    for arg in (a[2:] for a in extra.split() if a.startswith("--") and a[2:] in MAPPED):
        if arg not in ("recompute-granularity", "recompute-method", "recompute-num-layers", "bf16", "fp8-format"):
            _mapped_to(base + extra, arg)


def test_padding_sets_both_keys_on_one_mapped_line():
    line = _mapped_to(
        MOE + "--moe-expert-capacity-factor 2 --moe-pad-expert-input-to-capacity", "moe-pad-expert-input-to-capacity"
    )
    assert "training.moe_host_sync = false; training.expert_load.pad_to_capacity = true" in line
    # without a factor (Megatron-Core refuses it) the host sync goes, nothing is padded, and it says so
    res = import_megatron(MOE + "--moe-pad-expert-input-to-capacity", "dgx-h100")
    assert res.scenario["training"]["moe_host_sync"] is False and "expert_load" not in res.scenario["training"]
    assert any("without a --moe-expert-capacity-factor" in a for a in res.assumptions)


def test_moments_of_different_sizes_are_listed_as_not_mapped():
    res = import_megatron(
        MOE + "--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype fp32", "dgx-h100"
    )
    assert res.scenario["training"].get("optimizer_state_dtype") is None  # the larger, fp32, for both
    assert [u for u in res.unmapped if u.startswith("--exp-avg-dtype bf16 --exp-avg-sq-dtype fp32")]


def test_moe_flags_on_a_dense_model_change_nothing():
    res = import_megatron(DENSE + "--moe-router-dtype fp64 --moe-expert-capacity-factor 0.5", "dgx-h100")
    tr = res.scenario["training"]
    assert "moe_router_dtype" not in tr and "expert_load" not in tr
    assert sum("no effect without --num-experts" in a for a in res.assumptions) == 2
    assert not res.unmapped


@pytest.mark.parametrize(
    "base,extra,arg,message",
    [
        (MOE, "--moe-router-dtype fp64", "moe-router-dtype", "not 'fp64'"),
        (MOE, "--moe-expert-capacity-factor 0.5", "moe-expert-capacity-factor", "got '0.5'"),
        (MOE, "--moe-expert-capacity-factor many", "moe-expert-capacity-factor", "expected a number"),
        (DENSE, "--distribute-saved-activations", "distribute-saved-activations", "got recompute none"),
        (DENSE, FULL + "--sequence-parallel --distribute-saved-activations", "distribute-saved-activations", "True"),
        (
            DENSE.replace("--tensor-model-parallel-size 2", "--tensor-model-parallel-size 1"),
            FULL + "--distribute-saved-activations",
            "distribute-saved-activations",
            "tp 1",
        ),
        (
            DENSE,
            "--recompute-granularity full --distribute-saved-activations",
            "distribute-saved-activations",
            "method",
        ),
        (MOE, "--main-params-dtype fp16", "main-params-dtype", "needs --use-precision-aware-optimizer"),
        (MOE, "--exp-avg-dtype bf16", "exp-avg-dtype", "needs --use-precision-aware-optimizer"),
        (MOE, "--use-precision-aware-optimizer --exp-avg-sq-dtype fp64", "exp-avg-sq-dtype", "got 'fp64'"),
        (MOE, "--use-precision-aware-optimizer --main-params-dtype bf16", "main-params-dtype", "fp32, fp16"),
        (
            MOE.replace("--use-distributed-optimizer", ""),
            "--use-precision-aware-optimizer",
            "use-precision-aware-optimizer",
            "distributed optimizer",
        ),
        (MOE, "--use-precision-aware-optimizer --optimizer sgd", "use-precision-aware-optimizer", "adam only"),
    ],
)
def test_an_unmodelled_value_is_refused_naming_the_argument(base, extra, arg, message):
    with pytest.raises(ScenarioError, match=message) as e:
        import_megatron(base + extra, "dgx-h100")
    assert e.value.field == f"--{arg}"


def _round_trip(sc):
    back = load_scenario(import_megatron(export_megatron(sc), sc.cluster.name, name=sc.name).scenario)
    return back.training, back.expert_load


@pytest.mark.parametrize(
    "base,extra",
    [
        (DENSE, FULL + "--distribute-saved-activations"),
        (MOE, "--moe-router-dtype fp32 --moe-expert-capacity-factor 1.25 --moe-pad-expert-input-to-capacity"),
        (MOE, "--moe-expert-capacity-factor 3"),
        (MOE, "--use-precision-aware-optimizer --grad-reduce-in-bf16"),
        (MOE, "--use-precision-aware-optimizer --main-params-dtype fp16 --exp-avg-dtype fp16 --exp-avg-sq-dtype fp16"),
        (MOE, "--use-precision-aware-optimizer --main-grads-dtype bf16 --exp-avg-dtype fp8 --exp-avg-sq-dtype fp8"),
    ],
)
def test_import_of_export_gives_the_flags_back(base, extra):
    sc = load_scenario(import_megatron(base + extra, "dgx-h100").scenario)
    training, load = _round_trip(sc)
    assert training == sc.training
    assert load == sc.expert_load
    assert (load is not None) == ("capacity-factor" in extra)


def test_export_refuses_what_megatron_cannot_launch():
    sc = load_scenario(import_megatron(MOE + "--moe-expert-capacity-factor 2", "dgx-h100").scenario)
    raw = dict(sc.source)
    training = dict(raw["training"])
    for change, key in (
        ({"moe_host_sync": False}, "training.expert_load.pad_to_capacity"),  # sync-free without the padding
        ({"optimizer_state_dtype": "bf16"}, "training.master_weights"),  # an FP32 master beside BF16 moments
        ({"master_weights": "bf16"}, "training.master_weights"),  # no master copy at all
    ):
        bad = load_scenario({**raw, "training": {**training, **change}})
        with pytest.raises(ScenarioError) as e:
            export_megatron(bad)
        assert e.value.field == key
    padded = {**training, "expert_load": {"capacity_factor": 2, "pad_to_capacity": True}}
    with pytest.raises(ScenarioError) as e:  # padded to capacity, yet blocking on the host
        export_megatron(load_scenario({**raw, "training": padded}))
    assert e.value.field == "training.moe_host_sync"


def test_the_routing_imbalance_is_written_as_a_comment():
    sc = load_scenario(import_megatron(MOE + "--moe-expert-capacity-factor 2", "dgx-h100").scenario)
    raw = dict(sc.source)
    raw["training"] = {**raw["training"], "expert_load": {"distribution": "zipf", "skew": 1.2, "capacity_factor": 2}}
    text = export_megatron(load_scenario(raw))
    assert "# routing imbalance (training.expert_load): zipf, skew 1.2, seed 0" in text
    assert "--moe-expert-capacity-factor 2" in text
