"""What is trained and how it is split: models, layouts, schedules, FLOPs, memory, traces.

Plain data and pure functions; nothing here imports the simulator.

* :mod:`.model` — model specifications (plain, frozen data), :mod:`.presets` the published
  ones with their sources, :mod:`.hf_config` one from a Hugging Face ``config.json``;
* :mod:`.training` — the training settings of one step; :mod:`.enums` every named choice;
* :mod:`.layout` — the parallel layout and its communication groups (Megatron-Core's
  rank generators);
* :mod:`.pipeline` — the pipeline schedules as objects, one module each, and their registry;
  :mod:`.schedules` the same as pure functions of the schedule's name; :mod:`.schedule_timing`
  a tiny reference executor of them;
* :mod:`.shapes` and :mod:`.shard` — tensor widths on one TP rank, one rank's shard of a
  micro-batch;
* :mod:`.kernels` — a kernel's FLOPs and bytes as plain data, and the constructors of the
  common ones; :mod:`.counts` the kernels of a layer and the model FLOPs; :mod:`.parameters`
  parameter counts;
* :mod:`.memory` and :mod:`.activations` — model states, buffers and activation memory;
* :mod:`.quantization` — the FP8 quantisation passes beside each FP8 GEMM;
* :mod:`.moe_kernels` and :mod:`.moe_load` — the kernels around the routed experts and how
  unevenly tokens land on them;
* :mod:`.moe_unfused` — Megatron-Core's unfused MoE router and permutations, one launch an op;
* :mod:`.trace` — the operation-level trace of one step;
* :mod:`.errors` — :class:`~workloads.errors.WorkloadError` and its kin.
"""
