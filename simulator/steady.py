"""Steady-state skipping: a step of ``m`` micro-batches from a shorter run that provably repeats.

A pipeline schedule's step is a warm-up, a steady phase in which every stage runs the same
ops each ``k`` micro-batches, and a cool-down. Simulate the step with ``m1`` micro-batches
instead. If, inside that run, the engine's op records repeat exactly -- on every stream of
every simulated rank, every op in a window of time at least a period long, which holds the end
of every op in flight at its start, has a copy ``P_s`` ops later (``P_s``: the ops ``k`` more
micro-batches add to the stream) that starts and ends ``delta`` later, with one ``delta`` for
every stream, and a stream with no ops per period runs none in the window -- then the relative state of the whole simulation (ops in
flight, flows and the bytes they have left, who waits on whom) is the same at the window's
start and one period later. (Every op in flight after the window's start is one of the
repeating ops, on every stream, since a stream runs its ops one at a time; so the ops in
flight, and with them the flows' max-min rates, repeat over the window; an op in flight at its
start ends inside it, at ``E``, and its copy ends ``delta`` later; every op in flight between
the start and ``E`` is in the window and has its copy, shifted by ``delta``, so the rates the op
and its copy see until their ends are the same: the bytes each had left at the start and one
period later, the integral of the same rates to the same end, are the same. The copy's end need
not lie in the window.) The
engine is deterministic and time-invariant, and what follows is the same ops (the rest of the
steady phase, then the same cool-down), so the run repeats its period until the cool-down:
the step of ``m`` micro-batches is the shorter run with ``n = (m - m1) / k`` periods inserted
at the window.

:func:`simulate_steady` checks the two halves of that claim -- the schedule's and the ops'
(:func:`schedule_repeats`: every stage's action list for ``m`` is the one for ``m1`` with
``n`` periods inserted; the run's trace is the one of ``m1 - k`` micro-batches, built but not
simulated, with one period of ops inserted inside the repeating stretch, stream by stream) --
and the records' (:func:`certify`), and then builds the full step's busy intervals from the
shorter run's: everything before the window's end, ``n`` copies of the window, the rest
shifted by ``n delta``. The idle accounting runs on them as on a full run's; FLOPs and events
add ``n`` windows' worth; peaks (memory) are the shorter run's, whose periods the inserted ones
copy. Where a check fails it returns ``None`` and the
caller simulates every micro-batch.

Steps whose op timings never settle into an exact period are common: pipeline sends
sharing NVLink links with tensor-parallel collectives overlap them differently from one
micro-batch to the next (a ZB-H1 test step's sends take 14.7 us in one micro-batch and
24.6 us in another); their summaries are not even affine in ``m`` to better than ~1e-5
(``benchmarks/README.md``), and the certificate refuses them.

What it gives is the summary record and the per-stage table; not the op-level tables
(events, memory over time, idle spans), which only a full simulation has:
:class:`~simulator.results.result.Result` refuses them for a skipped step, naming the way
to get them. The summary says how it was obtained under ``steady_state``.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict

import numpy as np

#: Records repeat when their shifted times agree to this share of the step time.
TIME_TOLERANCE = 1e-12
#: The shorter run may cost at most this share of the full step's micro-batches (all a try
#: costs on top of the full simulation where its records have not settled). Half lets
#: interleaved 1F1B skip at ``m = 8 pp``, the common Megatron setting (its run is ``4 pp``):
#: 14 more validation cases, every one certified, 1.1-2.1x faster (``benchmarks/README.md``).
MAX_SHARE = 0.5
#: The same with expert parallelism, whose certificates fail more often (all-to-alls sharing
#: NICs overlap differently from one micro-batch to the next: mbridge-qwen3-235b-256xh100-fp8
#: refuses runs of 40 and 56 of 128), so a try is more often paid on top of the full run.
MAX_SHARE_EXPERT_PARALLEL = 0.4


def runs_for(
    schedule: str,
    pp: int,
    m: int,
    vpp: int = 1,
    global_aux: bool = False,
    expert_parallel: bool = False,
    batch_overlap: bool = False,
) -> list[tuple[int, int]]:
    """The try: ``[(m1, k)]`` simulates ``m1`` micro-batches and certifies a period of ``k``; empty
    where skipping does not apply or its run would cost more than :data:`MAX_SHARE` of ``m``
    (:data:`MAX_SHARE_EXPERT_PARALLEL` with expert parallelism). Each schedule's module of
    :mod:`workloads.pipeline` gives its ``(m1, k)`` (``PipelineSchedule.steady_run``), chosen so:

    ``k`` is twice the schedule's own period in micro-batches for 1F1B and ZB-H1 (1) and DualPipe
    (2: one micro-batch from each end): steady phases often settle into a pattern two micro-batches
    long (a 1F1B test step alternates 0 and +1.32 us per micro-batch), and a period of one is one of
    two too; interleaved 1F1B's own, ``pp`` (it runs its micro-batches in groups of ``pp`` per
    chunk). ``m1`` leaves a steady phase of several periods on every stage, past the warm-up (1F1B
    and ZB-H1: ``pp - 1`` forwards on stage 0; interleaved 1F1B: at most ``2(pp - 1) + (vpp - 1)
    pp`` forward chunks; DualPipe: ``m >= 2 pp``) and the time its records take to settle:
    ``pp + 8`` (1F1B, ZB-H1), ``4 pp`` (interleaved), ``2 pp + 8`` (DualPipe), and with expert
    parallelism, whose all-to-alls settle later, ``2 pp + 12``, ``5 pp`` and ``3 pp + 16`` (the DGX
    Cloud DeepSeek-V3 step on 512 H100, PP8: stage 0's records repeat at 24 and 28 micro-batches,
    not at 16; on 128 GB200, PP4, at 20 and 22, not at 18). Megatron-Core's batch-level overlap of
    the expert all-to-all (``batch_overlap``) settles later still: at least ``8 pp`` (Qwen3-235B on
    256 H100, PP8 VPP4, 128 micro-batches, does not settle within 64: its ops still shift by up to
    0.11 s from one period of 8 to the next; the try would cost more than the 0.4 of the step
    allowed anyway, so that step is simulated whole without a try that would fail). Where the run is more than the
    step allows, the longest run allowed is taken, down to the schedule's shortest
    (``steady_run_shortest``: DualPipe with EP ``4 pp + 8``; DeepSeek-V3 on 2,048 H800 needs 72 of its
    120, more than allowed: it runs whole, without a try). GPipe and an all-forward-first step hold
    every micro-batch's activations at once: no steady phase."""
    from workloads.pipeline import get_schedule

    if global_aux or pp < 2:
        return []
    sched = get_schedule(schedule)
    run = sched.steady_run(pp, vpp, expert_parallel)
    if run is None:
        return []
    m1, k = run
    shortest = sched.steady_run_shortest(pp, vpp, expert_parallel) or m1
    if batch_overlap and m1 < 8 * pp:  # whole periods more, to at least 8 pp
        m1 += -(-(8 * pp - m1) // k) * k
        shortest = m1
    cap = _longest_allowed(m, expert_parallel)
    longest_period = max(sched.steady_multiples(pp, expert_parallel)) * k
    if longest_period > 2 * k:  # whole periods of the longest one tried short of m, where allowed
        up, down = m1 + (m - m1) % longest_period, cap - (cap - m) % longest_period
        if up <= cap:
            m1 = up
        elif shortest <= down:
            m1 = shortest = down
    if m1 > cap and shortest < m1:  # the longest run allowed, down to the shortest
        m1 = cap - (cap - m) % k  # whole periods short of m
        if m1 < shortest:
            return []
    if (m - m1) % k or m1 + k >= m or m1 > cap:
        return []
    return [(m1, k)]


def _longest_allowed(m: int, expert_parallel: bool) -> int:
    """The longest run ``m`` micro-batches allow (:data:`MAX_SHARE`, :data:`MAX_SHARE_EXPERT_PARALLEL`)."""
    return int((MAX_SHARE_EXPERT_PARALLEL if expert_parallel else MAX_SHARE) * m + 1e-9)


def schedule_repeats(schedule: str, pp: int, m1: int, m: int, k: int, vpp: int = 1) -> bool:
    """Whether every stage's action list for ``m`` micro-batches is the one for ``m1`` with
    ``(m - m1) / k`` copies of one period of its steady phase inserted (actions compared by kind
    and chunk, steps as they are paired): the schedule's half of the claim that a longer run is
    a shorter one with periods inserted (:func:`certify` checks the ops of two runs). Pure and
    cheap: the lists only, no ops."""
    from workloads import schedules as sched

    n, rem = divmod(m - m1, k)
    if rem or n < 1:
        return False
    for stage in range(pp):
        a = [tuple((x.op, x.chunk) for x in st) for st in sched.schedule(schedule, stage, pp, m1, vpp)]
        f = [tuple((x.op, x.chunk) for x in st) for st in sched.schedule(schedule, stage, pp, m, vpp)]
        P, rem = divmod(len(f) - len(a), n)
        if rem or P < 1 or len(a) < 2 * P:
            return False
        ok = _same_later(a, P)
        # any stretch of at least a period will do (a 1F1B warm-up of pp - 1 forwards repeats too)
        if not any(f == a[:b] + a[b - P : b] * n + a[b:] for b in _stretch_ends(ok, P)):
            return False
    return True


def _same_later(seq: list, P: int) -> np.ndarray:
    """``out[j] = seq[j] == seq[j + P]`` for every ``j`` with a ``j + P``."""
    return np.fromiter((seq[j] == seq[j + P] for j in range(len(seq) - P)), dtype=bool, count=max(len(seq) - P, 0))


def _periods(run: dict, shorter: dict) -> dict | None:
    """Each stream's period in ops: what the run has more than the trace ``k`` micro-batches
    shorter; ``None`` if the two do not have the same streams."""
    if set(run) != set(shorter):
        return None
    return {key: len(v[0]) - len(shorter[key]) for key, v in run.items()}


def _stretches(ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends of the maximal stretches ``ok[a:b]`` of True."""
    d = np.diff(np.r_[0, ok.astype(np.int8), 0])
    return np.flatnonzero(d == 1), np.flatnonzero(d == -1)


def _stretch_ends(ok: np.ndarray, length: int) -> list[int]:
    """The ends ``b`` of the stretches ``ok[a:b]`` of True at least ``length`` long."""
    starts, ends = _stretches(ok)
    return [int(e) for s, e in zip(starts, ends) if e - s >= length]


def _streams(trace, raw) -> dict:
    """(rank, stream) -> (signatures, start_s, end_s, ops) of its recorded ops in program order
    (the trace's order; times looked up by op id, ids being unique: :meth:`Trace.check`)."""
    recs = raw.records
    ids = np.fromiter((r.op.id for r in recs), dtype=np.int64, count=len(recs))
    n = int(ids.max()) + 1 if len(ids) else 0
    start, end = np.full(n, np.nan), np.full(n, np.nan)
    start[ids] = np.fromiter((r.start_s for r in recs), dtype=float, count=len(recs))
    end[ids] = np.fromiter((r.end_s for r in recs), dtype=float, count=len(recs))
    out = {}
    for key, ops in _recorded(trace).items():
        at = np.fromiter((o.id for o in ops), dtype=np.int64, count=len(ops))
        out[key] = ([_signature(o) for o in ops], start[at], end[at], ops)
    return out


def _signatures(trace) -> dict:
    """(rank, stream) -> the signatures of the ops that leave a record, in program order, of a
    trace built but not simulated."""
    return {key: [_signature(o) for o in ops] for key, ops in _recorded(trace).items()}


def _recorded(trace) -> dict:
    """(rank, stream) -> the trace's ops that leave an engine record (all but compute ops without
    kernels), in program order."""
    by: dict = defaultdict(list)
    for op in trace.ops:
        if op.kernels or op.kind != "compute":
            by[(op.rank, op.stream)].append(op)
    return by


def _signature(o) -> tuple:
    return (o.kind, o.name, o.phase, o.chunk, o.layer, o.recompute, o.size_bytes, o.coll, o.axis)


def certify(run: dict, shorter: dict, delta_s: float, tol_s: float) -> tuple[tuple, dict] | None:
    """``((lo, hi), {stream: ops of one period})``: the window over which the run's records repeat
    (see the module doc), with the ops the run has more than the trace ``k`` micro-batches
    shorter as each stream's period and the run's ops that trace's with one period inserted
    inside the repeating stretch, and each stream's ops of one period there; ``None`` if they do
    not. ``run``: :func:`_streams` of the run; ``shorter``: :func:`_signatures` of the trace ``k``
    micro-batches shorter."""
    period = _periods(run, shorter)
    if period is None:
        return None
    found = _repeats(run, period, delta_s, tol_s)
    if found is None:
        return None
    ends, window = found
    for key, b in ends.items():  # the run: the shorter trace with its P ops [b - P, b) inserted
        sig, sig0, P = run[key][0], shorter[key], period[key]
        if sig0[: b - P] != sig[: b - P] or sig0[b - P :] != sig[b:]:
            return None
    if any(run[key][0] != shorter[key] for key, P in period.items() if P == 0):
        return None
    return window, {key: run[key][3][b - period[key] : b] for key, b in ends.items()}


def _repeats(streams, period: dict, delta_s: float, tol_s: float) -> tuple[dict, tuple] | None:
    """Where each stream's records repeat: ``({stream: b}, (lo, hi))`` -- ops ``a .. b-1`` of each
    stream's longest stretch have a copy ``period[stream]`` ops later, ``delta_s`` later to
    ``tol_s``; the stretches share the window ``[lo, hi]``, at least ``delta_s`` long and holding
    the end of every op in flight at ``lo`` (see the module doc); no stream without a period runs
    an op in it or the period after -- or ``None``."""
    if not delta_s > 0:
        return None
    lo, hi, found, idle, stretches = -np.inf, np.inf, {}, [], []
    for key, (sig, s0, e0, *_) in streams.items():
        n, P = len(sig), period.get(key, 0)
        if P < 0:
            return None
        if P == 0:
            idle.append((s0, e0))
            continue
        if n < 3 * P:
            return None
        ok = (
            _same_later(sig, P)
            & (np.abs(s0[P:] - s0[:-P] - delta_s) <= tol_s)
            & (np.abs(e0[P:] - e0[:-P] - delta_s) <= tol_s)
        )
        run = _longest_true(ok)
        if run is None or run[1] - run[0] < P:
            return None
        a, b = run
        found[key] = b
        stretches.append((s0, e0))
        lo, hi = max(lo, s0[a]), min(hi, e0[b - 1])
    if not found or hi - lo < delta_s or hi < _in_flight_until(stretches, lo):
        return None
    for s0, e0 in idle:
        if np.any((s0 < hi + delta_s) & (e0 > lo)):
            return None
    return found, (float(lo), float(hi))


def _in_flight_until(stretches: list, t: float) -> float:
    """The latest end of the ops in flight at ``t`` (``t`` if none) on streams given as their ops'
    ``(start_s, end_s)`` arrays in program order (a stream runs its ops one at a time, so the
    starts are sorted and at most one op is in flight)."""
    until = t
    for s0, e0 in stretches:
        i = int(np.searchsorted(s0, t, side="right")) - 1
        if i >= 0 and e0[i] > until:
            until = float(e0[i])
    return until


def _shift(streams, period: dict, last_rank: int) -> float:
    """The period's length in time, as the last simulated rank's compute stream shows it: the
    median shift of its ops to their copies one period later (``nan`` if none); :func:`certify`
    then requires every stream to agree with it."""
    ref, P = streams.get((last_rank, "compute")), period.get((last_rank, "compute"), 0)
    if ref is None or P <= 0:
        return float("nan")
    sig, s0 = ref[0], ref[1]
    same = _same_later(sig, P)
    return float(np.median((s0[P:] - s0[:-P])[same])) if same.any() else float("nan")


def _longest_true(ok: np.ndarray) -> tuple[int, int] | None:
    """``(a, b)`` of the longest stretch ``ok[a:b]`` of True (the first of equal length), or None."""
    if not ok.any():
        return None
    starts, ends = _stretches(ok)
    i = int(np.argmax(ends - starts))
    return int(starts[i]), int(ends[i])


def _with_micro_batches(sc, m: int):
    """The scenario with ``m`` micro-batches per data-parallel replica (the global batch scaled)."""
    t = sc.training
    return dataclasses.replace(
        sc, training=dataclasses.replace(t, global_batch_size=m * t.micro_batch_size * sc.layout.dp)
    )


def simulate_steady(sc, progress=False, engine_options=None, tried: list | None = None):
    """The :class:`~simulator.results.result.Result` of ``sc`` (a resolved Scenario) from a shorter
    run whose steady phase provably repeats (see the module doc), or ``None`` where skipping does
    not apply or the certificate fails (the caller then simulates every micro-batch).

    A run is certified for the period :func:`runs_for` gives, else for the longer ones the schedule
    names (``steady_multiples``: twice it, and 24 micro-batches for DualPipe with expert parallelism
    from PP16 on), each screened on the run's records before its trace is built. A second, longer run
    only where the first's records nearly repeat (:data:`NEAR_REPEAT_SHARE`) and the schedule retries
    (``steady_retries``); ``tried`` gets each run's micro-batches. Steps settle into such patterns
    (Kimi K2 TP4 PP8 EP48 DualPipe on 2,304 H100 in 144-GPU domains: each stream's shifts alternate
    between the period and 2.45 ms less, 4 micro-batches apart, and repeat exactly every 8)."""
    from simulator.engine.symmetry import class_budget
    from simulator.scenario.checks import check_step_time
    from simulator.step import load_engine, run_step
    from workloads.pipeline import get_schedule

    t0 = load_engine()
    L = sc.layout
    m = sc.training.micro_batches(L.dp)
    global_aux = sc.model.is_moe and sc.training.balance == "aux-loss-global"  # TraceBuilder.global_aux
    ep = sc.model.is_moe and L.ep > 1
    batch_overlap = ep and sc.training.overlap_moe_expert_parallel_comm
    budget = class_budget(sc.workload())
    tries = runs_for(sc.schedule, L.pp, m, L.vpp, global_aux, ep, batch_overlap)
    sched = get_schedule(sc.schedule)
    multiples, retries = sched.steady_multiples(L.pp, ep), sched.steady_retries()
    runs = tried if tried is not None else []
    while tries:
        m1, k = tries.pop(0)
        if not schedule_repeats(sc.schedule, L.pp, m1, m, k, L.vpp):
            continue
        # the run's idle time is accounted on the full timeline, periods inserted (_extend); it
        # simulates the ranks the full step would (its op budget, not the shorter run's)
        opts = {**(engine_options or {}), "account_idle": False}
        runs.append(m1)
        run = run_step(_with_micro_batches(sc, m1), False, None, None, progress, opts, budget)
        short = _streams(run[2], run[3])
        own = None  # each stream's ops per period of k micro-batches
        for j in multiples:
            kk = j * k
            if j > 1 and (
                (m - m1) % kk
                or m1 <= kk
                or own is None
                or not _screen(short, own, j, run[3])
                or not schedule_repeats(sc.schedule, L.pp, m1, m, kk, L.vpp)
            ):
                continue
            res, period = _certified(sc, run, short, m, m1, kk)
            own = period if j == 1 else own
            if res is not None:
                check_step_time(res.summary["step_time_s"])  # as the full simulation checks its step
                res.summary["steady_state"]["micro_batches_simulated"] = list(runs)  # a retry's first run too
                res.summary["sim_wall_s"] = time.perf_counter() - t0
                return res
        longer = _longer_run(m, m1, k * max(multiples), ep)
        if longer and retries and own is not None and _nearly_repeats(short, own):
            tries.append((longer, k))
    return None


#: A try whose records repeat to this share of their period but not to :data:`TIME_TOLERANCE` has
#: not settled yet: it is tried once more, as long as the step allows (:func:`_longer_run`).
#: DeepSeek-V3 TP4 PP16 EP16 DualPipe in 16-GPU domains, 512 micro-batches: at 104 its ops still
#: move by 2-4 us a period and 0.45 ms once every 24 micro-batches (0.3 %); 200 certifies a period
#: of 24, 12-15 s in all against 4.5 (the try) + 19 (the full run).
NEAR_REPEAT_SHARE = 0.01


def _longer_run(m: int, m1: int, longest_period: int, expert_parallel: bool) -> int | None:
    """The retry's length: the longest run allowed that is whole longest periods short of ``m``,
    where that is at least one such period longer than ``m1``; else None."""
    cap = _longest_allowed(m, expert_parallel)
    longer = cap - (cap - m) % longest_period
    return longer if longer >= m1 + longest_period and longer + longest_period < m else None


def _nearly_repeats(short: dict, own: dict) -> bool:
    """Whether the run's records repeat with each stream's period ``own`` to
    :data:`NEAR_REPEAT_SHARE` of the period's length (:func:`_repeats`' test, with that
    tolerance)."""
    delta = _shift(short, own, max(r for r, _ in short))
    return delta > 0 and _repeats(short, own, delta, NEAR_REPEAT_SHARE * delta) is not None


def _screen(short: dict, own: dict, j: int, raw) -> bool:
    """Whether the run's records repeat with ``j`` times each stream's period ``own`` (ops) over a
    window (:func:`_repeats`): the cheap half of a longer period's certificate, before the trace
    it needs is built."""
    period = {key: j * P for key, P in own.items()}
    delta = _shift(short, period, max(r for r, _ in short))
    return _repeats(short, period, delta, TIME_TOLERANCE * raw.step_time_s) is not None


def _certified(sc, run, short: dict, m: int, m1: int, k: int):
    """``(result, period)``: the Result of ``m`` micro-batches from ``run`` (``run_step``'s tuple
    for ``m1``; ``short``: its :func:`_streams`) where its records and host repeat with a period
    of ``k`` micro-batches (:func:`certify`, :func:`host_repeats`), else ``None``; and each
    stream's ops per period (:func:`_periods`; ``None`` if the traces' streams differ)."""
    from workloads.trace.builder import build_trace

    trace, raw = run[2], run[3]
    w_k = _with_micro_batches(sc, m1 - k).workload()
    if len(trace.ranks) > sc.layout.pp:  # one rank per class (simulator.engine.symmetry.rank_classes)
        trace_k = dataclasses.replace(
            build_trace(w_k, ranks=trace.ranks), representative=True, weight=dict(trace.weight)
        )
    else:
        trace_k = build_trace(w_k, position=min(trace.ranks))  # the run's representatives
    shorter = _signatures(trace_k)
    period = _periods(short, shorter)
    if period is None:
        return None, None
    delta = _shift(short, period, max(trace.ranks))
    tol = TIME_TOLERANCE * raw.step_time_s
    found = certify(short, shorter, delta, tol)
    if found is None or not host_repeats(raw, short, period, found, delta, tol):
        return None, period
    (cut, _), one_period = found
    return _extend(sc, run, trace_k, m, m1, k, delta, cut, one_period), period


def host_repeats(raw, streams: dict, period: dict, found: tuple, delta_s: float, tol_s: float) -> bool:
    """The host stream's half of the certificate (:mod:`simulator.engine.host`): the host's
    issue times are state the op records do not show. On every simulated rank, over one period
    of each stream's repeating stretch (ops ``j`` against their copies ``j + P``), either the
    host issues every op exactly ``delta_s`` later (to ``tol_s``): its state repeats as the GPU's
    does (a host-bound step, or a sync re-aligning it each period); or it issues every copy at
    most ``delta_s`` later (its lead over the GPU does not shrink) and the GPU waited for the host
    on no op starting at or after the window's start: the host then binds nowhere in the periods
    inserted or after them, in the shorter run and the full one alike. Else the step is
    simulated whole.

    The period is the stretch's last, ``[b - P, b)``, or the one before it where the stretch
    holds it: the last period's copies end where the cool-down begins, and the host's program
    differs there (a stage's reductions issued between backwards), which can issue a copy a
    launch later where the steady phase repeats exactly (Megatron-Bridge's DeepSeek-V3 on 256
    GB200: 3 of 668 copies on the last stage 10 us late, with the host 24 ms ahead)."""
    if raw.host is None:
        return True
    ends = {}
    for key, ops in found[1].items():
        allops = streams[key][3]
        ends[key] = next((i for i, o in enumerate(allops) if o is ops[0]), 0) + period[key] if ops else 0
    return any(
        _host_repeats_over(raw, streams, period, ends, back, found[0][0], delta_s, tol_s)
        for back in (1, 2)
        if back == 1 or _stretch_holds(streams, period, ends, back, delta_s, tol_s)
    )


def _stretch_holds(streams: dict, period: dict, ends: dict, back: int, delta_s: float, tol_s: float) -> bool:
    """Whether every stream's ops ``[b - back P, b - (back - 1) P)`` repeat one period later
    (records and times, as :func:`_repeats` checks them): a period inside the stretch."""
    for key, b in ends.items():
        sig, s0, e0 = streams[key][:3]
        P = period[key]
        lo = b - back * P
        if lo < 0:
            return False
        if P == 0:
            continue
        j = np.arange(lo, b - (back - 1) * P)
        same = np.fromiter((sig[x] == sig[x + P] for x in j.tolist()), dtype=bool, count=j.size)
        ok = same & (np.abs(s0[j + P] - s0[j] - delta_s) <= tol_s)
        if not (ok & (np.abs(e0[j + P] - e0[j] - delta_s) <= tol_s)).all():
            return False
    return True


def _host_repeats_over(raw, streams, period, ends, back: int, lo: float, delta_s: float, tol_s: float) -> bool:
    """:func:`host_repeats` over each stream's ops ``[b - back P, b - (back - 1) P)``."""
    issue = raw.host._start
    exact, ahead = defaultdict(lambda: True), defaultdict(lambda: True)
    for key, b in ends.items():
        P, allops = period[key], streams[key][3]
        for j in range(b - back * P, b - (back - 1) * P):
            s0, s1 = issue.get(allops[j].id), issue.get(allops[j + P].id)
            if s0 is None or s1 is None:
                return False
            d = s1 - s0
            exact[key[0]] &= abs(d - delta_s) <= tol_s
            ahead[key[0]] &= d <= delta_s + tol_s
    waited = raw.host_delay_by_op_s  # ops the GPU waited for the host to issue
    late = {rec.op.rank for rec in raw.records if rec.start_s >= lo - tol_s and waited.get(rec.op.id, 0.0) > 0}
    ranks = set(exact) | set(ahead)
    return all(exact[r] or (ahead[r] and r not in late) for r in ranks)


def _extend(sc, run, trace_k, m: int, m1: int, k: int, delta: float, cut: float, one_period: dict):
    """The Result of ``m`` micro-batches from the certified run of ``m1`` (``_run``'s tuple; the
    trace ``k`` micro-batches shorter, ``trace_k``; each stream's ops of one period, ``one_period``):
    the run's busy intervals with ``n = (m - m1) / k`` copies of ``[cut, cut + delta)`` inserted,
    and ``n`` periods' ops more counted."""
    from simulator.engine.accounting import account_intervals, busy_intervals
    from simulator.results.result import Result
    from simulator.results.summary import host_and_overlap_terms, summarise
    from workloads.counts import matmul_flops, model_flops_per_step

    _, topo, trace, raw, mem = run
    n = (m - m1) // k
    ranks = tuple(trace.ranks)  # as Engine.run accounts them
    r, c, s, e, axes = busy_intervals(raw.records, ranks)
    r, c, s, e = _insert_periods(r, c, s, e, cut, delta, n)
    step = raw.step_time_s + n * delta
    acc = account_intervals(r, c, s, e, axes, ranks, step, with_spans=False)
    flops = dict(raw.matmul_flops)
    for ops in one_period.values():
        for op in ops:
            if op.kind == "compute":
                flops[op.rank] = flops.get(op.rank, 0.0) + n * matmul_flops(op.kernels)
    # the host's waits repeat with the periods (host_repeats): one period's more per period
    host_delay = dict(raw.host_delay_s)
    for ops in one_period.values():
        for op in ops:
            late = raw.host_delay_by_op_s.get(op.id)
            if late:
                host_delay[(op.rank, op.layer)] = host_delay.get((op.rank, op.layer), 0.0) + n * late
    raw_full = dataclasses.replace(
        raw,
        host_delay_s=host_delay,
        records=[],
        step_time_s=step,
        idle=acc.per_rank(),
        idle_spans=[],
        account=acc,
        mem_events=[],
        matmul_flops=flops,
        events_processed=raw.events_processed + n * sum(len(ops) for ops in one_period.values()),
    )
    # expert-load imbalance's extra work (timed, not executed): one period's more per period
    u0, u1 = trace_k.unexecuted_flops, trace.unexecuted_flops
    unexec = {q: u1.get(q, 0.0) + n * (u1.get(q, 0.0) - u0.get(q, 0.0)) for q in set(u0) | set(u1)}
    full_trace = dataclasses.replace(
        trace,
        model_flops=model_flops_per_step(sc.model, sc.training),
        unexecuted_flops={q: v for q, v in sorted(unexec.items()) if v},
    )
    summary, per_stage = summarise(sc, full_trace, raw_full, mem, topo)
    extra: dict = defaultdict(int)  # forward dispatches of the inserted periods, by rank
    for ops in one_period.values():
        for op in ops:
            if op.kind == "collective" and op.phase == "F" and op.name.endswith(".dispatch"):
                extra[op.rank] += n
    terms = host_and_overlap_terms(full_trace, raw_full, extra)
    if terms:
        summary["moe_terms_s"].update(terms)
    summary["steady_state"] = {"micro_batches_simulated": [m1], "period_micro_batches": k}
    # no raw run nor trace: the op-level tables exist only for a full simulation
    return Result(
        summary=summary, scenario=sc, notes=list(summary["notes"]), topology=topo, columns={"per_stage": per_stage}
    )


def _insert_periods(r, c, s, e, cut: float, delta: float, n: int):
    """Busy intervals ``(rank, channel, start, end)`` of a run whose timeline repeats over
    ``[cut, cut + 2 delta]``, with ``n`` more periods: the run up to ``cut + delta``, ``n``
    copies of its window ``[cut, cut + delta)`` shifted by ``delta, 2 delta, ...``, and the rest
    shifted by ``n delta`` (intervals cut at the seams: busy time is a union, so pieces of one
    interval count as the interval)."""
    end = cut + delta
    head = s < end
    win = (s < end) & (e > cut)
    tail = e > end
    parts_r, parts_c = [r[head]], [c[head]]
    parts_s, parts_e = [s[head]], [np.minimum(e[head], end)]
    ws, we = np.maximum(s[win], cut), np.minimum(e[win], end)
    for j in range(1, n + 1):
        parts_r.append(r[win])
        parts_c.append(c[win])
        parts_s.append(ws + j * delta)
        parts_e.append(we + j * delta)
    parts_r.append(r[tail])
    parts_c.append(c[tail])
    parts_s.append(np.maximum(s[tail], end) + n * delta)
    parts_e.append(e[tail] + n * delta)
    return (np.concatenate(parts_r), np.concatenate(parts_c), np.concatenate(parts_s), np.concatenate(parts_e))
