"""The lock file: images/locks/pylock.<flavor>.toml, its grammar, and what the steps read from it.

    read_lock(path) / load_lock(ref) -> LockFile   parse and validate a committed lock (every value
                                                   that can reach a file or a command, by grammar)
    render_lock(data) -> str, write_lock(path, text)  the file as `invoke lock` writes it (atomically)
    step_requirements(lock, step)                  a step's slice: `name @ url --hash=sha256:...` lines
                                                   that `uv pip install --no-deps --require-hashes` installs
    router_requirement(lock, url)                  the router wheel's slice, by its recorded sha256
    uv_requirement(lock)                           the venv step's slice: the pinned uv's wheel, by its sha256

The lock is uv's own `pylock.toml` output cut down to the one file per package that the target
installs, plus `[tool.slimeforge]`: what PEP 751 cannot hold (the base image digest, the router
wheel, the git commits, the allowed pre-releases, the resolution's cutoff, the hash of the stack
inputs it was resolved from, the wheel of the pinned uv that the venv step installs) and `steps`,
which package each step installs.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from ... import paths, readback
from ...errors import ConfigError, Problem, SlimeforgeError
from ...scripts.venvlock import canonical
from ..stack import Stack, load_stack, stack_path
from .remedies import lock_command, remedy

SCHEMA = 1

SHA256_RE = re.compile(r"[0-9a-f]{64}")
# What a lock may hold in a name, a version or a URL: nothing that could break out of a
# requirements line or a shell word (no whitespace, no quotes, no control characters).
NAME_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9])?")
URL_RE = re.compile(r"(?:https?|file)://[A-Za-z0-9._~:/?#@!$&()*+,;=%-]{1,2000}")
FLAVOR_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
# The resolution's cutoff (uv's --exclude-newer): an RFC 3339 UTC time to the second.
CUTOFF_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")


class LockError(SlimeforgeError):
    """A lock is missing, stale or does not hold what the stack needs; the message says how to fix it."""


def normalize(name: str) -> str:
    """The PEP 503 name: the one normaliser, the step library's (scripts/venvlock.py canonical)."""
    return canonical(name)


def lock_path(ref: str | Path | Stack) -> Path:
    """images/<flavor>.yaml -> images/locks/pylock.<flavor>.toml (a lock lies beside its stack)."""
    stack = ref if isinstance(ref, Stack) else load_stack(ref)
    path = stack.file or stack_path(stack.name)
    return path.parent / "locks" / f"pylock.{stack.name}.toml"


def stack_ref(stack: Stack) -> str:
    """What `invoke lock` takes to name this stack: its flavor, or its file."""
    f = stack.file
    if f is None or f.resolve().parent == paths.IMAGES.resolve():
        return stack.name
    try:
        return str(f.resolve().relative_to(paths.ROOT))  # the same text from any working directory
    except ValueError:
        return str(f)


# --- the file ---------------------------------------------------------------------------------


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items() if x is not None) + " }"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def render_lock(data: dict[str, Any]) -> str:
    tool = data["tool"]["slimeforge"]
    lines = [
        f"# The {tool['flavor']} flavor, locked by `{tool['command']}` (PEP 751). Do not edit: re-lock.",
        "# One file per distribution: what the target installs. [tool.slimeforge] holds what pylock cannot.",
    ]
    for key in ("lock-version", "created-by", "requires-python"):
        lines.append(f"{key} = {_toml_value(data[key])}")
    for pkg in data["packages"]:
        lines += ["", "[[packages]]"]
        for key in ("name", "version", "index"):
            if key in pkg:
                lines.append(f"{key} = {_toml_value(pkg[key])}")
        if "sdist" in pkg:
            lines.append(f"sdist = {_toml_value(pkg['sdist'])}")
        if "wheels" in pkg:
            lines.append(f"wheels = {_toml_value(pkg['wheels'])}")
    lines += ["", "[tool.slimeforge]"]
    for key, value in tool.items():
        if not isinstance(value, dict):
            lines.append(f"{key} = {_toml_value(value)}")
    for key, value in tool.items():
        if isinstance(value, dict):
            lines += ["", f"[tool.slimeforge.{key}]"]
            lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None]
    return "\n".join(lines) + "\n"


