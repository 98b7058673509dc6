"""Memory as allocated (issue 40, item 5): checkpointed layer inputs distributed over the
TP group, FSDP's gather and reduce-scatter buffers (prefetch depth, reshard after forward),
optimizers without FP32 master weights, and the CUDA caching allocator's reserve; each
against bytes counted by hand for the tiny test model (h = 1024, 4 layers of 12h^2 + 2h
parameters) and, where a framework states it, against the framework's figure."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import scenario

from simulator import simulate
from simulator.scenario.loading import load_scenario
from simulator.scenario.schema import ScenarioError
from workloads import activations, memory
from workloads.activations import ActivationPolicy
from workloads.errors import WorkloadError
from workloads.layout import ParallelLayout
from workloads.shard import Shard
from workloads.training import ALLOCATOR_RESERVE_FRACTION, TrainingSpec

H = 1024
LAYER_PARAMS = 12 * H * H + 2 * H  # QKV + out (4h^2), GELU MLP (8h^2), two RMSNorms


# ---- distributed saved activations ---------------------------------------------------


def test_distributed_saved_input_is_the_layer_input_over_tp():
    """Full recompute keeps the layer input, 2sbh bytes (Korthikanti §5); Megatron's
    --distribute-saved-activations keeps 1/t of it on each TP rank (random.py
    CheckpointFunction), as sequence parallelism would."""
    sc = load_scenario(scenario())
    s, b, t = 2048, 2, 4
    full = ActivationPolicy(recompute="full")
    dist = ActivationPolicy(recompute="full", distribute_saved_activations=True)
    no_sp = Shard(b, s, tp=t, sequence_parallel=False)
    assert activations.activation_bytes_per_layer(sc.model, 0, no_sp, full) == 2 * s * b * H
    assert activations.activation_bytes_per_layer(sc.model, 0, no_sp, dist) == 2 * s * b * H / t
    with_sp = Shard(b, s, tp=t, sequence_parallel=True)
    assert activations.activation_bytes_per_layer(sc.model, 0, with_sp, full) == 2 * s * b * H / t


def test_distributed_saved_activations_refused_where_megatron_refuses_it():
    with pytest.raises(WorkloadError, match="training.distribute_saved_activations"):
        TrainingSpec(distribute_saved_activations=True, recompute="selective")
    sc = load_scenario(scenario())
    dist = ActivationPolicy(recompute="full", distribute_saved_activations=True)
    for shard in (Shard(1, 1024, tp=4, sequence_parallel=True), Shard(1, 1024, tp=1, sequence_parallel=False)):
        with pytest.raises(WorkloadError, match="training.distribute_saved_activations"):
            activations.activation_bytes_per_layer(sc.model, 0, shard, dist)
    bad = scenario(training={"recompute": "selective", "distribute_saved_activations": True})
    with pytest.raises(ScenarioError, match="training.distribute_saved_activations"):
        load_scenario(bad)


def test_distributed_saved_activations_shrink_the_simulated_stash():
    """TP4 without sequence parallelism, one micro-batch per replica: the simulated
    activation peak drops by 3/4 of the four stashed layer inputs."""
    over = dict(
        parallel={"tp": 4, "pp": 1, "dp": 2, "sequence_parallel": False},
        training={"recompute": "full", "global_batch_size": 2, "micro_batch_size": 1},
    )
    a = simulate(load_scenario(scenario(**over))).summary
    over["training"] = {**over["training"], "distribute_saved_activations": True}
    b = simulate(load_scenario(scenario(**over))).summary
    s = 1024
    # at the peak (the last layer rebuilt before its backward) the four layers' inputs are
    # still stashed (a layer's stash is freed after its backward): 4 x 2sbh, split 4 ways
    saved = 4 * 2 * s * H
    assert a["peak_activation_bytes"] - b["peak_activation_bytes"] == pytest.approx(saved * 3 / 4, rel=1e-9)


# ---- optimizers without FP32 master weights -----------------------------------------


@pytest.mark.parametrize(
    "master, moments, per_param",
    [
        ("fp32", "fp32", 2 + 4 + 4 + 8),  # Megatron's 18 (theoretical_memory_usage.py)
        ("fp16", "fp32", 2 + 4 + 2 + 8),  # --use-precision-aware-optimizer --main-params-dtype fp16
        ("remainder", "fp32", 2 + 4 + 2 + 8),  # BF16 remainders (Megatron-Bridge performance guide)
        ("bf16", "fp32", 2 + 4 + 0 + 8),  # pure BF16 AdamW: no master copy
        ("none", "fp32", 4 + 4 + 0 + 8),  # FP32 weights, their own master (MaxText)
        ("fp16", "fp16", 2 + 4 + 2 + 4),  # --exp-avg-dtype fp16 --exp-avg-sq-dtype fp16
        ("fp16", "fp8", 2 + 4 + 2 + 2),  # --exp-avg-dtype fp8 --exp-avg-sq-dtype fp8
        ("bf16", "bf16", 2 + 4 + 0 + 4),
    ],
)
def test_bytes_per_parameter_by_master_and_moment_dtype(master, moments, per_param):
    t = TrainingSpec(master_weights=master, optimizer_state_dtype=moments)
    assert memory.training_state_bytes(1.0, 0, ParallelLayout(dp=8, zero=0), t).total == per_param
    # distributed optimizer: the master and moments shard over dp (Megatron: 6 + 12/dp for fp32)
    s = memory.training_state_bytes(1.0, 0, ParallelLayout(dp=8, zero=1), t)
    weights = 4 if master == "none" else 2
    assert s.total == pytest.approx(weights + 4 + (per_param - weights - 4) / 8)


def test_master_weights_change_only_the_simulated_optimizer_states():
    over = dict(parallel={"tp": 1, "pp": 1, "dp": 8, "zero": 0})
    a = simulate(load_scenario(scenario(**over))).summary["memory_breakdown_bytes"]
    b = simulate(load_scenario(scenario(**over, training={"master_weights": "bf16"}))).summary["memory_breakdown_bytes"]
    params = 4 * LAYER_PARAMS + 8 * H + 9 * H  # layers, embedding (vocab 8), norm + head
    assert a["optimizer"] - b["optimizer"] == pytest.approx(4 * params, rel=1e-12)
    assert a["weights"] == b["weights"] and a["activations"] == b["activations"]


def test_new_dtype_choices_are_checked_by_name():
    with pytest.raises(WorkloadError, match="training.master_weights"):
        TrainingSpec(master_weights="fp8")
    with pytest.raises(ScenarioError, match="training.optimizer_state_dtype"):
        load_scenario(scenario(training={"optimizer_state_dtype": "int8"}))
    assert TrainingSpec(optimizer_state_dtype="fp8").moment_bytes == 1


# ---- FSDP gather and reduce-scatter buffers -----------------------------------------


def test_fsdp_buffers_closed_form():
    units = [LAYER_PARAMS] * 4 + [8 * H, 9 * H]
    w, g = 2, 4
    # the computing unit and one prefetched (FSDP limit_all_gathers / FSDP2), plus one
    # unit's unsharded gradient being reduce-scattered
    assert memory.sharding_buffer_bytes(units, 3) == (2 * w + g) * LAYER_PARAMS
    assert memory.sharding_buffer_bytes(units, 3, gathered_units=3) == (3 * w + g) * LAYER_PARAMS
    # reshard_after_forward=False: every unit's gathered weights from its forward to its backward
    assert memory.sharding_buffer_bytes(units, 3, reshard_after_forward=False) == w * sum(units) + g * LAYER_PARAMS
    assert memory.sharding_buffer_bytes(units, 2, reshard_after_forward=False) == g * LAYER_PARAMS
    assert memory.sharding_buffer_bytes(units, 1, gathered_units=5) == 0.0
    # two units' unsharded gradients, one being reduce-scattered while the next is produced
    # (Megatron-FSDP's double buffer); at most as many as there are units
    assert memory.sharding_buffer_bytes(units, 3, grad_units=2) == (2 * w + 2 * g) * LAYER_PARAMS
    assert memory.sharding_buffer_bytes(units, 2, grad_units=2) == 2 * g * LAYER_PARAMS
    assert memory.sharding_buffer_bytes([5.0], 2, grad_units=3) == g * 5.0
    # one weight array at a time under grad_reduce_granularity tensor, whatever grad_units says
    assert memory.sharding_buffer_bytes(units, 2, grad_units=2, grad_array_params=7.0) == g * 7.0
    with pytest.raises(ValueError):
        memory.sharding_buffer_bytes(units, 3, gathered_units=0)


@pytest.mark.parametrize(
    "training, gathered, grads",
    [
        ({}, 2 * LAYER_PARAMS, 2 * LAYER_PARAMS),
        ({"fsdp_prefetch_units": 0}, LAYER_PARAMS, 2 * LAYER_PARAMS),
        ({"fsdp_prefetch_units": 2}, 3 * LAYER_PARAMS, 2 * LAYER_PARAMS),
        ({"reshard_after_forward": False}, 4 * LAYER_PARAMS + 8 * H + 9 * H, 2 * LAYER_PARAMS),
        ({"fsdp_grad_units": 1}, 2 * LAYER_PARAMS, LAYER_PARAMS),
    ],
)
def test_simulated_fsdp_buffers(training, gathered, grads):
    """BF16 gathered weights (2 B) and FP32 unsharded gradients (4 B) of the tiny model's
    layers (its largest units) on a ZeRO-3 rank."""
    sc = scenario(parallel={"tp": 1, "pp": 1, "dp": 8, "zero": 3}, training=training)
    s = simulate(load_scenario(sc)).summary
    assert s["memory_breakdown_bytes"]["buffers"] == pytest.approx(2 * gathered + 4 * grads, rel=1e-12)


def test_fsdp_options_are_bounded():
    with pytest.raises(ScenarioError, match="training.fsdp_prefetch_units"):
        load_scenario(scenario(training={"fsdp_prefetch_units": -1}))
    with pytest.raises(ScenarioError, match="training.fsdp_prefetch_units"):
        load_scenario(scenario(training={"fsdp_prefetch_units": 65}))
    with pytest.raises(ScenarioError, match="training.fsdp_grad_units"):
        load_scenario(scenario(training={"fsdp_grad_units": 0}))


# ---- the caching allocator's reserve ---------------------------------------------------


def test_reserved_is_allocated_plus_the_reserve_on_transient_bytes():
    f = 0.1
    res = simulate(load_scenario(scenario(training={"allocator_reserve_fraction": f})))
    s, mem = res.summary, res.table("memory")
    total = np.asarray(mem["total"], dtype=float)
    transient = np.asarray(mem["activations"], dtype=float) + np.asarray(mem["buffers"], dtype=float)
    assert s["reserved_memory_bytes"] == pytest.approx(float((total + f * transient).max()), rel=1e-12)
    assert s["peak_memory_bytes"] == pytest.approx(float(total.max()), rel=1e-12)
    b = s["memory_breakdown_bytes"]
    assert b["allocator_reserve"] == pytest.approx(f * (b["activations"] + b["buffers"]), rel=1e-12)
    assert s["allocator_reserve_fraction"] == f


def test_default_reserve_by_chip_family_and_oom_judged_on_reserved():
    gpu = simulate(load_scenario(scenario())).summary
    assert gpu["allocator_reserve_fraction"] == ALLOCATOR_RESERVE_FRACTION
    assert gpu["reserved_memory_bytes"] > gpu["peak_memory_bytes"]
    tpu = scenario(cluster={"preset": "tpu-v5p", "devices": 8}, parallel={"tp": 1, "pp": 1, "dp": 8})
    t = simulate(load_scenario(tpu)).summary
    assert t["allocator_reserve_fraction"] == 0.0 and t["reserved_memory_bytes"] == t["peak_memory_bytes"]
    # a chip whose memory lies between the allocated and the reserved peak is out of memory
    f = 0.5
    probe = simulate(load_scenario(scenario(training={"allocator_reserve_fraction": f}))).summary
    hbm = (probe["peak_memory_bytes"] + probe["reserved_memory_bytes"]) / 2
    chip = {
        "name": "small",
        "peak_flops_per_s": {"bf16": 989e12},
        "hbm_bytes": hbm,
        "hbm_bw_bytes_per_s": 3.35e12,
        "family": "hopper",
    }
    small = scenario(cluster={"chip": chip, "devices": 8, "network": {"kind": "switched"}})
    small["training"] = {**small["training"], "allocator_reserve_fraction": f}
    assert simulate(load_scenario(small)).summary["oom"]
    small["training"]["allocator_reserve_fraction"] = 0.0
    assert not simulate(load_scenario(small)).summary["oom"]


def test_reserve_fraction_is_bounded():
    for bad in (-0.1, 1.5):
        with pytest.raises(ScenarioError, match="training.allocator_reserve_fraction"):
            load_scenario(scenario(training={"allocator_reserve_fraction": bad}))


def _weights(cluster: str = "dgx-h100", zero: int = 0, **training) -> float:
    over = dict(parallel={"tp": 1, "pp": 1, "dp": 8, "zero": zero}, cluster={"preset": cluster, "devices": 8})
    sc = scenario(**over, training={"dtype": "fp8", **training})
    return simulate(load_scenario(sc)).summary["memory_breakdown_bytes"]["weights"]


def test_fp8_weights_as_transformer_engine_keeps_them():
    """Transformer Engine keeps the layers' FP8 weights across micro-batches (module/base.py
    quantize_weight with a cache name when Megatron passes is_first_microbatch), with the
    transpose Hopper's TN-only FP8 GEMMs need (pytorch/utils.py is_non_tn_fp8_gemm_supported):
    2 bytes a layer parameter (MXFP8's two scalings on B200); FP8 primary weights
    (--fp8-param-gather) replace the BF16 weight instead, at its size. Embedding and head stay
    BF16; ZeRO-3 shards are not cached; the default (no Transformer Engine) keeps no copy."""
    bf16_weights = 2 * (4 * LAYER_PARAMS + 8 * H + 9 * H)
    assert _weights() == pytest.approx(bf16_weights, rel=1e-12)
    for cluster in ("dgx-h100", "dgx-b200"):
        assert _weights(cluster, fp8_weight_cache=True) - _weights(cluster) == pytest.approx(
            2 * 4 * LAYER_PARAMS, rel=1e-12
        )
        assert _weights(cluster, fp8_params=True, fp8_weight_cache=True) == _weights(cluster)
    assert _weights(zero=3, fp8_weight_cache=True) == _weights(zero=3)
    assert _weights("dgx-a100", fp8_weight_cache=True) == _weights("dgx-a100")


def test_fp8_primary_weights_are_gathered_in_fp8():
    """The distributed optimizer all-gathers FP8 primary weights in FP8: the layers' gathers
    carry half the bytes, the embedding's and head's stay BF16."""

    def gathers(**training):
        sc = scenario(parallel={"tp": 1, "pp": 1, "dp": 8, "zero": 1}, training={"dtype": "fp8", **training})
        ev = simulate(load_scenario(sc)).events
        ag = ev[ev.name.str.endswith(".param_ag")]
        return dict(zip(ag.name, ag.size_bytes))

    a, b = gathers(), gathers(fp8_params=True)
    assert set(a) == set(b) and any(n.startswith("L") for n in a)
    for name in a:
        assert b[name] == (a[name] / 2 if name.startswith("L") else a[name]), name


@pytest.mark.parametrize("key", ["fp8_params", "fp8_weight_cache"])
def test_fp8_weight_keys_refused_without_fp8_training(key):
    with pytest.raises(ScenarioError, match=f"training.{key}: needs training.dtype: fp8"):
        load_scenario(scenario(training={key: True}))
