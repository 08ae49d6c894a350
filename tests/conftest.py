"""Shared fixtures: the repository root, and the real services the integration tests use."""

from __future__ import annotations

import fcntl
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
# tests/integration/heavy holds what needs no service but real tools and seconds each (compiles, venvs,
# whole doc pages, shellcheck, bash completion): out of the unit tier, which stays fast.
TIERS = {"docker", "ray", "ssh", "slurm", "network", "local", "heavy", "real"}
DIRECTORY_TIERS = {"integration/slurm": "slurm", "integration/cluster/test_cluster_node_agent.py": "local",
                   "integration/heavy": "heavy"}

# On parallel workers (pytest-xdist, `--dist loadfile`, as CI runs the integration tiers) the tests of
# one module run on one worker, in order: its module-scoped lab, cluster or image is made once. Modules
# named here share a scope as well, so they run on one worker one after the other: the two container
# labs pull the same image through one registry store (lab_image.REGISTRY_STORE) and each runs a
# Docker daemon per host, too much for this machine's two cores at once; the three run-cluster modules
# share one lab and cluster (test_run_cluster.SHARED_BY). (Not xdist_group marks:
# pytest-xdist 3.8's --dist loadgroup renames node ids, which pytest 9 no longer reads back.)
WORKER_GROUPS = {
    "tests/integration/cluster/test_run_cluster_container.py": "container-lab",
    "tests/integration/cluster/test_run_cluster_container_mismatch.py": "container-lab",
    "tests/integration/cluster/test_run_cluster.py": "run-cluster-lab",
    "tests/integration/cluster/test_run_gate.py": "run-cluster-lab",
    "tests/integration/cluster/test_run_restart.py": "run-cluster-lab",
}


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent without it
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadfile":
        return None  # xdist's own scheduler for the other modes
    from xdist.scheduler import LoadFileScheduling

    class GroupedFiles(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return WORKER_GROUPS.get(path, path)

    return GroupedFiles(config, log)


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


def pytest_configure(config):
    """The suite never reads or writes the user's slimeforge cache (~/.cache/slimeforge: bare copies
    of sources, downloaded wheels, the compiled store): a cache a real install filled would change
    what a test sees (a fresh clone's unreadable patches become readable). One temp dir for the
    session instead, set before any test runs; the real tier (SLIMEFORGE_REAL=1) keeps the user's."""
    if not os.environ.get("SLIMEFORGE_REAL") and not os.environ.get("SLIMEFORGE_CACHE_DIR"):
        config._slimeforge_cache = tempfile.mkdtemp(prefix="sf-test-cache-")
        os.environ["SLIMEFORGE_CACHE_DIR"] = config._slimeforge_cache


def pytest_unconfigure(config):
    cache = getattr(config, "_slimeforge_cache", None)
    if cache:
        os.environ.pop("SLIMEFORGE_CACHE_DIR", None)
        shutil.rmtree(cache, ignore_errors=True)


# No test leaks environment variables: what a module's tests and fixtures set in os.environ is
# restored by the time its last test is torn down (monkeypatch, or a context scoped to a fixture);
# a change that outlives its module (a session-wide setenv, a test that never restores) is an error
# of that module's last test, naming the variables. The next module starts from what this one found.
_module_env: dict[str, object] = {}
# Set by the libraries themselves, not by a test: pytest for each phase of each test; Ray on its
# first import in the process (ray/_private/client_mode_hook.py: RAY_CLIENT_MODE=0).
OWN_VARIABLES = {"PYTEST_CURRENT_TEST", "RAY_CLIENT_MODE"}


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in OWN_VARIABLES}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if _module_env.get("path") != item.path:
        _module_env.update(path=item.path, env=_environment())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield
    before = _module_env.get("env")
    if (nextitem is None or nextitem.path != item.path) and isinstance(before, dict) and _environment() != before:
        after = _environment()
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        for k in changed:
            if k in before:
                os.environ[k] = before[k]
            else:
                os.environ.pop(k, None)
        raise AssertionError(f"{item.path.name} left os.environ changed after its tests: {', '.join(changed)} "
                             "(set it with monkeypatch, or in a context scoped to the fixture that needs it)")
    return result


def docker_available() -> bool:
    return shutil.which("docker") is not None and subprocess.run(["docker", "info"],
                                                                 capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def docker_engine():
    if not docker_available():
        absent("no Docker Engine running (.ci/run starts dockerd)")
    return "docker"


@pytest.fixture(scope="session")
def base_image(docker_engine) -> str:
    """A Debian bookworm base made with debootstrap (nothing can be pulled from Docker Hub here)."""
    # One maker at a time: CI's parallel workers (pytest-xdist) and other sessions on this machine
    # each ask for it; the second waits for the first's image instead of making its own.
    with open(Path(tempfile.gettempdir()) / f"slimeforge-test-base-{os.getuid()}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _make_base_image()
    return BASE_IMAGE


def _make_base_image() -> None:
    have = subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode == 0
    if not have:
        root = Path(tempfile.mkdtemp(prefix="slimeforge-rootfs-"))
        try:
            subprocess.run(
                ["debootstrap", "--variant=minbase",
                 "--include=python3,python3-venv,python3-pip,ca-certificates,git,patch",
                 "bookworm", str(root), "http://deb.debian.org/debian"],
                check=True, capture_output=True,
            )
            tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
            subprocess.run(["docker", "import", "-", BASE_IMAGE], stdin=tar.stdout, check=True, capture_output=True)
            tar.wait()
        finally:
            subprocess.run(["rm", "-rf", str(root)], check=False)
