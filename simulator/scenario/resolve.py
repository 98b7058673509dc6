"""Resolving a validated scenario into frozen specs: presets, overrides and defaults.

A model or cluster given by preset name, or as a mapping beside ``preset`` (or
``hf_config``) that overrides it field by field, becomes a :class:`workloads.model.ModelSpec`
or :class:`topologies.networks.ClusterSpec`; ``parallel`` becomes a
:class:`workloads.layout.ParallelLayout` (``dp`` derived from the devices when left out) and
``training`` a :class:`workloads.training.TrainingSpec`. Errors the specs raise are re-raised
as :class:`~simulator.scenario.schema.ScenarioError` naming the scenario key.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pydantic import ValidationError

from simulator.scenario.checks import MAX_DEVICES
from simulator.scenario.schema import ChipIn, ModelIn, ParallelIn, ScenarioError, TrainingIn, error_from_pydantic
from simulator.scenario.serialise import model_dict
from topologies.chips import CHIPS, ChipSpec, get_chip
from topologies.errors import TopologyError
from topologies.networks import ClusterSpec, PodsSpec, SwitchedNetwork, TorusNetwork
from topologies.presets import CLUSTER_PRESETS, cluster_preset
from workloads.errors import WorkloadError
from workloads.layout import LayoutError, ParallelLayout
from workloads.model import MLASpec, ModelSpec, MoESpec
from workloads.presets import MODEL_PRESETS, get_model
from workloads.training import TrainingSpec

# ---- model -------------------------------------------------------------------------------


def resolve_model(spec: str | dict, base_dir: Path | None) -> ModelSpec:
    if isinstance(spec, str):
        return _preset_model(spec)
    spec = dict(spec)
    base: dict = {}
    if "hf_config" in spec and spec["hf_config"] is not None:
        from workloads.hf_config import model_from_hf_config

        if not isinstance(spec["hf_config"], str):
            raise ScenarioError(f"must be a path to a config.json, got {spec['hf_config']!r}", field="model.hf_config")

        path = Path(spec["hf_config"])
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        try:
            base = model_dict(model_from_hf_config(path, name=spec.get("name")))
        except (OSError, ValueError, KeyError) as err:
            raise ScenarioError(str(err), field="model.hf_config") from None
    if spec.get("preset") is not None:
        base = model_dict(_preset_model(spec["preset"], field="model.preset"))
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
        raise ScenarioError(str(err), field="model") from None
    if model.heads % model.kv_heads:
        raise ScenarioError(f"must divide heads ({model.heads}), got {model.kv_heads}", field="model.kv_heads")
    if model.moe and model.moe.top_k > model.moe.experts:
        raise ScenarioError(
            f"must be at most experts ({model.moe.experts}), got {model.moe.top_k}", field="model.moe.top_k"
        )
    if model.moe and model.moe.dense_layers > model.layers:
        raise ScenarioError(f"must be at most layers ({model.layers})", field="model.moe.dense_layers")
    return model


def _preset_model(name: str, field: str = "model") -> ModelSpec:
    try:
        return get_model(name)
    except (KeyError, ValueError):
        raise ScenarioError(
            f"unknown preset {name!r}; allowed: {', '.join(sorted(MODEL_PRESETS))}", field=field
        ) from None


# ---- cluster -------------------------------------------------------------------------------


def _resolve_cluster(spec: str | dict) -> ClusterSpec:
    if isinstance(spec, str):
        spec = {"preset": spec}
    spec = dict(spec)
    allowed = (
        "preset",
        "devices",
        "chip",
        "network",
        "pods",
        "name",
        "host_bw_bytes_per_s",
        "storage_bw_bytes_per_s",
        "devices_per_domain",
        "domain_capacity",
    )
    for k in spec:
        if k not in allowed:
            raise ScenarioError(f"unknown key; allowed: {', '.join(allowed)}", field=f"cluster.{k}")
    devices = spec.get("devices")
    if devices is not None and (not isinstance(devices, int) or isinstance(devices, bool) or devices < 1):
        raise ScenarioError(f"must be an integer >= 1, got {devices!r}", field="cluster.devices")
    if devices is not None and devices > MAX_DEVICES:
        raise ScenarioError(f"at most {MAX_DEVICES:,} devices are supported, got {devices:,}", field="cluster.devices")
    try:
        chip = _resolve_chip(spec.get("chip"))
        if spec.get("preset") is not None:
            if not isinstance(spec["preset"], str):
                raise ScenarioError(
                    f"must be a preset name, got {spec['preset']!r}; allowed: {', '.join(sorted(CLUSTER_PRESETS))}",
                    field="cluster.preset",
                )
            over = {
                k: spec[k]
                for k in (
                    "network",
                    "pods",
                    "name",
                    "host_bw_bytes_per_s",
                    "storage_bw_bytes_per_s",
                    "devices_per_domain",
                    "domain_capacity",
                )
                if k in spec
            }
            if chip is not None:
                over["chip"] = chip
            return cluster_preset(spec["preset"], devices, **over)
        if chip is None:
            raise ScenarioError(
                f"required without a preset; a chip preset ({', '.join(sorted(CHIPS))}) or a mapping",
                field="cluster.chip",
            )
        if "network" not in spec:
            raise ScenarioError("required without a preset (kind: torus | switched)", field="cluster.network")
        if devices is None:
            raise ScenarioError("required without a preset", field="cluster.devices")
        network = _network(spec["network"])
        pods = _pods(spec.get("pods"))
        return ClusterSpec(
            name=str(spec.get("name", "custom")),
            devices=devices,
            chip=chip,
            network=network,
            pods=pods,
            host_bw_bytes_per_s=spec.get("host_bw_bytes_per_s", 32e9),
            storage_bw_bytes_per_s=spec.get("storage_bw_bytes_per_s", 2e12),  # ClusterSpec's default
            devices_per_domain=spec.get("devices_per_domain"),
            domain_capacity=spec.get("domain_capacity"),
        )
    except TopologyError as err:
        raise ScenarioError.from_error(err, "cluster") from None
    except TypeError as err:
        raise ScenarioError(str(err), field="cluster") from None


# Where each placement key lands in the cluster mapping (docs/scenario.md, "Placement").
_PLACEMENT_KEYS = {"devices_per_domain": ("devices_per_domain",), "tile": ("network", "tile")}


def resolve_cluster(spec: str | dict, placement=None) -> ClusterSpec:
    """The cluster section as a :class:`ClusterSpec`, with the scenario's ``placement`` block
    (``PlacementIn`` or None) applied: ``placement.devices_per_domain`` is ``cluster.devices_per_domain`` and
    ``placement.tile`` is ``cluster.network.tile``; a key given in both places with
    different values is refused, and errors about a placed key name ``placement.*``."""
    given = {} if placement is None else {k: v for k, v in placement.model_dump().items() if v is not None}
    if not given:
        return _resolve_cluster(spec)
    spec = {"preset": spec} if isinstance(spec, str) else dict(spec)
    for key, value in given.items():
        path = _PLACEMENT_KEYS[key]
        parent = spec
        for part in path[:-1]:
            child = parent.get(part)
            if child is not None and not isinstance(child, dict):  # `network: 5`: the cluster's check names it
                return _resolve_cluster(spec)
            child = parent[part] = dict(child or {})
            parent = child
        if path[-1] in parent and parent[path[-1]] != value:
            raise ScenarioError(
                f"{value!r} differs from cluster.{'.'.join(path)} = {parent[path[-1]]!r}; give it in one place",
                field=f"placement.{key}",
            )
        parent[path[-1]] = value
    try:
        return _resolve_cluster(spec)
    except ScenarioError as err:
        for key, path in _PLACEMENT_KEYS.items():
            if key in given and err.field == "cluster." + ".".join(path):
                message = str(err).split(": ", 1)[-1]
                if key == "tile" and message.startswith("unknown key"):
                    message = "applies to a torus (TPU slices); on a switched network use placement.devices_per_domain"
                raise ScenarioError(message, field=f"placement.{key}") from None
        raise


def _resolve_chip(chip) -> ChipSpec | None:
    if chip is None:
        return None
    if isinstance(chip, str):
        try:
            return get_chip(chip)
        except (KeyError, ValueError):
            raise ScenarioError(
                f"unknown chip {chip!r}; allowed: {', '.join(sorted(CHIPS))}", field="cluster.chip"
            ) from None
    if isinstance(chip, dict):
        base = {}
        if chip.get("preset") is not None:
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
    raise ScenarioError(f"a chip preset name or a mapping, got {chip!r}", field="cluster.chip")


def _network(net) -> TorusNetwork | SwitchedNetwork:
    if not isinstance(net, dict):
        raise ScenarioError(f"must be a mapping with a kind (torus | switched), got {net!r}", field="cluster.network")
    net = dict(net)
    kind = net.pop("kind", None)
    classes = {"torus": TorusNetwork, "switched": SwitchedNetwork}
    if kind not in classes:
        raise ScenarioError(f"must be one of torus, switched; got {kind!r}", field="cluster.network.kind")
    cls = classes[kind]
    allowed = [f.name for f in dataclasses.fields(cls)]
    for k in net:
        if k not in allowed:
            raise ScenarioError(
                f"unknown key for a {kind} network; allowed: kind, {', '.join(allowed)}", field=f"cluster.network.{k}"
            )
    for k in ("shape", "wraparound", "tile"):
        if k in net and isinstance(net[k], list):
            net[k] = tuple(net[k])
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in net
    ]
    if missing:
        raise ScenarioError(f"required for a {kind} network", field=f"cluster.network.{missing[0]}")
    return cls(**net)


def _pods(p) -> PodsSpec | None:
    if p is None:
        return None
    if not isinstance(p, dict):
        raise ScenarioError(f"must be a mapping {{count, dcn_bw_bytes_per_s}}, got {p!r}", field="cluster.pods")
    allowed = [f.name for f in dataclasses.fields(PodsSpec)]
    for k in p:
        if k not in allowed:
            raise ScenarioError(f"unknown key; allowed: {', '.join(allowed)}", field=f"cluster.pods.{k}")
    if "count" not in p or "dcn_bw_bytes_per_s" not in p:
        raise ScenarioError("needs count and dcn_bw_bytes_per_s", field="cluster.pods")
    return PodsSpec(**p)


# ---- layout -------------------------------------------------------------------------------


def resolve_layout(p: ParallelIn, devices: int) -> ParallelLayout:
    model_par = p.tp * p.cp * p.pp
    dp = p.dp
    if dp is None:
        if devices % model_par:
            raise ScenarioError(
                f"tp*cp*pp = {p.tp}*{p.cp}*{p.pp} = {model_par} does not divide the {devices} devices", field="parallel"
            )
        dp = devices // model_par
    if model_par * dp != devices:
        raise ScenarioError(
            f"tp*cp*pp*dp = {p.tp}*{p.cp}*{p.pp}*{dp} = {model_par * dp} must equal cluster.devices = {devices}",
            field="parallel",
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
            expert_mapping=p.expert_mapping,
            mla_down_proj=p.mla_down_proj,
            pipeline_layers=(p.pipeline_layers if p.pipeline_layers in (None, "auto") else tuple(p.pipeline_layers)),
        )
    except LayoutError as err:
        raise ScenarioError.from_error(err) from None


def resolve_training(t: TrainingIn, layout: ParallelLayout) -> TrainingSpec:
    """The training section as a :class:`TrainingSpec` (``offload`` flattened into its two
    flags), checked to split its batch over the layout's data-parallel replicas."""
    try:
        tr = t.model_dump(exclude={"expert_load", "offload"})
        tr["recompute_modules"] = tuple(tr.get("recompute_modules") or ())
        tr["tp_comm_overlap_sms"] = tuple(sorted((tr.get("tp_comm_overlap_sms") or {}).items()))
        if t.offload is not None:
            tr["offload_optimizer"] = t.offload.optimizer
            tr["offload_activations"] = t.offload.activations
        training = TrainingSpec(**tr)
        training.micro_batches(layout.dp)
    except WorkloadError as err:
        raise ScenarioError.from_error(err, "training") from None
    return training
