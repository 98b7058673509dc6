"""Studies: many simulations, or a simulation held against something else.

* :mod:`.sweep` — a grid of scenario overrides, run on processes or Dask, resumable (a
  sub-package: its file, cases, executors, rows and figures); :mod:`.workers` the worker pools;
* :mod:`.search` — every layout that fits, ranked by the analytic step-time estimate, the
  best simulated (a sub-package: layouts, rounds, the estimate and its parts);
* :mod:`.ppmap` — the map of where pipeline parallelism pays, a search per grid point (a
  sub-package: the map file, screen, closed-form columns, figure);
* :mod:`.validate` — the validation suite against published runs (a sub-package: cases,
  running, tables); :mod:`.calibrate`
  fits the compute and network calibrations to measurements;
* :mod:`.compare` — two runs side by side; :mod:`.bench` — one collective on a topology;
* :mod:`.goodput` — failures over a run: interruptions, checkpoints, the best interval, goodput.

A new study is a module here and a command in :mod:`simulator.cli`.
"""
