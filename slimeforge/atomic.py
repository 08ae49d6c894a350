"""Write a directory of files so that it is either complete or absent (never half written), and
let one writer at a time into a directory (a lock file)."""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from .errors import ConfigError, Problem
from .schema import text_problem

LOCK_NAME = ".slimeforge.lock"
# The mark of a directory slimeforge writes as a whole (`build --out`, `install --out`): a reused
# --out is replaced piece by piece (its context/lock/ removed and rewritten), which is only right
# in a directory that holds nothing but what slimeforge put there.
OUTPUT_MARKER = ".slimeforge-output"
LOCK_WAIT_S = 120.0  # a render takes well under a second; a writer stuck longer is reported


def write_dir(target: Path, files: Mapping[str, str | bytes], modes: dict[str, int] | None = None,
              last: str | None = None) -> None:
    """Create `target` with `files`, or replace those files in an existing `target`.

    A new directory is assembled beside the target and renamed into place in one step. In an
    existing directory (a run directory keeps job.log and state across launches) every file is
    first written in full under a temporary name, then all are renamed into place, `last` (the
    file that marks completeness) after the others: a failure while writing changes nothing.
    """
    modes = modes or {}
    target = Path(target)
    # Writers write only files: a directory that is a dangling link or not a directory, and a name
    # in it that is a link, a device, a FIFO or a directory, are refused, never replaced.
    if os.path.lexists(target) and not target.is_dir():
        raise _not_a_file(target, "is not a directory (a file, a link to nothing, a device)",
                          "a directory, or a new name")
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_dir():
        for name in files:
            if why := replace_problem(target / name):
                raise _not_a_file(target / name, why,
                                  "a regular file or a new name: move the other thing away, or write elsewhere")
    if not target.exists():
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            for name, content in files.items():
                _write(tmp / name, content, modes.get(name))
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return
    order = [n for n in files if n != last] + ([last] if last is not None and last in files else [])
    staged: list[tuple[str, Path]] = []
    try:
        for name in order:
            fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", dir=target)
            os.close(fd)
            staged.append((tmp_name, target / name))
            _write(Path(tmp_name), files[name], modes.get(name))
        while staged:
            tmp_name, path = staged[0]
            os.replace(tmp_name, path)
            staged.pop(0)
    finally:
        for tmp_name, _ in staged:
            Path(tmp_name).unlink(missing_ok=True)


def write_file(path: Path, content: str | bytes, mode: int | None = None) -> None:
    """One file, replaced atomically (the old content or the new, never a mix)."""
    path = Path(path)
    write_dir(path.parent, {path.name: content}, {path.name: mode} if mode is not None else None)


