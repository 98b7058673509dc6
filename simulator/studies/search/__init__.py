"""The layout search (``stepsim search``): every layout of a model on a cluster within the
bounds, pruned by memory, ranked by an analytic step-time estimate, the best simulated in
adaptive rounds until no layout left can win.

* :mod:`.run` — :func:`search` and its result, tables and outputs;
* :mod:`.layouts` — the bounds (:class:`~.layouts.SearchBounds`), every layout within them,
  their labels and placements;
* :mod:`.rounds` — which layouts are simulated: the candidate cap, the adaptive rounds and
  their stopping bound, duplicates;
* :mod:`.estimate` — the analytic step time and memory of a layout, built from the trace
  builder's own sizes; :mod:`.layer_costs` its per-layer costs; :mod:`.network_model` one
  collective alone on the network, in closed form; :mod:`.dualpipe_pairs` DualPipe's
  overlapped forward/backward pairs on one compute stream.
"""

from simulator.studies.search.layouts import SearchBounds
from simulator.studies.search.run import SearchResult, search

__all__ = ["SearchBounds", "SearchResult", "search"]
