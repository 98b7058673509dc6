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
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import traceback
from typing import Callable


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def can_fork() -> bool:
    """Whether :class:`Beside` may fork here (see the module's note)."""
    return "fork" in multiprocessing.get_all_start_methods() and usable_cpus() > 1 and threading.active_count() == 1


class Beside:
    """``fn()`` running in a forked child from construction until :meth:`wait`."""

    def __init__(self, fn: Callable[[], object]):
        ctx = multiprocessing.get_context("fork")
        self._recv, send = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_child, args=(fn, send), daemon=True)
        self._proc.start()
        send.close()  # the child holds its own end: EOF here once it exits

    def wait(self) -> None:
        """Block until the child has finished; raise its exception (or a RuntimeError
        when it died without a word, e.g. killed for memory)."""
        try:
            outcome = self._recv.recv()
        except EOFError:
            outcome = None
        finally:
            self._recv.close()
            self._proc.join()
        if outcome is None:
            raise RuntimeError(f"the child process writing beside stepsim ended with exit code {self._proc.exitcode}")
        if outcome[0] == "error":
            err, text = outcome[1], outcome[2]
            if isinstance(err, BaseException):
                raise err
            raise RuntimeError(f"the child process writing beside stepsim failed:\n{text}")


def _child(fn: Callable[[], object], send) -> None:
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
