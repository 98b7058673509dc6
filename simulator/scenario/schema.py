"""The scenario file: schema, loading, preset resolution (shared/scenario.md).

``load_scenario(path_or_mapping) -> Scenario`` reads YAML or JSON, validates it
with pydantic (unknown keys and wrong types refused), resolves model and cluster
presets (a mapping beside ``preset`` overrides it field by field) and returns
frozen specs. Every failure is a :class:`ScenarioError` whose message starts
with the dotted key at fault and says what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from simulator.errors import StepsimError
from topologies.chips import CHIPS, ChipSpec, get_chip
from topologies.errors import TopologyError
from topologies.networks import ClusterSpec, PodsSpec, SwitchedNetwork, TorusNetwork
from topologies.presets import CLUSTER_PRESETS, cluster_preset
from workloads.layout import ORDER_AXES, LayoutError, ParallelLayout
from workloads.model import MLASpec, ModelSpec, MoESpec
from workloads.moe_load import ExpertLoad
from workloads.presets import MODEL_PRESETS, get_model
from workloads.enums import Balance, Recompute, Schedule, TraceCollectiveOp
from workloads.errors import WorkloadError
from workloads.training import TrainingSpec


MAX_DEVICES = 262_144
# The simulation's size, estimated before anything is built (workloads.trace.builder.estimated_ops,
# an upper estimate: ~12 ops per layer pass per simulated rank). Measured on 2026-12-01:
# Llama-3-8B widened to 1,000 layers on 8 H100 (112,033 ops, 192,384 estimated) peaked
# 163 MB above the interpreter (~850 B per estimated op) and took 12.9 s. The largest
# built-in case (DeepSeek-V3 on 2,048 H800) estimates 443,520 ops; the largest validation
# case (Narayanan et al. 2021, 1008B on 3,072 A100: pp 64, 512 micro-batches, interleaved,
# full recompute) 4,718,592. The limit admits it with ~25% room (~6 GB at the measured rate).
MAX_ESTIMATED_OPS = 6_000_000
BYTES_PER_ESTIMATED_OP = 1_000


class ScenarioError(StepsimError):
    """A scenario that cannot be simulated; ``field`` is the dotted key at fault."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}" if field else message, field)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False, frozen=True)


