"""ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR'24, §3.1): 1F1B with the
backward split into input-gradient (``I``) and deferrable weight-gradient (``W``) passes."""

from __future__ import annotations

from collections.abc import Callable

from workloads.pipeline.base import Action, MegatronPlacement, PipelineSchedule, Step, single
from workloads.pipeline.gpipe import one_chunk
from workloads.pipeline.one_f_one_b import one_f_one_b_run


class ZBH1(MegatronPlacement, PipelineSchedule):
    name = "zb-h1"
    virtual_stages = False
    forwards_all_first = False
    bidirectional = False
    overlapped_pairs = False
    wraps_stages = False
    megatron_lm = False

    def validate(self, pp: int, m: int, vpp: int) -> None:
        one_chunk(self.name, vpp)

    def steps(self, rank: int, pp: int, m: int, vpp: int) -> list[Step]:
        """Warm-up and the F/I order are 1F1B's; rank ``r`` holds back its first ``r`` weight
        passes, so after each ``I`` of the steady phase it runs the ``W`` of ``r`` micro-batches
        earlier, and the held-back ``W``s fill the cool-down bubble. Activations are freed at
        ``W``, so rank ``r`` holds at most ``(pp-r-1) + 1 + r = pp`` micro-batches — 1F1B's peak
        (reached on rank 0 in 1F1B, on every rank here)."""
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
        return single(out)

    def bubble_s(self, pp: int, mean: Callable[[str], float], pair_s: float | None) -> float:
        return max(0.0, (pp - 1) * (mean("F") + mean("I") - mean("W")))

    def steady_run(self, pp: int, vpp: int, expert_parallel: bool) -> tuple[int, int] | None:
        return one_f_one_b_run(pp, expert_parallel)
