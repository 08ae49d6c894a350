"""`invoke lock`: one hermetic PEP 751 lock per flavor, and what build and install do with it.

    resolve(opts) -> LockFile      resolve the whole flavor once, for its target (the stack's CPython,
                                   x86_64, the base image's glibc), and write images/locks/pylock.<flavor>.toml
    read_lock(path) -> LockFile    parse and validate a committed lock
    check(ref) -> list[str]        offline: the lock satisfies every pin, holds every step's packages,
                                   mixes no CUDA majors, is not stale (raises LockError listing all)
    step_requirements(lock, step)  a step's slice: `name @ url --hash=sha256:...` lines that
                                   `uv pip install --no-deps --require-hashes` installs without resolving

The lock is uv's own `pylock.toml` output (`uv pip compile --format pylock.toml`), cut down to the
one file per package that the target installs (the best wheel for the target's tags, or the sdist
where the step builds from source or no wheel fits), plus `[tool.slimeforge]`: what PEP 751 cannot
hold (the base image digest, the router wheel, the git commits, the allowed pre-releases, the hash
of the stack inputs it was resolved from) and `steps`, which package each step installs.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import tempfile
import time
import tomllib
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from .. import paths
from ..errors import ConfigError, Problem, SlimeforgeError
from ..proc import Runner
from .stack import Stack, load_stack, stack_path

SCHEMA = 1
PYPI = "https://pypi.org/simple"
SHA256_RE = re.compile(r"[0-9a-f]{64}")
# What a lock may hold in a name, a version or a URL: nothing that could break out of a
# requirements line or a shell word (no whitespace, no quotes, no control characters).
NAME_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9])?")
URL_RE = re.compile(r"(?:https?|file)://[A-Za-z0-9._~:/?#@!$&()*+,;=%-]{1,2000}")
# uv's hint when a dependency pins an exact pre-release that the resolver was not told about.
PRERELEASE_HINT_RE = re.compile(r"`([A-Za-z0-9._-]+)` was requested with a pre-release marker \(e\.g\., ([A-Za-z0-9._-]+)==([A-Za-z0-9.+!_-]+)\)")
# The venv's own tools: made by `python -m venv` (pip) and the venv step (uv), not by the lock.
VENV_TOOLS = ("pip", "uv")


class LockError(SlimeforgeError):
    """A lock is missing, stale or does not hold what the stack needs; the message says how to fix it."""


def lock_command(ref: str | Path) -> str:
    """The command that (re)makes the lock of a flavor name or a stack file."""
    text = str(ref)
    return f"invoke lock --stack {text}" if text.endswith((".yaml", ".yml")) else f"invoke lock --cuda {text}"


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


# --- the target and its files -----------------------------------------------------------------


def target_tags(stack: Stack) -> list[Tag]:
    """The wheel tags the target installs, best first: CPython <python>, manylinux x86_64 up to
    the base image's glibc (and the legacy aliases of those)."""
    major, minor = (int(x) for x in stack.python.split("."))
    glibc_minor = int(stack.base.glibc.split(".")[1])
    platforms = [f"manylinux_2_{m}_x86_64" for m in range(glibc_minor, 4, -1)]
    legacy = {17: "manylinux2014_x86_64", 12: "manylinux2010_x86_64", 5: "manylinux1_x86_64"}
    platforms = [p for m, p0 in zip(range(glibc_minor, 4, -1), platforms, strict=True) for p in (p0, legacy.get(m)) if p]
    return [*cpython_tags((major, minor), platforms=platforms), *compatible_tags((major, minor), f"cp{major}{minor}", platforms)]


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
    return {"name": name, "url": url, "size": entry.get("size"), "sha256": (entry.get("hashes") or {}).get("sha256", "")}


# --- what a flavor resolves ------------------------------------------------------------------


def normalize(name: str) -> str:
    return str(canonicalize_name(name))


def req_name(text: str) -> str:
    return normalize(Requirement(text).name)


