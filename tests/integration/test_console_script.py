"""The `slimeforge` command as a user gets it (issue 42): the package built into a wheel and
installed, not editable, into a fresh venv, then run from a directory that holds nothing but a
recipe. Its stacks and templates must come from the installed package (package data), its run and
build directories must appear where it runs, and its help must name it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.local, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
UV = Path(sys.executable).parent / "uv"  # the project's own uv (a dependency, pinned)
# What a checkout holds that a wheel is not built from (and a copy need not carry).
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "runs", "build", "*.egg-info", "__pycache__", ".pytest_cache",
                                    ".ruff_cache",
                                    ".mypy_cache", "tests", "benchmarks", "docs", "reference")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh venv with the package installed from a copy of the checkout (the build writes
    build/ and *.egg-info beside its sources: never into the user's checkout), its bytecode
    compiled at install time as pip does (uv only when asked)."""
    if not UV.exists():
        pytest.fail(f"no uv at {UV}: install the project's dependencies (pip install -e '.[dev]')")
    tmp = tmp_path_factory.mktemp("console")
    src = tmp / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=NOT_SOURCE)
    venv = tmp / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    subprocess.run([str(UV), "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env)
    res = subprocess.run([str(UV), "pip", "install", "-q", "--compile-bytecode", "--python",
                          str(venv / "bin" / "python"), str(src)], env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    shutil.rmtree(src)  # nothing of the checkout may be read from here on
    return venv


def user_env(venv: Path) -> dict[str, str]:
    """A user's shell with the venv's bin on PATH; nothing that points Python at the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")}
    env["PATH"] = f"{venv / 'bin'}:/usr/bin:/bin"
    return env


def slimeforge(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / "slimeforge"), *args], cwd=cwd, env=user_env(venv), capture_output=True,
                          text=True,
                          timeout=120)


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def test_the_installed_package_carries_every_stack_and_template(installed, tmp_path):
    probe = ("import json, slimeforge, slimeforge.paths as p; "
             "print(json.dumps([slimeforge.__file__, str(p.IMAGES), str(p.TEMPLATES), str(p.SCRIPTS)]))")
    out = subprocess.run([str(installed / "bin" / "python"), "-c", probe], cwd=tmp_path, env=user_env(installed),
                         capture_output=True,
                         text=True, check=True).stdout
    package, images, templates, scripts = (Path(x) for x in json.loads(out))
    site = installed.resolve()
    assert all(p.resolve().is_relative_to(site) for p in (package, images, templates, scripts))  # not the checkout's
    # Every file of the checkout's images/ and templates/ (a new kind of file included), byte for byte.
    for ours, theirs in ((ROOT / "images", images), (ROOT / "templates", templates), (ROOT / "slimeforge" / "scripts",
                                                                                      scripts)):
        assert files_under(theirs) == files_under(ours), ours
        assert all((theirs / f).read_bytes() == (ours / f).read_bytes() for f in files_under(ours))
    assert not any((package.parent / d).is_symlink() for d in ("stacks",
                                                               # the files themselves in a wheel, no links
                                                               "templates"))


def test_help_and_list_name_the_command_and_every_task(installed, tmp_path):
    res = slimeforge(installed, tmp_path, "--help")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("Usage: slimeforge ") and "Traceback" not in res.stderr
    res = slimeforge(installed, tmp_path, "--list")
    assert res.returncode == 0, res.stderr
    listed = {line.split()[0] for line in res.stdout.splitlines() if line.startswith("  ") and not line.startswith("  "
                                                                                                                   " ")}
    assert listed >= {"run.start", "run.status", "doctor", "build", "install", "lock", "publish", "cluster.up",
                      "stack.show", "wheels.ls"}
    assert "run.start (run)" in res.stdout  # `slimeforge run` is run.start, as `invoke run` is
    res = slimeforge(installed, tmp_path, "run", "--help")
    assert res.returncode == 0 and "Usage: slimeforge " in res.stdout and "--dry-run" in res.stdout
    # another task, named as typed here
    assert "`slimeforge doctor --list-checks`" in res.stdout and "`invoke " not in res.stdout
    # A usage error names the command that was typed, not `invoke`.
    res = slimeforge(installed, tmp_path, "run")
    assert res.returncode == 2 and "usage: slimeforge run [OPTIONS] RECIPE" in res.stderr, res.stderr


def test_a_dry_run_from_an_empty_directory_writes_there(installed, tmp_path):
    shutil.copy(ROOT / "recipes" / "gsm8k.yaml", tmp_path / "gsm8k.yaml")
    res = slimeforge(installed, tmp_path, "run", "gsm8k.yaml", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    run = tmp_path / "runs" / "gsm8k-3b-smoke"
    assert {"launch.sh", "plan.json", "slime.args"} <= {p.name for p in run.iterdir()}
    assert str(run) in res.stdout or "runs/gsm8k-3b-smoke" in res.stdout
    assert "stack cu13-" in res.stdout  # the stack, read from the package's data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gsm8k.yaml", "runs"]  # nothing else written here


def test_a_build_dry_run_renders_from_the_package_into_build_here(installed, tmp_path):
    res = slimeforge(installed, tmp_path, "build", "--cuda", "cu13", "--dry-run", "--base-image", "sha256:" + "ab" * 32)
    assert res.returncode == 0, res.stdout + res.stderr
    [build] = (tmp_path / "build").iterdir()
    assert build.name.startswith("cu13-") and (build / "Dockerfile").is_file()
    assert (build / "context" / "steps.sh").read_text() == (ROOT / "templates" / "steps.sh").read_text()


def test_a_closed_pipe_ends_the_listing_quietly(installed, tmp_path):
    res = subprocess.run(["bash", "-c",
                          f'{installed / "bin" / "slimeforge"} --list | head -1; exit '
                          '"${PIPESTATUS[0]}"'], cwd=tmp_path,
                         env=user_env(installed), capture_output=True, text=True, timeout=60)
    # 141 when head had gone before the listing was written, 0 when the pipe took it all first.
    assert res.stdout == "Subcommands:\n" and res.stderr == "" and res.returncode in (0, 141), res


def test_an_error_names_the_command_to_run_as_slimeforge(installed, tmp_path):
    res = slimeforge(installed, tmp_path, "publish", "--cuda", "cu13", "--registry", "127.0.0.1:5000/slime",
                     "--dry-run")
    assert res.returncode == 2 and ("run slimeforge build --cuda cu13 "
                                   "first") in res.stderr and "invoke" not in res.stderr, res.stderr
