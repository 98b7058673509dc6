"""Megatron-Core's unfused MoE router and permutations (workloads.moe_unfused, switched by
training.moe_router_fusion / training.moe_permute_fusion): the launches counted from the code
(NVIDIA/Megatron-LM d98e8a64, megatron/core/transformer/moe/moe_utils.py), what they cost a
layer, and that the fused default is what it was."""

import pytest
from test_moe import moe_scenario

from simulator import simulate
from simulator.engine.compute import DEFAULT_COMPUTE_CALIBRATION, kernel_time_s
from topologies.chips import get_chip
from workloads import moe_unfused
from workloads.counts import layer_kernels
from workloads.kernels import backward_kernels
from workloads.moe_kernels import MoEOptions
from workloads.presets import get_model
from workloads.shard import Shard

H100 = get_chip("h100")
HOPPER = DEFAULT_COMPUTE_CALIBRATION["hopper"]


def _layer(model_name: str, opts: MoEOptions, ep: int = 8):
    model = get_model(model_name)
    layer = model.moe.dense_layers  # the first MoE layer
    shard = Shard(micro_batch_size=1, seq_len=4096, ep=ep)
    return {k.name: k for k in layer_kernels(model, layer, shard, moe_options=opts)}


def _launches(ks) -> tuple[int, int]:
    fwd = sum(k.launches for k in ks.values())
    bwd = sum(b.launches for k in ks.values() for b in backward_kernels(k))
    return fwd, bwd


def test_softmax_router_launches_as_counted_from_the_code():
    # topk, softmax, type_as, zeros + scatter copy + scatter (probs), the map's five
    c = moe_unfused.router_topk("softmax", False, False, 2, 4096, 128)
    assert (c.launches, c.bwd_launches) == (11, 5)
    # FP32 logits (--moe-router-dtype fp32): no cast back
    c32 = moe_unfused.router_topk("softmax", False, False, 4, 4096, 128)
    assert (c32.launches, c32.bwd_launches) == (10, 4)


def test_sigmoid_group_limited_router_launches_as_counted_from_the_code():
    # DeepSeek-V3: cast, sigmoid, + bias, group_limited_topk's ten, gather, sum + eps + div,
    # scaling, type_as, the two scatters (3 + 5)
    c = moe_unfused.router_topk("sigmoid", True, True, 2, 4096, 256)
    assert c.launches == 1 + 1 + 1 + 10 + 1 + 3 + 1 + 1 + 3 + 5 == 27
    assert c.bwd_launches == 12
    # no expert grouping (Kimi K2): one topk instead of ten
    assert moe_unfused.router_topk("sigmoid", True, False, 2, 4096, 384).launches == 18


def test_fused_default_is_unchanged_and_unfused_adds_the_counted_launches():
    fused = _layer("qwen3-30b-a3b", MoEOptions())
    assert fused == _layer("qwen3-30b-a3b", MoEOptions(router_fusion=True, permute_fusion=True))
    router = _layer("qwen3-30b-a3b", MoEOptions(router_fusion=False))
    f0, b0 = _launches(fused)
    f1, b1 = _launches(router)
    assert (f1 - f0, b1 - b0) == (11 - 1, 5 - 1)  # the fused top-k: one kernel, one backward
    both = _layer("qwen3-30b-a3b", MoEOptions(router_fusion=False, permute_fusion=False))
    f2, b2 = _launches(both)
    # permute with the probabilities (gate weight in the activation): 7 forward, 5 backward;
    # unpermute without them: 2 and 1; the chunk sort's second cat (probabilities): 1 and 1
    assert (f2 - f1, b2 - b1) == ((7 - 1) + (2 - 1) + 1, (5 - 1) + (1 - 1) + 1)


def test_unfused_permutation_moves_more_bytes_than_the_fused_kernels():
    """The fused permute reads a token once (R h + S h); index_select reads each copy (2 S h).
    The fused unpermute writes each output once; zeros + scatter_add_ write it three times."""
    act, h, R, k, E = 2, 2048, 4096, 8, 128
    S = R * k
    p = moe_unfused.permute(R, E, S, False, False, act, h, 2)
    assert p.bytes >= act * 2 * S * h
    u = moe_unfused.unpermute(R, E, S, False, False, act, h, 2)
    assert u.bytes == act * (S * h + 3 * R * h)
    fused = _layer("qwen3-30b-a3b", MoEOptions())
    unfused = _layer("qwen3-30b-a3b", MoEOptions(permute_fusion=False))
    for name in ("moe_permute", "moe_unpermute"):
        pair = [unfused[name], unfused[f"{name}_nograd"]]
        assert sum(k.bytes for k in pair) > fused[name].bytes
        t_fused = kernel_time_s(fused[name], H100, HOPPER)
        assert sum(kernel_time_s(k, H100, HOPPER) for k in pair) > t_fused


