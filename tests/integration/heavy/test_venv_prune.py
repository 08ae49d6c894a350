"""The prune in the real step library: sf_pip_step installs a slice with a keep-arch line (uv, a
wheel directory, no network), prunes in the same step, and its verify (venvlock.py, with the
prune's check) passes on the pruned venv; a re-run prunes the reinstalled files again; a file the
rule does not remove, once missing, fails the step's verify, naming it."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import prune_support as ps  # noqa: E402

LIB = Path(__file__).resolve().parents[3] / "templates" / "steps.sh"


def step(venv: Path, state: Path, slice_: Path, wheels: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", 'source "$1"; shift; "$@"', "sf", str(LIB), "sf_pip_step", "--venv", str(venv),
                           "--step", "sglang", "--lock", str(slice_), "--find-links", str(wheels)],
                          capture_output=True, text=True,
                          env={"PATH": f"{venv}/bin:/usr/bin:/bin", "SF_STATE": str(state), "HOME": str(state)})


def test_the_pip_step_prunes_in_place_and_its_verify_holds_on_the_pruned_venv(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    (venv / "bin" / "uv").symlink_to(shutil.which("uv") or str(Path(sys.executable).parent / "uv"))
    wheel = ps.make_wheel(tmp_path / "wheels")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    slice_ = tmp_path / "sglang.txt"
    slice_.write_text(f"# step sglang: 1 distribution(s)\n{ps.DIST}=={ps.VERSION} --hash=sha256:{sha}  "
                      f"# =={ps.VERSION}\n# prune: keep-arch 9.0\n")
    state = tmp_path / "state"
    # What the venv came with (pip; setuptools below 3.12) is the rest of this test's lock.
    have = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"], capture_output=True,
                          text=True, check=True).stdout
    (state / "lock").mkdir(parents=True)
    (state / "lock" / "base.txt").write_text(have)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())

    res = step(venv, state, slice_, wheel.parent)
    assert res.returncode == 0, res.stderr
    assert "step sglang: pruned flashinfer-cubin 0.6.12: 3 file(s)" in res.stderr
    assert "distribution(s) installed, all as locked" in res.stderr  # the verify after it
    assert "slimeforge: phase sglang prune" in res.stderr
    assert sorted(p for p in ps.FILES if not (site / p).exists()) == sorted(ps.PRUNED)
    assert json.loads((state / "pruned" / "flashinfer-cubin.json").read_text())["removed"] == 3
    # pip's own view of the venv holds: nothing it checks is in the removed files
    check = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout

    # A re-run reinstalls the wheel (every file back, hash-checked), then prunes again.
    res = step(venv, state, slice_, wheel.parent)
    assert res.returncode == 0, res.stderr
    assert "pruned flashinfer-cubin 0.6.12: 3 file(s)" in res.stderr

    # A file of the distribution that the rule does not remove is missing: the step's verify says so.
    (site / "flashinfer_cubin" / "__init__.py").unlink()
    res = subprocess.run(["bash", "-c", 'source "$1"; shift; "$@"', "sf", str(LIB), "sf_lock_verify", str(venv),
                          "later-step"], capture_output=True, text=True,
                         env={"PATH": f"{venv}/bin:/usr/bin:/bin", "SF_STATE": str(state), "HOME": str(state)})
    assert res.returncode == 1
    assert ("step later-step: flashinfer-cubin 0.6.12 (pruned by step sglang): flashinfer_cubin/__init__.py is "
            "missing, and no prune rule removes it") in res.stderr