@dataclass
class Inputs:
    """Everything a resolution of the flavor depends on; its hash says whether a lock is stale."""

    requirements: list[str]  # every pin of every step, sources' declared deps included
    overrides: list[str]
    indexes: list[str]  # extra indexes, searched before the default one
    python: str
    platform: str
    by_step: dict[str, list[str]]  # step -> the names it asks for
    from_source: list[str]  # names built from their sdist
    router: str | None
    sources: dict[str, str]
    base_image: str
    patches: list[str]  # <source>@<commit>:<dir>/<file> of every patch a step applies

    @property
    def hash(self) -> str:
        canon = json.dumps(self.__dict__, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()


def inputs(stack: Stack) -> Inputs:
    reqs: list[str] = []
    by_step: dict[str, list[str]] = {}
    overrides: list[str] = []
    from_source: list[str] = []
    for step in stack.plan:
        if step.kind == "pip":
            names = list(step.requirements or ())
            from_source += [normalize(n) for n in step.no_binary or ()]
            # uv has no "never this dependency": an override with a marker that is never true drops it.
            overrides += [f"{p} ; sys_platform == 'never'" for p in step.exclude or ()]
        elif step.kind == "source":
            assert step.source is not None  # a source step names its source (Stack.plan)
            names = [*(step.requirements or ()), *stack.lock.source_requirements.get(step.source, [])]
        else:
            continue  # apt, and the router wheel (a URL outside any index: its sha256 is recorded apart)
        bad = []
        for r in names:
            try:
                Requirement(r)
            except InvalidRequirement as exc:
                bad.append(Problem(f"steps ({step.name})", f"is not a requirement: {exc}", r, "name[extras]<specifier>"))
        if bad:
            raise ConfigError(f"stack {stack.name}", bad)
        reqs += [r for r in names if r not in reqs]
        by_step[step.name] = sorted({req_name(r) for r in names})
    # Packages that a source step builds itself (e.g. torch_memory_saver from its pinned commit)
    # must not come from the index too: two copies of one name cannot both be installed.
    overrides += [f"{p} ; sys_platform == 'never'" for p in stack.lock.provided_by_sources]
    overrides += list(stack.lock.overrides)
    indexes = [i for i in [stack.torch_index, *stack.lock.extra_indexes] if i]
    patches = []
    if stack.patches:
        src = stack.patches.from_source
        patches = [f"{src}@{stack.sources[src].commit}:{stack.patches.dir}/{p.file}" for p in stack.used_patches()]
    return Inputs(reqs, overrides, indexes, stack.python, stack.uv_platform, by_step, sorted(set(from_source)),
                  stack.router.wheel if stack.router else None, {n: s.commit for n, s in stack.sources.items()}, stack.base.image,
                  patches)


# --- resolving --------------------------------------------------------------------------------


@dataclass
class LockOptions:
    stack: str = "cu13"
    index_url: str | None = None  # replaces PyPI (a mirror, or a test's loopback index)
    base_digest: str | None = None  # sha256:... set by hand; else asked of the base image's registry
    router_sha256: str | None = None  # set by hand where the router URL cannot be reached
    sources: list[str] = field(default_factory=list)  # NAME=PATH: where the patches' source is read (else fetched)
    build_root: Path = paths.BUILDS
    out: Path | None = None
    uv: str | None = None
    echo: Callable[[str], None] = print
    runner: Runner = field(default_factory=Runner)


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


def _index_args(inp: Inputs, index_url: str | None) -> list[str]:
    argv = ["--index-url", index_url or PYPI]
    for extra in inp.indexes:
        argv += ["--extra-index-url", extra]
    return argv


def resolve(opts: LockOptions) -> dict[str, Any]:
    """Resolve the flavor once for its target and write its lock. Returns the lock's summary."""
    stack = load_stack(opts.stack)
    problems = []
    if opts.base_digest is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", opts.base_digest):
        problems.append(Problem("--base-digest", "is not a digest", opts.base_digest, "sha256:<64 lowercase hex>"))
    if opts.router_sha256 is not None and not SHA256_RE.fullmatch(opts.router_sha256):
        problems.append(Problem("--router-sha256", "is not a sha256", opts.router_sha256, "64 lowercase hex digits"))
    if opts.index_url is not None and not URL_RE.fullmatch(opts.index_url):
        problems.append(Problem("--index-url", "is not an http(s) or file URL", opts.index_url))
    local: dict = {}
    try:
        from .sources import parse_sources

        local = parse_sources(stack, opts.sources)
    except ConfigError as exc:
        problems.extend(exc.problems)
    if problems:
        raise ConfigError("invoke lock", problems)
    uv = uv_binary(stack, opts.uv)
    inp = inputs(stack)
    echo = opts.echo
    out = Path(opts.out) if opts.out else lock_path(opts.stack)
    started = time.monotonic()
    echo(f"lock {stack.name}: {len(inp.requirements)} pins, CPython {inp.python}, {inp.platform}; indexes: "
         + ", ".join([opts.index_url or PYPI, *inp.indexes]))
    with tempfile.TemporaryDirectory(prefix="sf-lock-") as tmp:
        work = Path(tmp)
        (work / "in.txt").write_text("\n".join(inp.requirements) + "\n")
        (work / "overrides.txt").write_text("\n".join(inp.overrides) + "\n")
        prereleases: list[str] = []
        common = ["--python-version", inp.python, "--python-platform", inp.platform, "--no-header",
                  "--prerelease", "if-necessary-or-explicit", *_index_args(inp, opts.index_url)]
        # 1. The resolution, with the graph ("# via") that divides the lock into steps.
        for attempt in range(1, 6):
            (work / "prereleases.txt").write_text("".join(f"{p}\n" for p in prereleases))
            echo(f"[1/3] resolving (round {attempt}) ...")
            argv = [uv, "pip", "compile", "-v", *common, "--annotation-style", "line", "--override", str(work / "overrides.txt"),
                    *(["--constraint", str(work / "prereleases.txt")] if prereleases else []),
                    str(work / "in.txt"), "-o", str(work / "resolved.txt")]
            rc, text = _stream_uv(opts.runner, argv, echo)
            if rc == 0:
                break
            unreachable = re.search(r"Failed to fetch: `(https?://[^/`]+)[^`]*`", text)
            if unreachable and re.search(r"dns error|client error \(Connect\)|timed out", text):
                raise LockError(f"lock {stack.name}: the index {unreachable.group(1)} cannot be reached from here; run "
                                f"`{lock_command(stack_ref(stack))}` where it can be, and commit {lock_path(stack)}")
            # An exact pre-release pinned by a dependency (sglang: flash-attn-4==4.0.0b15) is allowed,
            # that one version only; any other failure is the user's to fix.
            hints = [f"{m.group(2)}=={m.group(3)}" for m in PRERELEASE_HINT_RE.finditer(text.replace("\n      ", " "))
                     if normalize(m.group(1)) == normalize(m.group(2))]
            new = [h for h in hints if h not in prereleases]
            if not new:
                raise LockError(f"lock {stack.name}: uv could not resolve the flavor:\n{_tail(text)}")
            for h in new:
                echo(f"  allowing the exact pre-release {h} (a dependency pins it)")
            prereleases += new
        else:
            raise LockError(f"lock {stack.name}: still unresolved after allowing {prereleases}")
        resolved = (work / "resolved.txt").read_text()
        versions, graph = parse_annotated(resolved)
        echo(f"  {len(versions)} distributions resolved in {time.monotonic() - started:.0f}s")
        # 2. The files and hashes of exactly those versions (no second resolution: --no-deps).
        echo("[2/3] file hashes ...")
        pins = work / "pins.txt"
        pins.write_text("".join(f"{n}=={v}\n" for n, v in sorted(versions.items())))
        argv = [uv, "pip", "compile", "--quiet", *common, "--no-deps", "--format", "pylock.toml", "--generate-hashes", str(pins),
                "-o", str(work / "pylock.all.toml")]
        rc, text = _stream_uv(opts.runner, argv, echo)
        if rc != 0:
            raise LockError(f"lock {stack.name}: uv could not list the files of the resolved set:\n{_tail(text)}")
        pylock = tomllib.loads((work / "pylock.all.toml").read_text())
    echo("[3/3] base image digest, router wheel, steps ...")
    base_digest = opts.base_digest or stack.base.digest or base_image_digest(stack.base.image, echo)
    router = None
    if inp.router:
        router = {"url": inp.router, "sha256": opts.router_sha256 or url_sha256(inp.router, echo)}
    patches = patch_hashes(stack, local, opts.build_root, echo)
    data = build_lock(stack, inp, pylock, graph, prereleases, base_digest, router, patches)
    text = render_lock(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(out, text)
    summary = summarize(read_lock(out, stack), stack)
    summary.update(path=str(out), seconds=round(time.monotonic() - started, 1))
    echo(f"wrote {out}: {summary['packages']} distributions ({summary['packages'] - summary['named_by_stack']} of them named by no pin "
         f"of the stack), each fixed at one file by URL and sha256; {summary['bytes'] / 1e9:.2f} GB to download")
    for warn in summary["warnings"]:
        echo(f"  warning: {warn}")
    return summary


def _tail(text: str, n: int = 25) -> str:
    """uv's own message, without its -v DEBUG lines."""
    return "\n".join([line for line in text.splitlines() if not line.startswith("DEBUG")][-n:])


def _stream_uv(runner: Runner, argv: list[str], echo: Callable[[str], None]) -> tuple[int, str]:
    """Run uv, showing one progress line per package the resolver selects (resolution is slow)."""
    names: set[str] = set()
    lines: list[str] = []

    def on_line(line: str) -> None:
        lines.append(line)
        m = re.search(r"Selecting: ([^=\s]+)==(\S+) \[", line)
        if m and m.group(1) not in names:
            names.add(m.group(1))
            if len(names) % 20 == 1:  # a line per 20 new distributions: alive, not a flood
                echo(f"  {len(names):4} distributions so far ({m.group(1)}=={m.group(2)})")
        elif line.startswith(("warning:", "error:", "Resolved")):
            echo(f"  uv: {line}")

    rc = runner.stream(argv, on_line, step="lock")
    return rc, "\n".join(lines)


def parse_annotated(text: str) -> tuple[dict[str, str], dict[str, set[str]]]:
    """uv's `--annotation-style line` output: name -> version, and name -> the packages it needs."""
    versions: dict[str, str] = {}
    needs: dict[str, set[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        spec, _, via = line.partition("# via ")
        name, _, version = spec.strip().partition("==")
        name = normalize(name.split("[")[0])
        versions[name] = version.strip()
        for parent in via.split(","):
            parent = parent.strip()
            if parent and not parent.startswith("-"):
                needs.setdefault(normalize(parent), set()).add(name)
    return versions, needs


def build_lock(stack: Stack, inp: Inputs, pylock: dict[str, Any], graph: dict[str, set[str]], prereleases: list[str],
               base_digest: str | None, router: dict[str, Any] | None, patches: dict[str, str] | None = None) -> dict[str, Any]:
    tags = target_tags(stack)
    packages = []
    missing = []
    for pkg in sorted(pylock.get("packages", []), key=lambda p: normalize(p["name"])):
        name = normalize(pkg["name"])
        chosen = pick_file(pkg, tags, name in inp.from_source)
        if chosen is None or not chosen["sha256"]:
            missing.append(name)
            continue
        entry: dict[str, Any] = {"name": name, "version": pkg["version"]}
        if pkg.get("index"):
            entry["index"] = pkg["index"]
        key = "sdist" if chosen["kind"] == "sdist" else "wheels"
        f = {"name": chosen["name"], "url": chosen["url"], "size": chosen["size"], "hashes": {"sha256": chosen["sha256"]}}
        entry[key] = f if key == "sdist" else [f]
        packages.append(entry)
    if missing:
        raise LockError(f"lock {stack.name}: no file for {inp.platform} / CPython {inp.python} with a sha256: {missing}")
    steps = step_slices(inp.by_step, graph, {p["name"] for p in packages})
    tool = {
        "schema": SCHEMA,
        "flavor": stack.name,
        "inputs": inp.hash,
        "python": inp.python,
        "platform": inp.platform,
        "uv": stack.versions.get("uv", ""),
        # No timestamp: re-locking unchanged inputs against unchanged indexes gives the same bytes,
        # so the same content-addressed image tag.
        "command": lock_command(stack_ref(stack)),
        "indexes": inp.indexes,
        "prereleases": prereleases,
        "base": {"image": stack.base.image, "digest": base_digest or ""},
        "router": router or {},
        "sources": inp.sources,
        "patches": patches or {},
        "steps": steps,
    }
    return {"lock-version": "1.0", "created-by": "slimeforge", "requires-python": f"=={inp.python}.*",
            "packages": packages, "tool": {"slimeforge": tool}}


def step_slices(by_step: dict[str, list[str]], graph: dict[str, set[str]], names: set[str]) -> dict[str, list[str]]:
    """Each step gets the closure of what it asks for, less what an earlier step installed; what is
    left (dependencies of nothing a step names) goes to the last step, so nothing is left out."""
    taken: set[str] = set()
    out: dict[str, list[str]] = {}
    for step, wanted in by_step.items():
        todo, mine = [w for w in wanted if w in names], set()
        while todo:
            n = todo.pop()
            if n in taken or n in mine:
                continue
            mine.add(n)
            todo.extend(graph.get(n, ()))
        out[step] = sorted(mine)
        taken |= mine
    rest = names - taken
    if rest and out:
        last = list(out)[-1]
        out[last] = sorted(set(out[last]) | rest)
    return out


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


def _atomic_write(path: Path, text: str) -> None:
    from ..atomic import write_dir

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

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def steps(self) -> dict[str, list[str]]:
        return self.tool.get("steps", {})


def read_lock(path: Path, stack: Stack | None = None, ref: str | Path | None = None) -> LockFile:
    """Parse a lock and check its grammar (every value that can reach a file or a command)."""
    if not path.exists():
        flavor = stack.name if stack else path.stem.removeprefix("pylock.")
        raise LockError(f"{path}: no lock for {flavor}; make it with `{lock_command(ref or flavor)}` where the flavor's indexes "
                        "are reachable, and commit it")
    text = path.read_text()
    where = str(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(where, [Problem("(file)", f"is not TOML: {exc}", show_value=False)]) from None
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
            problems.append(Problem(f"{at} ({name})", "must hold exactly one file (the one the target installs)", len(files)))
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
    digest = (tool.get("base") or {}).get("digest", "")
    if digest and not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        problems.append(Problem("tool.slimeforge.base.digest", "is not a digest", digest, "sha256:<64 hex> or empty"))
    router = tool.get("router") or {}
    if router.get("sha256") and not SHA256_RE.fullmatch(router["sha256"]):
        problems.append(Problem("tool.slimeforge.router.sha256", "is not a sha256", router["sha256"]))
    if problems:
        raise ConfigError(where, problems)
    return LockFile(path, packages, tool, text)


def load_lock(ref: str | Path, stack: Stack | None = None) -> LockFile:
    stack = stack or load_stack(ref)
    return read_lock(lock_path(stack), stack, ref)


def check_patches(lock: LockFile, patches: dict[str, str]) -> None:
    """The patch files a build or install read must be those the lock recorded (when it did)."""
    recorded = lock.tool.get("patches") or {}
    wrong = [f"{f}: sha256 {sha}, the lock says {recorded[f]}" for f, sha in sorted(patches.items()) if f in recorded and recorded[f] != sha]
    if wrong:
        raise LockError(f"{lock.path}: patch files differ from the lock:\n" + "\n".join(f"  - {w}" for w in wrong))


def checked_lock(stack: Stack) -> LockFile:
    """The stack's committed lock, refused (with the command that makes it) when missing, stale or
    short of anything the stack needs: build and install install from it alone."""
    ref = stack_ref(stack)
    lock = read_lock(lock_path(stack), stack, ref)
    problems = check_lock(stack, lock, ref)
    if problems:
        raise LockError(f"{lock.path} cannot be installed from ({len(problems)} problem(s)); fix them, e.g. `{lock_command(ref)}`:\n"
                        + "\n".join(f"  - {p}" for p in problems))
    return lock


# --- checking ---------------------------------------------------------------------------------

CUDA_NAME_RE = re.compile(r"(?:^|[-_])cu(1[0-9])(?:[0-9])?(?:$|[-_])")
CUDA_LOCAL_RE = re.compile(r"^cu(1[0-9])[0-9]$")
# Distributions whose own major version is the CUDA major they are built for (no cuNN in the name).
CUDA_VERSIONED = {"cuda-python", "cuda-bindings", "cuda-toolkit", "nvidia-cuda-runtime", "nvidia-cuda-nvrtc",
                  "nvidia-cuda-cupti", "nvidia-cuda-nvcc", "nvidia-cublas", "nvidia-nvjitlink", "nvidia-nvtx"}


def cuda_major_of(name: str, version: str) -> str | None:
    """The CUDA major a distribution is built for, where its name or version says so: a `cu12` /
    `cu13` part of the name (nvidia-cudnn-cu12, transformer-engine-cu13), a local version `+cu129`,
    or the major version of the CUDA runtime packages themselves (cuda-python 12.9, nvidia-cublas 13.1)."""
    m = CUDA_NAME_RE.search(name)
    if m:
        return m.group(1)
    local = Version(version).local
    if local:
        m = CUDA_LOCAL_RE.fullmatch(local.split(".")[0])
        if m:
            return m.group(1)
    if name in CUDA_VERSIONED:
        return str(Version(version).major)
    return None


def check_lock(stack: Stack, lock: LockFile, ref: str | Path | None = None) -> list[str]:
    """Every problem of a lock against its stack (empty: good)."""
    problems: list[str] = []
    relock = lock_command(ref or stack_ref(stack))
    inp = inputs(stack)
    tool = lock.tool
    if tool.get("inputs") != inp.hash:
        problems.append(f"stale: the stack's pins, steps or indexes changed since the lock was made (run `{relock}`)")
    if tool.get("uv") != stack.versions.get("uv"):
        problems.append(f"uv: locked with uv {tool.get('uv')}, the stack pins {stack.versions.get('uv')} (run `{relock}`)")
    if tool.get("python") != stack.python or tool.get("platform") != stack.uv_platform:
        problems.append(f"target: locked for CPython {tool.get('python')} {tool.get('platform')}, the stack is "
                        f"CPython {stack.python} {stack.uv_platform}")
    for req_text in inp.requirements:
        req = Requirement(req_text)
        name = normalize(req.name)
        got = lock.packages.get(name)
        if got is None:
            problems.append(f"pin {req_text}: {name} is not in the lock")
        elif not req.specifier.contains(got.version, prereleases=True):
            problems.append(f"pin {req_text}: the lock holds {name} {got.version}")
    held = {n for names in lock.steps.values() for n in names}
    for step, wanted in inp.by_step.items():
        if step not in lock.steps:
            problems.append(f"step {step}: has no slice in [tool.slimeforge.steps]")
        for n in wanted:
            if n not in held and n not in {normalize(p) for p in stack.lock.provided_by_sources}:
                problems.append(f"step {step}: {n} is in no step's slice")
    extra = sorted(set(lock.steps) - set(inp.by_step))
    if extra:
        problems.append(f"steps {extra}: in the lock but not in the stack")
    orphans = sorted(set(lock.packages) - held)
    if orphans:
        problems.append(f"packages in no step's slice (never installed): {orphans}")
    twice = sorted(n for n in held if sum(n in v for v in lock.steps.values()) > 1)
    if twice:
        problems.append(f"packages in two steps' slices: {twice}")
    for n in stack.lock.provided_by_sources:
        if normalize(n) in lock.packages:
            problems.append(f"{normalize(n)}: built by a source step, yet also in the lock")
    if stack.cuda_major:
        for p in lock.packages.values():
            major = cuda_major_of(p.name, p.version)
            if major and major != stack.cuda_major:
                problems.append(f"CUDA mix: {p.name} {p.version} is built for CUDA {major}, the flavor is CUDA {stack.cuda}")
    sources = tool.get("sources") or {}
    for n, s in stack.sources.items():
        if sources.get(n) != s.commit:
            problems.append(f"source {n}: the lock has commit {sources.get(n)!r}, the stack {s.commit}")
    if stack.router:
        router = tool.get("router") or {}
        if router.get("url") != stack.router.wheel:
            problems.append(f"router: the lock has {router.get('url')!r}, the stack {stack.router.wheel}")
        # A missing router sha256 is a warning here (summarize): the lock is still right for every
        # other step; the router step itself refuses to render without it (router_requirement).
    for name, sha in (tool.get("patches") or {}).items():
        if not SHA256_RE.fullmatch(str(sha)):
            problems.append(f"patch {name}: {sha!r} is not a sha256")
    base = tool.get("base") or {}
    if base.get("image") != stack.base.image:
        problems.append(f"base: the lock has {base.get('image')!r}, the stack {stack.base.image}")
    return problems


def check(ref: str, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """`invoke lock --check`: offline. Raises LockError listing every problem."""
    stack = load_stack(ref)
    lock = load_lock(ref, stack)
    problems = check_lock(stack, lock, ref)
    if problems:
        raise LockError(f"{lock.path}: {len(problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in problems))
    summary = summarize(lock, stack)
    echo(f"{lock.path}: ok ({summary['packages']} distributions, {summary['bytes'] / 1e9:.2f} GB, "
         f"{len(lock.steps)} steps, base {'@' + summary['base_digest'] if summary['base_digest'] else 'NOT pinned by digest'})")
    for warn in summary["warnings"]:
        echo(f"  warning: {warn}")
    return summary


def summarize(lock: LockFile, stack: Stack | None = None) -> dict[str, Any]:
    tool = lock.tool
    warnings = []
    if not (tool.get("base") or {}).get("digest"):
        warnings.append("the base image has no digest in the lock (pass --base-digest sha256:... or lock where its registry is reachable)")
    if tool.get("router") and not tool["router"].get("sha256"):
        warnings.append(f"the router wheel has no sha256 in the lock: its step cannot be built or installed until "
                        f"`{tool.get('command', 'invoke lock')} --router-sha256 <sha256>` (or a re-lock where {tool['router'].get('url')} is reachable)")
    if stack is not None and stack.patches and not tool.get("patches"):
        warnings.append(f"no patch sha256 in the lock: re-lock with --source {stack.patches.from_source}=PATH (a checkout holding the commit)")
    sdists = sorted(p.name for p in lock.packages.values() if p.kind == "sdist")
    named = set()
    if stack is not None:
        named = {req_name(r) for r in inputs(stack).requirements}
    return {
        "packages": len(lock.packages),
        "bytes": sum(p.size or 0 for p in lock.packages.values()),
        "sdists": sdists,
        "base_digest": (tool.get("base") or {}).get("digest", ""),
        "prereleases": tool.get("prereleases", []),
        "named_by_stack": len(named & set(lock.packages)),
        "warnings": warnings,
        "hash": lock.hash,
    }


# --- installing a step's slice ---------------------------------------------------------------


SDIST_MARK = "# --- built from source (sdist), after the wheels above"


def step_requirements(lock: LockFile, step: str, *, by_name: bool = False) -> str:
    """The requirements file of one step: `name @ url --hash=sha256:H` per package, so uv fetches
    exactly that file and nothing else (`by_name`: `name==version --hash=sha256:H`, for a local
    wheel directory: the same files, found there instead of at their URL)."""
    if step not in lock.steps:
        raise LockError(f"{lock.path}: step {step} has no slice; re-lock with `{lock_command(lock.tool.get('flavor', '?'))}`")
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
    if not sha:
        raise LockError(f"{lock.path}: the router wheel {url} has no sha256; re-lock where it is reachable, "
                        f"or `{lock_command(lock.tool.get('flavor', '?'))} --router-sha256 <sha256>`")
    name = urllib.parse.unquote(url.rsplit("/", 1)[-1]).split("-")[0]
    return f"# the router wheel, by sha256\n{normalize(name)} @ {url} --hash=sha256:{sha}\n"


def expected_versions(lock: LockFile) -> dict[str, str]:
    return {n: p.version for n, p in lock.packages.items()}


# --- base image and router -------------------------------------------------------------------


def base_image_digest(image: str, echo: Callable[[str], None]) -> str | None:
    """The digest the base image's tag points at, asked of its registry (any OCI registry, Docker
    Hub included); None, with a warning, where the registry cannot be reached."""
    from .publish import docker_config_credentials
    from .registry import RegistryAPI, Retry, parse_image_ref

    ref = parse_image_ref(image, "base.image")
    if ref.digest:
        return ref.digest
    try:
        # Anonymous where the registry allows it (Docker Hub's public images); `docker login`'s where given.
        credentials = docker_config_credentials(ref.registry)
        api = RegistryAPI(ref.registry, credentials, retry=Retry(attempts=2), echo=echo, timeout=20)
        manifest = api.manifest(ref.repository, ref.tag or "latest")
    except (SlimeforgeError, OSError) as exc:
        echo(f"  base image {image}: its registry cannot be reached ({str(exc).splitlines()[0]}); "
             "the lock records no digest (set one with --base-digest sha256:...)")
        return None
    if manifest is None:
        raise LockError(f"base image {image}: its registry has no such tag")
    echo(f"  base image {image} -> {manifest.digest}")
    return manifest.digest


def patch_hashes(stack: Stack, local: dict, build_root: Path, echo: Callable[[str], None]) -> dict[str, str] | None:
    """sha256 of every patch file a step applies, read from the pinned source (a local checkout
    given with --source, else fetched); None, with a warning, where neither can be read."""
    if not stack.patches:
        return {}
    from .patches import read_patches

    try:
        contents = read_patches(stack, local, paths.sources_cache(build_root))
    except SlimeforgeError as exc:
        echo(f"  patches: cannot read them ({str(exc).splitlines()[0]}); the lock records no patch sha256 "
             f"(pass --source {stack.patches.from_source}=PATH)")
        return None
    return {p.file: p.sha256 for p in contents}


def url_sha256(url: str, echo: Callable[[str], None], limit: int = 512 << 20) -> str | None:
    """sha256 of a file by URL (streamed, bounded); None, with a warning, where it cannot be fetched."""
    digest = hashlib.sha256()
    size = 0
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 - the URL is a pinned https file
            while chunk := resp.read(1 << 20):
                size += len(chunk)
                if size > limit:
                    raise LockError(f"{url}: larger than {limit >> 20} MiB")
                digest.update(chunk)
    except (OSError, ValueError) as exc:
        echo(f"  {url}: cannot be fetched ({exc}); the lock records no sha256 (set one with --router-sha256)")
        return None
    return digest.hexdigest()
