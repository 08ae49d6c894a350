"""The install script is valid bash, shellcheck-clean, with its prerequisites in front (moved from
tests/unit/test_install_render.py: shellcheck on a whole rendered install script takes seconds)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slimeforge.image.builder.install import render_install_script
from slimeforge.image.stack import load_stack

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))
import build_support as bs  # noqa: E402
from build_support import placeholder_patches, render_lock  # noqa: E402


@pytest.mark.parametrize("flavor", ["cu13", str(bs.TEST_STACK)])
def test_install_script_is_valid_bash_and_checks_prerequisites_first(flavor, tmp_path):
    stack = load_stack(flavor)
    text = render_install_script(stack, "/opt/slime it's", patches=placeholder_patches(stack), lock=render_lock(stack))
    path = tmp_path / "install.sh"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    res = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout
    assert text.index("\nsf_prereqs\n") < text.index("\nsf_run_step ")
    if stack.cuda:
        assert "nvcc" in text and f"-ge {stack.driver_min}" not in text and f"driver_min={stack.driver_min}" in text
        assert "want_cuda=13.0" in text and "release $release, the stack needs $want_cuda" in text
