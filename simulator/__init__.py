"""stepsim: a discrete-event simulator of one LLM training step on a cluster.

>>> from simulator import simulate
>>> result = simulate("scenario.yaml")      # or a mapping, or a Scenario
>>> result.summary["mfu"], result.events, result.memory

See :func:`simulate`, :func:`load_scenario` and :class:`Result`; the scenario file and the
summary record are specified in ``docs/scenario.md``, the other file formats in
``docs/formats.md``.
"""

from simulator._version import __version__
from simulator.result import Result
from simulator.schema import Scenario, ScenarioError, load_scenario
from simulator.simulate import simulate

__all__ = ["simulate", "load_scenario", "Scenario", "ScenarioError", "Result", "__version__"]
