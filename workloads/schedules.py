"""Pipeline-parallel schedules as pure functions of the schedule's name (each schedule is an
object of :mod:`workloads.pipeline`; these functions look it up and ask it).

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

from collections.abc import Sequence
from functools import lru_cache

from workloads import enums
from workloads.pipeline import get_schedule
from workloads.pipeline.base import OPS, Action, OpKind, ScheduleError, Step, single

__all__ = [
    "OPS",
    "SCHEDULES",
    "Action",
    "OpKind",
    "ScheduleError",
    "Step",
    "all_forward_first",
    "chunk_owner",
    "in_flight_profile",
    "local_chunks",
    "micro_batch_direction",
    "micro_batch_path",
    "model_chunk",
    "model_chunks",
    "peak_in_flight",
    "schedule",
    "validate_schedule_args",
    "weight_copies",
    "weight_peer",
]

SCHEDULES = enums.SCHEDULES


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
    sched = get_schedule(name)
    _positive_int(pp, "parallel.pp", "pipeline size pp")
    _positive_int(m, "training.global_batch_size", "micro-batches per pipeline m")
    _positive_int(vpp, "parallel.vpp", "virtual stages vpp")
    sched.validate(pp, m, vpp)


# ---------------------------------------------------------------------------
# Chunk placement
# ---------------------------------------------------------------------------
def model_chunks(name: str, pp: int, vpp: int = 1) -> int:
    """Number of distinct model chunks the layers are cut into: ``pp * vpp``;
    DualPipe ``pp`` (each held on two ranks, see the module docstring)."""
    return get_schedule(name).model_chunks(pp, vpp)


def local_chunks(name: str, vpp: int = 1) -> int:
    """Model chunks held by each rank: ``vpp``; DualPipe 2."""
    return get_schedule(name).local_chunks(vpp)


def weight_copies(name: str) -> int:
    """How many ranks hold each model chunk's parameters within one pipeline.

    DualPipe stores every stage twice (stage ``s`` on rank ``s`` for direction 0
    and on rank ``pp-1-s`` for direction 1), so parameters, their gradients and
    (without ZeRO sharding across the pipeline) optimizer states are doubled:
    DeepSeek-V3 Table 2 lists "Parameter 2x". Activations are not duplicated —
    each micro-batch uses one copy. Every other schedule: 1."""
    return get_schedule(name).weight_copies()


def weight_peer(name: str, rank: int, pp: int) -> int | None:
    """The other rank of the pipeline holding copies of ``rank``'s parameters (DualPipe:
    ``pp-1-rank``, the pair that sums their gradients); None where :func:`weight_copies` is 1."""
    return get_schedule(name).weight_peer(rank, pp)


def micro_batch_direction(name: str, mb: int, m: int) -> int:
    """0 if micro-batch ``mb`` flows rank 0 -> pp-1, 1 if it flows the other way
    (DualPipe's second half of the micro-batches)."""
    return get_schedule(name).micro_batch_direction(mb, m)


def chunk_owner(name: str, model_chunk: int, pp: int, vpp: int = 1, direction: int = 0) -> tuple[int, int]:
    """``(rank, local_chunk)`` holding model chunk ``model_chunk``.

    Megatron placement: chunk ``k`` -> ``(k % pp, k // pp)``. DualPipe: stage
    ``k`` is held twice, so ``direction`` picks the copy: ``(k, 0)`` for
    direction 0, ``(pp-1-k, 1)`` for direction 1."""
    n = model_chunks(name, pp, vpp)
    if not 0 <= model_chunk < n:
        raise IndexError(f"model chunk {model_chunk} outside 0..{n - 1}")
    return get_schedule(name).chunk_owner(model_chunk, pp, vpp, direction)


def model_chunk(name: str, rank: int, local_chunk: int, pp: int, vpp: int = 1) -> int:
    """Inverse of :func:`chunk_owner`: the model chunk (layer group) that
    ``rank`` holds as ``local_chunk``."""
    if not 0 <= rank < pp:
        raise IndexError(f"rank {rank} outside 0..{pp - 1}")
    nl = local_chunks(name, vpp)
    if not 0 <= local_chunk < nl:
        raise IndexError(f"local chunk {local_chunk} outside 0..{nl - 1}")
    return get_schedule(name).model_chunk(rank, local_chunk, pp, vpp)


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
    return get_schedule(name).steps(rank, pp, m, vpp)


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
    return single([a for a in actions if a.op == "F"] + [a for a in actions if a.op != "F"])


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
