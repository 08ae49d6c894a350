"""The build report (build/<flavor>-<hash>/report.json): what `invoke build` made, typed.

`BuildReport` is written with `to_json` and read back with `from_dict`, as pip's pylock.py reads
a lock: one small typed getter per key (`_get`, `_get_required`, `_get_list`) that names the key
and the type it wanted, so a damaged record is an error naming what is wrong, never a KeyError.
publish adds `digest` and `published` to the file; a later build keeps them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ... import paths, readback
from ...schema import printable, text_problem
from .buildprogress import took  # the one way a duration is written for people

REPORT = paths.BUILD_REPORT
T = TypeVar("T")


class ReportError(ValueError):
    """report.json is not what `invoke build` writes: names the key and what it should hold."""


def _get(d: Mapping[str, Any], expected: type[T], key: str) -> T | None:
    value = d.get(key)
    if value is not None and not isinstance(value, expected):
        raise ReportError(f"{REPORT}: `{key}` has type {type(value).__name__}, expected {expected.__name__}")
    return value


def _get_required(d: Mapping[str, Any], expected: type[T], key: str) -> T:
    value = _get(d, expected, key)
    if value is None:
        raise ReportError(f"{REPORT}: `{key}` is missing")
    return value


def _get_number(d: Mapping[str, Any], key: str) -> float | None:
    value = d.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ReportError(f"{REPORT}: `{key}` has type {type(value).__name__}, expected a number")
    return value


def _get_list(d: Mapping[str, Any], expected: type[T], key: str) -> list[T]:
    value = _get(d, list, key) or []
    for item in value:
        if not isinstance(item, expected):
            raise ReportError(f"{REPORT}: `{key}` holds a {type(item).__name__}, expected {expected.__name__} items")
    return value


@dataclass(frozen=True)
class StepTiming:
    """One Dockerfile instruction as BuildKit's plain progress told it (buildkit.parse_progress)."""

    name: str
    index: int
    of: int
    instruction: str
    cached: bool
    duration_s: float | None
    error: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StepTiming:
        duration = _get_number(d, "duration_s")
        return cls(_get_required(d, str, "name"), _get_required(d, int, "index"), _get_required(d, int, "of"),
                   _get(d, str, "instruction") or "", bool(_get(d, bool, "cached")), duration,
                   bool(_get(d, bool, "error")))

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"index": self.index, "of": self.of, "name": self.name,
                                  "instruction": self.instruction,
                               "cached": self.cached, "duration_s": self.duration_s}
        if self.error:
            out["error"] = True
        return out


@dataclass(frozen=True)
class CompiledWheels:
    """Where a compiled step's wheels came from this time: store, registry (pulled into the store),
    compiled (for the store by this build, then installed from it); from_store False: in place."""

    key: str
    source: str
    from_store: bool
    log: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"key": self.key, "source": self.source, "from_store": self.from_store,
                **({"log": self.log} if self.log else {})}


VENV_SIZES_MAX_BYTES = 64 << 10
VENV_SIZES_TOP = 10
# A directory in a venv may be named anything (pip's `~orch` leftovers, spaces, non-ASCII, `.venv`):
# venv_sizes.py writes each path as printable text (bytes that are not UTF-8 as \\xNN), at most 512
# characters. Read back: printable, bounded, made of components that are names (not '', '.', '..').
_SHOWN_MAX = 512
_BYTES_MAX = 1 << 50  # 1 PiB: any real venv is below it


def _path_of(path: Any, absolute: bool) -> str | None:
    """`path` when it is such a path (absolute or relative, as asked), else None."""
    if not isinstance(path, str) or not 0 < len(path) <= _SHOWN_MAX or text_problem(path):
        return None
    if path.startswith("/") != absolute:
        return None
    parts = path[1:].split("/") if absolute else path.split("/")
    return None if any(part in ("", ".", "..") for part in parts) else path


