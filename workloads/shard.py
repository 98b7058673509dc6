"""One rank's shard of one micro-batch: the parallel degrees that split the model's tensors on it,
the micro-batch and sequence it runs, and the width of its activations.

:class:`Shard` is what the kernel counts (:mod:`workloads.counts`), the activation memory
(:mod:`workloads.activations`), the trace builder and the search's analytic estimate all need to
size a layer on one rank. They build it once from the scenario's layout and training
(:meth:`Shard.of`) and pass it whole, instead of repeating the degrees, the batch and the dtype
as keywords. How a layer is trained (recompute, flash attention, dropout, DeepSeek-V3's savings)
is not part of the shard: the activation functions take it as an
:class:`~workloads.activations.ActivationPolicy`.
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads import shapes
from workloads.errors import WorkloadError
from workloads.layout import ParallelLayout
from workloads.training import TrainingSpec

#: Bytes per activation element: BF16, also under FP8 training (FP8 GEMMs cast their inputs;
#: the FP8 caches of DeepSeek-V3's savings are the activation policy's, not the dtype's).
ACT_BYTES = 2


@dataclass(frozen=True)
class Shard:
    """The slice of one micro-batch that one rank computes.

    ``micro_batch_size`` sequences of ``seq_len`` tokens; ``tp`` splits heads and FFN widths
    (and, with ``sequence_parallel``, the token rows of norms, residuals and dropout), ``cp``
    the queries of each sequence, ``ep`` the routed experts and ``etp`` each expert's width;
    ``act_bytes`` is the width of an activation element. Degrees must be positive integers
    (``WorkloadError`` naming ``parallel.<degree>``), the batch and sequence positive.
    """

    micro_batch_size: int
    seq_len: int
    tp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    sequence_parallel: bool = True
    act_bytes: int = ACT_BYTES
    mla_down_proj: str = "duplicated"  # how MLA's down projections split over tp (workloads.layout)

    def __post_init__(self) -> None:
        shapes._check_positive(tp=self.tp, cp=self.cp, ep=self.ep, etp=self.etp)
        if self.micro_batch_size < 1 or self.seq_len < 1:
            raise WorkloadError(
                f"micro_batch_size and seq_len must be positive, got {self.micro_batch_size!r}, {self.seq_len!r}",
                field="training",
            )

    @classmethod
    def of(cls, layout: ParallelLayout, training: TrainingSpec) -> Shard:
        """The shard of a rank of ``layout`` running one micro-batch of ``training``."""
        return cls(
            micro_batch_size=training.micro_batch_size,
            seq_len=training.seq_len,
            tp=layout.tp,
            cp=layout.cp,
            ep=layout.ep,
            etp=layout.etp,
            sequence_parallel=layout.sequence_parallel,
            mla_down_proj=layout.mla_down_proj,
        )

    @property
    def tokens(self) -> int:
        """The rank's token rows, ``micro_batch_size * seq_len // cp`` (the rows the trace's
        kernels and messages are sized by)."""
        return self.micro_batch_size * self.seq_len // self.cp

    @property
    def sp(self) -> bool:
        """Whether token rows are split over ``tp`` (sequence parallelism with ``tp > 1``)."""
        return self.sequence_parallel and self.tp > 1

    def sp_rows(self, rows: float) -> float:
        """``rows`` as a sequence-parallel op sees them: ``rows / tp`` under :attr:`sp`, else all."""
        return rows / self.tp if self.sp else rows