def test_drop_and_pad_and_combine_take_their_own_paths():
    dp = moe_unfused.permute(4096, 8, 8192, True, True, 2, 6144, 2)
    dl = moe_unfused.permute(4096, 8, 8192, True, False, 2, 6144, 2)
    assert (dp.launches, dl.launches) == (5 + 5 + 1, 4 + 2 + 1)
    # merging probabilities in the unpermutation (Megatron-Core <= 0.12, Grok-1's and Mixtral's
    # recipes): their gather and the multiply, and four more backward kernels
    plain = moe_unfused.unpermute(4096, 8, 8192, False, True, 2, 6144, 2)
    merged = moe_unfused.unpermute(4096, 8, 8192, True, True, 2, 6144, 2)
    assert (merged.launches - plain.launches, merged.bwd_launches - plain.bwd_launches) == (6, 6)


def test_aux_loss_router_is_unfused_too():
    fused = _layer("mixtral-8x7b", MoEOptions(balance="aux-loss-local"))
    unfused = _layer("mixtral-8x7b", MoEOptions(balance="aux-loss-local", router_fusion=False))
    assert fused["moe_router_stats"].launches == 1
    pair = [unfused["moe_router_stats"], unfused["moe_router_stats_nograd"]]
    assert sum(k.launches for k in pair) == 1 + 1 + 5 + 1 + 4
    assert [b.launches for k in pair for b in backward_kernels(k)] == [5]


def test_a_step_with_unfused_ops_is_slower_and_reports_them_in_its_terms():
    base = simulate(moe_scenario())
    sc = moe_scenario(training={"moe_router_fusion": False, "moe_permute_fusion": False})
    slow = simulate(sc)
    assert slow.summary["step_time_s"] > base.summary["step_time_s"]
    for term in ("routing", "permutation", "unpermutation"):
        assert slow.summary["moe_terms_s"][term] > base.summary["moe_terms_s"][term]
    # the same scenario, the same answer
    again = simulate(sc).summary
    assert {k: v for k, v in again.items() if k != "sim_wall_s"} == {
        k: v for k, v in slow.summary.items() if k != "sim_wall_s"
    }


def test_the_options_apply_to_moe_models_only():
    from helpers import scenario

    from simulator import ScenarioError, load_scenario

    dense = scenario(
        training={"seq_len": 1024, "micro_batch_size": 1, "global_batch_size": 16, "moe_router_fusion": False}
    )
    with pytest.raises(ScenarioError, match="moe_router_fusion"):
        load_scenario(dense)


def test_trace_files_keep_the_unfused_launches(tmp_path):
    """JSON and Chakra traces of a step with the unfused chains give back the same kernels
    and the same step."""
    from workloads.trace.io import read_trace, trace_from_dict, trace_to_dict, write_trace

    res = simulate(moe_scenario(training={"moe_router_fusion": False, "moe_permute_fusion": False}))
    tr = res.trace
    assert any(k.name.endswith("_nograd") for op in tr.ops for k in op.kernels)
    back = trace_from_dict(trace_to_dict(tr))
    assert [op.kernels for op in back.ops] == [op.kernels for op in tr.ops]
    pytest.importorskip("chakra.schema.protobuf.et_def_pb2")
    write_trace(tr, tmp_path / "et", format="chakra")
    assert [op.kernels for op in read_trace(tmp_path / "et").ops] == [op.kernels for op in tr.ops]


def test_a_chain_is_two_kernels_with_its_time_launches_and_backward():
    """The chain's kernel stands for its backward's launches and carries the backward bytes; its
    ``_nograd`` twin for the other forward launches, with no backward. Their time on the roofline
    is the chain's: its bytes at the memory-bound rate plus one overhead a launch."""
    from workloads.moe_kernels import _chain_kernels

    c = moe_unfused.router_topk("sigmoid", True, True, 2, 4096, 256)
    a, b = _chain_kernels("moe_router_topk", c)
    assert (a.launches, b.launches) == (12, 27 - 12) and b.name == "moe_router_topk_nograd"
    assert a.bytes + b.bytes == pytest.approx(c.bytes, rel=1e-12)
    assert [k.launches for k in backward_kernels(a)] == [12] and backward_kernels(b) == ()
    assert backward_kernels(a)[0].bytes == c.bwd_bytes
    cal = HOPPER
    rate = H100.hbm_bw_bytes_per_s * cal.memory_efficiency
    chain_s = c.bytes / rate + 27 * cal.launch_overhead_s
    assert kernel_time_s(a, H100, cal) + kernel_time_s(b, H100, cal) == pytest.approx(chain_s, rel=1e-9)
    # a chain whose backward has as many launches as its forward is one kernel
    assert len(_chain_kernels("x", moe_unfused.Chain(3, 3, 1e6, 1e6))) == 1
