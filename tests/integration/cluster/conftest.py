"""Fixtures for cluster tests: SSH hosts in network namespaces (see netlab.py) and inventories."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from netlab import NetLab, can_create_namespaces

ROOT = Path(__file__).resolve().parents[3]


def _require_lab() -> None:
    why = can_create_namespaces()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to create network namespaces with sshd: {why}")
        pytest.skip(f"cannot create network namespaces with sshd here: {why}")


@pytest.fixture(scope="session")
def lab():
    """Three hosts, each a network namespace with its own IP address and sshd."""
    _require_lab()
    lab = NetLab(3).start()
    try:
        yield lab
    finally:
        lab.stop()


@pytest.fixture(scope="session")
def ray_image_for_lab(base_image) -> str:
    """The container lab's image in this machine's engine: the test base, Ray at the lock's version,
    the stand-in slime at /root/slime (lab_image.py); built once, then found by its content tag."""
    from lab_image import lab_ray_image

    return lab_ray_image(base_image)


@pytest.fixture(autouse=True)
def _own_state_home(tmp_path, monkeypatch):
    # cluster.up records the head's address for `invoke run --cluster`; keep it out of ~.
    monkeypatch.setenv("SLIMEFORGE_STATE_HOME", str(tmp_path / "state-home"))
