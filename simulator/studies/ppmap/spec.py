"""A pipeline-parallelism map's file (:func:`load_map`, :class:`MapSpec`; the format is described in
:mod:`simulator.studies.ppmap`) and its points (:func:`points`): the grid of scale-up domain
sizes and scale-out bandwidths of every model, and today's systems.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from simulator.scenario.loading import read_mapping
from simulator.scenario.schema import MAX_NAME_CHARS, ScenarioError
from simulator.studies.search.layouts import (
    SearchBounds,
)

MAP_KEYS = ("name", "devices", "models", "training", "grid", "systems", "search", "simulate", "marks")
SCREEN_FILE, MAP_CSV, CANDIDATES_CSV, STATUS_JSON = "screen.jsonl", "map.csv", "candidates.csv", "status.json"
#: Summary figures each simulated candidate keeps (candidates.csv columns).
SIM_KEYS = (
    "step_time_s",
    "mfu",
    "peak_memory_bytes",
    "hbm_bytes",
    "bubble_fraction",
    "exposed_comm_fraction",
    "sim_wall_s",
    "micro_batches",
    "tokens_per_s_per_domain",
)
RATIO_CONTOUR = 1.10  # "PP pays": the best layout without PP is at least 10 % slower
TRAINING_DEFAULTS = {
    "seq_len": 4096,
    "sequences_per_device": 8,
    "micro_batch_size": 1,
    "dtype": "fp8",
    "balance": "aux-free",
}


@dataclass(frozen=True)
class MapSpec:
    name: str
    devices: int
    models: tuple
    training: dict
    grid_cluster: dict
    domain_sizes: tuple[int, ...]
    nic_gbps: tuple[float, ...]
    systems: dict
    bounds: SearchBounds
    pp_degrees: tuple[int, ...] | None
    nopp_micro_batch_sizes: tuple[int, ...]
    with_pp: int
    without_pp: int
    marks: tuple = ()  # (label, domain, nic GB/s): today's systems' places on the grid
    # simulate as ``stepsim search`` does (adaptive rounds until no layout left can win); with
    # ``simulate: {with_pp: k, without_pp: n}`` the k + n best-estimated layouts only
    adaptive: bool = True


GRID_KEYS = ("cluster", "domain_sizes", "nic_gbps")
SYSTEM_KEYS = ("cluster", "training")
SEARCH_LISTS = ("pp", "nopp_micro_batch_sizes", "schedules", "zero", "recompute", "micro_batch_sizes")
#: Points a map may hold (models x (grid cells + systems)): each screens thousands of layouts and
#: simulates tens (docs/results/ppmap/ppmap.yaml: 68 points, 1,593 simulations, days of CPU).
MAX_MAP_POINTS = 1_000
#: A grid point's NIC bandwidth, GB/s per GPU: the scenario's bandwidth range (1e6 to 1e18 bytes/s).
MIN_NIC_GBPS, MAX_NIC_GBPS = 1e-3, 1e9


def _pos_int(v, field: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ScenarioError(f"must be a positive integer, got {v!r}", field=field)
    return v


def _mapping(v, field: str, keys: tuple[str, ...] | None = None) -> dict:
    """``v`` (``None``: empty) as a dict; refused naming ``field`` unless a mapping of ``keys``."""
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ScenarioError(f"must be a mapping, got {type(v).__name__} {v!r:.60}", field=field)
    for k in v:
        if keys is not None and k not in keys:
            raise ScenarioError(f"unknown key; allowed: {', '.join(keys)}", field=f"{field}.{k}")
    return dict(v)


def _list(v, field: str) -> list:
    if not isinstance(v, list):
        raise ScenarioError(f"must be a list, got {type(v).__name__} {v!r:.60}", field=field)
    return v


def _nic_gbps(v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not MIN_NIC_GBPS <= v <= MAX_NIC_GBPS:
        raise ScenarioError(
            f"must be numbers from {MIN_NIC_GBPS:g} to {MAX_NIC_GBPS:g} (GB/s per GPU), got {v!r}",
            field="grid.nic_gbps",
        )
    return float(v)


def _search_bounds(search) -> tuple:
    """The map file's ``search:`` as ``(SearchBounds, pp degrees or None, micro-batch sizes
    without PP)``; :class:`ScenarioError` names the key at fault."""
    s = _mapping(search, "search")
    for k in SEARCH_LISTS:
        if k in s:
            _list(s[k], f"search.{k}")
    pp_degrees = s.pop("pp", None)
    nopp_mbs = tuple(_pos_int(b, "search.nopp_micro_batch_sizes") for b in s.pop("nopp_micro_batch_sizes", ()))
    for k in ("schedules", "zero", "recompute", "micro_batch_sizes"):
        if k in s:
            s[k] = tuple(s[k])
    if pp_degrees is not None:
        pp_degrees = tuple(_pos_int(p, "search.pp") for p in pp_degrees)
        if not pp_degrees:
            raise ScenarioError("a non-empty list of pipeline degrees", field="search.pp")
        s.setdefault("max_pp", max(pp_degrees))
    bound_keys = [f.name for f in dataclasses.fields(SearchBounds)]
    for k in s:
        if k not in bound_keys:
            allowed = ", ".join(sorted({*bound_keys, "pp", "nopp_micro_batch_sizes"}))
            raise ScenarioError(f"unknown key; allowed: {allowed}", field=f"search.{k}")
    return SearchBounds(**s), pp_degrees, nopp_mbs


def _marks(marks) -> tuple:
    """The map file's ``marks:`` as ``((label, domain size, NIC GB/s), ...)``."""
    marks = marks or {}
    if not isinstance(marks, Mapping) or any(
        not isinstance(v, list)
        or len(v) != 2
        or any(isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 < x < math.inf for x in v)
        for v in marks.values()
    ):
        raise ScenarioError("a mapping of label -> [domain size, NIC GB/s]", field="marks")
    return tuple((str(k), int(v[0]), float(v[1])) for k, v in marks.items())


