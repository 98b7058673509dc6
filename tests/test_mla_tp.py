"""Multi-latent attention under tensor parallelism, as Megatron-Core splits it (``parallel.mla_down_proj``).

The tensor shapes are those of ``MLASelfAttention.get_query_key_value_tensors`` and the layer
specs of NVIDIA/Megatron-LM (megatron/core/transformer/multi_latent_attention.py and
megatron/core/models/gpt/gpt_layer_specs.py, read at tags core_v0.10.0, core_v0.12.0,
core_v0.13.0, core_v0.14.0 and commit d98e8a64); the gradient sum over TP is
``finalize_model_grads``'s (megatron/core/distributed/finalize_model_grads.py at d98e8a64, for
parameters that ``TELinear(parallel_mode="duplicated")`` and the router mark
``sequence_parallel``):

* ``duplicated``, core_v0.14.0 and d98e8a64: ``linear_q_down_proj=backend.linear()`` (a
  ``TELinear`` with ``parallel_mode="duplicated"``) on each rank's ``[s/TP]`` rows; the up
  projections' sequence-parallel gathers take the ``[s, q_lora_rank]`` and ``[s, kv_lora_rank]``
  latents, and ``gather_from_sequence_parallel_region(k_pos_emb)`` the ``[s, 64]`` RoPE key.
* ``column``, core_v0.10.0 through core_v0.13.x: ``TEColumnParallelLinear`` down projections,
  each gathering the ``[s, hidden]`` input and writing ``[s, rank/TP]``, then
  ``gather_from_tensor_model_parallel_region`` over the columns, ``scatter_to_sequence_parallel_region``
  back to ``[s/TP]`` and the up projections' gathers.

For DeepSeek-V3 (hidden 7,168, q 1,536, kv 512, RoPE 64) at TP2 and 4,096 tokens in BF16 a forward
gathers 17.3 MB duplicated and 151.5 MB column, against 58.7 MB for the hidden states once.
"""

from __future__ import annotations

import dataclasses

import pytest
from helpers import scenario

from simulator import load_scenario, simulate
from simulator.scenario.resolve import resolve_model
from simulator.scenario.schema import ScenarioError
from workloads import activations, counts, memory, parameters
from workloads.layout import ParallelLayout
from workloads.shard import Shard
from workloads.trace.shared import TraceBuilder

H, Q, KV, ROPE = 1024, 384, 128, 32
TINY_MLA = {
    "name": "tiny-mla",
    "layers": 2,
    "hidden": H,
    "heads": 8,
    "ffn_hidden": 2048,
    "vocab": 64,
    "attention": {"q_lora_rank": Q, "kv_lora_rank": KV, "qk_rope_head_dim": ROPE, "qk_nope_head_dim": 64},
}
SEQ = 2048
MODEL = resolve_model(TINY_MLA, None)


