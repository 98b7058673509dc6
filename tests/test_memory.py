"""Activation and model-state memory against Korthikanti et al. and ZeRO."""

from dataclasses import replace

import pytest

from workloads.activations import (
    ActivationPolicy,
    activation_bytes_per_layer,
    embedding_activation_bytes,
    head_activation_bytes,
    mtp_activation_bytes,
)
from workloads.layout import ParallelLayout
from workloads.memory import (
    StateBytes,
    rank_parameter_counts,
    rank_parameter_units,
    sharding_buffer_bytes,
    state_bytes,
)
from workloads.model import ModelSpec
from workloads.parameters import _block_params, expert_parameter_count, largest_weight_params, parameter_count
from workloads.presets import get_model
from workloads.shard import Shard

GPT3 = get_model("gpt3-175b")  # a = 96, h = 12288: 5as/h = 80 at s = 2048 (Korthikanti §4.1)
A, H = GPT3.heads, GPT3.hidden
S, B = 2048, 2


def act(**kw):
    """One GPT-3 layer at b = 2, s = 2048 with dropout: ``kw`` are Shard and ActivationPolicy fields."""
    shard = Shard(B, S, **{k: kw.pop(k) for k in ("tp", "cp", "sequence_parallel") if k in kw})
    return activation_bytes_per_layer(GPT3, 0, shard, ActivationPolicy(**{"dropout": True, **kw}))


def test_korthikanti_no_parallelism():
    assert 5 * A * S / H == 80
    assert act() == pytest.approx(S * B * H * (34 + 5 * A * S / H), rel=1e-12)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_korthikanti_tensor_parallel(t):
    sbh = S * B * H
    assert act(tp=t, sequence_parallel=False) == pytest.approx(sbh * (10 + 24 / t + 5 * A * S / (H * t)), rel=1e-12)
    assert act(tp=t) == pytest.approx(sbh / t * (34 + 5 * A * S / H), rel=1e-12)
    assert act(tp=t, recompute="selective") == pytest.approx(34 * sbh / t, rel=1e-12)
    assert act(tp=t, recompute="selective", sequence_parallel=False) == pytest.approx(sbh * (10 + 24 / t), rel=1e-12)


def test_korthikanti_full_recompute():
    assert act(recompute="full") == 2 * S * B * H
    assert act(recompute="full", tp=8, sequence_parallel=False) == 2 * S * B * H
    assert act(recompute="full", tp=8) == pytest.approx(2 * S * B * H / 8)  # the input is sequence-sharded


def test_no_dropout_drops_masks_and_dropout_output():
    sbh = S * B * H
    plain = act(dropout=False)
    assert plain == pytest.approx(sbh * 32 + 2 * A * S * S * B, rel=1e-12)
    assert act(dropout=False, recompute="selective") == pytest.approx(32 * sbh, rel=1e-12)
    assert activation_bytes_per_layer(GPT3, 0, Shard(B, S)) == plain  # dropout=False is the default


def test_flash_attention_is_selective_plus_lse():
    sel = act(dropout=False, recompute="selective")
    fa = act(dropout=False, flash_attention=True)
    assert fa == pytest.approx(sel + 4 * S * B * A, rel=1e-12)


def test_swiglu_gqa_layer():
    m = get_model("llama3-70b")
    s, b, h, f = 8192, 1, 8192, 28672
    kv_cols = 8 * 128
    tokens = s * b
    expected = 2 * tokens * (4 * h + h + 2 * kv_cols + h + 2 * f + f)  # norms/inputs, Q, K+V, attn out, up out, act out
    assert activation_bytes_per_layer(m, 0, Shard(b, s), ActivationPolicy(recompute="selective")) == pytest.approx(
        expected, rel=1e-12
    )
    tp8 = activation_bytes_per_layer(m, 0, Shard(b, s, tp=8), ActivationPolicy(recompute="selective"))
    assert tp8 == pytest.approx(expected / 8, rel=1e-12)