def load_map(spec: str | Path | Mapping) -> MapSpec:
    """Parse a map file or mapping; :class:`ScenarioError` names the key at fault."""
    data = read_mapping(spec, what="map") if isinstance(spec, (str, Path)) else dict(spec)
    for k in data:
        if k not in MAP_KEYS:
            raise ScenarioError(f"unknown map key; allowed: {', '.join(MAP_KEYS)}", field=k)
    name = data.get("name") or "ppmap"
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS:
        raise ScenarioError(f"must be a label of at most {MAX_NAME_CHARS} characters, got {name!r:.60}", field="name")
    devices = _pos_int(data.get("devices"), "devices")
    models = data.get("models")
    if not isinstance(models, list) or not models or any(not isinstance(m, (str, Mapping)) for m in models):
        raise ScenarioError("a non-empty list of model presets or mappings", field="models")
    training = {**TRAINING_DEFAULTS, **_mapping(data.get("training"), "training")}
    _pos_int(training["sequences_per_device"], "training.sequences_per_device")
    grid = _mapping(data.get("grid"), "grid", GRID_KEYS)
    systems = _mapping(data.get("systems"), "systems")
    if not grid and not systems:
        raise ScenarioError("a map needs a grid and/or systems", field="grid")
    doms = tuple(_pos_int(d, "grid.domain_sizes") for d in _list(grid.get("domain_sizes", []), "grid.domain_sizes"))
    for d in doms:
        if devices % d:
            raise ScenarioError(f"{d} does not divide devices = {devices}", field="grid.domain_sizes")
    nics = tuple(_nic_gbps(x) for x in _list(grid.get("nic_gbps", []), "grid.nic_gbps"))
    if grid and (not doms or not nics):
        raise ScenarioError("needs non-empty domain_sizes and positive nic_gbps", field="grid")
    _mapping(grid.get("cluster"), "grid.cluster")
    for label, system in systems.items():
        system = _mapping(system, f"systems.{label}", SYSTEM_KEYS)
        if "cluster" not in system:
            raise ScenarioError("a mapping of label -> {cluster: ..., training: ...}", field="systems")
        _mapping(system["cluster"], f"systems.{label}.cluster")
        _mapping(system.get("training"), f"systems.{label}.training")
    n_points = len(models) * (len(doms) * len(nics) + len(systems))
    if n_points > MAX_MAP_POINTS:
        raise ScenarioError(
            f"the map would have {n_points:,} points ({len(models)} models x ({len(doms)} domain sizes x "
            f"{len(nics)} NIC bandwidths + {len(systems)} systems)); the limit is {MAX_MAP_POINTS:,}: split it",
            field="grid",
        )
    bounds, pp_degrees, nopp_mbs = _search_bounds(data.get("search"))
    sim = data.get("simulate") or {}
    if not isinstance(sim, Mapping) or set(sim) - {"with_pp", "without_pp", "adaptive"}:
        raise ScenarioError("a mapping of adaptive (true/false), with_pp, without_pp", field="simulate")
    adaptive = sim.get("adaptive", "with_pp" not in sim and "without_pp" not in sim)
    if not isinstance(adaptive, bool):
        raise ScenarioError(f"must be true or false, got {adaptive!r}", field="simulate.adaptive")
    marks = _marks(data.get("marks"))
    return MapSpec(
        marks=marks,
        name=name,
        devices=devices,
        models=tuple(models),
        training=training,
        grid_cluster=dict(grid.get("cluster") or {"preset": "dgx-h100"}),
        domain_sizes=doms,
        nic_gbps=nics,
        systems={str(k): dict(v) for k, v in systems.items()},
        bounds=bounds,
        pp_degrees=pp_degrees,
        nopp_micro_batch_sizes=nopp_mbs,
        with_pp=_pos_int(sim.get("with_pp", 2), "simulate.with_pp"),
        without_pp=_pos_int(sim.get("without_pp", 1), "simulate.without_pp"),
        adaptive=adaptive,
    )


