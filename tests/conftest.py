"""Shared fixtures: the repository root, and the real services the integration tests use."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BASE_IMAGE = "slimeforge-test/base:bookworm"


def docker_available() -> bool:
    return shutil.which("docker") is not None and subprocess.run(["docker", "info"], capture_output=True).returncode == 0


@pytest.fixture(scope="session")
def docker_engine():
    if not docker_available():
        if os.environ.get("CI"):
            pytest.fail("CI must have a running Docker Engine (.ci/run starts dockerd)")
        pytest.skip("no Docker Engine running")
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
