"""Fixture git repositories for the small test stack (tests/stacks/test.yaml).

Commits are made with fixed names and dates, so their ids are the same on every machine and the
test stack can pin them. `slime` holds a stand-in of slime's argument parsing (tests/flag_standin.py:
three parsers, as slime's) and the patches under
docker/patch/test/ (exactly where slime keeps its own); `libdemo` is the source they patch.
Commits of slime: S1 (first), S2 (only slime's package changes), S3 (libdemo.patch broken), and
`fresh` (a new id every time: only slime changes).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import flag_standin

from slimeforge.image.lock import lockfile, lockinputs
from slimeforge.image.patches import PatchContent

ROOT = Path(__file__).resolve().parent.parent
TEST_STACK = ROOT / "tests" / "stacks" / "test.yaml"

GIT_ENV = {
    "GIT_AUTHOR_NAME": "slimeforge test", "GIT_AUTHOR_EMAIL": "test@slimeforge.invalid",
    "GIT_COMMITTER_NAME": "slimeforge test", "GIT_COMMITTER_EMAIL": "test@slimeforge.invalid",
    "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
}

PYPROJECT = """[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "{version}"

[tool.setuptools]
packages = ["{name}"]
"""

LIBDEMO_INIT = 'GREETING = "hello"\n'

LIBDEMO_PATCH = """diff --git a/libdemo/__init__.py b/libdemo/__init__.py
--- a/libdemo/__init__.py
+++ b/libdemo/__init__.py
@@ -1 +1,2 @@
 GREETING = "hello"
+PATCHED = True
"""

# Applied to six's wheel in site-packages with -p2, like slime's SGLang patches (a/python/...).
SIX_PATCH = """diff --git a/python/six.py b/python/six.py
--- a/python/six.py
+++ b/python/six.py
@@ -1,3 +1,4 @@
 # Copyright (c) 2010-2024 Benjamin Peterson
+# patched by slimeforge's test stack
 #
 # Permission is hereby granted, free of charge, to any person obtaining a copy
"""

BROKEN_LIBDEMO_PATCH = LIBDEMO_PATCH.replace(' GREETING = "hello"', ' GREETING = "goodbye"')

# The commit ids these contents produce (asserted by make_repos).
LIBDEMO_COMMIT = "0b063434083b635854f024822284ffa214c25ec6"
SLIME_S1 = "c1af8188fb229f9ec7f2bb5da6b7d912981b1bbd"
SLIME_S2 = "8968eaf8518ed33df2fea7a60fc9b637e85dd080"
SLIME_S3 = "d7f1dd89486945953746e7e91f980986fd096b97"


def _git(repo: Path, *args: str, date: str | None = None) -> str:
    env = {**os.environ, **GIT_ENV}
    if date:
        env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    return subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def _commit(repo: Path, files: dict[str, str], message: str, date: str) -> str:
    for name, text in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message, date=date)
    return _git(repo, "rev-parse", "HEAD")


def make_repos(root: Path) -> dict[str, object]:
    """Create libdemo and slime under `root`; returns paths and commit ids."""
    lib, slime = root / "libdemo", root / "slime"
    for repo in (lib, slime):
        repo.mkdir(parents=True)
        _git(repo, "init", "-q", "-b", "main")
    lib_c = _commit(lib, {"pyproject.toml": PYPROJECT.format(name="libdemo", version="0.1.0"),
                          "libdemo/__init__.py": LIBDEMO_INIT},
                    "libdemo 0.1.0", "2026-01-01T00:00:00Z")
    s1 = _commit(slime, {
        # slime's argument parsing, structured as slime's (three parsers, SGLang's without help).
        **flag_standin.slime_files(inline_megatron=True),
        "pyproject.toml": PYPROJECT.format(name="slime", version="0.0.1"),
        "slime/__init__.py": '__version__ = "0.0.1"\n',
        "docker/patch/test/libdemo.patch": LIBDEMO_PATCH,
        "docker/patch/test/six.patch": SIX_PATCH,
    }, "slime 0.0.1", "2026-01-02T00:00:00Z")
    s2 = _commit(slime, {"slime/__init__.py": '__version__ = "0.0.2"\n'}, "slime 0.0.2", "2026-01-03T00:00:00Z")
    s3 = _commit(slime, {"docker/patch/test/libdemo.patch": BROKEN_LIBDEMO_PATCH}, "break libdemo.patch",
                 "2026-01-04T00:00:00Z")
    # A commit no earlier test session built (BuildKit's cache outlives the images): on a branch from
    # S1, only slime's own package changes.
    _git(slime, "checkout", "-q", "-b", "fresh", s1)
    fresh = _commit(slime, {"slime/fresh.py": f"NONCE = {time.time_ns()}\n"}, "fresh slime commit",
                    "2026-01-05T00:00:00Z")
    _git(slime, "checkout", "-q", "main")
    got = (lib_c, s1, s2, s3)
    want = (LIBDEMO_COMMIT, SLIME_S1, SLIME_S2, SLIME_S3)
    assert got == want, f"fixture commits {got} differ from the ids tests/stacks/test.yaml pins {want}"
    return {"libdemo": lib, "slime": slime, "libdemo_commit": lib_c, "s1": s1, "s2": s2, "s3": s3, "fresh": fresh}


def derived_stack(path: Path, slime_commit: str, lock: bool = True, **extra: str) -> Path:
    """A stack file that extends the test stack and pins slime at another commit, locked beside it
    (locks/pylock.sftest.toml, resolved for real: the commits are part of what a lock records)."""
    lines = [f"extends: {os.path.relpath(TEST_STACK, path.parent)}", "sources:", "  slime:",
             f"    commit: '{slime_commit}'"]
    for key, value in extra.items():
        lines.append(f"{key}: {value}")
    path.write_text("\n".join(lines) + "\n")
    if lock:
        from slimeforge.image.lock.uvlock import LockOptions, resolve

        resolve(LockOptions(stack=str(path), echo=lambda _: None))
    return path


TEST_LOCK = TEST_STACK.parent / "locks" / "pylock.sftest.toml"


def tampered_lock(directory: Path, package: str):
    """The test stack's lock with one package's sha256 changed (a replaced file on the index, or a
    tampered lock): installing that package must fail, naming it and its step."""
    from slimeforge.image.lock.lockfile import read_lock

    good = read_lock(TEST_LOCK)
    path = directory / "locks" / TEST_LOCK.name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(TEST_LOCK.read_text().replace(good.packages[package].sha256, "0" * 64))
    return read_lock(path)


# --- rendering the real stacks without their network-only inputs ------------------------------

def placeholder_patches(stack):
    # The real patch files live in slime's tree (no network here); the drift guard is about steps.
    return [PatchContent(p.file, p.target, p.method, p.strip,
                         f"placeholder {p.file}\n".encode()) for p in stack.used_patches()]


def render_lock(stack):
    """The committed lock where there is one, else (cu129: its index is unreachable here) one with
    an empty slice per step; the router wheel's sha256, which cannot be fetched here, is set (and, for
    that made-up lock, the uv wheel's)."""
    try:
        lock = lockfile.load_lock(stack.name if stack.file.parent.name == "images" else str(stack.file), stack)
    except lockfile.LockError:
        lock = lockfile.LockFile(Path("pylock.none.toml"), {},
                                 {"steps": {n: [] for n in lockinputs.inputs(stack).by_step}}, "")
    lock.tool.setdefault("router", {})["sha256"] = "0" * 64
    lock.tool.setdefault("uv", stack.versions["uv"])
    lock.tool.setdefault("uv-wheel", {"url": f"https://files.example/uv-{stack.versions['uv']}-py3-none-any.whl",
                                      "sha256": "0" * 64})
    lock.tool["patches"] = {}  # the placeholder patches below are not the locked ones
    return lock


def remove_tags(*prefixes: str) -> None:
    """Remove the image tags (repository:tag) that start with one of `prefixes`: only what a test
    or benchmark made; an image shared with other tags stays for them."""
    refs = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True,
                          text=True).stdout.split()
    mine = [r for r in refs if r.startswith(prefixes)]
    if mine:
        subprocess.run(["docker", "rmi", *mine], capture_output=True)
