"""The one reader for records: every file slimeforge wrote earlier and reads back.

    read_text(path, what, pattern=..., max_bytes=...) -> str | None    (None: no such file)
    read_json(path, what, check=..., max_bytes=...) -> Any | None

A record is input like any other: a run directory is a plain folder people copy, edit and share.
So a record is read only when it is a regular file (never a FIFO, which would block the reader
forever, a device such as /dev/zero, which never ends, or a directory); a symlink only when the
caller asks for one to be followed. It is opened with O_NONBLOCK|O_NOFOLLOW and checked with fstat
(the file that was opened, not the name), read up to a size cap, decoded as strict UTF-8, and
then held to a fullmatch pattern or a schema check. Anything else is a RecordError naming the file,
what it should hold and what was found: never a traceback, never a hang.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import ConfigError, Problem
from .schema import text_problem

MAX_LINE_RECORD = 4096  # a one-line record: an id, a pid, an address, a token
MAX_JSON_RECORD = 4 << 20  # a plan.json, a build report, a cluster state


class RecordError(ConfigError):
    """A record file exists but is not what slimeforge wrote there."""

    def __init__(self, path: str | os.PathLike[str], what: str, message: str, accepted: str, value: object = None):
        self.path = str(path)
        super().__init__(str(path), [Problem(what, message, value, accepted, show_value=value is not None)])


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def read_bytes(path: str | os.PathLike[str], what: str, accepted: str, *, max_bytes: int, follow_symlinks: bool = False) -> bytes | None:
    """The bytes of the regular file at `path` (at most `max_bytes`), or None if nothing is there."""
    path = Path(path)
    try:
        st = os.stat(path, follow_symlinks=follow_symlinks)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RecordError(path, what, f"cannot be read: {exc.strerror}", accepted) from None
    if not stat.S_ISREG(st.st_mode):
        # Judged before open(): opening a device can itself have effects (a tape rewinds).
        raise RecordError(path, what, f"is {_kind(st.st_mode)}, not a regular file", accepted)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: it became a symlink since the stat
        raise RecordError(path, what, f"cannot be read: {exc.strerror}", accepted) from None
    try:
        fst = os.fstat(fd)
        if not stat.S_ISREG(fst.st_mode) or (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            raise RecordError(path, what, f"was replaced while being read (now {_kind(fst.st_mode)})", accepted)
        if fst.st_size > max_bytes:
            raise RecordError(path, what, f"is {fst.st_size} bytes, more than a record of this kind holds ({max_bytes})", accepted)
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise RecordError(path, what, f"is more than {max_bytes} bytes", accepted)
    return data


def decode(path: str | os.PathLike[str], what: str, accepted: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(path, what, f"is not UTF-8 text (byte {exc.start})", accepted) from None


def read_text(path: str | os.PathLike[str], what: str, pattern: re.Pattern[str], accepted: str, *, max_bytes: int = MAX_LINE_RECORD,
              follow_symlinks: bool = False) -> str | None:
    """A one-value record: its text without the final newline, matching `pattern` in full."""
    data = read_bytes(path, what, accepted, max_bytes=max_bytes, follow_symlinks=follow_symlinks)
    if data is None:
        return None
    text = decode(path, what, accepted, data)
    value = text[:-1] if text.endswith("\n") else text
    if not pattern.fullmatch(value) or text_problem(value):
        raise RecordError(path, what, "is not a record slimeforge writes", accepted, value)
    return value


def read_json(path: str | os.PathLike[str], what: str, accepted: str, check: Callable[[Any], str | None] | None = None, *,
              max_bytes: int = MAX_JSON_RECORD, follow_symlinks: bool = False) -> Any:
    """A JSON record, parsed, then held to `check` (returns why the document is refused, or None)."""
    data = read_bytes(path, what, accepted, max_bytes=max_bytes, follow_symlinks=follow_symlinks)
    if data is None:
        return None
    text = decode(path, what, accepted, data)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise RecordError(path, what, "is not JSON", accepted) from None
    if check is not None and (why := check(doc)):
        raise RecordError(path, what, why, accepted)
    return doc