# ---- the points ------------------------------------------------------------------------------


def model_name(model) -> str:
    return model if isinstance(model, str) else str(model.get("preset") or model.get("name"))


def base_scenario(model, cluster: Mapping, devices: int, training: Mapping, name: str) -> dict:
    """The scenario of one point, before the layout is chosen."""
    t = dict(training)
    seqs = t.pop("sequences_per_device")
    t["global_batch_size"] = seqs * devices
    return {
        "name": name,
        "model": copy.deepcopy(model),
        "cluster": {**copy.deepcopy(dict(cluster)), "devices": devices},
        "parallel": {"tp": 1, "pp": 1, "ep": 1, "zero": 1},
        "schedule": "1f1b",
        "training": t,
    }


def points(spec: MapSpec) -> list[dict]:
    """Every point: ``{"id", "model", "system", "domain", "nic_gbps", "scenario"}``; grid
    points have ``system = "grid"``, systems their label (``domain`` / ``nic_gbps`` None)."""
    out = []
    for model in spec.models:
        m = model_name(model)
        for d in spec.domain_sizes:
            for w in spec.nic_gbps:
                net = {**(spec.grid_cluster.get("network") or {}), "domain_size": d, "nic_bw_bytes_per_s": w * 1e9}
                pid = f"{m}/d{d}-w{w:g}"
                out.append(
                    {
                        "id": pid,
                        "model": m,
                        "system": "grid",
                        "domain": d,
                        "nic_gbps": w,
                        "scenario": base_scenario(
                            model, {**spec.grid_cluster, "network": net}, spec.devices, spec.training, pid
                        ),
                    }
                )
        for lab, sysd in spec.systems.items():
            pid = f"{m}/{lab}"
            out.append(
                {
                    "id": pid,
                    "model": m,
                    "system": lab,
                    "domain": None,
                    "nic_gbps": None,
                    "scenario": base_scenario(
                        model, sysd["cluster"], spec.devices, {**spec.training, **(sysd.get("training") or {})}, pid
                    ),
                }
            )
    return out
