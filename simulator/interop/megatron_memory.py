"""The memory side of a Megatron-LM import (:mod:`simulator.interop.megatron`): the saved inputs
of full recomputation split over the TP group (``--distribute-saved-activations``), the MoE
router's dtype (``--moe-router-dtype``), token dropping and padding
(``--moe-expert-capacity-factor``, ``--moe-pad-expert-input-to-capacity``) and the precision-aware
optimizer (``--use-precision-aware-optimizer`` with ``--main-params-dtype``,
``--main-grads-dtype``, ``--exp-avg-dtype``, ``--exp-avg-sq-dtype``; and
``--grad-reduce-in-bf16``). Each function takes the import under way ``r`` (its ``args``,
``take``, ``assume``, ``used`` and ``res``) and returns the training keys it sets.

Semantics read from NVIDIA/Megatron-LM at d98e8a64ddf34856e74b24714e3bedb2f5a39553:
``megatron/training/arguments.py`` (the precision-aware optimizer's arguments and their
choices; ``validate_args``' asserts on ``distribute_saved_activations``; ``--bf16`` turning
FP32 gradient accumulation off when the main gradients are BF16),
``megatron/core/transformer/transformer_config.py`` (``moe_router_dtype``,
``moe_expert_capacity_factor``, ``moe_pad_expert_input_to_capacity`` and
``distribute_saved_activations``, which ``arguments.py`` turns into arguments through its
``ArgumentGroupFactory(TransformerConfig)``), ``megatron/core/optimizer/optimizer_config.py``
and ``megatron/core/optimizer/distrib_optimizer.py`` (the master copy kept as 16-bit
remainders beside BF16 weights, ``store_param_remainders``, on by default and with no
argument to turn it off).
"""

from __future__ import annotations

import math

from simulator.interop.megatron_args import ScenarioError

# Megatron-LM's choices for the precision-aware optimizer's dtypes (arguments.py at d98e8a64).
OPTIMIZER_DTYPES = {
    "main-params-dtype": ("fp32", "fp16"),
    "main-grads-dtype": ("fp32", "bf16"),
    "exp-avg-dtype": ("fp32", "fp16", "bf16", "fp8"),
    "exp-avg-sq-dtype": ("fp32", "fp16", "bf16", "fp8"),
}
_KEYS = {
    "main-params-dtype": "training.master_weights",
    "main-grads-dtype": "training.grad_dtype",
    "exp-avg-dtype": "training.optimizer_state_dtype",
    "exp-avg-sq-dtype": "training.optimizer_state_dtype",
}
_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
AWARE = "use-precision-aware-optimizer"
#: stepsim's range of capacity factors (workloads.moe_load.ExpertLoad.capacity_factor).
CAPACITY_RANGE = (1.0, 1000.0)


def saved_activations(r, recompute: str, par: dict) -> dict:
    """``--distribute-saved-activations``: each layer's input that full recomputation keeps is
    split over the TP group. Megatron asserts tp > 1, full granularity with a recompute method
    and no sequence parallelism (arguments.py and transformer_config.py at d98e8a64): refused
    otherwise, naming the argument."""
    a = "distribute-saved-activations"
    if a not in r.args:
        return {}
    method = r.args.get("recompute-method") is not None or "checkpoint-activations" in r.args
    if recompute != "full" or not method or par["tp"] <= 1 or par["sequence_parallel"]:
        raise ScenarioError(
            "needs --recompute-granularity full with a --recompute-method, --tensor-model-parallel-size > 1 "
            f"and no --sequence-parallel, as Megatron asserts; got recompute {recompute}, tp {par['tp']}, "
            f"sequence parallel {par['sequence_parallel']}",
            field=f"--{a}",
        )
    r.take(a, "training.distribute_saved_activations", True)
    return {"distribute_saved_activations": True}


def dense_only(r, names: tuple[str, ...]) -> None:
    """MoE arguments ``names`` on a dense model: used, each noted as having no effect."""
    for a in names:
        if a in r.args:
            r.used.add(a)
            r.assume(f"--{a}: no effect without --num-experts (a dense model has no router or experts)")


def router_dtype(r, moe: bool) -> dict:
    """``--moe-router-dtype fp32`` (Megatron's choices fp32, fp64; absent: the input's BF16).
    stepsim models BF16 and FP32 routing: fp64 is refused."""
    a = "moe-router-dtype"
    v = r.args.get(a)
    if v is None:
        return {}
    if not moe:
        dense_only(r, (a,))
        return {}
    if v != "fp32":
        raise ScenarioError(
            f"fp32 (stepsim models BF16 and FP32 router logits, not {v!r}; leave it out for BF16)", field=f"--{a}"
        )
    r.take(a, "training.moe_router_dtype", "fp32")
    return {"moe_router_dtype": "fp32"}


