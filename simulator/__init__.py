"""stepsim: a discrete-event simulator of one LLM training step on a cluster.

>>> from simulator import simulate
>>> result = simulate("scenario.yaml")      # or a mapping, or a Scenario
>>> result.summary["mfu"], result.events, result.memory

See :func:`simulate`, :func:`load_scenario` and :class:`Result`; the scenario file and the
summary record are specified in ``docs/scenario.md``, the other file formats in
``docs/formats.md``.

``import simulator`` is light (numpy, no pandas, matplotlib, simpy or pydantic), so that
``stepsim --help`` and a bare import start in a fraction of a second: the engine and the
scenario schema load when :func:`simulate` first runs or a schema name is first used
(PEP 562), pandas when a table is asked for, matplotlib when a figure is.

The layers, bottom up (``docs/design.md``; ``tests/test_architecture.py`` holds them):
:mod:`.errors` and :mod:`.version` (the base), :mod:`.network` (flows over links),
:mod:`.scenario` (the validated scenario), :mod:`.engine` (the event loop),
:mod:`.results` (tables, figures, reports, the summary record), :mod:`.simulate` (the entry
point) with :mod:`.step` (one step run) and :mod:`.steady` (steady-state skipping), :mod:`.studies` (sweeps, search, the map, validation),
:mod:`.interop` (other tools' files) and :mod:`.cli` (the command line).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from simulator.results.result import Result
from simulator.simulate import simulate
from simulator.version import __version__

__all__ = ["simulate", "load_scenario", "Scenario", "ScenarioError", "Result", "__version__"]

#: public names defined by the scenario layer (pydantic), by the module each is imported from on first use
_SCHEMA_NAMES = {
    "load_scenario": "simulator.scenario.loading",
    "Scenario": "simulator.scenario.resolved",
    "ScenarioError": "simulator.scenario.schema",
}

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from simulator.scenario.loading import load_scenario
    from simulator.scenario.resolved import Scenario
    from simulator.scenario.schema import ScenarioError


def __getattr__(name: str):
    if name not in _SCHEMA_NAMES:
        raise AttributeError(f"module 'simulator' has no attribute {name!r}")
    value = getattr(importlib.import_module(_SCHEMA_NAMES[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