def _size(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _BYTES_MAX:
        raise ReportError(f"{where} is {value!r:.80}, expected a whole number of bytes (0 to 2**50)")
    return value


@dataclass(frozen=True)
class VenvSizes:
    """The venv's total bytes and its largest directories (path relative to the venv, bytes), the
    largest first: a size regression shows in the build that made it."""

    venv: str
    total: int  # bytes (the record's key `bytes`)
    largest: list[tuple[str, int]]
    # Files of one name and size in two places (venv and the base's CUDA toolkit): (name, bytes,
    # copies, absolute paths), the most wasteful first, and the bytes beyond each first copy over
    # all of them; None from a record made before they were measured.
    duplicates: list[tuple[str, int, int, list[str]]] = field(default_factory=list)
    duplicates_bytes: int | None = None

    @classmethod
    def from_dict(cls, doc: Any, where: str = "the venv sizes record") -> VenvSizes:
        """Validated in full: the record is read out of an image, and back from report.json."""
        if not isinstance(doc, dict):
            raise ReportError(f"{where}: is a {type(doc).__name__}, expected an object")
        venv = _path_of(doc.get("venv"), absolute=True)
        if venv is None:
            raise ReportError(f"{where}: `venv` is {printable(repr(doc.get('venv'))[:80])}, expected an absolute path "
                              f"(printable, at most {_SHOWN_MAX} characters)")
        largest = doc.get("largest")
        if not isinstance(largest, list) or len(largest) > VENV_SIZES_TOP:
            raise ReportError(f"{where}: `largest` is not a list of at most {VENV_SIZES_TOP} directories")
        rows = []
        for i, item in enumerate(largest):
            raw = item.get("path") if isinstance(item, dict) else None
            path = _path_of(raw, absolute=False)
            if path is None:
                raise ReportError(f"{where}: `largest[{i}].path` is {printable(repr(raw)[:80])}, expected a path "
                                  "inside the venv "
                                  f"(printable, at most {_SHOWN_MAX} characters)")
            rows.append((path, _size(item.get("bytes"), f"{where}: `largest[{i}].bytes`")))
        if [b for _, b in rows] != sorted((b for _, b in rows), reverse=True):
            raise ReportError(f"{where}: `largest` is not ordered largest first")
        if doc.get("duplicates_bytes") is None:
            return cls(venv, _size(doc.get("bytes"), f"{where}: `bytes`"), rows)
        dups = doc.get("duplicates")
        if not isinstance(dups, list) or len(dups) > VENV_SIZES_TOP:
            raise ReportError(f"{where}: `duplicates` is not a list of at most {VENV_SIZES_TOP} files")
        found = []
        for i, d in enumerate(dups):
            d = d if isinstance(d, dict) else {}
            name, copies, paths = _path_of(d.get("name"), absolute=False), d.get("copies"), d.get("paths")
            if name is None or "/" in name:
                raise ReportError(f"{where}: `duplicates[{i}].name` is {printable(repr(d.get('name'))[:80])}, "
                                  f"expected a file name (printable, at most {_SHOWN_MAX} characters)")
            if isinstance(copies, bool) or not isinstance(copies, int) or not 2 <= copies <= 1 << 20:
                raise ReportError(f"{where}: `duplicates[{i}].copies` is {copies!r:.80}, "
                                  "expected a whole number from 2")
            if (not isinstance(paths, list) or not 0 < len(paths) <= 4
                    or any(_path_of(p, absolute=True) is None for p in paths)):
                raise ReportError(f"{where}: `duplicates[{i}].paths` is not a list of 1 to 4 absolute paths "
                                  f"(printable, at most {_SHOWN_MAX} characters)")
            found.append((name, _size(d.get("bytes"), f"{where}: `duplicates[{i}].bytes`"), copies,
                          [str(p) for p in paths]))
        return cls(venv, _size(doc.get("bytes"), f"{where}: `bytes`"), rows, found,
                   _size(doc.get("duplicates_bytes"), f"{where}: `duplicates_bytes`"))

    @classmethod
    def parse(cls, data: bytes, where: str) -> VenvSizes:
        """The record as the image holds it: bounded, UTF-8 JSON of bounded depth, then from_dict."""
        if len(data) > VENV_SIZES_MAX_BYTES:
            raise ReportError(f"{where}: is more than {VENV_SIZES_MAX_BYTES} bytes")
        try:
            doc = readback.json_loads(data)
        except ValueError as exc:
            raise ReportError(f"{where}: is not JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("schema") != 1:
            raise ReportError(f"{where}: is not a venv sizes record of schema 1")
        return cls.from_dict(doc, where)

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"venv": self.venv, "bytes": self.total,
                                  "largest": [{"path": p, "bytes": b} for p, b in self.largest]}
        if self.duplicates_bytes is not None:
            doc["duplicates_bytes"] = self.duplicates_bytes
            doc["duplicates"] = [{"name": n, "bytes": b, "copies": c, "paths": ps} for n, b, c, ps in self.duplicates]
        return doc

    def lines(self) -> list[str]:
        rows = [f"venv {printable(self.venv)}: {self.total / 1e9:.2f} GB; largest directories:"]
        rows += [f"  {b / 1e9:>7.2f} GB  {printable(p)}" for p, b in self.largest]
        if self.duplicates_bytes is not None:
            rows.append("files there twice (venv and the base's CUDA toolkit; same name and size): "
                        f"{self.duplicates_bytes / 1e9:.2f} GB beyond the first copies; largest:")
            rows += [f"  {b * (c - 1) / 1e9:>7.2f} GB  {printable(n)} x{c}: {printable(' '.join(ps))[:160]}"
                     for n, b, c, ps in self.duplicates[:5]]
        return rows


@dataclass(frozen=True)
class BuildReport:
    tag: str
    human_tags: list[str]
    image_id: str
    build_hash: str
    stack: str
    flavor: str
    base: dict[str, str | None]  # ResolvedBase.to_json()
    skipped: bool  # up to date: nothing was built
    steps: list[StepTiming]
    dir: str
    dockerfile: str
    lock: str
    log: str
    command: list[str]
    size: int | None = None
    build_duration_s: float | None = None
    duration_s: float | None = None
    flags: str | None = None
    digest: str | None = None  # publish's, kept across builds
    published: list[str] = field(default_factory=list)
    compiled: dict[str, CompiledWheels] = field(default_factory=dict)
    patches: dict[str, str] = field(default_factory=dict)  # file -> sha256
    venv_sizes: VenvSizes | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BuildReport:
        compiled = _get(d, dict, "compiled") or {}
        for c in compiled.values():
            if not isinstance(c, dict):
                raise ReportError(f"{REPORT}: `compiled` holds a {type(c).__name__}, expected objects")
        return cls(
            tag=_get_required(d, str, "tag"), human_tags=_get_list(d, str, "human_tags"),
            image_id=_get_required(d, str, "image_id"),
            build_hash=_get_required(d, str, "build_hash"), stack=_get_required(d, str, "stack"),
            flavor=_get_required(d, str, "flavor"),
            base=_get(d, dict, "base") or {}, skipped=bool(_get(d, bool, "skipped")),
            steps=[StepTiming.from_dict(s) for s in _get_list(d, dict, "steps")],
            dir=_get_required(d, str, "dir"), dockerfile=_get(d, str, "dockerfile") or "",
            lock=_get(d, str, "lock") or "",
            log=_get(d, str, "log") or "", command=_get_list(d, str, "command"), size=_get(d, int, "size"),
            build_duration_s=_get_number(d, "build_duration_s"), duration_s=_get_number(d, "duration_s"),
            flags=_get(d, str, "flags"),
            digest=_get(d, str, "digest"), published=_get_list(d, str, "published"),
            compiled={n: CompiledWheels(_get_required(c, str, "key"), _get_required(c, str, "source"),
                                        bool(_get(c, bool, "from_store")), _get(c, str, "log"))
                      for n, c in compiled.items()},
            patches=_get(d, dict, "patches") or {},
            venv_sizes=(VenvSizes.from_dict(d["venv_sizes"], f"{REPORT}: venv_sizes")
                        if d.get("venv_sizes") is not None else None),
        )

    def to_json(self) -> dict[str, object]:
        """The report as report.json holds it (the keys publish and the tests read)."""
        return {
            "tag": self.tag, "human_tags": self.human_tags, "image_id": self.image_id, "digest": self.digest,
            "published": self.published, "size": self.size, "build_hash": self.build_hash, "stack": self.stack,
            "flavor": self.flavor, "base": self.base, "skipped": self.skipped,
            "build_duration_s": self.build_duration_s,
            "duration_s": self.duration_s, "steps": [s.to_json() for s in self.steps],
            "cache": {"hits": sum(1 for s in self.steps if s.cached), "steps": len(self.steps)},
            "compiled": {n: c.to_json() for n, c in self.compiled.items()}, "patches": self.patches, "dir": self.dir,
            "dockerfile": self.dockerfile, "lock": self.lock, "flags": self.flags, "log": self.log,
            "command": self.command,
            "venv_sizes": self.venv_sizes.to_json() if self.venv_sizes else None,
        }

    def summary_table(self) -> str:
        how = {"store": "store hit, nothing compiled", "registry": "pulled into the store, nothing compiled",
               "compiled": "a miss: compiled for the store first"}
        rows = [f"{'step':<24} {'cached':<7} {'seconds':>8}  compiled wheels"]
        for s in self.steps:
            dur = "" if s.duration_s is None else f"{s.duration_s:.1f}"
            c = self.compiled.get(s.name)
            note = "" if not c else (f"{how.get(c.source, c.source)} ({c.key})" if c.from_store
                                     else f"compiled in place ({c.key})")
            rows.append(f"{s.name[:24]:<24} {'yes' if s.cached else 'no':<7} {dur:>8}  {note}".rstrip())
        hits = sum(1 for s in self.steps if s.cached)
        rows.append(f"image {self.tag}  id {self.image_id[:19]}  size {(self.size or 0) / 1e6:.1f} MB  "
                    f"cache {hits}/{len(self.steps)}" + ("  (skipped: up to date)" if self.skipped else ""))
        if self.duration_s is not None and not self.skipped:
            rows.append(f"took {took(self.duration_s)}"
                        + ("" if self.build_duration_s is None else f" (BuildKit {took(self.build_duration_s)})"))
        if self.venv_sizes:
            rows += self.venv_sizes.lines()
        rows.append(f"report {self.dir}/{REPORT}  flags {self.flags}")
        # The report is read back from a file: what reaches the terminal is printable, line by line.
        return "\n".join(printable(r) for r in rows)
