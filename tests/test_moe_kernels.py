"""The kernels around the routed experts (workloads.moe_kernels.moe_kernels) and the grouped
GEMMs' efficiency by shape (simulator.engine.grouped_gemm), against closed forms and the
published figures they come from."""

import math

import numpy as np
import pytest
from test_moe import moe_scenario

from simulator import simulate
from simulator.engine import grouped_gemm as gg
from simulator.engine.compute import (
    DEFAULT_COMPUTE_CALIBRATION,
    grouped_gemm_shape_loss_s,
    kernel_time_s,
)
from topologies.chips import get_chip
from workloads.counts import layer_kernels
from workloads.kernels import Kernel, backward_kernels
from workloads.moe_kernels import MoEOptions
from workloads.moe_load import ExpertLoad, rank_load_factors
from workloads.presets import get_model
from workloads.shard import Shard

H800 = get_chip("h800")
HOPPER = DEFAULT_COMPUTE_CALIBRATION["hopper"]


# ---- grouped-GEMM efficiency by shape ---------------------------------------------------


def test_table_points_are_reproduced():
    for p in gg.DEEPGEMM_H800_FP8:
        top = max(q.tflops for q in gg.DEEPGEMM_H800_FP8 if (q.n, q.k) == (p.n, p.k))
        assert gg.grouped_gemm_efficiency(p.m, (p.n, p.k)) == pytest.approx(p.tflops / top, rel=1e-12)


def test_efficiency_is_monotone_lower_for_few_rows_and_one_when_large():
    for dims in ((4096, 7168), (7168, 2048), (3000, 5000), (1024, 1024)):
        rs = [gg.grouped_gemm_efficiency(m, dims) for m in np.geomspace(16, 65536, 60)]
        assert all(b >= a - 1e-15 for a, b in zip(rs, rs[1:]))
        assert rs[-1] == 1.0 and rs[0] < 0.7
    # the DeepGEMM masked rows at 256 tokens per expert: 932 / 1346 and 815 / 1214
    assert gg.grouped_gemm_efficiency(256, (4096, 7168)) == pytest.approx(932 / 1346)
    assert gg.grouped_gemm_efficiency(100, (7168, 2048)) == pytest.approx(815 / 1214)  # held below the table


def test_rows_scale_by_ridge_point():
    h100, a100 = get_chip("h100"), get_chip("a100")
    # H100 BF16 and H800 FP8 have the same ridge in FLOPs per weight element (591)
    assert gg.equivalent_rows(1000, h100.peak("bf16"), h100.hbm_bw_bytes_per_s, "bf16") == pytest.approx(1000, rel=1e-3)
    r = gg.equivalent_rows(1000, a100.peak("bf16"), a100.hbm_bw_bytes_per_s, "bf16")
    assert r == pytest.approx(1000 * 1979e12 / 3.35e12 / (a100.peak("bf16") * 2 / a100.hbm_bw_bytes_per_s))
    assert r > 1000  # fewer FLOPs per byte: the same rows lose less


def _grouped(groups, m, n, k):
    rows = groups * m
    return Kernel("expert_up", "gemm", 2.0 * rows * n * k, 2 * (rows * k + rows * n + groups * n * k), m, n, k, groups)


def test_published_masked_figure_beside_the_model():
    """DeepGEMM README @327ec92, masked layout, 1 group x 1024 rows, N 4096, K 7168, H800 FP8:
    1233 TFLOP/s against 1346 at 8192 rows (contiguous). The simulated grouped GEMM (here 4
    groups of 1024 rows, compute-bound in the roofline) runs at the in-situ FP8 rate x the
    dimension factors of N and K x 1233 / 1346."""
    k = _grouped(4, 1024, 4096, 7168)
    t = kernel_time_s(k, H800, HOPPER, "fp8") - HOPPER.launch_overhead_s
    achieved_tflops = k.flops / t / 1e12
    dims = (4096 / (4096 + HOPPER.gemm_dim_half)) * (7168 / (7168 + HOPPER.gemm_dim_half))
    published_ratio = 1233 / 1346
    assert achieved_tflops == pytest.approx(1979 * HOPPER.fp8_gemm_efficiency * dims * published_ratio, rel=1e-9)
    loss = grouped_gemm_shape_loss_s(k, H800, HOPPER, "fp8")
    assert loss == pytest.approx(t * (1 - published_ratio), rel=1e-9)


def test_weight_gradient_loses_on_its_token_dimension():
    fwd = _grouped(24, 512, 4096, 7168)
    dgrad, wgrad = backward_kernels(fwd)
    assert grouped_gemm_shape_loss_s(wgrad, H800, HOPPER, "fp8") > 0
    assert grouped_gemm_shape_loss_s(dgrad, H800, HOPPER, "fp8") > 0
    big = _grouped(4, 8192, 4096, 7168)
    assert all(grouped_gemm_shape_loss_s(x, H800, HOPPER, "fp8") == 0 for x in (big, *backward_kernels(big)))
    # a dense GEMM keeps the d / (d + half) factor on every dimension, no table
    dense = Kernel("mlp_up", "gemm", 2.0 * 256 * 4096 * 7168, 1.0, 256, 4096, 7168)
    assert grouped_gemm_shape_loss_s(dense, H800, HOPPER, "fp8") == 0


