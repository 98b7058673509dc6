"""The event engine: runs a per-rank trace of ops on simpy over the network model.

* :mod:`.loop` — :class:`~simulator.engine.loop.Engine`: one simpy process per stream of
  each simulated rank, compute ops as timeouts, collectives lowered into network phases,
  the symmetry quotient (one rank stands for its identical twins) and the events table;
* :mod:`.compute` — the compute model: the time of a kernel from its FLOPs and bytes on a
  chip (roofline with calibrated efficiencies);
* :mod:`.accounting` — idle attribution: which wait on which stream was exposed
  communication, pipeline bubble or imbalance.

A new kind of compute op gets its cost in :mod:`.compute`; a new collective algorithm goes
in :mod:`simulator.network.collectives`, not here.
"""
