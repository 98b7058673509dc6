"""The map of where pipeline parallelism pays (``stepsim ppmap``): a layout search at every
point of scale-up domain size x scale-out bandwidth, and today's systems.

* :mod:`.run` — :func:`run_map` (screen, simulate in rounds, assemble) and the map table
  (:func:`assemble`); the map file's format is in its docstring;
* :mod:`.spec` — the map file (:func:`~.spec.load_map`) and its points;
* :mod:`.screen` — each point's screen: every layout checked, memory-estimated and ranked,
  the candidates chosen;
* :mod:`.roofline` — the closed-form columns: the memory of a batch-global auxiliary loss
  and a roofline of what PP saves against what it costs;
* :mod:`.plot` — the map figure;
* :mod:`.recheck` — each point's best layouts simulated again on this version and compared
  with the store (``--recheck``).
"""

from simulator.studies.ppmap.run import assemble, cases_of, run_map, with_fallbacks

__all__ = ["assemble", "cases_of", "run_map", "with_fallbacks"]
