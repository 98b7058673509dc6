"""Output folders and files written whole or not at all.

Every command that writes a folder (``stepsim run --out DIR``, ``compare --out``,
``validate --out``, ``report --html``...) writes into a hidden staging folder beside ``DIR``
(``.stepsim-partial-<pid>-<name>``, in the nearest folder that exists) and moves what it
wrote into ``DIR`` only once everything is written (:func:`staged_dir`); a single output file
is written to a hidden file beside it and renamed over it (:func:`staged_file`). A run that
fails or is interrupted removes its staging folder and leaves ``DIR`` as it was: nothing
half-written ever sits under a finished name.

Moving in place: a ``DIR`` that does not exist is the staging folder renamed (one atomic
step). Into a ``DIR`` that exists, each new entry replaces the old one of its name (a
rename each), and the entries named in ``outputs`` (what the command writes, e.g.
``timeline.png``) that this run did not write are removed, so that a re-run with
``--no-plots`` does not leave the old run's figures beside the new summary; other files in
``DIR`` are left alone. SIGINT and SIGTERM are held back while the entries move, and
``summary.json`` (the file that says a run is complete) is removed first and moved last.

The paths are checked before any work (:func:`check_output_dir`, :func:`check_output_file`):
an existing file where a folder is wanted, a device or folder where a file is wanted, a
parent that is a file or cannot be written are refused with an :class:`OutputPathError`
naming the flag and the path. A staging folder left by a process that was killed outright
(SIGKILL) is removed by the next run writing to the same place.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from stepsim_errors import StepsimError

#: Prefix of staging folders and files (hidden: ``ls`` and globbing skip them).
STAGING_PREFIX = ".stepsim-partial-"

#: Written last and removed first when moving a folder in place: its presence says "finished".
FINISHED_MARKER = "summary.json"

PathLike = str | os.PathLike


class OutputPathError(StepsimError):
    """An output path that cannot be written (``field``: the flag naming it)."""


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and not p.is_symlink():
        if p.parent == p:
            break
        p = p.parent
    return p


def _refuse(flag: str, path: Path, why: str) -> OutputPathError:
    return OutputPathError(f"{flag}: {path}: {why}", field=flag)


def _check_parent(path: Path, flag: str) -> Path:
    """The nearest existing ancestor of ``path``: a folder this process can write in."""
    base = _nearest_existing(path.parent if path.parent != path else path)
    if not base.is_dir():
        raise _refuse(flag, path, f"{base} is not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        raise _refuse(flag, path, f"cannot write in {base} (permission denied)")
    return base


def _there(p: Path, flag: str) -> bool:
    """Whether something (a broken link included) is at ``p``; a name the file system refuses
    (longer than it allows) is refused here, naming ``flag``."""
    try:
        return p.exists() or p.is_symlink()
    except OSError as err:
        raise _refuse(flag, p, err.strerror or str(err)) from None


def check_output_dir(path: PathLike, flag: str = "--out") -> Path:
    """Refuse, before any work, an output folder that cannot be written: an existing file or
    device, a folder that cannot be written, a parent that is a file. Returns the path."""
    p = Path(path)
    if _there(p, flag):
        if not p.is_dir():
            kind = "a broken link" if not p.exists() else "a file" if p.is_file() else "not a folder"
            raise _refuse(flag, p, f"exists and is {kind}; give a folder (new or existing)")
        if not os.access(p, os.W_OK | os.X_OK):
            raise _refuse(flag, p, "cannot write in this folder (permission denied)")
        return p
    _check_parent(p, flag)
    return p


def check_output_file(path: PathLike, flag: str, within: PathLike | None = None) -> Path:
    """Refuse, before any work, an output file that cannot be written: a folder or device
    (``/dev/full``) at the path, a parent folder that does not exist (unless it is ``within``,
    a folder the same command creates), or that cannot be written. Returns the path."""
    p = Path(path)
    if _there(p, flag):
        try:
            mode = p.stat().st_mode
        except OSError as err:
            raise _refuse(flag, p, err.strerror or str(err)) from None
        if stat.S_ISDIR(mode):
            raise _refuse(flag, p, "is a folder; give a file name")
        if not stat.S_ISREG(mode):
            raise _refuse(flag, p, "is not a regular file (a device, pipe or socket); give a file name")
    parent = p.parent
    if not parent.is_dir():
        if within is not None and _same_path(parent, Path(within)):
            return p
        if parent.exists():
            raise _refuse(flag, p, f"{parent} is not a folder")
        raise _refuse(flag, p, f"no folder {parent}; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise _refuse(flag, p, f"cannot write in {parent} (permission denied)")
    return p


def _same_path(a: Path, b: Path) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


def _staging_name(name: str) -> str:
    return f"{STAGING_PREFIX}{os.getpid()}-{name}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process has this pid
        return True
    return True


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def _remove_dead_stagings(where: Path, name: str) -> None:
    """Staging entries for ``name`` left by processes that no longer exist (killed outright).
    Not on Windows, where ``os.kill(pid, 0)`` is no existence check."""
    if os.name == "nt":  # pragma: no cover
        return
    try:
        entries = list(where.glob(f"{STAGING_PREFIX}*-{name}"))
    except OSError:
        return
    for e in entries:
        pid_text = e.name[len(STAGING_PREFIX) :].split("-", 1)[0]
        if pid_text.isdigit() and int(pid_text) != os.getpid() and not _alive(int(pid_text)):
            _remove(e)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back (delivered on leaving) while the entries move in place."""
    sigs = {signal.SIGINT, signal.SIGTERM}
    can = hasattr(signal, "pthread_sigmask")
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs) if can else None
    try:
        yield
    finally:
        if can:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _os_error(flag: str, path: Path, err: OSError) -> OutputPathError:
    what = err.strerror or str(err)
    if err.filename is not None and not _same_path(Path(str(err.filename)), path):
        what += f" ({Path(str(err.filename)).name})"
    return OutputPathError(f"{flag}: {path}: cannot write: {what}", field=flag)


