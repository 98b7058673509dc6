"""The scenario file's schema: the pydantic input models and how their failures read.

Each ``...In`` model is one section of the scenario file (``docs/scenario.md``): unknown keys
and wrong types are refused, and :func:`error_from_pydantic` turns pydantic's first error
into a :class:`ScenarioError` whose message starts with the dotted key at fault
(``model.moe.experts``) and says what is allowed. Resolving the validated input into the
frozen specs of :mod:`workloads` and :mod:`topologies` is :mod:`.resolve`'s job.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import types
import typing
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model, field_validator

from simulator.network.calibration import LINK_KINDS
from simulator.scenario.errors import ScenarioError
from topologies.chips import (
    FAMILIES,
    MAX_PEAK_FLOPS_PER_S,
    MIN_EFFICIENCY,
    MIN_PEAK_FLOPS_PER_S,
    ChipSpec,
    ComputeCalibration,
)
from workloads.enums import Schedule, TraceCollectiveOp
from workloads.layout import EXPERT_MAPPINGS, MLA_DOWN_PROJS, ORDER_AXES, ParallelLayout
from workloads.model import MLASpec, ModelSpec, MoESpec
from workloads.moe_load import ExpertLoad
from workloads.training import UB_SM_LAYERS, TrainingSpec


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False, frozen=True, allow_inf_nan=False)


def _integer(v):
    """Integer fields take integers only (any ``numbers.Integral``, e.g. numpy's, but not a
    bool, a float or a string): `ep: true` or `tp: 8.0` is refused, not read as 1 or 8."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ValueError("must be an integer" + (", not a boolean" if isinstance(v, bool) else ""))
    return int(v)


SInt = Annotated[int, BeforeValidator(_integer)]


