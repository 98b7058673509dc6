"""Studies: many simulations, or a simulation held against something else.

* :mod:`.sweep` — a grid of scenario overrides, run on processes or Dask, resumable (a
  sub-package: its file, cases, executors, rows and figures); :mod:`.workers` the worker pools;
* :mod:`.search` — every layout that fits, ranked by :mod:`.estimate` (the analytic step
  time), the best simulated;
* :mod:`.ppmap` — the map of where pipeline parallelism pays, a search per grid point;
* :mod:`.validate` — the validation suite against published runs; :mod:`.calibrate`
  fits the compute and network calibrations to measurements;
* :mod:`.compare` — two runs side by side; :mod:`.bench` — one collective on a topology.

Their parts: the search's layouts and bounds (:mod:`.search_layouts`) and its
adaptive rounds (:mod:`.search_rounds`); the map's file (:mod:`.ppmap_spec`), screen
(:mod:`.ppmap_screen`), closed-form columns (:mod:`.ppmap_roofline`) and figure
(:mod:`.ppmap_plot`); the estimate's per-layer costs (:mod:`.layer_costs`), collective
times alone on the network (:mod:`.network_model`) and DualPipe's overlapped pairs
(:mod:`.dualpipe_pairs`).

A new study is a module here and a command in :mod:`simulator.cli`.
"""
