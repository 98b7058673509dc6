"""Memory as the frameworks allocate it (issue 15): where the gate weight multiplies a
routed expert, the dtypes of gradients and optimizer moments, the distributed
optimizer's expert shards on Megatron-Core's expert grid, and the validation suite's
memory columns, memory metrics and expected-OOM cases."""

from __future__ import annotations

import copy
import csv
from dataclasses import replace

import pytest
import yaml

from simulator.cli.validate import main as cli_main
from simulator.scenario.loading import load_scenario
from simulator.scenario.schema import ScenarioError
from simulator.studies import validate as v
from workloads import activations, memory
from workloads.activations import ActivationPolicy
from workloads.layout import ParallelLayout
from workloads.presets import get_model
from workloads.shard import Shard
from workloads.training import TrainingSpec

DSV3 = get_model("deepseek-v3")


def test_gate_weighting_keeps_an_fp32_weight_instead_of_the_expert_output():
    """Per token-expert assignment the gate gradient needs the 16-bit expert output
    (``h`` = 7168 wide: 2h bytes) when the gate scales it at the combine (Megatron-Core
    <= 0.12 ``unpermute(probs=...)``), one fp32 weight when it scales the SwiGLU output
    (Megatron-Core >= 0.13 ``activation_func_with_probs``)."""
    kw = dict(recompute="selective", flash_attention=True, activation_saving="deepseek-v3")
    act = activations.activation_bytes_per_layer(
        DSV3, 5, Shard(1, 4096, ep=64), ActivationPolicy(moe_gate_weighting="activation", **kw)
    )
    comb = activations.activation_bytes_per_layer(
        DSV3, 5, Shard(1, 4096, ep=64), ActivationPolicy(moe_gate_weighting="combine", **kw)
    )
    assignments = 4096 * 8
    assert comb - act == pytest.approx(assignments * (2 * 7168 - 4), rel=1e-12)
    # DeepSeek-V3's per-assignment cache (§3.3.2): FP8 expert input (h) and FP8 SwiGLU
    # input (2f = 4096) plus the fp32 weight: 11,268 bytes, down from 25,600 (BF16 output kept).
    top16 = DSV3.with_(moe=replace(DSV3.moe, top_k=16))
    more = activations.activation_bytes_per_layer(
        top16, 5, Shard(1, 4096, ep=64), ActivationPolicy(moe_gate_weighting="activation", **kw)
    )
    assert more - act == pytest.approx(assignments * (7168 + 4096 + 4), rel=1e-12)
    with pytest.raises(ValueError, match="training.moe_gate_weighting"):
        activations.activation_bytes_per_layer(DSV3, 5, Shard(1, 4096), ActivationPolicy(moe_gate_weighting="router"))


def test_megatron_bytes_per_parameter():
    """Megatron-LM ``theoretical_memory_usage.py``: 18 bytes per parameter (BF16 weight,
    FP32 main gradient, FP32 master + two Adam moments), ``6 + 12/dp`` with the
    distributed optimizer; NeMo's ``grad_sync_dtype: bf16`` halves the gradient."""
    t = TrainingSpec()
    assert memory.training_state_bytes(1.0, 0, ParallelLayout(dp=8, zero=0), t).total == 18
    assert memory.training_state_bytes(1.0, 0, ParallelLayout(dp=8, zero=1), t).total == pytest.approx(6 + 12 / 8)
    bf16 = TrainingSpec(grad_dtype="bf16")
    assert memory.training_state_bytes(1.0, 0, ParallelLayout(dp=8, zero=1), bf16).total == pytest.approx(4 + 12 / 8)
    # DeepSeek-V3 §3.3.3: BF16 AdamW moments, FP32 master weights and gradients -> K = 8
    ds = TrainingSpec(dtype="fp8", optimizer_state_dtype="bf16")
    assert memory.training_state_bytes(1.0, 0, ParallelLayout(zero=0), ds) == memory.StateBytes(2, 4, 8)


