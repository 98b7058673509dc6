"""DualPipe (DeepSeek-V3, arXiv 2412.19437 §3.2.1, Fig. 5 and Table 2; the public
``deepseek-ai/DualPipe`` code): micro-batches enter at both ends, every stage is held on two
ranks, and the steady phase pairs a forward with a backward of the other direction so that one
half's expert all-to-alls hide behind the other half's compute."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from workloads.pipeline.base import Action, PipelineSchedule, ScheduleError, Step
from workloads.pipeline.gpipe import one_chunk


class DualPipe(PipelineSchedule):
    name = "dualpipe"
    virtual_stages = False
    forwards_all_first = False
    bidirectional = True
    overlapped_pairs = True
    wraps_stages = False
    megatron_lm = False

    def validate(self, pp: int, m: int, vpp: int) -> None:
        one_chunk(self.name, vpp)
        if pp % 2:
            raise ScheduleError(f"dualpipe needs an even pp >= 2, got {pp}", field="parallel.pp")
        if m % 2 or m < 2 * pp:
            raise ScheduleError(
                f"dualpipe needs an even number of micro-batches per pipeline m >= 2*pp = {2 * pp}, got "
                f"m = {m}; m = global_batch_size / (micro_batch_size * dp)",
                field="training.global_batch_size",
            )

    # the layers are cut into pp stages; rank r holds stage r as local chunk 0 (direction 0)
    # and stage pp-1-r as local chunk 1 (direction 1): the local chunk is the direction
    def model_chunks(self, pp: int, vpp: int) -> int:
        return pp

    def local_chunks(self, vpp: int) -> int:
        return 2

    def weight_copies(self) -> int:
        # every stage twice: parameters, gradients and (unsharded) optimizer states doubled
        # (DeepSeek-V3 Table 2, "Parameter 2x"); activations are not
        return 2

    def weight_peer(self, rank: int, pp: int) -> int | None:
        return pp - 1 - rank  # its stages' other copies: stage r on rank r and rank pp-1-r

    def micro_batch_direction(self, mb: int, m: int) -> int:
        return 0 if mb < m // 2 else 1

    def chunk_owner(self, model_chunk: int, pp: int, vpp: int, direction: int) -> tuple[int, int]:
        if direction not in (0, 1):
            raise ValueError(f"direction must be 0 or 1, got {direction!r}")
        return (model_chunk, 0) if direction == 0 else (pp - 1 - model_chunk, 1)

    def model_chunk(self, rank: int, local_chunk: int, pp: int, vpp: int) -> int:
        return rank if local_chunk == 0 else pp - 1 - rank

    def chunks_per_micro_batch(self, vpp: int) -> int:
        return 1  # the chunk of its direction

    def finish_lead(self, rank: int, pp: int) -> int:
        return min(rank, pp - 1 - rank)  # both ends drain last

    def steps(self, rank: int, pp: int, m: int, vpp: int) -> list[Step]:
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

    def bubble_s(self, pp: int, mean: Callable[[str], float], pair_s: float | None) -> float:
        # (pp/2 - 1)(F&B + B - 3W) (DeepSeek-V3 §3.2.1, Table 2), F&B the time of an overlapped
        # forward/backward pair (F + B where the pairs were not costed: the simulator
        # interleaves the two halves layer by layer on one in-order compute stream)
        fb = pair_s if pair_s is not None else mean("F") + mean("B")
        return max(0.0, (pp / 2 - 1) * (fb + mean("B") - 3 * mean("W")))

    def steady_run(self, pp: int, vpp: int, expert_parallel: bool) -> tuple[int, int] | None:
        # twice its own period (one micro-batch from each end): m1 = 2 pp + 8, k = 4; with expert
        # parallelism 3 pp + 16, and from PP16 on 6.5 pp (steady_multiples: Kimi K2 TP4 PP8 EP48
        # on 144-GPU domains repeats every 8 from a run of 40, not of 32; DeepSeek-V3 TP4 PP16
        # EP16 on 144-GPU domains every 24 from a run of 104, not of 80)
        if not expert_parallel:
            return (2 * pp + 8, 4)
        return (max(3 * pp + 16, (13 * pp + 1) // 2 if pp >= 16 else 0), 4)

    def steady_multiples(self, pp: int, expert_parallel: bool) -> tuple[int, ...]:
        # with expert parallelism from PP16 on also 24 micro-batches: 5 of 7 PP16 DualPipe layouts
        # of the PP map drawn at random that repeat over neither 4 nor 8 do over 24, within 2e-13
        # of the full step (docs/results/benchmarks/log.md)
        return (1, 2, 6) if expert_parallel and pp >= 16 else (1, 2)

    def steady_retries(self) -> bool:
        # 11 of 14 retries certified in the PP map (PipelineSchedule.steady_retries): its steps
        # settle into patterns longer than a short run holds (a period of 24 at 200 of 512)
        return True

    def steady_run_shortest(self, pp: int, vpp: int, expert_parallel: bool) -> int | None:
        # Without expert parallelism the outermost ranks' steady phase is m1 / 2 - pp + 1 pairs of
        # pairs. With it the inner stages settle later, about as late as the warm-up is long, so a
        # run needs 2 pp more: 4 pp + 8. DeepSeek-V3 on 2,048 H800 (PP16, EP64, 120 micro-batches,
        # with the FP8 quantisation passes) repeats at 72 and 80 and not at 48, 56 or 64: in its full
        # run stage 7's records shift by 44 ms from one period of 4 to the next at micro-batch 20 and
        # settle to 1e-12 only from 36 on; Kimi K2 TP4 PP8 EP48 repeats from a run of 40, not 32.
        # (2 pp + 16 = 48 had certified DeepSeek-V3 before the quantisation passes.)
        return 2 * pp + 8 + (2 * pp if expert_parallel else 0)