@contextmanager
def dir_lock(directory: Path, timeout: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold an exclusive lock on `directory` (flock on its LOCK_NAME file); concurrent writers
    wait their turn. The kernel drops the lock when its holder dies, so it never goes stale."""
    fd = os.open(Path(directory) / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ConfigError(str(directory), [Problem("lock",
                                                               "another slimeforge process has been writing here for "
                                                               f"over {timeout:g} s",
                                                               show_value=False,
                                                               accepted="wait for it to finish, or use another "
                                                                        "directory")]) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def dir_problem(path: Path) -> str | None:
    """Why `path` cannot be (or become) a directory we write into, or None: a file, a path under a
    file, an unwritable place, or a name with control characters."""
    if why := text_problem(str(path)):
        return why
    path = Path(path)
    if path.is_symlink() or path.exists():
        if not path.is_dir():
            return "is a file, not a directory"
        return None if os.access(path, os.W_OK | os.X_OK) else "is not writable"
    parent = path.parent
    while not (parent.is_symlink() or parent.exists()):
        parent = parent.parent
    if not parent.is_dir():
        return f"cannot be created: {parent} is a file"
    return None if os.access(parent, os.W_OK | os.X_OK) else f"cannot be created: {parent} is not writable"


def output_dir_problem(path: Path) -> str | None:
    """Why `path` may not be used as an output directory (--out), or None: dir_problem's reasons,
    and a directory that is not empty and lacks OUTPUT_MARKER (the user's files: never replaced or
    deleted). New and empty directories are accepted, and so is one slimeforge marked."""
    if why := dir_problem(path):
        return why
    path = Path(path)
    if not path.is_dir():
        return None
    marker = path / OUTPUT_MARKER
    if marker.is_file() and not marker.is_symlink():
        return None
    try:
        with os.scandir(path) as entries:
            empty = next(iter(entries), None) is None
    except OSError as exc:
        return f"cannot be listed: {exc.strerror}"
    return None if empty else (f"is a directory slimeforge did not write (it holds files and no {OUTPUT_MARKER}); "
                               "nothing in it is replaced or deleted")


def mark_output_dir(path: Path, what: str) -> None:
    """Create `path` if needed and mark it as slimeforge's (output_dir_problem accepts it again)."""
    Path(path).mkdir(parents=True, exist_ok=True)
    write_file(Path(path) / OUTPUT_MARKER,
               f"written by slimeforge ({what}); a later `{what} --out` here replaces its files\n")


def _write(path: Path, content: str | bytes, mode: int | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    if mode is not None:
        os.chmod(path, mode)


# --- files written for the user (--out, --record) ------------------------------------------------


def _kind_problem(st: os.stat_result) -> str | None:
    if stat.S_ISREG(st.st_mode):
        return None
    if stat.S_ISLNK(st.st_mode):
        return "is a symlink (not followed: name its target)"
    kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a device, FIFO or socket, not a regular file"
    return f"is {kind}; only a regular file is replaced"


def replace_problem(path: str | os.PathLike[str]) -> str | None:
    """Why the thing at `path` may not be replaced by a file slimeforge writes, or None (nothing
    there, or a regular file): the one check of every writer (write_dir, write_file, write_output)."""
    try:
        return _kind_problem(os.lstat(path))
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be examined: {exc.strerror}"


def _not_a_file(path: Path, why: str, accepted: str) -> ConfigError:
    return ConfigError(str(path), [Problem("path", why, str(path), accepted)])



def output_problem(path: str | os.PathLike[str], follow_symlinks: bool = False) -> str | None:
    """Why `path` may not be (re)written as an output file, or None.

    Accepted: a new name in an existing directory, or an existing regular file. A symlink is
    refused unless `follow_symlinks` (then its target is judged), and so is anything that is not a
    regular file: replacing a device node (`--out /dev/null` as root), a FIFO or a directory with a
    file would break whatever else uses it."""
    if why := text_problem(str(path)):
        return why
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        return f"cannot be examined: {exc.strerror}"
    if st is not None and stat.S_ISLNK(st.st_mode):
        if not follow_symlinks:
            return "is a symlink (not followed: name its target, or ask for symlinks to be followed)"
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return "is a symlink to nothing"
        except OSError as exc:
            return f"is a symlink that cannot be followed: {exc.strerror}"
    if st is not None and (why := _kind_problem(st)):
        return why
    parent = Path(os.path.realpath(path)).parent if st is not None else path.parent
    if not parent.is_dir():
        return f"cannot be created: {parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be written: {parent} is not writable"
    return None


def open_log(path: str | os.PathLike[str], mode: str = "a") -> IO[Any]:
    """A log slimeforge writes as it goes (a build's build.log, a started process's output): opened
    only as a regular file or a new name, the one check of write_dir applied as it opens. Never
    through a symlink (O_NOFOLLOW: a link planted at the name would have us truncate its target),
    never a FIFO or a device (O_NONBLOCK for the open: a FIFO without a reader would hang us).
    `mode`: "a"/"w" (text) or "ab"/"wb"."""
    flags = (os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_APPEND
                                                                                        if mode.startswith("a") else 0))
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        why = replace_problem(path) or f"cannot be opened: {exc.strerror}"
        raise _not_a_file(Path(path), why, "a regular file or a new name: move the other thing away") from None
    try:
        if kind := _kind_problem(os.fstat(fd)):
            raise _not_a_file(Path(path), kind, "a regular file or a new name: move the other thing away")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        if mode.startswith("w"):
            os.ftruncate(fd, 0)
        return os.fdopen(fd, mode) if "b" in mode else os.fdopen(fd, mode, encoding="utf-8", errors="replace")
    except BaseException:
        os.close(fd)
        raise


def write_output(path: str | os.PathLike[str], content: str | bytes, *, where: str = "--out",
                 follow_symlinks: bool = False,
                 mode: int | None = None, field: str | None = None) -> Path:
    """Write a file the user named: judged by `output_problem` first, then written under a temporary
    name in the same directory and renamed over the old one (old content or new, never a mix).
    With `follow_symlinks`, the symlink's target is replaced and the link is kept. Returns the path
    written. `where` names the command, `field` the option or argument (default: `where`)."""
    field = field or where
    if why := output_problem(path, follow_symlinks):
        raise ConfigError(where, [Problem(field, why, str(path),
                                          "a new file in an existing directory, or a regular file to replace")])
    target = Path(os.path.realpath(path)) if follow_symlinks else Path(os.path.abspath(path))
    data = content.encode() if isinstance(content, str) else content
    if mode is None:
        try:
            mode = stat.S_IMODE(os.stat(target).st_mode)
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        if why := output_problem(target):  # again at the last moment: the path may have changed meanwhile
            raise ConfigError(where, [Problem(field, why, str(path),
                                              "a new file in an existing directory, or a regular file to replace")])
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