def write_lock(path: Path, text: str) -> None:
    """Replace the lock whole (atomically): a reader sees the old file or the new one."""
    from ...atomic import write_dir

    path.parent.mkdir(parents=True, exist_ok=True)
    write_dir(path.parent, {path.name: text})


@dataclass
class Locked:
    name: str
    version: str
    url: str
    sha256: str
    size: int | None
    kind: str  # wheel or sdist
    filename: str


@dataclass
class LockFile:
    path: Path
    packages: dict[str, Locked]
    tool: dict[str, Any]
    text: str
    # A dry run's lock that lacks an outside fact (lockfacts.lock_for_run): the router's slice is
    # rendered marked, failing if run, instead of refused.
    provisional: bool = False
    # What `invoke lock` takes to remake it (its stack's flavor or file): the remedies name it.
    ref: str = ""

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def steps(self) -> dict[str, list[str]]:
        return self.tool.get("steps", {})

    @property
    def patch_sha256(self) -> dict[str, str]:
        """file -> sha256 of each patch file, as the lock records them ({} before `invoke lock` read them)."""
        return self.tool.get("patches") or {}


LOCK_ACCEPTED = "a lock as `invoke lock` writes it (PEP 751 TOML with [tool.slimeforge])"
# The type of every field of a lock the code reads (a lock is input: it may have been edited).
_TOP_TYPES: dict[str, type | tuple[type, ...]] = {"lock-version": str, "created-by": str, "requires-python": str,
                                                  "packages": list, "tool": dict}
_PACKAGE_TYPES: dict[str, type | tuple[type, ...]] = {"name": str, "version": str, "index": str, "sdist": dict,
                                                      "wheels": list}
_FILE_TYPES: dict[str, type | tuple[type, ...]] = {"name": str, "url": str, "size": int, "hashes": dict}
_TOOL_TYPES: dict[str, type | tuple[type, ...]] = {
    "schema": int, "flavor": str, "inputs": str, "python": str, "platform": str, "uv": str, "command": str,
                                                   "indexes": list,
    "prereleases": list, "base": dict,  # exclude-newer: by its grammar in read_lock
    "router": dict, "sources": dict, "patches": dict, "steps": dict, "uv-wheel": dict}
_TOOL_TABLES_OF_TEXT = ("base", "router", "sources", "patches", "uv-wheel")
MAX_FILE_SIZE = 1 << 40  # a distribution's recorded size in bytes: 1 TiB is a typo already


def _typed(doc: dict[str, Any], types: dict[str, type | tuple[type, ...]], at: str) -> list[Problem]:
    out = []
    for key, want in types.items():
        if key in doc and (isinstance(doc[key], bool) or not isinstance(doc[key], want)):
            names = " or ".join(t.__name__ for t in (want if isinstance(want, tuple) else (want,)))
            out.append(Problem(f"{at}{key}", f"is {type(doc[key]).__name__}, not {names}", doc[key],
                               f"a {names}, as `invoke lock` writes it"))
    return out


