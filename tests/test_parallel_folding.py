"""MoE Parallel Folding: expert parallelism over the ranks of a pipeline stage,
across the tensor-parallel ranks (Megatron-Core, megatron/core/transformer/moe/
README.md "MoE Parallel Folding"; Liu et al. 2025, arXiv 2504.14960)."""

from __future__ import annotations

import copy

import pytest
from test_moe import TINY_MOE, moe_scenario

from simulator import simulate
from simulator.scenario.loading import load_scenario
from simulator.scenario.schema import ScenarioError
from workloads import memory, parameters
from workloads.layout import LayoutError, ParallelLayout
from workloads.presets import get_model
from workloads.trace.builder import build_trace


def test_folded_groups_closed_form_16_ranks_tp4_dp4_ep8():
    # 16 ranks, tp4 dp4 ep8 etp1: ep does not divide dp = 4, so EP folds over the TP ranks.
    # Megatron-Core's expert RankGenerator (tp=etp=1, ep=8, dp=edp=16/8=2, order
    # tp-cp-ep-dp-pp) makes the EP groups consecutive runs of 8 ranks and the
    # expert-data-parallel groups the ranks 8 apart.
    L = ParallelLayout(tp=4, dp=4, ep=8)
    assert L.folded and L.edp == 2
    for r in range(16):
        assert L.group(r, "ep") == tuple(range(r // 8 * 8, r // 8 * 8 + 8))
        assert L.group(r, "edp") == (r % 8, r % 8 + 8)
        assert L.group(r, "etp") == (r,)
        assert L.group(r, "tp") == tuple(range(r // 4 * 4, r // 4 * 4 + 4))  # attention TP unchanged
    # An EP group spans two whole TP groups: ranks 0..3 (one TP group) dispatch to each other.
    assert set(L.group(0, "tp")) < set(L.group(0, "ep"))


def test_folded_groups_with_expert_tp_and_pipeline():
    # tp4 dp4 pp2 ep4 etp2 (32 ranks, stages of 16): etp innermost (pairs), then ep (stride 2),
    # then edp (stride 2*4 = 8), within each stage; stage 1 is stage 0 shifted by 16.
    L = ParallelLayout(tp=4, dp=4, pp=2, ep=4, etp=2)
    assert L.folded and L.edp == 16 // 8
    assert L.groups("etp", 0) == [(2 * i, 2 * i + 1) for i in range(8)]
    assert L.groups("ep", 0) == [(0, 2, 4, 6), (1, 3, 5, 7), (8, 10, 12, 14), (9, 11, 13, 15)]
    assert L.groups("edp", 0) == [(i, i + 8) for i in range(8)]
    assert L.group(16 + 5, "ep") == tuple(16 + x for x in (1, 3, 5, 7))
    assert {L.stage_of(r) for r in L.group(21, "edp")} == {1}


def test_folded_expert_nesting_follows_order():
    # order nests tp, ep, dp; with dp inside ep (tp-cp-dp-ep-pp) the expert mesh is
    # etp, edp, ep: EP takes every second rank, EDP pairs neighbours.
    L = ParallelLayout(tp=4, dp=4, ep=8, order=("tp", "cp", "dp", "ep", "pp"))
    assert L.group(0, "ep") == tuple(range(0, 16, 2))
    assert L.group(0, "edp") == (0, 1)


def test_deepspeed_mapping_carves_ep_out_of_dp():
    # expert_mapping deepspeed (deepspeed/utils/groups.py, _get_expert_parallel_ranks,
    # deepspeedai/DeepSpeed edaa7221): the EP group is carved out of the data-parallel ranks
    # at the same TP coordinate (tp innermost, so ranks tp apart).
    L = ParallelLayout(tp=2, dp=8, ep=4, expert_mapping="deepspeed")
    assert not L.folded
    assert L.group(0, "ep") == (0, 2, 4, 6) and L.group(1, "ep") == (1, 3, 5, 7)
    # etp = 1: both TP ranks at an EP position hold the same full-width experts, so the
    # expert gradient is summed over tp * dp*cp/ep = 4 ranks.
    assert L.edp == 4 and L.group(0, "edp") == L.group(1, "edp") == (0, 1, 8, 9)
    T = ParallelLayout(tp=2, dp=8, ep=4, etp=2, expert_mapping="deepspeed")
    assert not T.folded and T.group(0, "etp") == T.group(0, "tp") == (0, 1)
    assert T.edp == 2 and T.group(0, "edp") == (0, 8)
    # DeepSpeed's docstring example: world 16, model degree 2, expert degree 4.
    D = ParallelLayout(tp=2, dp=8, ep=4, etp=2, expert_mapping="deepspeed")
    assert D.groups("ep") == [(0, 2, 4, 6), (1, 3, 5, 7), (8, 10, 12, 14), (9, 11, 13, 15)]
    assert D.groups("edp") == [(0, 8), (1, 9), (2, 10), (3, 11), (4, 12), (5, 13), (6, 14), (7, 15)]
    with pytest.raises(LayoutError) as e:
        ParallelLayout(tp=2, dp=4, ep=8, expert_mapping="deepspeed")
    assert e.value.field == "parallel.ep"


def test_megatron_core_folds_ep_over_tp_with_etp_1():
    # The same layout under Megatron-Core (the default): tp2 etp1 ep4 gives EP groups of 4
    # consecutive ranks (across the attention's TP pairs); with etp = tp the EP group is the
    # ranks tp apart, as carved out of DP.
    L = ParallelLayout(tp=2, dp=8, ep=4)
    assert L.folded and L.group(0, "ep") == (0, 1, 2, 3) and L.group(0, "edp") == (0, 4, 8, 12)
    T = ParallelLayout(tp=2, dp=8, ep=4, etp=2)
    assert not T.folded and T.group(0, "ep") == (0, 2, 4, 6) and T.group(0, "edp") == (0, 8)


@pytest.mark.parametrize(
    "par, field",
    [
        ({"tp": 2, "dp": 4, "ep": 16}, "parallel.ep"),  # ep*etp = 16 does not divide tp*cp*dp = 8
        ({"tp": 2, "dp": 4, "ep": 4, "etp": 4}, "parallel.ep"),  # 16 does not divide 8
        ({"tp": 2, "dp": 3, "ep": 2, "etp": 4}, "parallel.etp"),  # etp 4 does not divide 6
    ],
)
def test_refused_when_ep_times_etp_does_not_divide_the_stage(par, field):
    with pytest.raises(ScenarioError) as e:
        load_scenario(
            moe_scenario(
                cluster={"preset": "dgx-h100", "devices": 2 * par["tp"] * par["dp"]}, parallel={"pp": 2, **par}
            )
        )
    assert e.value.field == field and "tp*cp*dp" in str(e.value)
    with pytest.raises(LayoutError, match="parallel.ep"):
        ParallelLayout(tp=4, dp=4, ep=32)


@pytest.mark.parametrize(
    "par",
    [
        {"tp": 4, "dp": 4, "pp": 2, "ep": 8},
        {"tp": 2, "dp": 8, "ep": 4},
        {"tp": 4, "dp": 4, "pp": 2, "ep": 4, "etp": 2},
        {"tp": 2, "dp": 4, "cp": 2, "pp": 1, "ep": 16},
    ],
)
def test_expert_parameters_per_rank_sum_to_the_model(par):
    # Every expert shard is held by edp ranks: summed over all ranks and divided by edp,
    # the routed-expert parameters are the model's (closed form: parameters.expert_parameter_count).
    model = get_model("qwen3-30b-a3b")  # 48 layers, 128 experts, every layer MoE
    L = ParallelLayout(**par)
    stages = L.chunk_layer_ranges(model.layers)
    total_expert = 0
    for r in range(L.world):
        s = L.stage_of(r)
        _, e = memory.rank_parameter_counts(model, L, stages[s], has_embedding=s == 0, has_head=s == L.pp - 1)
        total_expert += e
    assert total_expert == L.edp * parameters.expert_parameter_count(model)
    # ZeRO-1 shards a rank's expert optimizer states over its edp group (12 bytes per
    # parameter: fp32 master and Adam moments, ZeRO's K = 12).
    _, e0 = memory.rank_parameter_counts(model, L, stages[0], True, L.pp == 1)
    assert memory.state_bytes(0.0, e0, L).optimizer == pytest.approx(12 * e0 / L.edp)
    assert len(L.group(0, "edp")) == L.edp


FOLDED = {
    "tp2-pp2-ep8": {"tp": 2, "pp": 2, "dp": 4, "ep": 8},
    "tp4-etp2-ep8": {"tp": 4, "pp": 1, "dp": 4, "ep": 8, "etp": 2},
    # not folded (EP carved out of DP), but the block routes the SP shard all the same
    "tp2-etp2-pp2-ep4": {"tp": 2, "pp": 2, "dp": 4, "ep": 4, "etp": 2},
}


@pytest.mark.parametrize("name", list(FOLDED))
def test_folded_exact_equals_representatives(name):
    sc = moe_scenario(parallel=FOLDED[name])
    fast, exact = simulate(sc), simulate(sc, exact=True)
    assert fast.summary["simulated_ranks"] < exact.summary["simulated_ranks"] == 16
    assert fast.summary["step_time_s"] == pytest.approx(exact.summary["step_time_s"], rel=1e-9)
    assert fast.summary["peak_memory_bytes"] == pytest.approx(exact.summary["peak_memory_bytes"], rel=1e-9)


def test_folded_moe_block_dispatches_the_sp_shard_and_gathers_over_etp():
    sc = load_scenario(moe_scenario(parallel={"tp": 4, "pp": 1, "dp": 4, "ep": 8, "etp": 2}))
    L = sc.layout
    ops = [op for op in build_trace(sc.workload()).ops if op.rank == 0 and op.mb == 0 and op.phase == "F"]
    moe_layer, dense_layer = 2, 0  # TINY_MOE: one dense layer first
    names = {op.name: op for op in ops}
    # Megatron's all-to-all dispatcher routes each TP rank's sequence-parallel shard:
    # tokens/tp x top_k x hidden x 2 bytes = 1024/4 x 2 x 1024 x 2 per rank.
    disp = names[f"L{moe_layer}.dispatch"]
    assert disp.size_bytes == 1024 / 4 * 2 * 1024 * 2
    assert disp.group == L.group(0, "ep") == (0, 2, 4, 6, 8, 10, 12, 14)
    # The expert-TP all-gather brings the etp ranks' assignments together, and its
    # reduce-scatter hands them back: etp x the dispatch buffer.
    assert names[f"L{moe_layer}.experts.ag"].size_bytes == 2 * disp.size_bytes
    assert names[f"L{moe_layer}.experts.ag"].group == (0, 1)
    assert names[f"L{moe_layer}.experts.rs"].coll == "reduce-scatter"
    # No TP all-gather before the router nor reduce-scatter after the combine in a folded
    # MoE layer; the shared experts keep theirs; a dense layer keeps its MLP collectives.
    assert f"L{moe_layer}.mlp.ag" not in names and f"L{moe_layer}.mlp.out" not in names
    assert names[f"L{moe_layer}.shared.ag"].group == L.group(0, "tp")
    assert f"L{dense_layer}.mlp.ag" in names and f"L{dense_layer}.mlp.out" in names


def test_experts_as_wide_as_tp_route_the_sp_shard_too():
    """etp = tp (Grok-1's recipe: TP4, expert TP4, EP8): EP is carved out of data parallelism
    (ranks tp apart), yet Megatron-Core's MoE block is the same as a folded one. MoELayer.forward
    routes its input, the SP shard, and MoEAlltoAllTokenDispatcher all-to-alls its assignments over
    EP and then all-gathers them over the expert tensor-parallel group, here the TP group
    (megatron/core/transformer/moe/token_dispatcher.py and moe_layer.py at NVIDIA/Megatron-LM
    core_v0.10.0, the Megatron-Core of NeMo 24.12, and d98e8a64): no TP all-gather of the hidden
    states before the router, no reduce-scatter after the combine."""
    sc = load_scenario(moe_scenario(parallel={"tp": 4, "pp": 1, "dp": 4, "ep": 4, "etp": 4}))
    L = sc.layout
    assert not L.folded and L.routes_sp_shard and L.group(0, "ep") == (0, 4, 8, 12)
    ops = [op for op in build_trace(sc.workload()).ops if op.rank == 0 and op.mb == 0 and op.phase == "F"]
    names = {op.name: op for op in ops}
    moe_layer = 2
    disp = names[f"L{moe_layer}.dispatch"]
    assert disp.size_bytes == 1024 / 4 * 2 * 1024 * 2 and disp.group == L.group(0, "ep")
    gather = names[f"L{moe_layer}.experts.ag"]
    assert gather.coll == "all-gather" and gather.group == L.group(0, "tp") == (0, 1, 2, 3)
    assert gather.size_bytes == 4 * disp.size_bytes
    assert names[f"L{moe_layer}.experts.rs"].size_bytes == 4 * names[f"L{moe_layer}.combine"].size_bytes
    assert f"L{moe_layer}.mlp.ag" not in names and f"L{moe_layer}.mlp.out" not in names
    # DeepSpeed's mapping gathers the sequence over TP before the router instead.
    ds = load_scenario(
        moe_scenario(parallel={"tp": 4, "pp": 1, "dp": 4, "ep": 4, "etp": 4, "expert_mapping": "deepspeed"})
    )
    assert not ds.layout.routes_sp_shard
    ds_names = {op.name for op in build_trace(ds.workload()).ops if op.rank == 0 and op.mb == 0}
    assert f"L{moe_layer}.mlp.ag" in ds_names and f"L{moe_layer}.experts.ag" not in ds_names


def test_folded_dualpipe_with_node_limited_routing():
    # 32 ranks, stages of 16 over two 8-GPU nodes: the folded EP group (16, across the
    # TP pairs) spans both nodes, so node-limited routing dispatches in two pipelined hops
    # (one all-to-all on the ep axis whose rail share is 1 node / top_k 2 = 1/2); DualPipe
    # still pairs a forward with a backward and overlaps their all-to-alls.
    m = copy.deepcopy(TINY_MOE)
    m["moe"]["max_nodes_per_token"] = 1
    sc = moe_scenario(
        model=m,
        cluster={"preset": "dgx-h100", "devices": 32},
        parallel={"tp": 2, "pp": 2, "dp": 8, "ep": 16},
        schedule="dualpipe",
        training={"global_batch_size": 32},
    )
    L = load_scenario(sc).layout
    assert L.folded and len({r // 8 for r in L.group(0, "ep")}) == 2
    res = simulate(sc)
    ev = res.events
    axes = set(ev.loc[ev["kind"] == "collective", "axis"])
    assert {"ep", "pp_mirror"} <= axes
    tr = build_trace(load_scenario(sc).workload())
    a2a = [op for op in tr.ops if op.kind == "collective" and op.coll == "all-to-all"]
    assert a2a and all(op.scaleout_fraction == pytest.approx(1 / m["moe"]["top_k"]) for op in a2a)
    assert all(op.group == L.group(op.rank, "ep") for op in a2a)
    assert any(op.comm_overlap for op in tr.ops if op.kind == "compute")
