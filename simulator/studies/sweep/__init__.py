"""Parameter sweeps: many scenarios, one table, resumable after a crash.

* :mod:`.run` — :func:`sweep` and :func:`run_cases` (the sweep file's format is in its
  docstring);
* :mod:`.spec` — the sweep file: its schema, the dotted scenario keys its axes name and its
  ``where`` expressions;
* :mod:`.cases` — the cases, the key of each (its resolved scenario's SHA-256) and the
  checks ``skip_invalid`` applies;
* :mod:`.executors` — running cases: in a worker, on local processes, any
  ``concurrent.futures`` executor or Dask;
* :mod:`.rows` — the append-only row store ``rows.jsonl`` and the tables built from it;
* :mod:`.plots` — the sweep's figures.
"""

from simulator.studies.sweep.run import run_cases, sweep

__all__ = ["run_cases", "sweep"]
