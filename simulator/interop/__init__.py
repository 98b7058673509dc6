"""Reading the files of other tools into stepsim's own terms.

* :mod:`.megatron` — a Megatron-LM command line into a scenario (``stepsim import``), read by
  :mod:`.megatron_args`;
* :mod:`.nccl_tests` — nccl-tests output into bus-bandwidth measurements;
* :mod:`.kineto` — PyTorch profiler (Kineto) traces into measured kernel timings.

Traces in other formats (Chakra) are read and written in :mod:`workloads.trace`.
"""
