"""The network model: transfers over the topology's links with max-min fair sharing.

* :mod:`.flows` — :class:`~simulator.network.flows.FlowNetwork`: the simpy side, phases of
  concurrent transfers, incremental recomputation and completion events;
* :mod:`.maxmin` — the max-min rate solvers (pure functions of flows and capacities);
* :mod:`.phases` — :class:`~simulator.network.phases.Transfer` and a phase's routing,
  validation and merging into a prepared phase;
* :mod:`.isolated` — phases alone on their links, run from their cached evolution;
* :mod:`.runahead` — a big link-sharing component's completions computed ahead (chains);
* :mod:`.ratememo` — large max-min solutions remembered by the flows solved (a repeated
  phase passes through the same flow sets);
* :mod:`.flowslots`, :mod:`.stats` — the in-flight flows' slot arrays, the counters;
* :mod:`.components` — the link-sharing components of the active flows, found on arrays;
* :mod:`.orbits` — a torus's translation orbits: a phase every translation of a group maps
  onto itself as one flow per orbit; :mod:`.binding` — links that can never bind a rate;
* :mod:`.collectives` — planning a collective (algorithm choice, :func:`plan_collective`)
  and running its phases; the algorithms by family in :mod:`.plans` (phases, combinators,
  group structure), :mod:`.reductions` (ring, tree, halving-doubling, hierarchical,
  NVLS/SHARP), :mod:`.torus_collective` and :mod:`.alltoall`;
* :mod:`.calibration` — the network calibration (per-hop latency, bus-bandwidth
  efficiencies), fitted to nccl-tests by :mod:`simulator.studies.calibrate`.

A new collective algorithm is a phase builder in its family's module, chosen in
:mod:`.collectives`; a new topology is a builder in :mod:`topologies`, which this package
reads as a graph.
"""
