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
    :mod:`workloads.pipeline` with a subclass, registered in :data:`workloads.pipeline.REGISTRY`.

    Every hook is required: each method is abstract (:class:`MegatronPlacement` supplies the six
    placement methods of Megatron's chunk numbering) and each fact of :data:`FACTS` must be set
    by the subclass, so a schedule that leaves one out cannot be made (``TypeError`` naming it)
    instead of falling silently into another schedule's case."""

    #: the scenario's ``schedule`` value (``workloads.enums.SCHEDULES``)
    name: ClassVar[str]
    #: ``parallel.vpp`` > 1 (virtual stages per rank) is what the schedule runs on
    virtual_stages: ClassVar[bool]
    #: every forward runs before any backward already (a batch-global auxiliary loss, which
    #: otherwise forces all forwards first, changes nothing)
    forwards_all_first: ClassVar[bool]
    #: micro-batches enter at both ends of the pipeline, each stage held on two ranks
    #: (a micro-batch passes through one of a rank's two local chunks)
    bidirectional: ClassVar[bool]
    #: steps pair a forward with a backward of another micro-batch, overlapping one half's
    #: expert all-to-alls with the other half's compute
    overlapped_pairs: ClassVar[bool]
    #: the last stage sends to the first (model chunks wrap around the ranks)
    wraps_stages: ClassVar[bool]
    #: Megatron-LM runs this schedule (``--num-layers-per-virtual-pipeline-stage`` or not)
    megatron_lm: ClassVar[bool]

    def __init__(self) -> None:
        missing = [f for f in FACTS if not hasattr(type(self), f)]
        if missing:
            raise TypeError(f"Can't instantiate schedule {type(self).__name__} without the facts {', '.join(missing)}")

    # ---- arguments --------------------------------------------------------------------------
    @abstractmethod
    def validate(self, pp: int, m: int, vpp: int) -> None:
        """Raise :class:`ScheduleError` (naming the field) where the schedule cannot run ``m``
        micro-batches on ``pp`` ranks with ``vpp`` local chunks (each already a positive int)."""

    # ---- where the model chunks live --------------------------------------------------------
    @abstractmethod
    def model_chunks(self, pp: int, vpp: int) -> int:
        """Distinct model chunks the layers are cut into."""

    @abstractmethod
    def local_chunks(self, vpp: int) -> int:
        """Model chunks each rank holds."""

    @abstractmethod
    def weight_copies(self) -> int:
        """Ranks of one pipeline holding each model chunk's parameters."""

    @abstractmethod
    def weight_peer(self, rank: int, pp: int) -> int | None:
        """The other pipeline rank holding copies of ``rank``'s parameters, with which it sums
        their gradients; None where each chunk is held once (:meth:`weight_copies` 1)."""

    @abstractmethod
    def micro_batch_direction(self, mb: int, m: int) -> int:
        """0 where micro-batch ``mb`` flows rank 0 -> pp-1, 1 the other way."""

    @abstractmethod
    def chunk_owner(self, model_chunk: int, pp: int, vpp: int, direction: int) -> tuple[int, int]:
        """``(rank, local_chunk)`` holding ``model_chunk`` (the copy of ``direction``)."""

    @abstractmethod
    def model_chunk(self, rank: int, local_chunk: int, pp: int, vpp: int) -> int:
        """The model chunk ``rank`` holds as ``local_chunk`` (inverse of :meth:`chunk_owner`)."""

    @abstractmethod
    def chunks_per_micro_batch(self, vpp: int) -> int:
        """Local chunks of a rank that one micro-batch passes through (of :meth:`local_chunks`)."""

    @abstractmethod
    def finish_lead(self, rank: int, pp: int) -> int:
        """Backward passes by which ``rank``'s last backward ends before the pipeline's last one:
        its distance to the end where the last micro-batches leave."""

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
    @abstractmethod
    def steady_run(self, pp: int, vpp: int, expert_parallel: bool) -> tuple[int, int] | None:
        """``(m1, k)``: simulate ``m1`` micro-batches and certify a period of ``k``; None where
        the schedule has no steady phase (every micro-batch's activations held at once)."""

    def steady_multiples(self, pp: int, expert_parallel: bool) -> tuple[int, ...]:
        """The periods :func:`simulator.steady.simulate_steady` certifies a run for, as multiples
        of :meth:`steady_run`'s ``k``, in order: by default ``k`` and twice it (steps often settle
        into a pattern twice as long as the one tried)."""
        return (1, 2)

    def steady_retries(self) -> bool:
        """Whether a first run whose records nearly repeat is tried once more, longer
        (:func:`simulator.steady.simulate_steady`). A retry takes up to half the step (0.4 with
        expert parallelism) and pays only where it certifies more often than that share: in
        the PP map's stored simulations (docs/results/ppmap/sims, 2026-12-07) it certified 11 of
        14 DualPipe retries but 8 of 63 for 1F1B, ZB-H1 and interleaved 1F1B (1 of 18, 4 of 29
        and 3 of 16), so by default no."""
        return False

    def steady_run_shortest(self, pp: int, vpp: int, expert_parallel: bool) -> int | None:
        """The fewest micro-batches a run may have where :meth:`steady_run`'s is more than the
        step allows (:func:`simulator.steady.runs_for` then takes the longest run allowed down
        to this); by default the same run."""
        run = self.steady_run(pp, vpp, expert_parallel)
        return None if run is None else run[0]


#: the class attributes every schedule sets (besides ``name``)
FACTS: tuple[str, ...] = (
    "virtual_stages",
    "forwards_all_first",
    "bidirectional",
    "overlapped_pairs",
    "wraps_stages",
    "megatron_lm",
)
#: every hook of a schedule: its facts and its methods
HOOKS: tuple[str, ...] = FACTS + tuple(sorted(PipelineSchedule.__abstractmethods__))


class MegatronPlacement:
    """Megatron's chunk placement, the placement hooks of a one-direction schedule: the layers
    cut into ``pp * vpp`` chunks, chunk ``k`` on rank ``k % pp`` as local chunk ``k // pp``, one
    copy of each, every micro-batch entering and leaving at rank 0 through all of a rank's
    chunks (list it before :class:`PipelineSchedule` in the bases)."""

    def model_chunks(self, pp: int, vpp: int) -> int:
        return pp * vpp

    def local_chunks(self, vpp: int) -> int:
        return vpp

    def weight_copies(self) -> int:
        return 1

    def weight_peer(self, rank: int, pp: int) -> int | None:
        return None

    def micro_batch_direction(self, mb: int, m: int) -> int:
        return 0

    def chunk_owner(self, model_chunk: int, pp: int, vpp: int, direction: int) -> tuple[int, int]:
        return model_chunk % pp, model_chunk // pp

    def model_chunk(self, rank: int, local_chunk: int, pp: int, vpp: int) -> int:
        return local_chunk * pp + rank

    def chunks_per_micro_batch(self, vpp: int) -> int:
        return vpp

    def finish_lead(self, rank: int, pp: int) -> int:
        return rank
