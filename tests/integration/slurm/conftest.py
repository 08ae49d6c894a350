"""Fixtures for the Slurm tests: a real Slurm cluster of three nodes (see slurmlab.py)."""

from __future__ import annotations

import os

import pytest
from slurmlab import SlurmLab, can_run_slurm


@pytest.fixture(scope="session")
def slurm_lab():
    """slurmctld and three slurmd in network namespaces, each node with 2 (count-only) GPUs; h3 cannot
    see <workdir>/private (a mount namespace of its own: tests/integration/slurm/slurmlab.py)."""
    why = can_run_slurm()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to run the Slurm lab: {why}")
        pytest.skip(f"cannot run a Slurm lab here: {why}")
    lab = SlurmLab(3)
    lab.private = {"h3": lab.net.workdir / "private"}
    lab.start()
    try:
        yield lab
    finally:
        lab.stop()
