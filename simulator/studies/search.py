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
(:func:`simulator.studies.sweep.check_scenario`: status ``invalid`` with the reason) and
its memory estimated with the closed forms of :mod:`workloads.memory`
(:func:`simulator.studies.estimate.estimate_memory`: weights, gradients and optimizer states via
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
(:func:`simulator.studies.estimate.estimate_step_time`, column ``est_step_time_s``): compute on the roofline, the
schedule's bubble in closed form, and the communication of each parallel axis at the
bandwidth its group sees (scale-up links inside a domain, NICs across domains, the
ICI links of a torus box). ``max_candidates`` caps how many layouts are simulated:
the candidates are then ranked by that estimate (:func:`simulator.studies.estimate.proxy_cost`), the best-ranked
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
import hashlib
import json
import math
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import pandas as pd

from simulator.studies.estimate import NetModel, estimate_memory, proxy_cost
from simulator.scenario.loading import load_scenario, read_mapping
from simulator.scenario.schema import ScenarioError
from simulator.studies.sweep import (
    Case,
    _absolutise,
    _atomic_write,
    canonical_json,
    check_scenario,
    resolve,
    run_cases,
    set_dotted,
)
from topologies.networks import SwitchedNetwork
from workloads import memory
from workloads.enums import RECOMPUTE_MODES
from workloads import schedules as sched

LAYOUT_KEYS = ("tp", "pp", "dp", "cp", "ep", "vpp", "schedule", "zero", "micro_batch_size", "recompute")
STATUSES = ("ok", "oom", "failed", "pruned", "invalid", "skipped", "duplicate")
SUMMARY_COLUMNS = (
    "step_time_s",
    "mfu",
    "tokens_per_s",
    "peak_memory_bytes",
    "bubble_fraction",
    "exposed_comm_fraction",
)
SEARCH_CSV, BEST_JSON = "search.csv", "best.json"
# A layout is pruned only when its memory estimate exceeds the chip's memory by more than
# this share: the closed forms and the trace's accounting differ by well under 0.1 % on
# the test scenarios (tests/test_search.py), so nothing that would fit is dropped.
PRUNE_TOLERANCE = 0.01
# The adaptive search (bounds.estimate_margin, the default) simulates layouts in the order
# of their analytic estimate E and stops when every layout left has E >= S_best (1 + a):
# such a layout's simulated step E / (1 + e) is no shorter than S_best as long as its
# estimate's relative error e = E / S - 1 is at most the allowance a = (largest e seen on
# the layouts simulated so far, at least 0) + ESTIMATE_MARGIN (the same with pp = 1 for the
# best layout without pipeline parallelism). The margin covers the errors of layouts not
# yet simulated beyond those seen. Measured on the 32 layouts simulated in the DeepSeek-V3
# searches of docs/results/search (with the DualPipe pair model of simulator.studies.estimate):
# e in -4.1 .. +2.9 % on 2,048 H800, -0.9 .. +6.1 % on 2,304 GB200, so the largest error of
# a search exceeds the smallest by 7 %; the layouts simulated first are those the estimate
# ranks best, which are also those it most underestimates, so the allowance must reach
# beyond the largest error seen among them by about the spread: 5 % plus what the search
# observes (on a small search whose errors reach +80 %, tests/test_search.py, the seen
# overestimates widen the allowance themselves).
ESTIMATE_MARGIN = 0.05


@dataclass(frozen=True)
class SearchBounds:
    """What :func:`search` may vary. ``None`` means: for ``max_tp`` the scale-up domain,
    for ``max_pp`` / ``max_ep`` no bound, for ``zero`` / ``micro_batch_sizes`` the
    scenario's own value only, for ``estimate_margin`` simulate every layout that fits
    (``max_candidates`` still caps). ``estimate_margin``: simulate only layouts whose
    analytic estimate is within this share of the best estimate (see
    :data:`ESTIMATE_MARGIN`)."""

    max_tp: Optional[int] = None
    max_pp: Optional[int] = None
    max_cp: int = 1
    max_ep: Optional[int] = None
    max_vpp: int = 4
    schedules: tuple[str, ...] = tuple(sched.SCHEDULES)
    zero: Optional[tuple[int, ...]] = None
    micro_batch_sizes: Optional[tuple[int, ...]] = None
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    max_candidates: Optional[int] = None
    estimate_margin: Optional[float] = ESTIMATE_MARGIN

    def __post_init__(self) -> None:
        for name in ("max_tp", "max_pp", "max_ep", "max_candidates"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ScenarioError(f"bounds.{name}", f"must be a positive integer or None, got {v!r}")
        for name in ("max_cp", "max_vpp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ScenarioError(f"bounds.{name}", f"must be a positive integer, got {v!r}")
        m = self.estimate_margin
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not m >= 0):
            raise ScenarioError("bounds.estimate_margin", f"must be a number >= 0 or None, got {m!r}")
        if not self.schedules or any(s not in sched.SCHEDULES for s in self.schedules):
            raise ScenarioError(
                "bounds.schedules",
                f"must be a non-empty list of {', '.join(sched.SCHEDULES)}; got {list(self.schedules)}",
            )
        if self.zero is not None and (not self.zero or any(z not in (0, 1, 2, 3) for z in self.zero)):
            raise ScenarioError("bounds.zero", f"must be a non-empty list of 0, 1, 2, 3; got {list(self.zero)}")
        if self.micro_batch_sizes is not None and (
            not self.micro_batch_sizes
            or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in self.micro_batch_sizes)
        ):
            raise ScenarioError(
                "bounds.micro_batch_sizes",
                f"must be a non-empty list of positive integers; got {list(self.micro_batch_sizes)}",
            )
        if not self.recompute or any(r not in memory.RECOMPUTE_MODES for r in self.recompute):
            raise ScenarioError(
                "bounds.recompute",
                f"must be a non-empty list of {', '.join(memory.RECOMPUTE_MODES)}; got {list(self.recompute)}",
            )


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
                    eps = [
                        e
                        for e in _divisors(dp * cp)
                        if model.moe.experts % e == 0 and (bounds.max_ep is None or e <= bounds.max_ep)
                    ]
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
                                        out.append(
                                            {
                                                "tp": tp,
                                                "pp": pp,
                                                "dp": dp,
                                                "cp": cp,
                                                "ep": ep,
                                                "vpp": vpp,
                                                "schedule": schedule,
                                                "zero": zero,
                                                "micro_batch_size": mb,
                                                "recompute": rc,
                                            }
                                        )
    return out


def candidate_mapping(base: Mapping, p: Mapping, name: str) -> dict:
    """The scenario mapping of one layout: ``base`` (the scenario as given) with its
    parallel layout, schedule, micro-batch size and recompute mode replaced; every other
    field (model, cluster, sequence length, batch, dtype, ...) kept as it was."""
    par = dict(base.get("parallel") or {})
    etp = p["tp"] if par.get("etp", 1) > 1 and par.get("etp") == par.get("tp") else 1
    par.update(
        tp=p["tp"],
        pp=p["pp"],
        dp=p["dp"],
        cp=p["cp"],
        ep=p["ep"],
        vpp=p["vpp"],
        zero=p["zero"],
        etp=etp,
        pipeline_layers="auto",
    )
    out = set_dotted(base, "parallel", par)
    out = set_dotted(out, "schedule", p["schedule"])
    out = set_dotted(out, "training.micro_batch_size", p["micro_batch_size"])
    out = set_dotted(out, "training.recompute", p["recompute"])
    return set_dotted(out, "name", f"{name}:{label(p)}")


def _resolved_key(resolved: Mapping, **training) -> str:
    """SHA-256 of a resolved scenario with some ``training`` fields replaced."""
    r = dict(resolved)
    r["training"] = {**r["training"], **training}
    return hashlib.sha256(canonical_json(r).encode()).hexdigest()


def _workers(jobs: Optional[int], client) -> int:
    """How many layouts one round of the adaptive search simulates at once."""
    if client is not None:
        return 8
    if jobs is None:
        from simulator.studies.sweep import default_jobs

        return default_jobs()
    return max(1, jobs)


def _cap(cases: list, records: list, bounds: SearchBounds) -> list:
    """At most ``bounds.max_candidates`` cases, best estimates first, keeping the best-ranked
    layout without pipeline parallelism when the cap is at least 2; the rest ``skipped``."""
    if bounds.max_candidates is None or len(cases) <= bounds.max_candidates:
        return cases
    order = sorted(cases, key=lambda c: (records[c.index]["est_step_time_s"], c.index))
    chosen = order[: bounds.max_candidates]
    if bounds.max_candidates > 1 and not any(records[c.index]["pp"] == 1 for c in chosen):
        # Keep the comparison with the best layout without pipeline parallelism possible.
        no_pp = [c for c in order if records[c.index]["pp"] == 1]
        if no_pp:
            chosen = chosen[:-1] + no_pp[:1]
    keep = {c.index for c in chosen}
    for c in cases:
        if c.index not in keep:
            records[c.index].update(
                status="skipped",
                reason=(f"over max_candidates = {bounds.max_candidates} (ranked by the analytic step-time estimate)"),
            )
    return [c for c in cases if c.index in keep]


def family(r: Mapping) -> tuple:
    """The estimate's error is systematic by schedule, by whether there is a pipeline and by
    ZeRO stage (measured: DeepSeek-V3 on H800, DualPipe -4 .. +3 %, 1F1B -1 .. +0.4 %; a
    small MoE, pp = 1 -4 %, pp = 2 +10 %): :func:`bounds_from_simulated` allows each such
    family its own largest error."""
    return r["schedule"], r["pp"] == 1, r["zero"]


def bounds_from_simulated(records: Sequence[Mapping], margin: float):
    """``(allowance, best, best without pp)`` of the adaptive search from the layouts simulated
    so far (``records`` with ``est_step_time_s``, ``step_time_s``, ``status``, ``pp``,
    ``schedule``, ``zero``). ``allowance(r)``: the largest overestimate ``est / simulated - 1``
    (at least 0) seen in ``r``'s :func:`family` (in any family while none of its own has
    run) plus ``margin``. A layout ``r`` whose estimate is at least ``best x (1 +
    allowance(r))`` cannot be faster than the best simulated step as long as its estimate
    overestimates by no more than its allowance. ``best`` / ``best without pp`` are the
    best simulated steps that fit (``inf`` while none has run)."""
    seen: dict = {}
    for r in records:
        if r.get("step_time_s") and r["status"] in ("ok", "oom") and r.get("est_step_time_s") is not None:
            e = max(0.0, r["est_step_time_s"] / r["step_time_s"] - 1)
            f = family(r)
            seen[f] = max(seen.get(f, 0.0), e)
    overall = max(seen.values(), default=0.0)

    def allowance(r: Mapping) -> float:
        return seen.get(family(r), overall) + margin

    ok = [r for r in records if r["status"] == "ok" and r.get("step_time_s")]
    best = min((r["step_time_s"] for r in ok), default=math.inf)
    best_no_pp = min((r["step_time_s"] for r in ok if r["pp"] == 1), default=math.inf)
    return allowance, best, best_no_pp


# The first round samples the best-estimated layout of each family whose best estimate is
# within this share of the best estimate, so that the allowance knows each family's error.
FAMILY_SAMPLE_SHARE = 0.5


def _adaptive(cases: list, records: list, bounds: SearchBounds, dedupe, run, width: int) -> None:
    """Simulate in rounds, best estimates first, until no layout left can beat the best
    simulated one, with and without pipeline parallelism (:func:`bounds_from_simulated`).
    The first round runs the best-estimated layout of each :func:`family` (within
    :data:`FAMILY_SAMPLE_SHARE` of the best estimate) and with pp = 1; each later round the
    next ``width`` that could still win. At most ``bounds.max_candidates`` are simulated.
    What is left gets status ``skipped``."""
    rec = lambda c: records[c.index]  # noqa: E731
    pending = sorted(cases, key=lambda c: (rec(c)["est_step_time_s"], c.index))
    done: list = []
    simulated = 0
    cap = bounds.max_candidates if bounds.max_candidates is not None else math.inf

    def could_win(c, allowance, best, best_no_pp) -> bool:
        r = rec(c)
        e, a = r["est_step_time_s"], allowance(r)
        return e < best * (1 + a) or (r["pp"] == 1 and e < best_no_pp * (1 + a))

    first = []
    if pending:
        top = rec(pending[0])["est_step_time_s"]
        fams = set()
        for c in pending:
            f = family(rec(c))
            if f not in fams and rec(c)["est_step_time_s"] <= top * (1 + FAMILY_SAMPLE_SHARE):
                fams.add(f)
                first.append(c)
        no_pp = [c for c in pending if rec(c)["pp"] == 1]
        if no_pp and no_pp[0] not in first:
            first.append(no_pp[0])
    while pending and simulated < cap:
        if first:
            eligible, first = first, []
        else:
            state = bounds_from_simulated([rec(c) for c in done], bounds.estimate_margin)
            eligible = [c for c in pending if could_win(c, *state)]
        if not eligible:
            break
        batch = []
        for c in eligible:
            if len(batch) >= max(width, 1) and done or simulated + len(batch) >= cap:
                break
            pending.remove(c)
            if dedupe.is_duplicate(c):
                continue
            batch.append(c)
        if batch:
            run(batch)
            done += batch
            simulated += len(batch)
        for i, j in dedupe.dropped.items():
            if records[i].get("step_time_s") is None:
                for k in SUMMARY_COLUMNS:
                    records[i][k] = records[j].get(k)
    allowance, best, best_no_pp = bounds_from_simulated([rec(c) for c in done], bounds.estimate_margin)
    for c in pending:
        r = rec(c)
        if simulated >= cap:
            r.update(
                status="skipped",
                reason=f"over max_candidates = {bounds.max_candidates} (ranked by the analytic step-time estimate)",
            )
        else:
            r.update(
                status="skipped",
                reason=(
                    f"estimated {r['est_step_time_s']:.4g} s: cannot beat the best simulated step "
                    f"({best:.4g} s; {best_no_pp:.4g} s with pp = 1) unless the estimate overestimates it by more "
                    f"than {allowance(r):.1%}: the largest overestimate seen in its family plus "
                    f"estimate_margin = {bounds.estimate_margin:g}"
                ),
            )


def trace_fingerprint(trace) -> str:
    """SHA-256 of what the engine simulates in a trace: its ops (with their kernels, sizes,
    dependencies and memory deltas), ranks, weights, static memory, world size and FLOP
    counts (not its notes). Compared within one process only (pickles of equal objects)."""
    h = hashlib.sha256()
    h.update(
        pickle.dumps(
            (
                trace.ranks,
                trace.weight,
                trace.static_memory,
                trace.world,
                trace.model_flops,
                trace.representative,
                trace.unexecuted_flops,
            ),
            protocol=4,
        )
    )
    step = 4096
    for k in range(0, len(trace.ops), step):
        h.update(pickle.dumps(trace.ops[k : k + step], protocol=4))
    return h.hexdigest()


# Scenario fields the simulation reads only through the trace it builds
# (simulator.simulate: the engine gets the trace, the cluster, the layout, the chip's
# calibrations, the dtype, perturbations and algorithms; the summary echoes the name and
# the schedule).
TRACE_ONLY_FIELDS = ("name", "schedule", "training.recompute")


class _Dedupe:
    """Finds the layouts that provably simulate identically to one already chosen: the
    resolved scenarios are equal but for :data:`TRACE_ONLY_FIELDS` and the built traces have
    the same :func:`trace_fingerprint`. Only layouts with equal memory and step-time
    estimates are compared (different estimates: left alone), so traces are built only for
    those. A duplicate gets status ``duplicate`` and, once it has run, the figures of the
    layout it repeats; ``dropped`` maps it to that layout."""

    def __init__(self, records: list):
        self.records = records
        self.groups: dict = {}
        self.fingerprints: dict = {}
        self.dropped: dict = {}

    def _key(self, i: int):
        r = self.records[i]
        rs = {k: v for k, v in r["_resolved"].items() if k not in ("name", "schedule")}
        return _resolved_key(rs, recompute=None), r["est_step_time_s"], canonical_json(r["_memory"])

    def _fingerprint(self, i: int) -> Optional[str]:
        if i not in self.fingerprints:
            from workloads.trace.builder import build_trace

            try:
                self.fingerprints[i] = trace_fingerprint(build_trace(self.records[i]["_sc"].workload()))
            except ValueError:  # LayoutError, ScheduleError, TraceError: simulated (and failed) alone
                self.fingerprints[i] = None
        return self.fingerprints[i]

    def is_duplicate(self, c) -> bool:
        members = self.groups.setdefault(self._key(c.index), [])
        if members:
            fp = self._fingerprint(c.index)
            for j in members:
                if fp is not None and self._fingerprint(j) == fp:
                    self.dropped[c.index] = j
                    self.records[c.index].update(
                        status="duplicate",
                        reason=(
                            f"simulates identically to candidate {j} ({self.records[j]['label']}): the same trace, "
                            f"and the same scenario but for {' / '.join(TRACE_ONLY_FIELDS)}"
                        ),
                    )
                    return True
        members.append(c.index)
        return False


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
        strip = lambda b: None if b is None else {"scenario": b["scenario"], "summary": b["summary"]}
        return {"best": strip(self.best), "best_without_pp": strip(self.best_without_pp), "gap": self.gap}

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
                lines.append(f"{title:<16} {b['label']}: {s['step_time_s']:.4g} s/step, MFU {s['mfu']:.1%}")
        if self.gap is not None:
            lines.append(
                f"pipeline parallelism gains {self.gap:.1%} (best without pp is {1 + self.gap:.3f}x slower)"
                if self.gap > 0
                else "the best layout needs no pipeline parallelism"
            )
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
    notes). ``client`` / ``jobs`` / ``progress`` / ``executor`` as for :func:`simulator.studies.sweep.sweep`."""
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
                rec.update(
                    status="pruned",
                    reason=(
                        f"estimated {est['total'] / 1e9:.2f} GB (weights {est['weights'] / 1e9:.2f}, gradients "
                        f"{est['gradients'] / 1e9:.2f}, optimizer {est['optimizer'] / 1e9:.2f}, activations "
                        f"{est['activations'] / 1e9:.2f} on stage {est['stage']}) > HBM {hbm / 1e9:.2f} GB"
                    ),
                )
            elif key in by_key:
                rec.update(status="invalid", reason=f"same scenario as candidate {by_key[key]}")
            else:
                by_key[key] = i
                # The estimate reads training.recompute only as "full or not" (simulator.studies.estimate):
                # layouts differing only in none / selective share one evaluation.
                ekey = _resolved_key(resolved, recompute="full" if p["recompute"] == "full" else "not-full")
                if ekey not in est_cache:
                    est_cache[ekey] = proxy_cost(p, rec["_micro_batches"], sc, net)
                rec["est_step_time_s"] = est_cache[ekey]
                rec["_key"], rec["_mapping"], rec["_resolved"], rec["_sc"] = key, mapping, resolved, sc
                rec["_memory"] = est
                cases.append(
                    Case(index=i, axes={k: p[k] for k in LAYOUT_KEYS}, scenario=mapping, key=key, resolved=resolved)
                )
        records.append(rec)
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

    dedupe = _Dedupe(records)
    if bounds.estimate_margin is None:
        batch = []
        for c in _cap(cases, records, bounds):
            if not dedupe.is_duplicate(c):
                batch.append(c)
        run(batch, executor)
    else:
        own_pool = None
        ex = executor
        width = _workers(jobs, client)
        if ex is None and client is None and width > 1:
            from simulator.studies.workers import process_pool

            ex = own_pool = process_pool(width)  # one pool for every round
        try:
            _adaptive(cases, records, bounds, dedupe, lambda batch: run(batch, ex), max(2, width))
        finally:
            if own_pool is not None:
                own_pool.shutdown(cancel_futures=True)
    duplicates = dedupe.dropped
    for i, j in duplicates.items():  # i simulates identically to j
        src = records[j]
        for k in SUMMARY_COLUMNS:
            records[i][k] = src.get(k)
        if src["status"] not in ("ok", "oom"):
            records[i].update(status=src["status"], reason=src["reason"])
    table = pd.DataFrame.from_records(
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

    def pick(mask) -> Optional[dict]:
        ok = table[(table["status"] == "ok") & mask]
        if ok.empty:
            return None
        i = int(ok.sort_values(["step_time_s", "candidate"], kind="stable").iloc[0]["candidate"])
        return {"scenario": records[i]["_mapping"], "summary": summaries[i], "label": records[i]["label"]}

    result = SearchResult(
        table=table, best=pick(table["pp"] > 0), best_without_pp=pick(table["pp"] == 1), hbm_bytes=hbm, name=sc0.name
    )
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"csv": out / SEARCH_CSV, "best": out / BEST_JSON}
        _atomic_write(paths["csv"], lambda p: table.to_csv(p, index=False))
        _atomic_write(
            paths["best"], lambda p: p.write_text(json.dumps(result.best_json(), indent=2, default=str) + "\n")
        )
        result.paths = paths
    return result
