"""The operation-level trace of one step: what each rank runs, in order.

* :mod:`.builder` — :func:`~workloads.trace.builder.build_trace`: the model, training and
  layout into a per-rank program of compute ops and collectives, stage by stage of the
  pipeline schedule;
* :mod:`.ops` — :class:`~workloads.trace.ops.Op` and :class:`~workloads.trace.ops.Trace`,
  the plain data the engine runs;
* :mod:`.io` — stepsim's own trace file (JSON), written and read back;
* :mod:`.chakra` — MLCommons Chakra execution traces, written and read.

A new pipeline schedule is a pure function in :mod:`workloads.schedules`; the builder
turns its order into ops.
"""
