"""Steady-state skipping: a step of ``m`` micro-batches from two shorter runs that repeat.

A pipeline schedule's step is a warm-up, a steady phase in which every stage runs the same
ops each ``k`` micro-batches, and a cool-down. A run of ``m1`` micro-batches and one of
``m1 + k`` differ only in the steady phase, which the longer one holds one period (``P_s``
ops on stream ``s``) more of. If, inside the shorter run, the engine's op records repeat
exactly -- on every stream of every rank, every op in a window of time at least two
periods long has a copy ``P_s`` ops later that starts and ends ``delta`` later, with one
``delta`` for every stream, and a stream with no ops per period runs none in the window --
then the relative state of the whole simulation (ops in flight, flows and the bytes they
have left, who waits on whom) is the same at the window's start and one period later. The
engine is deterministic and time-invariant, and what follows is the same ops (the rest of
the steady phase, then the same cool-down), so from there on the run repeats the period
until its cool-down: a run of ``m`` micro-batches is the shorter run with ``(m - m1) / k``
periods inserted at the window. Every extensive figure (step time, each rank's compute,
bubble and exposed seconds per axis, FLOPs, events) is then ``x(m1) + n (x(m1 + k) - x(m1))``
and every peak (memory per rank and category) that of the shorter run.

:func:`simulate_steady` runs the two steps, checks the certificate (:func:`certify`: the
records' repetition, and that the longer run's ops are the shorter run's with ``P_s`` ops
inserted inside the repeating stretch, on every stream; :func:`schedule_repeats`, before either
run: every stage's action list for ``m`` micro-batches is the shorter run's with
``(m - m1) / k`` periods inserted), and returns ``None`` where it fails,
so that the caller simulates every micro-batch. Steps whose op timings never settle into an
exact period are common: pipeline sends sharing NVLink links with tensor-parallel
collectives overlap them differently from one micro-batch to the next (a ZB-H1 test step's
sends take 14.7 us in one micro-batch and 24.6 us in another); their summaries are not
affine in ``m`` to better than ~1e-5 (``benchmarks/README.md``), and the certificate refuses
them.

What it gives is the summary record and the per-stage table; not the op-level tables
(events, memory over time, idle spans), which only a full simulation has:
:class:`~simulator.results.result.Result` refuses them for a skipped step, naming the way
to get them. The summary says how it was obtained under ``steady_state``.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from typing import Optional

import numpy as np

#: Records repeat when their shifted times agree to this share of the step time.
TIME_TOLERANCE = 1e-12
#: The two shorter runs may cost at most this share of the full step's micro-batches.
MAX_SHARE = 0.6
#: The first run, all that a try costs where its records have not settled, at most this share.
FIRST_SHARE = 0.2


def runs_for(
    schedule: str, pp: int, m: int, vpp: int = 1, global_aux: bool = False, expert_parallel: bool = False
) -> list[tuple[int, int]]:
    """The try: ``[(m1, k)]`` simulates ``m1`` and ``m1 + k`` micro-batches and certifies a period
    of ``k``; empty where skipping does not apply or would cost too much: both runs together more
    than :data:`MAX_SHARE` of ``m`` micro-batches, or the first run, which is all a try costs when
    its records have not settled (:func:`_settled`), more than :data:`FIRST_SHARE`.

    ``k`` is twice the schedule's own period in micro-batches for 1F1B and ZB-H1 (1) and DualPipe
    (2: one micro-batch from each end): steady phases often settle into a pattern two micro-batches
    long (a 1F1B test step alternates 0 and +1.32 us per micro-batch), and a period of one is one of
    two too; interleaved 1F1B's own, ``pp`` (it runs its micro-batches in groups of ``pp`` per
    chunk; twice that would not fit two periods in a run). ``m1`` leaves a steady phase of several
    periods on every stage, past the warm-up (1F1B and ZB-H1: ``pp - 1`` forwards on stage 0;
    interleaved 1F1B: at most ``2(pp - 1) + (vpp - 1) pp`` forward chunks; DualPipe: ``m >= 2 pp``)
    and the time its records take to settle: ``pp + 8`` (1F1B, ZB-H1), ``4 pp`` (interleaved),
    ``2 pp + 8`` (DualPipe), and ``pp`` more with expert parallelism, whose all-to-alls settle later (the DGX
    Cloud DeepSeek-V3 step on 512 H100, PP8: stage 0's records repeat at 24 micro-batches, not at
    16; on 128 GB200, PP4, stage 0 still had not at 18). GPipe and an all-forward-first step hold
    every micro-batch's activations at once: no steady phase."""
    if global_aux or pp < 2:
        return []
    if schedule in ("1f1b", "zb-h1"):
        m1, k = pp + 8, 2
    elif schedule == "interleaved-1f1b":
        m1, k = 4 * pp, pp
    elif schedule == "dualpipe":
        m1, k = 2 * pp + 8, 4
    else:
        return []
    if expert_parallel:
        m1 += pp
    if (m - m1) % k or m1 + k >= m or 2 * m1 + k > MAX_SHARE * m or m1 > FIRST_SHARE * m:
        return []
    return [(m1, k)]


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
        ok = np.fromiter((a[j] == a[j + P] for j in range(len(a) - P)), dtype=bool, count=len(a) - P)
        # any stretch of at least a period will do (a 1F1B warm-up of pp - 1 forwards repeats too)
        if not any(f == a[:b] + a[b - P : b] * n + a[b:] for b in _stretch_ends(ok, P)):
            return False
    return True


