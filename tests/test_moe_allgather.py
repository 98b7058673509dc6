"""``training.moe_token_dispatcher: allgather``: Megatron-Core's default token dispatcher.

``MoEAllGatherTokenDispatcher`` (megatron/core/transformer/moe/token_dispatcher.py at
NVIDIA/Megatron-LM d98e8a64) all-gathers the hidden states, routing map and probabilities of the
expert-TP x EP group (``gather_from_sequence_parallel_region(..., group=self.tp_ep_group)``), reads
the local experts' token counts on the host (``tokens_per_expert = ....cpu()``), permutes the local
experts' rows out of the gathered tokens, and reduce-scatters the unpermuted outputs back over the
same group in the probabilities' dtype (``token_combine``). The closed forms below are that code's
tensor shapes.
"""

from __future__ import annotations

import pytest
from test_moe import TINY_MOE, moe_scenario

from simulator import simulate
from simulator.scenario.loading import load_scenario
from simulator.scenario.schema import ScenarioError

H, E = TINY_MOE["hidden"], TINY_MOE["moe"]["experts"]
SEQ = 1024  # moe_scenario's sequence, one sequence a micro-batch


def _trace(parallel: dict, **training):
    sc = moe_scenario(parallel=parallel, training={"moe_token_dispatcher": "allgather", **training})
    return simulate(sc)


def _ep_ops(res, layer_name: str) -> dict:
    """The EP and expert-TP collectives of the first micro-batch's MoE layer ``layer_name`` on rank 0."""
    ops = [o for o in res.trace.ops if o.rank == 0 and o.mb == 0 and o.name.startswith(layer_name + ".")]
    return {o.name[len(layer_name) + 1 :]: o for o in ops if o.kind == "collective" and o.axis in ("ep", "etp")}


def test_gathers_and_reduce_scatters_the_ep_groups_tokens():
    """EP8 without TP: the dispatch all-gathers every member's 1,024 tokens (BF16 hidden states, a
    one-byte routing map and BF16 probabilities per expert), the combine reduce-scatters BF16
    outputs; backward, the combine's gradient is an all-gather and the dispatch's a reduce-scatter
    of the hidden states' and probabilities' gradients. The host waits for the dispatch."""
    res = _trace({"tp": 1, "pp": 1, "dp": 16, "ep": 8})
    ops = _ep_ops(res, "L1")  # layer 0 is dense (dense_layers: 1)
    rows = 8 * SEQ
    expected = {
        "dispatch": ("all-gather", rows * (2 * H + E * (2 + 1))),
        "combine": ("reduce-scatter", rows * 2 * H),
        "combine.bwd": ("all-gather", rows * 2 * H),
        "dispatch.bwd": ("reduce-scatter", rows * (2 * H + E * 2)),
    }
    assert {name: (op.coll, op.size_bytes) for name, op in ops.items()} == expected
    assert all(op.group == res.scenario.layout.group(0, "ep") for op in ops.values())
    assert ops["dispatch"].host_sync and not ops["combine"].host_sync
    before = [o for o in res.trace.ops if o.rank == 0 and o.mb == 0 and o.name.startswith("L1.") and o.host_sync]
    assert before == [ops["dispatch"]]  # not the compute op before it, as under alltoall


def test_fp32_router_probabilities_widen_the_combine():
    """``--moe-router-dtype fp32``: the probabilities are FP32, and ``token_combine`` casts the
    outputs to their dtype before the reduce-scatter."""
    ops = _ep_ops(_trace({"tp": 1, "pp": 1, "dp": 16, "ep": 8}, moe_router_dtype="fp32"), "L1")
    rows = 8 * SEQ
    assert ops["dispatch"].size_bytes == rows * (2 * H + E * (4 + 1))
    assert ops["combine"].size_bytes == ops["combine.bwd"].size_bytes == rows * 4 * H


