"""Parameter and FLOP counts against published totals and closed forms."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.counts import (
    embedding_kernels,
    forward_flops_per_token,
    head_kernels,
    layer_kernels,
    model_flops_per_step,
    model_flops_per_token,
    mtp_kernels,
)
from workloads.kernels import KERNEL_KINDS, MATMUL_KINDS, Kernel, backward_flops_factor, backward_kernels
from workloads.model import MLASpec, ModelSpec, MoESpec
from workloads.parameters import (
    _block_params,
    active_parameter_count,
    embedding_parameter_count,
    expert_parameter_count,
    head_extra_parameter_count,
    head_parameter_count,
    layer_parameter_count,
    mtp_parameter_count,
    parameter_count,
)
from workloads.presets import get_model
from workloads.shard import Shard
from workloads.training import TrainingSpec


def matmul(kernels):
    return sum(k.flops for k in kernels if k.kind in MATMUL_KINDS)


# ---- published totals --------------------------------------------------------
# (preset, published total, published active or None, relative tolerance, source)
PUBLISHED = [
    ("gpt3-175b", 175e9, None, 0.01, "Brown et al. 2020"),
    ("megatron-1t", 1008.0e9, None, 0.01, "Narayanan Table 1"),
    ("llama3-8b", 8.03e9, None, 0.01, "Llama 3 HF card (8B)"),
    ("llama3-70b", 70.6e9, None, 0.01, "Llama 3 HF card (70B)"),
    ("llama3-405b", 405e9, None, 0.01, "Dubey et al. 2024"),
    ("mixtral-8x7b", 46.7e9, 12.9e9, 0.01, "Jiang et al. 2024 §2"),
    ("mixtral-8x22b", 141e9, 39e9, 0.01, "Mistral AI announcement"),
    ("qwen3-235b-a22b", 235e9, 22e9, 0.01, "Qwen3 report Table 2"),
    ("nemotron-4-340b", 340e9, None, 0.01, "Nemotron-4 340B report"),
    ("grok-1", 314e9, None, 0.01, "xAI Grok-1 release"),
    ("korthikanti-22b", 22e9, None, 0.01, "Korthikanti Table 3"),
    ("korthikanti-530b", 530e9, None, 0.01, "Korthikanti Table 3"),
    # DeepSeek-V3 §4.2: 671B total / 37B activated, main model without MTP.
    # Our exact count is 671.03B / 37.55B: the printed "37B" is 1.5% under
    # (truncated, not rounded, as the 37.55B count of the released config shows).
    ("deepseek-v3", 671e9, 37e9, 0.015, "DeepSeek-V3 §4.2"),
    # Kimi K2 report: 1.04T total / 32.6B activated. The released config (61
    # layers, 384 experts, vocab 163,840, no MTP) gives 1.0264T / 32.86B: the
    # total is 1.3% under the printed figure, the active 0.8% over.
    ("kimi-k2", 1.04e12, 32.6e9, 0.015, "Kimi K2 report"),
]


@pytest.mark.parametrize("name,total,active,tol,source", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_published_parameter_totals(name, total, active, tol, source):
    m = get_model(name)
    assert parameter_count(m, include_mtp=False) == pytest.approx(total, rel=tol), source
    if active is not None:
        assert active_parameter_count(m, include_mtp=False) == pytest.approx(active, rel=tol), source


def test_exact_counts_of_released_configs():
    # Regression values, hand-derived from the architecture tables.
    assert parameter_count(get_model("deepseek-v3"), include_mtp=False) == 671_026_404_352
    assert active_parameter_count(get_model("deepseek-v3"), include_mtp=False) == 37_552_282_624
    assert parameter_count(get_model("kimi-k2")) == 1_026_408_209_408
    assert parameter_count(get_model("llama3-8b")) == 8_030_261_248
    assert parameter_count(get_model("mixtral-8x7b")) == 46_702_792_704


def test_deepseek_v3_mtp_accounting():
    m = get_model("deepseek-v3")
    mtp = mtp_parameter_count(m)
    assert parameter_count(m) == parameter_count(m, include_mtp=False) + mtp
    # One MoE block (11.51B) + the 2h->h projection (0.10B) + norms.
    assert mtp == pytest.approx(11.61e9, rel=0.001)
    # HF release: "685B = 671B main model + 14B MTP"; the 14B includes stored
    # copies of the shared embedding and output head.
    hf_total = parameter_count(m) + 2 * embedding_parameter_count(m)
    assert hf_total == pytest.approx(685e9, rel=0.01)
    assert active_parameter_count(m) > active_parameter_count(m, include_mtp=False)
    assert head_extra_parameter_count(m) == 7168 + mtp
    assert head_extra_parameter_count(m, include_mtp=False) == 7168
    assert expert_parameter_count(m) == 59 * 256 * 3 * 7168 * 2048
    assert expert_parameter_count(m, include_mtp=False) == 58 * 256 * 3 * 7168 * 2048


def test_dense_active_equals_total():
    m = get_model("llama3-70b")
    assert active_parameter_count(m) == parameter_count(m)
    assert expert_parameter_count(m) == 0
    assert mtp_parameter_count(m) == 0


# ---- Narayanan et al. Eq. 2 and Eq. 3 -----------------------------------------

NARAYANAN_ROWS = [
    ("megatron-gpt-1.7b", 1.7),
    ("megatron-gpt-3.6b", 3.6),
    ("megatron-gpt-7.5b", 7.5),
    ("megatron-gpt-18.4b", 18.4),
    ("megatron-gpt-39.1b", 39.1),
    ("megatron-gpt-76.1b", 76.1),
    ("megatron-gpt-145.6b", 145.6),
    ("megatron-gpt-310.1b", 310.1),
    ("megatron-gpt-529.6b", 529.6),
    ("megatron-1t", 1008.0),
]
S, V = 2048, 51200


def eq2(l, h):
    """Narayanan Eq. 2: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))."""
    return 12 * l * h * h * (1 + 13 / (12 * h) + (V + S) / (12 * l * h))


@pytest.mark.parametrize("name,printed", NARAYANAN_ROWS)
def test_narayanan_eq2(name, printed):
    m = get_model(name)
    p = eq2(m.layers, m.hidden)
    # Eq. 2 counts learned position embeddings (s*h), which ModelSpec does not
    # model, and omits the final LayerNorm (2h): otherwise identical.
    assert parameter_count(m) == pytest.approx(p - S * m.hidden + 2 * m.hidden, rel=1e-12)
    # Eq. 2 reproduces Table 1's printed parameter column to its last digit.
    assert round(p / 1e9, 1) == printed
    if printed >= 7:  # 1.7B and 3.6B are printed to two digits only (1.65B, 3.56B)
        assert parameter_count(m) == pytest.approx(printed * 1e9, rel=0.01)


@pytest.mark.parametrize("name", ["megatron-gpt-1.7b", "megatron-gpt-18.4b", "megatron-gpt-145.6b", "megatron-1t"])
def test_narayanan_eq3_without_recompute(name):
    m = get_model(name)
    l, h = m.layers, m.hidden
    B = 512
    t = TrainingSpec(seq_len=S, global_batch_size=B)
    expected = 72 * B * S * l * h * h * (1 + S / (6 * h) + V / (12 * l * h))  # Eq. 3 divided by 4/3
    assert model_flops_per_step(m, t) == pytest.approx(expected, rel=1e-12)


def test_model_flops_is_three_times_forward():
    m = get_model("deepseek-v3")
    assert backward_flops_factor() == 2.0
    assert model_flops_per_token(m, 4096) == pytest.approx(3 * forward_flops_per_token(m, 4096))
    assert model_flops_per_token(m, 4096) > model_flops_per_token(m, 4096, include_mtp=False)
    # Dominated by ~6 x active parameters (minus the embedding lookup) + attention.
    six_n = 6 * (active_parameter_count(m, include_mtp=False) - embedding_parameter_count(m))
    assert six_n < model_flops_per_token(m, 4096, include_mtp=False) < 1.3 * six_n


def test_model_flops_per_step_scales_with_tokens():
    m = get_model("llama3-8b")
    t = TrainingSpec(seq_len=8192, global_batch_size=64)
    assert model_flops_per_step(m, t) == pytest.approx(model_flops_per_token(m, 8192) * 64 * 8192)
    with pytest.raises(ValueError, match="seq_len"):
        model_flops_per_token(m, 0)


# ---- layer kernels -------------------------------------------------------------


def test_gpt_layer_forward_flops_closed_form():
    m = get_model("gpt3-175b")
    b, s, h = 2, 2048, m.hidden
    ks = layer_kernels(m, 0, Shard(b, s))
    assert matmul(ks) == pytest.approx(24 * b * s * h * h + 4 * b * s * s * h, rel=1e-12)
    names = [k.name for k in ks]
    assert names[:4] == ["attn_norm", "qkv_proj", "attn_core", "out_proj"]
    assert {"mlp_up", "mlp_act", "mlp_down", "mlp_norm"} <= set(names)
    assert all(k.kind in KERNEL_KINDS for k in ks)
    qkv = next(k for k in ks if k.name == "qkv_proj")
    assert (qkv.m, qkv.n, qkv.k) == (b * s, 3 * h, h)
    assert qkv.flops == 2 * qkv.m * qkv.n * qkv.k
    core = next(k for k in ks if k.name == "attn_core")
    assert core.flops == 4 * b * s * s * m.heads * m.head_dim


def test_swiglu_and_gqa_shapes():
    m = get_model("llama3-70b")
    ks = {k.name: k for k in layer_kernels(m, 3, Shard(1, 4096, tp=8))}
    assert (ks["qkv_proj"].n, ks["qkv_proj"].k) == ((64 // 8 + 2 * 1) * 128, 8192)
    assert (ks["mlp_up"].n, ks["mlp_down"].k) == (2 * 28672 // 8, 28672 // 8)
    assert ks["attn_norm"].bytes < ks["qkv_proj"].bytes  # norm sees tokens/tp under SP
    no_sp = {k.name: k for k in layer_kernels(m, 3, Shard(1, 4096, tp=8, sequence_parallel=False))}
    assert no_sp["attn_norm"].flops == pytest.approx(8 * ks["attn_norm"].flops)


def test_kv_heads_replicated_when_tp_exceeds_them():
    m = get_model("qwen3-235b-a22b")  # 4 KV heads
    ks = {k.name: k for k in layer_kernels(m, 0, Shard(1, 1024, tp=8))}
    assert ks["qkv_proj"].n == (64 // 8 + 2 * 1) * 128


@pytest.mark.parametrize("name", ["megatron-gpt-18.4b", "llama3-70b", "nemotron-4-340b"])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tensor_parallel_splits_matmul_flops(name, tp):
    m = get_model(name)
    whole = matmul(layer_kernels(m, 1, Shard(1, 2048)))
    assert tp * matmul(layer_kernels(m, 1, Shard(1, 2048, tp=tp))) == pytest.approx(whole, rel=1e-12)
    h1 = matmul(head_kernels(m, Shard(1, 2048)))
    assert tp * matmul(head_kernels(m, Shard(1, 2048, tp=tp))) == pytest.approx(h1, rel=1e-12)


@pytest.mark.parametrize("cp", [2, 4])
def test_context_parallel_splits_queries(cp):
    m = get_model("llama3-8b")
    s = 8192
    whole = layer_kernels(m, 0, Shard(1, s))
    part = layer_kernels(m, 0, Shard(1, s, cp=cp))
    assert cp * matmul(part) == pytest.approx(matmul(whole), rel=1e-12)
    core = {k.name: k for k in part}["attn_core"]
    assert core.flops == 4 * (s // cp) * s * m.heads * m.head_dim


def test_mla_kernels():
    m = get_model("deepseek-v3")
    T, s = 4096, 4096
    ks = {k.name: k for k in layer_kernels(m, 0, Shard(1, s, tp=4))}
    assert {"q_down", "q_up", "kv_down", "kv_up", "attn_core", "out_proj", "q_down_norm", "kv_down_norm"} <= set(ks)
    assert (ks["q_down"].n, ks["q_down"].k) == (1536, 7168)  # replicated
    assert (ks["q_up"].n, ks["q_up"].k) == (32 * 192, 1536)
    assert (ks["kv_down"].n, ks["kv_up"].n) == (576, 32 * 256)
    assert ks["attn_core"].flops == 2 * T * s * 32 * (192 + 128)
    assert (ks["out_proj"].n, ks["out_proj"].k) == (7168, 32 * 128)
    # Dense first layers, MoE afterwards.
    assert "mlp_up" in ks and "router" not in ks
    moe = {k.name for k in layer_kernels(m, 3, Shard(1, s))}
    assert {"router", "expert_up", "expert_act", "expert_down", "shared_up", "shared_down"} <= moe


def test_mla_without_query_compression():
    m = ModelSpec(
        "mla-lite",
        layers=2,
        hidden=1024,
        heads=8,
        ffn_hidden=2048,
        vocab=1000,
        attention=MLASpec(q_lora_rank=0, kv_lora_rank=128, qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64),
    )
    ks = {k.name: k for k in layer_kernels(m, 0, Shard(1, 10))}
    assert "q_down" not in ks and (ks["q_proj"].n, ks["q_proj"].k) == (8 * 96, 1024)
    assert layer_parameter_count(m, 0) == (
        1024 * 768 + 1024 * 160 + 128 + 128 * 8 * 128 + 8 * 64 * 1024 + 3 * 1024 * 2048 + 2 * 1024
    )


def test_moe_expert_work():
    m = get_model("deepseek-v3")
    T, h, fe = 4096, 7168, 2048
    ks = {k.name: k for k in layer_kernels(m, 10, Shard(1, 4096, ep=64))}
    up, down = ks["expert_up"], ks["expert_down"]
    assert up.flops == 2 * T * 8 * 2 * fe * h and down.flops == 2 * T * 8 * fe * h
    assert up.groups == 4 and up.m == math.ceil(T * 8 / 4)
    assert ks["router"].flops == 2 * T * 256 * h
    assert ks["shared_up"].flops == 2 * T * 2 * fe * h
    # Load imbalance: twice the assignments, twice the expert FLOPs; weights read once.
    hot = {k.name: k for k in layer_kernels(m, 10, Shard(1, 4096, ep=64), expert_tokens=2 * T * 8)}
    assert hot["expert_up"].flops == pytest.approx(2 * up.flops)
    # Expert tensor parallelism: etp ranks share the assignments of the TP group.
    etp = {k.name: k for k in layer_kernels(m, 10, Shard(1, 4096, tp=2, ep=8, etp=2))}
    assert etp["expert_up"].flops == pytest.approx(up.flops / 2)
    assert etp["expert_up"].n == fe  # 2 * fe / etp
    assert etp["router"].flops == pytest.approx(ks["router"].flops / 2)
    # Top-2 Mixtral: per-token expert FLOPs are 2 experts of 3 matrices.
    mx = get_model("mixtral-8x7b")
    e = sum(
        k.flops
        for k in layer_kernels(mx, 0, Shard(1, 4096, cp=4096))
        if k.name.startswith("expert_") and k.kind == "gemm"
    )
    assert e == 2 * 2 * 3 * 4096 * 14336


def test_moe_needs_sequence_parallel_with_tp():
    with pytest.raises(ValueError, match="sequence_parallel"):
        layer_kernels(get_model("mixtral-8x7b"), 0, Shard(1, 128, tp=2, sequence_parallel=False))


@pytest.mark.parametrize(
    "kwargs,field",
    [({"tp": 3}, "parallel.tp"), ({"ep": 3}, "parallel.ep"), ({"etp": 3}, "parallel.etp"), ({"cp": 0}, "parallel.cp")],
)
def test_bad_parallel_degrees(kwargs, field):
    with pytest.raises(ValueError, match=field):
        layer_kernels(get_model("deepseek-v3"), 5, Shard(1, 128, **kwargs))


def test_layer_out_of_range():
    with pytest.raises(IndexError):
        layer_kernels(get_model("llama3-8b"), 32, Shard(1, 1))
    with pytest.raises(IndexError):
        layer_parameter_count(get_model("llama3-8b"), -1)


def test_embedding_and_head_kernels():
    m = get_model("llama3-8b")
    (emb,) = embedding_kernels(m, Shard(1, 1000, tp=4))
    assert emb.kind == "embedding" and emb.flops == 0 and emb.bytes > 0
    names = [k.name for k in head_kernels(m, Shard(1, 1000, tp=4))]
    assert names == ["final_norm", "lm_head", "loss"]
    head = head_kernels(m, Shard(1, 1000, tp=4))[1]
    assert head.flops == 2 * 1000 * (128256 / 4) * 4096
    assert (head.m, head.n, head.k) == (1000, 128256 // 4, 4096)
    # A vocabulary tp does not divide: n rounds up, FLOPs stay exact.
    odd = head_kernels(get_model("gpt3-175b"), Shard(1, 10, tp=8))[1]
    assert odd.n == math.ceil(50257 / 8) and odd.flops == pytest.approx(2 * 10 * 50257 / 8 * 12288)


def test_mtp_kernels():
    assert mtp_kernels(get_model("llama3-8b"), Shard(1, 128)) == []
    m = get_model("deepseek-v3")
    ks = mtp_kernels(m, Shard(1, 4096, tp=2, cp=16, ep=8))
    names = [k.name for k in ks]
    assert names[0] == "mtp0.embed" and "mtp0.proj" in names and "mtp0.expert_up" in names
    assert names[-3:] == ["mtp0.final_norm", "mtp0.lm_head", "mtp0.loss"]
    proj = next(k for k in ks if k.name == "mtp0.proj")
    assert (proj.n, proj.k) == (7168 // 2, 2 * 7168)


def test_backward_kernels():
    k = layer_kernels(get_model("llama3-8b"), 0, Shard(1, 512))[1]  # qkv_proj
    dgrad, wgrad = backward_kernels(k)
    assert dgrad.flops + wgrad.flops == backward_flops_factor() * k.flops
    assert (dgrad.m, dgrad.n, dgrad.k) == (k.m, k.k, k.n)
    assert (wgrad.m, wgrad.n, wgrad.k) == (k.k, k.n, k.m)
    core = next(x for x in layer_kernels(get_model("llama3-8b"), 0, Shard(1, 512)) if x.kind == "attention")
    (bwd,) = backward_kernels(core)
    assert bwd.flops == 2 * core.flops and bwd.kind == "attention"
    norm = Kernel("n", "norm", 10.0, 100.0)
    assert backward_kernels(norm)[0].bytes == 200.0


def test_parameter_parts_add_up():
    m = get_model("llama3-8b")
    assert embedding_parameter_count(m) == 128256 * 4096
    assert head_parameter_count(m) == 128256 * 4096 + 4096
    assert parameter_count(m) == embedding_parameter_count(m) + head_parameter_count(m) + sum(
        layer_parameter_count(m, i) for i in range(m.layers)
    )
    tied = get_model("gpt3-175b")
    assert head_parameter_count(tied) == 2 * 12288  # final LayerNorm only


@st.composite
def small_models(draw):
    tp = draw(st.sampled_from([1, 2, 4]))
    heads = tp * draw(st.integers(1, 4))
    kv = draw(st.sampled_from([h for h in range(1, heads + 1) if heads % h == 0 and h % tp == 0]))
    head_dim = draw(st.sampled_from([8, 16]))
    hidden = heads * head_dim
    moe = None
    if draw(st.booleans()):
        experts = draw(st.sampled_from([4, 8]))
        moe = MoESpec(
            experts=experts,
            top_k=draw(st.integers(1, 2)),
            expert_ffn_hidden=8 * tp,
            shared_experts=draw(st.integers(0, 1)),
            dense_layers=draw(st.integers(0, 1)),
        )
    m = ModelSpec(
        "h",
        layers=2,
        hidden=hidden,
        heads=heads,
        kv_heads=kv,
        ffn_hidden=16 * tp,
        vocab=64,
        ffn=draw(st.sampled_from(["swiglu", "gelu"])),
        bias=draw(st.booleans()),
        moe=moe,
        norm=draw(st.sampled_from(["rmsnorm", "layernorm"])),
    )
    return m, tp


@settings(max_examples=40, deadline=None)
@given(small_models(), st.integers(1, 3))
def test_tp_ranks_together_do_the_whole_layer(model_tp, b):
    m, tp = model_tp
    s = 8 * tp
    for layer in range(m.layers):
        whole = matmul(layer_kernels(m, layer, Shard(b, s)))
        per_rank = matmul(layer_kernels(m, layer, Shard(b, s, tp=tp)))
        assert tp * per_rank == pytest.approx(whole, rel=1e-9)
        # Each GEMM does 2 FLOPs per weight per token: per-token GEMM FLOPs are
        # twice the layer's active weights (norm scales and biases excluded).
        if not m.bias:
            gemm = sum(k.flops for k in layer_kernels(m, layer, Shard(b, s)) if k.kind == "gemm")
            weights = sum(_block_params(m, m.is_moe_layer(layer), active=True))
            weights -= 2 * (m.hidden if m.norm == "rmsnorm" else 2 * m.hidden)
            assert gemm / (b * s) == pytest.approx(2 * weights, rel=1e-12)


def test_unfused_attention_score_traffic_per_element():
    # Unfused (pre-FlashAttention) Megatron attention materialises b * a/t * s * s scores.
    # Bytes per score element derived from the kernels Megatron-LM ran (the causal fused
    # softmax of megatron/fused_kernels/scaled_upper_triang_masked_softmax.h loads only
    # the unmasked half of each row and writes it whole; PyTorch dropout keeps a 1-byte
    # mask): forward 2 (QK^T write) + 1 + 2 (softmax) + 2 + 2 + 1 (dropout) + 2 (PV read)
    # = 12; backward 2 (dP write) + 2 (dV reads P) + 5 (dropout) + 4 (softmax) + 4 (dQ, dK
    # read dS) = 17 -- not 2x the forward as for a plain element-wise kernel.
    m = get_model("korthikanti-22b")  # h 6144, 64 heads; 22B layer of Korthikanti et al. Table 4
    b, s, tp = 4, 2048, 8
    ks = layer_kernels(m, 0, Shard(b, s, tp=tp), flash_attention=False)
    (scores,) = [k for k in ks if k.name == "attn_scores"]
    elements = b * (m.heads // tp) * s * s
    assert scores.bytes == 12 * elements and scores.flops == 0
    (bwd,) = backward_kernels(scores)
    assert bwd.bytes == 17 * elements and bwd.name == "attn_scores.bwd"
    assert "attn_scores" not in {k.name for k in layer_kernels(m, 0, Shard(b, s, tp=tp))}  # flash: none


def test_unfused_attention_forward_time_matches_korthikanti_table4():
    # Korthikanti et al. 2022 (arXiv 2205.05198) Table 4, one 22B layer (h 6144, 64 heads,
    # t = 8, micro-batch 4, s = 2048) on A100: selective recompute -- re-running QK^T,
    # softmax, dropout and PV in the backward pass -- adds 1.3 ms (13.2 vs 11.9 ms; the
    # paper: "The overhead of selective recomputation is 1.3ms"). The simulator's unfused
    # attention forward (attn_core + attn_scores) with the Ampere calibration: 1.24 ms.
    from simulator.engine.compute import calibration_for, kernel_time_s
    from topologies.chips import get_chip

    chip = get_chip("a100")
    cal = calibration_for(chip)
    ks = layer_kernels(get_model("korthikanti-22b"), 0, Shard(4, 2048, tp=8), flash_attention=False)
    core_s = sum(kernel_time_s(k, chip, cal) for k in ks if k.name in ("attn_core", "attn_scores"))
    assert core_s == pytest.approx(1.3e-3, rel=0.10)