def shape_problems(data: dict[str, Any]) -> list[Problem]:
    """Every field the code reads, typed: a string where a size goes, a table where a list goes or
    a number where a name goes is named here, not a traceback later."""
    problems = _typed(data, _TOP_TYPES, "")
    packages = data.get("packages")
    for i, pkg in enumerate(packages if isinstance(packages, list) else []):
        if not isinstance(pkg, dict):
            problems.append(Problem(f"packages[{i}]", "is not a table", pkg, "[[packages]] tables"))
            continue
        problems += _typed(pkg, _PACKAGE_TYPES, f"packages[{i}].")
        files = ([pkg["sdist"]] if isinstance(pkg.get("sdist"),
                                              dict) else []) + (pkg["wheels"] if isinstance(pkg.get("wheels"),
                                                                                            list) else [])
        for f in files:
            if not isinstance(f, dict):
                problems.append(Problem(f"packages[{i}].wheels", "holds something that is not a table", f,
                                        "{ name, url, size, hashes }"))
                continue
            problems += _typed(f, _FILE_TYPES, f"packages[{i}].file.")
            size = f.get("size")
            if isinstance(size, int) and not isinstance(size, bool) and not 0 <= size <= MAX_FILE_SIZE:
                problems.append(Problem(f"packages[{i}].file.size", "is out of range", size,
                                        f"0..{MAX_FILE_SIZE} bytes"))
            hashes = f.get("hashes")
            if isinstance(hashes, dict) and "sha256" in hashes and not isinstance(hashes["sha256"], str):
                problems.append(Problem(f"packages[{i}].file.hashes.sha256", "is not text", hashes["sha256"],
                                        "64 hex digits"))
    tool = data.get("tool", {}).get("slimeforge") if isinstance(data.get("tool"), dict) else None
    if isinstance(tool, dict):
        problems += _typed(tool, _TOOL_TYPES, "tool.slimeforge.")
        for key in _TOOL_TABLES_OF_TEXT:
            table = tool.get(key)
            if isinstance(table, dict):
                problems += [Problem(f"tool.slimeforge.{key}.{k}", "is not text", v, "text") for k,
                             v in table.items() if not isinstance(v, str)]
        for key in ("indexes", "prereleases"):
            if isinstance(tool.get(key), list):
                problems += [Problem(f"tool.slimeforge.{key}", "holds something that is not text", v,
                                     "a list of text") for v in tool[key] if not isinstance(v, str)]
        steps = tool.get("steps")
        if isinstance(steps, dict):
            problems += [Problem(f"tool.slimeforge.steps.{k}", "is not a list of package names", v, "a list of names")
                         for k, v in steps.items() if not (isinstance(v, list) and all(isinstance(n, str) for n in v))]
    return problems


