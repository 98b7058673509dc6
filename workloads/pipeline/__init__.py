"""Pipeline schedules as objects: one module a schedule, each a :class:`~.base.PipelineSchedule`
with the hooks the trace builder, the analytic estimate and steady-state skipping use, and the
registry :data:`REGISTRY` keyed by the scenario's ``schedule`` value.

* :mod:`.base` — the :class:`~.base.PipelineSchedule` base and its hooks, :class:`~.base.Action`,
  :data:`~.base.Step`, :class:`~.base.ScheduleError`;
* :mod:`.gpipe` — GPipe, all forwards then all backwards;
* :mod:`.one_f_one_b` — Megatron's 1F1B;
* :mod:`.interleaved` — Megatron's interleaved 1F1B (virtual stages);
* :mod:`.zb_h1` — ZB-H1, 1F1B with split backwards;
* :mod:`.dualpipe` — DualPipe, both directions and overlapped forward/backward pairs;
* :mod:`.ep_overlap` — Megatron-Core's combined 1F1B: a schedule's backward and next forward
  paired (``training.overlap_moe_expert_parallel_comm``).

A new schedule is a module here with a :class:`~.base.PipelineSchedule` subclass and a line in
:data:`REGISTRY` (and its name in :data:`workloads.enums.SCHEDULES`).
"""

from __future__ import annotations

from workloads.pipeline.base import PipelineSchedule, ScheduleError
from workloads.pipeline.dualpipe import DualPipe
from workloads.pipeline.gpipe import GPipe
from workloads.pipeline.interleaved import Interleaved1F1B
from workloads.pipeline.one_f_one_b import OneFOneB
from workloads.pipeline.zb_h1 import ZBH1

#: schedule name -> the schedule (one instance each: they hold no state)
REGISTRY: dict[str, PipelineSchedule] = {
    s.name: s for s in (GPipe(), OneFOneB(), Interleaved1F1B(), ZBH1(), DualPipe())
}


def get_schedule(name: str) -> PipelineSchedule:
    """The schedule called ``name``, or a :class:`ScheduleError` naming ``schedule`` and the
    allowed names."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ScheduleError(
            f"unknown schedule {name!r}; expected one of {', '.join(REGISTRY)}", field="schedule"
        ) from None
