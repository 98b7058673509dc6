"""The one base of every error stepsim raises for bad input: :class:`StepsimError`.

A module of its own, below the three packages (``topologies``, ``workloads`` and
``simulator`` all import it; it imports nothing of theirs), so that each package's
errors share one base without the packages importing each other. The tree::

    StepsimError                      stepsim_errors (here)
    ├── TopologyError                 topologies.errors (UnknownPresetError: also a KeyError)
    ├── WorkloadError                 workloads.errors (LayoutError, ScheduleError, TraceError)
    ├── ScenarioError                 simulator.scenario.errors (the scenario file and what it resolves to)
    ├── InputFileError                stepsim_fileio (a file that cannot be read as what it should be)
    ├── NetworkError                  simulator.errors (CollectiveError, CalibrationError, BenchError)
    ├── ReportError                   simulator.errors (PlotError: a report or plot that cannot be drawn)
    ├── StudyError                    simulator.errors (ValidationError, WorkerVersionError,
    │                                   WorkerLostError, ExecutorError, CalibrationInputError,
    │                                   KinetoTraceError, NcclTestsError, GoodputError)
    ├── OutputPathError               simulator.results.outdir (an output path that cannot be written)
    └── CliError                      simulator.cli.common (flags the command line checks itself)

Every class is built the same way, ``Error(message, *, field=None)`` (a class may add
keyword-only arguments, as :class:`~stepsim_fileio.InputFileError`'s ``path``);
:class:`ScenarioError` and :class:`WorkloadError` put the field in front of the message
(``parallel.tp: must divide ...``), the others are given the whole line.

The command line turns a :class:`StepsimError` (and an ``OSError``) into exit 2 with its
one-line message; anything else is an internal error (exit 1).
"""

from __future__ import annotations


class StepsimError(ValueError):
    """Bad input: one line that names what is at fault and what is allowed.

    ``field`` is the dotted scenario key (``parallel.tp``, ``cluster.network.shape``) or
    the input (``--devices``, a file name, ``topology``) at fault, or ``None`` when the
    error concerns no one key. By convention the message starts with it. A
    :class:`ValueError`, so that code catching ``ValueError`` keeps working.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(_one_line(message))
        self.field = _one_line(field) if field else field

    @property
    def reason(self) -> str:
        """The message without its leading ``"<field>: "``: what is wrong, to say of
        another key (``perturbations[2].link`` for a topology's ``perturbations.link``)."""
        message = str(self)
        head = f"{self.field}: " if self.field else ""
        return message[len(head) :] if head and message.startswith(head) else message

    @classmethod
    def from_error(cls, err: StepsimError, field: str | None = None):
        """``err`` as this class: the same field (``field`` when ``err`` names none) and
        message, which starts with the field."""
        name = err.field or field
        return _restore(cls, f"{name}: {err.reason}" if name else str(err), name)

    def __reduce__(self):
        # Subclasses keep their own constructor signatures, so rebuild through the base
        # (errors cross process boundaries in sweeps and validation runs).
        return _restore, (type(self), str(self.args[0]) if self.args else "", self.field), self.__dict__


def _one_line(text: str) -> str:
    """``text`` with its non-printable characters escaped (a newline as ``\\n``, a
    right-to-left override as ``\\u202e``): a key or value from a file cannot break the
    message over lines or reorder it on the terminal."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _restore(cls: type, message: str, field: str | None) -> StepsimError:
    out = cls.__new__(cls)
    StepsimError.__init__(out, message, field=field)
    return out