def capacity(r, moe: bool, allgather: bool = False) -> dict:
    """Token dropping and padding: ``--moe-expert-capacity-factor X`` (a negative factor is
    Megatron's none: dropless) onto ``training.expert_load.capacity_factor``, and
    ``--moe-pad-expert-input-to-capacity`` onto ``expert_load.pad_to_capacity`` and a
    dispatcher without the host sync (``training.moe_host_sync: false``). Megatron needs a
    factor for the padding; without one the flag still lifts the host sync here (the padding
    has no capacity to pad to), as stepsim's export writes a sync-free dispatcher. Under the
    ``allgather`` dispatcher the flag changes nothing (only the alltoall dispatcher permutes
    with ``drop_and_pad``, token_dispatcher.py at d98e8a64) and is taken as such."""
    cf_arg, pad_arg = "moe-expert-capacity-factor", "moe-pad-expert-input-to-capacity"
    if not moe:
        dense_only(r, (cf_arg, pad_arg))
        return {}
    out, load = {}, {}
    raw = r.args.get(cf_arg)
    if raw is not None:
        try:
            cf = float(str(raw))
        except ValueError:
            raise ScenarioError(f"expected a number, got {raw!r}", field=f"--{cf_arg}") from None
        lo, hi = CAPACITY_RANGE
        if cf < 0:
            r.take(
                cf_arg, "training.expert_load.capacity_factor", "none (dropless: Megatron's reading of a negative one)"
            )
        elif not (math.isfinite(cf) and lo <= cf <= hi):
            raise ScenarioError(
                f"a factor from {lo:g} to {hi:g} (stepsim does not model capacities below the mean load), got {raw!r}",
                field=f"--{cf_arg}",
            )
        else:
            load["capacity_factor"] = cf
            r.take(cf_arg, "training.expert_load.capacity_factor", cf)
    if pad_arg in r.args and allgather:
        r.take(pad_arg, "training.expert_load.pad_to_capacity", "not set: the allgather dispatcher pads no expert")
    elif pad_arg in r.args:
        out["moe_host_sync"] = False
        if load:
            load["pad_to_capacity"] = True
            r.take(pad_arg, "training.moe_host_sync", "false; training.expert_load.pad_to_capacity = true")
        else:
            r.take(pad_arg, "training.moe_host_sync", False)
            r.assume(
                f"--{pad_arg} without a --{cf_arg} (Megatron-Core refuses it): a dispatcher without the host "
                "sync, experts not padded"
            )
    out.update(_rank_budget(r))
    if load:
        r.assume("training.expert_load.distribution = balanced: the routing's imbalance is not in the arguments")
        out["expert_load"] = load
    return out


#: HybridEP's fixed per-rank token budget and the paged stash that relies on it.
RANK_BUDGET, PAGED_STASH = "moe-expert-rank-capacity-factor", "moe-paged-stash"


def _rank_budget(r) -> dict:
    """``--moe-expert-rank-capacity-factor`` with the HybridEP flex backend: a fixed budget of
    permuted tokens per rank, so the dispatch never reads the token counts on the host
    (``MoEFlexTokenDispatcher`` passes ``num_permuted_tokens`` and HybridEP runs
    ``non_blocking``; without it "HybridEP sizes buffers dynamically (CPU sync in dispatch)",
    token_dispatcher.py and fused_a2a.py at NVIDIA/Megatron-LM d98e8a64): ``training.moe_host_sync:
    false``. Tokens over the budget are dropped; balanced routing drops none, and the budget's
    buffers, like ``--moe-paged-stash``'s pages, are not in the memory model. Under another backend
    the factor is left for the not-mapped list."""
    if RANK_BUDGET not in r.args or str(r.args.get("moe-flex-dispatcher-backend", "")) != "hybridep":
        return {}
    r.take(RANK_BUDGET, "training.moe_host_sync", False)
    if PAGED_STASH in r.args:
        r.take(PAGED_STASH, "training.moe_host_sync", "false (the stash's pages are not in the memory model)")
    r.assume(
        f"--{RANK_BUDGET}: HybridEP's per-rank budget; balanced routing drops no token, its buffers are not modelled"
    )
    return {"moe_host_sync": False}