@contextlib.contextmanager
def staged_dir(path: PathLike, outputs: Iterable[str] = (), flag: str = "--out") -> Iterator[Path]:
    """A staging folder to write ``path``'s contents into; moved in place when the block ends
    without an exception, removed otherwise (see the module notes). ``outputs``: the names
    this kind of output may hold; those the block did not write are removed from ``path``.
    An ``OSError`` while writing becomes an :class:`OutputPathError` naming ``flag`` and
    ``path``."""
    if Path(path).name.startswith(_staging_name("")) and Path(path).is_dir():
        yield Path(path)  # already a staging folder of this process (a writer inside a writer)
        return
    dest = check_output_dir(path, flag)
    real = Path(os.path.realpath(dest))
    name = real.name or "root"
    where = _nearest_existing(real.parent)
    if dest.exists() and not os.access(where, os.W_OK | os.X_OK):
        where = real  # beside is read-only: stage inside the folder itself (hidden)
    _remove_dead_stagings(where, name)
    tmp = where / _staging_name(name)
    _remove(tmp)
    try:
        tmp.mkdir()
    except OSError as err:
        raise _os_error(flag, dest, err) from None
    try:
        yield tmp
        _move_into(tmp, dest, outputs)
    except OSError as err:
        raise _os_error(flag, dest, err) from None
    finally:
        _remove(tmp)


def _move_into(tmp: Path, dest: Path, outputs: Iterable[str]) -> None:
    with _signals_held():
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.rename(tmp, dest)
            return
        written = {e.name for e in tmp.iterdir()}
        old = {n for n in outputs if n not in written}  # stale: this run did not write them
        if FINISHED_MARKER in written:
            old.add(FINISHED_MARKER)  # removed first, moved in last
        for n in sorted(old, key=lambda n: n != FINISHED_MARKER):
            _remove(dest / n)
        for entry in sorted(tmp.iterdir(), key=lambda e: e.name == FINISHED_MARKER):
            target = dest / entry.name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(entry, target)


@contextlib.contextmanager
def staged_file(path: PathLike, flag: str, within: PathLike | None = None) -> Iterator[Path]:
    """A hidden file beside ``path`` to write into (its name ends with ``path``'s, so that
    suffixes such as ``.json.gz`` keep their meaning); renamed over ``path`` when the block
    ends without an exception, removed otherwise."""
    dest = check_output_file(path, flag, within)
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_stagings(dest.parent, dest.name)
    tmp = dest.parent / _staging_name(dest.name)
    try:
        yield tmp
        with _signals_held():
            os.replace(tmp, dest)
    except OSError as err:
        raise _os_error(flag, dest, err) from None
    finally:
        _remove(tmp)
