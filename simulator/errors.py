"""The simulator's error classes, from the one base :class:`StepsimError`.

``from simulator.errors import StepsimError`` catches every bad-input error of stepsim,
whichever package raised it (the tree is in :mod:`stepsim_errors`). This module holds
the bases of the simulator's layers that several modules raise — the network model
(:class:`NetworkError`), results and reports (:class:`ReportError`) and the studies
(:class:`StudyError`) — so that a module can raise them without importing another's
code; the scenario's (``simulator.scenario.schema.ScenarioError``) and the input files'
(``stepsim_fileio.InputFileError``) live beside the code that raises them. Each
class is also importable from its old module (``simulator.network.flows.NetworkError``...).
"""

from __future__ import annotations

from stepsim_errors import StepsimError


class NetworkError(StepsimError):
    """Bad input to the network model (a transfer, a capacity, a weight), a collective that
    cannot be planned, a network calibration or a benchmark size."""


class ReportError(StepsimError):
    """A report or plot that cannot be drawn: a missing file, an unknown column, the
    plotting library."""


class StudyError(StepsimError):
    """A study that cannot run: a bad case file, sweep table, measured-timing file or log,
    or workers of another stepsim version."""


__all__ = ["NetworkError", "ReportError", "StepsimError", "StudyError"]
