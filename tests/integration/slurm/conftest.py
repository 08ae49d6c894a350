"""Fixtures for the Slurm tests: a real Slurm cluster of three nodes (see slurmlab.py)."""

from __future__ import annotations

import os

import pytest
from launch_support import VENV_BIN
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


@pytest.fixture
def env(slurm_lab: SlurmLab, tmp_path, monkeypatch):
    """This test's Slurm client environment: the lab's slurm.conf, the fake nvidia-smi (2 x H200)
    and this venv first on PATH (sbatch passes the environment on to the job)."""
    for key, value in slurm_lab.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", f"{slurm_lab.net.workdir / 'bin'}:{VENV_BIN}:/usr/bin:/bin:/usr/sbin:/sbin")
    monkeypatch.setenv("SLIMEFORGE_PYTHON", str(VENV_BIN / "python"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # Run directories on the "shared filesystem" (the lab's), short for Ray's socket paths.
    work = slurm_lab.net.workdir / tmp_path.name[-20:]
    work.mkdir()
    return work
