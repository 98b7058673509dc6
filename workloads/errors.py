"""Exceptions raised by :mod:`workloads`: a model, layout, training or schedule that
cannot be laid out or run, and traces that cannot be executed.

:class:`WorkloadError` is this package's :class:`stepsim_errors.StepsimError`;
``workloads.layout.LayoutError``, ``workloads.schedules.ScheduleError`` and
``workloads.trace.ops.TraceError`` derive from it.
"""

from __future__ import annotations

from stepsim_errors import StepsimError


class WorkloadError(StepsimError):
    """A workload that cannot be built. ``field`` names the scenario key at fault
    (``training.micro_batch_size``, ``parallel.tp``...); the message is
    ``"<field>: <message>"``."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message, field=field or None)
