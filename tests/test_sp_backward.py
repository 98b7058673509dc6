"""The sequence-parallel backward of a block with column-parallel GEMMs, as Megatron-Core and
Transformer Engine run it (workloads/trace/program_tp_overlap.py ``TpOverlapOps.tp_backward``).

What the frameworks compute, read in their code:

* ``LinearWithGradAccumulationAndAsyncCommunication.backward``
  (megatron/core/tensor_parallel/layers.py, NVIDIA/Megatron-LM d98e8a64): with
  ``sequence_parallel`` it starts ``dist_all_gather_func(..., input, async_op=True)`` of the
  saved input shard, computes ``grad_input = grad_output.matmul(weight)``, waits for the gather,
  starts ``dist_reduce_scatter_func(..., grad_input, async_op=True)`` and computes the weight
  gradient from the gathered input before waiting for the reduce-scatter;
* ``_LayerNormLinear.backward`` (transformer_engine/pytorch/module/layernorm_linear.py,
  NVIDIA/TransformerEngine d0067d0): ``ln_out_needs_gather`` (weight gradient, column parallel,
  sequence parallel) gathers the saved ``ln_out`` with ``async_op=True`` beside the dgrad GEMM,
  ``reduce_scatter_along_first_dim(dgrad, async_op=True)`` beside the wgrad GEMM.

So in the trace: the second gather waits for the rest of the block and runs beside the input
gradients; the weight gradients wait for it; the reduce-scatter waits only for the input
gradients; what follows the block waits for the reduce-scatter."""

from __future__ import annotations

import pytest
from helpers import scenario

from simulator.scenario.loading import load_scenario
from workloads.trace.builder import build_trace
from workloads.trace.shared import TraceBuilder


def _workload(sp: bool, **model):
    sc = load_scenario(
        scenario(
            cluster={"preset": "dgx-h100", "devices": 8},
            parallel={"tp": 4, "pp": 1, "dp": 2, "sequence_parallel": sp},
            training={"global_batch_size": 2},
            **({"model": model} if model else {}),
        )
    )
    return sc.workload()


def _by_name(trace, rank=0, mb=0):
    return {op.name: op for op in trace.ops if op.rank == rank and op.mb == mb}


@pytest.mark.parametrize("block", ["attn", "mlp"])
def test_the_second_gather_and_the_scatter_run_beside_the_gemms_gradients(block):
    w = _workload(True)
    ops = _by_name(build_trace(w, ranks=[0]))
    name = f"L1.{block}.B"
    body, dgrad, wgrad = ops[f"{name}.body"], ops[f"{name}.dgrad"], ops[name]
    again, scatter = ops[f"{name}.regather"], ops[f"L1.{block}.ag.bwd"]
    assert body.id < dgrad.id < wgrad.id  # one compute stream, in this order
    assert (again.coll, again.axis, again.deps) == ("all-gather", "tp", (body.id,))
    assert again.id in wgrad.deps  # the weight gradients wait for the gathered input
    assert again.id not in dgrad.deps  # the input gradients do not
    assert (scatter.coll, scatter.deps) == ("reduce-scatter", (dgrad.id,))
    b = TraceBuilder(w)
    assert again.size_bytes == scatter.size_bytes == b.hidden_bytes  # the hidden states, all TP rows
    # the kernels: the column-parallel GEMM's input gradient alone, its weight gradient with the norm
    first = "qkv_proj" if block == "attn" else "mlp_up"
    assert [k.name for k in dgrad.kernels] == [f"{first}.dgrad"]
    assert f"{first}.wgrad" in [k.name for k in wgrad.kernels]
    assert f"{block}_norm.bwd" in [k.name for k in wgrad.kernels]
    # every backward kernel of the block once, in one of the three ops
    attn, pre = b.layer_parts(1)[:2]
    whole = sorted(k.name for k in b.bwd(attn if block == "attn" else pre, "B"))
    assert sorted(k.name for op in (body, dgrad, wgrad) for k in op.kernels) == whole


def test_what_follows_waits_for_the_scatter_and_the_weight_gradients():
    ops = _by_name(build_trace(_workload(True), ranks=[0]))
    # the attention's output-gradient gather needs the MLP block's input gradient after its norm
    nxt = ops["L1.attn.out.bwd"]
    assert ops["L1.mlp.ag.bwd"].id in nxt.deps and ops["L1.mlp.B"].id in nxt.deps


def test_without_sequence_parallelism_the_block_is_one_op_and_its_all_reduce_follows():
    ops = _by_name(build_trace(_workload(False), ranks=[0]))
    assert not any(n.endswith((".regather", ".dgrad", ".body")) for n in ops)
    ar = ops["L1.mlp.ag.bwd"]
    assert ar.coll == "all-reduce" and ar.deps == (ops["L1.mlp.B"].id,)


def _moe_workload(**training):
    """A Megatron-Core MoE layer with a shared expert under TP2 and sequence parallelism (the
    block routes each rank's sequence shard: ``ParallelLayout.routes_sp_shard``)."""
    sc = load_scenario(
        scenario(
            cluster={"preset": "dgx-h100", "devices": 8},
            model={"preset": "deepseek-v3", "layers": 4, "mtp_depth": 0, "vocab": 1024, "moe": {"dense_layers": 1}},
            parallel={"tp": 2, "pp": 1, "dp": 4, "ep": 4, "sequence_parallel": True},
            training={"global_batch_size": 4, **training},
        )
    )
    return sc.workload()


