"""``training.moe_token_dispatcher``: what an expert all-to-all puts across scale-up domains.

Megatron-Core's alltoall dispatcher permutes a token once per routed expert and all-to-alls the
copies, so a token with experts on another node crosses the NICs once per such expert. DeepEP's
internode dispatch (Megatron ``--moe-token-dispatcher-type flex``, backends deepep and hybridep)
sends it once per destination node (``Buffer.get_dispatch_layout``'s ``num_tokens_per_rdma_rank``,
deepseek-ai/DeepEP README at b57e5e2) and forwards it over NVLink there, as DeepSeek-V3 describes
(arXiv 2412.19437 §3.2.2).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import scenario, summary_numbers
from test_moe import TINY_MOE, moe_scenario

from simulator import simulate
from simulator.network.collectives import plan_collective

ROOT = Path(__file__).resolve().parents[1]
K = 4  # top-k of the tests' model


def _step(dispatcher: str | None, max_nodes: int | None = None):
    moe = {**TINY_MOE["moe"], "top_k": K}
    if max_nodes is not None:
        moe["max_nodes_per_token"] = max_nodes
    training = {} if dispatcher is None else {"moe_token_dispatcher": dispatcher}
    # EP16 over two 8-GPU nodes
    sc = moe_scenario(
        model={**TINY_MOE, "moe": moe}, parallel={"tp": 1, "pp": 1, "dp": 16, "ep": 16}, training=training
    )
    return simulate(sc)


def _fractions(res) -> set[float]:
    return {op.scaleout_fraction for op in res.trace.ops if op.coll == "all-to-all"}


def _cross_node_bytes(res) -> float:
    """Bytes one dispatch of the step puts across the two nodes, all ranks of its group."""
    op = next(op for op in res.trace.ops if op.coll == "all-to-all")
    plan = plan_collective("all-to-all", op.group, op.size_bytes, res.topology, scaleout_fraction=op.scaleout_fraction)
    return sum(t.size_bytes for ph in plan.phases for t in ph.transfers if t.src // 8 != t.dst // 8)


def test_flex_sends_a_token_once_per_other_node():
    """k experts drawn uniformly over N = 2 nodes reach N (1 - (1 - 1/N)^k) nodes on average; the
    rail hop carries that share of the k routed copies, and the NICs that share of the alltoall
    dispatcher's bytes."""
    flex, per_copy, default = _step("flex"), _step("alltoall"), _step(None)
    frac = 2 * (1 - 0.5**K) / K
    (got,) = _fractions(flex)
    assert got == pytest.approx(frac, rel=1e-12)
    assert _fractions(per_copy) == _fractions(default) == {1.0}
    assert _cross_node_bytes(flex) == pytest.approx(frac * _cross_node_bytes(per_copy), rel=1e-9)
    assert flex.summary["step_time_s"] < per_copy.summary["step_time_s"]
    # no node-limited routing: auto is the alltoall dispatcher
    assert summary_numbers(default.summary) == summary_numbers(per_copy.summary)


def test_node_limited_routing_caps_the_nodes_and_alltoall_sends_every_copy():
    """With DeepSeek-V3's node-limited routing (M nodes a token at most) auto and flex dispatch per
    node, at most M; Megatron-Core's alltoall dispatcher still sends one copy per routed expert."""
    assert _fractions(_step(None, max_nodes=1)) == _fractions(_step("flex", max_nodes=1)) == {1 / K}
    assert _fractions(_step("alltoall", max_nodes=1)) == {1.0}


def test_dense_models_refuse_it():
    """A dense model has no dispatcher: setting one is refused, naming the key."""
    from simulator.scenario.schema import ScenarioError

    dense = {k: v for k, v in TINY_MOE.items() if k != "moe"}
    sc = scenario(
        model=dense,
        cluster={"preset": "dgx-h100", "devices": 8},
        parallel={"tp": 1, "pp": 1, "dp": 8},
        training={"seq_len": 128, "micro_batch_size": 1, "global_batch_size": 8, "moe_token_dispatcher": "flex"},
    )
    with pytest.raises(ScenarioError, match="training.moe_token_dispatcher"):
        simulate(sc)


def test_measured_alltoall_against_hybridep():
    """NVIDIA's Qwen3-30B-A3B runs on 16 H100, EP16 across two nodes, BF16, GBS 1024 (github.com/
    NVIDIA/skills at 7149a88, skills/nemo-mbridge-perf-expert-parallel-overlap/SKILL.md): 41.25 s a
    step with the alltoall dispatcher, 24.71 s with HybridEP, 1.67 times as long. The two runs differ
    in more than the dispatcher (an SFT run without CUDA graphs or permutation fusion against a
    pre-training run with router and preprocess graphs), so the check is loose: within 10 %."""
    import yaml

    sc = yaml.safe_load((ROOT / "docs/results/moe/qwen3-30b-16xh100-ep-overlap-off.yaml").read_text())
    alltoall = simulate({**sc, "training": {**sc["training"], "moe_token_dispatcher": "alltoall"}}, steady_state=True)
    flex = simulate({**sc, "training": {**sc["training"], "moe_token_dispatcher": "flex"}}, steady_state=True)
    ratio = alltoall.summary["step_time_s"] / flex.summary["step_time_s"]
    assert ratio == pytest.approx(41.25 / 24.71, rel=0.10)


MOE_LINE = (
    "--data-parallel-size 8 --num-layers 4 --hidden-size 512 --num-attention-heads 8 --ffn-hidden-size 1024 --num-experts 8 "
    "--moe-router-topk 2 --expert-model-parallel-size 8 --seq-length 128 --micro-batch-size 1 "
    "--global-batch-size 16 --vocab-size 1024 --bf16 "
)


