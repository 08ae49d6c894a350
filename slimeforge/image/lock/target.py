"""The target of a lock: which file of a package it installs, and the pinned uv that lists them.

    target_tags(stack)          the wheel tags the target installs, best first
    pick_file(pkg, tags, ...)   the one file of a pylock package the target installs
    uv_binary(stack)            the stack's pinned uv (beside this Python, else on PATH)
    uv_wheel(stack, cutoff, ...)  the wheel of that uv for the target: the venv step's one input, by
                                URL and sha256 (`invoke lock` and `invoke lock --complete` record it)
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import tomllib
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from ...proc import Runner
from ..stack import Stack
from .lockfile import SHA256_RE, URL_RE, LockError, normalize

PYPI = "https://pypi.org/simple"


def target_tags(stack: Stack) -> list[Tag]:
    """The wheel tags the target installs, best first: CPython <python>, manylinux x86_64 up to
    the base image's glibc (and the legacy aliases of those)."""
    major, minor = (int(x) for x in stack.python.split("."))
    glibc_minor = int(stack.base.glibc.split(".")[1])
    platforms = [f"manylinux_2_{m}_x86_64" for m in range(glibc_minor, 4, -1)]
    legacy = {17: "manylinux2014_x86_64", 12: "manylinux2010_x86_64", 5: "manylinux1_x86_64"}
    platforms = [p for m, p0 in zip(range(glibc_minor, 4, -1), platforms, strict=True) for p in (p0,
                                                                                                 legacy.get(m)) if p]
    return [*cpython_tags((major, minor), platforms=platforms), *compatible_tags((major, minor), f"cp{major}{minor}",
                                                                                 platforms)]


def pick_file(pkg: dict[str, Any], tags: list[Tag], from_source: bool) -> dict[str, Any] | None:
    """The one file of a pylock package the target installs: the sdist for a step that builds from
    source, else the wheel with the best tag, else the sdist (built without isolation)."""
    sdist = pkg.get("sdist")
    if from_source and sdist:
        return {"kind": "sdist", **_file(sdist)}
    rank = {t: i for i, t in enumerate(tags)}
    best: tuple[int, str] | None = None
    chosen = None
    for wheel in pkg.get("wheels", []):
        name = wheel.get("name") or urllib.parse.unquote(wheel["url"].rsplit("/", 1)[-1].split("#")[0])
        try:
            wheel_tags = parse_wheel_filename(name)[3]
        except InvalidWheelFilename:
            continue
        score = min((rank[t] for t in wheel_tags if t in rank), default=None)
        if score is not None and (best is None or (score, name) < best):
            best, chosen = (score, name), wheel
    if chosen is not None:
        return {"kind": "wheel", **_file(chosen)}
    return {"kind": "sdist", **_file(sdist)} if sdist else None


def _file(entry: dict[str, Any]) -> dict[str, Any]:
    url = entry.get("url") or ""
    name = entry.get("name") or urllib.parse.unquote(url.rsplit("/", 1)[-1].split("#")[0])
    return {"name": name, "url": url, "size": entry.get("size"), "sha256": (entry.get("hashes") or {}).get("sha256",
                                                                                                           "")}


def uv_binary(stack: Stack, given: str | None = None) -> str:
    """The pinned uv: the one beside this Python (pyproject pins it), else on PATH."""
    candidates = [given] if given else [str(Path(sys.executable).parent / "uv"), shutil.which("uv") or ""]
    want = stack.versions.get("uv", "")
    for cand in candidates:
        if cand and Path(cand).is_file():
            res = Runner().run([cand, "--version"], check=False)
            have = res.stdout.split()[1] if res.ok and len(res.stdout.split()) > 1 else "?"
            if have == want:
                return cand
            raise LockError(f"uv at {cand} is {have}, the stack pins {want}: pip install uv=={want}")
    raise LockError(f"uv {want} not found: pip install uv=={want} (into the venv that runs invoke)")


def uv_wheel(stack: Stack, cutoff: str, index_url: str | None, echo: Callable[[str], None],
             runner: Runner | None = None, uv: str | None = None) -> dict[str, str] | None:
    """The wheel of the stack's pinned uv that the target installs, the venv step's one input: its
    URL and sha256, as the index lists the files of exactly that version (nothing is resolved), the
    best for the target's tags. None, with a warning, where the index cannot be reached or lists none."""
    version = stack.versions.get("uv", "")
    try:
        binary = uv or uv_binary(stack)
    except LockError as exc:
        echo(f"  the wheel of uv {version}: {exc}")
        return None
    with tempfile.TemporaryDirectory(prefix="sf-uv-wheel-") as tmp:
        (Path(tmp) / "uv.txt").write_text(f"uv=={version}\n")
        argv = [binary, "pip", "compile", "--quiet", "--python-version", stack.python, "--python-platform",
                stack.uv_platform, "--no-header", *(["--exclude-newer", cutoff] if cutoff else []),
                "--index-url", index_url or PYPI, "--no-deps", "--format", "pylock.toml", "--generate-hashes",
                str(Path(tmp) / "uv.txt"), "-o", str(Path(tmp) / "pylock.toml")]
        res = (runner or Runner()).run(argv, check=False, step="lock", timeout=120)
        listed = tomllib.loads((Path(tmp) / "pylock.toml").read_text()) if res.ok else {}
    pkg = next((p for p in listed.get("packages", []) if normalize(str(p.get("name", ""))) == "uv"), None)
    chosen = pick_file(pkg, target_tags(stack), False) if pkg else None
    if not chosen or chosen["kind"] != "wheel" or not SHA256_RE.fullmatch(chosen["sha256"] or "") \
            or not URL_RE.fullmatch(chosen["url"]):
        echo(f"  the wheel of uv {version} for {stack.uv_platform}: not found on {index_url or PYPI}"
             + (f" ({res.stderr.strip()[-300:]})" if not res.ok else "") + "; the lock records none")
        return None
    echo(f"  uv {version}: {chosen['name']}")
    return {"url": chosen["url"], "sha256": chosen["sha256"]}
