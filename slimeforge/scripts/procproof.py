"""The proof that a pid is still the process a record names, and the safe reading of that record:
what both records of a started process use (hostrecord.py: what the node agent started on a
cluster host; headrecord.py: the Ray head launch.sh started), and slimeforge/run/ownership.py
through them.

Standard library only, Python >= 3.8: it runs on hosts, inside one program with the module that
imports it (slimeforge.scripts.program).

A process is proved by its pid AND its start time (field 22 of /proc/PID/stat: a pid is reused)
AND the boot id (a start time means nothing after a reboot) AND its exact argv (argv_matches). A
record is read as a regular file only (never a FIFO, a device or a symlink), size-capped and
depth-checked before it is parsed: a BadRecord names the file, never a traceback or a hang.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Callable
from typing import Any

OURS, ENDED, FOREIGN = "ours", "ended", "foreign"
PID_MAX = 1 << 22  # the kernel's limit (pid_max)
TOKEN_RE = re.compile(r"[0-9a-f]{32}")
BOOT_ID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_DIGITS = re.compile(r"[0-9]{1,20}")


class BadRecord(Exception):
    """The record exists but is not one slimeforge writes; the message names the file. (The hosts'
    own: slimeforge.readback.RecordError, the package's, is a ConfigError these scripts cannot import.)"""


# --- reading files that may be anything ----------------------------------------------------------


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in words (readback.py reads it from here)."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISLNK, "a symlink"))
    for test, name in kinds:
        if test(mode):
            return name
    return "not a regular file"



def read_bounded(fd: int, cap: int) -> bytes:
    """At most cap + 1 bytes of an open file: one more than a record may hold, so that a file that
    grew past its cap since its stat is seen to."""
    chunks, left = [], cap + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)

def read_regular(path: str, cap: int, last: bool = False) -> bytes | None:
    """The bytes of the regular file at `path`: at most `cap` (the last `cap` with last=True, for
    logs; else more is an error). None when nothing is there. Opened with O_NONBLOCK|O_NOFOLLOW and
    judged by fstat of what was opened: a FIFO never blocks the reader, a device is never read."""
    try:
        # Judged before open(): opening a device can itself have effects (a tape rewinds).
        first = os.lstat(path)
        if not stat.S_ISREG(first.st_mode):
            raise BadRecord(f"{path}: is {file_kind(first.st_mode)}, not a regular file slimeforge wrote")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        what = "is a symlink" if exc.errno == errno.ELOOP else f"cannot be read ({exc.strerror})"
        raise BadRecord(f"{path}: {what}, not a regular file slimeforge wrote") from None
    try:
        st = os.fstat(fd)  # what was opened, not the name: it may have been replaced since the lstat
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (first.st_dev, first.st_ino):
            raise BadRecord(f"{path}: is {file_kind(st.st_mode)}, not a regular file slimeforge wrote")
        if st.st_size > cap:
            if not last:
                raise BadRecord(f"{path}: is {st.st_size} bytes, more than a record holds ({cap})")
            os.lseek(fd, st.st_size - cap, os.SEEK_SET)
        data = read_bounded(fd, cap)
    finally:
        os.close(fd)
    if len(data) > cap:
        if not last:
            raise BadRecord(f"{path}: is more than {cap} bytes, more than a record holds")
        data = data[-cap:]
    return data


def _depth(text: str, limit: int) -> int:
    """The deepest nesting of [ and { outside strings (counting stops past `limit`): checked before
    json.loads, which recurses."""
    depth = deepest = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                break
        elif ch in "]}":
            depth -= 1
    return deepest


def read_json(path: str, cap: int, max_depth: int, problem: Callable[[Any], str | None]) -> Any:
    """The JSON record at `path`, read by read_regular and held to `problem` (why a document is not
    one slimeforge writes, or None); None when nothing is there."""
    data = read_regular(path, cap)
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRecord(f"{path}: is not UTF-8 text (byte {exc.start}): not a record slimeforge wrote") from None
    if _depth(text, max_depth) > max_depth:
        raise BadRecord(f"{path}: nests deeper than {max_depth}: not a record slimeforge wrote")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise BadRecord(f"{path}: is not JSON: not a record slimeforge wrote") from None
    why = problem(doc)
    if why:
        raise BadRecord(f"{path}: {why}: not a record slimeforge wrote")
    return doc


def whole(value: Any, lo: int, hi: int) -> bool:
    return type(value) is int and lo <= value <= hi  # not bool, not "123", not 1.0


# --- processes -----------------------------------------------------------------------------------


def parse_stat(text: str) -> tuple[str, int, int] | None:
    """(state, ppid, starttime) from the text of /proc/PID/stat; None when it is not one.
    The command name (field 2) is in parentheses and may hold spaces and ')': split after the last ')'."""
    _, paren, rest = text.rpartition(")")
    fields = rest.split()
    if not paren or len(fields) < 20 or not (_DIGITS.fullmatch(fields[1]) and _DIGITS.fullmatch(fields[19])):
        return None
    return fields[0], int(fields[1]), int(fields[19])  # fields 3 (state), 4 (ppid) and 22 (starttime)


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, starttime) of `pid`, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    return parse_stat(data)


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def proc_words(pid: int, name: str) -> list[str] | None:
    """The NUL-separated words of /proc/PID/NAME (cmdline, environ); None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        return None
    return [w.decode("utf-8", "replace") for w in data.split(b"\0") if w]


def argv_matches(recorded: list[str], live: list[str] | None) -> bool:
    """The live cmdline is the recorded argv, run as it was: exactly, or with the interpreter of its
    `#!` line in front (python for the `ray` script: up to two words, `/usr/bin/env python3`) and
    argv[0] as the kernel found it on PATH when the record gave a bare name."""
    if live is None or len(live) < len(recorded) or len(live) - len(recorded) > 2:
        return False
    tail = live[len(live) - len(recorded):]
    if tail[1:] != recorded[1:]:
        return False
    return tail[0] == recorded[0] or ("/" not in recorded[0] and os.path.basename(tail[0]) == recorded[0])


# --- JSON a host answers or holds --------------------------------------------------------------


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads_strict(text: str) -> Any:
    """json.loads without NaN/Infinity; a nesting too deep for the parser is a ValueError too."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None
