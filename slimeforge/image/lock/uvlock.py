"""`invoke lock`: resolve a flavor once, for its target (the stack's CPython, x86_64, the base
image's glibc), and write images/locks/pylock.<flavor>.toml (see lockfile.py for the file).

    resolve(opts) -> LockWritten   two uv calls: the resolution with its graph (which step installs what),
                                   then the files and hashes of exactly those versions; then the outside
                                   facts (lockfacts.py) and the steps' slices

The resolution's cutoff (uv's `--exclude-newer`) is recorded in the lock and reused by the next
`invoke lock` of unchanged inputs, so re-locking later gives the same bytes; `--upgrade`, or
changed inputs, move it to now.
"""

from __future__ import annotations

import re
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ...errors import Problem, SlimeforgeError
from ...proc import Runner
from ..stack import Stack, load_stack
from .lockcheck import LockSummary, summarize
from .lockfacts import base_image_digest, patch_hashes, url_sha256
from .lockfile import (
    DIGEST_RE,
    SCHEMA,
    SHA256_RE,
    URL_RE,
    LockError,
    LockFile,
    lock_command,
    lock_path,
    normalize,
    read_lock,
    render_lock,
    stack_ref,
    write_lock,
)
from .lockinputs import Inputs, inputs
from .target import PYPI, pick_file, target_tags, uv_binary, uv_wheel

# an allowed pre-release, name==version
PINNED_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}==[0-9A-Za-z.+!_-]{1,64}")
# uv's hint when a dependency pins an exact pre-release that the resolver was not told about.
PRERELEASE_HINT_RE = re.compile(r"`([A-Za-z0-9._-]+)` was requested with a pre-release marker \(e\.g\., "
                                r"([A-Za-z0-9._-]+)==([A-Za-z0-9.+!_-]+)\)")


# --- resolving --------------------------------------------------------------------------------


@dataclass
class LockOptions:
    stack: str = "cu13"
    index_url: str | None = None  # replaces PyPI (a mirror, or a test's loopback index)
    base_digest: str | None = None  # sha256:... set by hand; else asked of the base image's registry
    router_sha256: str | None = None  # set by hand where the router URL cannot be reached
    sources: list[str] = field(default_factory=list)  # NAME=PATH: where the patches' source is read (else fetched)
    out: Path | None = None
    upgrade: bool = False  # move the cutoff to now even where the inputs are unchanged
    uv: str | None = None
    echo: Callable[[str], None] = print
    runner: Runner = field(default_factory=Runner)
    now: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))  # the clock a new cutoff is read from


def previous_lock(path: Path) -> LockFile | None:
    """The lock that `invoke lock` replaces, validated as any lock is; None when there is none
    (or none that reads as a lock: then nothing of it is reused)."""
    try:
        return read_lock(path) if path.is_file() else None
    except SlimeforgeError:
        return None


def choose_cutoff(previous: LockFile | None, inp: Inputs, upgrade: bool, now: datetime) -> tuple[str, str, bool]:
    """The resolution's cutoff (uv's --exclude-newer) and why: the previous lock's, where it records
    one and the stack's inputs are unchanged (so re-locking later gives the same lock), else now
    (--upgrade, changed inputs, or no previous lock). The flag: whether it is the previous lock's."""
    tool = previous.tool if previous else {}
    recorded = tool.get("exclude-newer")
    fresh = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if upgrade:
        return fresh, "now (--upgrade)", False
    if not recorded:
        return fresh, "now (the previous lock records none)" if previous else "now (no previous lock)", False
    if tool.get("inputs") != inp.hash:
        return fresh, f"now (the stack's inputs changed since the lock with cutoff {recorded})", False
    return recorded, "the previous lock's (inputs unchanged; --upgrade moves it)", True


def _index_args(inp: Inputs, index_url: str | None) -> list[str]:
    argv = ["--index-url", index_url or PYPI]
    for extra in inp.indexes:
        argv += ["--extra-index-url", extra]
    return argv


class LockWritten(LockSummary):
    """A lock's summary (lockcheck.summarize), with where it was written and how long resolving took."""

    path: str
    seconds: float


