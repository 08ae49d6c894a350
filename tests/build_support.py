"""Fixture git repositories for the small test stack (tests/stacks/test.yaml).

Commits are made with fixed names and dates, so their ids are the same on every machine and the
test stack can pin them. `slime` holds a real argparse `train.py` and the patches under
docker/patch/test/ (exactly where slime keeps its own); `libdemo` is the source they patch.
Commits of slime: S1 (first), S2 (only slime's package changes), S3 (libdemo.patch broken), and
`fresh` (a new id every time: only slime changes).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

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

TRAIN_PY = '''"""A stand-in for slime's train.py: a real argparse parser, so --help lists real flags."""
import argparse


def parse_args():
    p = argparse.ArgumentParser(description="test slime")
    p.add_argument("--hf-checkpoint")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--num-rollout", type=int)
    p.add_argument("--rollout-batch-size", type=int)
    p.add_argument("--colocate", action="store_true")
    p.add_argument("--train-env-vars")
    return p.parse_args()


if __name__ == "__main__":
    print(parse_args())
'''

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
SLIME_S1 = "6932c040dfd197c75855c9d7e961bf2fd1d18c9d"
SLIME_S2 = "30395ca17014c91434737007a6ad91700914035a"
SLIME_S3 = "ebef37151e1e11be9a44d9643737879f91845843"


def _git(repo: Path, *args: str, date: str | None = None) -> str:
    env = {**os.environ, **GIT_ENV}
    if date:
        env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    return subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True, text=True).stdout.strip()


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
    lib_c = _commit(lib, {"pyproject.toml": PYPROJECT.format(name="libdemo", version="0.1.0"), "libdemo/__init__.py": LIBDEMO_INIT},
                    "libdemo 0.1.0", "2026-01-01T00:00:00Z")
    s1 = _commit(slime, {
        "pyproject.toml": PYPROJECT.format(name="slime", version="0.0.1"),
        "slime/__init__.py": '__version__ = "0.0.1"\n',
        "train.py": TRAIN_PY,
        "docker/patch/test/libdemo.patch": LIBDEMO_PATCH,
        "docker/patch/test/six.patch": SIX_PATCH,
    }, "slime 0.0.1", "2026-01-02T00:00:00Z")
    s2 = _commit(slime, {"slime/__init__.py": '__version__ = "0.0.2"\n'}, "slime 0.0.2", "2026-01-03T00:00:00Z")
    s3 = _commit(slime, {"docker/patch/test/libdemo.patch": BROKEN_LIBDEMO_PATCH}, "break libdemo.patch", "2026-01-04T00:00:00Z")
    # A commit no earlier test session built (BuildKit's cache outlives the images): on a branch from
    # S1, only slime's own package changes.
    _git(slime, "checkout", "-q", "-b", "fresh", s1)
    fresh = _commit(slime, {"slime/fresh.py": f"NONCE = {time.time_ns()}\n"}, "fresh slime commit", "2026-01-05T00:00:00Z")
    _git(slime, "checkout", "-q", "main")
    got = (lib_c, s1, s2, s3)
    want = (LIBDEMO_COMMIT, SLIME_S1, SLIME_S2, SLIME_S3)
    assert got == want, f"fixture commits {got} differ from the ids tests/stacks/test.yaml pins {want}"
    return {"libdemo": lib, "slime": slime, "libdemo_commit": lib_c, "s1": s1, "s2": s2, "s3": s3, "fresh": fresh}


def derived_stack(path: Path, slime_commit: str, lock: bool = True, **extra: str) -> Path:
    """A stack file that extends the test stack and pins slime at another commit, locked beside it
    (locks/pylock.sftest.toml, resolved for real: the commits are part of what a lock records)."""
    lines = [f"extends: {os.path.relpath(TEST_STACK, path.parent)}", "sources:", "  slime:", f"    commit: '{slime_commit}'"]
    for key, value in extra.items():
        lines.append(f"{key}: {value}")
    path.write_text("\n".join(lines) + "\n")
    if lock:
        from slimeforge.lock import LockOptions, resolve

        resolve(LockOptions(stack=str(path), echo=lambda _: None))
    return path


TEST_LOCK = TEST_STACK.parent / "locks" / "pylock.sftest.toml"


def tampered_lock(directory: Path, package: str):
    """The test stack's lock with one package's sha256 changed (a replaced file on the index, or a
    tampered lock): installing that package must fail, naming it and its step."""
    from slimeforge.lock import read_lock

    good = read_lock(TEST_LOCK)
    path = directory / "locks" / TEST_LOCK.name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(TEST_LOCK.read_text().replace(good.packages[package].sha256, "0" * 64))
    return read_lock(path)
