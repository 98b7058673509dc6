"""Layout search: the fastest way to train a scenario's model on its cluster.

:func:`search` enumerates every layout of the scenario's model on its cluster
within :class:`SearchBounds`:

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
(:func:`simulator.sweep.check_scenario`: status ``invalid`` with the reason) and
its memory estimated with the closed forms of :mod:`workloads.memory`
(:func:`simulator.estimate.estimate_memory`: weights, gradients and optimizer states via
``state_bytes``, plus the activations each pipeline rank stashes at the peak of
its schedule, ``activation_bytes_per_layer`` per layer and micro-batch in flight).
Layouts whose estimate exceeds the chip's memory (by more than ``PRUNE_TOLERANCE``)
are ``pruned`` before any simulation — the estimate counts ZeRO-2/3's buffers as the
trace does and matches the simulator's accounting otherwise, so pruning does not drop a
layout that would fit.

The rest are simulated through the sweep executor (:func:`simulator.sweep.run_cases`:
local processes or Dask, resumable with ``out``) and ranked by step time among
those that fit (status ``ok``; ``oom`` when the simulated peak exceeds the chip).
``best_without_pp`` is the fastest with ``pp == 1``, reported beside the best with
the gap between them.

Every layout that is simulated or could be also gets an analytic step-time estimate
(:func:`simulator.estimate.estimate_step_time`, column ``est_step_time_s``): compute on the roofline, the
schedule's bubble in closed form, and the communication of each parallel axis at the
bandwidth its group sees (scale-up links inside a domain, NICs across domains, the
ICI links of a torus box). ``max_candidates`` caps how many layouts are simulated:
the candidates are then ranked by that estimate (:func:`simulator.estimate.proxy_cost`), the best-ranked
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Union

import pandas as pd

from simulator.estimate import NetModel, estimate_memory, proxy_cost
from simulator.schema import ScenarioError, load_scenario, read_mapping
from simulator.sweep import Case, _absolutise, _atomic_write, check_scenario, resolve, run_cases, set_dotted
from topologies.networks import SwitchedNetwork
from workloads import memory
from workloads.enums import RECOMPUTE_MODES
from workloads import schedules as sched

LAYOUT_KEYS = ("tp", "pp", "dp", "cp", "ep", "vpp", "schedule", "zero", "micro_batch_size", "recompute")
STATUSES = ("ok", "oom", "failed", "pruned", "invalid", "skipped")
SUMMARY_COLUMNS = ("step_time_s", "mfu", "tokens_per_s", "peak_memory_bytes", "bubble_fraction",
                   "exposed_comm_fraction")
SEARCH_CSV, BEST_JSON = "search.csv", "best.json"
# A layout is pruned only when its memory estimate exceeds the chip's memory by more than
# this share: the closed forms and the trace's accounting differ by well under 0.1 % on
# the test scenarios (tests/test_search.py), so nothing that would fit is dropped.
PRUNE_TOLERANCE = 0.01


@dataclass(frozen=True)
class SearchBounds:
    """What :func:`search` may vary. ``None`` means: for ``max_tp`` the scale-up domain,
    for ``max_pp`` / ``max_ep`` no bound, for ``zero`` / ``micro_batch_sizes`` the
    scenario's own value only."""

    max_tp: Optional[int] = None
    max_pp: Optional[int] = None
    max_cp: int = 1
    max_ep: Optional[int] = None
    max_vpp: int = 4
    schedules: tuple[str, ...] = ("1f1b", "interleaved-1f1b")
    zero: Optional[tuple[int, ...]] = None
    micro_batch_sizes: Optional[tuple[int, ...]] = None
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    max_candidates: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("max_tp", "max_pp", "max_ep", "max_candidates"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ScenarioError(f"bounds.{name}", f"must be a positive integer or None, got {v!r}")
        for name in ("max_cp", "max_vpp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ScenarioError(f"bounds.{name}", f"must be a positive integer, got {v!r}")
        if not self.schedules or any(s not in sched.SCHEDULES for s in self.schedules):
            raise ScenarioError("bounds.schedules", f"must be a non-empty list of {', '.join(sched.SCHEDULES)}; "
                                                    f"got {list(self.schedules)}")
        if self.zero is not None and (not self.zero or any(z not in (0, 1, 2, 3) for z in self.zero)):
            raise ScenarioError("bounds.zero", f"must be a non-empty list of 0, 1, 2, 3; got {list(self.zero)}")
        if self.micro_batch_sizes is not None and (
                not self.micro_batch_sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                                                  for b in self.micro_batch_sizes)):
            raise ScenarioError("bounds.micro_batch_sizes",
                                f"must be a non-empty list of positive integers; got {list(self.micro_batch_sizes)}")
        if not self.recompute or any(r not in memory.RECOMPUTE_MODES for r in self.recompute):
            raise ScenarioError("bounds.recompute", f"must be a non-empty list of "
                                                    f"{', '.join(memory.RECOMPUTE_MODES)}; got {list(self.recompute)}")


# ---- enumeration ---------------------------------------------------------------------------


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def scale_up_domain(sc) -> int:
    """Devices in one scale-up domain: a switched network's ``domain_size``; a torus pod."""
    net = sc.cluster.network
    if isinstance(net, SwitchedNetwork):
        return min(net.domain_size, sc.cluster.devices)
    return sc.cluster.devices_per_pod


def label(p: Mapping) -> str:
    parts = [f"tp{p['tp']}", f"pp{p['pp']}", f"dp{p['dp']}"]
    for k in ("cp", "ep", "vpp"):
        if p[k] > 1:
            parts.append(f"{k}{p[k]}")
    parts += [p["schedule"], f"z{p['zero']}", f"mb{p['micro_batch_size']}", p["recompute"]]
    return "-".join(parts)


def enumerate_layouts(sc, bounds: SearchBounds) -> list[dict]:
    """Every layout within ``bounds`` whose degrees divide the devices (and, for MoE, ep the
    experts; for pipelines, the layers over pp*vpp chunks). Deterministic order."""
    n = sc.cluster.devices
    model = sc.model
    max_tp = bounds.max_tp or scale_up_domain(sc)
    max_pp = min(bounds.max_pp or model.layers, model.layers)
    zeros = bounds.zero if bounds.zero is not None else (sc.layout.zero,)
    mbs = bounds.micro_batch_sizes if bounds.micro_batch_sizes is not None else (sc.training.micro_batch_size,)
    out = []
    for tp in _divisors(n):
        if tp > max_tp:
            continue
        for cp in _divisors(n // tp):
            if cp > bounds.max_cp:
                continue
            for pp in _divisors(n // (tp * cp)):
                if pp > max_pp:
                    continue
                dp = n // (tp * cp * pp)
                eps = [1]
                if model.is_moe:
                    eps = [e for e in _divisors(dp * cp)
                           if model.moe.experts % e == 0 and (bounds.max_ep is None or e <= bounds.max_ep)]
                for ep in eps:
                    for schedule in bounds.schedules:
                        if schedule == "interleaved-1f1b":
                            if pp < 2:
                                continue
                            # Uneven splits are fine (pipeline_layers: auto), but every
                            # chunk needs a layer.
                            vpps = [v for v in range(2, bounds.max_vpp + 1) if pp * v <= model.layers]
                        else:
                            if sched.model_chunks(schedule, pp, 1) > model.layers:
                                continue
                            vpps = [1]
                        for vpp in vpps:
                            for zero in zeros:
                                for mb in mbs:
                                    for rc in bounds.recompute:
                                        out.append({"tp": tp, "pp": pp, "dp": dp, "cp": cp, "ep": ep, "vpp": vpp,
                                                    "schedule": schedule, "zero": zero, "micro_batch_size": mb,
                                                    "recompute": rc})
    return out


def candidate_mapping(base: Mapping, p: Mapping, name: str) -> dict:
    """The scenario mapping of one layout: ``base`` (the scenario as given) with its
    parallel layout, schedule, micro-batch size and recompute mode replaced; every other
    field (model, cluster, sequence length, batch, dtype, ...) kept as it was."""
    par = dict(base.get("parallel") or {})
    etp = p["tp"] if par.get("etp", 1) > 1 and par.get("etp") == par.get("tp") else 1
    par.update(tp=p["tp"], pp=p["pp"], dp=p["dp"], cp=p["cp"], ep=p["ep"], vpp=p["vpp"], zero=p["zero"], etp=etp,
               pipeline_layers="auto")
    out = set_dotted(base, "parallel", par)
    out = set_dotted(out, "schedule", p["schedule"])
    out = set_dotted(out, "training.micro_batch_size", p["micro_batch_size"])
    out = set_dotted(out, "training.recompute", p["recompute"])
    return set_dotted(out, "name", f"{name}:{label(p)}")


# ---- the search ----------------------------------------------------------------------------


@dataclass
class SearchResult:
    """``table``: every layout tried (status, reason, memory estimate, simulated figures);
    ``best`` / ``best_without_pp``: ``{"scenario", "summary", "label"}`` or None; ``gap``:
    ``best_without_pp`` step time / ``best`` step time - 1 (None without both)."""

    table: pd.DataFrame
    best: Optional[dict]
    best_without_pp: Optional[dict]
    hbm_bytes: float
    name: str = ""
    paths: dict = field(default_factory=dict)

    @property
    def gap(self) -> Optional[float]:
        if self.best is None or self.best_without_pp is None:
            return None
        return self.best_without_pp["summary"]["step_time_s"] / self.best["summary"]["step_time_s"] - 1.0

    @property
    def ranked(self) -> pd.DataFrame:
        """Layouts that ran and fit, fastest first."""
        ok = self.table[self.table["status"] == "ok"]
        return ok.sort_values(["step_time_s", "candidate"], kind="stable").reset_index(drop=True)

    def best_json(self) -> dict:
        strip = (lambda b: None if b is None else {"scenario": b["scenario"], "summary": b["summary"]})
        return {"best": strip(self.best), "best_without_pp": strip(self.best_without_pp), "gap": self.gap}

    def to_text(self, top: int = 10) -> str:
        t = self.table
        counts = t["status"].value_counts()
        lines = [f"search {self.name}: {len(t)} layouts — "
                 + ", ".join(f"{counts.get(s, 0)} {s}" for s in STATUSES if counts.get(s, 0))]
        ranked = self.ranked
        if ranked.empty:
            lines.append("no layout fits in memory and runs")
        else:
            lines.append(f"{'#':>3}  {'layout':<44} {'step (s)':>10} {'MFU':>6} {'bubble':>7} "
                         f"{'exp.comm':>8} {'peak GB':>8}")
            for i, r in ranked.head(top).iterrows():
                lines.append(f"{i + 1:>3}  {r['label']:<44} {r['step_time_s']:>10.4g} {r['mfu']:>6.1%} "
                             f"{r['bubble_fraction']:>7.1%} {r['exposed_comm_fraction']:>8.1%} "
                             f"{r['peak_memory_bytes'] / 1e9:>8.2f}")
        for title, b in (("best", self.best), ("best without pp", self.best_without_pp)):
            if b is None:
                lines.append(f"{title:<16} none")
            else:
                s = b["summary"]
                lines.append(f"{title:<16} {b['label']}: {s['step_time_s']:.4g} s/step, MFU {s['mfu']:.1%}")
        if self.gap is not None:
            lines.append(f"pipeline parallelism gains {self.gap:.1%} (best without pp is {1 + self.gap:.3f}x slower)"
                         if self.gap > 0 else "the best layout needs no pipeline parallelism")
        return "\n".join(lines)


def search(
    scenario: Union[str, Path, Mapping],
    out: Optional[Union[str, Path]] = None,
    bounds: Optional[SearchBounds] = None,
    client=None,
    jobs: Optional[int] = None,
    progress: bool = False,
    executor=None,
) -> SearchResult:
    """Search the layouts of ``scenario`` (path or mapping) within ``bounds`` (see the module
    notes). ``client`` / ``jobs`` / ``progress`` / ``executor`` as for :func:`simulator.sweep.sweep`."""
    bounds = bounds or SearchBounds()
    if isinstance(scenario, (str, Path)):
        base = _absolutise(read_mapping(scenario), Path(scenario).resolve().parent)
    elif isinstance(scenario, Mapping):
        base = copy.deepcopy(dict(scenario))
    else:
        raise ScenarioError("", f"expected a scenario path or mapping, got {type(scenario).__name__}")
    sc0 = load_scenario(base)
    hbm = sc0.cluster.chip.hbm_bytes
    records, cases, by_key = [], [], {}
    net = NetModel(sc0.cluster, sc0.network_calibration())  # one cache of collective times for every candidate
    for i, p in enumerate(enumerate_layouts(sc0, bounds)):
        mapping = candidate_mapping(base, p, sc0.name)
        rec = {"candidate": i, "label": label(p), **p, "status": None, "reason": None, "est_memory_bytes": None,
               "est_step_time_s": None}
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
        else:
            rec["est_memory_bytes"] = est["total"]
            rec["_micro_batches"] = sc.training.micro_batches(sc.layout.dp)
            if est["total"] > hbm * (1 + PRUNE_TOLERANCE):
                rec.update(status="pruned", reason=(
                    f"estimated {est['total'] / 1e9:.2f} GB (weights {est['weights'] / 1e9:.2f}, gradients "
                    f"{est['gradients'] / 1e9:.2f}, optimizer {est['optimizer'] / 1e9:.2f}, activations "
                    f"{est['activations'] / 1e9:.2f} on stage {est['stage']}) > HBM {hbm / 1e9:.2f} GB"))
            elif key in by_key:
                rec.update(status="invalid", reason=f"same scenario as candidate {by_key[key]}")
            else:
                by_key[key] = i
                rec["est_step_time_s"] = proxy_cost(p, rec["_micro_batches"], sc, net)
                rec["_key"], rec["_mapping"] = key, mapping
                cases.append(Case(index=i, axes={k: p[k] for k in LAYOUT_KEYS}, scenario=mapping, key=key,
                                  resolved=resolved))
        records.append(rec)
    if bounds.max_candidates is not None and len(cases) > bounds.max_candidates:
        order = sorted(cases, key=lambda c: (records[c.index]["est_step_time_s"], c.index))
        chosen = order[:bounds.max_candidates]
        if bounds.max_candidates > 1 and not any(records[c.index]["pp"] == 1 for c in chosen):
            # Keep the comparison with the best layout without pipeline parallelism possible.
            no_pp = [c for c in order if records[c.index]["pp"] == 1]
            if no_pp:
                chosen = chosen[:-1] + no_pp[:1]
        keep = {c.index for c in chosen}
        for c in cases:
            if c.index not in keep:
                records[c.index].update(status="skipped", reason=(
                    f"over max_candidates = {bounds.max_candidates} (ranked by the analytic step-time estimate)"))
        cases = [c for c in cases if c.index in keep]
    _, rows = run_cases(cases, LAYOUT_KEYS, out=out, client=client, jobs=jobs, progress=progress,
                        desc=f"search {sc0.name}", executor=executor)
    summaries: dict[int, dict] = {}
    for c in cases:
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
    table = pd.DataFrame.from_records(
        [{k: v for k, v in r.items() if not k.startswith("_")} for r in records],
        columns=["candidate", "label", *LAYOUT_KEYS, "status", "reason", "est_memory_bytes", "est_step_time_s",
                 *SUMMARY_COLUMNS])

    def pick(mask) -> Optional[dict]:
        ok = table[(table["status"] == "ok") & mask]
        if ok.empty:
            return None
        i = int(ok.sort_values(["step_time_s", "candidate"], kind="stable").iloc[0]["candidate"])
        return {"scenario": records[i]["_mapping"], "summary": summaries[i], "label": records[i]["label"]}

    result = SearchResult(table=table, best=pick(table["pp"] > 0), best_without_pp=pick(table["pp"] == 1),
                          hbm_bytes=hbm, name=sc0.name)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"csv": out / SEARCH_CSV, "best": out / BEST_JSON}
        _atomic_write(paths["csv"], lambda p: table.to_csv(p, index=False))
        _atomic_write(paths["best"], lambda p: p.write_text(json.dumps(result.best_json(), indent=2,
                                                                       default=str) + "\n"))
        result.paths = paths
    return result
