"""Run one function in a forked child process beside the caller, and wait for it.

``stepsim run --out`` writes tables and a Chrome trace (pyarrow, text) and renders two
figures (matplotlib): independent work of about the same size, each a few seconds on a
large step. :meth:`~simulator.results.result.Result.write` renders the figures in a child
forked from the caller, so both halves run at once on two cores; the child inherits the
result (nothing is pickled) and sends back only whether it succeeded.

Forking is safe only where the child cannot inherit a lock another thread holds, so
:func:`can_fork` asks for a process whose only Python thread is the caller's (a
Jupyter kernel has several: it writes in turn), the ``fork`` start method (Linux; not
Windows, nor macOS's default) and a second usable CPU (one core gains nothing). Where
it says no, the caller runs the function itself: the files are the same either way.

The child ignores SIGINT and dies on SIGTERM (:func:`child_signal_defaults`); a caller
leaving early (an exception, an interrupt) ends it with :meth:`Beside.stop`.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import traceback
from collections.abc import Callable


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def can_fork() -> bool:
    """Whether :class:`Beside` may fork here (see the module's note)."""
    return "fork" in multiprocessing.get_all_start_methods() and usable_cpus() > 1 and threading.active_count() == 1


def child_signal_defaults() -> None:
    """In a child process: SIGINT ignored (Ctrl-C reaches the whole process group; the
    parent, which handles it, ends its children) and SIGTERM ending it at once (not the
    parent's handler, inherited through ``fork``). Pool workers call it too
    (:mod:`simulator.studies.workers`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)


_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def _signals_blocked():
    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - Windows
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class Beside:
    """``fn()`` running in a forked child from construction until :meth:`wait`."""

    def __init__(self, fn: Callable[[], object]):
        ctx = multiprocessing.get_context("fork")
        self._recv, send = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_child, args=(fn, send), daemon=True)
        with _signals_blocked():  # the child unblocks them once its own handlers are set
            self._proc.start()
        send.close()  # the child holds its own end: EOF here once it exits

    def wait(self) -> None:
        """Block until the child has finished; raise its exception (or a RuntimeError
        when it died without a word, e.g. killed for memory)."""
        try:
            outcome = self._recv.recv()
        except EOFError:
            outcome = None
        except BaseException:  # interrupted while waiting: the child's work is not wanted
            self.stop()
            raise
        self._recv.close()
        self._proc.join()
        if outcome is None:
            raise RuntimeError(f"the child process writing beside stepsim ended with exit code {self._proc.exitcode}")
        if outcome[0] == "error":
            err, text = outcome[1], outcome[2]
            if isinstance(err, BaseException):
                raise err
            raise RuntimeError(f"the child process writing beside stepsim failed:\n{text}")

    def stop(self) -> None:
        """End the child now (the caller is leaving early and will not wait for it)."""
        if self._proc.is_alive():
            self._proc.terminate()
        self._proc.join()
        self._recv.close()


def _child(fn: Callable[[], object], send) -> None:
    child_signal_defaults()
    try:
        fn()
    except BaseException as err:  # noqa: BLE001 - everything goes back to the parent
        text = traceback.format_exc()
        try:
            send.send(("error", err, text))
        except Exception:  # the exception does not pickle: its text does
            send.send(("error", None, text))
    else:
        send.send(("ok",))
    finally:
        send.close()
