"""The screen of a map point: every layout checked, memory-estimated and ranked by the analytic
step-time estimate (:func:`screen`), the layouts chosen to simulate (:func:`choose`), the memory
facts of the point (:func:`memory_facts`) and every point's screen, kept in ``screen.jsonl``
(:func:`run_screens`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from simulator.scenario.loading import load_scenario
from simulator.scenario.schema import ScenarioError
from simulator.studies.ppmap.spec import SCREEN_FILE, MapSpec, points
from simulator.studies.search.estimate import estimate_memory, proxy_cost
from simulator.studies.search.layouts import (
    LAYOUT_KEYS,
    PRUNE_TOLERANCE,
    candidate_mapping,
    enumerate_layouts,
    label,
)
from simulator.studies.search.network_model import net_model_for
from simulator.studies.sweep.cases import check_scenario, plain_json
from simulator.studies.sweep.rows import RowStore


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


def screen(point: Mapping, spec: MapSpec, mem_cache: dict | None = None) -> pd.DataFrame:
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
    nets: dict = {}  # devices per domain -> the NetModel of that placement (net_model_for)
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
                "est_step_time_s": proxy_cost(p, sc.training.micro_batches(sc.layout.dp), sc, net_model_for(nets, sc)),
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
    return [_layout_record(r) for r in picks]


# An adaptive map keeps, of each point's screen, the layouts whose estimate is within this
# share of the best estimate of their kind (with PP, without): the adaptive rounds stop far
# below it (the allowance is the largest error seen in a family plus 5 %; the DeepSeek-V3
# searches saw errors of -4 .. +6 %), and the store stays small.
ADAPTIVE_SCREEN_SHARE = 1.0


def candidates(table: pd.DataFrame) -> list[dict]:
    """The layouts an adaptive map point may simulate, best estimates first: every layout that
    fits by the memory estimate and is within :data:`ADAPTIVE_SCREEN_SHARE` of the best
    estimate with PP (for pp > 1) or without (for pp = 1)."""
    t = table[table["est_memory_bytes"] <= table["hbm_bytes"]]
    keep = []
    for part in (t[t["pp"] > 1], t[t["pp"] == 1]):
        if len(part):
            top = float(part["est_step_time_s"].min())
            keep.append(part[part["est_step_time_s"] <= top * (1 + ADAPTIVE_SCREEN_SHARE)])
    if not keep:
        return []
    t = pd.concat(keep).sort_values(["est_step_time_s", "label"], kind="stable")
    return [_layout_record(r) for r in t.to_dict("records")]


def _layout_record(r: dict) -> dict:
    """A screen row as the layout it chose: a placement the table held as NaN (a float column
    with no value: the layout's own devices per domain) is None again."""
    out = {k: r[k] for k in ("label", *LAYOUT_KEYS, "est_memory_bytes", "est_step_time_s")}
    dpd = out.get("devices_per_domain")
    out["devices_per_domain"] = None if dpd is None or dpd != dpd else int(dpd)
    return out


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


def _best_est(table: pd.DataFrame, pp: bool) -> dict | None:
    t = table[(table["pp"] > 1) if pp else (table["pp"] == 1)]
    t = t[t["est_memory_bytes"] <= t["hbm_bytes"]]
    return None if t.empty else {"label": t.iloc[0]["label"], "est_step_time_s": float(t.iloc[0]["est_step_time_s"])}


def _screen_record(pt: Mapping, spec: MapSpec, mem_cache: dict) -> dict:
    """One point's line of ``screen.jsonl``."""
    t0 = time.process_time()
    table = screen(pt, spec, mem_cache)
    return {
        "key": pt["id"],
        "mode": "adaptive" if spec.adaptive else "fixed",
        "chosen": candidates(table) if spec.adaptive else choose(table, spec.with_pp, spec.without_pp),
        "est_best_pp": _best_est(table, True),
        "est_best_nopp": _best_est(table, False),
        "layouts_fit": int(len(table)),
        **memory_facts(table),
        "screen_cpu_s": time.process_time() - t0,
    }


def _screen_group(pts: list, spec: MapSpec, mem_cache: dict | None = None) -> list[dict]:
    """The records of points that share a chip and model, with one memory cache
    (``mem_cache``, or a new one)."""
    mem_cache = {} if mem_cache is None else mem_cache
    return [json.loads(plain_json(_screen_record(pt, spec, mem_cache))) for pt in pts]


def run_screens(spec: MapSpec, out: Path, progress: bool = False, jobs: int | None = 1, select=None) -> dict[str, dict]:
    """Screen every point not yet in ``OUT/screen.jsonl`` (of those ``select``, a predicate on
    point ids, accepts); returns screens by point id. With
    ``jobs`` > 1 (``None``: every core) the points are screened in that many processes, one
    group of points at a time per process: a model's grid points of one domain size (one chip,
    one memory cache) or one system point; every record is the same either way."""
    store = RowStore(out)
    store.path = out / SCREEN_FILE
    mode = "adaptive" if spec.adaptive else "fixed"
    # a point screened for the other mode is screened again (its "chosen" list means another thing)
    done = {k: v for k, v in store.load().items() if v.get("mode", "fixed") == mode}
    groups: dict[tuple, list] = {}
    for pt in points(spec):
        if pt["id"] not in done and (select is None or select(pt["id"])):
            groups.setdefault((pt["model"], pt["system"], pt["domain"]), []).append(pt)

    def keep(recs: list[dict]) -> None:
        for rec in recs:
            store.append(rec)
            done[rec["key"]] = rec
            if progress:
                print(
                    f"screened {rec['key']}: {rec['layouts_fit']} layouts fit, {rec['screen_cpu_s']:.1f} s CPU",
                    flush=True,
                )

    workers = min(len(groups), (os.cpu_count() or 1) if jobs is None else jobs)
    if workers <= 1:
        mem_cache: dict = {}  # across every point of a chip, as the groups share theirs
        for pts in groups.values():
            keep(_screen_group(pts, spec, mem_cache))
        return done
    from concurrent.futures import as_completed

    from simulator.studies.workers import process_pool

    with process_pool(workers) as pool:
        futures = [pool.submit(_screen_group, pts, spec) for pts in groups.values()]
        for f in as_completed(futures):
            keep(f.result())
    return done