def test_a_shared_expert_gathers_its_input_again_as_a_dense_mlp():
    """Megatron-Core's ``SharedExpertMLP`` is an ``MLP`` of the dense part's TP split
    (megatron/core/transformer/moe/shared_experts.py, NVIDIA/Megatron-LM d98e8a64): its up
    projection, a column-parallel TE ``Linear`` under sequence parallelism, keeps the input's
    shard and gathers it again in its backward, beside its input gradient."""
    w = _moe_workload()
    b = TraceBuilder(w)
    layer = next(i for i in range(w.model.layers) if w.model.is_moe_layer(i))
    ops = _by_name(build_trace(w, ranks=[0]))
    name = f"L{layer}.shared.B"
    grad_in, body, dgrad, wgrad = ops[f"L{layer}.shared.rs.bwd"], ops[f"{name}.body"], ops[f"{name}.dgrad"], ops[name]
    again, scatter = ops[f"{name}.regather"], ops[f"L{layer}.shared.ag.bwd"]
    assert grad_in.coll == "all-gather" and body.deps == (grad_in.id,)
    assert (again.coll, again.axis, again.deps, again.size_bytes) == ("all-gather", "tp", (body.id,), b.hidden_bytes)
    assert again.id in wgrad.deps and again.id not in dgrad.deps
    assert (scatter.coll, scatter.deps) == ("reduce-scatter", (dgrad.id,))
    assert [k.name for k in dgrad.kernels] == ["shared_up.dgrad"]
    shared = b.layer_parts(layer)[2]
    assert sorted(k.name for op in (body, dgrad, wgrad) for k in op.kernels) == sorted(
        k.name for k in b.bwd(shared, "B")
    )
    # the combine's gradient all-to-all waits for the shared experts' input gradient as before
    assert scatter.id in ops[f"L{layer}.combine.bwd"].deps


def test_under_the_shared_expert_overlap_the_gathered_input_is_kept():
    """``--moe-shared-expert-overlap`` gathers the shared experts' input itself and sets the
    linear layers' ``parallel_mode`` to None (the same file): no second gather."""
    w = _moe_workload(moe_shared_expert_overlap=True)
    layer = next(i for i in range(w.model.layers) if w.model.is_moe_layer(i))
    ops = _by_name(build_trace(w, ranks=[0]))
    assert f"L{layer}.shared.B.regather" not in ops and f"L{layer}.shared.B" in ops
    assert ops[f"L{layer}.shared.ag.bwd"].deps == (ops[f"L{layer}.shared.B"].id,)


@pytest.mark.parametrize("overlap", [False, True])
def test_the_estimate_hides_the_shared_experts_second_gather_behind_their_gemms(overlap):
    """The search's estimate (``StepCosts.layer_comm``) prices a shard-routing MoE layer's TP
    backward as the trace runs it: without the shared-expert overlap, the shared experts' second
    gather and their input gradient's reduce-scatter are exposed only beyond their up projection's
    input and weight gradients; under it, the reduce-scatter whole, as before."""
    from simulator.studies.search.layer_costs import StepCosts

    sc = load_scenario(
        scenario(
            cluster={"preset": "dgx-h100", "devices": 8},
            model={"preset": "deepseek-v3", "layers": 4, "mtp_depth": 0, "vocab": 1024, "moe": {"dense_layers": 1}},
            parallel={"tp": 2, "pp": 1, "dp": 4, "ep": 4, "sequence_parallel": True},
            training={"global_batch_size": 4, "moe_shared_expert_overlap": overlap},
        )
    )
    c = StepCosts(sc)
    layer = next(i for i in range(sc.model.layers) if sc.model.is_moe_layer(i))
    attn, _, shared, expert, _ = c.b.layer_parts(layer)
    tp_b = c.layer_comm(layer, 0, expert, shared)[1]
    g, h = sc.layout.group(0, "tp"), c.b.hidden_bytes
    ag, rs = c.net.time_s("all-gather", g, h), c.net.time_s("reduce-scatter", g, h)
    _, attn_back, back_ag = c.b.attn_tp_bytes
    _, a_dgrad, a_wgrad = c.b.column_split(attn, "B")
    again = c.net.time_s("all-gather", g, c.b.regather_bytes(attention=True))
    attn_part = max(0.0, again - c.kt(a_dgrad)) + max(0.0, c.net.time_s("reduce-scatter", g, attn_back) - c.kt(a_wgrad))
    base = ag + c.net.time_s("all-gather", g, back_ag) + ag + attn_part
    if overlap:
        assert tp_b == pytest.approx(base + rs, rel=1e-12)
    else:
        _, s_dgrad, s_wgrad = c.b.column_split(shared, "B")
        shared_part = max(0.0, ag - c.kt(s_dgrad)) + max(0.0, rs - c.kt(s_wgrad))
        assert tp_b == pytest.approx(base + shared_part, rel=1e-12)
        assert shared_part < rs  # the GEMMs hide part of it
