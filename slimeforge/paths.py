"""Every location slimeforge names, once: its own data files (stacks, templates, scripts) in a
checkout, the run and build directories it writes and their file names, and where an image keeps
slimeforge's state."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "images"
TEMPLATES = ROOT / "templates"
# Python scripts that run on a target (node agent, flag catalog, versions probe): copied or
# shipped as files, so they are found by path, not by import.
SCRIPTS = ROOT / "slimeforge" / "scripts"

# Run directories: `invoke render/run` write runs/<exp_id>/ (relative to the working directory).
RUNS = Path("runs")

# In an image: the step library, the locks, the flag catalog and the step records.
IMAGE_STATE = "/opt/slimeforge"
STACK_LOCK = "stack.lock.json"  # beside a build's report and in IMAGE_STATE
FLAGS = "flags.json"  # the flag catalog, beside a build's report, in IMAGE_STATE and an install prefix

# The submission id of a launch: <exp_id>-<local time in this format>-<6 hex>; launch.py and
# launch.sh make it the same way.
SUBMISSION_TIME = "%Y%m%d-%H%M%S"


def run_dir(exp_id: str) -> Path:
    return RUNS / exp_id


# A build directory is named here only: `invoke build` writes build/<flavor>-<build hash, 12>/,
# and doctor and publish find builds of a flavor by this pattern (the newest complete one first).
BUILD_REPORT = "report.json"


def build_dir(root: Path, flavor: str, build_hash: str) -> Path:
    return Path(root) / f"{flavor}-{build_hash[:12]}"


def local_builds(root: Path, flavor: str) -> list[Path]:
    """Complete builds (those with a report.json) of `flavor` under `root`, newest first."""
    reports = [p for p in Path(root).glob(f"{build_dir(root, flavor, '*').name}/{BUILD_REPORT}") if p.is_file()]
    return [p.parent for p in sorted(reports, key=lambda p: p.stat().st_mtime, reverse=True)]