def _dtype_args(r, aware: bool) -> None:
    """Each optimizer dtype given is one of Megatron's choices, and fp32 without the
    precision-aware optimizer (Megatron-Core asserts it: optimizer_config.py)."""
    for a, choices in OPTIMIZER_DTYPES.items():
        v = r.args.get(a)
        if v is None:
            continue
        if v not in choices:
            raise ScenarioError(f"{', '.join(choices)}, got {v!r}", field=f"--{a}")
        if v != "fp32" and not aware:
            raise ScenarioError(f"{v} needs --{AWARE} (Megatron-Core asserts fp32 without it)", field=f"--{a}")


def _master(r, main: str) -> str:
    """The master copy under the precision-aware optimizer: Transformer Engine's FusedAdam holds
    it (``fp16`` as asked; ``fp32`` as its low 16 bits beside BF16 weights,
    ``store_param_remainders``) unless ``--fp8-recipe`` names a recipe other than delayed
    scaling, where Megatron-Core keeps its own FP32 copy (optimizer_config.py,
    ``use_precision_aware_optimizer_no_fp8_or_ds_fp8``)."""
    if main == "fp16":
        return "fp16"
    recipe = str(r.args.get("fp8-recipe") or "delayed")
    if recipe != "delayed" and "optimizer-cpu-offload" not in r.args:
        r.assume(f"training.master_weights = fp32: Megatron-Core keeps the FP32 master under --fp8-recipe {recipe}")
        return "fp32"
    if "bf16" in r.args and "fp16" not in r.args:
        r.assume(
            "training.master_weights = remainder: Transformer Engine's FusedAdam keeps the FP32 master's low 16 bits "
            "beside the BF16 weight (store_param_remainders, Megatron-Core's default; Transformer Engine >= 2.1)"
        )
        return "remainder"
    return "fp32"


def optimizer_precision(r, optimizer: str) -> dict:
    """The precision-aware optimizer's master copy, Adam moments and main gradients, and
    ``--grad-reduce-in-bf16`` (BF16 main gradients without it)."""
    args, out = r.args, {}
    aware = AWARE in args
    _dtype_args(r, aware)
    grads = "bf16" if args.get("main-grads-dtype") == "bf16" or "grad-reduce-in-bf16" in args else "fp32"
    if "grad-reduce-in-bf16" in args:
        r.take("grad-reduce-in-bf16", "training.grad_dtype", "bf16")
    if grads == "bf16":
        out["grad_dtype"] = "bf16"
    if not aware:
        for a, key in _KEYS.items():
            if a in args:
                r.take(a, key, "fp32" if a != "main-grads-dtype" else grads)
        return out
    if "use-distributed-optimizer" not in args and "use-megatron-fsdp" not in args:
        raise ScenarioError(
            "needs the distributed optimizer (--use-distributed-optimizer or --use-megatron-fsdp), as Megatron-Core "
            "asserts",
            field=f"--{AWARE}",
        )
    if optimizer != "adam":
        raise ScenarioError(
            f"supports adam only (Megatron-Core asserts it), got --optimizer {optimizer}", field=f"--{AWARE}"
        )
    master = _master(r, str(args.get("main-params-dtype") or "fp32"))
    r.take(AWARE, "training.master_weights", master)
    if master != "fp32":
        out["master_weights"] = master
    if "main-params-dtype" in args:
        r.take("main-params-dtype", "training.master_weights", master)
    if "main-grads-dtype" in args:
        r.take("main-grads-dtype", "training.grad_dtype", grads)
    out.update(_moments(r))
    return out


def _moments(r) -> dict:
    """``--exp-avg-dtype`` and ``--exp-avg-sq-dtype`` onto ``training.optimizer_state_dtype``,
    one dtype for both moments: where they differ in size the larger is simulated and the pair
    is listed as not mapped."""
    first, second = (str(r.args.get(a) or "fp32") for a in ("exp-avg-dtype", "exp-avg-sq-dtype"))
    state = first if _BYTES[first] >= _BYTES[second] else second
    if _BYTES[first] != _BYTES[second]:
        r.used.update(("exp-avg-dtype", "exp-avg-sq-dtype"))
        r.res.unmapped.append(
            f"--exp-avg-dtype {first} --exp-avg-sq-dtype {second} (stepsim keeps one dtype for both Adam moments, "
            f"training.optimizer_state_dtype: simulated as {state} for both)"
        )
    else:
        for a in ("exp-avg-dtype", "exp-avg-sq-dtype"):
            if a in r.args:
                r.take(a, "training.optimizer_state_dtype", state)
        if first != second:
            r.assume(f"--exp-avg-dtype {first}, --exp-avg-sq-dtype {second}: the same bytes, simulated as {state}")
    return {} if state == "fp32" else {"optimizer_state_dtype": state}
