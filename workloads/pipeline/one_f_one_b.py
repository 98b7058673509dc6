"""Megatron's non-interleaved 1F1B (PipeDream-Flush; Narayanan et al. 2021 §2.2.1)."""

from __future__ import annotations

from collections.abc import Callable

from workloads.pipeline.base import Action, MegatronPlacement, PipelineSchedule, Step, single
from workloads.pipeline.gpipe import one_chunk


class OneFOneB(MegatronPlacement, PipelineSchedule):
    name = "1f1b"
    virtual_stages = False
    forwards_all_first = False
    bidirectional = False
    overlapped_pairs = False
    wraps_stages = False
    # Megatron-Core's forward_backward_pipelining_without_interleaving (megatron/core/pipeline_parallel/schedules.py)
    megatron_lm = True

    def validate(self, pp: int, m: int, vpp: int) -> None:
        one_chunk(self.name, vpp)

    def steps(self, rank: int, pp: int, m: int, vpp: int) -> list[Step]:
        """``pp-rank-1`` warm-up forwards, then alternate one forward and one backward, then
        drain the remaining backwards."""
        warmup = min(pp - rank - 1, m)
        out = [Action("F", j) for j in range(warmup)]
        for i in range(m - warmup):
            out += [Action("F", warmup + i), Action("B", i)]
        out += [Action("B", j) for j in range(m - warmup, m)]
        return single(out)

    def bubble_s(self, pp: int, mean: Callable[[str], float], pair_s: float | None) -> float:
        return (pp - 1) * (mean("F") + mean("B"))

    def steady_run(self, pp: int, vpp: int, expert_parallel: bool) -> tuple[int, int] | None:
        return one_f_one_b_run(pp, expert_parallel)


def one_f_one_b_run(pp: int, expert_parallel: bool) -> tuple[int, int]:
    """1F1B and ZB-H1: ``m1 = pp + 8`` (``2 pp + 12`` with expert parallelism, whose
    all-to-alls settle later), period 2 (twice the schedule's own: steady phases often settle
    into a two-micro-batch pattern; see :func:`simulator.steady.runs_for`)."""
    return (pp + 8 + (pp + 4 if expert_parallel else 0), 2)
