"""Shared fixtures: the repository root, and the real services the integration tests use."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from helpers import absent

ROOT = Path(__file__).resolve().parent.parent
BASE_IMAGE = "slimeforge-test/base:bookworm"

# Every integration test names its tier, so `-m "not slurm"` and the like select exactly; tests in a
# directory of one tier get its marker here (the labs' own directories), every other file says its own.
TIERS = {"docker", "ray", "ssh", "slurm", "network", "local", "real"}
DIRECTORY_TIERS = {"integration/slurm": "slurm", "integration/cluster/test_cluster_node_agent.py": "local"}


def pytest_collection_modifyitems(config, items):
    untiered = []
    for item in items:
        rel = Path(str(item.fspath)).relative_to(ROOT / "tests").as_posix()
        for prefix, tier in DIRECTORY_TIERS.items():
            if rel == prefix or rel.startswith(prefix + "/"):
                item.add_marker(tier)
        if rel.startswith(("integration/", "real/")) and not {m.name for m in item.iter_markers()} & TIERS:
            untiered.append(item.nodeid)
    if untiered:
        raise pytest.UsageError("integration tests without a tier marker (one of " + ", ".join(sorted(TIERS)) + "):\n  "
                                + "\n  ".join(untiered))


ENV_BEFORE = pytest.StashKey[dict[str, str]]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[ENV_BEFORE] = dict(os.environ)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """No test leaks environment variables: what a test, or a fixture it set up, changed in
    os.environ and did not restore by its teardown is an error of that test (use monkeypatch or a
    scoped context). The next test starts from the environment this one found."""
    result = yield
    before = item.stash.get(ENV_BEFORE, None)
    if before is not None and dict(os.environ) != before:
        after = dict(os.environ)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        os.environ.clear()
        os.environ.update(before)
        raise AssertionError(f"{item.nodeid} left os.environ changed: {', '.join(changed)} (use monkeypatch or a scoped context)")
    return result


def docker_available() -> bool:
    return shutil.which("docker") is not None and subprocess.run(["docker", "info"], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def docker_engine():
    if not docker_available():
        absent("no Docker Engine running (.ci/run starts dockerd)")
    return "docker"


@pytest.fixture(scope="session")
def base_image(docker_engine) -> str:
    """A Debian bookworm base made with debootstrap (nothing can be pulled from Docker Hub here)."""
    have = subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode == 0
    if not have:
        root = Path(tempfile.mkdtemp(prefix="slimeforge-rootfs-"))
        try:
            subprocess.run(
                ["debootstrap", "--variant=minbase", "--include=python3,python3-venv,python3-pip,ca-certificates,git,patch",
                 "bookworm", str(root), "http://deb.debian.org/debian"],
                check=True, capture_output=True,
            )
            tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
            subprocess.run(["docker", "import", "-", BASE_IMAGE], stdin=tar.stdout, check=True, capture_output=True)
            tar.wait()
        finally:
            subprocess.run(["rm", "-rf", str(root)], check=False)
    return BASE_IMAGE