def resolve(opts: LockOptions) -> LockWritten:
    """Resolve the flavor once for its target and write its lock. Returns the lock's summary.
    Its phases: the options; the cutoff; [1/3] the versions (with the graph that divides the lock
    into steps); [2/3] the files and hashes of exactly those versions; [3/3] the outside facts;
    then the lock written and read back."""
    stack = load_stack(opts.stack)
    local = _checked_options(stack, opts)
    uv = uv_binary(stack, opts.uv)
    inp = inputs(stack)
    echo = opts.echo
    out = Path(opts.out) if opts.out else lock_path(opts.stack)
    started = time.monotonic()
    echo(f"lock {stack.name}: {len(inp.requirements)} pins, CPython {inp.python}, {inp.platform}; indexes: "
         + ", ".join([opts.index_url or PYPI, *inp.indexes]))
    previous = previous_lock(out)
    cutoff, why, reused = choose_cutoff(previous, inp, opts.upgrade, opts.now())
    echo(f"  cutoff {cutoff}: {why}")
    with tempfile.TemporaryDirectory(prefix="sf-lock-") as tmp:
        work = Path(tmp)
        (work / "in.txt").write_text("\n".join(inp.requirements) + "\n")
        (work / "overrides.txt").write_text("\n".join(inp.overrides) + "\n")
        if reused:
            # uv prefers the versions of an existing output file: the previous lock's, where the inputs
            # are unchanged, so that a lock made from stale index pages (files the cutoff lets in but
            # that resolution did not see) is reproduced too, not moved.
            assert previous is not None
            (work / "resolved.txt").write_text("".join(f"{n}=={p.version}\n" for n, p in previous.packages.items()))
        # The exact pre-releases the previous lock allowed, where its versions are preferred: they are
        # among them, and uv would no longer name them in a hint.
        prereleases: list[str] = [p for p in previous.tool.get("prereleases") or [] if isinstance(p, str)
                                  and PINNED_RE.fullmatch(p)] \
            if previous and reused else []
        run = _Resolution(stack, inp, uv, work, opts, reused)
        versions, graph, prereleases, cutoff = run.versions(prereleases, cutoff)
        echo(f"  {len(versions)} distributions resolved in {time.monotonic() - started:.0f}s")
        pylock = run.hashes(versions, cutoff)
    echo("[3/3] base image digest, router wheel, uv's wheel, steps ...")
    base_digest, router, patches = _outside_facts(stack, inp, opts, previous, local)
    kept_wheel = (previous.tool.get("uv-wheel") or {}) if previous and previous.tool.get("uv") == \
        stack.versions.get("uv") and not opts.upgrade else {}
    wheel = (kept_wheel if kept_wheel.get("url") and kept_wheel.get("sha256")
             else uv_wheel(stack, cutoff, opts.index_url, echo, opts.runner, uv))
    write_lock(out, render_lock(build_lock(stack, inp, pylock, graph, prereleases, base_digest, router, patches,
                                           cutoff, wheel)))
    summary: LockWritten = {**summarize(read_lock(out, stack), stack), "path": str(out),
                            "seconds": round(time.monotonic() - started, 1)}
    echo(f"wrote {out}: {summary['packages']} distributions ({summary['packages'] - summary['named_by_stack']} of "
         "them named by no pin "
         f"of the stack), each fixed at one file by URL and sha256; {summary['bytes'] / 1e9:.2f} GB to download")
    for warn in summary["warnings"]:
        echo(f"  warning: {warn}")
    return summary


def _checked_options(stack: Stack, opts: LockOptions) -> dict:
    problems = []
    if opts.base_digest is not None and not DIGEST_RE.fullmatch(opts.base_digest):
        problems.append(Problem("--base-digest", "is not a digest", opts.base_digest, "sha256:<64 lowercase hex>"))
    if opts.router_sha256 is not None and not SHA256_RE.fullmatch(opts.router_sha256):
        problems.append(Problem("--router-sha256", "is not a sha256", opts.router_sha256, "64 lowercase hex digits"))
    if opts.index_url is not None and not URL_RE.fullmatch(opts.index_url):
        problems.append(Problem("--index-url", "is not an http(s) or file URL", opts.index_url))
    from ..sources import checked_options

    return checked_options("invoke lock", stack, problems, opts.sources)


