"""``simulator.interop.megatron_args.MAPPED`` is the table docs and users read of which
Megatron-LM argument sets which scenario key: every argument ``stepsim import megatron``
maps says the key the table gives it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from simulator.interop.megatron import import_megatron
from simulator.interop.megatron_args import MAPPED

DATA = Path(__file__).resolve().parent / "data" / "megatron"

MOE_ARGS = """
torchrun --nnodes 2 --nproc_per_node 8 pretrain_gpt.py \\
  --num-layers 16 --hidden-size 2048 --num-attention-heads 16 \\
  --group-query-attention --num-query-groups 4 --ffn-hidden-size 8192 --swiglu \\
  --normalization RMSNorm --disable-bias-linear --untie-embeddings-and-output-weights \\
  --vocab-size 32001 --seq-length 4096 --micro-batch-size 1 --global-batch-size 64 \\
  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --context-parallel-size 1 \\
  --num-layers-per-virtual-pipeline-stage 4 --expert-model-parallel-size 4 --num-experts 8 \\
  --moe-router-topk 2 --moe-ffn-hidden-size 1024 --sequence-parallel --use-distributed-optimizer \\
  --recompute-granularity selective --bf16 --overlap-grad-reduce --moe-aux-loss-coeff 0.01
"""


def _mapped(text: str, cluster: str) -> list[tuple[str, str]]:
    out = []
    for line in import_megatron(text, cluster).mapped:
        m = re.match(r"--([\w-]+).* -> ([\w.\[\]]+)", line)
        assert m, line
        out.append((m.group(1), m.group(2)))
    return out


@pytest.mark.parametrize(
    "text,cluster",
    [(p.read_text(), "dgx-a100") for p in sorted(DATA.glob("*.args"))] + [(MOE_ARGS, "dgx-h100")],
)
def test_every_mapped_argument_is_in_the_table_with_its_key(text, cluster):
    pairs = _mapped(text, cluster)
    assert pairs
    assert [(arg, key, MAPPED.get(arg)) for arg, key in pairs if MAPPED.get(arg) != key] == []


def test_the_expert_all_to_all_overlap_is_imported():
    text = MOE_ARGS.replace("--pipeline-model-parallel-size 2", "--pipeline-model-parallel-size 1").replace(
        "--num-layers-per-virtual-pipeline-stage 4 ", ""
    )
    text += " --overlap-moe-expert-parallel-comm --delay-wgrad-compute"
    res = import_megatron(text, "dgx-h100")
    assert res.scenario["training"]["overlap_moe_expert_parallel_comm"] is True
    assert ("overlap-moe-expert-parallel-comm", "training.overlap_moe_expert_parallel_comm") in _mapped(
        text, "dgx-h100"
    )


def test_fp8_training_dispatches_bf16_tokens_as_megatron_core_does():
    """Megatron-Core all-to-alls the permuted BF16 hidden states under FP8 training (its alltoall,
    DeepEP and HybridEP dispatchers, moe/token_dispatcher.py and moe/fused_a2a.py at d98e8a64);
    FP8 on the wire only with ``--moe-dispatch-fwd-dtype mxfp8`` (the flex ncclep backend)."""
    fp8 = MOE_ARGS.replace("--bf16", "--bf16 --fp8-format hybrid")
    assert import_megatron(fp8, "dgx-h100").scenario["training"]["moe_dispatch_dtype"] == "bf16"
    # BF16 training dispatches BF16 anyway: nothing to write
    assert "moe_dispatch_dtype" not in import_megatron(MOE_ARGS, "dgx-h100").scenario["training"]
    ncclep = fp8 + " --moe-dispatch-fwd-dtype mxfp8"
    res = import_megatron(ncclep, "dgx-h100")
    assert "moe_dispatch_dtype" not in res.scenario["training"]  # FP8 training's default: FP8 on the wire
    assert ("moe-dispatch-fwd-dtype", "training.moe_dispatch_dtype") in _mapped(ncclep, "dgx-h100")


def test_fp8_weight_flags_are_imported():
    """``--fp8-param-gather``: FP8 primary weights; FP8 without it keeps BF16 weights and Transformer
    Engine's cached FP8 copies (Megatron-Core's default) unless ``--disable-parameter-transpose-cache``;
    neither flag has an effect without FP8."""
    fp8 = MOE_ARGS.replace("--bf16", "--bf16 --fp8-format hybrid")
    tr = import_megatron(fp8, "dgx-h100").scenario["training"]
    assert tr["fp8_weight_cache"] is True and "fp8_params" not in tr
    tr = import_megatron(fp8 + " --fp8-param-gather", "dgx-h100").scenario["training"]
    assert tr["fp8_params"] is True and "fp8_weight_cache" not in tr
    tr = import_megatron(fp8 + " --disable-parameter-transpose-cache", "dgx-h100").scenario["training"]
    assert "fp8_params" not in tr and "fp8_weight_cache" not in tr
    res = import_megatron(MOE_ARGS + " --fp8-param-gather", "dgx-h100")
    assert "fp8_params" not in res.scenario["training"]
    assert any("--fp8-param-gather without FP8" in a for a in res.assumptions)


def test_router_and_permute_fusion_and_the_score_function_are_imported():
    """Without the flags Megatron-Core runs its unfused ops (transformer_config.py at
    NVIDIA/Megatron-LM d98e8a64: moe_router_fusion and moe_permute_fusion default False)."""
    plain = import_megatron(MOE_ARGS, "dgx-h100").scenario
    assert plain["training"]["moe_router_fusion"] is False
    assert plain["training"]["moe_permute_fusion"] is False
    assert "score_function" not in plain["model"]["moe"]  # Megatron's default, softmax
    text = MOE_ARGS + " --moe-router-fusion --moe-permute-fusion --moe-router-score-function sigmoid"
    fused = import_megatron(text, "dgx-h100").scenario
    assert fused["training"]["moe_router_fusion"] is True
    assert fused["training"]["moe_permute_fusion"] is True
    assert fused["model"]["moe"]["score_function"] == "sigmoid"
    pairs = _mapped(text, "dgx-h100")
    assert ("moe-router-fusion", "training.moe_router_fusion") in pairs
    assert ("moe-router-score-function", "model.moe.score_function") in pairs
    with pytest.raises(Exception, match="moe-router-score-function"):
        import_megatron(MOE_ARGS + " --moe-router-score-function sqrtsoftplus", "dgx-h100")


def test_load_balancing_is_imported_and_exported():
    """--moe-router-enable-expert-bias: aux-loss-free (aux-free); an auxiliary loss with a
    coefficient above 0 (Megatron's default type aux_loss): aux-loss-local; neither: aux-free with
    an assumption line (router.py and arguments.py at NVIDIA/Megatron-LM d98e8a64)."""
    from simulator import load_scenario
    from simulator.interop.export_megatron import export_megatron

    assert import_megatron(MOE_ARGS, "dgx-h100").scenario["training"]["balance"] == "aux-loss-local"
    assert ("moe-aux-loss-coeff", "training.balance") in _mapped(MOE_ARGS, "dgx-h100")
    seq = MOE_ARGS + " --moe-router-load-balancing-type seq_aux_loss global_aux_loss"
    assert import_megatron(seq, "dgx-h100").scenario["training"]["balance"] == "aux-loss-local"
    bias = MOE_ARGS + " --moe-router-enable-expert-bias --moe-router-score-function sigmoid"
    res = import_megatron(bias, "dgx-h100")
    assert res.scenario["training"]["balance"] == "aux-free"
    assert any("not modelled" in a for a in res.assumptions)  # the coefficient beside the bias
    none = MOE_ARGS.replace("--moe-aux-loss-coeff 0.01", "")
    res = import_megatron(none, "dgx-h100")
    assert res.scenario["training"]["balance"] == "aux-free"
    assert any("no auxiliary loss" in a for a in res.assumptions)
    sinkhorn = import_megatron(MOE_ARGS + " --moe-router-load-balancing-type sinkhorn", "dgx-h100")
    assert "balance" not in sinkhorn.scenario["training"]
    assert any(u.startswith("--moe-aux-loss-coeff") for u in sinkhorn.unmapped)
    with pytest.raises(Exception, match="moe-aux-loss-coeff"):
        import_megatron(MOE_ARGS.replace("0.01", "lots"), "dgx-h100")
    # written back and read again
    for text in (MOE_ARGS, bias):
        sc = load_scenario(import_megatron(text, "dgx-h100").scenario)
        again = import_megatron(export_megatron(sc), "dgx-h100").scenario["training"]["balance"]
        assert again == sc.training.balance


@pytest.mark.parametrize(
    "backend,synced",
    [("hybridep", False), ("deepep", True)],
)
def test_hybridep_rank_budget_lifts_the_host_sync(backend, synced):
    """``--moe-expert-rank-capacity-factor`` gives HybridEP a fixed per-rank token budget: its
    dispatch runs ``non_blocking`` with no token count read on the host (token_dispatcher.py
    ``MoEFlexTokenDispatcher`` at NVIDIA/Megatron-LM d98e8a64), as the 26.08 recipes' full-iteration
    CUDA graph needs. Under DeepEP the factor does nothing here and stays in the not-mapped list."""
    text = MOE_ARGS + (
        f" --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend {backend}"
        " --moe-expert-rank-capacity-factor 1.5 --moe-paged-stash"
    )
    res = import_megatron(text, "dgx-h100")
    assert res.scenario["training"].get("moe_host_sync", True) is synced
    unmapped = " ".join(res.unmapped)
    assert ("rank-capacity" in unmapped) is synced and ("paged-stash" in unmapped) is synced
    if not synced:
        pairs = _mapped(text, "dgx-h100")
        assert ("moe-expert-rank-capacity-factor", "training.moe_host_sync") in pairs
        assert ("moe-paged-stash", "training.moe_host_sync") in pairs
