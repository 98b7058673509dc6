"""A resolved scenario back as a plain mapping: :func:`scenario_to_dict` (presets expanded).

What sweeps hash and store and what ``scenario.json`` of a run directory holds; keys
whose value is the default that predates them are left out so that older sweep keys stay
stable.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from workloads.model import ModelSpec
from workloads.training import TrainingSpec

if TYPE_CHECKING:
    from simulator.scenario.resolved import Scenario


def model_dict(m: ModelSpec) -> dict:
    d = dataclasses.asdict(m)
    if d.get("attention"):
        d["attention"] = {"kind": "mla", **d["attention"]}
    if d.get("moe") and d["moe"]["score_function"] == "softmax":  # as before the key existed: keys stay stable
        del d["moe"]["score_function"]
    return d


def _training_dict(t: TrainingSpec) -> dict:
    d = dataclasses.asdict(t)
    off = {"optimizer": d.pop("offload_optimizer"), "activations": d.pop("offload_activations")}
    if off["optimizer"] or off["activations"]:
        d["offload"] = off
    if d["activation_saving"] == "none":  # as before the key existed: sweep keys stay stable
        del d["activation_saving"]
    for key, default in (
        ("moe_gate_weighting", "activation"),
        ("moe_router_dtype", "bf16"),
        ("moe_dispatch_dtype", "auto"),
        ("moe_token_dispatcher", "auto"),
        ("grad_dtype", "fp32"),
        ("optimizer_state_dtype", "fp32"),
        ("master_weights", "fp32"),
        ("grad_reduce_granularity", "unit"),
        ("distribute_saved_activations", False),
        ("fsdp_prefetch_units", 1),
        ("fsdp_grad_units", 2),
        ("reshard_after_forward", True),
        ("allocator_reserve_fraction", None),
        ("fp8_weight_cache", False),
        ("fp8_params", False),
        ("fp8_recipe", "delayed"),
        ("moe_expert_gemm", "grouped"),
        ("moe_router_fusion", True),
        ("moe_permute_fusion", True),
        ("overlap_param_gather", True),
    ):
        if d[key] == default:  # likewise
            del d[key]
    if not d["dropout"]:
        del d["dropout"]
    if d["tp_comm_overlap_sms"]:  # absent when TE's defaults: sweep keys stay stable
        d["tp_comm_overlap_sms"] = dict(d["tp_comm_overlap_sms"])
    else:
        del d["tp_comm_overlap_sms"]
    if d["recompute_modules"]:
        d["recompute_modules"] = list(d["recompute_modules"])
    else:
        del d["recompute_modules"]
    return d


def scenario_to_dict(s: Scenario) -> dict:
    """A resolved scenario as a plain mapping (presets expanded) — what sweeps hash and store."""
    model = model_dict(s.model)
    c = s.cluster
    net = dataclasses.asdict(c.network)
    net = {"kind": c.network.kind, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in net.items()}}
    if net.get("tile", 0) is None:  # as before the key existed: sweep and map keys stay stable
        del net["tile"]
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
        "storage_bw_bytes_per_s": c.storage_bw_bytes_per_s,
    }
    if c.pods is not None:
        cluster["pods"] = dataclasses.asdict(c.pods)
    if c.devices_per_domain is not None:
        cluster["devices_per_domain"] = c.devices_per_domain
    if c.domain_capacity is not None and c.domain_capacity != c.network.domain_size:
        cluster["domain_capacity"] = c.domain_capacity  # devices a domain holds (network.domain_size: used)
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
        "expert_mapping": L.expert_mapping,
        "mla_down_proj": L.mla_down_proj,
        "pipeline_layers": (L.pipeline_layers if L.pipeline_layers in (None, "auto") else list(L.pipeline_layers)),
    }
    if parallel["mla_down_proj"] == "duplicated":  # as before the key existed: sweep keys stay stable
        del parallel["mla_down_proj"]
    out = {
        "name": s.name,
        "model": model,
        "cluster": cluster,
        "parallel": parallel,
        "schedule": s.schedule,
        "training": _training_dict(s.training),
    }
    # the host's launch cost as this chip resolves it (unset: 10 us on GPUs, the value every
    # earlier version wrote, so sweep keys stay stable; 0 on TPUs)
    out["training"]["host_launch_s"] = s.training.launch_s(s.cluster.chip.family)
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