@dataclass
class _Resolution:
    """The two uv runs of a lock, in one work directory."""

    stack: Stack
    inp: Inputs
    uv: str
    work: Path
    opts: LockOptions
    reused: bool  # the previous lock's versions are preferred (inputs unchanged)

    def common(self, cutoff: str) -> list[str]:
        return ["--python-version", self.inp.python, "--python-platform", self.inp.platform, "--no-header",
                "--prerelease", "if-necessary-or-explicit", *(["--exclude-newer", cutoff] if cutoff else []),
                # A new cutoff is now: index pages uv cached minutes ago would hide files from
                # before it that a later re-lock sees. Fresh pages, so both see the same.
                *([] if self.reused else ["--refresh"]),
                *_index_args(self.inp, self.opts.index_url)]

    def versions(self, prereleases: list[str], cutoff: str) -> tuple[dict[str, str], dict, list[str], str]:
        """[1/3] The resolution, with the graph ("# via") that divides the lock into steps; exact
        pre-releases a dependency pins are allowed one by one. Returns versions, graph, the
        pre-releases allowed and the cutoff (dropped for an index without upload times)."""
        work, echo, name = self.work, self.opts.echo, self.stack.name
        for attempt in range(1, 7):
            (work / "prereleases.txt").write_text("".join(f"{p}\n" for p in prereleases))
            echo(f"[1/3] resolving (round {attempt}) ...")
            argv = [self.uv, "pip", "compile", "-v", *self.common(cutoff), "--annotation-style", "line",
                    "--override", str(work / "overrides.txt"), *(["--constraint",
                                                                  str(work / "prereleases.txt")] if prereleases
                                                                 else []),
                    str(work / "in.txt"), "-o", str(work / "resolved.txt")]
            rc, text = _stream_uv(self.opts.runner, argv, echo)
            if rc == 0:
                versions, graph = parse_annotated((work / "resolved.txt").read_text())
                return versions, graph, prereleases, cutoff
            unreachable = re.search(r"Failed to fetch: `(https?://[^/`]+)[^`]*`", text)
            if unreachable and re.search(r"dns error|client error \(Connect\)|timed out", text):
                raise LockError(f"lock {name}: the index {unreachable.group(1)} cannot be reached from here; run "
                                f"`{lock_command(stack_ref(self.stack))}` where it can be, and commit "
                                f"{lock_path(self.stack)}")
            # An exact pre-release pinned by a dependency (sglang: flash-attn-4==4.0.0b15) is allowed,
            # that one version only.
            hints = [f"{m.group(2)}=={m.group(3)}" for m in PRERELEASE_HINT_RE.finditer(text.replace("\n      ", " "))
                     if normalize(m.group(1)) == normalize(m.group(2))]
            new = [h for h in hints if h not in prereleases]
            for h in new:
                echo(f"  allowing the exact pre-release {h} (a dependency pins it)")
            prereleases = prereleases + new
            if not new and cutoff and "is missing an upload date" in text:
                # An index without upload times (PEP 700) gives uv nothing to compare with the cutoff,
                # so it drops every file of it: resolve without one, and say that re-locking moves.
                echo(f"  warning: an index gives no upload times, so no cutoff can apply: resolving without one "
                     f"(re-locking later may choose newer versions of what no pin names)\n{_missing_dates(text)}")
                cutoff = ""
            elif not new:  # any other failure is the user's to fix
                raise LockError(f"lock {name}: uv could not resolve the flavor:\n{_tail(text)}")
        raise LockError(f"lock {name}: still unresolved after allowing {prereleases}")

    def hashes(self, versions: dict[str, str], cutoff: str) -> dict[str, Any]:
        """[2/3] The files and hashes of exactly those versions (no second resolution: --no-deps)."""
        self.opts.echo("[2/3] file hashes ...")
        pins = self.work / "pins.txt"
        pins.write_text("".join(f"{n}=={v}\n" for n, v in sorted(versions.items())))
        argv = [self.uv, "pip", "compile", "--quiet", *self.common(cutoff), "--no-deps", "--format", "pylock.toml",
                "--generate-hashes",
                str(pins), "-o", str(self.work / "pylock.all.toml")]
        rc, text = _stream_uv(self.opts.runner, argv, self.opts.echo)
        if rc != 0:
            raise LockError(f"lock {self.stack.name}: uv could not list the files of the resolved set:\n{_tail(text)}")
        return tomllib.loads((self.work / "pylock.all.toml").read_text())


