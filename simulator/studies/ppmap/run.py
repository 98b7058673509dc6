"""Where pipeline parallelism pays: a map over scale-up domain size and scale-out bandwidth.

A *map file* (YAML/JSON, format below) names the models, a GPU cluster preset whose
scale-up domain size (``cluster.network.domain_size``) and scale-out bandwidth per GPU
(``cluster.network.nic_bw_bytes_per_s``) are varied over a grid, and today's systems as
points of their own (any cluster mapping, a TPU torus included). At every point:

1. **screen** -- every layout of :func:`simulator.studies.search.layouts.enumerate_layouts` within the
   map's search bounds (pipeline degrees restricted to ``search.pp``) is checked and its
   memory estimated (:func:`simulator.studies.search.estimate.estimate_memory`, cached per model and chip:
   memory does not depend on the network), and every one that fits gets the analytic
   step-time estimate (:func:`simulator.studies.search.estimate.proxy_cost`) -- the same rules
   :func:`simulator.studies.search.search` applies;
2. **choose** -- by default every layout that fits and whose estimate is within
   :data:`~simulator.studies.ppmap.screen.ADAPTIVE_SCREEN_SHARE` of the best estimate of its
   kind (with PP, without) is a candidate, and the point simulates them as ``stepsim
   search`` does: in rounds, best estimates first, until no candidate left can beat the best
   simulated step with PP or without
   (:func:`simulator.studies.search.rounds.adaptive_rounds`, the same bounds and
   ``estimate_margin``). With ``simulate: {with_pp: k, without_pp: n}`` only the ``k``
   best-estimated layouts with ``pp > 1`` (distinct schedules first) and the ``n`` best with
   ``pp == 1`` are simulated;
3. **simulate** -- every chosen layout of every point through the sweep executor
   (:func:`simulator.studies.sweep.run_cases`): local processes, any ``concurrent.futures``
   executor or a Dask cluster, one resumable row store ``OUT/sims/rows.jsonl`` for the
   whole map, so an interrupted run resumes where it stopped and a cluster runs the
   points' simulations side by side.

``OUT/screen.jsonl`` keeps each point's screen (one line a point: the chosen layouts,
the estimated best with and without PP, the memory facts), so a resumed run does not
screen again. :func:`assemble` turns screen and rows into the map table (one row per
point: best layout with PP and without, ``ratio = best without PP / best``, the
estimate's ratio, the memory side, the roofline); :func:`simulator.studies.ppmap.plot.plot_map` draws it.

Why not ``search`` itself at each point: the map screens with one memory cache across the
points of one chip (memory does not depend on the network) and keeps one resumable row
store for the whole map; the rounds and their stopping rule are the search's own.

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
    simulate: {adaptive: true}         # default; or {with_pp: 2, without_pp: 1}
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from simulator.errors import StudyError
from simulator.scenario.loading import load_scenario
from simulator.scenario.schema import ScenarioError
from simulator.studies.ppmap.roofline import aux_global_memory, roofline
from simulator.studies.ppmap.screen import run_screens
from simulator.studies.ppmap.spec import (
    CANDIDATES_CSV,
    MAP_CSV,
    SCREEN_FILE,
    SIM_KEYS,
    STATUS_JSON,
    MapSpec,
    load_map,
    model_name,
    points,
)
from simulator.studies.search.layouts import (
    LAYOUT_KEYS,
    candidate_mapping,
    label,
)
from simulator.studies.search.rounds import FINGERPRINT_FORMAT, Dedupe, adaptive_rounds
from simulator.studies.search.run import worker_count
from simulator.studies.sweep import run_cases
from simulator.studies.sweep.cases import resolve
from simulator.studies.sweep.spec import Case
from simulator.studies.workers import process_pool

# ---- the whole run -------------------------------------------------------------------------------


def _priority(spec: MapSpec, pt: Mapping) -> tuple:
    """Simulation order: torus systems first, whose layouts are the slowest to simulate (up to
    9 min each on the TPU v5p torus), so that they run beside the other points rather than
    alone at the end of a map whose points run a few at a time (:func:`_run_adaptive`); then,
    so that a partial run already draws a coarse map, model by model, grid points on every
    other row and column first, then the rest, then the other systems."""
    torus = pt["system"] != "grid" and "tpu" in json.dumps(pt["scenario"]["cluster"]).lower()
    m = [model_name(x) for x in spec.models].index(pt["model"])
    if pt["system"] == "grid":
        i, k = spec.domain_sizes.index(pt["domain"]), spec.nic_gbps.index(pt["nic_gbps"])
        return (not torus, m, 0, (i % 2) + (k % 2), i, k)
    return (not torus, m, 1, 0, 0, 0)


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


def cases_of(spec: MapSpec, screens: Mapping[str, dict], select=None) -> list[Case]:
    """One sweep case per chosen layout of every screened point (axes: point + the layout
    keys); of the points ``select`` (a predicate on point ids, :func:`point_filter`) accepts."""
    cases, seen = [], set()
    for pt in sorted(points(spec), key=lambda p: _priority(spec, p)):
        if pt["id"] not in screens or (select is not None and not select(pt["id"])):
            continue
        chosen = screens[pt["id"]]["chosen"]
        # an adaptive point's candidates hold every micro-batch size that fits by the estimate
        for p in chosen if spec.adaptive else with_fallbacks(chosen):
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
    out: str | Path,
    client=None,
    jobs: int | None = None,
    executor=None,
    progress: bool | None = False,
    only: Sequence[str] | None = None,
    retry_failed: bool = False,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Screen, simulate and assemble the map into ``out`` (resumable). Returns
    ``(map table, candidates table)``, also written as ``OUT/map.csv`` and ``OUT/candidates.csv``.
    ``only``: shell-style patterns of point ids (``kimi-k2/d72-*``): screen and simulate only
    the points they match (the tables still hold every point the store has). A resumed run
    takes a layout the store records as failed as done; ``retry_failed`` simulates it again
    where the rounds choose it (a failure of an earlier version)."""
    spec = spec_or_path if isinstance(spec_or_path, MapSpec) else load_map(spec_or_path)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    select = point_filter(spec, only)
    screens = run_screens(
        spec, out, progress=bool(progress), jobs=jobs if client is None and executor is None else 1, select=select
    )
    cases = cases_of(spec, screens, select)
    # local workers: several points' rounds at once (threads), each round in worker processes of
    # its own, as many as the points in a round at that moment leave it (fresh processes: a
    # worker's memory does not grow over a map's thousand simulations)
    workers = worker_count(jobs, client)
    local = spec.adaptive and client is None and executor is None and workers > 1
    in_round = [0]
    lock = threading.Lock()

    def run(batch: list) -> dict:
        pool = None
        if local:
            with lock:
                in_round[0] += 1
                share = max(1, min(len(batch), workers // in_round[0]))
            pool = process_pool(share)
        try:
            return run_cases(
                batch,
                ("point", *LAYOUT_KEYS),
                out=out / "sims",
                client=client,
                jobs=jobs,
                executor=executor if pool is None else pool,
                progress=progress,
                retry_failed=retry_failed,
                desc=f"ppmap {spec.name}",
            )[1]
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
                with lock:
                    in_round[0] -= 1

    if spec.adaptive:
        simulated = _run_adaptive(spec, screens, cases, run, jobs, client, out / "sims", workers if local else 1)
    else:
        run(cases)
        simulated = len(cases)
    table, cands = assemble(spec, out)
    if only is not None:  # run.json is the wall time of a whole map's run
        return table, cands
    (out / "run.json").write_text(
        json.dumps(
            {
                "name": spec.name,
                "points": len(screens),
                "simulations": simulated,
                "wall_s": round(time.perf_counter() - t0, 1),
            },
            indent=2,
        )
        + "\n"
    )
    return table, cands


def point_filter(spec: MapSpec, only: Sequence[str] | None):
    """A predicate on point ids: those matching one of the shell-style patterns ``only``
    (every point when ``None``). A pattern that matches no point of the map is refused,
    naming the points there are."""
    if only is None:
        return lambda point: True
    ids = [p["id"] for p in points(spec)]
    for pat in only:
        if not fnmatch.filter(ids, pat):
            raise StudyError(
                f"{pat!r} matches no point of map {spec.name!r}; its points are {', '.join(ids)}",
                field="--points",
            )
    return lambda point: any(fnmatch.fnmatchcase(point, pat) for pat in only)


class _MapDedupe(Dedupe):
    """The search's :class:`~simulator.studies.search.rounds.Dedupe` over a point's records:
    a layout that provably simulates identically to one already chosen (the same resolved
    scenario but for name, schedule and recompute, the same estimates, the same trace:
    ``selective`` recompute is ``none`` under flash attention) is not simulated again. The
    records hold the resolved scenario and the memory estimate; a scenario is loaded only when
    its trace is to be compared.

    A resumed map would otherwise build those traces again for every finished point (83 % of
    a restart's time on the committed store): a layout whose row is already in the store
    (``stored``, case keys) is read, not simulated, so it is not compared; and the traces'
    fingerprints are kept beside the rows (``fingerprints``: an open
    :class:`_Fingerprints`). A fingerprint read back from another process can only differ
    where the same one would, so a cached value never makes two different traces equal."""

    def __init__(
        self, records: list, cases: list, stored: frozenset = frozenset(), fingerprints=None, by_workload=None
    ):
        super().__init__(records, by_workload)
        self.cases = cases
        self.stored = stored
        self.saved = fingerprints

    def is_duplicate(self, c) -> bool:
        if self.cases[c.index].key in self.stored:  # its figures are read back, at no cost
            self.groups.setdefault(self._key(c.index), []).append(c.index)
            return False
        return super().is_duplicate(c)

    def _fingerprint(self, i: int) -> str | None:
        key = self.cases[i].key
        if i not in self.fingerprints and self.saved is not None and key in self.saved.values:
            self.fingerprints[i] = self.saved.values[key]
        r = self.records[i]
        if i not in self.fingerprints and "_sc" not in r:
            try:
                r["_sc"] = load_scenario(self.cases[i].scenario)
            except (ScenarioError, ValueError):
                self.fingerprints[i] = None
        fp = super()._fingerprint(i)
        if self.saved is not None:
            self.saved.add(key, fp)
        return fp


def _current(fp) -> bool:
    """Whether a kept fingerprint is today's encoding (or ``None``: the trace does not build)."""
    return fp is None or (isinstance(fp, str) and fp.startswith(f"{FINGERPRINT_FORMAT}:"))


class _Fingerprints:
    """Trace fingerprints by case key, kept in ``OUT/sims/fingerprints.jsonl`` (one JSON object a
    line, ``{"key", "fingerprint"}``), appended as they are computed; one of an earlier
    encoding (:data:`~simulator.studies.search.rounds.FINGERPRINT_FORMAT`) is not read back."""

    def __init__(self, path: Path):
        self.path = path
        self.values: dict[str, str | None] = {}
        self._lock = threading.Lock()  # points' rounds run in threads (_run_adaptive)
        if path.exists():
            for line in path.read_text(encoding="utf-8").split("\n"):
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict) and isinstance(row.get("key"), str) and _current(row.get("fingerprint")):
                    self.values[row["key"]] = row.get("fingerprint")

    def add(self, key: str, fp: str | None) -> None:
        with self._lock:
            if key in self.values:
                return
            self.values[key] = fp
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"key": key, "fingerprint": fp}) + "\n")


def _run_adaptive(
    spec: MapSpec,
    screens: Mapping,
    cases: list,
    run,
    jobs: int | None,
    client,
    sims: Path | None = None,
    concurrent_points: int = 1,
) -> int:
    """Simulate each point as :func:`simulator.studies.search.search` does: in rounds, best
    estimates first, until no layout left can beat the best simulated one with PP and
    without (:func:`simulator.studies.search.rounds.adaptive_rounds`, with the map's search
    bounds and their ``estimate_margin``). Returns how many layouts were simulated.

    ``concurrent_points`` points run their rounds at once (threads, each handing its rounds
    to ``run``, which gives each round the workers the others leave): a round waits for its slowest layout,
    and another point's layouts use the workers meanwhile. Each point's rounds see only its
    own results, so what a point simulates and finds does not depend on this."""
    from concurrent.futures import ThreadPoolExecutor

    width = max(2, worker_count(jobs, client))
    stored = (
        frozenset(k for k, r in _read_rows(sims / "rows.jsonl").items() if r.get("status") == "ok")
        if sims
        else frozenset()
    )
    saved = _Fingerprints(sims / "fingerprints.jsonl") if sims else None
    by_workload: dict = {}  # trace fingerprints by workload, across points (Dedupe.by_workload)
    by_point: dict[str, list] = {}
    for c in cases:
        by_point.setdefault(c.axes["point"], []).append(c)

    def one_point(point: str) -> int:
        group = by_point[point]
        est = {p["label"]: (p["est_step_time_s"], p["est_memory_bytes"]) for p in screens[point]["chosen"]}
        records, local = [], []
        for c in group:
            step_s, mem = est[label(c.axes)]
            records.append(
                {
                    **c.axes,
                    "label": label(c.axes),
                    "est_step_time_s": step_s,
                    "status": None,
                    "reason": None,
                    "_resolved": c.resolved,
                    "_memory": mem,
                }
            )
            local.append(dataclasses.replace(c, index=len(records) - 1))

        def run_round(batch: list) -> None:
            rows = run(batch)
            for c in batch:
                r, row = records[c.index], rows.get(c.key) or {}
                summary = row.get("summary") or {}
                if row.get("status") != "ok":
                    r.update(status="failed", reason=row.get("error"))
                    continue
                r.update(status="oom" if summary.get("oom") else "ok", step_time_s=summary.get("step_time_s"))

        dedupe = _MapDedupe(records, local, stored, saved, by_workload)
        adaptive_rounds(local, records, spec.bounds, dedupe, run_round, width)
        return sum(1 for r in records if r["status"] in ("ok", "oom", "failed"))

    if concurrent_points <= 1 or len(by_point) <= 1:
        return sum(map(one_point, by_point))
    with ThreadPoolExecutor(min(concurrent_points, len(by_point)), thread_name_prefix="ppmap-point") as threads:
        return sum(threads.map(one_point, by_point))


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


def assemble(spec_or_path, out: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The map table from what ``out`` holds so far (points with no finished simulation
    have empty figures): also works on a partial run."""
    spec = spec_or_path if isinstance(spec_or_path, MapSpec) else load_map(spec_or_path)
    out = Path(out)
    # read-only (RowStore.load would cut a torn last line, which may be a line a running
    # ``run_map`` is writing): a line that does not parse is left out
    screens, rows = _read_rows(out / SCREEN_FILE), _read_rows(out / "sims" / "rows.jsonl")
    # only the rows of today's cases: a row the store kept from an earlier map file (another
    # system, another screen's choice) has a key no case has now
    current = {c.key for c in cases_of(spec, screens)}
    rows = {k: r for k, r in rows.items() if k in current}
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
        for k in ("label", "step_time_s", "mfu", "peak_memory_bytes", "devices_per_domain", "tokens_per_s_per_domain"):
            rec[f"{tag}_{k}"] = None if b is None else b.get(k)
    # per scale-up domain: a placement that leaves devices of each domain idle uses more domains
    # for the same devices, so it is compared on tokens/s per domain too (higher is better)
    per_domain = [c for c in ok if c.get("tokens_per_s_per_domain") is not None]
    dp_ = max((c for c in per_domain if c["pp"] > 1), key=lambda c: c["tokens_per_s_per_domain"], default=None)
    dn_ = max((c for c in per_domain if c["pp"] == 1), key=lambda c: c["tokens_per_s_per_domain"], default=None)
    for tag, b in (("best_pp_per_domain", dp_), ("best_nopp_per_domain", dn_)):
        rec[f"{tag}_label"] = None if b is None else b["label"]
        rec[f"{tag}_tokens_per_s"] = None if b is None else b["tokens_per_s_per_domain"]
    rec["ratio_per_domain"] = (
        max(dp_["tokens_per_s_per_domain"], dn_["tokens_per_s_per_domain"]) / dn_["tokens_per_s_per_domain"]
        if dp_ is not None and dn_ is not None
        else None
    )
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


def failed_count(cands) -> int:
    """The simulations of ``cands`` (the candidates table) that raised an error."""
    return int((cands["status"] == "failed").sum()) if len(cands) and "status" in cands else 0


def _write_status(spec: MapSpec, out: Path, screens: Mapping, rows: Mapping, table, cands) -> None:
    """Write ``status.json``: how far the run has got."""
    versions = sorted({str(r.get("stepsim_version")) for r in rows.values()})
    status = {
        "name": spec.name,
        "points_total": len(points(spec)),
        "points_screened": len(screens),
        "simulations_chosen": sum(len(with_fallbacks(v["chosen"])) for v in screens.values()),
        "simulations_done": len(cands),
        # a failed simulation is no candidate of its point's comparison: candidates.csv names each
        "simulations_failed": failed_count(cands),
        "points_with_ratio": int(table["ratio"].notna().sum()) if len(table) else 0,
        "screen_cpu_s_total": round(sum(v.get("screen_cpu_s", 0.0) for v in screens.values()), 1),
        "simulation_wall_s_total": round(float(cands["sim_wall_s"].fillna(0).sum()) if len(cands) else 0.0, 1),
        "stepsim_versions": versions,
    }
    (out / STATUS_JSON).write_text(json.dumps(status, indent=2) + "\n")
