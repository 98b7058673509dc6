"""Megatron's interleaved 1F1B (Narayanan et al. 2021 §2.2.2): ``vpp`` model chunks per rank,
micro-batches through the chunks in groups of ``pp``."""

from __future__ import annotations

from collections.abc import Callable

from workloads.pipeline.base import Action, MegatronPlacement, PipelineSchedule, ScheduleError, Step, single


class Interleaved1F1B(MegatronPlacement, PipelineSchedule):
    name = "interleaved-1f1b"
    virtual_stages = True
    forwards_all_first = False
    bidirectional = False
    overlapped_pairs = False
    wraps_stages = True
    # Megatron-Core's forward_backward_pipelining_with_interleaving (megatron/core/pipeline_parallel/schedules.py)
    megatron_lm = True

    def validate(self, pp: int, m: int, vpp: int) -> None:
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

    def steps(self, rank: int, pp: int, m: int, vpp: int) -> list[Step]:
        """``total = m * vpp`` forward and backward units. Warm-up runs
        ``2*(pp-rank-1) + (vpp-1)*pp`` forwards (all of them when ``m == pp``, as Megatron
        does), the steady phase alternates one forward and one backward, the cool-down drains
        the backwards."""
        total = m * vpp
        if m == pp:
            warmup = total
        else:
            warmup = min(2 * (pp - rank - 1) + (vpp - 1) * pp, total)
        fwd = [Action("F", *unit(k, pp, vpp, True)) for k in range(total)]
        bwd = [Action("B", *unit(k, pp, vpp, False)) for k in range(total)]
        out = fwd[:warmup]
        for i in range(total - warmup):
            out += [fwd[warmup + i], bwd[i]]
        out += bwd[total - warmup :]
        return single(out)

    def bubble_s(self, pp: int, mean: Callable[[str], float], pair_s: float | None) -> float:
        # (pp - 1)(F + B) / vpp of a rank's work per micro-batch: per action, (pp - 1)(F + B)
        return (pp - 1) * (mean("F") + mean("B"))

    def steady_run(self, pp: int, vpp: int, expert_parallel: bool) -> tuple[int, int] | None:
        # its own period, pp (micro-batches run in groups of pp per chunk); m1 = 4 pp (5 pp
        # with expert parallelism)
        return (4 * pp + (pp if expert_parallel else 0), pp)


def unit(k: int, pp: int, vpp: int, forward: bool) -> tuple[int, int]:
    """Megatron's k-th virtual micro-batch -> (micro-batch, local chunk): micro-batches go
    through the chunks in groups of ``pp`` (micro-batches ``0..pp-1`` on chunk 0, then on
    chunk 1, ..., then the next group); backwards walk the chunks from the last one down."""
    group, within = divmod(k, pp * vpp)
    chunk = within // pp
    if not forward:
        chunk = vpp - 1 - chunk
    return group * pp + within % pp, chunk
