"""FP8 training keeps the FP8 copies of the linear layers' inputs for the backward (issue 40,
item 5: memory as allocated). Transformer Engine's ``_Linear.forward`` saves its quantised input
(``transformer_engine/pytorch/module/linear.py`` at NVIDIA/TransformerEngine d0067d0); each term
below is counted by hand for a preset model and a tensor-parallel shard."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulator import simulate
from simulator.scenario.loading import load_scenario
from workloads.activations import ActivationPolicy, activation_bytes_per_layer
from workloads.errors import WorkloadError
from workloads.presets import get_model
from workloads.quantization import saved_copy_bytes
from workloads.shard import Shard
from workloads.training import TrainingSpec

LLAMA = get_model("llama3-70b")  # h 8192, SwiGLU f 28672, GQA: 8 KV heads of 128
T, S = 4, 4096
SHARD = Shard(1, S, tp=T, sequence_parallel=True)
SELECTIVE = ActivationPolicy(recompute="selective", flash_attention=True, recompute_modules=("core_attn",))


def layer(policy, model=LLAMA, shard=SHARD):
    return activation_bytes_per_layer(model, 0, shard, policy)


def test_te_documented_measurement_one_byte_an_element():
    """Transformer Engine's own measurement (docs/features/low_precision_training/
    performance_considerations, memory_usage_1/2_pytorch.out at d0067d0): a 1024 x 1024 BF16
    te.Linear on Hopper holds 6.00 MB after its forward in BF16 (2 MB weight, 2 MB input saved,
    2 MB output) and 6.02 MB under FP8 (2 MB weight, 1 MB FP8 weight, 1 MB FP8 input saved, 2 MB
    output): the saved input is 1 byte an element."""
    mib, elems = 1024**2, 1024 * 1024
    saved_fp8 = (6.02 - 2 - 1 - 2) * mib / elems
    assert saved_copy_bytes("tensorwise") == pytest.approx(saved_fp8, abs=0.03)
    assert saved_copy_bytes("delayed") == 1.0
    assert saved_copy_bytes("mxfp8") == 1 + 1 / 32  # an E8M0 scale per 32 elements
    assert saved_copy_bytes("blockwise") == 1 + 4 / 128  # an FP32 scale per 128


def test_dense_layer_keeps_fp8_gemm_inputs():
    """Current scaling: the QKV and up projections' inputs (norm outputs, h wide, sequence-parallel
    shards) and the down projection's input (f/t wide) take 1 byte instead of 2; Q/K/V, the
    attention output, the norm inputs and the SwiGLU input stay BF16."""
    bf16 = layer(SELECTIVE)
    fp8 = layer(replace(SELECTIVE, fp8_recipe="tensorwise"))
    rows_sp, f = S / T, LLAMA.ffn_hidden / T
    assert bf16 - fp8 == pytest.approx(rows_sp * 2 * LLAMA.hidden + S * f, rel=1e-12)
    # the whole layer, by hand: 2 norm inputs, 2 norm outputs in FP8, Q (h/t) K V (2 x 256),
    # attention output (h/t), SwiGLU input (2f/t), down input in FP8 (f/t), log-sum-exp (fp32)
    h, heads = LLAMA.hidden, LLAMA.heads // T
    kv = 2 * 2 * 128  # K and V: 8 KV heads of 128 over TP4
    by_hand = rows_sp * (2 * 2 * h + 2 * 1 * h) + S * (2 * (h / T + kv) + 2 * h / T + 2 * 2 * f + 1 * f + 4 * heads)
    assert fp8 == pytest.approx(by_hand, rel=1e-12)


def test_delayed_recipe_keeps_the_out_projections_copy_too():
    """Under delayed scaling Megatron-Core leaves the out projection's FP8 copy beside the BF16
    attention output the fused attention keeps (set_save_original_input only for the other
    recipes, megatron/core/transformer/attention.py at d98e8a64): h/t more bytes a token."""
    cs = layer(replace(SELECTIVE, fp8_recipe="tensorwise"))
    delayed = layer(replace(SELECTIVE, fp8_recipe="delayed"))
    assert delayed - cs == pytest.approx(S * LLAMA.hidden / T, rel=1e-12)
    mx = layer(replace(SELECTIVE, fp8_recipe="mxfp8"))
    assert mx - cs == pytest.approx((S / T * 2 * LLAMA.hidden + S * LLAMA.ffn_hidden / T) / 32, rel=1e-12)


def test_recomputed_norms_keep_nothing_in_either_precision():
    """With layernorm recompute the norm outputs are rebuilt (Megatron sets save_original_input on
    the linear after them): FP8 saves only the down projection's byte."""
    ln = replace(SELECTIVE, recompute_modules=("core_attn", "layernorm"))
    diff = layer(ln) - layer(replace(ln, fp8_recipe="tensorwise"))
    assert diff == pytest.approx(S * LLAMA.ffn_hidden / T, rel=1e-12)
    full = ActivationPolicy(recompute="full")
    assert layer(full) == layer(replace(full, fp8_recipe="tensorwise"))  # the BF16 layer input


