"""Where pipeline parallelism pays: a map over scale-up domain size and scale-out bandwidth.

A *map file* (YAML/JSON, format below) names the models, a GPU cluster preset whose
scale-up domain size (``cluster.network.domain_size``) and scale-out bandwidth per GPU
(``cluster.network.nic_bw_bytes_per_s``) are varied over a grid, and today's systems as
points of their own (any cluster mapping, a TPU torus included). At every point:

1. **screen** -- every layout of :func:`simulator.studies.search_layouts.enumerate_layouts` within the
   map's search bounds (pipeline degrees restricted to ``search.pp``) is checked and its
   memory estimated (:func:`simulator.studies.estimate.estimate_memory`, cached per model and chip:
   memory does not depend on the network), and every one that fits gets the analytic
   step-time estimate (:func:`simulator.studies.estimate.proxy_cost`) -- the same rules
   :func:`simulator.studies.search.search` applies;
2. **choose** -- the ``simulate.with_pp`` best-estimated layouts with ``pp > 1`` (distinct
   schedules first, so that an estimate that under-rates DualPipe's overlap still gets
   DualPipe simulated) and the ``simulate.without_pp`` best with ``pp == 1``;
3. **simulate** -- every chosen layout of every point through the sweep executor
   (:func:`simulator.studies.sweep.run_cases`): local processes, any ``concurrent.futures``
   executor or a Dask cluster, one resumable row store ``OUT/sims/rows.jsonl`` for the
   whole map, so an interrupted run resumes where it stopped and a cluster runs the
   points' simulations side by side.

``OUT/screen.jsonl`` keeps each point's screen (one line a point: the chosen layouts,
the estimated best with and without PP, the memory facts), so a resumed run does not
screen again. :func:`assemble` turns screen and rows into the map table (one row per
point: best layout with PP and without, ``ratio = best without PP / best``, the
estimate's ratio, the memory side, the roofline); :func:`plot_map` draws it.

Why not ``search`` itself at each point: its ``max_candidates`` keeps one layout without
PP and fills the rest by the estimate, and screens every layout again at every point
(about 30 s of CPU per DeepSeek-V3 point); the map needs k layouts of each kind and
reuses the memory screen across its 30 grid points of one chip. Both could be options of
``search`` (a per-kind cap; a memory-estimate cache).

Map file::

    name: ppmap
    devices: 2304                      # divisible by every domain size
    models: [deepseek-v3, kimi-k2]     # model presets or mappings
    training: {seq_len: 4096, sequences_per_device: 8, micro_batch_size: 1, dtype: fp8}
    grid:
      cluster: {preset: dgx-h100}      # chip, NVLink bandwidth and latencies of every grid point
      domain_sizes: [8, 16, 32, 72, 144]
      nic_gbps: [12.5, 25, 50, 100, 200, 400]
    marks: {H100 + IB 50: [8, 50]}     # label -> [domain, NIC GB/s]: marked on the grid
    systems:                           # points of their own: label -> cluster (+ training overrides)
      h800-ib50: {cluster: {preset: h800}}
      tpu-v5p: {cluster: {preset: tpu-v5p}, training: {dtype: bf16}}
    search: {max_tp: 8, pp: [1, 2, 4, 8, 16], max_ep: 64, schedules: [1f1b, interleaved-1f1b, dualpipe],
             zero: [1, 3], recompute: [none, selective, full], max_vpp: 2,
             nopp_micro_batch_sizes: [1, 2, 4, 8]}   # pp = 1 also with larger micro-batches
    simulate: {with_pp: 2, without_pp: 1}
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Union

import pandas as pd

from simulator.studies.estimate import estimate_memory, proxy_cost
from simulator.studies.network_model import NetModel
from simulator.scenario.schema import ScenarioError, load_scenario, read_mapping
from simulator.studies.search_layouts import (
    LAYOUT_KEYS,
    PRUNE_TOLERANCE,
    SearchBounds,
    candidate_mapping,
    enumerate_layouts,
    label,
)
from simulator.studies.sweep import run_cases
from simulator.studies.sweep_cases import check_scenario, plain_json, resolve
from simulator.studies.sweep_rows import RowStore
from simulator.studies.sweep_spec import Case
from workloads import memory

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
    pp_degrees: Optional[tuple[int, ...]]
    nopp_micro_batch_sizes: tuple[int, ...]
    with_pp: int
    without_pp: int
    marks: tuple = ()  # (label, domain, nic GB/s): today's systems' places on the grid


def _pos_int(v, field: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ScenarioError(field, f"must be a positive integer, got {v!r}")
    return v


def load_map(spec: Union[str, Path, Mapping]) -> MapSpec:
    """Parse a map file or mapping; :class:`ScenarioError` names the key at fault."""
    data = read_mapping(spec, what="map") if isinstance(spec, (str, Path)) else dict(spec)
    for k in data:
        if k not in MAP_KEYS:
            raise ScenarioError(k, f"unknown map key; allowed: {', '.join(MAP_KEYS)}")
    devices = _pos_int(data.get("devices"), "devices")
    models = data.get("models")
    if not isinstance(models, list) or not models:
        raise ScenarioError("models", "a non-empty list of model presets or mappings")
    training = {**TRAINING_DEFAULTS, **(data.get("training") or {})}
    grid = data.get("grid") or {}
    systems = data.get("systems") or {}
    if not grid and not systems:
        raise ScenarioError("grid", "a map needs a grid and/or systems")
    doms = tuple(_pos_int(d, "grid.domain_sizes") for d in grid.get("domain_sizes", ())) if grid else ()
    for d in doms:
        if devices % d:
            raise ScenarioError("grid.domain_sizes", f"{d} does not divide devices = {devices}")
    nics = tuple(float(x) for x in grid.get("nic_gbps", ())) if grid else ()
    if grid and (not doms or not nics or any(x <= 0 for x in nics)):
        raise ScenarioError("grid", "needs non-empty domain_sizes and positive nic_gbps")
    if not isinstance(systems, Mapping) or any(
        not isinstance(v, Mapping) or "cluster" not in v for v in systems.values()
    ):
        raise ScenarioError("systems", "a mapping of label -> {cluster: ..., training: ...}")
    s = dict(data.get("search") or {})
    pp_degrees = s.pop("pp", None)
    nopp_mbs = tuple(_pos_int(b, "search.nopp_micro_batch_sizes") for b in s.pop("nopp_micro_batch_sizes", ()))
    for k in ("schedules", "zero", "recompute", "micro_batch_sizes"):
        if k in s:
            s[k] = tuple(s[k])
    if pp_degrees is not None:
        pp_degrees = tuple(_pos_int(p, "search.pp") for p in pp_degrees)
        s.setdefault("max_pp", max(pp_degrees))
    try:
        bounds = SearchBounds(**s)
    except TypeError as err:
        raise ScenarioError("search", str(err)) from None
    sim = data.get("simulate") or {}
    marks = data.get("marks") or {}
    if not isinstance(marks, Mapping) or any(not isinstance(v, list) or len(v) != 2 for v in marks.values()):
        raise ScenarioError("marks", "a mapping of label -> [domain size, NIC GB/s]")
    return MapSpec(
        marks=tuple((str(k), int(v[0]), float(v[1])) for k, v in marks.items()),
        name=str(data.get("name") or "ppmap"),
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


# ---- screen ------------------------------------------------------------------------------------


def _layouts(sc0, spec: MapSpec):
    """The search's layouts with pp in ``search.pp``; layouts without PP also with each
    micro-batch size of ``search.nopp_micro_batch_sizes`` (fewer, larger micro-batches:
    ZeRO-3 gathers each layer's weights once per micro-batch)."""
    for p in enumerate_layouts(sc0, spec.bounds):
        if spec.pp_degrees is not None and p["pp"] not in spec.pp_degrees:
            continue
        yield p
        if p["pp"] == 1:
            for mb in spec.nopp_micro_batch_sizes:
                if mb != p["micro_batch_size"]:
                    yield {**p, "micro_batch_size": mb}


def screen(point: Mapping, spec: MapSpec, mem_cache: Optional[dict] = None) -> pd.DataFrame:
    """Every layout of the point that loads and fits by the memory estimate, with its
    estimated step time (columns: label, the layout keys, est_memory_bytes, est_step_time_s,
    hbm_bytes). ``mem_cache`` (a dict) keeps memory estimates across points."""
    base = point["scenario"]
    sc0 = load_scenario(base)
    hbm = sc0.cluster.chip.hbm_bytes
    chip_key = (
        json.dumps(base["model"], sort_keys=True, default=str),
        sc0.cluster.chip.name,
        hbm,
        json.dumps(base["training"], sort_keys=True),
    )
    mem_cache = {} if mem_cache is None else mem_cache
    net = NetModel(sc0.cluster, sc0.network_calibration())
    recs = []
    for p in _layouts(sc0, spec):
        key = (chip_key, label(p))
        mapping = candidate_mapping(base, p, point["id"])
        if key in mem_cache and mem_cache[key] is None:
            continue  # invalid or over the HBM: the same on every network
        try:
            sc = load_scenario(mapping)
            if key not in mem_cache:
                check_scenario(sc)
                est = estimate_memory(sc)["total"]
                mem_cache[key] = est if est <= hbm * (1 + PRUNE_TOLERANCE) else None
            est = mem_cache[key]
        except (ScenarioError, ValueError):
            mem_cache[key] = None
            continue
        if est is None:
            continue
        recs.append(
            {
                "label": label(p),
                **p,
                "est_memory_bytes": est,
                "est_step_time_s": proxy_cost(p, sc.training.micro_batches(sc.layout.dp), sc, net),
                "hbm_bytes": hbm,
            }
        )
    cols = ["label", *LAYOUT_KEYS, "est_memory_bytes", "est_step_time_s", "hbm_bytes"]
    return pd.DataFrame.from_records(recs, columns=cols).sort_values(["est_step_time_s", "label"], kind="stable")


def choose(table: pd.DataFrame, with_pp: int, without_pp: int) -> list[dict]:
    """The layouts to simulate: the ``with_pp`` best-estimated with pp > 1 (one per schedule
    first), the ``without_pp`` best with pp = 1; only layouts whose memory estimate is
    within the HBM (no tolerance: a layout at the edge would be simulated out of memory)."""
    t = table[table["est_memory_bytes"] <= table["hbm_bytes"]]
    picks = []
    pp = t[t["pp"] > 1]
    first = pp.drop_duplicates("schedule")
    rest = pp[~pp.index.isin(first.index)]
    picks += pd.concat([first, rest]).head(with_pp).to_dict("records")
    picks += t[t["pp"] == 1].head(without_pp).to_dict("records")
    return [{k: r[k] for k in ("label", *LAYOUT_KEYS, "est_memory_bytes", "est_step_time_s")} for r in picks]


def memory_facts(table: pd.DataFrame) -> dict:
    """Does a layout without PP fit (by the estimate) at all, without ZeRO-3, without
    recomputation, without either?"""
    nopp = table[(table["pp"] == 1) & (table["est_memory_bytes"] <= table["hbm_bytes"])]
    return {
        "nopp_fits": bool(len(nopp)),
        "nopp_fits_without_zero3": bool(len(nopp[nopp["zero"] < 3])),
        "nopp_fits_without_recompute": bool(len(nopp[nopp["recompute"] == "none"])),
        "nopp_fits_without_either": bool(len(nopp[(nopp["zero"] < 3) & (nopp["recompute"] == "none")])),
    }


def _best_est(table: pd.DataFrame, pp: bool) -> Optional[dict]:
    t = table[(table["pp"] > 1) if pp else (table["pp"] == 1)]
    t = t[t["est_memory_bytes"] <= t["hbm_bytes"]]
    return None if t.empty else {"label": t.iloc[0]["label"], "est_step_time_s": float(t.iloc[0]["est_step_time_s"])}


def run_screens(spec: MapSpec, out: Path, progress: bool = False) -> dict[str, dict]:
    """Screen every point not yet in ``OUT/screen.jsonl``; returns screens by point id."""
    store = RowStore(out)
    store.path = out / SCREEN_FILE
    done = {k: v for k, v in store.load().items()}
    mem_cache: dict = {}
    for pt in points(spec):
        if pt["id"] in done:
            continue
        t0 = time.process_time()
        table = screen(pt, spec, mem_cache)
        rec = {
            "key": pt["id"],
            "chosen": choose(table, spec.with_pp, spec.without_pp),
            "est_best_pp": _best_est(table, True),
            "est_best_nopp": _best_est(table, False),
            "layouts_fit": int(len(table)),
            **memory_facts(table),
            "screen_cpu_s": time.process_time() - t0,
        }
        store.append(rec)
        done[pt["id"]] = json.loads(plain_json(rec))
        if progress:
            print(f"screened {pt['id']}: {len(table)} layouts fit, {rec['screen_cpu_s']:.1f} s CPU", flush=True)
    return done


# ---- the whole run -------------------------------------------------------------------------------


def _priority(spec: MapSpec, pt: Mapping) -> tuple:
    """Simulation order, so that a partial run already draws a coarse map: model by model,
    grid points on every other row and column first, then the rest, then the systems;
    torus systems (slowest to simulate) last of all."""
    torus = pt["system"] != "grid" and "tpu" in json.dumps(pt["scenario"]["cluster"]).lower()
    m = [model_name(x) for x in spec.models].index(pt["model"])
    if pt["system"] == "grid":
        i, k = spec.domain_sizes.index(pt["domain"]), spec.nic_gbps.index(pt["nic_gbps"])
        return (torus, m, 0, (i % 2) + (k % 2), i, k)
    return (torus, m, 1, 0, 0, 0)


def with_fallbacks(chosen: list) -> list:
    """The chosen layouts, and after each one without PP whose micro-batch is above 1 the
    same layout at half that micro-batch: the memory estimate is least accurate there
    (DeepSeek-V3 on 80 GB H100s, FSDP + EP16, 8 sequences a micro-batch: estimated 67.6 GB,
    simulated 87.8 GB, activations 66.8 GB against about 47 GB estimated), and a layout that
    does not fit in the simulation would leave its point without a no-PP answer."""
    out = []
    for p in chosen:
        out.append(p)
        if p["pp"] == 1 and p["micro_batch_size"] > 1:
            half = {
                **p,
                "micro_batch_size": p["micro_batch_size"] // 2,
                "est_step_time_s": None,
                "est_memory_bytes": None,
            }
            half["label"] = label(half)
            out.append(half)
    return out


def cases_of(spec: MapSpec, screens: Mapping[str, dict]) -> list[Case]:
    """One sweep case per chosen layout of every point (axes: point + the layout keys)."""
    cases, seen = [], set()
    for pt in sorted(points(spec), key=lambda p: _priority(spec, p)):
        for p in with_fallbacks(screens[pt["id"]]["chosen"]):
            mapping = candidate_mapping(pt["scenario"], p, pt["id"])
            key, resolved, _, err = resolve(mapping)
            if err is not None or key in seen:
                continue
            seen.add(key)
            cases.append(
                Case(
                    index=len(cases),
                    axes={"point": pt["id"], **{k: p[k] for k in LAYOUT_KEYS}},
                    scenario=mapping,
                    key=key,
                    resolved=resolved,
                )
            )
    return cases


def run_map(
    spec_or_path,
    out: Union[str, Path],
    client=None,
    jobs: Optional[int] = None,
    executor=None,
    progress: Optional[bool] = False,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Screen, simulate and assemble the map into ``out`` (resumable). Returns
    ``(map table, candidates table)``, also written as ``OUT/map.csv`` and ``OUT/candidates.csv``."""
    spec = spec_or_path if isinstance(spec_or_path, MapSpec) else load_map(spec_or_path)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    screens = run_screens(spec, out, progress=bool(progress))
    cases = cases_of(spec, screens)
    run_cases(
        cases,
        ("point", *LAYOUT_KEYS),
        out=out / "sims",
        client=client,
        jobs=jobs,
        executor=executor,
        progress=progress,
        desc=f"ppmap {spec.name}",
    )
    table, cands = assemble(spec, out)
    (out / "run.json").write_text(
        json.dumps(
            {
                "name": spec.name,
                "points": len(screens),
                "simulations": len(cases),
                "wall_s": round(time.perf_counter() - t0, 1),
            },
            indent=2,
        )
        + "\n"
    )
    return table, cands


def _read_rows(path: Path) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    if not path.exists():
        return rows
    for line in path.read_text(encoding="utf-8").split("\n"):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "key" in row:
            rows[row["key"]] = row
    return rows


def assemble(spec_or_path, out: Union[str, Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The map table from what ``out`` holds so far (points with no finished simulation
    have empty figures): also works on a partial run."""
    spec = spec_or_path if isinstance(spec_or_path, MapSpec) else load_map(spec_or_path)
    out = Path(out)
    # read-only (RowStore.load would cut a torn last line, which may be a line a running
    # ``run_map`` is writing): a line that does not parse is left out
    screens, rows = _read_rows(out / SCREEN_FILE), _read_rows(out / "sims" / "rows.jsonl")
    by_point: dict[str, list] = {}
    for r in rows.values():
        ax = r.get("axes") or {}
        by_point.setdefault(ax.get("point"), []).append(r)
    cand_recs, map_recs = [], []
    for pt in points(spec):
        scr = screens.get(pt["id"])
        if scr is None:
            continue
        sims = _candidate_records(pt, scr, by_point.get(pt["id"], []))
        cand_recs += sims
        map_recs.append(_map_record(pt, scr, sims))
    table = pd.DataFrame(map_recs)
    cands = pd.DataFrame(cand_recs, columns=None if cand_recs else list(_CANDIDATE_COLUMNS))
    if out.exists():
        table.to_csv(out / MAP_CSV, index=False)
        cands.to_csv(out / CANDIDATES_CSV, index=False)
        _write_status(spec, out, screens, rows, table, cands)
    return table, cands


_CANDIDATE_COLUMNS = (
    "point",
    "model",
    "system",
    "domain",
    "nic_gbps",
    "label",
    *LAYOUT_KEYS,
    "status",
    "error",
    "est_step_time_s",
    "est_memory_bytes",
    *SIM_KEYS,
)


def _point_fields(pt: Mapping) -> dict:
    """The columns that name a map point."""
    return {
        "point": pt["id"],
        "model": pt["model"],
        "system": pt["system"],
        "domain": pt["domain"],
        "nic_gbps": pt["nic_gbps"],
    }


def _candidate_records(pt: Mapping, scr: Mapping, rows: list) -> list[dict]:
    """One record per simulated candidate of point ``pt``: its layout, status, estimates (from
    the screen ``scr``) and simulated figures."""
    est_of = {c["label"]: c for c in scr["chosen"]}
    sims = []
    for r in rows:
        ax, s = r["axes"], r.get("summary") or {}
        lab = label(ax)
        rec = {
            **_point_fields(pt),
            "label": lab,
            **{k: ax[k] for k in LAYOUT_KEYS},
            "status": ("oom" if s.get("oom") else "ok") if r["status"] == "ok" else "failed",
            "error": r.get("error"),
            "est_step_time_s": est_of.get(lab, {}).get("est_step_time_s"),
            "est_memory_bytes": est_of.get(lab, {}).get("est_memory_bytes"),
        }
        for k in SIM_KEYS:
            rec[k] = s.get(k)
        for k, v in (s.get("exposed_comm_by_axis_s") or {}).items():
            rec[f"exposed_{k}_s"] = v
        sims.append(rec)
    return sims


def _fastest(cands, default=None):
    """The candidate of shortest simulated step time (``default`` when there is none)."""
    return min(cands, key=lambda c: c["step_time_s"], default=default)


def _map_record(pt: Mapping, scr: Mapping, sims: list) -> dict:
    """Point ``pt``'s row of the map: its best layouts with and without PP, the ratio, what the
    screen found and the memory and roofline columns."""
    ok = [c for c in sims if c["status"] == "ok"]
    bp = _fastest(c for c in ok if c["pp"] > 1)
    bn = _fastest(c for c in ok if c["pp"] == 1)
    best = _fastest(c for c in (bp, bn) if c is not None)
    rec = {
        **_point_fields(pt),
        "simulated": len(sims),
        "chosen": len(scr["chosen"]),
        "layouts_fit": scr["layouts_fit"],
    }
    for tag, b in (("best", best), ("best_pp", bp), ("best_nopp", bn)):
        for k in ("label", "step_time_s", "mfu", "peak_memory_bytes"):
            rec[f"{tag}_{k}"] = None if b is None else b[k]
    # ratio: how much slower the best layout without PP is; inf when none fits (PP needed)
    rec["ratio"] = (
        bn["step_time_s"] / best["step_time_s"]
        if bn is not None and best is not None
        else (math.inf if bp is not None and not scr["nopp_fits"] else None)
    )
    # the same with the layouts that ran out of memory allowed: what more HBM would buy
    ran = [c for c in sims if c["status"] in ("ok", "oom")]
    bn_any = _fastest(c for c in ran if c["pp"] == 1)
    best_any = _fastest(ran)
    rec["nopp_oom_label"] = bn_any["label"] if bn_any is not None and bn_any["status"] == "oom" else None
    rec["nopp_oom_peak_memory_bytes"] = bn_any["peak_memory_bytes"] if rec["nopp_oom_label"] else None
    rec["ratio_any_memory"] = (
        bn_any["step_time_s"] / best_any["step_time_s"] if bn_any is not None and best_any is not None else None
    )
    ep_, en = scr.get("est_best_pp"), scr.get("est_best_nopp")
    est_best = min((e["est_step_time_s"] for e in (ep_, en) if e), default=None)
    rec["est_ratio"] = en["est_step_time_s"] / est_best if en and est_best else (math.inf if ep_ and not en else None)
    for k in ("nopp_fits", "nopp_fits_without_zero3", "nopp_fits_without_recompute", "nopp_fits_without_either"):
        rec[k] = scr[k]
    rec.update(aux_global_memory(pt, bp))
    rec.update(roofline(pt, bp, bn))
    return rec


def _write_status(spec: MapSpec, out: Path, screens: Mapping, rows: Mapping, table, cands) -> None:
    """Write ``status.json``: how far the run has got."""
    versions = sorted({str(r.get("stepsim_version")) for r in rows.values()})
    status = {
        "name": spec.name,
        "points_total": len(points(spec)),
        "points_screened": len(screens),
        "simulations_chosen": sum(len(with_fallbacks(v["chosen"])) for v in screens.values()),
        "simulations_done": len(cands),
        "points_with_ratio": int(table["ratio"].notna().sum()) if len(table) else 0,
        "screen_cpu_s_total": round(sum(v.get("screen_cpu_s", 0.0) for v in screens.values()), 1),
        "simulation_wall_s_total": round(float(cands["sim_wall_s"].fillna(0).sum()) if len(cands) else 0.0, 1),
        "stepsim_versions": versions,
    }
    (out / STATUS_JSON).write_text(json.dumps(status, indent=2) + "\n")


# ---- the memory side: a batch-global auxiliary loss ------------------------------------------


def aux_global_memory(point: Mapping, best_pp: Optional[Mapping]) -> dict:
    """For the best PP layout: its estimated peak memory under a batch-global auxiliary
    loss (``balance: aux-loss-global``: every forward before any backward, so every
    micro-batch's activations are stashed at once) against auxiliary-loss-free balancing
    (the map's own runs). Closed form (:func:`simulator.studies.estimate.estimate_memory`): the
    simulator refuses ``aux-loss-global`` with DualPipe."""
    if best_pp is None:
        return {"aux_free_peak_bytes": None, "aux_global_peak_bytes": None, "aux_global_fits": None}
    mapping = candidate_mapping(point["scenario"], best_pp, point["id"])
    free = estimate_memory(load_scenario(mapping))["total"]
    glob = load_scenario({**mapping, "training": {**mapping["training"], "balance": "aux-loss-global"}})
    g = estimate_memory(glob)["total"]
    return {
        "aux_free_peak_bytes": free,
        "aux_global_peak_bytes": g,
        "aux_global_fits": bool(g <= glob.cluster.chip.hbm_bytes),
    }


# ---- the roofline ------------------------------------------------------------------------------


def dp_traffic_s(sc, net: Optional[NetModel] = None) -> float:
    """Seconds one step's data-parallel traffic takes alone on the network, no overlap
    ("How to Scale Your Model"'s DP term): each gradient reduction (fp32; all-reduce under
    ZeRO-0, reduce-scatter otherwise; once a step, every micro-batch under ZeRO-2/3) and
    parameter all-gather (bf16; once under ZeRO-1/2, forward and backward of every
    micro-batch under ZeRO-3) of the parameters rank 0 holds, over its dense (``dp_cp``)
    and expert (``edp``) groups, costed by the estimate's :class:`NetModel`."""
    L, t, model = sc.layout, sc.training, sc.model
    net = net if net is not None else NetModel(sc.cluster, sc.network_calibration())
    dense, expert = memory.rank_parameter_counts(model, L, range(model.layers), True, True)
    dense, expert = dense / L.pp, expert / L.pp  # one stage's share
    m = t.micro_batches(L.dp)
    groups = ((L.group(0, "dp_cp"), dense), (L.group(0, "edp"), expert))
    grad_op = "all-reduce" if L.zero == 0 else "reduce-scatter"
    n_red = m if L.zero >= 2 else 1
    n_gather = 2 * m if L.zero == 3 else (1 if L.zero >= 1 else 0)
    total = 0.0
    for g, n in groups:
        total += n_red * net.time_s(grad_op, g, n * t.grad_bytes)
        total += n_gather * net.time_s("all-gather", g, n * 2)
    return total


def roofline(point: Mapping, best_pp: Optional[Mapping], best_nopp: Optional[Mapping]) -> dict:
    """The roofline view of the two best layouts: per layout, compute per step (the
    estimate's roofline compute of the slowest rank plus its closed-form bubble) against
    the DP traffic alone (:func:`dp_traffic_s`); the roofline step is their maximum, and
    ``roof_ratio`` the no-PP layout's roofline step over the better of the two."""
    from simulator.studies.estimate import estimate_step_time

    rec = {}
    steps = {}
    for tag, b in (("pp", best_pp), ("nopp", best_nopp)):
        if b is None:
            rec.update({f"roof_{tag}_compute_s": None, f"roof_{tag}_dp_s": None, f"roof_{tag}_ep_s": None})
            continue
        sc = load_scenario(candidate_mapping(point["scenario"], b, point["id"]))
        est = estimate_step_time(sc)
        comp = est["compute_s"] + est["bubble_s"]
        dp = dp_traffic_s(sc)
        rec.update({f"roof_{tag}_compute_s": comp, f"roof_{tag}_dp_s": dp, f"roof_{tag}_ep_s": est["ep_s"]})
        steps[tag] = max(comp, dp)
    rec["roof_ratio"] = (steps["nopp"] / min(steps.values())) if "nopp" in steps else None
    return rec


# ---- the figure ------------------------------------------------------------------------------------


_PLOT_VMAX = 2.0  # ratios from here up (and "PP needed") share the darkest colour


def plot_map(
    table: pd.DataFrame, path: Union[str, Path], markers: Optional[Mapping[str, tuple]] = None, title: str = ""
):
    """Heat map per model of ``ratio`` (best without PP / best) over domain size (rows) and
    NIC bandwidth per GPU (columns), the 1.10 contour, today's systems as annotated cells
    in a strip below (``markers``: system label -> (domain, nic GB/s) also marks it on the
    grid). Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import LinearSegmentedColormap

    markers = dict(markers or {})
    models = list(dict.fromkeys(table["model"]))
    grid = table[table["system"] == "grid"]
    doms = sorted(grid["domain"].dropna().unique().astype(int)) if len(grid) else []
    nics = sorted(grid["nic_gbps"].dropna().unique()) if len(grid) else []
    systems = list(dict.fromkeys(table.loc[table["system"] != "grid", "system"]))
    cmap = LinearSegmentedColormap.from_list(
        "pp", ["#f7f7f7", "#fdd49e", "#fc8d59", "#d7301f", "#7f0000"]
    ).with_extremes(bad="#dddddd")
    rows = 2 if systems else 1
    fig, axes = plt.subplots(
        rows,
        len(models),
        figsize=(6.2 * len(models), 4.6 + 2.0 * (rows - 1)),
        gridspec_kw={"height_ratios": [max(len(doms), 1), 1.3][:rows]},
        squeeze=False,
    )
    for j, model in enumerate(models):
        ax = axes[0, j]
        im = _draw_grid(ax, grid[grid["model"] == model], doms, nics, cmap)
        _draw_markers(ax, markers, doms, nics)
        ax.set_xticks(range(len(nics)), [f"{w:g}" for w in nics])
        ax.set_yticks(range(len(doms)), [str(d) for d in doms])
        ax.set_xlabel("scale-out bandwidth per GPU (GB/s)")
        ax.set_ylabel("GPUs per scale-up domain")
        ax.set_title(f"{model}: best without PP / best (contour {RATIO_CONTOUR:.2f})", fontsize=10)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
        if systems:
            _draw_systems(axes[1, j], table, model, systems, cmap)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return fig


def _shown(r):
    """A ratio as drawn: "PP needed" (inf) at the top of the colour scale."""
    import numpy as np

    return _PLOT_VMAX if r is not None and np.isinf(r) else r


def _draw_grid(ax, g: pd.DataFrame, doms: list, nics: list, cmap):
    """One model's heat map of the ratio on ``ax``: a cell per (domain, NIC bandwidth), its value
    written in it (the estimate's, hatched and marked "est", where not simulated yet), the
    :data:`RATIO_CONTOUR` contour. Returns the image."""
    import matplotlib.pyplot as plt
    import numpy as np

    vmax = _PLOT_VMAX
    z = np.full((len(doms), len(nics)), np.nan)
    for _, r in g.iterrows():
        # a point screened but not simulated yet shows the estimate's ratio, marked "est"
        v = r["ratio"] if not pd.isna(r["ratio"]) else r.get("est_ratio")
        if v is not None and not pd.isna(v):
            z[doms.index(int(r["domain"])), nics.index(r["nic_gbps"])] = min(_shown(v), vmax)
    im = ax.imshow(z, cmap=cmap, vmin=1.0, vmax=vmax, origin="lower", aspect="auto")
    for _, r in g.iterrows():
        i, k = doms.index(int(r["domain"])), nics.index(r["nic_gbps"])
        sim = not pd.isna(r["ratio"])
        v = r["ratio"] if sim else r.get("est_ratio")
        txt = "—" if v is None or pd.isna(v) else ("PP\nneeded" if np.isinf(v) else f"{v:.2f}")
        if not sim and txt != "—":
            txt = f"est\n{txt}"
            ax.add_patch(plt.Rectangle((k - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", ec="0.6", lw=0))
        dark = v is not None and not pd.isna(v) and min(_shown(v), vmax) > 1.6
        ax.text(
            k,
            i,
            txt,
            ha="center",
            va="center",
            fontsize=8,
            style="normal" if sim else "italic",
            color="white" if dark else "black",
            weight="bold" if sim else "normal",
        )
    if np.isfinite(z).sum() >= 4 and len(doms) > 1 and len(nics) > 1:
        ax.contour(
            np.arange(len(nics)),
            np.arange(len(doms)),
            np.ma.masked_invalid(z),
            levels=[RATIO_CONTOUR],
            colors="k",
            linewidths=1.6,
        )
    return im


def _draw_markers(ax, markers: Mapping, doms: list, nics: list) -> None:
    """Mark today's systems (``markers``: label -> (domain, nic GB/s)) on their grid cells."""
    at: dict = {}
    for lab, (d, w) in markers.items():
        if d in doms and w in nics:
            at.setdefault((doms.index(d), nics.index(float(w))), []).append(lab)
    for (i, k), labs in at.items():
        ax.plot(k - 0.36, i + 0.3, "o", ms=7, mfc="#1f4e9c", mec="white", mew=1.2)
        ax.text(
            k - 0.28,
            i + 0.3,
            " / ".join(labs),
            color="#1f4e9c",
            fontsize=6.5,
            va="center",
            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85},
        )


def _draw_systems(sx, table: pd.DataFrame, model: str, systems: list, cmap) -> None:
    """The strip of today's systems below a model's grid: each one's ratio and best layout."""
    import numpy as np

    vmax = _PLOT_VMAX
    s = table[(table["model"] == model) & (table["system"] != "grid")].set_index("system")
    vals, texts = [], []
    for x in systems:
        r = s.loc[x] if x in s.index else None
        sim = r is not None and not pd.isna(r["ratio"])
        v = None if r is None else (r["ratio"] if sim else r.get("est_ratio"))
        ok = v is not None and not pd.isna(v)
        vals.append(min(_shown(v), vmax) if ok else np.nan)
        txt = x + "\n" + ("—" if not ok else ("est " if not sim else "") + ("PP needed" if np.isinf(v) else f"{v:.2f}"))
        if sim and isinstance(r["best_label"], str):
            parts = r["best_label"].split("-")
            txt += "\n" + " ".join(
                x for x in parts if x[:2] in ("pp", "ep") or x in ("1f1b", "dualpipe", "interleaved")
            )
        texts.append((txt, sim))
    sx.imshow(np.array([vals]), cmap=cmap, vmin=1.0, vmax=vmax, aspect="auto")
    for k, (txt, sim) in enumerate(texts):
        sx.text(k, 0, txt, ha="center", va="center", fontsize=7, style="normal" if sim else "italic")
    sx.set_xticks([])
    sx.set_yticks([])
    sx.set_title("today's systems, each searched on its own", fontsize=9)


# ---- command line ----------------------------------------------------------------------------------