@pytest.mark.parametrize("parallel", [{"tp": 2, "etp": 2}, {"tp": 4, "etp": 2}, {"tp": 2, "etp": 1}])
def test_each_rank_receives_its_tp_ep_groups_tokens(parallel):
    """Whether the experts keep the attention's TP split (etp = tp) or fold (etp < tp), the block
    routes the sequence-parallel shard: the EP stage on it, then the expert-TP stage (the TP group
    itself where etp = tp), with no TP all-gather before the router (Megatron-Core's MoELayer
    routes its input as it comes, megatron/core/transformer/moe/moe_layer.py, core_v0.10.0 to
    d98e8a64). The dispatch brings every rank the other ``etp x ep - 1`` shards of its
    ``tp_ep_group``, as Megatron-Core's one all-gather over that group does (counted in token rows)."""
    tp, etp, ep = parallel["tp"], parallel["etp"], 4
    res = _trace({**parallel, "pp": 1, "dp": 16 // tp, "ep": ep, "sequence_parallel": True})
    ops = _ep_ops(res, "L1")
    shard = SEQ / tp
    rows = 0.0  # token rows received: an all-gather of a B-byte buffer over n ranks brings each (n - 1) / n B
    for name in ("dispatch", "experts.ag"):
        op = ops.get(name)
        if op is not None:
            assert op.coll == "all-gather"
            rows += op.size_bytes / (2 * H + E * 3) * (len(op.group) - 1) / len(op.group)
    assert not any(o.name == "L1.mlp.ag" for o in res.trace.ops)
    if etp > 1:
        assert ops["experts.ag"].group == res.scenario.layout.group(0, "etp")
    assert rows == pytest.approx((etp * ep - 1) * shard, rel=1e-12)


@pytest.mark.parametrize("ep, top_k", [(8, 2), (4, 8)])
def test_allgather_pays_for_small_ep_and_large_top_k(ep, top_k):
    """Megatron-Core's MoE README (megatron/core/transformer/moe/README.md at d98e8a64, "Token
    Dispatching") gives allgather as best for "TP-only setups, small EP, large Top-K" and alltoall
    for "Standard EP > 1 setups": a rank receives ``(ep - 1)`` other members' tokens from the
    gather against ``k (ep - 1) / ep`` copies a token from the all-to-all. Top-2 over EP8: the
    all-to-all is the faster; top-8 over EP4: the gather. The search's analytic estimate
    (``StepCosts.ep_collective``) orders the two the same way."""
    from simulator.studies.search.estimate import estimate_step_time

    model = {**TINY_MOE, "moe": {**TINY_MOE["moe"], "top_k": top_k}}
    steps, estimates = {}, {}
    for d in ("alltoall", "allgather"):
        sc = moe_scenario(
            model=model, parallel={"tp": 1, "pp": 1, "dp": 16, "ep": ep}, training={"moe_token_dispatcher": d}
        )
        steps[d] = simulate(sc).summary["step_time_s"]
        estimates[d] = estimate_step_time(load_scenario(sc))["step_time_s"]
    gather_faster = top_k >= ep
    assert (steps["allgather"] < steps["alltoall"]) == gather_faster
    assert (estimates["allgather"] < estimates["alltoall"]) == gather_faster


@pytest.mark.parametrize(
    "training, match",
    [
        ({"moe_shared_expert_overlap": True}, "moe_shared_expert_overlap"),
        ({"overlap_moe_expert_parallel_comm": True}, "overlap_moe_expert_parallel_comm"),
        ({"moe_host_sync": False}, "moe_host_sync"),
        ({"moe_dispatch_dtype": "fp8", "dtype": "fp8"}, "moe_dispatch_dtype"),
        ({"expert_load": {"capacity_factor": 1.0, "pad_to_capacity": True}}, "pad_to_capacity"),
    ],
)
def test_refuses_what_megatron_core_does_not_run(training, match):
    """Megatron-Core asserts alltoall or flex for the shared-expert and batch-level overlaps
    (transformer_config.py at d98e8a64); only the alltoall dispatcher pads experts or skips the
    host read; the allgather dispatcher gathers BF16 hidden states."""
    sc = moe_scenario(
        parallel={"tp": 1, "pp": 1, "dp": 16, "ep": 8}, training={"moe_token_dispatcher": "allgather", **training}
    )
    with pytest.raises(ScenarioError, match=f"training.moe_token_dispatcher: allgather cannot run with .*{match}"):
        load_scenario(sc)


def test_fp8_training_gathers_bf16_by_default():
    """Under FP8 training the dispatch's wire dtype ``auto`` is FP8 for the other dispatchers
    (DeepSeek-V3's), BF16 hidden states for allgather."""
    spec = load_scenario(
        moe_scenario(
            parallel={"tp": 1, "pp": 1, "dp": 16, "ep": 8},
            training={"moe_token_dispatcher": "allgather", "dtype": "fp8"},
        )
    ).training
    assert spec.fp8_dispatch is False


def test_refuses_dualpipe():
    """DualPipe's paired passes overlap the expert all-to-alls (DeepSeek-V3 §3.2.1), which the
    allgather dispatcher does not send."""
    sc = moe_scenario(
        parallel={"tp": 1, "pp": 2, "dp": 8, "ep": 8},
        schedule="dualpipe",
        training={"moe_token_dispatcher": "allgather", "global_batch_size": 32},
    )
    with pytest.raises(ScenarioError, match="allgather cannot run with schedule: dualpipe"):
        load_scenario(sc)


def test_the_host_reads_the_counts_without_expert_parallelism_too():
    """With EP1 (TP only, the README's first use of it) there is no EP gather to wait for, but the
    dispatcher still reads the token counts on the host every layer: the op before the experts."""
    res = _trace({"tp": 2, "pp": 1, "dp": 8, "ep": 1, "sequence_parallel": True})
    synced = [o for o in res.trace.ops if o.rank == 0 and o.mb == 0 and o.name.startswith("L1.") and o.host_sync]
    assert len(synced) == 1 and synced[0].kind == "compute"


@pytest.mark.parametrize("name", ["ep48-144xgb200", "tp2-etp1-ep16-12dom", "cp2-ep16-12dom"])
def test_representative_mode_gives_the_exact_step_where_ep_groups_straddle(name):
    """Expert groups that straddle scale-up domains unevenly (EP48 on two NVL72 racks; EP16 in
    12-GPU domains): the rank classes of representative mode give ``--exact``'s step and peak
    memory under the allgather dispatcher. On EP48 the exposed share is exact too; in 12-GPU
    domains it is off by a few tenths of a point (docs/limits.md): a ring over a group split
    unevenly treats its members by their place in the ring, which the classes do not tell apart."""
    from test_symmetry import STRADDLING

    sc = STRADDLING[name]
    sc = {**sc, "training": {**sc["training"], "moe_token_dispatcher": "allgather"}}
    rep, exact = simulate(sc).summary, simulate(sc, exact=True).summary
    for key in ("step_time_s", "peak_memory_bytes"):
        assert rep[key] == pytest.approx(exact[key], rel=1e-9), key
    assert rep["exposed_comm_fraction"] == pytest.approx(exact["exposed_comm_fraction"], abs=0.005)
    if name == "ep48-144xgb200":
        assert rep["exposed_comm_fraction"] == pytest.approx(exact["exposed_comm_fraction"], rel=1e-9)
