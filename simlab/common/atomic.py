"""Writing outputs so that nothing is lost or mixed, whatever stops the writer.

Every command that writes a file or a directory goes through here:

- :func:`check_output` runs before any work: a path that cannot be written (its parent is a
  file, a read-only folder, a directory where a file is wanted) fails in one line at once,
  not after a long sweep, and an existing output is kept unless the user passes ``--force``.
  Even with ``--force`` a non-empty directory that simlab did not write (one without
  ``owned``, e.g. ``manifest.json`` for a trace) is never replaced: ``--force`` must not be
  able to delete a home directory.
- :func:`replace_file` and :func:`replace_dir` write into a fresh temporary path beside the
  target (``.NAME.tmp-PID``) and rename it into place, so readers see the old output or the
  new one, never a mix. A write that fails removes its temporary path; one killed outright
  leaves it, and the next write to the same target removes it (its process is gone).
- :func:`one_at_a_time` lets one process at a time fill a shared cache (a model's conversion,
  vLLM's environment, the llama.cpp build): two simlab commands started together, or two test
  workers, would otherwise run pip into one environment or cmake into one tree at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

from simlab.common.errors import SimlabError

_LEFT = re.compile(r"\.(?:tmp|old)-(\d+)")  # what a writer leaves beside its target while it runs


def check_output(path: str | os.PathLike, what: str = "--out", *, force: bool = False, directory: bool = False,
                 owned: str | None = None) -> Path:
    """``path`` as a Path if it can be written now; raise :class:`SimlabError` if not.

    ``what`` names the path in messages (the option, e.g. ``--timeline``); ``directory`` says
    whether the output is a directory; ``owned`` is the file that marks a directory simlab wrote.
    """
    out = Path(path)
    if out.exists():
        if directory and not out.is_dir():
            raise SimlabError(f"{what} {out} is a file; it must name a directory")
        if not directory and out.is_dir():
            raise SimlabError(f"{what} {out} is a directory; it must name a file")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise SimlabError(f"{what} {out}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SimlabError(f"{what} {out}: cannot write in {parent} (permission denied)")
    if directory and out.is_dir() and any(out.iterdir()):
        if owned is not None and not (out / owned).exists():
            raise SimlabError(f"{what} {out} is a non-empty directory that simlab did not write; choose another")
        if not force:
            raise SimlabError(f"{what} {out} is not empty; pass --force to replace it")
    elif out.exists() and not directory and not force:
        raise SimlabError(f"{what} {out} exists; pass --force to overwrite it")
    return out


def _tmp_name(out: Path) -> Path:
    """``.NAME.tmp-PID`` for a directory, ``.STEM.tmp-PID.SUFFIX`` for a file (writers that pick a
    format by the suffix, such as matplotlib's, still see it)."""
    return out.with_name(f".{out.stem}.tmp-{os.getpid()}{out.suffix}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def clear_stale(out: Path) -> None:
    """Remove what killed writers of ``out`` left beside it: their temporary copies and an old
    directory they had moved aside (the output the user asked to replace)."""
    if not out.parent.is_dir():
        return
    for p in [*out.parent.glob(f".{out.stem}.tmp-*{out.suffix}"), *out.parent.glob(f".{out.name}.old-*")]:
        m = _LEFT.search(p.name)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            _remove(p)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _written(out: Path, fill: Callable[[Path], None], install: Callable[[Path], None]) -> Path:
    """Fill a temporary path beside ``out`` and install it; remove it if anything fails."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SimlabError(f"cannot create {out.parent} ({exc.strerror})") from None
    clear_stale(out)
    tmp = _tmp_name(out)
    try:
        fill(tmp)
        install(tmp)
    except OSError as exc:
        _remove(tmp)
        raise SimlabError(f"cannot write {out} ({exc.strerror or exc})") from None
    except BaseException:
        _remove(tmp)
        raise
    return out


def replace_file(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Write a file through ``write(tmp_path)`` and rename it to ``path`` in one step."""
    out = Path(path)
    return _written(out, write, lambda tmp: os.replace(tmp, out))


def replace_dir(path: str | os.PathLike, fill: Callable[[Path], None]) -> Path:
    """Fill a fresh directory through ``fill(tmp_dir)`` and put it at ``path``.

    An existing directory at ``path`` is moved aside first and removed once the new one is in
    place: a kill between the two renames leaves the old one whole, beside the target.
    """
    out = Path(path)

    def make(tmp: Path) -> None:
        tmp.mkdir()
        fill(tmp)

    def install(tmp: Path) -> None:
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)

    return _written(out, make, install)


_HELD: set[Path] = set()  # the locks this process holds (flock would block on a second open of its own lock)


@contextlib.contextmanager
def one_at_a_time(lock: Path, log: Callable[[str], None] = lambda _: None) -> Iterator[None]:
    """Hold an exclusive lock on the file ``lock`` (created if missing) while the block runs.

    Another process holding it makes this one wait (saying so through ``log``) and then find the
    cache filled; the kernel drops the lock when its holder dies, so a killed install blocks
    nobody. Re-entrant within a process: an install that calls another under the same lock
    (llama.cpp's server build starts with the plain build) does not wait on itself.
    """
    lock = lock.resolve()
    if lock in _HELD:
        yield
        return
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another simlab process to finish with {lock.parent} ...")
            fcntl.flock(handle, fcntl.LOCK_EX)
        _HELD.add(lock)
        try:
            yield
        finally:
            _HELD.discard(lock)
            fcntl.flock(handle, fcntl.LOCK_UN)
