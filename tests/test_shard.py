"""A rank's shard (workloads.shard.Shard) and the activation policy a training sets."""

import pytest

from workloads.activations import ActivationPolicy
from workloads.layout import ParallelLayout
from workloads.shard import ACT_BYTES, Shard
from workloads.training import TrainingSpec


def test_shard_of_layout_and_training():
    layout = ParallelLayout(tp=4, cp=2, pp=2, dp=8, ep=8, etp=2, sequence_parallel=False)
    training = TrainingSpec(seq_len=8192, micro_batch_size=3, global_batch_size=48)
    s = Shard.of(layout, training)
    assert s == Shard(3, 8192, tp=4, cp=2, ep=8, etp=2, sequence_parallel=False, act_bytes=ACT_BYTES)
    assert s.tokens == 3 * 8192 // 2 and isinstance(s.tokens, int)
    assert not s.sp and s.sp_rows(100) == 100


def test_sequence_parallel_rows():
    assert Shard(1, 4096, tp=8).sp and Shard(1, 4096, tp=8).sp_rows(4096) == 512
    assert not Shard(1, 4096, tp=1).sp and Shard(1, 4096).sp_rows(4096) == 4096


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"tp": 0}, "parallel.tp"),
        ({"cp": 1.5}, "parallel.cp"),
        ({"ep": -1}, "parallel.ep"),
        ({"etp": 0}, "parallel.etp"),
    ],
)
def test_bad_degrees(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Shard(1, 4096, **kwargs)


def test_bad_batch():
    with pytest.raises(ValueError, match="micro_batch_size and seq_len"):
        Shard(0, 4096)
    with pytest.raises(ValueError, match="micro_batch_size and seq_len"):
        Shard(1, 0)


def test_policy_of_training():
    t = TrainingSpec(
        recompute="selective",
        recompute_modules=("layernorm", "moe_act"),
        flash_attention=False,
        dropout=True,
        moe_gate_weighting="combine",
    )
    assert ActivationPolicy.of(t) == ActivationPolicy(
        recompute="selective",
        flash_attention=False,
        dropout=True,
        activation_saving="none",
        moe_gate_weighting="combine",
        recompute_modules=("layernorm", "moe_act"),
    )
    # the defaults reproduce Korthikanti's tables: scores materialised, not TrainingSpec's flash
    assert ActivationPolicy().flash_attention is False and TrainingSpec().flash_attention is True


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"recompute": "some"}, "training.recompute"),
        ({"activation_saving": "fp4"}, "training.activation_saving"),
        ({"moe_gate_weighting": "router"}, "training.moe_gate_weighting"),
        ({"recompute_modules": ("mlp_everything",)}, "training.recompute_modules"),
    ],
)
def test_bad_policy(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ActivationPolicy(**kwargs)