def test_context_parallel_divides_tokens():
    m = get_model("llama3-8b")
    whole = activation_bytes_per_layer(m, 0, Shard(1, 8192), ActivationPolicy(recompute="selective"))
    assert activation_bytes_per_layer(
        m, 0, Shard(1, 8192, cp=4), ActivationPolicy(recompute="selective")
    ) == pytest.approx(whole / 4)
    # Materialised scores: an (s/cp) x s block per head.
    a1 = activation_bytes_per_layer(m, 0, Shard(1, 8192)) - whole
    a4 = activation_bytes_per_layer(m, 0, Shard(1, 8192, cp=4)) - whole / 4
    assert a4 == pytest.approx(a1 / 4)


def test_mla_and_moe_layers():
    m = get_model("deepseek-v3")
    dense = activation_bytes_per_layer(m, 0, Shard(1, 4096), ActivationPolicy(recompute="selective"))
    moe = activation_bytes_per_layer(m, 5, Shard(1, 4096), ActivationPolicy(recompute="selective"))
    assert moe > dense
    # Routed-expert memory scales with top_k * expert_ffn: doubling top_k adds
    # one more copy of each assignment's (in + 2f + f) 16-bit tensors and its fp32
    # gate weight (gate applied to the SwiGLU output, Megatron-Core >= 0.13), or its
    # 16-bit expert output instead when the gate scales the output at the combine.
    m16 = m.with_(moe=replace(m.moe, top_k=16))
    more = activation_bytes_per_layer(m16, 5, Shard(1, 4096), ActivationPolicy(recompute="selective"))
    assert more - moe == pytest.approx(4096 * 8 * (2 * (7168 + 3 * 2048) + 4))
    comb = dict(recompute="selective", moe_gate_weighting="combine")
    assert activation_bytes_per_layer(m16, 5, Shard(1, 4096), ActivationPolicy(**comb)) - activation_bytes_per_layer(
        m, 5, Shard(1, 4096), ActivationPolicy(**comb)
    ) == pytest.approx(2 * 4096 * 8 * (7168 + 3 * 2048 + 7168))
    # Balanced assignments do not depend on ep; an imbalance override does.
    assert activation_bytes_per_layer(m, 5, Shard(1, 4096, ep=64), ActivationPolicy(recompute="selective")) == moe
    hot = activation_bytes_per_layer(
        m, 5, Shard(1, 4096, ep=64), ActivationPolicy(recompute="selective"), expert_tokens=2 * 4096 * 8
    )
    assert hot > moe
    with pytest.raises(ValueError, match="parallel.ep"):
        activation_bytes_per_layer(m, 5, Shard(1, 4096, ep=3))
    with pytest.raises(ValueError, match="parallel.sequence_parallel"):
        activation_bytes_per_layer(m, 5, Shard(1, 4096, tp=2, sequence_parallel=False))
    # TP with SP splits the MLA per-head tensors but not the latents.
    tp4 = activation_bytes_per_layer(m, 0, Shard(1, 4096, tp=4), ActivationPolicy(recompute="selective"))
    assert dense / 4 < tp4 < dense


def test_embedding_head_and_mtp_activations():
    assert embedding_activation_bytes(GPT3, Shard(B, S)) == 8 * S * B
    assert embedding_activation_bytes(GPT3, Shard(B, S, tp=8), ActivationPolicy(dropout=True)) == pytest.approx(
        8 * S * B + S * B * H / 8
    )
    for t in (1, 8):
        v = GPT3.vocab
        assert head_activation_bytes(GPT3, Shard(B, S, tp=t)) == pytest.approx(
            4 * S * B * H / t * (1 + v / H), rel=1e-12
        )
    assert mtp_activation_bytes(GPT3, Shard(B, S)) == 0
    dsv3 = get_model("deepseek-v3")
    mtp = mtp_activation_bytes(dsv3, Shard(1, 4096), ActivationPolicy(recompute="selective"))
    layer = activation_bytes_per_layer(dsv3, 60, Shard(1, 4096), ActivationPolicy(recompute="selective"))
    assert mtp > layer + head_activation_bytes(dsv3, Shard(1, 4096))


