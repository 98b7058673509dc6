"""SIGINT and SIGTERM: every ``stepsim`` command ends with one line and exit code 128 + the
signal's number (130 for SIGINT, Ctrl-C; 143 for SIGTERM, ``kill``), no traceback.

While a command runs (:func:`handled`), both signals raise :class:`Interrupted` (a
``KeyboardInterrupt``) in the main thread, so that the ``finally`` blocks on the way out run:
a staging folder is removed (:mod:`simulator.results.outdir`), worker pools end their
processes (:mod:`simulator.studies.workers`), a sweep's rows finished so far stay in
``rows.jsonl``. A second signal while the first unwinds ends the process at once (exit code
of that signal): the way out of a clean-up that hangs.

A child forked while the handlers are installed (the workers of an executor given with
``--executor``) ends at once on either signal, as without them, rather than raising in its
task. Child processes of stepsim's own (pool workers, the figure writer of
:mod:`simulator.results.beside`) call
:func:`simulator.results.beside.child_signal_defaults`: they ignore SIGINT (Ctrl-C reaches
the whole process group; the parent ends them) and die at once on SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

#: Exit codes of a command ended by SIGINT and SIGTERM (the shells' 128 + signal number).
EXIT_SIGINT = 128 + int(signal.SIGINT)
EXIT_SIGTERM = 128 + int(signal.SIGTERM)

_WORDS = {signal.SIGINT: "interrupted (SIGINT)", signal.SIGTERM: "terminated (SIGTERM)"}


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived while a command ran (``signum``)."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(int(signum))  # args: the number, so that type(err)(*err.args) rebuilds it
        self.signum = int(signum)

    def __str__(self) -> str:
        try:
            return _WORDS.get(signal.Signals(self.signum), f"ended by signal {self.signum}")
        except ValueError:
            return f"ended by signal {self.signum}"

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` inside the block (main thread only;
    elsewhere the block runs with the handlers as they are); the old handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    first: list[int] = []
    pid = os.getpid()

    def on_signal(signum, _frame):
        if os.getpid() != pid:  # a child forked with this handler (an executor's worker): die quietly
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if first:  # the first one is unwinding: end now
            with contextlib.suppress(OSError):
                os.write(
                    2, f"stepsim: {_WORDS.get(signal.Signals(signum), 'signal')} again; exiting at once\n".encode()
                )
            os._exit(128 + signum)
        first.append(signum)
        raise Interrupted(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
