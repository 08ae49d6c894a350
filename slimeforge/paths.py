"""Every location slimeforge names, once: its own data files (stacks, templates, scripts) in a
checkout, the run and build directories it writes and their file names, and where an image keeps
slimeforge's state, and how a bare-metal install lays out its prefix (Prefix)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent  # a checkout's root (or site-packages, installed)
# The stacks (images/*.yaml, their locks, slime's facts) and the templates ship inside the package:
# in a checkout slimeforge/stacks and slimeforge/templates are links to images/ and templates/
# (resolved, so paths read the same as the checkout's), in a wheel the directories themselves.
IMAGES = (PACKAGE / "stacks").resolve()
TEMPLATES = (PACKAGE / "templates").resolve()
# The step library every image build and bare-metal install runs (bash functions).
STEP_LIBRARY = TEMPLATES / "steps.sh"
# Python scripts that run on a target (node agent, flag catalog, versions probe): copied or
# shipped as files, so they are found by path, not by import.
SCRIPTS = PACKAGE / "scripts"

# Run directories: `invoke run` (and `invoke run --dry-run`) write runs/<exp_id>/, relative to the
# working directory (the user's, for the installed `slimeforge` command), never the package's.
RUNS = Path("runs")

# In an image: the step library, the locks, the flag catalog and the step records.
IMAGE_STATE = "/opt/slimeforge"
STACK_LOCK = "stack.lock.json"  # beside a build's report and in IMAGE_STATE
FLAGS = "flags.json"  # the flag catalog, beside a build's report, in IMAGE_STATE and an install prefix



@dataclass(frozen=True)
class Prefix:
    """A bare-metal install (`invoke install --prefix P`), laid out as an image lays out its root:
    source checkouts at P/<source dir> (P/slime, P/Megatron-LM, where an image has /root/slime),
    the venv at P/venv, slimeforge's records in P/.slimeforge, the lock and the flag catalog at
    P/stack.lock.json and P/flags.json. Named here once (`Prefix.at(P)`): install writes them;
    launch, preflight, the Slurm job and cluster.up read them."""

    root: str
    venv: str
    python: str
    ray: str
    state: str
    lock: str
    flags: str

    @classmethod
    def at(cls, root: str) -> Prefix:
        venv = f"{root}/venv"
        return cls(root, venv, f"{venv}/bin/python", f"{venv}/bin/ray", f"{root}/.slimeforge", f"{root}/{STACK_LOCK}",
                   f"{root}/{FLAGS}")

    def source(self, source_dir: str) -> str:
        return f"{self.root}/{source_dir}"

    def site_packages(self, python: str) -> str:
        return f"{self.venv}/lib/python{python}/site-packages"


# The submission id of a launch: <exp_id>-<local time in this format>-<6 hex>; launch.py and
# launch.sh make it the same way.
SUBMISSION_TIME = "%Y%m%d-%H%M%S"


def run_dir(exp_id: str) -> Path:
    return RUNS / exp_id


# A build directory is named here only: `invoke build` writes build/<flavor>-<build hash, 12>/
# (relative to the working directory, as runs/ is), and doctor and publish find builds of a flavor
# by this pattern (the newest complete one first).
BUILDS = Path("build")
BUILD_REPORT = "report.json"


def user_cache() -> Path:
    """slimeforge's cache of downloads and what is made from them: $SLIMEFORGE_CACHE_DIR, else
    $XDG_CACHE_HOME/slimeforge (absolute paths, as the XDG spec asks), else ~/.cache/slimeforge. Never the repository:
    they are gigabytes, and every checkout shares them. Beside each other there: sources/ (bare copies of pinned
    commits), wheels/ (patches.check's downloads), compiled/ (the compiled-wheel store)."""
    own = os.environ.get("SLIMEFORGE_CACHE_DIR", "")
    if own.startswith("/"):  # slimeforge's alone (the test suite's, a shared disk), not uv's or pip's
        return Path(own)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if xdg.startswith("/") else Path.home() / ".cache") / "slimeforge"


def sources_cache() -> Path:
    """Bare repositories of the pinned commits (sources.bare_copy), by name and commit."""
    return user_cache() / "sources"


def build_dir(root: Path, flavor: str, build_hash: str) -> Path:
    return Path(root) / f"{flavor}-{build_hash[:12]}"


def local_builds(root: Path, flavor: str) -> list[Path]:
    """Complete builds (those with a report.json) of `flavor` under `root`, newest first."""
    reports = [p for p in Path(root).glob(f"{build_dir(root, flavor, '*').name}/{BUILD_REPORT}") if p.is_file()]
    return [p.parent for p in sorted(reports, key=lambda p: p.stat().st_mtime, reverse=True)]
