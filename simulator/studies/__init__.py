"""Studies: many simulations, or a simulation held against something else.

* :mod:`.sweep` — a grid of scenario overrides, run on processes or Dask, resumable;
  :mod:`.sweep_plots` its figures; :mod:`.workers` the worker pools;
* :mod:`.search` — every layout that fits, ranked by :mod:`.estimate` (the analytic step
  time), the best simulated;
* :mod:`.ppmap` — the map of where pipeline parallelism pays, a search per grid point;
* :mod:`.validate` — the validation suite against published runs; :mod:`.calibrate`
  fits the compute and network calibrations to measurements;
* :mod:`.compare` — two runs side by side; :mod:`.bench` — one collective on a topology.

A new study is a module here and a command in :mod:`simulator.cli`.
"""
