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

"Still there" is two checks, so that every start method is covered: the worker's
parent process id has not changed (a dead parent's children are handed to init or
to a sub-reaper at once), and the process that created the pool still exists
(with the ``forkserver`` start method the workers' parent is the fork server; and a
parent that died before the watchdog started is caught too).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ProcessPoolExecutor

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


def process_pool(max_workers: int) -> ProcessPoolExecutor:
    """A :class:`ProcessPoolExecutor` of ``max_workers`` processes that exit when this
    process dies (see the module notes)."""
    return ProcessPoolExecutor(max_workers=max_workers, initializer=watch_parent, initargs=(os.getpid(),))