def test_expert_states_shard_over_megatron_cores_expert_grid():
    """Megatron-Core's expert data-parallel size is world / (etp * ep * pp)
    (parallel_state.py): the dgxc Grok-1 512-GPU layout (TP4 CP2 PP8 DP8 EP8, ETP1) has
    8 replicas of each expert, not dp*cp/ep = 2; DeepSeek-V3's (PP16 DP128 EP64) 2."""
    grok = ParallelLayout(tp=4, cp=2, pp=8, dp=8, ep=8, etp=1, zero=1)
    assert memory.expert_replicas(grok) == 512 // (1 * 8 * 8) == 8
    assert memory.expert_replicas(ParallelLayout(tp=4, cp=2, pp=8, dp=8, ep=8, etp=4)) == 2
    assert memory.expert_replicas(ParallelLayout(pp=16, dp=128, ep=64)) == 2
    s = memory.state_bytes(0.0, 8.0, grok)
    assert s.optimizer == pytest.approx(12 * 8 / 8)


def test_training_dtype_fields_are_checked_by_name():
    assert TrainingSpec(grad_dtype="bf16").grad_bytes == 2 and TrainingSpec().grad_bytes == 4
    assert TrainingSpec(optimizer_state_dtype="bf16").moment_bytes == 2
    with pytest.raises(ValueError, match="training.grad_dtype"):
        TrainingSpec(grad_dtype="fp16")
    base = {"model": "llama3-8b", "cluster": {"preset": "dgx-h100", "devices": 8}, "training": {"global_batch_size": 8}}
    for key in ("grad_dtype", "optimizer_state_dtype", "moe_gate_weighting"):
        bad = copy.deepcopy(base)
        bad["training"][key] = "fp64"
        with pytest.raises(ScenarioError, match=f"training.{key}"):
            load_scenario(bad)


def test_bf16_moments_shrink_only_the_optimizer_states():
    sc = {
        "model": {"preset": "llama3-8b", "layers": 2, "vocab": 1024},
        "cluster": {"preset": "dgx-h100", "devices": 8},
        "parallel": {"tp": 1, "dp": 8, "zero": 1},
        "training": {"global_batch_size": 8, "seq_len": 512},
    }
    from simulator import simulate

    a = simulate(load_scenario(sc)).summary["memory_breakdown_bytes"]
    sc["training"]["optimizer_state_dtype"] = "bf16"
    sc["training"]["grad_dtype"] = "bf16"
    b = simulate(load_scenario(sc)).summary["memory_breakdown_bytes"]
    # moments 8 -> 4 of 12 optimizer bytes per parameter; gradients 4 -> 2 bytes
    assert b["optimizer"] == pytest.approx(a["optimizer"] * 8 / 12, rel=1e-12)
    assert b["gradients"] == pytest.approx(a["gradients"] / 2, rel=1e-12)
    assert b["weights"] == a["weights"] and b["activations"] == a["activations"]


# ---- validation: memory columns, memory metrics, expected-OOM cases ---------------------

_TINY = {"preset": "megatron-gpt-1.7b", "layers": 4, "vocab": 1024}


def _case(name, metric="step_time_s", value=0.1, hbm=None):
    cluster = {"preset": "dgx-a100", "devices": 8}
    if hbm is not None:  # a made-up chip small enough that the tiny model does not fit
        cluster["chip"] = {
            "peak_flops_per_s": {"bf16": 312e12},
            "hbm_bytes": hbm,
            "hbm_bw_bytes_per_s": 2.039e12,
            "family": "ampere",
        }
    return {
        "name": name,
        "published": {"metric": metric, "value": value, "source": "synthetic test case"},
        "model": _TINY,
        "cluster": cluster,
        "parallel": {"tp": 2, "pp": 1, "dp": 4},
        "training": {"seq_len": 1024, "micro_batch_size": 1, "global_batch_size": 8, "recompute": "full"},
    }


def test_oom_cases_load_as_booleans_and_reject_numbers():
    c = v.load_case(_case("x", metric="oom", value=True))
    assert c.metric == "oom" and c.published == 1.0
    with pytest.raises(v.ValidationError, match="published.value: metric oom needs true or false"):
        v.load_case(_case("x", metric="oom", value=1))
    with pytest.raises(v.ValidationError, match="published.value: needs a number"):
        v.load_case(_case("x", metric="peak_memory_bytes", value=True))


