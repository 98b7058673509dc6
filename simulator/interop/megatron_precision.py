"""The precision side of a Megatron-LM import (:mod:`simulator.interop.megatron`): the training
dtype (``--bf16`` / ``--fp16`` / ``--fp8-format``, NeMo's ``trainer.precision``), the expert
dispatch's wire dtype and Transformer Engine's FP8 weights (``--fp8-param-gather``,
``--disable-parameter-transpose-cache``). Each function takes the import under way ``r`` (its
``args``, ``take`` and ``assume``) and returns what it sets."""

from __future__ import annotations

from simulator.interop.megatron_args import ScenarioError
from workloads import enums

# Megatron-LM's --fp8-format choices (megatron/training/arguments.py, _add_transformer_engine_args).
FP8_FORMATS = ("e4m3", "hybrid")
# Megatron-Core's --fp8-recipe choices (transformer_config.py fp8_recipe at d98e8a64), default
# delayed: stepsim's, and a user quantizer factory's
FP8_RECIPES = (*enums.FP8_RECIPES, "custom")


def dtype(r) -> str:
    """The training dtype: ``fp8`` under ``--fp8-format`` / ``--fp8``, else ``bf16`` (``--fp16``
    simulated as BF16)."""
    args = r.args
    precision = str(args.get("precision") or "")  # NeMo: trainer.precision
    if precision:
        r.used.add("precision")
        if "bf16" in precision:
            args.setdefault("bf16", None)
        elif precision.startswith("16"):
            args.setdefault("fp16", None)
        else:
            r.used.discard("precision")
    if "bf16" in args and "fp16" in args:
        raise ScenarioError("cannot be given with --bf16 (Megatron asserts one of the two)", field="--fp16")
    if args.get("fp8") not in (None, *FP8_FORMATS):  # NeMo's model.fp8=True reads as a bare flag
        raise ScenarioError(f"true, {' or '.join(FP8_FORMATS)}, got {args['fp8']!r}", field="--fp8")
    fmt = args.get("fp8-format")
    if fmt is not None and fmt not in FP8_FORMATS:
        raise ScenarioError(f"{' or '.join(FP8_FORMATS)}, got {fmt!r}", field="--fp8-format")
    if fmt is not None or "fp8" in args:
        for a in ("fp8-format", "fp8"):
            if a in args:
                r.take(a, "training.dtype", "fp8")
        return "fp8"
    if "bf16" in args:
        r.take("bf16", "training.dtype", "bf16")
    if "fp16" in args:
        r.take("fp16", "training.dtype", "bf16")
        r.assume("--fp16 simulated as bf16: the same tensor-core peak and activation bytes")
    return "bf16"


def moe_dispatch(r, dtype: str) -> dict:
    """The expert dispatch's wire dtype under FP8 training: BF16, as Megatron-Core's
    alltoall and DeepEP dispatchers send it, unless ``--moe-dispatch-fwd-dtype mxfp8``
    (the flex 'ncclep' backend, one byte an element plus block scales)
    (megatron/core/transformer/transformer_config.py, moe/fused_a2a.py at d98e8a64)."""
    args, out = r.args, {}
    wire = args.get("moe-dispatch-fwd-dtype")
    if wire is not None:
        if wire not in ("bf16", "mxfp8"):
            raise ScenarioError(f"bf16 or mxfp8, got {wire!r}", field="--moe-dispatch-fwd-dtype")
        r.take("moe-dispatch-fwd-dtype", "training.moe_dispatch_dtype", "fp8" if wire == "mxfp8" else "bf16")
        if wire == "mxfp8":
            r.assume("--moe-dispatch-fwd-dtype mxfp8 simulated as one byte an element (block scales not counted)")
        value = "fp8" if wire == "mxfp8" else "bf16"
        # "auto" where it means the same (FP8 training dispatches FP8): one scenario, one key
        if value != ("fp8" if dtype == "fp8" else "bf16"):
            out["moe_dispatch_dtype"] = value
        return out
    if dtype == "fp8" and args.get("num-experts") is not None:
        r.assume("FP8 training dispatches BF16 tokens (Megatron-Core's alltoall and DeepEP dispatchers)")
        out["moe_dispatch_dtype"] = "bf16"
    return out


def fp8_recipe(r, dtype: str) -> dict:
    """``--fp8-recipe`` -> ``training.fp8_recipe`` (absent: ``delayed``, Megatron-Core's default
    and stepsim's); ``custom`` (a user quantizer factory) is refused: its passes are unknown."""
    recipe = r.args.get("fp8-recipe")
    if recipe is None:
        return {}
    if recipe not in FP8_RECIPES:
        raise ScenarioError(f"one of {', '.join(FP8_RECIPES)}, got {recipe!r}", field="--fp8-recipe")
    if recipe == "custom":
        raise ScenarioError(
            "a custom quantizer factory's quantisation passes are not modelled: use delayed, tensorwise, "
            "blockwise or mxfp8",
            field="--fp8-recipe",
        )
    r.take("fp8-recipe", "training.fp8_recipe")
    if dtype != "fp8":
        r.assume(f"--fp8-recipe {recipe} without FP8 training: no effect")
        return {}
    return {} if recipe == "delayed" else {"fp8_recipe": recipe}


def fp8_weights(r, dtype: str) -> dict:
    """``--fp8-param-gather`` (FP8 primary weights) and ``--disable-parameter-transpose-cache``
    (Transformer Engine re-quantises the weights every micro-batch)."""
    out = {}
    if "fp8-param-gather" in r.args:
        r.take("fp8-param-gather", "training.fp8_params", dtype == "fp8")
        if dtype == "fp8":
            out["fp8_params"] = True
        else:
            r.assume("--fp8-param-gather without FP8 training: no effect (the weights stay BF16)")
    if "disable-parameter-transpose-cache" in r.args:
        r.take("disable-parameter-transpose-cache", "training.fp8_weight_cache", False)
    elif dtype == "fp8" and not out:
        out["fp8_weight_cache"] = True
        r.assume("FP8 with BF16 weights: Transformer Engine caches their FP8 copies (Megatron-Core's default)")
    return out
