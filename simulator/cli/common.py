"""What every ``stepsim`` command module shares: the exit codes, :class:`CliError`, the
scenario argument, the top-level parser and the mapping of errors to exit codes.

The command modules (``simulator.cli.app``, ``simulator.cli.sweep``, ``simulator.cli.validate``)
import this one and never each other's internals, so that there is no import cycle
between them: ``simulator.cli.app`` registers the others' commands.

Exit codes (the same for every command; README.md and docs/formats.md list them):

* 0: success;
* 1: an internal error (traceback only with ``STEPSIM_DEBUG=1``);
* 2: bad input (one line naming the field and what is allowed, no traceback): a
  :class:`stepsim_errors.StepsimError` or an ``OSError``;
* 3: ``stepsim validate --max-error F``: a case is off by more than ``F``;
* 4: ``sweep``, ``search`` or ``validate`` ran, but some of its cases failed (the
  command says how many; the others' results are written as usual).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import Optional, Sequence

from stepsim_errors import StepsimError

EXIT_OK, EXIT_INTERNAL, EXIT_BAD_INPUT, EXIT_OFF_TARGET, EXIT_CASES_FAILED = 0, 1, 2, 3, 4

#: The exit codes as ``--help`` prints them.
EXIT_CODES_HELP = (
    f"exit codes: {EXIT_OK} success, {EXIT_INTERNAL} internal error, {EXIT_BAD_INPUT} bad input, "
    f"{EXIT_OFF_TARGET} validate --max-error exceeded, {EXIT_CASES_FAILED} some cases of a sweep, "
    "search or validate failed"
)

#: Set (to anything) for the traceback of an error.
DEBUG_ENV = "STEPSIM_DEBUG"


class CliError(StepsimError):
    """Bad input detected by the command line itself (``field``: the flag or argument)."""


def resolve_scenario_path(arg: str) -> Path:
    """A scenario file, or the file of the built-in scenario of that name."""
    from simulator.scenario.loading import builtin_scenarios

    p = Path(arg)
    if p.exists() or p.is_symlink():  # a broken link or a link loop: reading it says which
        return p
    built = builtin_scenarios()
    if arg in built:
        return built[arg]
    raise CliError(
        f"scenario: no file {arg!r} and no built-in scenario of that name; built-in: {', '.join(built)}", "scenario"
    )


def new_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """The ``stepsim`` parser (``--version``, the exit codes in ``--help``) and its sub-command
    parsers, to which each command module's ``register`` adds its commands."""
    from simulator import __version__

    ap = argparse.ArgumentParser(
        prog="stepsim",
        description="Simulate one LLM training step on a cluster.",
        epilog=EXIT_CODES_HELP + ". File formats: docs/scenario.md, docs/formats.md.",
    )
    ap.add_argument("--version", action="version", version=f"stepsim {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    return ap, sub


def run(ap: argparse.ArgumentParser, argv: Optional[Sequence[str]] = None) -> int:
    """Parse ``argv``, run the command and return its exit code: a :class:`StepsimError` or an
    ``OSError`` is bad input (exit 2, its one-line message); anything else is an internal
    error (exit 1, a one-line hint; the traceback with ``STEPSIM_DEBUG=1``)."""
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:  # argparse: usage errors exit 2 already
        return int(e.code or 0)
    try:
        return args.func(args)
    except (StepsimError, OSError) as err:
        print(f"stepsim: error: {err}", file=sys.stderr)
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
        return EXIT_BAD_INPUT
    except Exception as err:  # noqa: BLE001 — an internal bug: say so, no traceback unless asked
        print(
            f"stepsim: internal error: {type(err).__name__}: {err} (a bug in stepsim; set {DEBUG_ENV}=1 for "
            "a traceback)",
            file=sys.stderr,
        )
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
        return EXIT_INTERNAL
