"""templates/steps.sh and templates/sf pass shellcheck (moved from tests/unit/test_step_library.py:
shellcheck on the whole step library takes seconds, more than a unit test should)."""

from __future__ import annotations

import subprocess
from pathlib import Path

LIB = Path(__file__).resolve().parents[3] / "templates" / "steps.sh"


def test_shell_files_pass_shellcheck():
    root = LIB.parent
    res = subprocess.run(["shellcheck", "-x", "-P", "SCRIPTDIR", "steps.sh", "sf"], cwd=root, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout
