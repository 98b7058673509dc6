"""Layout search: the fastest way to train a scenario's model on its cluster.

:func:`search` enumerates every layout of the scenario's model on its cluster
within :class:`~simulator.studies.search.layouts.SearchBounds`:

* ``tp`` dividing the devices, at most the scale-up domain (``domain_size`` of a
  switched network; a torus pod is one ICI domain) unless ``max_tp`` says;
* ``pp`` dividing what is left, at most the layer count (and ``max_pp``);
* ``cp`` up to ``max_cp`` (1 by default), ``dp`` the devices left over;
* ``ep`` (MoE models only) dividing ``dp*cp`` and the routed experts;
* ``vpp`` for ``interleaved-1f1b`` only: 2 .. ``max_vpp`` with the layers splitting
  evenly over ``pp*vpp`` chunks;
* every schedule, ZeRO stage, micro-batch size and recompute mode listed.

Every other scenario field (model, cluster, sequence length, global batch, dtype,
perturbations, ...) is kept. Each layout is checked structurally
(:func:`simulator.studies.sweep.cases.check_scenario`: status ``invalid`` with the reason) and
its memory estimated with the closed forms of :mod:`workloads.memory`
(:func:`simulator.studies.search.estimate.estimate_memory`: weights, gradients and optimizer states via
``state_bytes``, plus the activations each pipeline rank stashes at the peak of
its schedule, ``activation_bytes_per_layer`` per layer and micro-batch in flight).
Layouts whose estimate exceeds the chip's memory (by more than ``PRUNE_TOLERANCE``)
are ``pruned`` before any simulation — the estimate counts ZeRO-2/3's buffers as the
trace does and matches the simulator's accounting otherwise, so pruning does not drop a
layout that would fit.

The rest are simulated through the sweep executor (:func:`simulator.studies.sweep.run_cases`:
local processes or Dask, resumable with ``out``) and ranked by step time among
those that fit (status ``ok``; ``oom`` when the simulated peak exceeds the chip).
``best_without_pp`` is the fastest with ``pp == 1``, reported beside the best with
the gap between them.

Every layout that is simulated or could be also gets an analytic step-time estimate
(:func:`simulator.studies.search.estimate.estimate_step_time`, column ``est_step_time_s``): compute on the roofline, the
schedule's bubble in closed form, and the communication of each parallel axis at the
bandwidth its group sees (scale-up links inside a domain, NICs across domains, the
ICI links of a torus box). ``max_candidates`` caps how many layouts are simulated:
the candidates are then ranked by that estimate (:func:`simulator.studies.search.estimate.proxy_cost`), the best-ranked
layout without pipeline parallelism is kept among them (when the cap is at least 2),
and the rest get status ``skipped``.

With ``out=DIR``: ``DIR/search.csv`` (every layout tried, with ``status``
``ok | oom | failed | pruned | invalid | skipped``, ``reason`` and the estimates), ``DIR/best.json``
(``{"best": {"scenario", "summary"} | null, "best_without_pp": ... , "gap": ...}``,
each scenario the complete mapping that was simulated: the input scenario with the
layout fields replaced, ready for ``stepsim run``), and the sweep files
(``rows.jsonl``, ``results.parquet``/``.csv``) of the simulated layouts.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from simulator.scenario.loading import load_scenario, read_mapping
from simulator.scenario.schema import ScenarioError
from simulator.studies.search.estimate import estimate_memory, proxy_cost
from simulator.studies.search.layouts import (
    LAYOUT_KEYS,
    PRUNE_TOLERANCE,
    SearchBounds,
    candidate_mapping,
    enumerate_layouts,
    label,
)
from simulator.studies.search.network_model import net_model_for
from simulator.studies.search.rounds import SUMMARY_COLUMNS, Dedupe, _resolved_key, adaptive_rounds, cap_candidates
from simulator.studies.sweep import run_cases
from simulator.studies.sweep.cases import absolutise, check_scenario, resolve
from simulator.studies.sweep.rows import atomic_write
from simulator.studies.sweep.spec import Case

STATUSES = ("ok", "oom", "failed", "pruned", "invalid", "skipped", "duplicate")
SEARCH_CSV, BEST_JSON = "search.csv", "best.json"


def worker_count(jobs: int | None, client) -> int:
    """How many layouts one round of the adaptive search simulates at once."""
    if client is not None:
        return 8
    if jobs is None:
        from simulator.studies.sweep.executors import default_jobs

        return default_jobs()
    return max(1, jobs)


# ---- the search ----------------------------------------------------------------------------


@dataclass
class SearchResult:
    """``table``: every layout tried (status, reason, memory estimate, simulated figures);
    ``best`` / ``best_without_pp``: ``{"scenario", "summary", "label"}`` or None; ``gap``:
    ``best_without_pp`` step time / ``best`` step time - 1 (None without both)."""

    table: pd.DataFrame
    best: dict | None
    best_without_pp: dict | None
    hbm_bytes: float
    name: str = ""
    paths: dict = field(default_factory=dict)
    # the layout with the most tokens/s per scale-up domain used (switched networks; with the
    # spare devices of a partly used domain counted against it), and the same without PP
    best_per_domain: dict | None = None
    best_per_domain_without_pp: dict | None = None

    @property
    def gap(self) -> float | None:
        if self.best is None or self.best_without_pp is None:
            return None
        return self.best_without_pp["summary"]["step_time_s"] / self.best["summary"]["step_time_s"] - 1.0

    @property
    def ranked(self) -> pd.DataFrame:
        """Layouts that ran and fit, fastest first."""
        ok = self.table[self.table["status"] == "ok"]
        return ok.sort_values(["step_time_s", "candidate"], kind="stable").reset_index(drop=True)

    def best_json(self) -> dict:
        strip = lambda b: None if b is None else {"scenario": b["scenario"], "summary": b["summary"]}
        return {
            "best": strip(self.best),
            "best_without_pp": strip(self.best_without_pp),
            "gap": self.gap,
            "best_per_domain": strip(self.best_per_domain),
            "best_per_domain_without_pp": strip(self.best_per_domain_without_pp),
        }

    def to_text(self, top: int = 10) -> str:
        t = self.table
        counts = t["status"].value_counts()
        lines = [
            f"search {self.name}: {len(t)} layouts — "
            + ", ".join(f"{counts.get(s, 0)} {s}" for s in STATUSES if counts.get(s, 0))
        ]
        ranked = self.ranked
        if ranked.empty:
            lines.append("no layout fits in memory and runs")
        else:
            lines.append(
                f"{'#':>3}  {'layout':<44} {'step (s)':>10} {'MFU':>6} {'bubble':>7} {'exp.comm':>8} {'peak GB':>8}"
            )
            for i, r in ranked.head(top).iterrows():
                lines.append(
                    f"{i + 1:>3}  {r['label']:<44} {r['step_time_s']:>10.4g} {r['mfu']:>6.1%} "
                    f"{r['bubble_fraction']:>7.1%} {r['exposed_comm_fraction']:>8.1%} "
                    f"{r['peak_memory_bytes'] / 1e9:>8.2f}"
                )
        for title, b in (("best", self.best), ("best without pp", self.best_without_pp)):
            if b is None:
                lines.append(f"{title:<16} none")
            else:
                s = b["summary"]
                lines.append(
                    f"{title:<16} {b['label']}: {s['step_time_s']:.4g} s/step, MFU {s['mfu']:.1%}{_per_domain(s)}"
                )
        for title, b in (
            ("best per domain", self.best_per_domain),
            ("  without pp", self.best_per_domain_without_pp),
        ):
            if b is not None:
                s = b["summary"]
                lines.append(f"{title:<16} {b['label']}: {s['step_time_s']:.4g} s/step{_per_domain(s)}")
        if self.gap is not None:
            lines.append(
                f"pipeline parallelism gains {self.gap:.1%} (best without pp is {1 + self.gap:.3f}x slower)"
                if self.gap > 0
                else "the best layout needs no pipeline parallelism"
            )
        return "\n".join(lines)


def search(
    scenario: str | Path | Mapping,
    out: str | Path | None = None,
    bounds: SearchBounds | None = None,
    client=None,
    jobs: int | None = None,
    progress: bool = False,
    executor=None,
) -> SearchResult:
    """Search the layouts of ``scenario`` (path or mapping) within ``bounds`` (see the module
    notes). ``client`` / ``jobs`` / ``progress`` / ``executor`` as for :func:`simulator.studies.sweep.sweep`."""
    bounds = bounds or SearchBounds()
    base = _base_mapping(scenario)
    sc0 = load_scenario(base)
    hbm = sc0.cluster.chip.hbm_bytes
    records, cases = _screen(base, sc0, bounds)
    summaries: dict[int, dict] = {}

    def run(batch: list, ex) -> None:
        _, rows = run_cases(
            batch,
            LAYOUT_KEYS,
            out=out,
            client=client,
            jobs=jobs,
            progress=progress,
            desc=f"search {sc0.name}",
            executor=ex,
        )
        _record_rows(batch, rows, records, summaries, hbm)

    dedupe = Dedupe(records)
    _simulate(cases, records, bounds, dedupe, run, jobs, client, executor)
    _copy_duplicates(records, dedupe.dropped)
    table = _table(records)

    def pick(mask, per_domain: bool = False) -> dict | None:
        ok = table[(table["status"] == "ok") & mask]
        if per_domain:
            ok = ok[ok["tokens_per_s_per_domain"].notna()]
        if ok.empty:
            return None
        by = (
            (["tokens_per_s_per_domain", "candidate"], [False, True])
            if per_domain
            else (["step_time_s", "candidate"], True)
        )
        i = int(ok.sort_values(by[0], ascending=by[1], kind="stable").iloc[0]["candidate"])
        return {"scenario": records[i]["_mapping"], "summary": summaries[i], "label": records[i]["label"]}

    result = SearchResult(
        table=table,
        best=pick(table["pp"] > 0),
        best_without_pp=pick(table["pp"] == 1),
        hbm_bytes=hbm,
        name=sc0.name,
        best_per_domain=pick(table["pp"] > 0, per_domain=True),
        best_per_domain_without_pp=pick(table["pp"] == 1, per_domain=True),
    )
    if out is not None:
        result.paths = _write_outputs(result, Path(out))
    return result


def _per_domain(s: Mapping) -> str:
    """``", 64/72 per domain, 1.2e+05 tokens/s per domain"`` for a switched cluster's summary."""
    place = s.get("placement")
    if not place or s.get("tokens_per_s_per_domain") is None:
        return ""
    spare = f", {place['spare_devices']} idle" if place["spare_devices"] else ""
    return (
        f", {place['devices_per_domain']}/{place['domain_capacity']} per domain on {place['domains']} domains{spare}, "
        f"{s['tokens_per_s_per_domain']:,.0f} tokens/s per domain"
    )


def _base_mapping(scenario) -> dict:
    """The base scenario mapping of a path (its relative paths made absolute) or mapping."""
    if isinstance(scenario, (str, Path)):
        return absolutise(read_mapping(scenario), Path(scenario).resolve().parent)
    if isinstance(scenario, Mapping):
        return copy.deepcopy(dict(scenario))
    raise ScenarioError(f"expected a scenario path or mapping, got {type(scenario).__name__}", field="")


def _screen(base: dict, sc0, bounds: SearchBounds) -> tuple[list, list]:
    """Every layout within ``bounds``: its record (``invalid`` / ``pruned`` with the reason, or
    estimated) and, for each one left to simulate, its sweep case."""
    records, cases, by_key = [], [], {}
    # one cache of collective times for every candidate (the scenario's algorithms honoured)
    nets: dict = {}  # devices per domain -> the NetModel of that placement (net_model_for)
    est_cache: dict = {}
    for i, p in enumerate(enumerate_layouts(sc0, bounds)):
        mapping = candidate_mapping(base, p, sc0.name)
        rec = {
            "candidate": i,
            "label": label(p),
            **p,
            "status": None,
            "reason": None,
            "est_memory_bytes": None,
            "est_step_time_s": None,
        }
        case = _screen_one(rec, p, mapping, sc0.cluster.chip.hbm_bytes, by_key, nets, est_cache)
        if case is not None:
            cases.append(case)
        records.append(rec)
    return records, cases


def _screen_one(
    rec: dict, p: dict, mapping: dict, hbm: float, by_key: dict, nets: dict, est_cache: dict
) -> Case | None:
    """Check, memory-estimate and rank candidate ``rec`` (layout ``p``); its case when it is to
    be simulated, else None (its status says why)."""
    i = rec["candidate"]
    key, resolved, sc, error = resolve(mapping)
    est = None
    if error is None:
        try:
            check_scenario(sc)
            est = estimate_memory(sc)
        except ScenarioError as err:
            error = str(err)
        except ValueError as err:
            error = str(err)
    if error is not None:
        rec.update(status="invalid", reason=error)
        return None
    rec["est_memory_bytes"] = est["total"]
    rec["_micro_batches"] = sc.training.micro_batches(sc.layout.dp)
    if est["total"] > hbm * (1 + PRUNE_TOLERANCE):
        rec.update(
            status="pruned",
            reason=(
                f"estimated {est['total'] / 1e9:.2f} GB (weights {est['weights'] / 1e9:.2f}, gradients "
                f"{est['gradients'] / 1e9:.2f}, optimizer {est['optimizer'] / 1e9:.2f}, activations "
                f"{est['activations'] / 1e9:.2f} on stage {est['stage']}) > HBM {hbm / 1e9:.2f} GB"
            ),
        )
        return None
    if key in by_key:
        rec.update(status="invalid", reason=f"same scenario as candidate {by_key[key]}")
        return None
    by_key[key] = i
    # The estimate reads training.recompute only as "full or not" (simulator.studies.search.estimate):
    # layouts differing only in none / selective share one evaluation.
    ekey = _resolved_key(resolved, recompute="full" if p["recompute"] == "full" else "not-full")
    if ekey not in est_cache:
        est_cache[ekey] = proxy_cost(p, rec["_micro_batches"], sc, net_model_for(nets, sc))
    rec["est_step_time_s"] = est_cache[ekey]
    rec["_key"], rec["_mapping"], rec["_resolved"], rec["_sc"] = key, mapping, resolved, sc
    rec["_memory"] = est
    return Case(index=i, axes={k: p[k] for k in LAYOUT_KEYS}, scenario=mapping, key=key, resolved=resolved)


def _record_rows(batch: list, rows: Mapping, records: list, summaries: dict, hbm: float) -> None:
    """Copy the simulated rows of ``batch`` into their records (status, summary columns)."""
    for c in batch:
        row = rows.get(c.key)
        rec = records[c.index]
        if row is None:  # pragma: no cover — run_cases returns every case or raises
            rec.update(status="failed", reason="not run")
            continue
        if row["status"] != "ok":
            rec.update(status="failed", reason=row.get("error"))
            continue
        s = row["summary"]
        summaries[c.index] = s
        for k in SUMMARY_COLUMNS:
            rec[k] = s.get(k)
        rec["status"] = "oom" if s.get("oom") else "ok"
        if s.get("oom"):
            rec["reason"] = f"simulated peak {s['peak_memory_bytes'] / 1e9:.2f} GB > HBM {hbm / 1e9:.2f} GB"


def _simulate(cases: list, records: list, bounds: SearchBounds, dedupe, run, jobs, client, executor) -> None:
    """Simulate the cases: all of them (up to ``max_candidates``) without an estimate margin,
    else in adaptive rounds (:func:`~simulator.studies.search.rounds.adaptive_rounds`)."""
    if bounds.estimate_margin is None:
        batch = []
        for c in cap_candidates(cases, records, bounds):
            if not dedupe.is_duplicate(c):
                batch.append(c)
        run(batch, executor)
        return
    own_pool = None
    ex = executor
    width = worker_count(jobs, client)
    if ex is None and client is None and width > 1:
        from simulator.studies.workers import process_pool

        ex = own_pool = process_pool(width)  # one pool for every round
    try:
        adaptive_rounds(cases, records, bounds, dedupe, lambda batch: run(batch, ex), max(2, width))
    finally:
        if own_pool is not None:
            own_pool.shutdown(cancel_futures=True)


def _copy_duplicates(records: list, duplicates: Mapping) -> None:
    """Give every dropped duplicate the figures of the layout it simulates identically to."""
    for i, j in duplicates.items():  # i simulates identically to j
        src = records[j]
        for k in SUMMARY_COLUMNS:
            records[i][k] = src.get(k)
        if src["status"] not in ("ok", "oom"):
            records[i].update(status=src["status"], reason=src["reason"])


def _table(records: list) -> pd.DataFrame:
    """The search table: one row per layout, without the records' private fields."""
    return pd.DataFrame.from_records(
        [{k: v for k, v in r.items() if not k.startswith("_")} for r in records],
        columns=[
            "candidate",
            "label",
            *LAYOUT_KEYS,
            "status",
            "reason",
            "est_memory_bytes",
            "est_step_time_s",
            *SUMMARY_COLUMNS,
        ],
    )


def _write_outputs(result: SearchResult, out: Path) -> dict:
    """Write ``search.csv`` and ``best.json`` into ``out`` atomically; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out / SEARCH_CSV, "best": out / BEST_JSON}
    atomic_write(paths["csv"], lambda p: result.table.to_csv(p, index=False))
    atomic_write(paths["best"], lambda p: p.write_text(json.dumps(result.best_json(), indent=2, default=str) + "\n"))
    return paths
