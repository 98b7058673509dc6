"""GPipe (Huang et al. 2019): all forwards, then all backwards ("all-forward-all-backward")."""

from __future__ import annotations

from collections.abc import Callable

from workloads.pipeline.base import Action, MegatronPlacement, PipelineSchedule, ScheduleError, Step, single


class GPipe(MegatronPlacement, PipelineSchedule):
    name = "gpipe"
    virtual_stages = False
    forwards_all_first = True
    bidirectional = False
    overlapped_pairs = False
    wraps_stages = False
    megatron_lm = False

    def validate(self, pp: int, m: int, vpp: int) -> None:
        one_chunk(self.name, vpp)

    def steps(self, rank: int, pp: int, m: int, vpp: int) -> list[Step]:
        """All forwards, then all backwards, both in micro-batch order."""
        return single([Action("F", j) for j in range(m)] + [Action("B", j) for j in range(m)])

    def bubble_s(self, pp: int, mean: Callable[[str], float], pair_s: float | None) -> float:
        # per action = one micro-batch through one local chunk: (pp - 1)(F + B)
        return (pp - 1) * (mean("F") + mean("B"))

    def steady_run(self, pp: int, vpp: int, expert_parallel: bool) -> tuple[int, int] | None:
        return None  # every micro-batch's activations held at once: no steady phase


def one_chunk(name: str, vpp: int) -> None:
    """Every schedule but interleaved 1F1B runs one chunk per rank."""
    if vpp != 1:
        raise ScheduleError(
            f"{name} needs vpp == 1 (only interleaved-1f1b has virtual stages), got {vpp}", field="parallel.vpp"
        )
