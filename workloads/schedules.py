"""Pipeline-parallel schedules as pure functions.

A schedule says, for one pipeline rank, the order in which that rank runs the
forward and backward passes of its model chunks over the micro-batches of one
step. It says nothing about *when* (that is the simulator's business, or the
tiny reference executor in :mod:`workloads.schedule_timing`) nor about
communication or memory sizes.

Vocabulary
----------
* ``pp`` pipeline ranks, ``m`` micro-batches per pipeline per step, ``vpp``
  local model chunks per rank (interleaved schedule only).
* An :class:`Action` is one pass of one micro-batch through one *local* chunk:
  ``F`` forward, ``B`` full backward (input and weight gradients), ``I``
  input-gradient-only backward, ``W`` weight-gradient-only backward. A split
  backward is an ``I`` followed, later and on the same rank, by its ``W``.
* A :data:`Step` is a tuple of actions issued together. It has two actions only
  for DualPipe's overlapped forward/backward pairs, ``(F, B)``, whose two halves
  belong to different micro-batches and different directions and run
  concurrently, so that one half's communication hides behind the other's compute.

Dependencies (what the executor enforces)
-----------------------------------------
Every micro-batch visits the model chunks in pipeline order; :func:`micro_batch_path`
lists the ``(rank, local_chunk)`` it visits. For position ``s`` on that path:
``F(s)`` needs ``F(s-1)``; the backward (``B`` or ``I``) at ``s`` needs the
backward at ``s+1`` (the last position needs its own ``F``), and every backward
needs its own ``F``; ``W(s)`` needs ``I(s)``.

Model chunks
------------
Except for DualPipe, the layers are cut into ``pp * vpp`` model chunks and
chunk ``k`` lives on rank ``k % pp`` as local chunk ``k // pp`` (Megatron's
placement; :class:`workloads.layout.ParallelLayout.layers_per_chunk` uses the
same numbering).

DualPipe (DeepSeek-V3, arXiv 2412.19437 §3.2.1 and Table 2; the public
``deepseek-ai/DualPipe`` code) cuts the layers into ``pp`` stages and stores
each stage on *two* ranks: rank ``r`` holds stage ``r`` as local chunk 0 and
stage ``pp-1-r`` as local chunk 1. Micro-batches ``0 .. m/2-1`` (direction 0)
enter at rank 0 and use local chunk 0 on every rank; micro-batches
``m/2 .. m-1`` (direction 1) enter at rank ``pp-1`` and use local chunk 1. So
for DualPipe the local chunk *is* the direction, every stage's parameters (and
gradients, and optimizer state unless sharded away) exist twice —
:func:`weight_copies` is 2 — and :func:`model_chunks` is ``pp`` (the number of
distinct layer groups), not ``2*pp``. The "cut-in-half" DualPipeV variant, which
has ``2*pp`` distinct chunks and no duplication, is not implemented here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from workloads import enums
from workloads.errors import WorkloadError

OpKind = Literal["F", "B", "I", "W"]
OPS: tuple[str, ...] = ("F", "B", "I", "W")
SCHEDULES = enums.SCHEDULES


class ScheduleError(WorkloadError):
    """A schedule that cannot be built or run. ``field`` names the offending
    scenario key (``schedule``, ``parallel.pp``, ``parallel.vpp``,
    ``training.global_batch_size``), or ``schedule`` for a step list that
    cannot execute."""


@dataclass(frozen=True)
class Action:
    """One pass of micro-batch ``mb`` through local model chunk ``chunk``."""

    op: OpKind
    mb: int
    chunk: int = 0

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"Action.op must be one of {OPS}, got {self.op!r}")

    def __repr__(self) -> str:  # compact: F3.1 = forward of micro-batch 3, chunk 1
        return f"{self.op}{self.mb}.{self.chunk}"


Step = tuple[Action, ...]


# ---------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------
def _positive_int(value: object, field: str, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ScheduleError(f"{what} must be a positive integer, got {value!r}", field=field)


def validate_schedule_args(name: str, pp: int, m: int, vpp: int = 1) -> None:
    """Check that schedule ``name`` can run ``m`` micro-batches on ``pp`` ranks
    with ``vpp`` local chunks each. Raises :class:`ScheduleError` naming the field.

    Rules enforced:

    * every schedule: ``pp >= 1``, ``m >= 1``, ``vpp >= 1``;
    * ``gpipe``, ``1f1b``, ``zb-h1``, ``dualpipe``: ``vpp == 1``;
    * ``interleaved-1f1b``: ``vpp >= 2``, ``pp >= 2`` and ``m % pp == 0``
      (Megatron groups micro-batches in runs of ``pp`` per chunk; Narayanan et
      al. 2021 §2.2.2);
    * ``dualpipe``: ``pp`` even and ``>= 2``; ``m`` even and ``m >= 2*pp`` (each
      direction carries ``m/2`` micro-batches and the steady phase needs
      ``m/2 - pp + 1 >= 1`` rounds on the outermost ranks; the same check as the
      reference implementation).
    """
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}; expected one of {', '.join(SCHEDULES)}", field="schedule")
    _positive_int(pp, "parallel.pp", "pipeline size pp")
    _positive_int(m, "training.global_batch_size", "micro-batches per pipeline m")
    _positive_int(vpp, "parallel.vpp", "virtual stages vpp")
    if name == "interleaved-1f1b":
        if vpp < 2:
            raise ScheduleError(f"interleaved-1f1b needs vpp >= 2 chunks per rank, got {vpp}", field="parallel.vpp")
        if pp < 2:
            raise ScheduleError(f"interleaved-1f1b needs pp >= 2, got {pp}", field="parallel.pp")
        if m % pp:
            raise ScheduleError(
                f"interleaved-1f1b needs the micro-batches per pipeline (m = {m}) to be a multiple of "
                f"pp = {pp}; m = global_batch_size / (micro_batch_size * dp)",
                field="training.global_batch_size",
            )
        return
    if vpp != 1:
        raise ScheduleError(
            f"{name} needs vpp == 1 (only interleaved-1f1b has virtual stages), got {vpp}", field="parallel.vpp"
        )
    if name == "dualpipe":
        if pp % 2:
            raise ScheduleError(f"dualpipe needs an even pp >= 2, got {pp}", field="parallel.pp")
        if m % 2 or m < 2 * pp:
            raise ScheduleError(
                f"dualpipe needs an even number of micro-batches per pipeline m >= 2*pp = {2 * pp}, got "
                f"m = {m}; m = global_batch_size / (micro_batch_size * dp)",
                field="training.global_batch_size",
            )


# ---------------------------------------------------------------------------
# Chunk placement
# ---------------------------------------------------------------------------
def model_chunks(name: str, pp: int, vpp: int = 1) -> int:
    """Number of distinct model chunks the layers are cut into: ``pp * vpp``;
    DualPipe ``pp`` (each held on two ranks, see the module docstring)."""
    return pp if name == "dualpipe" else pp * vpp


def local_chunks(name: str, vpp: int = 1) -> int:
    """Model chunks held by each rank: ``vpp``; DualPipe 2."""
    return 2 if name == "dualpipe" else vpp


def weight_copies(name: str) -> int:
    """How many ranks hold each model chunk's parameters within one pipeline.

    DualPipe stores every stage twice (stage ``s`` on rank ``s`` for direction 0
    and on rank ``pp-1-s`` for direction 1), so parameters, their gradients and
    (without ZeRO sharding across the pipeline) optimizer states are doubled:
    DeepSeek-V3 Table 2 lists "Parameter 2x". Activations are not duplicated —
    each micro-batch uses one copy. Every other schedule: 1."""
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}; expected one of {', '.join(SCHEDULES)}", field="schedule")
    return 2 if name == "dualpipe" else 1


def micro_batch_direction(name: str, mb: int, m: int) -> int:
    """0 if micro-batch ``mb`` flows rank 0 -> pp-1, 1 if it flows the other way
    (DualPipe's second half of the micro-batches)."""
    if name == "dualpipe":
        return 0 if mb < m // 2 else 1
    return 0


def chunk_owner(name: str, model_chunk: int, pp: int, vpp: int = 1, direction: int = 0) -> tuple[int, int]:
    """``(rank, local_chunk)`` holding model chunk ``model_chunk``.

    Megatron placement: chunk ``k`` -> ``(k % pp, k // pp)``. DualPipe: stage
    ``k`` is held twice, so ``direction`` picks the copy: ``(k, 0)`` for
    direction 0, ``(pp-1-k, 1)`` for direction 1."""
    n = model_chunks(name, pp, vpp)
    if not 0 <= model_chunk < n:
        raise IndexError(f"model chunk {model_chunk} outside 0..{n - 1}")
    if name == "dualpipe":
        if direction not in (0, 1):
            raise ValueError(f"direction must be 0 or 1, got {direction!r}")
        return (model_chunk, 0) if direction == 0 else (pp - 1 - model_chunk, 1)
    return model_chunk % pp, model_chunk // pp


def model_chunk(name: str, rank: int, local_chunk: int, pp: int, vpp: int = 1) -> int:
    """Inverse of :func:`chunk_owner`: the model chunk (layer group) that
    ``rank`` holds as ``local_chunk``."""
    if not 0 <= rank < pp:
        raise IndexError(f"rank {rank} outside 0..{pp - 1}")
    nl = local_chunks(name, vpp)
    if not 0 <= local_chunk < nl:
        raise IndexError(f"local chunk {local_chunk} outside 0..{nl - 1}")
    if name == "dualpipe":
        return rank if local_chunk == 0 else pp - 1 - rank
    return local_chunk * pp + rank


@lru_cache(maxsize=1 << 14)
def micro_batch_path(name: str, mb: int, m: int, pp: int, vpp: int = 1) -> tuple[tuple[int, int], ...]:
    """The ``(rank, local_chunk)`` pairs micro-batch ``mb``'s forward visits, in order
    (its backward visits them in reverse)."""
    d = micro_batch_direction(name, mb, m)
    return tuple(chunk_owner(name, k, pp, vpp, direction=d) for k in range(model_chunks(name, pp, vpp)))


# ---------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------
def schedule(name: str, rank: int, pp: int, m: int, vpp: int = 1) -> list[Step]:
    """The ordered steps pipeline rank ``rank`` runs for one training step.

    Raises :class:`ScheduleError` for arguments the schedule cannot take (see
    :func:`validate_schedule_args`) and ``IndexError`` for a rank outside ``0..pp-1``."""
    validate_schedule_args(name, pp, m, vpp)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < pp:
        raise IndexError(f"rank {rank!r} outside 0..{pp - 1}")
    if name == "gpipe":
        return _gpipe(m)
    if name == "1f1b":
        return _one_f_one_b(rank, pp, m)
    if name == "interleaved-1f1b":
        return _interleaved(rank, pp, m, vpp)
    if name == "zb-h1":
        return _zb_h1(rank, pp, m)
    return _dualpipe(rank, pp, m)


def _single(actions: Iterable[Action]) -> list[Step]:
    return [(a,) for a in actions]


def _gpipe(m: int) -> list[Step]:
    """All forwards, then all backwards, both in micro-batch order (GPipe,
    Huang et al. 2019; "all-forward-all-backward")."""
    return _single([Action("F", j) for j in range(m)] + [Action("B", j) for j in range(m)])


def _one_f_one_b(rank: int, pp: int, m: int) -> list[Step]:
    """Megatron's non-interleaved 1F1B (PipeDream-Flush; Narayanan et al. 2021
    §2.2.1): ``pp-rank-1`` warm-up forwards, then alternate one forward and one
    backward, then drain the remaining backwards."""
    warmup = min(pp - rank - 1, m)
    out = [Action("F", j) for j in range(warmup)]
    for i in range(m - warmup):
        out += [Action("F", warmup + i), Action("B", i)]
    out += [Action("B", j) for j in range(m - warmup, m)]
    return _single(out)


def _interleaved_unit(k: int, pp: int, vpp: int, forward: bool) -> tuple[int, int]:
    """Megatron's k-th virtual micro-batch -> (micro-batch, local chunk).

    Micro-batches go through the chunks in groups of ``pp``: first micro-batches
    ``0..pp-1`` on chunk 0, then the same group on chunk 1, ..., then the next
    group. Backwards walk the chunks from the last one down."""
    group, within = divmod(k, pp * vpp)
    chunk = within // pp
    if not forward:
        chunk = vpp - 1 - chunk
    return group * pp + within % pp, chunk


def _interleaved(rank: int, pp: int, m: int, vpp: int) -> list[Step]:
    """Megatron interleaved 1F1B (Narayanan et al. 2021 §2.2.2).

    ``total = m * vpp`` forward and backward units. Warm-up runs
    ``2*(pp-rank-1) + (vpp-1)*pp`` forwards (all of them when ``m == pp``, as
    Megatron does), the steady phase alternates one forward and one backward,
    the cool-down drains the backwards."""
    total = m * vpp
    if m == pp:
        warmup = total
    else:
        warmup = min(2 * (pp - rank - 1) + (vpp - 1) * pp, total)
    fwd = [Action("F", *_interleaved_unit(k, pp, vpp, True)) for k in range(total)]
    bwd = [Action("B", *_interleaved_unit(k, pp, vpp, False)) for k in range(total)]
    out = fwd[:warmup]
    for i in range(total - warmup):
        out += [fwd[warmup + i], bwd[i]]
    out += bwd[total - warmup :]
    return _single(out)


def _zb_h1(rank: int, pp: int, m: int) -> list[Step]:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR'24, §3.1).

    1F1B with the backward split into ``I`` (input gradient, on the critical
    path) and ``W`` (weight gradient, deferrable). Warm-up and the F/I order are
    1F1B's; rank ``r`` holds back its first ``r`` weight passes, so after each
    ``I`` of the steady phase it runs the ``W`` of ``r`` micro-batches earlier,
    and the held-back ``W``s fill the cool-down bubble. Activations are freed at
    ``W``, so rank ``r`` holds at most ``(pp-r-1) + 1 + r = pp`` micro-batches —
    1F1B's peak (reached on rank 0 in 1F1B, on every rank here)."""
    warmup = min(pp - rank - 1, m)
    lag = rank
    out: list[Action] = [Action("F", j) for j in range(warmup)]
    next_w = 0

    def backward(i: int) -> None:
        nonlocal next_w
        out.append(Action("I", i))
        if i - lag >= next_w:
            out.append(Action("W", next_w))
            next_w += 1

    for i in range(m - warmup):
        out.append(Action("F", warmup + i))
        backward(i)
    for i in range(m - warmup, m):
        backward(i)
    out += [Action("W", j) for j in range(next_w, m)]
    return _single(out)


def _dualpipe(rank: int, pp: int, m: int) -> list[Step]:
    """DualPipe (DeepSeek-V3, arXiv 2412.19437 §3.2.1, Fig. 5), in the phase
    structure of the reference implementation.

    ``h = min(rank, pp-1-rank)`` is the distance to the nearer pipeline end,
    ``half = pp/2``, ``M = m/2`` micro-batches per direction. *near* is the
    direction entering at the nearer end (0 on the first half of the ranks, 1 on
    the second), *far* the other. ``B`` is a full backward; ``I``/``W`` a split
    one whose ``W`` is queued and run later (first in, first out). Phases:

    1. ``2*(half-h-1)`` forwards of *near*.
    2. ``h+1`` times: forward *near*, forward *far*.
    3. ``half-h-1`` times: ``I`` *far*, its ``W``, forward *far* (zero-bubble
       split so the next forward starts sooner).
    4. ``M-pp+h+1`` times (the steady state): pair (F *near*, B *far*), pair
       (F *far*, B *near*). On the two middle ranks the very first pair is run
       as two separate steps, F then B, which shortens the critical path.
    5. ``half-h-1`` times: B *far*, pair (F *far*, B *near*).
    6. ``h+1`` times: backward *far*, backward *near*; from the middle of this
       phase on the backwards are split (``I`` now, ``W`` queued).
    7. ``half-h-1`` times: a queued ``W``, then ``I`` *near* (its ``W`` queued).
    8. ``h+1`` queued ``W``s.
    """
    half, big_m = pp // 2, m // 2
    h = min(rank, pp - 1 - rank)
    near = 0 if rank < half else 1
    far = 1 - near
    middle = h == half - 1
    first_mb = (0, big_m)  # first micro-batch id of each direction
    next_f, next_b = [0, 0], [0, 0]
    wq: deque[Action] = deque()

    def f(d: int) -> Action:
        a = Action("F", first_mb[d] + next_f[d], d)
        next_f[d] += 1
        return a

    def b(d: int, split: bool = False) -> Action:
        mb = first_mb[d] + next_b[d]
        next_b[d] += 1
        if split:
            wq.append(Action("W", mb, d))
            return Action("I", mb, d)
        return Action("B", mb, d)

    steps: list[Step] = []
    for _ in range(2 * (half - h - 1)):  # 1
        steps.append((f(near),))
    for _ in range(h + 1):  # 2
        steps += [(f(near),), (f(far),)]
    for _ in range(half - h - 1):  # 3
        steps += [(b(far, True),), (wq.popleft(),), (f(far),)]
    for i in range(big_m - pp + h + 1):  # 4
        if i == 0 and middle:
            steps += [(f(near),), (b(far),)]
        else:
            steps.append((f(near), b(far)))
        steps.append((f(far), b(near)))
    for _ in range(half - h - 1):  # 5
        steps += [(b(far),), (f(far), b(near))]
    split = False  # 6
    for i in range(h + 1):
        if i == (h + 1) // 2 and h % 2 == 1:
            split = True
        steps.append((b(far, split),))
        if i == (h + 1) // 2 and h % 2 == 0:
            split = True
        steps.append((b(near, split),))
    for _ in range(half - h - 1):  # 7
        steps += [(wq.popleft(),), (b(near, True),)]
    while wq:  # 8
        steps.append((wq.popleft(),))
    return steps


# ---------------------------------------------------------------------------
# Transformations and analysis of step lists
# ---------------------------------------------------------------------------
def all_forward_first(steps: Sequence[Step]) -> list[Step]:
    """Every forward before any backward, for an MoE auxiliary loss computed over
    the whole global batch (no backward can start before the last forward; see
    reference-data A12.6). Forwards keep their relative order, and so do the
    backward-side actions (``B``/``I``/``W``); overlapped pairs are split into
    single steps. Applied to any schedule this yields a GPipe-like order whose
    in-flight activations grow to ``m`` per local chunk. Deadlock-free whenever
    the input is: the input's execution order, forwards first, is a valid
    execution order of the output."""
    actions = [a for st in steps for a in st]
    return _single([a for a in actions if a.op == "F"] + [a for a in actions if a.op != "F"])


def in_flight_profile(steps: Sequence[Step]) -> list[int]:
    """Micro-batch-chunks holding stashed activations after each step, in
    program order: +1 at ``F``, -1 at ``B`` or at ``W`` (a split backward keeps
    the stash until the weight gradient is done, since ``W`` reads the layer
    inputs). Within an overlapped pair the forward's stash is counted before
    the backward frees its own, so the pair's peak is seen."""
    level, out = 0, []
    for st in steps:
        level += sum(1 for a in st if a.op == "F")
        out.append(level)
        level -= sum(1 for a in st if a.op in ("B", "W"))
        if level != out[-1]:
            out.append(level)
    return out


def peak_in_flight(steps: Sequence[Step]) -> int:
    """Largest :func:`in_flight_profile` value (0 for an empty list)."""
    return max(in_flight_profile(steps), default=0)
