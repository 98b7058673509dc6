"""Which of a search's layouts are simulated: the ``max_candidates`` cap
(:func:`cap_candidates`), the adaptive rounds in estimate order and their stopping bound
(:func:`adaptive_rounds`, :func:`bounds_from_simulated`), and the layouts that would simulate
identically to one already simulated (:class:`Dedupe`, by :func:`trace_fingerprint`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import operator
import pickle
from collections.abc import Mapping, Sequence

from simulator.studies.search.layouts import SearchBounds
from simulator.studies.sweep.cases import canonical_json

SUMMARY_COLUMNS = (
    "step_time_s",
    "mfu",
    "tokens_per_s",
    "peak_memory_bytes",
    "bubble_fraction",
    "exposed_comm_fraction",
    "tokens_per_s_per_domain",
)


def _resolved_key(resolved: Mapping, **training) -> str:
    """SHA-256 of a resolved scenario with some ``training`` fields replaced."""
    r = dict(resolved)
    r["training"] = {**r["training"], **training}
    return hashlib.sha256(canonical_json(r).encode()).hexdigest()


def cap_candidates(cases: list, records: list, bounds: SearchBounds) -> list:
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
# within this share of the best estimate, so that the allowance knows each family's error: a
# family further off could win only where the estimate overestimates it by more, and the
# largest overestimate among the PP map's 1,412 stored simulations is +16.8 % (Kimi K2,
# DualPipe, `benchmarks/estimate_errors.py`, 2026-12-06). A family not sampled has the largest
# error seen in any family as its allowance. Replayed on the map's store
# (`benchmarks/ppmap_replay.py`, 66 points), 0.2 chooses the same best layout with PP and
# without at every point as 0.5 did, for 24,188 s of stored simulation against 31,452 s;
# 0.1 loses a point's best (Kimi K2 on TPU v6e, PP).
FAMILY_SAMPLE_SHARE = 0.2


def _first_round(pending: list, rec) -> list:
    """The first round of :func:`adaptive_rounds` from ``pending`` (best estimates first):
    the best-estimated layout of each :func:`family` within :data:`FAMILY_SAMPLE_SHARE` of
    the best estimate, the best with pp = 1, and each placement's (``devices_per_domain``)
    best with PP and without, so that layouts are compared per scale-up domain as well as
    per device (a placement that leaves GPUs idle)."""
    first: list = []
    if not pending:
        return first
    top = rec(pending[0])["est_step_time_s"]
    fams = set()
    for c in pending:
        f = family(rec(c))
        if f not in fams and rec(c)["est_step_time_s"] <= top * (1 + FAMILY_SAMPLE_SHARE):
            fams.add(f)
            first.append(c)
    seen = set()
    for c in pending:
        for key in ("no-pp" if rec(c)["pp"] == 1 else None, (rec(c).get("devices_per_domain"), rec(c)["pp"] == 1)):
            if key is not None and key not in seen:
                seen.add(key)
                if c not in first:
                    first.append(c)
    return first


def adaptive_rounds(cases: list, records: list, bounds: SearchBounds, dedupe, run, width: int) -> None:
    """Simulate in rounds, best estimates first, until no layout left can beat the best
    simulated one, with and without pipeline parallelism (:func:`bounds_from_simulated`).
    The first round runs the best-estimated layout of each :func:`family` (within
    :data:`FAMILY_SAMPLE_SHARE` of the best estimate), with pp = 1, and of each placement
    (``devices_per_domain``) with and without PP; each later round the
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

    first = _first_round(pending, rec)
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


#: Prefix of :func:`trace_fingerprint`'s values: a fingerprint kept from an earlier encoding
#: (``OUT/sims/fingerprints.jsonl`` of a map) is not compared with today's
FINGERPRINT_FORMAT = "v2"

# Op fields that hold tuples many ops share (a layer's kernels, its memory deltas): encoded once
# each, by value, and referred to by their index of first appearance
_SHARED_OP_FIELDS = ("kernels", "mem")


def trace_fingerprint(trace) -> str:
    """SHA-256 of what the engine simulates in a trace: its ops (every field of
    :class:`~workloads.trace.ops.Op`: kernels, sizes, dependencies, memory deltas), ranks, weights,
    static memory, world size and FLOP counts (not its notes), as ``"v2:<hex>"``. Equal traces
    give equal fingerprints in any process of the same version: the kernel and memory tuples ops
    share are numbered by value in order of first appearance, so how the builder shared the
    objects does not enter. About twice as fast as pickling every op (0.75 M ops: 1.2 against
    2.3 CPU-s)."""
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
    if trace.ops:
        names = [f.name for f in dataclasses.fields(trace.ops[0])]
        plain = operator.attrgetter(*(n for n in names if n not in _SHARED_OP_FIELDS))
        shared = operator.attrgetter(*_SHARED_OP_FIELDS)
        by_id: dict[int, int] = {}  # the trace holds every object, so no id is reused meanwhile
        by_value: dict = {}
        rows = []
        for op in trace.ops:
            refs = []
            for obj in shared(op):
                i = by_id.get(id(obj))
                if i is None:
                    i = by_id[id(obj)] = by_value.setdefault(obj, len(by_value))
                refs.append(i)
            rows.append((plain(op), *refs))
        step = 65536
        for k in range(0, len(rows), step):
            h.update(pickle.dumps(rows[k : k + step], protocol=4))
        h.update(pickle.dumps((names, list(by_value)), protocol=4))
    return f"{FINGERPRINT_FORMAT}:{h.hexdigest()}"


# Scenario fields the simulation reads only through the trace it builds
# (simulator.simulate: the engine gets the trace, the cluster, the layout, the chip's
# calibrations, the dtype, perturbations and algorithms; the summary echoes the name and
# the schedule).
TRACE_ONLY_FIELDS = ("name", "schedule", "training.recompute")


class Dedupe:
    """Finds the layouts that provably simulate identically to one already chosen: the
    resolved scenarios are equal but for :data:`TRACE_ONLY_FIELDS` and the built traces have
    the same :func:`trace_fingerprint`. Only layouts with equal memory and step-time
    estimates are compared (different estimates: left alone), so traces are built only for
    those. A duplicate gets status ``duplicate`` and, once it has run, the figures of the
    layout it repeats; ``dropped`` maps it to that layout."""

    def __init__(self, records: list, by_workload: dict | None = None):
        self.records = records
        self.groups: dict = {}
        self.fingerprints: dict = {}
        self.dropped: dict = {}
        #: fingerprints by workload (the trace's whole input: ``build_trace`` is a pure function of
        #: it), which several searches may share: a map's points of one domain size differ in
        #: their network only, and their layouts build the same traces
        self.by_workload = {} if by_workload is None else by_workload

    def _key(self, i: int):
        r = self.records[i]
        rs = {k: v for k, v in r["_resolved"].items() if k not in ("name", "schedule")}
        return _resolved_key(rs, recompute=None), r["est_step_time_s"], canonical_json(r["_memory"])

    def _fingerprint(self, i: int) -> str | None:
        if i not in self.fingerprints:
            from workloads.trace.builder import build_trace

            try:
                w = self.records[i]["_sc"].workload()
                if w not in self.by_workload:
                    self.by_workload[w] = trace_fingerprint(build_trace(w))
                self.fingerprints[i] = self.by_workload[w]
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
