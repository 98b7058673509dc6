"""The pipeline split and the MoE layer pattern of a Megatron-LM argument list (for
:mod:`simulator.interop.megatron`): ``--pipeline-model-parallel-layout`` (Megatron-Core's layout
string, ``megatron/core/transformer/pipeline_parallel_layer_layout.py`` at d98e8a64),
``--decoder-first/last-pipeline-num-layers`` and ``--moe-layer-freq``. Each function takes the
argument mapping ``m`` (its ``args``, ``integer``, ``take`` and ``assume``)."""

from __future__ import annotations

import re

from simulator.scenario.errors import ScenarioError


def pipeline_layers(m, layers: int, par: dict) -> None:
    """Uneven stages: ``--decoder-first/last-pipeline-num-layers`` (the rest split evenly), or,
    where the layers do not divide into the stages and neither is given, stepsim's "auto"
    (lighter first and last chunks; Megatron would ask for the two arguments)."""
    args, pp, vpp = m.args, par["pp"], par["vpp"]
    first, last = args.get("decoder-first-pipeline-num-layers"), args.get("decoder-last-pipeline-num-layers")
    if args.get("pipeline-model-parallel-layout") is not None:
        par["pipeline_layers"] = layout_layers(m, str(args["pipeline-model-parallel-layout"]), layers, pp * vpp)
        m.take("pipeline-model-parallel-layout", "parallel.pipeline_layers", par["pipeline_layers"])
    elif (first is not None or last is not None) and pp > 1 and vpp == 1:
        f = m.integer("decoder-first-pipeline-num-layers", low=0) if first is not None else None
        lst = m.integer("decoder-last-pipeline-num-layers", low=0) if last is not None else None
        inner = pp - (f is not None) - (lst is not None)
        rest = layers - (f or 0) - (lst or 0)
        if rest < 0:
            raise ScenarioError(
                f"the first and last stages' {(f or 0) + (lst or 0)} layers exceed the model's {layers}",
                field="--decoder-first-pipeline-num-layers" if f is not None else "--decoder-last-pipeline-num-layers",
            )
        if inner <= 0 or rest % inner:
            raise ScenarioError(
                f"the other {inner} stages cannot split {rest} layers evenly",
                field="--decoder-first-pipeline-num-layers",
            )
        split = [rest // inner] * inner
        par["pipeline_layers"] = ([f] if f is not None else []) + split + ([lst] if lst is not None else [])
        for a in ("decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers"):
            if a in args:
                m.take(a, "parallel.pipeline_layers", par["pipeline_layers"])
    elif pp > 1 and layers % (pp * vpp):
        par["pipeline_layers"] = "auto"
        m.assume(
            f"parallel.pipeline_layers = auto: {layers} layers do not divide into {pp * vpp} chunks "
            "(lighter first and last chunks)"
        )


def layout_layers(m, layout: str, layers: int, chunks: int) -> list[int]:
    """Transformer layers per model chunk of a Megatron-Core layout string (``|`` between
    chunks, ``t`` a layer, ``(..)*n`` and ``x*n`` repeats; embedding, MTP and loss marks
    are not layers)."""

    # The expanded string holds one t per layer, one | between chunks, E, L and up to 64 m (MTP):
    # a repeat making it longer is refused before it is built ('t*99999999999' is 100 GB).
    longest = layers + chunks + 1024
    built = [0]  # characters the repeats have built so far

    def repeat(match) -> str:
        part, times = match.group(1), int(match.group(2))
        built[0] += len(part) * times
        if built[0] > longest:
            raise ScenarioError(
                f"{part!r}*{times} repeats past the {layers} layers and {chunks} chunks of the arguments",
                field="--pipeline-model-parallel-layout",
            )
        return part * times

    text = layout.replace(",", "").replace(" ", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", repeat, text)
    text = re.sub(r"(.)\*(\d+)", repeat, text)
    if len(text) > longest:
        raise ScenarioError(
            f"repeats past the {layers} layers and {chunks} chunks of the arguments",
            field="--pipeline-model-parallel-layout",
        )
    if set(text) - set("EtmL|"):
        raise ScenarioError(
            f"layers E, t, m, L between | only, got {layout!r}", field="--pipeline-model-parallel-layout"
        )
    out = [stage.count("t") for stage in text.split("|")]
    if len(out) != chunks or sum(out) != layers:
        raise ScenarioError(
            f"{len(out)} chunks of {sum(out)} layers; the arguments give {chunks} chunks of {layers}",
            field="--pipeline-model-parallel-layout",
        )
    return out


def dense_layers(m, freq: str, layers: int) -> int:
    """``--moe-layer-freq``: 1 (every layer MoE) or a pattern ``([0]*k+[1]*n)`` (the first
    ``k`` layers dense): the layouts stepsim runs (``model.moe.dense_layers``)."""

    text = freq.replace(" ", "")
    if text == "1":
        return 0
    m = re.fullmatch(r"\(?\[0\]\*(\d+)\+\[1\]\*(\d+)\)?", text)
    if m is None or int(m.group(1)) + int(m.group(2)) != layers:
        raise ScenarioError(
            f"1 or ([0]*k+[1]*n) with k + n = {layers} layers (the first k dense), got {freq!r}",
            field="--moe-layer-freq",
        )
    return int(m.group(1))
