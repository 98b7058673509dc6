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
  command says how many; the others' results are written as usual);
* 130 / 143: ended by SIGINT (Ctrl-C) / SIGTERM (one line, no traceback; worker processes
  ended, outputs left as they were before the command: :mod:`simulator.cli.interrupts`).

Output text that the terminal's encoding cannot show (``PYTHONIOENCODING=ascii`` and a
non-ASCII scenario name) is written with backslash escapes, and an ``MPLBACKEND`` that
matplotlib does not know is replaced by Agg (with a line saying so): stepsim only writes
figures to files.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from simulator.cli.interrupts import EXIT_SIGINT, EXIT_SIGTERM, Interrupted, handled
from stepsim_errors import StepsimError

EXIT_OK, EXIT_INTERNAL, EXIT_BAD_INPUT, EXIT_OFF_TARGET, EXIT_CASES_FAILED = 0, 1, 2, 3, 4
EXIT_INTERRUPTED, EXIT_TERMINATED = EXIT_SIGINT, EXIT_SIGTERM  # 130, 143

#: The exit codes as ``--help`` prints them.
EXIT_CODES_HELP = (
    f"exit codes: {EXIT_OK} success, {EXIT_INTERNAL} internal error, {EXIT_BAD_INPUT} bad input, "
    f"{EXIT_OFF_TARGET} validate --max-error exceeded, {EXIT_CASES_FAILED} some cases of a sweep, "
    f"search or validate failed, {EXIT_INTERRUPTED} interrupted (SIGINT), {EXIT_TERMINATED} terminated (SIGTERM)"
)

#: Set to 1 (or true, yes, on) for the traceback of an error; 0, false, no, off or empty: none.
DEBUG_ENV = "STEPSIM_DEBUG"


