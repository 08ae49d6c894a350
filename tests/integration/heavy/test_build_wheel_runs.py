"""slimeforge/scripts/build_wheel.py run as the compiled steps run it, with real setuptools and gcc: a
C extension from its sdist and from a source tree, each with its backend called once; a backend's
failure and a bad input, each named; nothing of the step library importable from a setup.py."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from cext_support import make_sdist  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[3] / "slimeforge" / "scripts" / "build_wheel.py"


def build_wheel(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_an_sdist_and_a_tree_each_become_one_wheel_with_setup_py_run_once(tmp_path):
    sdist = make_sdist(tmp_path / "files")
    res = build_wheel("--wheel-dir", str(tmp_path / "wheels"), "--work", str(tmp_path / "src"), "--", str(sdist),
                      cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    (wheel,) = (tmp_path / "wheels").glob("*.whl")
    assert res.stdout.splitlines()[-1] == f"built: {wheel.name}" and wheel.name.startswith("sfcext-0.1.0-cp")
    assert any(n.startswith("sfcext.") and n.endswith(".so") for n in zipfile.ZipFile(wheel).namelist())
    assert "with setuptools.build_meta (no isolation" in res.stdout
    # A tree: built in place; its setup.py runs once (pip wheel ran it twice, metadata first).
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "setup.py").write_text("import pathlib\nwith open(pathlib.Path(__file__).with_name('runs'), 'a') as f:\n"
                                   "    f.write('run\\n')\nfrom setuptools import setup\n"
                                   "setup(name='once', version='1.0', py_modules=['once'])\n")
    (tree / "once.py").write_text("")
    res = build_wheel("--wheel-dir", str(tmp_path / "w2"), str(tree), cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tree / "runs").read_text() == "run\n" and [p.name for p in (tmp_path / "w2").iterdir()] == \
        ["once-1.0-py3-none-any.whl"]


def test_a_failing_backend_and_a_bad_input_are_named(tmp_path):
    tree = tmp_path / "broken"
    tree.mkdir()
    (tree / "setup.py").write_text("raise RuntimeError('setup.py says no')\n")
    res = build_wheel("--wheel-dir", str(tmp_path / "w"), str(tree), cwd=tmp_path)
    assert res.returncode == 1 and "setup.py says no" in res.stderr
    assert f"build_wheel: building {tree} failed (the backend's output is above)" in res.stderr
    res = build_wheel("--wheel-dir", str(tmp_path / "w"), str(tmp_path / "nothing.zip"), cwd=tmp_path)
    assert res.returncode == 2 and "neither a source directory nor an sdist file" in res.stderr
    res = build_wheel("--wheel-dir", str(tmp_path / "w"), "--config-settings", "k=\x1b[31m", str(tree), cwd=tmp_path)
    assert res.returncode == 2 and "expected KEY=VALUE" in res.stderr


def test_the_step_librarys_scripts_are_not_importable_from_a_setup_py(tmp_path):
    # build_wheel.py lies beside venvlock.py and the other scripts: a setup.py's `import venvlock`
    # must not find them (Python puts a script's own directory first on sys.path).
    tree = tmp_path / "probe"
    tree.mkdir()
    (tree / "setup.py").write_text("import importlib.util, sys\n"
                                   "assert importlib.util.find_spec('venvlock') is None, sys.path\n"
                                   "from setuptools import setup\nsetup(name='probe', version='1', py_modules=[])\n")
    res = build_wheel("--wheel-dir", str(tmp_path / "w"), str(tree), cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
