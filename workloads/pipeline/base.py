"""The pipeline schedule as an object: :class:`PipelineSchedule`, the hooks every schedule
implements for the trace builder, the analytic estimate and steady-state skipping, and the
plain data a schedule is made of (:class:`Action`, :data:`Step`, :class:`ScheduleError`).
The vocabulary (actions, steps, model chunks, dependencies) is :mod:`workloads.schedules`'."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar, Literal

from workloads.errors import WorkloadError

OpKind = Literal["F", "B", "I", "W"]
OPS: tuple[str, ...] = ("F", "B", "I", "W")


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


def single(actions: Iterable[Action]) -> list[Step]:
    """Each action a step of its own."""
    return [(a,) for a in actions]


class PipelineSchedule(ABC):
    """One pipeline schedule: the order each rank runs its passes, where the model chunks
    live, and what the rest of stepsim needs to know about it. A new schedule is a module of
    :mod:`workloads.pipeline` with a subclass, registered in :data:`workloads.pipeline.REGISTRY`
    (``tests/test_schedules.py`` checks that every registered one implements every hook)."""

    #: the scenario's ``schedule`` value (``workloads.enums.SCHEDULES``)
    name: ClassVar[str]
    #: ``parallel.vpp`` > 1 (virtual stages per rank) is what the schedule runs on
    virtual_stages: ClassVar[bool] = False
    #: every forward runs before any backward already (a batch-global auxiliary loss
    #: changes nothing)
    forwards_all_first: ClassVar[bool] = False
    #: micro-batches enter at both ends of the pipeline, each stage held on two ranks
    #: (a micro-batch passes through one of a rank's two local chunks)
    bidirectional: ClassVar[bool] = False
    #: steps pair a forward with a backward of another micro-batch, overlapping one half's
    #: expert all-to-alls with the other half's compute
    overlapped_pairs: ClassVar[bool] = False
    #: the last stage sends to the first (model chunks wrap around the ranks)
    wraps_stages: ClassVar[bool] = False

    # ---- arguments --------------------------------------------------------------------------
    @abstractmethod
    def validate(self, pp: int, m: int, vpp: int) -> None:
        """Raise :class:`ScheduleError` (naming the field) where the schedule cannot run ``m``
        micro-batches on ``pp`` ranks with ``vpp`` local chunks (each already a positive int)."""

    # ---- where the model chunks live --------------------------------------------------------
    def model_chunks(self, pp: int, vpp: int) -> int:
        """Distinct model chunks the layers are cut into (Megatron: ``pp * vpp``)."""
        return pp * vpp

    def local_chunks(self, vpp: int) -> int:
        """Model chunks each rank holds."""
        return vpp

    def weight_copies(self) -> int:
        """Ranks of one pipeline holding each model chunk's parameters."""
        return 1

    def micro_batch_direction(self, mb: int, m: int) -> int:
        """0 where micro-batch ``mb`` flows rank 0 -> pp-1, 1 the other way."""
        return 0

    def chunk_owner(self, model_chunk: int, pp: int, vpp: int, direction: int) -> tuple[int, int]:
        """``(rank, local_chunk)`` holding ``model_chunk`` (Megatron: ``(k % pp, k // pp)``)."""
        return model_chunk % pp, model_chunk // pp

    def model_chunk(self, rank: int, local_chunk: int, pp: int, vpp: int) -> int:
        """The model chunk ``rank`` holds as ``local_chunk`` (inverse of :meth:`chunk_owner`)."""
        return local_chunk * pp + rank

    # ---- the order ----------------------------------------------------------------------------
    @abstractmethod
    def steps(self, rank: int, pp: int, m: int, vpp: int) -> list[Step]:
        """The ordered steps pipeline rank ``rank`` runs for one training step."""

    # ---- the analytic estimate (simulator.studies.search.estimate) ------------------------------
    @abstractmethod
    def bubble_s(self, pp: int, mean: Callable[[str], float], pair_s: float | None) -> float:
        """The pipeline bubble in seconds, closed form, from the per-action times averaged over
        the stages (``mean("F")``, ``"B"``, ``"I"``, ``"W"``) and, for overlapped pairs, the mean
        time of one pair (None where no pair was costed)."""

    # ---- steady-state skipping (simulator.steady) ---------------------------------------------
    def steady_run(self, pp: int, vpp: int, expert_parallel: bool) -> tuple[int, int] | None:
        """``(m1, k)``: simulate ``m1`` micro-batches and certify a period of ``k``; None where
        the schedule has no steady phase (every micro-batch's activations held at once)."""
        return None
