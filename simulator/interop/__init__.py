"""Reading the files of other tools into stepsim's own terms, and writing them back.

* :mod:`.megatron` — a Megatron-LM command line into a scenario (``stepsim import``), read by
  :mod:`.megatron_args`, :mod:`.megatron_layout` (the pipeline split, the MoE layer pattern) and
  :mod:`.megatron_precision` (dtype, MoE dispatch dtype, FP8 weights), :mod:`.megatron_memory`
  (the memory flags: saved activations, router dtype, capacity, precision-aware optimizer) and
  :mod:`.megatron_moe` (the token dispatcher, the expert GEMMs' launches); :mod:`.export_megatron`
  — a scenario as the Megatron-LM launch line that
  would run it (``stepsim export megatron``), which :mod:`.megatron` reads back;
  :mod:`.export_maxtext` — a scenario as a MaxText configuration (``stepsim export maxtext``);
* :mod:`.nccl_tests` — nccl-tests output into bus-bandwidth measurements;
* :mod:`.kineto` — PyTorch profiler (Kineto) traces into measured kernel timings.

Traces in other formats (Chakra) are read and written in :mod:`workloads.trace`.
"""