def test_bad_recompute_and_layer():
    with pytest.raises(ValueError, match="training.recompute"):
        act(recompute="some")
    with pytest.raises(IndexError):
        activation_bytes_per_layer(GPT3, 96, Shard(1, 1))


# ---- model state ---------------------------------------------------------------


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_paper_formulas(zero):
    """Rajbhandari et al. Fig. 1: 2Ψ + 2Ψ + 12Ψ, sharded by stage over N_d."""
    psi, nd = 7.5e9, 64
    layout = ParallelLayout(dp=nd, zero=zero)
    s = state_bytes(psi, 0, layout, grad_dtype_bytes=2)
    expected = {
        0: (2 * psi, 2 * psi, 12 * psi),
        1: (2 * psi, 2 * psi, 12 * psi / nd),
        2: (2 * psi, 2 * psi / nd, 12 * psi / nd),
        3: (2 * psi / nd, 2 * psi / nd, 12 * psi / nd),
    }[zero]
    assert (s.weights, s.gradients, s.optimizer) == pytest.approx(expected)
    assert s.total == pytest.approx(sum(expected))


def test_optimizer_variants():
    layout = ParallelLayout(zero=0)
    assert state_bytes(1.0, 0, layout, optimizer="muon").optimizer == 8
    assert state_bytes(1.0, 0, layout, optimizer="adam", moment_dtype_bytes=2).optimizer == 8  # DeepSeek-V3
    assert state_bytes(1.0, 0, layout, master_weights=False).optimizer == 8
    fp8 = state_bytes(1.0, 0, layout, dtype="fp8")
    assert fp8 == StateBytes(2, 4, 12)  # BF16 weights, FP32 gradients, FP32 master + moments
    with pytest.raises(ValueError, match="training.optimizer"):
        state_bytes(1.0, 0, layout, optimizer="lion")
    with pytest.raises(ValueError, match="training.dtype"):
        state_bytes(1.0, 0, layout, dtype="fp16")


def test_expert_states_shard_over_edp():
    layout = ParallelLayout(dp=16, cp=2, ep=8, zero=1)  # dp*cp = 32, edp = 4
    s = state_bytes(100.0, 80.0, layout)
    assert s.optimizer == pytest.approx(12 * (100 / 32 + 80 / 4))
    assert s.weights == 2 * 180


def test_rank_parameters_whole_model():
    for name in ("llama3-8b", "deepseek-v3", "gpt3-175b", "mixtral-8x7b"):
        m = get_model(name)
        dense, expert = rank_parameter_counts(m, ParallelLayout(), range(m.layers), True, True)
        assert dense + expert == parameter_count(m)
        assert expert == expert_parameter_count(m)


def test_rank_parameters_split():
    m = get_model("llama3-70b")
    layout = ParallelLayout(tp=8, pp=4, dp=2)
    ranges = layout.chunk_layer_ranges(m.layers)
    per_stage = [
        rank_parameter_counts(m, layout, r, has_embedding=i == 0, has_head=i == len(ranges) - 1)[0]
        for i, r in enumerate(ranges)
    ]
    replicated = m.layers * 2 * m.hidden + m.hidden  # RMSNorm scales and the final norm
    assert 8 * (sum(per_stage) - replicated) == parameter_count(m) - replicated
    # Experts: ep splits the routed experts, etp each expert.
    d = get_model("deepseek-v3")
    _, e = rank_parameter_counts(d, ParallelLayout(dp=64, ep=64), range(3, 4), False, False)
    assert e == 4 * 3 * 7168 * 2048
    _, e2 = rank_parameter_counts(d, ParallelLayout(tp=2, etp=2, dp=32, ep=32), range(3, 4), False, False)
    assert e2 == 8 * 3 * 7168 * 1024
    assert _block_params(d, True, 2, 32, 2)[1] == e2