def _stretches(ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends of the maximal stretches ``ok[a:b]`` of True."""
    d = np.diff(np.r_[0, ok.astype(np.int8), 0])
    return np.flatnonzero(d == 1), np.flatnonzero(d == -1)


def _stretch_ends(ok: np.ndarray, length: int) -> list[int]:
    """The ends ``b`` of the stretches ``ok[a:b]`` of True at least ``length`` long."""
    starts, ends = _stretches(ok)
    return [int(e) for s, e in zip(starts, ends) if e - s >= length]


def _streams(trace, raw) -> dict:
    """(rank, stream) -> (signatures, start_s, end_s) of its recorded ops in program order."""
    by: dict = defaultdict(list)
    for rec in raw.records:
        op = rec.op
        by[(op.rank, op.stream)].append((op.id, rec.start_s, rec.end_s, op))
    out = {}
    for key, rows in by.items():
        rows.sort(key=lambda r: r[0])
        sig = [(o.kind, o.name, o.phase, o.chunk, o.layer, o.recompute, o.size_bytes, o.coll, o.axis) for *_, o in rows]
        out[key] = (sig, np.array([r[1] for r in rows]), np.array([r[2] for r in rows]))
    return out


def certify(short, long, delta_s: float, tol_s: float) -> bool:
    """Whether the shorter run's records repeat (see the module doc) with the longer run's extra
    ops per stream as the period, and the longer run's ops are the shorter run's with one period
    inserted inside the repeating stretch. ``short``, ``long``: :func:`_streams` of the two runs."""
    if set(short) != set(long):
        return False
    period = {key: len(long[key][0]) - len(sig) for key, (sig, _, _) in short.items()}
    found = _repeats(short, period, delta_s, tol_s)
    if found is None:
        return False
    for key, b in found.items():  # the longer run: P ops inserted inside the stretch, at b
        sig, sig2, P = short[key][0], long[key][0], period[key]
        if sig2[:b] != sig[:b] or sig2[b + P :] != sig[b:]:
            return False
    return all(short[key][0] == long[key][0] for key, P in period.items() if P == 0)


def _repeats(streams, period: dict, delta_s: float, tol_s: float) -> Optional[dict]:
    """Where each stream's records repeat: ``{stream: b}`` (ops ``a .. b-1`` of the longest stretch
    each have a copy ``period[stream]`` ops later, ``delta_s`` later to ``tol_s``), if every stream
    with a period has a stretch of at least two periods, their stretches share a window of at least
    two periods of time, and no stream without a period runs an op in that window or the period
    after it; else ``None``."""
    if delta_s <= 0:
        return None
    lo, hi, found, idle = -np.inf, np.inf, {}, []
    for key, (sig, s0, e0) in streams.items():
        n, P = len(sig), period.get(key, 0)
        if P < 0:
            return None
        if P == 0:
            idle.append((s0, e0))
            continue
        if n < 3 * P:
            return None
        same = np.fromiter((sig[j] == sig[j + P] for j in range(n - P)), dtype=bool, count=n - P)
        ok = same & (np.abs(s0[P:] - s0[:-P] - delta_s) <= tol_s) & (np.abs(e0[P:] - e0[:-P] - delta_s) <= tol_s)
        run = _longest_true(ok)
        if run is None or run[1] - run[0] < 2 * P:
            return None
        a, b = run
        found[key] = b
        lo, hi = max(lo, s0[a]), min(hi, e0[b - 1])
    if not found or hi - lo < 2 * delta_s:
        return None
    for s0, e0 in idle:
        if np.any((s0 < hi + delta_s) & (e0 > lo)):
            return None
    return found


def _settled(trace, streams, k: int, tol_frac: float) -> bool:
    """A cheap test of one run before the second is simulated: whether its records already repeat
    with the period of ``k`` micro-batches, estimated from the run alone (each stream's ops of one
    micro-batch from the middle of the steady phase, times ``k``; the shift from the last pipeline
    stage's compute stream). The certificate proper (:func:`certify`) still decides."""
    m = max((op.mb for op in trace.ops), default=-1) + 1
    mid = m // 2
    per_mb: dict = defaultdict(int)
    for op in trace.ops:
        if op.mb == mid and (op.kernels or op.kind != "compute"):  # ops that leave a record
            per_mb[(op.rank, op.stream)] += 1
    period = {key: k * per_mb.get(key, 0) for key in streams}
    last = max(trace.ranks)
    ref = streams.get((last, "compute"))
    P = period.get((last, "compute"), 0)
    if ref is None or P == 0 or len(ref[0]) < 3 * P:
        return False
    sig, s0, _ = ref
    shifts = [s0[j + P] - s0[j] for j in range(len(sig) - P) if sig[j] == sig[j + P]]
    if not shifts:
        return False
    delta = float(np.median(shifts))
    return _repeats(streams, period, delta, tol_frac * float(max(s0.max(), delta))) is not None


def _longest_true(ok: np.ndarray) -> Optional[tuple[int, int]]:
    """``(a, b)`` of the longest stretch ``ok[a:b]`` of True (the first of equal length), or None."""
    if not ok.any():
        return None
    starts, ends = _stretches(ok)
    i = int(np.argmax(ends - starts))
    return int(starts[i]), int(ends[i])


class _Extend:
    """Figures of the two runs extended to ``n`` periods past the shorter one."""

    def __init__(self, n: float):
        self.n = n

    def __call__(self, a, b):
        a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        return a + self.n * (b - a)


def _with_micro_batches(sc, m: int):
    """The scenario with ``m`` micro-batches per data-parallel replica (the global batch scaled)."""
    t = sc.training
    return dataclasses.replace(
        sc, training=dataclasses.replace(t, global_batch_size=m * t.micro_batch_size * sc.layout.dp)
    )


def _peaks(mem) -> tuple:
    """What the summary and the per-stage table read off the memory table: the global peak's row
    (its value, rank and categories), each rank's peak, and the activation and model-state peaks."""
    from workloads.trace.ops import MEMORY_CATEGORIES

    i = int(mem["total"].argmax())
    ranks = np.unique(mem["rank"])
    per_rank = tuple(float(mem["total"][mem["rank"] == r].max()) for r in ranks)
    return (
        float(mem["total"][i]),
        int(mem["rank"][i]),
        tuple(float(mem[c][i]) for c in MEMORY_CATEGORIES),
        tuple(int(r) for r in ranks),
        per_rank,
        float(mem["activations"].max()),
        float((mem["weights"] + mem["gradients"] + mem["optimizer"]).max()),
    )


def simulate_steady(sc, progress=False, engine_options=None):
    """The :class:`~simulator.results.result.Result` of ``sc`` (a resolved Scenario) from two
    shorter runs whose steady phase provably repeats (see the module doc), or ``None`` where
    skipping does not apply or no try's certificate holds (the caller then simulates every
    micro-batch)."""
    from simulator.simulate import _load_engine, _run

    t0 = _load_engine()
    L = sc.layout
    m = sc.training.micro_batches(L.dp)
    global_aux = sc.model.is_moe and sc.training.balance == "aux-loss-global"  # TraceBuilder.global_aux
    topo = None
    ep = sc.model.is_moe and L.ep > 1
    for m1, k in runs_for(sc.schedule, L.pp, m, L.vpp, global_aux=global_aux, expert_parallel=ep):
        if not schedule_repeats(sc.schedule, L.pp, m1, m, k, L.vpp):
            continue
        a = _run(_with_micro_batches(sc, m1), False, topo, None, progress, engine_options)
        topo = a[1]  # the network does not depend on the batch: built once
        short = _streams(a[2], a[3])
        if not _settled(a[2], short, k, TIME_TOLERANCE):
            continue  # not repeating yet: spare the second run
        b = _run(_with_micro_batches(sc, m1 + k), False, topo, None, progress, engine_options)
        step_a, step_b = a[3].step_time_s, b[3].step_time_s
        if certify(short, _streams(b[2], b[3]), step_b - step_a, TIME_TOLERANCE * step_b):
            res = _extend(sc, a, b, m, m1, k)
            if res is not None:
                res.summary["sim_wall_s"] = time.perf_counter() - t0
                return res
    return None


def _extend(sc, short, long, m: int, m1: int, k: int):
    """The Result of ``m`` micro-batches from certified runs at ``m1`` and ``m1 + k`` (``_run``'s
    tuples), or ``None`` if their accounts or peaks do not line up."""
    from simulator.results.result import Result
    from simulator.simulate import _summarise
    from workloads.counts import model_flops_per_step

    (_, topo, t1, r1, mem1), (_, _, t2, r2, mem2) = short, long
    a1, a2 = r1.account, r2.account
    if a1.axes != a2.axes or a1.ranks != a2.ranks or _peaks(mem1) != _peaks(mem2):
        return None
    if t1.notes != t2.notes or t1.weight != t2.weight:
        return None
    ext = _Extend((m - m1) / k)
    step = float(ext(r1.step_time_s, r2.step_time_s))
    fields = ("compute_s", "exposed_s", "offload_wait_s", "bubble_s", "offload_busy_s")
    fields += ("busy_by_axis_s", "exposed_by_axis_s")
    acc = dataclasses.replace(a1, step_s=step, spans=[], **{f: ext(getattr(a1, f), getattr(a2, f)) for f in fields})
    keys = sorted(set(r1.matmul_flops) | set(r2.matmul_flops))
    flops = ext([r1.matmul_flops.get(q, 0.0) for q in keys], [r2.matmul_flops.get(q, 0.0) for q in keys])
    ukeys = sorted(set(t1.unexecuted_flops) | set(t2.unexecuted_flops))
    unexec = ext([t1.unexecuted_flops.get(q, 0.0) for q in ukeys], [t2.unexecuted_flops.get(q, 0.0) for q in ukeys])
    raw = dataclasses.replace(
        r1,
        records=[],
        step_time_s=step,
        idle=acc.per_rank(),
        idle_spans=[],
        account=acc,
        mem_events=[],
        matmul_flops={q: float(v) for q, v in zip(keys, flops)},
        events_processed=int(round(float(ext(r1.events_processed, r2.events_processed)))),
    )
    trace = dataclasses.replace(
        t1,
        model_flops=model_flops_per_step(sc.model, sc.training),
        unexecuted_flops={q: float(v) for q, v in zip(ukeys, unexec) if v},
    )
    summary, per_stage = _summarise(sc, trace, raw, mem1)
    summary["steady_state"] = {"micro_batches_simulated": [m1, m1 + k], "period_micro_batches": k}
    # no raw run nor trace: the op-level tables exist only for a full simulation
    return Result(
        summary=summary, scenario=sc, notes=list(trace.notes), topology=topo, columns={"per_stage": per_stage}
    )