def _outside_facts(stack: Stack, inp: Inputs, opts: LockOptions, previous: LockFile | None,
                   local: dict) -> tuple[str | None, dict[str, Any] | None, dict[str, str] | None]:
    """[3/3] The base digest, the router wheel's sha256 and the patch hashes. Those of the previous
    lock stand where its inputs (base image, router URL, patch files by commit) are unchanged and
    this is no --upgrade: given by hand, else kept, else asked."""
    echo = opts.echo
    kept = previous.tool if previous and previous.tool.get("inputs") == inp.hash and not opts.upgrade else {}
    base_digest = (opts.base_digest or stack.base.digest or (kept.get("base") or {}).get("digest")
                   or base_image_digest(stack.base.image, echo))
    router = None
    if inp.router:
        router = {"url": inp.router, "sha256": opts.router_sha256 or (kept.get("router") or {}).get("sha256")
                  or url_sha256(inp.router, echo)}
    patches = patch_hashes(stack, local, echo)
    recorded = {f: sha for f, sha in (kept.get("patches") or {}).items() if isinstance(sha,
                                                                                       str)
                and SHA256_RE.fullmatch(sha)}
    if patches is None and recorded:
        echo("  patches: the previous lock's sha256 kept (the same patch files at the same commit)")
        patches = recorded
    return base_digest, router, patches


def _missing_dates(text: str, n: int = 3) -> str:
    lines = [line for line in text.splitlines() if "is missing an upload date" in line]
    return "\n".join(f"    {line}" for line in lines[:n]) + (f"\n    ... ({len(lines) - n} "
                                                             "more)" if len(lines) > n else "")


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
        elif line.startswith(("warning:", "error:", "Resolved")) and "is missing an upload date" not in line:
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
               base_digest: str | None, router: dict[str, Any] | None, patches: dict[str, str] | None = None,
               cutoff: str = "", uv_file: dict[str, str] | None = None) -> dict[str, Any]:
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
        f = {"name": chosen["name"], "url": chosen["url"], "size": chosen["size"],
             "hashes": {"sha256": chosen["sha256"]}}
        entry[key] = f if key == "sdist" else [f]
        packages.append(entry)
    if missing:
        raise LockError(f"lock {stack.name}: no file for {inp.platform} / CPython {inp.python} with a sha256: "
                        f"{missing}")
    steps = step_slices(inp.by_step, graph, {p["name"] for p in packages})
    tool = {
        "schema": SCHEMA,
        "flavor": stack.name,
        "inputs": inp.hash,
        "python": inp.python,
        "platform": inp.platform,
        "uv": stack.versions.get("uv", ""),
        # No time of locking, only the cutoff (below), which re-locking unchanged inputs reuses: the
        # same bytes again, so the same content-addressed image tag.
        "command": lock_command(stack_ref(stack)),
        "indexes": inp.indexes,
        "prereleases": prereleases,
        # The resolution saw only files uploaded before this: re-locking unchanged inputs reuses it.
        "exclude-newer": cutoff,
        "base": {"image": stack.base.image, "digest": base_digest or ""},
        "router": router or {},
        "sources": inp.sources,
        "patches": patches or {},
        "steps": steps,
        # The venv step's one input (the pinned uv), by URL and sha256 like every package above.
        "uv-wheel": uv_file or {},
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