@pytest.mark.slow
def test_a_case_that_does_not_fit_fails_and_an_oom_case_must_agree(tmp_path, capsys):
    ok = v.run_case(v.load_case(_case("fits")))
    assert not ok.oom and ok.failure is None and ok.peak_memory_bytes > 0
    small = v.run_case(v.load_case(_case("too-small", hbm=1e9)))
    assert small.oom and "but the source ran it" in small.failure
    expected = v.run_case(v.load_case(_case("expected-oom", metric="oom", value=True, hbm=1e9)))
    assert expected.failure is None and expected.error == 0.0 and expected.simulated == 1.0
    wrong = v.run_case(v.load_case(_case("wrongly-fits", metric="oom", value=True)))
    assert wrong.error == 1.0 and "fits in the simulation" in wrong.failure  # optimistic: positive
    # peak memory as the metric: simulated / published - 1, as for the other metrics
    mem = v.run_case(v.load_case(_case("mem", metric="peak_memory_bytes", value=ok.peak_memory_bytes / 2)))
    assert mem.error == pytest.approx(1.0)
    s = mem.summary
    assert 0 < s["peak_activation_bytes"] < s["peak_memory_bytes"]
    assert s["model_state_bytes"] == pytest.approx(
        sum(s["memory_breakdown_bytes"][k] for k in ("weights", "gradients", "optimizer"))
    )

    suite = tmp_path / "suite"
    suite.mkdir()
    for c in (_case("fits"), _case("expected-oom", metric="oom", value=True, hbm=1e9)):
        (suite / f"{c['name']}.yaml").write_text(yaml.safe_dump(c))
    out = tmp_path / "out"
    assert cli_main(["validate", "--suite", str(suite), "--out", str(out), "--jobs", "1", "--quiet"]) == 0
    rows = {r["case"]: r for r in csv.DictReader((out / "validation.csv").open())}
    assert rows["expected-oom"]["oom"] == "true" and rows["fits"]["oom"] == "false"
    assert float(rows["fits"]["peak_memory_bytes"]) == pytest.approx(ok.peak_memory_bytes)
    (suite / "too-small.yaml").write_text(yaml.safe_dump(_case("too-small", hbm=1e9)))
    capsys.readouterr()
    assert cli_main(["validate", "--suite", str(suite), "--jobs", "1", "--quiet"]) == 3
    cap = capsys.readouterr()
    assert "1 case(s) fail on memory: too-small" in cap.err and "FAILED too-small" in cap.out


def test_recompute_modules_drop_their_tensors_closed_form():
    """Megatron-Core ``--recompute-modules`` on DeepSeek-V3 (s = 4096, no parallelism,
    flash attention): ``mla_up_proj`` drops the per-head Q, K (192 wide) and V (128) of
    128 heads and the normed latents (1536 + 512); ``layernorm`` the two norm outputs
    (the down-projection input and the router / FFN input, h = 7168); ``moe_act`` the
    routed experts' SwiGLU outputs (f = 2048 per assignment)."""
    T, h, H, A = 4096, 7168, 128, 8 * 4096
    kw = dict(recompute="selective", flash_attention=True)
    base = activations.activation_bytes_per_layer(DSV3, 5, Shard(1, 4096), ActivationPolicy(**kw))

    def drop(*mods):
        return base - activations.activation_bytes_per_layer(
            DSV3, 5, Shard(1, 4096), ActivationPolicy(recompute_modules=mods, **kw)
        )

    assert drop("mla_up_proj") == pytest.approx(2 * T * H * (2 * 192 + 128) + 2 * T * (1536 + 512), rel=1e-12)
    assert drop("layernorm") == pytest.approx(2 * 2 * T * h, rel=1e-12)
    assert drop("moe_act") == pytest.approx(2 * A * 2048, rel=1e-12)
    assert drop("core_attn") == 0  # fused attention never stored the scores
    both = drop("mla_up_proj", "layernorm", "moe_act")
    assert both == pytest.approx(drop("mla_up_proj") + drop("layernorm") + drop("moe_act"), rel=1e-12)
    with pytest.raises(ValueError, match="training.recompute_modules"):
        activations.activation_bytes_per_layer(
            DSV3, 5, Shard(1, 4096), ActivationPolicy(recompute_modules=("mlp_everything",))
        )
    with pytest.raises(ValueError, match="training.recompute_modules: needs training.recompute: selective"):
        TrainingSpec(recompute="none", recompute_modules=("moe_act",))