def read_lock(path: Path, stack: Stack | None = None, ref: str | Path | None = None) -> LockFile:
    """Parse a lock and check its grammar (every value that can reach a file or a command)."""
    where = str(path)
    # The one reader: a regular file only (a FIFO would block, a directory or device is refused),
    # bounded in size and depth, strict UTF-8; then every field the code uses is typed.
    raw = readback.read_bytes(path, "lock", LOCK_ACCEPTED, max_bytes=readback.MAX_TOML_RECORD, follow_symlinks=True)
    if raw is None:
        flavor = stack.name if stack else path.stem.removeprefix("pylock.")
        raise LockError(f"{path}: no lock for {flavor}: {remedy('lock', ref or flavor)}")
    text = readback.decode(path, "lock", LOCK_ACCEPTED, raw)
    data = readback.parse_toml(path, "lock", LOCK_ACCEPTED, text)
    if shape := shape_problems(data):
        raise ConfigError(where, shape)
    problems = []
    packages: dict[str, Locked] = {}
    for i, pkg in enumerate(data.get("packages", [])):
        at = f"packages[{i}]"
        name, version = str(pkg.get("name", "")), str(pkg.get("version", ""))
        if not NAME_RE.fullmatch(name):
            problems.append(Problem(f"{at}.name", "is not a distribution name", name))
            continue
        try:
            Version(version)
        except InvalidVersion:
            problems.append(Problem(f"{at}.version", "is not a version", version))
            continue
        files = [("sdist", pkg["sdist"])] if "sdist" in pkg else []
        files += [("wheel", w) for w in pkg.get("wheels", [])]
        if len(files) != 1:
            problems.append(Problem(f"{at} ({name})", "must hold exactly one file (the one the target installs)",
                                    len(files)))
            continue
        kind, f = files[0]
        url, sha = str(f.get("url", "")), str((f.get("hashes") or {}).get("sha256", ""))
        fname = str(f.get("name") or urllib.parse.unquote(url.rsplit("/", 1)[-1]))
        if not URL_RE.fullmatch(url):
            problems.append(Problem(f"{at} ({name}).url", "is not an http(s)/file URL without spaces or quotes", url))
        if not SHA256_RE.fullmatch(sha):
            problems.append(Problem(f"{at} ({name}).hashes.sha256", "is not a sha256", sha))
        if normalize(name) in packages:
            problems.append(Problem(f"{at}.name", "appears twice", name))
        packages[normalize(name)] = Locked(normalize(name), version, url, sha, f.get("size"), kind, fname)
    tool = (data.get("tool") or {}).get("slimeforge")
    if not isinstance(tool, dict):
        problems.append(Problem("[tool.slimeforge]", "is missing", None, show_value=False))
        tool = {}
    for step, names in (tool.get("steps") or {}).items():
        for n in names:
            if n not in packages:
                problems.append(Problem(f"tool.slimeforge.steps.{step}", "names a package the lock does not hold", n))
    flavor = tool.get("flavor", "")
    if flavor and not FLAVOR_RE.fullmatch(flavor):  # it goes into hints (`invoke lock --cuda FLAVOR`): only a name
        problems.append(Problem("tool.slimeforge.flavor", "is not a flavor name", flavor,
                                "letters, digits, '.', '_' and '-', such as cu13"))
    digest = (tool.get("base") or {}).get("digest", "")
    if digest and not DIGEST_RE.fullmatch(digest):
        problems.append(Problem("tool.slimeforge.base.digest", "is not a digest", digest, "sha256:<64 hex> or empty"))
    cutoff = tool.get("exclude-newer", "")
    if cutoff and not (isinstance(cutoff, str) and CUTOFF_RE.fullmatch(cutoff)):
        problems.append(Problem("tool.slimeforge.exclude-newer", "is not a cutoff", cutoff,
                                "YYYY-MM-DDTHH:MM:SSZ (UTC) or empty"))
    router = tool.get("router") or {}
    if router.get("url") and not URL_RE.fullmatch(router["url"]):
        problems.append(Problem("tool.slimeforge.router.url", "is not an http(s)/file URL without spaces or quotes",
                                router["url"]))
    if router.get("sha256") and not SHA256_RE.fullmatch(router["sha256"]):
        problems.append(Problem("tool.slimeforge.router.sha256", "is not a sha256", router["sha256"]))
    problems += uv_wheel_problems(tool.get("uv-wheel") or {}, str(tool.get("uv", "")))
    if problems:
        raise ConfigError(where, problems)
    return LockFile(path, packages, tool, text, ref=stack_ref(stack) if stack else str(tool.get("flavor") or ""))


def lock_ref(lock: LockFile) -> str:
    """What `invoke lock` takes to remake this lock (in its hints)."""
    return lock.ref or str(lock.tool.get("flavor") or "?")


def load_lock(ref: str | Path, stack: Stack | None = None) -> LockFile:
    stack = stack or load_stack(ref)
    return read_lock(lock_path(stack), stack, ref)


# --- installing a step's slice ---------------------------------------------------------------


SDIST_MARK = "# --- built from source (sdist), after the wheels above"


def step_requirements(lock: LockFile, step: str, *, by_name: bool = False) -> str:
    """The requirements file of one step: `name @ url --hash=sha256:H` per package, so uv fetches
    exactly that file and nothing else (`by_name`: `name==version --hash=sha256:H`, for a local
    wheel directory: the same files, found there instead of at their URL)."""
    if step not in lock.steps:
        raise LockError(f"{lock.path}: step {step} has no slice; re-lock with `{lock_command(lock_ref(lock))}`")
    lines = [f"# step {step}: {len(lock.steps[step])} distribution(s) from {lock.path.name}"]
    # Wheels first, then what builds from an sdist (sf_lock_install installs them in two calls):
    # a build without isolation finds its build dependencies already in the venv.
    names = sorted(lock.steps[step], key=lambda n: (lock.packages[n].kind == "sdist", n))
    for n in names:
        p = lock.packages[n]
        if p.kind == "sdist" and (n == names[0] or lock.packages[names[names.index(n) - 1]].kind != "sdist"):
            lines.append(SDIST_MARK)
        where = f"=={p.version}" if by_name else f" @ {p.url}"
        # The version as a trailing comment: uv ignores it, the step's check (sf_lock_verify) reads it.
        lines.append(f"{p.name}{where} --hash=sha256:{p.sha256}  # =={p.version}")
    return "\n".join(lines) + "\n"


