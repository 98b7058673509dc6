"""Exceptions raised by :mod:`topologies`.

Every error says which scenario key (or graph element) it concerns and what is
allowed, so a user can fix the input without reading the code.
"""

from __future__ import annotations

from collections.abc import Iterable

from stepsim_errors import StepsimError


class TopologyError(StepsimError):
    """Bad cluster, network or graph description.

    ``field`` is the scenario key the error concerns (``cluster.devices``,
    ``cluster.network.shape``...) or, for graphs and files, ``topology``.
    """


class UnknownPresetError(TopologyError, KeyError):
    """A chip or cluster preset name that is not in the catalogue.

    It is both a :class:`ValueError` (via :class:`TopologyError`) and a
    :class:`KeyError`, so ``except KeyError`` around a dictionary-style lookup
    keeps working.
    """

    def __init__(self, message: str, *, field: str | None = None, allowed: Iterable[str] = ()) -> None:
        self.allowed = tuple(sorted(allowed))
        super().__init__(message, field=field)

    @classmethod
    def named(cls, what: str, name: object, allowed: Iterable[str], field: str) -> UnknownPresetError:
        """``field: unknown <what> <name>; allowed: ...`` (``allowed`` sorted)."""
        allowed = tuple(sorted(allowed))
        return cls(f"{field}: unknown {what} {name!r}; allowed: {', '.join(allowed)}", field=field, allowed=allowed)

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])