def _integer(v):
    """Integer fields take integers only (any ``numbers.Integral``, e.g. numpy's, but not a
    bool, a float or a string): `ep: true` or `tp: 8.0` is refused, not read as 1 or 8."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ValueError("must be an integer" + (", not a boolean" if isinstance(v, bool) else ""))
    return int(v)


SInt = Annotated[int, BeforeValidator(_integer)]


class MLAIn(_Strict):
    kind: Literal["mla"] = "mla"
    q_lora_rank: SInt = Field(1536, ge=0)
    kv_lora_rank: SInt = Field(512, ge=1)
    qk_rope_head_dim: SInt = Field(64, ge=0)
    qk_nope_head_dim: SInt = Field(128, ge=1)
    v_head_dim: SInt = Field(128, ge=1)


class MoEIn(_Strict):
    experts: SInt = Field(ge=1)
    top_k: SInt = Field(ge=1)
    expert_ffn_hidden: SInt = Field(ge=1)
    shared_experts: SInt = Field(0, ge=0)
    dense_layers: SInt = Field(0, ge=0)
    layer_freq: SInt = Field(1, ge=1)
    max_nodes_per_token: Optional[SInt] = Field(None, ge=1)


class ModelIn(_Strict):
    name: Optional[str] = None
    preset: Optional[str] = None
    hf_config: Optional[str] = None
    layers: SInt = Field(ge=1)
    hidden: SInt = Field(ge=1)
    heads: SInt = Field(ge=1)
    kv_heads: Optional[SInt] = Field(None, ge=1)
    head_dim: Optional[SInt] = Field(None, ge=1)
    ffn_hidden: SInt = Field(ge=1)
    ffn: Literal["swiglu", "gelu"] = "swiglu"
    vocab: SInt = Field(ge=1)
    tied_embeddings: bool = False
    parallel_block: bool = False
    attention: Optional[MLAIn] = None
    moe: Optional[MoEIn] = None
    mtp_depth: SInt = Field(0, ge=0)
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    bias: bool = False
    source: str = ""


class ChipIn(_Strict):
    name: str = "custom"
    peak_flops_per_s: dict[Literal["bf16", "fp8"], float]
    hbm_bytes: float = Field(gt=0)
    hbm_bw_bytes_per_s: float = Field(gt=0)
    family: Literal["ampere", "hopper", "blackwell", "tpu"] = "hopper"
    source: str = ""

    @field_validator("peak_flops_per_s")
    @classmethod
    def _peaks(cls, v):
        if "bf16" not in v:
            raise ValueError("needs a 'bf16' entry (dense peak FLOP/s)")
        for k, x in v.items():
            if not (x > 0 and math.isfinite(x)):
                raise ValueError(f"{k} must be a finite number > 0")
        return v


class ParallelIn(_Strict):
    tp: SInt = Field(1, ge=1)
    cp: SInt = Field(1, ge=1)
    pp: SInt = Field(1, ge=1)
    dp: Optional[SInt] = Field(None, ge=1)
    ep: SInt = Field(1, ge=1)
    vpp: SInt = Field(1, ge=1)
    pipeline_layers: Optional[Union[list[SInt], Literal["auto"]]] = None
    etp: SInt = Field(1, ge=1)
    zero: Literal[0, 1, 2, 3] = 1
    sequence_parallel: bool = True
    order: str = "-".join(ORDER_AXES)

    @field_validator("zero", mode="before")
    @classmethod
    def _zero_not_bool(cls, v):
        if isinstance(v, bool):
            raise ValueError("must be 0, 1, 2 or 3 (ZeRO stage), not a boolean")
        return v


class OffloadIn(_Strict):
    optimizer: bool = False
    activations: bool = False


class ExpertLoadIn(_Strict):
    distribution: Literal["balanced", "zipf", "lognormal", "dirichlet"] = "balanced"
    skew: float = Field(1.0, gt=0)
    capacity_factor: Optional[float] = Field(None, ge=1)
    seed: SInt = 0


class TrainingIn(_Strict):
    seq_len: SInt = Field(4096, ge=1)
    micro_batch_size: SInt = Field(1, ge=1)
    global_batch_size: SInt = Field(ge=1)
    dtype: Literal["bf16", "fp8"] = "bf16"
    recompute: Recompute = "none"
    balance: Balance = "aux-free"
    optimizer: Literal["adam", "muon", "sgd"] = "adam"
    flash_attention: bool = True
    overlap_grad_reduce: bool = True
    cp_algorithm: Literal["ring", "all-gather"] = "ring"
    activation_saving: Literal["none", "deepseek-v3"] = "none"
    moe_gate_weighting: Literal["activation", "combine"] = "activation"
    grad_dtype: Literal["fp32", "bf16"] = "fp32"
    optimizer_state_dtype: Literal["fp32", "bf16"] = "fp32"
    master_weights: Literal["fp32", "remainder", "none"] = "fp32"
    recompute_modules: Optional[list[str]] = None
    dropout: bool = False
    expert_load: Optional[ExpertLoadIn] = None
    offload: Optional["OffloadIn"] = None


class PerturbationIn(_Strict):
    devices: Optional[list[SInt]] = None
    compute_scale: Optional[float] = Field(None, gt=0)
    link: Optional[list[str]] = Field(None, min_length=2, max_length=2)
    bw_scale: Optional[float] = Field(None, gt=0)
    failed: bool = False


class ComputeCalIn(_Strict):
    gemm_efficiency: Optional[float] = Field(None, gt=0, le=1)
    fp8_gemm_efficiency: Optional[float] = Field(None, gt=0, le=1)
    gemm_dim_half: Optional[float] = Field(None, ge=0)
    attention_efficiency: Optional[float] = Field(None, gt=0, le=1)
    memory_efficiency: Optional[float] = Field(None, gt=0, le=1)
    launch_overhead_s: Optional[float] = Field(None, ge=0)
    comm_sm_fraction: Optional[float] = Field(None, ge=0, lt=1)


_LinkKind = Literal["ici", "nvlink", "nic", "fabric", "dcn"]  # simulator.network.calibration.LINK_KINDS


class NetCalIn(_Strict):
    """``network_calibration``: entries replacing those of the chip family's
    :class:`simulator.network.calibration.NetCalibration` (``stepsim calibrate --nccl-tests`` prints them)."""

    efficiency: dict[_LinkKind, Annotated[float, Field(gt=0, le=1)]] = {}
    message_overhead_s: dict[_LinkKind, Annotated[float, Field(ge=0, le=1e-2)]] = {}
    algorithm_efficiency: dict[str, Annotated[float, Field(gt=0, le=1)]] = {}


class ScenarioIn(_Strict):
    name: Optional[str] = None
    model: Union[str, dict]
    cluster: Union[str, dict]
    parallel: ParallelIn = ParallelIn()
    schedule: Schedule = "1f1b"
    training: TrainingIn
    perturbations: list[PerturbationIn] = []
    compute: ComputeCalIn = ComputeCalIn()
    network_calibration: NetCalIn = NetCalIn()
    algorithms: dict[TraceCollectiveOp, str] = {}


@dataclass(frozen=True)
class Scenario:
    """A validated scenario: frozen specs, ready for :func:`simulator.simulate`."""

    name: str
    model: ModelSpec
    cluster: ClusterSpec
    layout: ParallelLayout
    schedule: str
    training: TrainingSpec
    perturbations: tuple[PerturbationIn, ...] = ()
    compute_overrides: tuple[tuple[str, float], ...] = ()
    network_overrides: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()  # network_calibration
    algorithms: tuple[tuple[str, str], ...] = ()
    expert_load: Optional[ExpertLoad] = None
    source: Any = None  # the raw mapping it was loaded from

    @property
    def devices(self) -> int:
        return self.cluster.devices

    def network_calibration(self):
        """The chip family's :class:`simulator.network.calibration.NetCalibration` with the scenario's
        ``network_calibration`` entries applied."""
        from simulator.network.calibration import default_calibration

        cal = default_calibration(self.cluster.chip.family)
        return cal.with_overrides(**{k: dict(v) for k, v in self.network_overrides}) if self.network_overrides else cal

    def workload(self):
        """The :class:`workloads.trace.builder.Workload` this scenario describes."""
        from workloads.trace.builder import Workload

        net = self.cluster.network
        domain = net.domain_size if getattr(net, "kind", "") == "switched" else 0
        return Workload(
            self.model, self.layout, self.training, self.schedule, expert_load=self.expert_load, domain_size=domain
        )


# ---- loading ---------------------------------------------------------------------------


def read_mapping(path: Union[str, Path], what: str = "scenario") -> dict:
    """A scenario-like file (YAML, or JSON by extension) as a mapping, read through
    :mod:`simulator.fileio` (YAML 1.2 floats, duplicate keys, size, depth and alias caps).
    Every failure is a :class:`ScenarioError` naming the file."""
    from simulator.fileio import InputFileError, load_file

    p = Path(path)
    try:
        data = load_file(p, what=f"{what} file")
    except InputFileError as err:
        raise ScenarioError("", str(err)) from None
    if not isinstance(data, dict):
        raise ScenarioError(
            "",
            f"{p}: a {what} is a mapping with keys "
            f"{'model, cluster, parallel, schedule, training' if what == 'scenario' else 'name, base, grid, cases'}"
            f"; got {type(data).__name__}",
        )
    data.setdefault("name", p.stem)
    return data


BUILTIN_DIR = Path(__file__).resolve().parent.parent / "scenarios"


def builtin_scenarios() -> dict[str, Path]:
    """Built-in scenario files by name (``stepsim presets`` lists them)."""
    return {p.stem: p for p in sorted(BUILTIN_DIR.glob("*.yaml"))}


def load_scenario(source: Union[str, Path, Mapping]) -> Scenario:
    """Validate a scenario given as a path (YAML/JSON), a built-in scenario name, or a mapping."""
    base_dir = None
    if isinstance(source, str) and not Path(source).exists() and source in builtin_scenarios():
        source = builtin_scenarios()[source]
    if isinstance(source, (str, Path)):
        base_dir = Path(source).parent
        data = read_mapping(source)
    elif isinstance(source, Mapping):
        data = dict(source)
    else:
        raise ScenarioError("", f"expected a path or a mapping, got {type(source).__name__}")
    try:
        sc = ScenarioIn.model_validate(data)
    except ValidationError as err:
        raise error_from_pydantic(err, "") from None
    model = _resolve_model(sc.model, base_dir)
    cluster = resolve_cluster(sc.cluster)
    layout = _resolve_layout(sc.parallel, cluster.devices)
    try:
        tr = sc.training.model_dump(exclude={"expert_load", "offload"})
        tr["recompute_modules"] = tuple(tr.get("recompute_modules") or ())
        if sc.training.offload is not None:
            tr["offload_optimizer"] = sc.training.offload.optimizer
            tr["offload_activations"] = sc.training.offload.activations
        training = TrainingSpec(**tr)
        training.micro_batches(layout.dp)
    except WorkloadError as err:
        raise ScenarioError.from_error(err, "training") from None
    _check_dense(model, sc)
    _check_moe_layout(model, layout)
    _check_algorithms(sc.algorithms)
    check_size(model, layout, training, sc.schedule)
    for i, p in enumerate(sc.perturbations):
        if p.devices is None and p.link is None:
            raise ScenarioError(
                f"perturbations[{i}]", "needs 'devices' (with compute_scale) or 'link' (with bw_scale or failed: true)"
            )
        for d in p.devices or []:
            if not 0 <= d < cluster.devices:
                raise ScenarioError(f"perturbations[{i}].devices", f"device {d} outside 0..{cluster.devices - 1}")
        if p.devices is not None and p.compute_scale is None:
            raise ScenarioError(f"perturbations[{i}].compute_scale", "needed with 'devices' (e.g. 0.8 = 80% speed)")
        if p.link is not None and p.bw_scale is None and not p.failed:
            raise ScenarioError(f"perturbations[{i}]", "a link perturbation needs bw_scale or failed: true")
    overrides = tuple((k, v) for k, v in sc.compute.model_dump().items() if v is not None)
    for alg in sc.network_calibration.algorithm_efficiency:
        from simulator.network.collectives import ALGORITHMS

        if alg not in ALGORITHMS:
            raise ScenarioError(
                f"network_calibration.algorithm_efficiency.{alg}",
                f"unknown algorithm; allowed: {', '.join(ALGORITHMS)}",
            )
    net_overrides = tuple((k, tuple(sorted(v.items()))) for k, v in sc.network_calibration.model_dump().items() if v)
    name = sc.name or model.name
    return Scenario(
        name=str(name),
        model=model,
        cluster=cluster,
        layout=layout,
        schedule=sc.schedule,
        training=training,
        perturbations=tuple(sc.perturbations),
        compute_overrides=overrides,
        network_overrides=net_overrides,
        algorithms=tuple(sorted(sc.algorithms.items())),
        source=data,
        expert_load=ExpertLoad(**sc.training.expert_load.model_dump()) if sc.training.expert_load else None,
    )


def check_size(
    model: ModelSpec, layout: ParallelLayout, training: TrainingSpec, schedule: str, ranks: Optional[int] = None
) -> None:
    """Refuse a step too large to simulate before building it: the estimated op count
    (layers x micro-batches x passes over ``ranks`` simulated ranks, default one per
    pipeline stage) above :data:`MAX_ESTIMATED_OPS`, quoting the estimate and the field."""
    from workloads.trace.builder import Workload, estimated_ops

    n_ranks = layout.pp if ranks is None else ranks
    try:
        n = estimated_ops(Workload(model, layout, training, schedule), n_ranks)
        m = training.micro_batches(layout.dp)
    except ValueError:
        return  # an invalid layout or schedule: building reports it, naming the field
    if n <= MAX_ESTIMATED_OPS:
        return
    field = "model.layers" if model.layers >= m else "training.global_batch_size"
    raise ScenarioError(
        field,
        f"the step would need about {n:,.0f} operations (~{n * BYTES_PER_ESTIMATED_OP / 1e9:.1f} GB): "
        f"{model.layers:,} layers x {m:,} micro-batches x {n_ranks:,} simulated ranks; the limit "
        f"is {MAX_ESTIMATED_OPS:,} (~{MAX_ESTIMATED_OPS * BYTES_PER_ESTIMATED_OP / 1e9:.0f} GB): "
        "use fewer layers, fewer micro-batches (a larger micro_batch_size) or, with --exact, "
        "fewer devices",
    )


def _check_algorithms(algorithms: Mapping[str, str]) -> None:
    from simulator.network.collectives import VALID_ALGORITHMS

    for op, alg in algorithms.items():
        if alg not in VALID_ALGORITHMS[op]:
            raise ScenarioError(
                f"algorithms.{op}", f"unknown algorithm {alg!r} for {op}; allowed: {', '.join(VALID_ALGORITHMS[op])}"
            )


def _check_moe_layout(model: ModelSpec, layout: ParallelLayout) -> None:
    """MoE layers under tensor parallelism route the sequence-parallel shard of the tokens
    (Megatron-Core requires --sequence-parallel with MoE and tp > 1), refused at load rather
    than when the first MoE layer is counted."""
    has_moe_layer = model.moe is not None and model.moe.dense_layers < model.layers  # layer dense_layers is MoE
    if has_moe_layer and layout.tp > 1 and not layout.sequence_parallel:
        raise ScenarioError(
            "parallel.sequence_parallel",
            "MoE layers with tp > 1 need sequence parallelism "
            "(Megatron-Core routes the sequence-parallel shard of "
            "tokens); set it to true or use tp: 1",
        )


def _check_dense(model: ModelSpec, sc: ScenarioIn) -> None:
    """MoE-only settings on a dense model are refused rather than silently ignored."""
    if model.moe is not None:
        return
    dense = f"the model {model.name!r} is dense (no model.moe)"
    if sc.parallel.ep > 1:
        raise ScenarioError("parallel.ep", f"expert parallelism needs a MoE model; {dense}: use ep: 1")
    if sc.parallel.etp > 1:
        raise ScenarioError("parallel.etp", f"expert tensor parallelism needs a MoE model; {dense}: use etp: 1")
    if sc.training.balance != "aux-free":  # the default, which resolved scenarios spell out
        raise ScenarioError(
            "training.balance",
            f"load balancing applies to MoE models only; {dense}: leave it out (got {sc.training.balance!r})",
        )
    if sc.training.expert_load is not None:
        raise ScenarioError("training.expert_load", f"applies to MoE models only; {dense}: leave it out")
    if sc.training.moe_gate_weighting != "activation":  # the default
        raise ScenarioError("training.moe_gate_weighting", f"applies to MoE models only; {dense}: leave it out")
    if "moe_act" in (sc.training.recompute_modules or ()):
        raise ScenarioError("training.recompute_modules", f"moe_act applies to MoE models only; {dense}")


def error_from_pydantic(err: ValidationError, prefix: str) -> ScenarioError:
    e = err.errors()[0]
    loc = [str(x) for x in e["loc"] if not str(x).startswith(("function-", "literal["))]
    # Union members show up in loc (e.g. 'str', 'dict[any,any]'): drop them.
    loc = [x for x in loc if x not in ("str", "dict[any,any]", "int", "float")]
    field = ".".join(([prefix] if prefix else []) + loc)
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
        msg += f" (got {got!r})"
    return ScenarioError(field, msg)


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


# ---- model -------------------------------------------------------------------------------


def _resolve_model(spec: Union[str, dict], base_dir: Optional[Path]) -> ModelSpec:
    if isinstance(spec, str):
        return _preset_model(spec)
    spec = dict(spec)
    base: dict = {}
    if "hf_config" in spec and spec["hf_config"] is not None:
        from workloads.hf_config import model_from_hf_config

        if not isinstance(spec["hf_config"], str):
            raise ScenarioError("model.hf_config", f"must be a path to a config.json, got {spec['hf_config']!r}")

        path = Path(spec["hf_config"])
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        try:
            base = _model_dict(model_from_hf_config(path, name=spec.get("name")))
        except (OSError, ValueError, KeyError) as err:
            raise ScenarioError("model.hf_config", str(err)) from None
    if spec.get("preset") is not None:
        base = _model_dict(_preset_model(spec["preset"], field="model.preset"))
    merged = {**base, **{k: v for k, v in spec.items() if k not in ("preset", "hf_config")}}
    for sub in ("attention", "moe"):
        if isinstance(base.get(sub), dict) and isinstance(spec.get(sub), dict):
            merged[sub] = {**base[sub], **spec[sub]}
    try:
        m = ModelIn.model_validate(merged)
    except ValidationError as err:
        raise error_from_pydantic(err, "model") from None
    d = m.model_dump(exclude={"preset", "hf_config"})
    att = d.pop("attention")
    moe = d.pop("moe")
    d["name"] = d.get("name") or spec.get("preset") or "custom"
    try:
        model = ModelSpec(
            **d,
            attention=MLASpec(**{k: v for k, v in att.items() if k != "kind"}) if att else None,
            moe=MoESpec(**moe) if moe else None,
        )
    except (TypeError, ValueError) as err:
        raise ScenarioError("model", str(err)) from None
    if model.heads % model.kv_heads:
        raise ScenarioError("model.kv_heads", f"must divide heads ({model.heads}), got {model.kv_heads}")
    if model.moe and model.moe.top_k > model.moe.experts:
        raise ScenarioError("model.moe.top_k", f"must be at most experts ({model.moe.experts}), got {model.moe.top_k}")
    if model.moe and model.moe.dense_layers > model.layers:
        raise ScenarioError("model.moe.dense_layers", f"must be at most layers ({model.layers})")
    return model


def _preset_model(name: str, field: str = "model") -> ModelSpec:
    try:
        return get_model(name)
    except (KeyError, ValueError):
        raise ScenarioError(field, f"unknown preset {name!r}; allowed: {', '.join(sorted(MODEL_PRESETS))}") from None


def _model_dict(m: ModelSpec) -> dict:
    d = dataclasses.asdict(m)
    if d.get("attention"):
        d["attention"] = {"kind": "mla", **d["attention"]}
    return d


# ---- cluster -------------------------------------------------------------------------------


def resolve_cluster(spec: Union[str, dict]) -> ClusterSpec:
    if isinstance(spec, str):
        spec = {"preset": spec}
    spec = dict(spec)
    allowed = ("preset", "devices", "chip", "network", "pods", "name", "host_bw_bytes_per_s", "devices_per_domain")
    for k in spec:
        if k not in allowed:
            raise ScenarioError(f"cluster.{k}", f"unknown key; allowed: {', '.join(allowed)}")
    devices = spec.get("devices")
    if devices is not None and (not isinstance(devices, int) or isinstance(devices, bool) or devices < 1):
        raise ScenarioError("cluster.devices", f"must be an integer >= 1, got {devices!r}")
    if devices is not None and devices > MAX_DEVICES:
        raise ScenarioError("cluster.devices", f"at most {MAX_DEVICES:,} devices are supported, got {devices:,}")
    try:
        chip = _resolve_chip(spec.get("chip"))
        if spec.get("preset") is not None:
            if not isinstance(spec["preset"], str):
                raise ScenarioError(
                    "cluster.preset",
                    f"must be a preset name, got {spec['preset']!r}; allowed: {', '.join(sorted(CLUSTER_PRESETS))}",
                )
            over = {
                k: spec[k]
                for k in ("network", "pods", "name", "host_bw_bytes_per_s", "devices_per_domain")
                if k in spec
            }
            if chip is not None:
                over["chip"] = chip
            return cluster_preset(spec["preset"], devices, **over)
        if chip is None:
            raise ScenarioError(
                "cluster.chip", f"required without a preset; a chip preset ({', '.join(sorted(CHIPS))}) or a mapping"
            )
        if "network" not in spec:
            raise ScenarioError("cluster.network", "required without a preset (kind: torus | switched)")
        if devices is None:
            raise ScenarioError("cluster.devices", "required without a preset")
        network = _network(spec["network"])
        pods = _pods(spec.get("pods"))
        return ClusterSpec(
            name=str(spec.get("name", "custom")),
            devices=devices,
            chip=chip,
            network=network,
            pods=pods,
            host_bw_bytes_per_s=spec.get("host_bw_bytes_per_s", 32e9),
            devices_per_domain=spec.get("devices_per_domain"),
        )
    except TopologyError as err:
        raise ScenarioError.from_error(err, "cluster") from None
    except TypeError as err:
        raise ScenarioError("cluster", str(err)) from None


def _resolve_chip(chip) -> Optional[ChipSpec]:
    if chip is None:
        return None
    if isinstance(chip, str):
        try:
            return get_chip(chip)
        except (KeyError, ValueError):
            raise ScenarioError("cluster.chip", f"unknown chip {chip!r}; allowed: {', '.join(sorted(CHIPS))}") from None
    if isinstance(chip, dict):
        base = {}
        if "preset" in chip:
            c = _resolve_chip(chip["preset"])
            base = {
                "name": c.name,
                "peak_flops_per_s": dict(c.peak_flops_per_s),
                "hbm_bytes": c.hbm_bytes,
                "hbm_bw_bytes_per_s": c.hbm_bw_bytes_per_s,
                "family": c.family,
                "source": c.source,
            }
        merged = {**base, **{k: v for k, v in chip.items() if k != "preset"}}
        try:
            c = ChipIn.model_validate(merged)
        except ValidationError as err:
            raise error_from_pydantic(err, "cluster.chip") from None
        return ChipSpec(
            name=c.name,
            peak_flops_per_s=dict(c.peak_flops_per_s),
            hbm_bytes=c.hbm_bytes,
            hbm_bw_bytes_per_s=c.hbm_bw_bytes_per_s,
            family=c.family,
            source=c.source,
        )
    raise ScenarioError("cluster.chip", f"a chip preset name or a mapping, got {chip!r}")


def _network(net) -> Union[TorusNetwork, SwitchedNetwork]:
    if not isinstance(net, dict):
        raise ScenarioError("cluster.network", f"must be a mapping with a kind (torus | switched), got {net!r}")
    net = dict(net)
    kind = net.pop("kind", None)
    classes = {"torus": TorusNetwork, "switched": SwitchedNetwork}
    if kind not in classes:
        raise ScenarioError("cluster.network.kind", f"must be one of torus, switched; got {kind!r}")
    cls = classes[kind]
    allowed = [f.name for f in dataclasses.fields(cls)]
    for k in net:
        if k not in allowed:
            raise ScenarioError(
                f"cluster.network.{k}", f"unknown key for a {kind} network; allowed: kind, {', '.join(allowed)}"
            )
    for k in ("shape", "wraparound"):
        if k in net and isinstance(net[k], list):
            net[k] = tuple(net[k])
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in net
    ]
    if missing:
        raise ScenarioError(f"cluster.network.{missing[0]}", f"required for a {kind} network")
    return cls(**net)


def _pods(p) -> Optional[PodsSpec]:
    if p is None:
        return None
    if not isinstance(p, dict):
        raise ScenarioError("cluster.pods", f"must be a mapping {{count, dcn_bw_bytes_per_s}}, got {p!r}")
    allowed = [f.name for f in dataclasses.fields(PodsSpec)]
    for k in p:
        if k not in allowed:
            raise ScenarioError(f"cluster.pods.{k}", f"unknown key; allowed: {', '.join(allowed)}")
    if "count" not in p or "dcn_bw_bytes_per_s" not in p:
        raise ScenarioError("cluster.pods", "needs count and dcn_bw_bytes_per_s")
    return PodsSpec(**p)


# ---- layout -------------------------------------------------------------------------------


def _resolve_layout(p: ParallelIn, devices: int) -> ParallelLayout:
    model_par = p.tp * p.cp * p.pp
    dp = p.dp
    if dp is None:
        if devices % model_par:
            raise ScenarioError(
                "parallel", f"tp*cp*pp = {p.tp}*{p.cp}*{p.pp} = {model_par} does not divide the {devices} devices"
            )
        dp = devices // model_par
    if model_par * dp != devices:
        raise ScenarioError(
            "parallel",
            f"tp*cp*pp*dp = {p.tp}*{p.cp}*{p.pp}*{dp} = {model_par * dp} must equal cluster.devices = {devices}",
        )
    order = tuple(x.strip() for x in p.order.split("-"))
    try:
        return ParallelLayout(
            tp=p.tp,
            cp=p.cp,
            pp=p.pp,
            dp=dp,
            ep=p.ep,
            vpp=p.vpp,
            etp=p.etp,
            zero=p.zero,
            sequence_parallel=p.sequence_parallel,
            order=order,
            pipeline_layers=(p.pipeline_layers if p.pipeline_layers in (None, "auto") else tuple(p.pipeline_layers)),
        )
    except LayoutError as err:
        raise ScenarioError.from_error(err) from None


def _training_dict(t: TrainingSpec) -> dict:
    d = dataclasses.asdict(t)
    off = {"optimizer": d.pop("offload_optimizer"), "activations": d.pop("offload_activations")}
    if off["optimizer"] or off["activations"]:
        d["offload"] = off
    if d["activation_saving"] == "none":  # as before the key existed: sweep keys stay stable
        del d["activation_saving"]
    for key, default in (
        ("moe_gate_weighting", "activation"),
        ("grad_dtype", "fp32"),
        ("optimizer_state_dtype", "fp32"),
        ("master_weights", "fp32"),
    ):
        if d[key] == default:  # likewise
            del d[key]
    if not d["dropout"]:
        del d["dropout"]
    if d["recompute_modules"]:
        d["recompute_modules"] = list(d["recompute_modules"])
    else:
        del d["recompute_modules"]
    return d


def scenario_to_dict(s: Scenario) -> dict:
    """A resolved scenario as a plain mapping (presets expanded) — what sweeps hash and store."""
    model = _model_dict(s.model)
    c = s.cluster
    net = dataclasses.asdict(c.network)
    net = {"kind": c.network.kind, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in net.items()}}
    cluster = {
        "name": c.name,
        "devices": c.devices,
        "chip": {
            "name": c.chip.name,
            "peak_flops_per_s": dict(c.chip.peak_flops_per_s),
            "hbm_bytes": c.chip.hbm_bytes,
            "hbm_bw_bytes_per_s": c.chip.hbm_bw_bytes_per_s,
            "family": c.chip.family,
        },
        "network": net,
        "host_bw_bytes_per_s": c.host_bw_bytes_per_s,
    }
    if c.pods is not None:
        cluster["pods"] = dataclasses.asdict(c.pods)
    if c.devices_per_domain is not None:
        cluster["devices_per_domain"] = c.devices_per_domain
    L = s.layout
    parallel = {
        "tp": L.tp,
        "cp": L.cp,
        "pp": L.pp,
        "dp": L.dp,
        "ep": L.ep,
        "vpp": L.vpp,
        "etp": L.etp,
        "zero": L.zero,
        "sequence_parallel": L.sequence_parallel,
        "order": "-".join(L.order),
        "pipeline_layers": (L.pipeline_layers if L.pipeline_layers in (None, "auto") else list(L.pipeline_layers)),
    }
    out = {
        "name": s.name,
        "model": model,
        "cluster": cluster,
        "parallel": parallel,
        "schedule": s.schedule,
        "training": _training_dict(s.training),
    }
    if s.expert_load is not None:
        out["training"]["expert_load"] = dataclasses.asdict(s.expert_load)
    if s.perturbations:
        out["perturbations"] = [p.model_dump(exclude_none=True) for p in s.perturbations]
    if s.compute_overrides:
        out["compute"] = dict(s.compute_overrides)
    if s.network_overrides:
        out["network_calibration"] = {k: dict(v) for k, v in s.network_overrides}
    if s.algorithms:
        out["algorithms"] = dict(s.algorithms)
    return out
