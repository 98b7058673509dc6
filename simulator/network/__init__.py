"""The network model: transfers over the topology's links with max-min fair sharing.

* :mod:`.flows` — :class:`~simulator.network.flows.FlowNetwork`: routes, the max-min rate
  solvers, phases of concurrent transfers and their completion events;
* :mod:`.collectives` — collective algorithms (ring, tree, NVLS, hierarchical, all-to-all,
  torus) planned as phases of transfers on a group of ranks;
* :mod:`.calibration` — the network calibration (per-hop latency, bus-bandwidth
  efficiencies), fitted to nccl-tests by :mod:`simulator.studies.calibrate`.

A new collective algorithm is a planner in :mod:`.collectives`; a new topology is a builder
in :mod:`topologies`, which this package reads as a graph.
"""