@pytest.mark.parametrize(
    "flags,expected",
    [
        ("--moe-token-dispatcher-type alltoall", "alltoall"),
        ("--moe-token-dispatcher-type flex", "flex"),  # Megatron-Core's default backend: deepep
        ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep", "flex"),
        ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend ncclep", None),
        ("--moe-token-dispatcher-type allgather", "allgather"),
        ("", "allgather"),  # Megatron-Core's default
    ],
)
def test_megatron_dispatcher_flags(flags, expected):
    """``stepsim import megatron`` maps the allgather, alltoall and DeepEP / HybridEP flex
    dispatchers and leaves the ncclep backend for the user to check; ``export megatron`` writes
    the mapped ones back."""
    from simulator.interop.export_megatron import export_megatron
    from simulator.interop.megatron import import_megatron
    from simulator.scenario.loading import load_scenario

    res = import_megatron(MOE_LINE + flags, "dgx-h100")
    assert res.scenario["training"].get("moe_token_dispatcher") == expected
    unmapped = [u for u in res.unmapped if "dispatcher" in u]
    assert bool(unmapped) == (expected is None)
    if expected is not None:
        back = import_megatron(export_megatron(load_scenario(res.scenario)), "dgx-h100")
        assert back.scenario["training"]["moe_token_dispatcher"] == expected


def test_megatron_default_dispatcher_is_named_as_an_assumption():
    """Without the flag Megatron-Core runs its allgather dispatcher (transformer_config.py at
    NVIDIA/Megatron-LM d98e8a64: ``moe_token_dispatcher_type = "allgather"``): the import runs it
    and says so; a padding flag it ignores is not mapped onto padded experts."""
    from simulator.interop.megatron import import_megatron

    res = import_megatron(MOE_LINE, "dgx-h100")
    assert res.scenario["training"]["moe_token_dispatcher"] == "allgather"
    assert any("default, the allgather dispatcher" in a for a in res.assumptions)
    flagged = import_megatron(MOE_LINE + "--moe-token-dispatcher-type alltoall", "dgx-h100")
    assert not any("allgather" in a for a in flagged.assumptions)
    pad = "--moe-expert-capacity-factor 1.0 --moe-pad-expert-input-to-capacity"
    padded = import_megatron(MOE_LINE + pad, "dgx-h100").scenario["training"]
    assert "pad_to_capacity" not in padded["expert_load"] and "moe_host_sync" not in padded
    padded = import_megatron(MOE_LINE + pad + " --moe-token-dispatcher-type alltoall", "dgx-h100").scenario["training"]
    assert padded["expert_load"]["pad_to_capacity"] is True and padded["moe_host_sync"] is False


def test_megatron_dispatcher_flags_on_a_dense_model_have_no_effect():
    from simulator.interop.megatron import import_megatron

    dense = MOE_LINE.replace("--num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 8 ", "")
    res = import_megatron(dense + "--moe-token-dispatcher-type flex", "dgx-h100")
    assert "moe_token_dispatcher" not in res.scenario["training"]
    assert any("no effect without --num-experts" in a for a in res.assumptions)


def test_export_refuses_fp8_on_the_wire_with_a_named_dispatcher():
    """FP8 dispatch runs on the flex ncclep backend only, which is neither model."""
    from simulator.interop.export_megatron import export_megatron
    from simulator.interop.megatron import import_megatron
    from simulator.scenario.loading import load_scenario
    from simulator.scenario.schema import ScenarioError

    sc = import_megatron(MOE_LINE + "--moe-token-dispatcher-type alltoall", "dgx-h100").scenario
    sc["training"].update(dtype="fp8", moe_dispatch_dtype="fp8")
    with pytest.raises(ScenarioError, match="ncclep") as e:
        export_megatron(load_scenario(sc))
    assert e.value.field == "training.moe_token_dispatcher"


def test_the_search_estimate_follows_the_dispatcher():
    """``stepsim search`` and ``ppmap`` screen layouts with the analytic estimate: its all-to-all
    takes the same rail share as the trace (``StepCosts.a2a``), so a per-node dispatch estimates
    the cross-node EP16 step shorter, as it simulates."""
    from simulator.scenario.loading import load_scenario
    from simulator.studies.search.estimate import estimate_step_time

    moe = {**TINY_MOE["moe"], "top_k": K}
    steps = {}
    for d in ("alltoall", "flex"):
        sc = moe_scenario(
            model={**TINY_MOE, "moe": moe},
            parallel={"tp": 1, "pp": 1, "dp": 16, "ep": 16},
            training={"moe_token_dispatcher": d},
        )
        steps[d] = estimate_step_time(load_scenario(sc))["step_time_s"]
    assert steps["flex"] < steps["alltoall"]


@pytest.mark.parametrize("max_nodes, expected", [(None, "alltoall"), (1, "flex")])
def test_export_writes_auto_as_the_dispatcher_it_simulates(max_nodes, expected):
    """Without ``--moe-token-dispatcher-type`` Megatron-Core runs its allgather dispatcher
    (transformer_config.py at d98e8a64), so ``export megatron`` writes ``auto`` as what it
    simulates: per copy (alltoall), or per node under node-limited routing (flex, deepep)."""
    from simulator.interop.export_megatron import export_megatron
    from simulator.scenario.loading import load_scenario

    moe = {**TINY_MOE["moe"], "top_k": K}
    if max_nodes is not None:
        moe["max_nodes_per_token"] = max_nodes
    sc = moe_scenario(model={**TINY_MOE, "moe": moe}, parallel={"tp": 1, "pp": 1, "dp": 16, "ep": 16})
    words = export_megatron(load_scenario(sc)).split()
    assert words[words.index("--moe-token-dispatcher-type") + 1] == expected
    assert ("--moe-flex-dispatcher-backend" in words) == (expected == "flex")