def _real(v):
    """Number fields take finite numbers only (an integer or a float, not a boolean or a
    string): `hbm_bytes: .inf`, `compute_scale: "0.5"` or `bw_scale: true` is refused."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ValueError("must be a number" + (", not a boolean" if isinstance(v, bool) else ""))
    try:
        x = float(v)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x):
        raise ValueError("must be a finite number")
    return x


def _flag(v):
    """Flags take ``true`` or ``false`` only: `nvls: "false"` or `"no"` is a string, refused
    (pydantic would read "no" as false but "false" in quotes was echoed as a string)."""
    if not isinstance(v, bool):
        raise ValueError("must be true or false" + (" (in quotes it is a string)" if isinstance(v, str) else ""))
    return v


SFloat = Annotated[float, BeforeValidator(_real)]
SBool = Annotated[bool, BeforeValidator(_flag)]
#: Longest name (scenario, model, chip, cluster) accepted: a label, not a document.
MAX_NAME_CHARS = 200
Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]


def from_spec(
    name: str,
    spec: type,
    *,
    first: dict | None = None,
    replace: dict | None = None,
    exclude: tuple[str, ...] = (),
    last: dict | None = None,
    order: tuple[str, ...] | None = None,
    validators: dict | None = None,
    overrides: bool = False,
) -> type[BaseModel]:
    """The input model of a frozen spec dataclass: each field of ``spec`` with its name, type,
    default and constraint (``metadata``: ``ge``, ``gt``, ``le``, ``lt``), integers strict
    (:data:`SInt`) and nested specs as their input models (:data:`_INPUT_OF`). What the file
    spells differently is all that is written here: ``first`` / ``last`` fields the spec lacks,
    ``replace`` fields read otherwise, ``exclude`` fields the file does not hold; ``order`` the
    field order when it differs from the spec's (pydantic reports the first error in field
    order, so the order decides which key a message names); ``validators`` pydantic
    validators of what a constraint cannot say. ``overrides``: every field optional with
    default ``None`` ("keep the spec's value"), its constraint kept."""
    hints = typing.get_type_hints(spec)
    fields: dict[str, Any] = dict(first or {})
    for f in dataclasses.fields(spec):
        if f.name in exclude:
            continue
        if replace and f.name in replace:
            fields[f.name] = replace[f.name]
            continue
        default = None if overrides else ... if f.default is dataclasses.MISSING else f.default
        info = Field(default, **f.metadata) if f.metadata else default
        kind = _input_type(hints[f.name])
        fields[f.name] = (Optional[kind] if overrides else kind, info)
    fields.update(last or {})
    if order is not None:
        assert sorted(order) == sorted(fields), (name, sorted(set(order) ^ set(fields)))
        fields = {k: fields[k] for k in order}
    return create_model(name, __base__=_Strict, __module__=__name__, __validators__=validators, **fields)


def _input_type(ann):
    """A spec annotation as the input model reads it: ``int`` strict, nested specs as input models."""
    if ann is int:
        return SInt
    if ann is float:
        return SFloat
    if ann is bool:
        return SBool
    if ann is str:
        return Name
    if ann in _INPUT_OF:
        return _INPUT_OF[ann]
    if typing.get_origin(ann) in (Union, types.UnionType):  # Optional[X], X | None
        return Union[tuple(_input_type(a) for a in typing.get_args(ann))]
    return ann


#: spec dataclass -> its input model, filled as the models are built
_INPUT_OF: dict[type, type[BaseModel]] = {}


MLAIn = _INPUT_OF[MLASpec] = from_spec("MLAIn", MLASpec, first={"kind": (Literal["mla"], "mla")})
MoEIn = _INPUT_OF[MoESpec] = from_spec("MoEIn", MoESpec)
# A model in the file may name a preset or a Hugging Face config.json that its keys override
# (simulator.scenario.resolve), so its name is optional; the keys are listed in the file's order.
ModelIn = from_spec(
    "ModelIn",
    ModelSpec,
    replace={"name": (Optional[Name], None)},
    last={"preset": (Optional[Name], None), "hf_config": (Optional[Annotated[str, Field(max_length=4096)]], None)},
    order=(
        "name",
        "preset",
        "hf_config",
        "layers",
        "hidden",
        "heads",
        "kv_heads",
        "head_dim",
        "ffn_hidden",
        "ffn",
        "vocab",
        "tied_embeddings",
        "parallel_block",
        "attention",
        "moe",
        "mtp_depth",
        "norm",
        "bias",
        "source",
    ),
)


def _peaks(cls, v):
    if "bf16" not in v:
        raise ValueError("needs a 'bf16' entry (dense peak FLOP/s)")
    for k, x in v.items():
        if not MIN_PEAK_FLOPS_PER_S <= x <= MAX_PEAK_FLOPS_PER_S:
            raise ValueError(f"{k} must be from {MIN_PEAK_FLOPS_PER_S:g} to {MAX_PEAK_FLOPS_PER_S:g} FLOP/s")
    return v


# A chip in the file: named "custom" unless named, its peaks a mapping of bf16 (required) and
# fp8 to finite numbers > 0, its family one of the calibration families (default hopper).
ChipIn = from_spec(
    "ChipIn",
    ChipSpec,
    replace={
        "name": (Name, "custom"),
        "peak_flops_per_s": (dict[Literal["bf16", "fp8"], SFloat], ...),
        "family": (Literal[FAMILIES], "hopper"),
    },
    validators={"_peaks": field_validator("peak_flops_per_s")(classmethod(_peaks))},
)


def _zero_not_bool(cls, v):
    if isinstance(v, bool):
        raise ValueError("must be 0, 1, 2 or 3 (ZeRO stage), not a boolean")
    return v


# The file's parallel section: dp may be left out (derived from the devices), the pipeline
# split is a list or "auto", the ZeRO stage one of four (not a boolean), the mesh order one
# string ("tp-cp-ep-dp-pp"); the keys are listed in the file's order.
ParallelIn = from_spec(
    "ParallelIn",
    ParallelLayout,
    replace={
        "dp": (Optional[SInt], Field(None, ge=1)),
        "pipeline_layers": (Optional[list[SInt] | Literal["auto"]], None),
        "zero": (Literal[0, 1, 2, 3], 1),
        "order": (str, "-".join(ORDER_AXES)),
        "expert_mapping": (Literal[EXPERT_MAPPINGS], "megatron-core"),
        "mla_down_proj": (Literal[MLA_DOWN_PROJS], "duplicated"),
    },
    order=(
        "tp",
        "cp",
        "pp",
        "dp",
        "ep",
        "vpp",
        "pipeline_layers",
        "etp",
        "zero",
        "sequence_parallel",
        "order",
        "expert_mapping",
        "mla_down_proj",
    ),
    validators={"_zero_not_bool": field_validator("zero", mode="before")(classmethod(_zero_not_bool))},
)


class OffloadIn(_Strict):
    optimizer: SBool = False
    activations: SBool = False


ExpertLoadIn = from_spec("ExpertLoadIn", ExpertLoad)


# The file's training section: the batch size is required, the module list a list, the two
# offload flags one ``offload`` mapping, and the expert load (workloads.moe_load) nested here.
TrainingIn = from_spec(
    "TrainingIn",
    TrainingSpec,
    replace={
        "global_batch_size": (SInt, Field(ge=1)),
        "recompute_modules": (Optional[list[str]], None),
        # SMs a userbuffers layer's GEMM gives up: fewer than an H100's 132
        "tp_comm_overlap_sms": (Optional[dict[Literal[UB_SM_LAYERS], Annotated[SInt, Field(ge=0, le=131)]]], None),
    },
    exclude=("offload_optimizer", "offload_activations"),
    last={"expert_load": (Optional[ExpertLoadIn], None), "offload": (Optional[OffloadIn], None)},
)


#: Range of a perturbation's ``compute_scale`` and ``bw_scale``: 1/1000 to 1000 times.
MIN_SCALE, MAX_SCALE = 1e-3, 1e3


class PerturbationIn(_Strict):
    devices: list[SInt] | None = Field(None, max_length=262_144)
    compute_scale: SFloat | None = Field(None, ge=MIN_SCALE, le=MAX_SCALE)
    link: list[Name] | None = Field(None, min_length=2, max_length=2)
    bw_scale: SFloat | None = Field(None, ge=MIN_SCALE, le=MAX_SCALE)
    failed: SBool = False


# The file's ``compute:`` section: entries replacing those of the chip family's calibration.
ComputeCalIn = from_spec("ComputeCalIn", ComputeCalibration, exclude=("source",), overrides=True)

_LinkKind = Literal[LINK_KINDS]


class NetCalIn(_Strict):
    """``network_calibration``: entries replacing those of the chip family's
    :class:`simulator.network.calibration.NetCalibration` (``stepsim calibrate --nccl-tests`` prints them)."""

    efficiency: dict[_LinkKind, Annotated[SFloat, Field(ge=MIN_EFFICIENCY, le=1)]] = {}
    message_overhead_s: dict[_LinkKind, Annotated[SFloat, Field(ge=0, le=1e-2)]] = {}
    algorithm_efficiency: dict[Name, Annotated[SFloat, Field(ge=MIN_EFFICIENCY, le=1)]] = {}
    a2a_efficiency: dict[_LinkKind, Annotated[SFloat, Field(ge=MIN_EFFICIENCY, le=1)]] = {}


class PlacementIn(_Strict):
    """How ranks land on devices (docs/scenario.md, "Placement"): devices used per scale-up
    domain on a switched network (Slurm topology/block with ``--segment``), block lengths on
    a torus (a JAX mesh filling a slice's cubes)."""

    devices_per_domain: SInt | None = Field(None, ge=1)
    # one block length per torus axis: a 100,000-entry list was echoed whole in the error
    tile: list[SInt] | None = Field(None, max_length=64)


class ScenarioIn(_Strict):
    name: Name | None = None
    model: Name | dict
    cluster: Name | dict
    parallel: ParallelIn = ParallelIn()
    schedule: Schedule = "1f1b"
    training: TrainingIn
    perturbations: list[PerturbationIn] = []
    compute: ComputeCalIn = ComputeCalIn()
    network_calibration: NetCalIn = NetCalIn()
    algorithms: dict[TraceCollectiveOp, str] = {}
    placement: PlacementIn | None = None


def error_from_pydantic(err: ValidationError, prefix: str) -> ScenarioError:
    e = err.errors()[0]
    loc = [x for x in e["loc"] if not str(x).startswith(("function-", "literal[", "constrained-str"))]
    # Union members show up in loc (e.g. 'str', 'dict[any,any]'): drop them.
    loc = [x for x in loc if x not in ("str", "dict[any,any]", "int", "float")]
    field = prefix or ""
    for x in loc:  # list positions as [i]: perturbations[0].compute_scale
        field += f"[{x}]" if isinstance(x, int) else f".{x}" if field else str(x)
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "extra_forbidden":
        parent = field.rsplit(".", 1)[0] if "." in field else "the scenario"
        msg = f"unknown key in {parent}"
        allowed = _allowed_keys(err, e)
        if allowed:
            msg += f"; allowed: {', '.join(allowed)}"
    elif e["type"] == "missing":
        msg = "required key is missing"
    got = e.get("input")
    if e["type"] not in ("missing", "extra_forbidden") and not isinstance(got, (dict, list)):
        shown = repr(got)
        msg += f" (got {shown if len(shown) <= 80 else shown[:60] + f'... ({len(shown):,} characters)'})"
    return ScenarioError(msg, field=field)


def _allowed_keys(err: ValidationError, e) -> list[str]:
    title = err.title
    models = {
        m.__name__: m
        for m in (
            ScenarioIn,
            ParallelIn,
            TrainingIn,
            ModelIn,
            MoEIn,
            MLAIn,
            ChipIn,
            PerturbationIn,
            ComputeCalIn,
            ExpertLoadIn,
            OffloadIn,
        )
    }
    # Walk the location to find the model whose keys were exceeded.
    m = models.get(title)
    for part in e["loc"][:-1]:
        if m is None:
            break
        f = m.model_fields.get(str(part))
        if f is None:
            break
        ann = f.annotation
        m = next(
            (a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)), None
        )
    return sorted(m.model_fields) if m is not None else []
