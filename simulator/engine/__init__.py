"""The event engine: runs a per-rank trace of ops on simpy over the network model.

* :mod:`.loop` — :class:`~simulator.engine.loop.Engine`: one simpy process per stream of
  each simulated rank, compute ops as timeouts, chains of known durations, rendezvous;
* :mod:`.lowering` — what a collective or send runs on the network, in one call per op:
  plan, twin groups, symmetry quotient (:mod:`.quotient`), merged network phases;
* :mod:`.private` — communication ops nothing else can meet, run as known durations;
* :mod:`.ordering` — which communication ops of a rank never run at once (their windows
  on the rank's compute stream), for :mod:`.private`;
* :mod:`.compute` — the compute model: the time of a kernel from its FLOPs and bytes on a
  chip (roofline with calibrated efficiencies);
* :mod:`.accounting` — idle attribution: which wait on which stream was exposed
  communication, pipeline bubble or imbalance.
* :mod:`.grouped_gemm` — grouped-GEMM efficiency by shape (few tokens per expert);
* :mod:`.host` — the host side: one CPU stream per simulated rank issuing its kernels
  (launch cost, blocking syncs, CUDA graphs).

A new kind of compute op gets its cost in :mod:`.compute`; a new collective algorithm goes
in :mod:`simulator.network`, not here.
"""
