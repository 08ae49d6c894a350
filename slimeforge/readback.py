"""The one reader for records: every file slimeforge wrote earlier and reads back.

    read_bytes(path, what, accepted, max_bytes=...) -> bytes | None   (None: no such file)
    read_text(path, what, pattern=..., max_bytes=...) -> str | None
    read_json(path, what, check=..., max_bytes=...) -> Any | None
    parse_toml(path, what, accepted, text, check=...) -> dict       (a lock, after read_bytes and decode)
    (recipes, stacks and inventories: yamlio.read_yaml reads their bytes through read_bytes)

Every file slimeforge reads that a person could have written or replaced (a recipe, an
inventory, a stack, a lock, a build or kernel report, a run record) comes through here.
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
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import ConfigError, Problem
from .schema import text_problem
from .scripts.procproof import file_kind  # the one wording of what a non-regular file is

MAX_LINE_RECORD = 4096  # a one-line record: an id, a pid, an address, a token
MAX_JSON_RECORD = 4 << 20  # a plan.json, a build report, a cluster state
MAX_TOML_RECORD = 4 << 20  # a lock: the real cu13 lock is 0.5 MiB
# Nesting, in every format: the deepest real record (a plan.json) nests 6 levels, a stack 5. The
# parsers recurse (json and tomllib raise RecursionError near 1,000 levels, after a slow parse),
# and so would any code that walks a document: a depth is refused before the parse, on the text.
MAX_DEPTH = 32
# A quoted string (JSON's or TOML's basic/literal strings) or one bracket: brackets inside strings
# do not count. TOML's multi-line strings are rare in a lock and only make the count larger.
# (Strings as "unrolled loops", a run of plain characters at a time: 2.8 ms on the 121 KB lock, 15 ms before.)
_JSON_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_TOML_TOKENS = re.compile(r'"[^"\\\n]*(?:\\.[^"\\\n]*)*"|\'[^\'\n]*\'|#[^\n]*|[\[\]{}]')


class RecordError(ConfigError):
    """A record file exists but is not what slimeforge wrote there."""

    def __init__(self, path: str | os.PathLike[str], what: str, message: str, accepted: str, value: object = None):
        self.path = str(path)
        super().__init__(str(path), [Problem(what, message, value, accepted, show_value=value is not None)])



def read_bytes(path: str | os.PathLike[str], what: str, accepted: str, *, max_bytes: int,
               follow_symlinks: bool = False) -> bytes | None:
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
        raise RecordError(path, what, f"is {file_kind(st.st_mode)}, not a regular file", accepted)
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
            raise RecordError(path, what, f"was replaced while being read (now {file_kind(fst.st_mode)})", accepted)
        if fst.st_size > max_bytes:
            raise RecordError(path, what,
                              f"is {fst.st_size} bytes, larger than a file of this kind holds ({max_bytes})", accepted)
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


def read_text(path: str | os.PathLike[str], what: str, pattern: re.Pattern[str], accepted: str, *,
              max_bytes: int = MAX_LINE_RECORD,
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


def too_deep(text: str, tokens: re.Pattern[str] = _JSON_TOKENS, limit: int = MAX_DEPTH) -> bool:
    """Whether the brackets of `text` (outside strings) nest deeper than `limit`."""
    depth = 0
    for m in tokens.finditer(text):
        ch = m.group()
        if ch in ("[", "{"):
            depth += 1
            if depth > limit:
                return True
        elif ch in ("]", "}"):
            depth -= 1
    return False


def json_loads(text: str | bytes) -> Any:
    """json.loads for text from outside that is not a file (a Jobs API answer, a tool's output):
    ValueError, as json.loads raises, for a document nested deeper than MAX_DEPTH as well."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")  # UnicodeDecodeError is a ValueError
    if too_deep(text):
        raise ValueError(f"nests deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"nests deeper than {MAX_DEPTH} levels") from None


def depth_of(doc: Any, limit: int = MAX_DEPTH) -> int:
    """The nesting depth of a parsed document (lists and mappings), measured without recursion
    and stopping once past `limit` (TOML's dotted keys `a.b.c...` nest without a bracket)."""
    deepest, todo = 0, [(doc, 0)]
    while todo:
        node, depth = todo.pop()
        deepest = max(deepest, depth)
        if depth > limit:
            break
        if isinstance(node, dict):
            todo.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            todo.extend((v, depth + 1) for v in node)
    return deepest


def _deep_error(path: str | os.PathLike[str], what: str, accepted: str) -> RecordError:
    return RecordError(path, what, f"nests deeper than {MAX_DEPTH} levels", accepted)


def read_json(path: str | os.PathLike[str], what: str, accepted: str, check: Callable[[Any], str | None] | None = None,
              *,
              max_bytes: int = MAX_JSON_RECORD, follow_symlinks: bool = False) -> Any:
    """A JSON record, parsed, then held to `check` (returns why the document is refused, or None)."""
    data = read_bytes(path, what, accepted, max_bytes=max_bytes, follow_symlinks=follow_symlinks)
    if data is None:
        return None
    text = decode(path, what, accepted, data)
    if too_deep(text):
        raise _deep_error(path, what, accepted)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise RecordError(path, what, "is not JSON", accepted) from None
    if check is not None and (why := check(doc)):
        raise RecordError(path, what, why, accepted)
    return doc


def parse_toml(path: str | os.PathLike[str], what: str, accepted: str, text: str,
               check: Callable[[dict[str, Any]], str | None] | None = None) -> dict[str, Any]:
    """The TOML text of the file at `path` (read by read_bytes and decode), parsed and checked."""
    if too_deep(text, _TOML_TOKENS):
        raise _deep_error(path, what, accepted)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RecordError(path, what, f"is not TOML: {exc}", accepted) from None
    except RecursionError:
        raise _deep_error(path, what, accepted) from None
    if depth_of(doc) > MAX_DEPTH:
        raise _deep_error(path, what, accepted)
    if check is not None and (why := check(doc)):
        raise RecordError(path, what, why, accepted)
    return doc