def _scenario(tp: int = 2, sp: bool = True, down: str | None = None) -> dict:
    parallel = {"tp": tp, "pp": 1, "dp": 8 // tp, "sequence_parallel": sp}
    if down:
        parallel["mla_down_proj"] = down
    return scenario(
        model=dict(TINY_MLA),
        cluster={"preset": "dgx-h100", "devices": 8},
        parallel=parallel,
        training={"seq_len": SEQ, "micro_batch_size": 1, "global_batch_size": 8 // tp},
    )


def _attn_collectives(res) -> dict:
    """The first micro-batch's layer-0 attention TP collectives on rank 0: name -> (kind, bytes)."""
    ops = [o for o in res.trace.ops if o.rank == 0 and o.mb == 0 and o.name.startswith("L0.attn")]
    return {o.name: (o.coll, o.size_bytes) for o in ops if o.kind == "collective" and o.axis == "tp"}


def test_deepseek_v3_gather_sizes_match_megatron_cores_shapes():
    """The module docstring's figures: 17.3 MB (duplicated) and 151.5 MB (column) against the
    hidden states' 58.7 MB, for one 4,096-token micro-batch at TP2."""
    sc = load_scenario(
        scenario(
            model="deepseek-v3",
            cluster={"preset": "dgx-h100", "devices": 256},
            parallel={"tp": 2, "pp": 16, "dp": 8, "ep": 16, "pipeline_layers": "auto"},
            training={"seq_len": 4096, "micro_batch_size": 1, "global_batch_size": 64},
        )
    )
    b = TraceBuilder(sc.workload())
    assert b.hidden_bytes == 4096 * 7168 * 2 == pytest.approx(58.7e6, rel=1e-3)
    fwd, bwd, bwd_ag = b.attn_tp_bytes
    assert fwd == bwd == 4096 * (1536 + 512 + 64) * 2 == pytest.approx(17.3e6, rel=1e-3)
    assert bwd_ag == 0
    col = TraceBuilder(
        dataclasses.replace(sc, layout=dataclasses.replace(sc.layout, mla_down_proj="column")).workload()
    )
    fwd, bwd, bwd_ag = col.attn_tp_bytes
    assert fwd == 4096 * (2 * 7168 + 2 * 1536 + 2 * 512 + 64) * 2 == pytest.approx(151.5e6, rel=1e-3)
    assert bwd == 4096 * (2 * 7168 + 1536 + 512) * 2
    assert bwd_ag == 4096 * (1536 + 512) * 2


@pytest.mark.parametrize(
    ("down", "sp", "expected"),
    [
        # duplicated: the latents and the RoPE key forward, their gradients back
        (
            "duplicated",
            True,
            {
                "L0.attn.ag": ("all-gather", SEQ * (Q + KV + ROPE) * 2),
                "L0.attn.out": ("reduce-scatter", SEQ * H * 2),
                "L0.attn.out.bwd": ("all-gather", SEQ * H * 2),
                "L0.attn.ag.bwd": ("reduce-scatter", SEQ * (Q + KV + ROPE) * 2),
                # the up projections keep their inputs' shards and gather them again backward
                "L0.attn.B.regather": ("all-gather", SEQ * (Q + KV) * 2),
            },
        ),
        # column: both down projections' inputs, the latents' columns and the latents again
        (
            "column",
            True,
            {
                "L0.attn.ag": ("all-gather", SEQ * (2 * H + 2 * Q + 2 * KV + ROPE) * 2),
                "L0.attn.out": ("reduce-scatter", SEQ * H * 2),
                "L0.attn.out.bwd": ("all-gather", SEQ * H * 2),
                "L0.attn.ag.bwd": ("reduce-scatter", SEQ * (2 * H + Q + KV) * 2),
                "L0.attn.latent_ag.bwd": ("all-gather", SEQ * (Q + KV) * 2),
                # the down projections' hidden states and the up projections' latents, again
                "L0.attn.B.regather": ("all-gather", SEQ * (2 * H + Q + KV) * 2),
            },
        ),
        # without sequence parallelism: duplicated down projections need nothing forward
        (
            "duplicated",
            False,
            {
                "L0.attn.out": ("all-reduce", SEQ * H * 2),
                "L0.attn.ag.bwd": ("all-reduce", SEQ * (Q + KV) * 2),
            },
        ),
        (
            "column",
            False,
            {
                "L0.attn.ag": ("all-gather", SEQ * (Q + KV + ROPE) * 2),
                "L0.attn.out": ("all-reduce", SEQ * H * 2),
                "L0.attn.ag.bwd": ("all-reduce", SEQ * (2 * H + Q + KV) * 2),
            },
        ),
    ],
)
def test_attention_collectives_follow_the_down_projections_split(down, sp, expected):
    assert _attn_collectives(simulate(_scenario(2, sp, down))) == expected


def test_duplicated_is_the_default_and_other_values_are_refused():
    assert load_scenario(_scenario()).layout.mla_down_proj == "duplicated"
    with pytest.raises(ScenarioError, match=r"parallel\.mla_down_proj"):
        load_scenario(_scenario(down="row"))


@pytest.mark.parametrize("down", ["duplicated", "column"])
def test_down_projections_run_a_tp_share_of_the_work(down):
    """Either split runs 1/TP of the down projections' FLOPs on a rank; duplicated on the shard's
    rows at full width, column on every row at 1/TP of the width. The latents' norms see the shard."""
    one = {k.name: k for k in counts.layer_kernels(MODEL, 0, Shard(1, SEQ, tp=1))}
    four = {k.name: k for k in counts.layer_kernels(MODEL, 0, Shard(1, SEQ, tp=4, mla_down_proj=down))}
    for name in ("q_down", "kv_down", "q_down_norm", "kv_down_norm"):
        assert four[name].flops == pytest.approx(one[name].flops / 4, rel=1e-12), name
    assert four["q_up"].flops == pytest.approx(one["q_up"].flops / 4, rel=1e-12)


def test_column_splits_the_down_projections_parameters():
    dup = parameters._block_params(MODEL, False, tp=4)[0]
    col = parameters._block_params(MODEL, False, tp=4, mla_down_proj="column")[0]
    assert dup - col == H * (Q + KV + ROPE) * 3 // 4
    layout = ParallelLayout(tp=4, dp=2, mla_down_proj="column")
    units = memory.rank_parameter_units(MODEL, layout, [0], has_embedding=False, has_head=False)
    assert units == [("L0", col, 0)]


def test_latents_are_kept_on_the_sequence_shard():
    """TP4 keeps a quarter of the latents TP1 keeps (the RoPE key whole), either split."""
    one = activations.activation_bytes_per_layer(MODEL, 0, Shard(1, SEQ, tp=1))
    four = activations.activation_bytes_per_layer(MODEL, 0, Shard(1, SEQ, tp=4))
    col = activations.activation_bytes_per_layer(MODEL, 0, Shard(1, SEQ, tp=4, mla_down_proj="column"))
    assert four == col
    assert four < one / 2


@pytest.mark.parametrize("model", [MODEL, "deepseek-v3", "llama3-70b", "gpt3-175b", "mixtral-8x7b"])
@pytest.mark.parametrize("down", ["duplicated", "column"])
def test_replicated_parameters_are_what_tp_does_not_split(model, down):
    """``tp_replicated_params`` is the part of a block that TP leaves whole: with ``d(T)`` a
    rank's dense parameters at TP degree ``T``, ``T d(T) - d(1)`` counts it ``T - 1`` times."""
    model = resolve_model(model, None) if isinstance(model, str) else model
    for moe in {False, model.is_moe}:
        one = parameters._block_params(model, moe, 1, mla_down_proj=down)[0]
        four = parameters._block_params(model, moe, 4, mla_down_proj=down)[0]
        assert (4 * four - one) == 3 * parameters.tp_replicated_params(model, moe, down)


@pytest.mark.parametrize(("down", "sp"), [("duplicated", True), ("column", True), ("duplicated", False)])
def test_replicated_gradients_are_summed_over_tp_under_sequence_parallelism(down, sp):
    """One coalesced FP32 all-reduce over the TP group after the data-parallel reduction: two layers'
    replicated parameters and the final norm (``finalize_model_grads``); none without SP."""
    res = simulate(_scenario(2, sp, down))
    ops = [o for o in res.trace.ops if o.name == "tp_replicated.grad"]
    if not sp:
        assert ops == []
        return
    per_layer = parameters.tp_replicated_params(MODEL, False, down)
    assert [(o.rank, o.coll, o.size_bytes, o.group) for o in ops] == [
        (0, "all-reduce", (2 * per_layer + H) * 4, (0, 1))
    ]
    assert per_layer == 2 * H + KV + Q + (H * (Q + KV + ROPE) if down == "duplicated" else 0)
