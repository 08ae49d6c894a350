"""Issue 42 item 6: the docs' own Slurm dry run (docs/multinode.md, docs/slurm.md) renders without
an image, with the `<IMAGE>` placeholder as the other dry runs do (tests/doc_commands.py's TABLE runs
both pages' dry runs, checking slurm.sbatch); the launch without an image is still refused."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def doc_command(doc: str) -> list[str]:
    """The doc's own Slurm dry run of the gsm8k recipe, as written there (its comment cut)."""
    (line,) = [line for line in (ROOT / "docs" / doc).read_text().splitlines()
               if line.startswith("invoke run recipes/gsm8k.yaml --slurm") and "--dry-run" in line]
    return shlex.split(line, comments=True)


def invoke(tmp_path: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    # A working directory of its own (runs/ is relative to it), with the repository's tasks and recipes.
    for name in ("tasks", "recipes"):
        if not (tmp_path / name).exists():
            (tmp_path / name).symlink_to(ROOT / name)
    env = {**os.environ, "SLIMEFORGE_STATE_DIR": str(tmp_path / "state"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run([sys.executable, "-m", *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_slurm_launch_without_an_image_is_still_refused(tmp_path):
    res = invoke(tmp_path, [a for a in doc_command("multinode.md") if a != "--dry-run"])
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "image: container mode needs an image" in res.stderr
    assert not (tmp_path / "runs").exists()  # refused before anything is written
