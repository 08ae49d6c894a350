"""Checking a lock against its stack, offline: what build and install require before they install
from it, and `invoke lock --check`.

    check_lock(stack, lock) -> list[str]   every problem (stale inputs, unsatisfied pins, steps
                                           without a slice, CUDA majors mixed, ...); empty: good
    checked_lock(stack) -> LockFile        the committed lock, or LockError listing its problems
    check(ref)                             `invoke lock --check`
    summarize(lock) -> dict                sizes, and a warning per missing outside fact
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from packaging.requirements import Requirement
from packaging.version import Version

from ..stack import Stack, load_stack
from .lockfile import (
    SHA256_RE,
    LockError,
    LockFile,
    load_lock,
    lock_command,
    lock_path,
    lock_ref,
    normalize,
    read_lock,
    stack_ref,
)
from .lockinputs import inputs, req_name
from .remedies import remedy


def check_patch_hashes(lock: LockFile, patches: dict[str, str]) -> None:
    """The patch files a build or install read must be those the lock recorded (when it did)."""
    recorded = lock.patch_sha256
    wrong = [f"{f}: sha256 {sha}, the lock says {recorded[f]}"
             for f, sha in sorted(patches.items()) if f in recorded and recorded[f] != sha]
    if wrong:
        raise LockError(f"{lock.path}: patch files differ from the lock:\n" + "\n".join(f"  - {w}" for w in wrong))


def checked_lock(stack: Stack) -> LockFile:
    """The stack's committed lock, refused (with the command that makes it) when missing, stale or
    short of anything the stack needs: build and install install from it alone."""
    ref = stack_ref(stack)
    lock = read_lock(lock_path(stack), stack, ref)
    problems = check_lock(stack, lock, ref)
    if problems:
        raise LockError(f"{lock.path} cannot be installed from ({len(problems)} problem(s)); fix them, e.g. "
                        f"`{lock_command(ref)}`:\n"
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
        problems.append(f"uv: locked with uv {tool.get('uv')}, the stack pins {stack.versions.get('uv')} (run "
                        f"`{relock}`)")
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
                problems.append(f"CUDA mix: {p.name} {p.version} is built for CUDA {major}, the flavor is CUDA "
                                f"{stack.cuda}")
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


@dataclass(frozen=True)
class Missing:
    """An outside fact the lock lacks: what it is, where it goes, what fills it, and what holds until then."""

    key: str  # base_digest | router_sha256 | uv_wheel
    what: str
    field: str  # where in the lock it goes
    ref: str  # the stack, as `invoke lock` takes it
    meanwhile: str
    required: bool  # a real build or install cannot go on without it

    @property
    def remedy(self) -> str:
        return remedy(self.key, self.ref)

    def warning(self, path: Path) -> str:
        return f"{self.what} is missing from {path} ({self.field}): {self.remedy} ({self.meanwhile})"


def missing_facts(stack: Stack | None, lock: LockFile) -> list[Missing]:
    """The outside facts `lock` lacks (without its stack: those its own tables name)."""
    ref = stack_ref(stack) if stack else lock_ref(lock)
    out = []
    router = lock.tool.get("router") or {}
    if (stack.router if stack else router.get("url")) and not router.get("sha256"):
        out.append(Missing("router_sha256", "the router wheel's sha256", "tool.slimeforge.router.sha256", ref,
                           "a real build or install fills it by itself where the wheel can be downloaded", True))
    wheel = lock.tool.get("uv-wheel") or {}
    if (stack.versions.get("uv") if stack else lock.tool.get("uv")) and not (wheel.get("url") and wheel.get("sha256")):
        out.append(Missing("uv_wheel", "the wheel of the stack's uv (its URL and sha256)", "tool.slimeforge.uv-wheel",
                           ref, "a real build or install fills it by itself where the index can be reached", True))
    if not (stack and stack.base.digest) and not (lock.tool.get("base") or {}).get("digest"):
        out.append(Missing("base_digest", "the base image's digest", "tool.slimeforge.base.digest", ref,
                           "until then the base is taken by its tag as found here, and the compiled-wheel keys are "
                           "provisional", False))
    return out


def check(ref: str, echo: Callable[[str], None] = print) -> LockSummary:
    """`invoke lock --check`: offline. Raises LockError listing every problem."""
    stack = load_stack(ref)
    lock = load_lock(ref, stack)
    problems = check_lock(stack, lock, ref)
    if problems:
        raise LockError(f"{lock.path}: {len(problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in problems))
    summary = summarize(lock, stack)
    echo(f"{lock.path}: ok ({summary['packages']} distributions, {summary['bytes'] / 1e9:.2f} GB, "
         f"{len(lock.steps)} steps, base "
         f"{'@' + summary['base_digest'] if summary['base_digest'] else 'NOT pinned by digest'})")
    for warn in summary["warnings"]:
        echo(f"  warning: {warn}")
    return summary


class LockSummary(TypedDict):
    """What `invoke lock` and `lock --check` say of a lock."""

    packages: int
    bytes: int
    sdists: list[str]
    base_digest: str
    prereleases: list[str]
    named_by_stack: int
    warnings: list[str]
    hash: str


def summarize(lock: LockFile, stack: Stack | None = None) -> LockSummary:
    tool = lock.tool
    warnings = [fact.warning(lock.path) for fact in missing_facts(stack, lock)]
    if stack is not None and stack.patches and not tool.get("patches"):
        warnings.append(f"the patch files' sha256 are missing from {lock.path} (tool.slimeforge.patches): "
                        f"{remedy('patch_sha256', stack_ref(stack), stack.patches.from_source)}")
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


