"""Megatron-Core's batch-level overlap of the expert all-to-all (``--overlap-moe-expert-parallel-comm``,
Megatron-Core 0.14; ``training.overlap_moe_expert_parallel_comm``): the "combined 1F1B".

Megatron-Core (``megatron/core/pipeline_parallel/combined_1f1b.py`` at d98e8a64,
``combined_1f1b_schedule_for_no_pipelining`` and ``..._for_interleaved_pipelining``) runs each
backward beside the next micro-batch's forward as one combined step, layer by layer on two
streams, so that one pass's dispatch and combine all-to-alls hide behind the other's attention
and MLP compute. Without a pipeline, with ``m`` micro-batches: the first forward alone, then
``m - 1`` combined steps (backward ``i`` beside forward ``i + 1``), then the last backward
alone. With an interleaved pipeline the schedule runs one more warm-up forward
(``schedules.py``: ``num_warmup_microbatches += 1``) and pairs the steady phase the same way.

:func:`combine_forward_backward` makes those steps from a schedule's own step list: each
backward immediately followed by a forward of another micro-batch becomes one two-action step,
which the trace builder runs as an overlapped pair (as DualPipe's, :mod:`workloads.pipeline.dualpipe`).
"""

from __future__ import annotations

from collections.abc import Sequence

from workloads.pipeline.base import Step


def combine_forward_backward(steps: Sequence[Step]) -> list[Step]:
    """``steps`` with every backward (``B``) that is directly followed by a forward (``F``) of
    another micro-batch merged with it into one step ``(F, B)``; every other step as it is.

    On 1F1B without a pipeline (``F0 B0 F1 B1 ... ``) this gives Megatron-Core's ``F0, (F1, B0),
    (F2, B1), ..., B(m-1)``; on interleaved 1F1B's steady phase (``... F B F B ...``) it pairs
    each backward with the forward after it, the first steady forward running alone as the
    extra warm-up forward. Actions keep their order, so a valid order stays valid."""
    out: list[Step] = []
    i = 0
    while i < len(steps):
        st = steps[i]
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        if (
            nxt is not None
            and len(st) == 1
            and len(nxt) == 1
            and st[0].op == "B"
            and nxt[0].op == "F"
            and nxt[0].mb != st[0].mb
        ):
            out.append((nxt[0], st[0]))
            i += 2
        else:
            out.append(st)
            i += 1
    return out