def router_requirement(lock: LockFile, url: str) -> str:
    sha = (lock.tool.get("router") or {}).get("sha256", "")
    name = urllib.parse.unquote(url.rsplit("/", 1)[-1]).split("-")[0]
    if not sha and lock.provisional:
        # Without a hash, `uv pip install --require-hashes` refuses the line: a dry run's plan run as is
        # stops here, naming what is missing, instead of installing an unverified wheel.
        return (f"# MISSING: the router wheel's sha256 is not in {lock.path.name} (tool.slimeforge.router.sha256): "
                f"{remedy('router_sha256', lock_ref(lock))}. Until then this step fails.\n"
                f"{normalize(name)} @ {url}\n")
    if not sha:
        raise LockError(f"{lock.path}: the router wheel {url} has no sha256: {remedy('router_sha256', lock_ref(lock))}")
    return f"# the router wheel, by sha256\n{normalize(name)} @ {url} --hash=sha256:{sha}\n"


def uv_wheel_problems(wheel: dict[str, str], version: str) -> list[Problem]:
    """[tool.slimeforge.uv-wheel] by its grammar: the URL of a wheel of uv at the lock's `uv` version, its sha256."""
    out = []
    url, sha = wheel.get("url", ""), wheel.get("sha256", "")
    if url:
        if not URL_RE.fullmatch(url):
            out.append(Problem("tool.slimeforge.uv-wheel.url", "is not an http(s)/file URL without spaces or quotes",
                               url))
        else:
            try:
                name, found, _, _ = parse_wheel_filename(urllib.parse.unquote(url.rsplit("/", 1)[-1]))
            except (InvalidWheelFilename, InvalidVersion):
                out.append(Problem("tool.slimeforge.uv-wheel.url", "does not end in a wheel's file name", url,
                                   "uv-<version>-<tags>.whl"))
            else:
                if name != "uv" or str(found) != version:
                    out.append(Problem("tool.slimeforge.uv-wheel.url", f"is not a wheel of uv {version} "
                                       "(tool.slimeforge.uv, the stack's pin)", url))
    if sha and not SHA256_RE.fullmatch(sha):
        out.append(Problem("tool.slimeforge.uv-wheel.sha256", "is not a sha256", sha))
    extra = sorted(set(wheel) - {"url", "sha256"})
    if extra:
        out.append(Problem("tool.slimeforge.uv-wheel", "holds fields `invoke lock` does not write", extra,
                           "url and sha256"))
    return out


def uv_requirement(lock: LockFile) -> str:
    """The venv step's slice: the wheel of the stack's uv, fetched by URL and checked against its
    sha256 (pip --require-hashes), like every other file the install takes."""
    wheel = lock.tool.get("uv-wheel") or {}
    url, sha = wheel.get("url", ""), wheel.get("sha256", "")
    if not (url and sha) and lock.provisional:
        return (f"# MISSING: the wheel of uv {lock.tool.get('uv', '?')} is not in {lock.path.name} "
                f"(tool.slimeforge.uv-wheel): {remedy('uv_wheel', lock_ref(lock))}. Until then this step fails.\n"
                f"uv=={lock.tool.get('uv', '?')}\n")
    if not (url and sha):
        raise LockError(f"{lock.path}: the wheel of uv {lock.tool.get('uv', '?')} is not recorded "
                        f"(tool.slimeforge.uv-wheel): {remedy('uv_wheel', lock_ref(lock))}")
    return f"# the venv's uv, by sha256\nuv @ {url} --hash=sha256:{sha}  # =={lock.tool.get('uv')}\n"


def expected_versions(lock: LockFile) -> dict[str, str]:
    return {n: p.version for n, p in lock.packages.items()}