def test_tied_and_mtp_copies_on_the_last_stage():
    gpt = get_model("gpt3-175b")
    last, _ = rank_parameter_counts(gpt, ParallelLayout(pp=2), range(48, 96), False, True)
    layers = sum(sum(_block_params(gpt, False)) for _ in range(48))
    assert last == layers + 50257 * 12288 + 2 * 12288  # tied embedding copy + final LayerNorm
    d = get_model("deepseek-v3")
    with_mtp, _ = rank_parameter_counts(d, ParallelLayout(pp=2), range(31, 61), False, True)
    without, _ = rank_parameter_counts(d, ParallelLayout(pp=2), range(31, 61), False, True, has_mtp=False)
    assert (
        with_mtp - without
        == sum(_block_params(d, True)) - _block_params(d, True)[1] + 2 * 7168 * 7168 + 3 * 7168 + 129280 * 7168
    )


def test_parameter_units_sum_to_the_rank_and_cut_at_embedding_and_head():
    """The trace reduces and gathers parameters unit by unit; the units must add up to the
    rank's parameters exactly (issue 13: the head was left out of the reduction)."""
    gpt, d = get_model("gpt3-175b"), get_model("deepseek-v3")
    for m, layout, layers, emb, head in (
        (gpt, ParallelLayout(tp=8, pp=2, dp=2), range(48, 96), False, True),
        (gpt, ParallelLayout(tp=8, pp=2, dp=2), range(0, 48), True, False),
        (d, ParallelLayout(pp=16, dp=128, ep=64), list(range(0, 4)) + list(range(57, 61)), True, True),
        (d, ParallelLayout(pp=2, dp=64, ep=64), range(31, 61), False, True),
    ):
        units = rank_parameter_units(m, layout, layers, emb, head)
        assert (sum(u[1] for u in units), sum(u[2] for u in units)) == rank_parameter_counts(
            m, layout, layers, emb, head
        )
        names = [u[0] for u in units]
        assert names[: len(layers)] == [f"L{i}" for i in layers]
        assert ("embed" in names) == emb and ("head" in names) == head
    # GPT-3's last stage: the head unit is the tied table's copy (50,257 x 12,288 / 8) and the
    # final LayerNorm (2 x 12,288, replicated over TP)
    units = dict(
        (u[0], u[1]) for u in rank_parameter_units(gpt, ParallelLayout(tp=8, pp=2, dp=2), range(48, 96), False, True)
    )
    assert units["head"] == 6283 * 12288 + 2 * 12288


def test_sharding_buffers_closed_form():
    """ZeRO-2: the largest unit's unsharded fp32 gradient; ZeRO-3 / FSDP: also the bf16
    weights of two units (computing + prefetched: PyTorch FSDP limit_all_gathers)."""
    units = [10.0, 30.0, 20.0]
    assert sharding_buffer_bytes(units, 0) == sharding_buffer_bytes(units, 1) == 0.0
    assert sharding_buffer_bytes(units, 2) == 4 * 30
    assert sharding_buffer_bytes(units, 3) == (2 * 2 + 4) * 30
    assert sharding_buffer_bytes(units, 3, gathered_units=3) == (3 * 2 + 4) * 30
    with pytest.raises(ValueError, match="parallel.zero"):
        sharding_buffer_bytes(units, 4)


def test_sharding_buffers_one_weight_array_at_a_time():
    """grad_reduce_granularity tensor (XLA GSPMD): the full-size gradient is the largest
    weight array, never more than the unit; the gathered weights stay whole units."""
    units = [10.0, 30.0, 20.0]
    assert sharding_buffer_bytes(units, 2, grad_array_params=7.0) == 4 * 7
    assert sharding_buffer_bytes(units, 3, grad_array_params=7.0) == 2 * 2 * 30 + 4 * 7
    assert sharding_buffer_bytes(units, 3, grad_array_params=99.0) == sharding_buffer_bytes(units, 3)
    assert sharding_buffer_bytes(units, 1, grad_array_params=7.0) == 0.0


