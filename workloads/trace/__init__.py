"""The operation-level trace of one step: what each rank runs, in order.

* :mod:`.builder` — :func:`~workloads.trace.builder.build_trace`: the model, training and
  layout into a per-rank program of compute ops and collectives, stage by stage of the
  pipeline schedule, the programs' cross-rank dependencies resolved into one trace;
* :mod:`.shared` — what the programs share: the step's constants, :class:`~.shared.Workload`
  and :class:`~.shared.TraceBuilder`, which holds the sizes and kernels of every rank's
  program and makes the ops;
* :mod:`.program` — one rank's program from its schedule's actions (op helpers, pipeline
  sends and receives), with :mod:`.program_layers` (per-layer forward / backward ops: TP,
  CP and EP collectives, MoE, recomputation, activation offload) and :mod:`.program_params`
  (data-parallel gradient and parameter traffic, ZeRO, the optimizer, static memory);
* :mod:`.program_tp_overlap` — tensor-parallel communication overlap
  (``training.tp_comm_overlap``, Transformer Engine userbuffers);
* :mod:`.graphs` — CUDA graphs: which ops the host issues as one graph replay;
* :mod:`.ops` — :class:`~workloads.trace.ops.Op` and :class:`~workloads.trace.ops.Trace`,
  the plain data the engine runs;
* :mod:`.io` — stepsim's own trace file (JSON), written and read back;
* :mod:`.chakra` — MLCommons Chakra execution traces: the format and shared constants, with
  :mod:`.chakra_write` (the writer) and :mod:`.chakra_read` (the reader: the files, their
  messages and the trace assembled), which :mod:`.chakra_nodes` serves (what each node becomes).

A new pipeline schedule is a module of :mod:`workloads.pipeline` (a
:class:`~workloads.pipeline.base.PipelineSchedule` and a registry line); the builder
turns its order into ops.
"""
