"""The scenario's error: :class:`ScenarioError`, the dotted key at fault first.

A module of its own, without pydantic, so that the command line's readers of other tools'
files (:mod:`simulator.interop`) raise it without loading the schema.
"""

from __future__ import annotations

from simulator.errors import StepsimError


class ScenarioError(StepsimError):
    """A scenario that cannot be simulated; ``field`` is the dotted key at fault."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message, field=field)
