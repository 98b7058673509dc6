"""A tiny reference executor for pipeline schedules.

Runs every rank's step list (from :mod:`workloads.schedules`) with fixed
durations per action kind and free, instantaneous communication. It is a pure
list scheduler, not an event engine: each rank runs its steps strictly in
order, and a step starts at the later of the rank becoming free and the end of
the last action it depends on. Because there is no shared resource besides the
rank itself, the result does not depend on the order in which ready steps are
visited. The simulator proper adds communication, contention and real kernel
times; this module exists to check schedules against the published closed
forms and to give quick what-ifs.

Cost model
----------
``durations`` maps an op kind to seconds per action (one micro-batch through
one local chunk), e.g. ``{"F": 1, "B": 2, "I": 1, "W": 1}``. A missing ``B``
defaults to ``I + W``. An overlapped pair step (DualPipe's F&B) occupies the
rank for ``F + B`` (``pair_cost="sum"``: no overlap credit) or ``max(F, B)``
(``"max"``: perfect overlap); both actions of the pair start together and are
complete at the pair's end. How much a real pair saves is decided by the
simulator, which sees the communication it hides.

Dependencies are those documented in :mod:`workloads.schedules`. A schedule
that cannot finish raises :class:`~workloads.schedules.ScheduleError` naming
each stuck rank, the step it is blocked on and the missing predecessor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from workloads.schedules import (
    Action,
    ScheduleError,
    Step,
    in_flight_profile,
    micro_batch_path,
    schedule,
)
from workloads.schedules import (
    all_forward_first as _all_forward_first,
)

PairCost = Literal["sum", "max"]


class TimedAction(NamedTuple):
    """One executed action; unpacks as ``(action, start, end)``, seconds."""

    action: Action
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """Result of :func:`run_schedule`.

    ``ranks[r]`` lists rank ``r``'s actions with start and end in seconds (both
    actions of a pair carry the pair's interval). ``busy[r]`` is the time rank
    ``r`` computes; ``bubble_fraction`` is the idle share of ``pp * makespan``,
    i.e. ``1 - sum(busy) / (pp * makespan)`` (the per-rank idle share averaged
    over ranks). ``peak_in_flight[r]`` is the most micro-batch-chunks whose
    activations rank ``r`` holds at once (freed at ``B``, or at ``W`` when the
    backward is split)."""

    ranks: tuple[tuple[TimedAction, ...], ...]
    makespan: float
    busy: tuple[float, ...]
    bubble_fraction: float
    peak_in_flight: tuple[int, ...]

    @property
    def bubble_time(self) -> tuple[float, ...]:
        """Idle seconds of each rank within the makespan."""
        return tuple(self.makespan - b for b in self.busy)


def _durations(durations: Mapping[str, float]) -> dict[str, float]:
    d = {k: float(v) for k, v in durations.items()}
    for k, v in d.items():
        if k not in ("F", "B", "I", "W"):
            raise ValueError(f"durations: unknown op {k!r}; expected F, B, I, W")
        if not v >= 0:
            raise ValueError(f"durations[{k!r}] must be >= 0 seconds, got {v!r}")
    if "B" not in d and "I" in d and "W" in d:
        d["B"] = d["I"] + d["W"]
    return d


def _per_rank_durations(
    durations: Mapping[str, float] | Sequence[Mapping[str, float]], pp: int
) -> list[dict[str, float]]:
    """One mapping for every rank, or one per rank (e.g. a straggler's stage slower), checked."""
    per_rank = (
        [_durations(d) for d in durations] if not isinstance(durations, Mapping) else [_durations(durations)] * pp
    )
    if len(per_rank) != pp:
        raise ValueError(f"durations: {len(per_rank)} mappings for {pp} ranks")
    return per_rank


class _Passes:
    """The passes an action of :func:`run_schedule` waits for and completes, as ``(kind, micro-batch,
    position on the micro-batch's path)``: kind F, G (input gradient: B or I), W."""

    def __init__(self, paths: Sequence[Sequence[tuple[int, int]]], m: int):
        self.paths, self.m = paths, m
        self.pos = [{rc: s for s, rc in enumerate(p)} for p in paths]  # (rank, chunk) -> position on path

    def key(self, a: Action, rank: int) -> tuple[int, int]:
        m = self.m
        if not 0 <= a.mb < m:
            raise ScheduleError(f"rank {rank}: {a!r} names micro-batch {a.mb} outside 0..{m - 1}", field="schedule")
        s = self.pos[a.mb].get((rank, a.chunk))
        if s is None:
            raise ScheduleError(
                f"rank {rank}: {a!r}: micro-batch {a.mb} never visits local chunk {a.chunk} of rank {rank}",
                field="schedule",
            )
        return a.mb, s

    def needs(self, a: Action, rank: int) -> list[tuple[str, int, int]]:
        mb, s = self.key(a, rank)
        last = len(self.paths[mb]) - 1
        if a.op == "F":
            return [("F", mb, s - 1)] if s > 0 else []
        if a.op == "W":
            return [("G", mb, s)]
        deps = [("F", mb, s)]
        if s < last:
            deps.append(("G", mb, s + 1))
        return deps

    def produces(self, a: Action, rank: int) -> list[tuple[str, int, int]]:
        mb, s = self.key(a, rank)
        if a.op == "F":
            return [("F", mb, s)]
        if a.op == "I":
            return [("G", mb, s)]
        if a.op == "W":
            return [("W", mb, s)]
        return [("G", mb, s), ("W", mb, s)]


def run_schedule(
    steps_per_rank: Sequence[Sequence[Step]],
    durations: Mapping[str, float] | Sequence[Mapping[str, float]],
    m: int,
    name: str = "1f1b",
    vpp: int = 1,
    pair_cost: PairCost = "sum",
) -> Timeline:
    """Execute ``steps_per_rank`` (one step list per pipeline rank).

    ``name``, ``m`` and ``vpp`` fix which ``(rank, local_chunk)`` a micro-batch
    visits next (see :func:`workloads.schedules.micro_batch_path`); the step
    lists themselves may be any order, e.g. a schedule passed through
    :func:`~workloads.schedules.all_forward_first`.

    Raises :class:`ScheduleError` (field ``schedule``) on a deadlock, on an
    action that runs twice, or on an action of a micro-batch outside ``0..m-1``
    or a chunk the rank does not hold; ``ValueError`` for bad durations or
    ``pair_cost``."""
    if pair_cost not in ("sum", "max"):
        raise ValueError(f"pair_cost must be 'sum' or 'max', got {pair_cost!r}")
    pp = len(steps_per_rank)
    per_rank = _per_rank_durations(durations, pp)
    paths = [micro_batch_path(name, j, m, pp, vpp) for j in range(m)]
    passes = _Passes(paths, m)
    needs, produces = passes.needs, passes.produces

    def cost(op: str, rank: int) -> float:
        dur = per_rank[rank]
        if op not in dur:
            raise ValueError(f"durations: no duration given for op {op!r}")
        return dur[op]

    # done[(kind, mb, position)] = end time; kind F, G (input gradient: B or I), W
    done: dict[tuple[str, int, int], float] = {}

    nxt = [0] * pp
    free = [0.0] * pp
    busy = [0.0] * pp
    timed: list[list[TimedAction]] = [[] for _ in range(pp)]
    remaining = sum(len(s) for s in steps_per_rank)
    while remaining:
        progressed = False
        for r in range(pp):
            steps = steps_per_rank[r]
            while nxt[r] < len(steps):
                step = steps[nxt[r]]
                deps = [k for a in step for k in needs(a, r)]
                if any(k not in done for k in deps):
                    break
                start = max([free[r]] + [done[k] for k in deps])
                costs = [cost(a.op, r) for a in step]
                length = max(costs) if (pair_cost == "max" and costs) else sum(costs)
                end = start + length
                for a in step:
                    for k in produces(a, r):
                        if k in done:
                            raise ScheduleError(f"rank {r}: {a!r} runs a pass that already ran", field="schedule")
                        done[k] = end
                    timed[r].append(TimedAction(a, start, end))
                free[r] = end
                busy[r] += length
                nxt[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ScheduleError(
                "deadlock: " + "; ".join(_stuck(steps_per_rank, nxt, needs, done, paths)), field="schedule"
            )

    makespan = max(free, default=0.0)
    bubble = 1.0 - sum(busy) / (pp * makespan) if makespan > 0 else 0.0
    peaks = tuple(max(in_flight_profile(s), default=0) for s in steps_per_rank)
    return Timeline(
        ranks=tuple(tuple(t) for t in timed),
        makespan=makespan,
        busy=tuple(busy),
        bubble_fraction=bubble,
        peak_in_flight=peaks,
    )


def _stuck(steps_per_rank, nxt, needs, done, paths) -> list[str]:
    """One line per unfinished rank: the step it waits at and what it waits for."""
    label = {"F": "F", "G": "B/I", "W": "I"}
    out = []
    for r, steps in enumerate(steps_per_rank):
        if nxt[r] >= len(steps):
            continue
        step = steps[nxt[r]]
        missing = [k for a in step for k in needs(a, r) if k not in done]
        what = ", ".join(
            f"{label[kind]} of micro-batch {mb} chunk {paths[mb][s][1]} on rank {paths[mb][s][0]}"
            for kind, mb, s in missing
        )
        out.append(f"rank {r} blocked at step {nxt[r]} {step!r} waiting for {what}")
    return out


def simulate(
    name: str,
    pp: int,
    m: int,
    durations: Mapping[str, float],
    vpp: int = 1,
    pair_cost: PairCost = "sum",
    all_forward_first: bool = False,
) -> Timeline:
    """Build schedule ``name`` for every rank and run it with :func:`run_schedule`.
    ``all_forward_first`` applies the global-aux-loss constraint first."""
    steps = [schedule(name, r, pp, m, vpp) for r in range(pp)]
    if all_forward_first:
        steps = [_all_forward_first(s) for s in steps]
    return run_schedule(steps, durations, m, name=name, vpp=vpp, pair_cost=pair_cost)