def debug_enabled() -> bool:
    """Whether :data:`DEBUG_ENV` asks for tracebacks (a true value: 1, true, yes, on)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class CliError(StepsimError):
    """Bad input detected by the command line itself (``field``: the flag or argument)."""


#: The most devices a flag may name: the largest cluster a scenario may have
#: (``simulator.scenario.checks.MAX_DEVICES``, not imported here: it would load the scenario
#: package on every command's start).
MAX_DEVICES_FLAG = 262_144
#: The most worker processes ``--jobs`` may start.
MAX_JOBS = 1024


def int_flag(lo: int, hi: int, what: str = "an integer") -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``[lo, hi]``; argparse names the flag when it refuses."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} from {lo:,} to {hi:,}, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{what} from {lo:,} to {hi:,}, got {value:,}")
        return value

    parse.__name__ = "integer"
    return parse


def float_flag(lo: float, hi: float = math.inf, what: str = "a finite number") -> Callable[[str], float]:
    """An argparse ``type``: a finite number in ``[lo, hi]`` (no NaN, no infinity)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and lo <= value <= hi):
            bound = f">= {lo:g}" if hi == math.inf else f"from {lo:g} to {hi:g}"
            raise argparse.ArgumentTypeError(f"{what} {bound}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def resolve_scenario_path(arg: str) -> Path:
    """A scenario file, or the file of the built-in scenario of that name."""
    from simulator.scenario.loading import builtin_file, builtin_scenarios
    from stepsim_fileio import is_there

    p = Path(arg)
    if is_there(p):  # a broken link, a link loop or a name too long: reading it says which
        return p
    built = builtin_file(arg, p)
    if built is None:
        raise CliError(
            f"scenario: no file {arg!r} and no built-in scenario of that name; built-in: {', '.join(builtin_scenarios())}",
            field="scenario",
        )
    return built


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


def run(ap: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the command and return its exit code: a :class:`StepsimError` or an
    ``OSError`` is bad input (exit 2, its one-line message); SIGINT / SIGTERM end it with one
    line (exit 130 / 143); anything else is an internal error (exit 1, a one-line hint; the
    traceback with ``STEPSIM_DEBUG=1``)."""
    _tolerant_output()
    stdout = sys.stdout
    sys.stdout = _CheckedStdout(stdout)
    try:
        return _run(ap, argv)
    finally:
        sys.stdout = stdout


def _run(ap: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    with handled():
        try:
            try:
                args = ap.parse_args(argv)
            except SystemExit as e:  # argparse: usage errors exit 2 already
                return int(e.code or 0)
            _usable_matplotlib_backend()
            code = args.func(args)
            sys.stdout.flush()  # a full disk or closed pipe is reported here, not at exit
            return code
        except KeyboardInterrupt as err:  # Interrupted (SIGINT, SIGTERM), or a KeyboardInterrupt raised elsewhere
            code = err.exit_code if isinstance(err, Interrupted) else EXIT_INTERRUPTED
            print(f"stepsim: {err if isinstance(err, Interrupted) else 'interrupted (SIGINT)'}", file=sys.stderr)
            return code
        except (StepsimError, OSError) as err:
            if isinstance(err, StdoutError):
                _silence_stdout()
                if err.errno == errno.EPIPE:
                    return EXIT_OK  # the reader stopped reading (`| head`): nothing to say, no one to say it to
                err = f"stdout: cannot write: {err.strerror}"
            print(f"stepsim: error: {err}", file=sys.stderr)
            if debug_enabled():
                traceback.print_exc()
            return EXIT_BAD_INPUT
        except MemoryError as err:  # the frames of the traceback hold the memory: free them before saying so
            err.__traceback__ = None
            print(
                "stepsim: out of memory: the command needs more memory than this process may use "
                "(a smaller scenario: fewer devices, layers or micro-batches, a smaller ep or cp, no --exact)",
                file=sys.stderr,
            )
            return EXIT_INTERNAL
        except Exception as err:  # noqa: BLE001 — an internal bug: say so, no traceback unless asked
            print(
                f"stepsim: internal error: {type(err).__name__}: {err} (a bug in stepsim; set {DEBUG_ENV}=1 for "
                "a traceback)",
                file=sys.stderr,
            )
            if debug_enabled():
                traceback.print_exc()
            return EXIT_INTERNAL


class StdoutError(OSError):
    """Writing stdout failed: a closed pipe (``| head``), a full disk (``> /dev/full``)."""


class _CheckedStdout:
    """``sys.stdout`` while a command runs: an ``OSError`` writing it becomes a
    :class:`StdoutError`, so that the message says it was stdout."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as err:
            raise StdoutError(err.errno, err.strerror) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as err:
            raise StdoutError(err.errno, err.strerror) from None

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _silence_stdout() -> None:
    """Point stdout at the null device: what is still buffered for a reader that is gone is
    dropped, instead of failing again when the interpreter flushes it on exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no file descriptor (a test's capture)
        pass


def _tolerant_output() -> None:
    """stdout and stderr write what their encoding cannot show as backslash escapes (a
    non-ASCII scenario name under ``PYTHONIOENCODING=ascii``) instead of failing."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            with contextlib.suppress(ValueError, OSError):  # a stream that cannot change: leave it
                stream.reconfigure(errors="backslashreplace")


def _usable_matplotlib_backend() -> None:
    """An ``MPLBACKEND`` matplotlib refuses becomes Agg, with a line saying so (stepsim draws
    into files only). Looked at only when set: matplotlib is not imported otherwise."""
    value = os.environ.get("MPLBACKEND")
    if not value or "matplotlib" in sys.modules:
        return
    del os.environ["MPLBACKEND"]  # matplotlib reads it on import and refuses a bad one there
    try:
        import matplotlib
        from matplotlib import rcsetup
    except ImportError:  # no matplotlib: nothing will draw
        os.environ["MPLBACKEND"] = value
        return
    try:
        rcsetup.validate_backend(value)
    except ValueError:
        print(f"stepsim: MPLBACKEND={value!r} is not a matplotlib backend; drawing with Agg", file=sys.stderr)
        value = "Agg"
    os.environ["MPLBACKEND"] = value
    matplotlib.rcParams["backend"] = value