def test_recompute_modules_charge_their_kernels_to_the_backward():
    from simulator import simulate

    sc = {
        "model": {"preset": "deepseek-v3", "layers": 4, "mtp_depth": 0, "vocab": 1024},
        "cluster": {"preset": "dgx-h100", "devices": 8},
        "parallel": {"tp": 1, "dp": 8, "ep": 8},
        "training": {"global_batch_size": 8, "seq_len": 512, "recompute": "selective"},
    }
    plain = simulate(load_scenario(sc))
    sc["training"]["recompute_modules"] = ["mla_up_proj", "moe_act"]
    mods = simulate(load_scenario(sc))
    redo = mods.events[mods.events["name"].str.endswith(".recompute.R")]
    assert len(redo) > 0 and plain.events["name"].str.endswith(".recompute.R").sum() == 0
    assert mods.summary["hfu"] > plain.summary["hfu"] and mods.summary["mfu"] < plain.summary["mfu"] * 1.0001
    assert (
        mods.summary["memory_breakdown_bytes"]["activations"] < plain.summary["memory_breakdown_bytes"]["activations"]
    )


def test_master_weight_remainders():
    """Apex DistributedFusedAdam ``store_param_remainders`` (NeMo 1.0, BF16 models): the
    optimizer keeps 2 bytes of master weight plus two FP32 moments, 10 bytes per
    parameter instead of 12."""
    t = TrainingSpec(master_weights="remainder")
    assert memory.training_state_bytes(1.0, 0, ParallelLayout(zero=0), t).optimizer == 10
    with pytest.raises(ValueError, match="training.master_weights"):
        TrainingSpec(master_weights="fp8")


def test_fp32_weights_are_their_own_master():
    """JAX / MaxText (``weight_dtype: float32``): the FP32 parameters are cast per matmul,
    so there is no separate master copy: 4 B weights + 4 B gradients + 8 B Adam moments =
    16 B per parameter, against 2 + 4 + 12 = 18 B for BF16 weights with an FP32 master."""
    t = TrainingSpec(master_weights="none")
    s = memory.training_state_bytes(1.0, 0, ParallelLayout(zero=0), t)
    assert (s.weights, s.gradients, s.optimizer) == (4, 4, 8)
    # sharded like any other state under ZeRO-3 / FSDP
    s3 = memory.training_state_bytes(64.0, 0, ParallelLayout(dp=64, zero=3), t)
    assert (s3.weights, s3.gradients, s3.optimizer) == (4, 4, 8)


def test_matmul_outputs_policy_keeps_what_jax_checkpoint_dots_keeps():
    """``recompute_modules: [matmul_outputs]`` (JAX checkpoint_dots_with_no_batch_dims,
    MaxText remat_policy minimal): per token a dense layer keeps its input, Q, K, V, the
    out-projection output and the two SwiGLU up outputs, 16-bit: closed form
    2(3h + 2 kv_heads d + 2f) bytes for GQA; plain selective recompute keeps 2(3h + f)
    bytes more (the two norm outputs, the pre-FFN residual and the activation output) and
    the flash kernel's log-sum-exp."""
    m = get_model("llama3-8b")  # h 4096, 8 KV heads of 128, SwiGLU f 14336
    h, kvd, f, s = m.hidden, m.kv_heads * m.head_dim, m.ffn_hidden, 4096
    kw = dict(recompute="selective", flash_attention=True)
    dots = activations.activation_bytes_per_layer(
        m, 0, Shard(1, s), ActivationPolicy(recompute_modules=("matmul_outputs",), **kw)
    )
    assert dots == pytest.approx(2 * s * (3 * h + 2 * kvd + 2 * f), rel=1e-12)
    sel = activations.activation_bytes_per_layer(m, 0, Shard(1, s), ActivationPolicy(**kw))
    lse = 4 * s * m.heads  # the flash kernel's log-sum-exp, not kept when the kernel reruns
    assert sel - dots == pytest.approx(2 * s * (3 * h + f) + lse, rel=1e-12)
    # the kernels that run again before each layer's backward: norms, residual, SwiGLU
    # and the flash attention forward (not a dot_general output, so not saved)
    names = memory.recomputed_kernel_names(TrainingSpec(recompute="selective", recompute_modules=("matmul_outputs",)))
    assert {"attn_norm", "mlp_norm", "attn_core", "attn_residual", "mlp_act"} <= names
    assert not names & {"qkv_proj", "out_proj", "mlp_up", "mlp_down"}