def test_largest_weight_array_closed_form():
    """MaxText's 64B-class model (emb 8192, 64 heads of 128, MLP 28672, vocab 32000):
    the largest array is the 32000 x 8192 embedding table, not an MLP matrix
    (8192 x 28672); with TP 8 the table shard is 4000 x 8192. Llama-3-405B: its
    128256 x 16384 table too, whose TP-8 shard is still larger than one MLP matrix
    (16384 x 53248 / 8). DeepSeek-V3: the 256 routed experts' stacked matrix
    (256 x 7168 x 2048), over EP 64: 4 experts."""
    m64 = ModelSpec("m64", layers=64, hidden=8192, heads=64, ffn_hidden=28672, vocab=32000, ffn="swiglu")
    assert largest_weight_params(m64) == 32000 * 8192
    assert largest_weight_params(m64, tp=8) == max(4000 * 8192, 8192 * 28672 // 8)
    llama = get_model("llama3-405b")
    assert largest_weight_params(llama) == 128256 * 16384
    assert largest_weight_params(llama, tp=8) == 16032 * 16384
    assert largest_weight_params(replace(llama, vocab=32000), tp=8) == 16384 * 53248 // 8
    ds = get_model("deepseek-v3")
    assert largest_weight_params(ds) == 256 * 7168 * 2048
    assert largest_weight_params(ds, ep=64) == max(4 * 7168 * 2048, 129280 * 7168)


def test_rank_parameters_bad_layer():
    m = ModelSpec("x", layers=2, hidden=64, heads=4, ffn_hidden=128, vocab=100)
    with pytest.raises(IndexError):
        rank_parameter_counts(m, ParallelLayout(), range(0, 3), True, True)


def test_deepseek_v3_activation_savings_closed_form():
    """DeepSeek-V3 §3.2.3/§3.3.2 on one MoE layer (s = 4096, no parallelism, flash
    attention): norm outputs and MLA up-projections recomputed, the attention output
    in E5M6, expert inputs and SwiGLU inputs in FP8, SwiGLU outputs recomputed."""
    m = get_model("deepseek-v3")
    T, h, H, f = 4096, 7168, 128, 2048
    A = 8 * T  # token-expert assignments
    lse = 4 * T * H
    kept = (
        2 * T * h  # pre-attention norm input
        + 2 * T * 1536  # query latent (its normed copy recomputed)
        + 2 * T * (512 + 64)  # KV latent + RoPE key
        + 1.5 * T * H * 128  # attention output, E5M6
        + lse
        + 2 * T * h  # pre-FFN norm input
        + 4 * T * 256  # fp32 routing probabilities
        + A * (1 * h + 1 * 2 * f + 4)  # FP8 input, FP8 SwiGLU input, fp32 gate weight
        + T * (1 * 2 * f)
    )  # shared expert's FP8 SwiGLU input
    full = (
        2 * T * h
        + 2 * T * h
        + 2 * 2 * T * 1536
        + 2 * T * (512 + 64 + 512)
        + 2 * T * H * (2 * 192 + 128)
        + 2 * T * H * 128
        + lse
        + 2 * T * h
        + 2 * T * h
        + 4 * T * 256
        + A * (2 * (h + 2 * f + f) + 4)
        + 2 * T * (2 * f + f)
    )
    kw = dict(flash_attention=True)
    assert activation_bytes_per_layer(m, 5, Shard(1, 4096), ActivationPolicy(**kw)) == pytest.approx(full, rel=1e-12)
    saved = activation_bytes_per_layer(m, 5, Shard(1, 4096), ActivationPolicy(activation_saving="deepseek-v3", **kw))
    assert saved == pytest.approx(kept, rel=1e-12)
    assert saved < 0.6 * full
    # full recompute keeps only the layer input either way
    assert activation_bytes_per_layer(
        m, 5, Shard(1, 4096), ActivationPolicy(recompute="full", activation_saving="deepseek-v3")
    ) == activation_bytes_per_layer(m, 5, Shard(1, 4096), ActivationPolicy(recompute="full"))
    with pytest.raises(ValueError, match="training.activation_saving"):
        activation_bytes_per_layer(m, 5, Shard(1, 4096), ActivationPolicy(activation_saving="fp4"))