def test_moe_layer_keeps_fp8_expert_inputs():
    """Per token-expert assignment the permuted input (h) and the down GEMM's input (f_e) take 1
    byte; the router keeps its BF16 input; a shared expert's up GEMM keeps an FP8 copy of it."""
    qwen = get_model("qwen3-30b-a3b")
    shard = Shard(1, S, ep=16)
    base = ActivationPolicy(flash_attention=True)
    diff = layer(base, qwen, shard) - layer(replace(base, fp8_recipe="tensorwise"), qwen, shard)
    m = qwen.moe
    assert m is not None
    assignments = S * m.top_k
    dense_part = S * qwen.hidden  # the QKV input only: the MoE block's norm output feeds the router
    assert m.shared_experts == 0
    assert diff == pytest.approx(dense_part + assignments * (qwen.hidden + m.expert_ffn_hidden), rel=1e-12)
    shared = replace(qwen, moe=replace(m, shared_experts=1))
    diff_shared = layer(base, shared, shard) - layer(replace(base, fp8_recipe="tensorwise"), shared, shard)
    fs = m.expert_ffn_hidden
    # the shared expert's down input 2 -> 1 byte, and its up GEMM's own FP8 copy (+1 byte a row)
    assert diff_shared - diff == pytest.approx(S * fs - S * qwen.hidden, rel=1e-12)


def test_policy_follows_the_training_dtype():
    assert ActivationPolicy.of(TrainingSpec()).fp8_recipe is None
    assert ActivationPolicy.of(TrainingSpec(dtype="fp8", fp8_recipe="mxfp8")).fp8_recipe == "mxfp8"
    ds = ActivationPolicy(activation_saving="deepseek-v3")
    assert layer(ds, get_model("deepseek-v3"), Shard(1, S, tp=1, ep=8)) == layer(
        replace(ds, fp8_recipe="blockwise"), get_model("deepseek-v3"), Shard(1, S, tp=1, ep=8)
    )  # DeepSeek-V3's own list of cached tensors decides
    with pytest.raises(WorkloadError, match="training.fp8_recipe"):
        ActivationPolicy(fp8_recipe="fp4")


def test_simulated_stash_shrinks_by_the_per_layer_saving():
    """Llama 3 70B FP8 on 32 H100 (TP4 PP4 VP5, selective core_attn; the negative memory case's
    layout): stage 0's peak activations are the embedding's plus whole layers in flight, each
    the by-hand FP8 layer."""
    path = "validation/memory/mbridge-llama3-70b-sft-32xh100-vpp5-oom.yaml"
    sc = load_scenario(path)
    acts = simulate(sc).summary["memory_breakdown_bytes"]["activations"]
    policy = ActivationPolicy.of(sc.training)
    assert policy.fp8_recipe == "tensorwise"
    shard = Shard(1, S, tp=T, sequence_parallel=True)
    per_layer = activation_bytes_per_layer(LLAMA, 0, shard, policy)
    # 22 warm-up chunks of 4 layers and the one in flight (the token ids, 32 KB a micro-batch, are
    # within the tolerance)
    assert acts / per_layer == pytest.approx(4 * 23, abs=1e-3)
    bf16_layer = activation_bytes_per_layer(LLAMA, 0, shard, replace(policy, fp8_recipe=None))
    # bytes a token on a rank, by hand: norm inputs 2 x 4096, norm outputs 2 x 4096 (FP8: 2 x 2048),
    # Q 4096, K and V 1024, attention output 4096, log-sum-exp 64, SwiGLU input 28672, down
    # input 14336 (FP8: 7168)
    assert bf16_layer / S == 68672 and per_layer / S == 57408


def test_mla_down_projections_keep_a_copy_each():
    """DeepSeek-V3's first (dense) layer without its own savings, blockwise FP8 (1 + 4/128 bytes a
    copy): the norm output both down projections read is kept twice, the normed latents (q_up and
    kv_up inputs), the up projection's input and the down projection's input once each."""
    ds = get_model("deepseek-v3")
    shard = Shard(1, S, tp=1, ep=8)
    base = ActivationPolicy(flash_attention=True)
    assert not ds.is_moe_layer(0)
    diff = layer(base, ds, shard) - layer(replace(base, fp8_recipe="blockwise"), ds, shard)
    c, mla = 1 + 4 / 128, ds.attention
    assert mla is not None and mla.q_lora_rank
    once = mla.q_lora_rank + mla.kv_lora_rank + ds.hidden + ds.ffn_hidden
    assert diff == pytest.approx(S * ((2 - 2 * c) * ds.hidden + (2 - c) * once), rel=1e-12)
