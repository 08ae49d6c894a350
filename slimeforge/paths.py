"""Where slimeforge finds its own data files (stacks, templates, recipes) in a checkout."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "images"
TEMPLATES = ROOT / "templates"
# Python scripts that run on a target (node agent, flag catalog, versions probe): copied or
# shipped as files, so they are found by path, not by import.
SCRIPTS = ROOT / "slimeforge" / "scripts"

# A build directory is named here only: `invoke build` writes build/<flavor>-<build hash, 12>/,
# and doctor and publish find builds of a flavor by this pattern (the newest complete one first).
BUILD_REPORT = "report.json"


def build_dir(root: Path, flavor: str, build_hash: str) -> Path:
    return Path(root) / f"{flavor}-{build_hash[:12]}"


def local_builds(root: Path, flavor: str) -> list[Path]:
    """Complete builds (those with a report.json) of `flavor` under `root`, newest first."""
    reports = [p for p in Path(root).glob(f"{build_dir(root, flavor, '*').name}/{BUILD_REPORT}") if p.is_file()]
    return [p.parent for p in sorted(reports, key=lambda p: p.stat().st_mtime, reverse=True)]