# ---- the kernels around the experts ---------------------------------------------------


def _moe_layer(opts=None, tokens=4096, ep=64):
    model = get_model("deepseek-v3")
    shard = Shard(micro_batch_size=1, seq_len=tokens, ep=ep)
    return model, {k.name: k for k in layer_kernels(model, 3, shard, moe_options=opts)}


def test_permutations_are_memory_bound_passes_counted_once():
    model, ks = _moe_layer()
    T, h, k, E = 4096, model.hidden, model.moe.top_k, model.moe.experts
    S = T * k
    perm = ks["moe_permute"]
    row_map = T * E + 4 * T * (2 * E + 1) + 4 * T * (2 * k + 1)
    assert perm.bytes == 2 * (T * h + S * h) + 8 * S + row_map  # read each token once, write its k rows
    assert perm.flops == 0 and perm.kind == "elementwise"
    (bwd,) = backward_kernels(perm)
    assert bwd.bytes == 2 * (S * h + T * h) + 8 * S + 4 * T * (2 * k + 1)  # not 2x the forward
    un = ks["moe_unpermute"]
    assert un.bytes == 2 * (S * h + T * h) + 4 * T * (2 * k + 1)
    # 4 local experts: the received rows are sorted by expert and back
    A = S
    assert ks["expert_sort_chunks"].bytes == ks["expert_unsort_chunks"].bytes == 4 * A * h + 12 * A
    # the routing weight multiplies inside the activation: one FP32 weight per row
    width = model.moe.expert_ffn_hidden
    assert ks["expert_act"].bytes == 2 * 3 * A * width + 4 * A


def test_histogram_and_bias_statistics_have_no_backward():
    _, ks = _moe_layer()
    assert backward_kernels(ks["moe_tokens_per_expert"]) == ()
    assert backward_kernels(ks["moe_router_stats"]) == ()
    _, aux = _moe_layer(MoEOptions(balance="aux-loss-global"))
    assert aux["moe_router_stats"].bytes > 10 * ks["moe_router_stats"].bytes
    assert len(backward_kernels(aux["moe_router_stats"])) == 1


def test_fp32_router_gradients_run_at_tf32():
    _, ks = _moe_layer(MoEOptions(router_dtype="fp32"))
    r = ks["router"]
    assert r.math_dtype == "bf16"  # BF16 operands even in an FP8 step
    dgrad, wgrad = backward_kernels(r)
    assert dgrad.math_dtype == wgrad.math_dtype == "tf32"
    h100 = get_chip("h100")
    cal = HOPPER.with_(memory_efficiency=1.0, launch_overhead_s=0.0)
    fast = HOPPER.with_(launch_overhead_s=0.0)
    # math time (bytes made free): TF32 is half the BF16 rate
    free = dgrad.__class__(**{**dgrad.__dict__, "bytes": 0.0})
    bf16 = dgrad.__class__(**{**dgrad.__dict__, "bytes": 0.0, "math_dtype": "bf16"})
    assert kernel_time_s(free, h100, fast) == pytest.approx(2 * kernel_time_s(bf16, h100, fast))
    # the FP8 step does not time the router at the FP8 rate
    assert kernel_time_s(r, h100, cal, "fp8") == kernel_time_s(r, h100, cal, "bf16")


def test_pad_to_capacity_computes_on_capacity():
    cf = 1.25
    _, drop = _moe_layer()
    _, pad = _moe_layer(MoEOptions(capacity_factor=cf, pad_to_capacity=True))
    assert pad["expert_up"].flops == pytest.approx(cf * drop["expert_up"].flops)
    assert "moe_tokens_per_expert" not in pad and "moe_capacity_drop" in pad
    # a capacity factor of 1 pads too: fixed counts, no histogram (Grok-1's recipe)
    _, one = _moe_layer(MoEOptions(capacity_factor=1.0, pad_to_capacity=True))
    assert "moe_tokens_per_expert" not in one
    f = rank_load_factors(ExpertLoad("zipf", 1.5, cf, pad_to_capacity=True), 64, 8, 8, 4096, 3)
    assert np.allclose(f, math.ceil(cf * 4096 * 8 / 64) / (4096 * 8 / 64))
    with pytest.raises(Exception, match="capacity_factor"):
        ExpertLoad(pad_to_capacity=True)


def test_summary_reports_the_moe_terms():
    res = simulate(moe_scenario())
    terms = res.summary["moe_terms_s"]
    for key in ("routing", "permutation", "unpermutation", "grouped_gemm", "grouped_gemm_shape_loss"):
        assert terms[key] >= 0
    assert terms["routing"] > 0 and terms["permutation"] > 0 and terms["unpermutation"] > 0
    # the tiny model's experts get 1024 * 2 / 16 = 128 rows each: below the table's 8192
    assert 0 < terms["grouped_gemm_shape_loss"] < terms["grouped_gemm"]
