"""Local worker processes that end when the process that started them dies.

The workers of a :class:`concurrent.futures.ProcessPoolExecutor` are plain child
processes. When their parent is killed (SIGKILL; or SIGTERM, whose default action
ends Python without running any cleanup) nothing tells them: a worker in the middle
of a case simulates on, and an idle one waits on its task queue for ever (it holds
the queue's write end itself, so it never sees end-of-file). :func:`process_pool`
starts every worker with a watchdog thread that checks, every
:data:`WATCH_INTERVAL_S`, whether the parent is still there, and ends the worker at
once (``os._exit``) when it is not. Workers send their results back to the parent
and write no files, so nothing is lost that the parent could still use.

An interrupt of the parent (SIGINT, SIGTERM: ``stepsim`` turns both into a
``KeyboardInterrupt``) shuts the pool down on its way out: :class:`WorkerPool` then ends
its workers at once rather than waiting for their cases. Workers ignore SIGINT, which
Ctrl-C sends the whole process group, so that only the parent reports it.

"Still there" is two checks, so that every start method is covered: the worker's
parent process id has not changed (a dead parent's children are handed to init or
to a sub-reaper at once), and the process that created the pool still exists
(with the ``forkserver`` start method the workers' parent is the fork server; and a
parent that died before the watchdog started is caught too).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from concurrent.futures import ProcessPoolExecutor

from simulator.results.beside import child_signal_defaults

#: How often a worker checks on its parent (seconds). A check is two system calls.
WATCH_INTERVAL_S = 0.2

#: Exit status of a worker whose parent died.
ORPHAN_EXIT_STATUS = 70


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover — a process of another user has this pid now
        return True
    return True


def _watch(parent_pid: int, creator_pid: int, interval_s: float) -> None:
    stop = threading.Event()
    while not stop.wait(interval_s):
        if os.getppid() != parent_pid or not _exists(creator_pid):
            os._exit(ORPHAN_EXIT_STATUS)


def watch_parent(creator_pid: int, interval_s: float = WATCH_INTERVAL_S) -> None:
    """Start the watchdog in this (worker) process: end it when its parent process, or
    the process ``creator_pid`` that started the pool, is gone. The pool's initializer."""
    threading.Thread(
        target=_watch, args=(os.getppid(), creator_pid, interval_s), name="stepsim-parent-watchdog", daemon=True
    ).start()


def _init_worker(creator_pid: int) -> None:
    """A worker's start: SIGINT ignored and SIGTERM fatal (the parent handles the command's
    interrupt and ends its workers), and the watchdog on its parent."""
    child_signal_defaults()
    watch_parent(creator_pid)


class WorkerPool(ProcessPoolExecutor):
    """A :class:`ProcessPoolExecutor` whose workers exit when this process dies, and which
    ends them at once (SIGTERM) when it is shut down while an interrupt (``KeyboardInterrupt``,
    SIGINT / SIGTERM in ``stepsim``) or ``SystemExit`` unwinds, instead of waiting for the
    cases they are simulating: workers write no files, so nothing is lost."""

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if isinstance(sys.exc_info()[1], (KeyboardInterrupt, SystemExit)):
            self.terminate_workers()
            cancel_futures = True
        super().shutdown(wait=wait, cancel_futures=cancel_futures)

    def terminate_workers(self) -> None:
        """Send every worker SIGTERM (each dies at once: :func:`_init_worker`)."""
        terminate_processes(self)


def terminate_processes(executor) -> None:
    """SIGTERM to every worker process of ``executor`` if it is a
    :class:`ProcessPoolExecutor` (a :class:`WorkerPool`, or one given with ``--executor``);
    nothing for other executors, whose workers this process cannot reach."""
    if isinstance(executor, ProcessPoolExecutor):
        for proc in list((getattr(executor, "_processes", None) or {}).values()):
            with contextlib.suppress(Exception):
                proc.terminate()


def abandon(executor) -> None:
    """Shut ``executor`` down without waiting for the tasks it runs (an interrupt is
    unwinding): its process workers terminated, queued tasks cancelled."""
    terminate_processes(executor)
    try:
        executor.shutdown(wait=False, cancel_futures=True)
    except TypeError:  # an executor without cancel_futures (Python < 3.9's signature)
        executor.shutdown(wait=False)


def process_pool(max_workers: int) -> WorkerPool:
    """A :class:`WorkerPool` of ``max_workers`` processes that exit when this process dies
    (see the module notes) or the pool is shut down by an interrupt."""
    return WorkerPool(max_workers=max_workers, initializer=_init_worker, initargs=(os.getpid(),))
