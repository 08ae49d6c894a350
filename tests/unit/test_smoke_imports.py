"""The smoke test's imports in one pass (scripts/smoke_imports.py, steps.sh sf_import_pass) and the
flag catalog made in it: the preload imported once, each module in a child of its own that sees
nothing of the others, failures and killed children reported, the catalog byte for byte what
flag_catalog.py writes, and its import of slime's argument module taken for that module's smoke
import only when it is the same import. Then finalize's pass (--imports-to) reported by the smoke
test (--imports-from) without importing again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import flag_standin as fs
import pytest

from slimeforge.image.steps import TARGET_SCRIPTS

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = TARGET_SCRIPTS["smoke_imports.py"]
LIB = ROOT / "templates" / "steps.sh"


def mods(root: Path) -> Path:
    """Modules for the pass: `pre` (the preload) notes each import of it in pre.log; `clean` fails
    unless `pre` is loaded and no other module of the pass is; `bad` raises; `killed` dies by SIGKILL."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pre.py").write_text("import os\nwith open(os.environ['PRE_LOG'], 'a') as f:\n    f.write('imported\\n')\n")
    (root / "clean.py").write_text("import sys\nassert 'pre' in sys.modules\n"
                                   "assert not {'bad', 'other', 'killed'} & set(sys.modules), sorted(sys.modules)\n")
    (root / "other.py").write_text("print('other says hello')\n")
    (root / "bad.py").write_text("raise RuntimeError('bad module for the test')\n")
    (root / "killed.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    (root / "hangs.py").write_text("import time\ntime.sleep(120)\n")
    return root


def run_pass(tmp_path: Path, *args: str, pythonpath: str) -> tuple[subprocess.CompletedProcess, Path]:
    results = tmp_path / "results"
    results.mkdir(exist_ok=True)
    res = subprocess.run([sys.executable, str(SCRIPT), "--results", str(results), *args], capture_output=True,
                         text=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": pythonpath,
                                         "PRE_LOG": str(tmp_path / "pre.log")})
    return res, results


def test_each_module_in_its_own_child_after_one_preload(tmp_path):
    m = mods(tmp_path / "mods")
    names = ["other", "clean", "bad", "killed", "pre", "clean"]
    res, out = run_pass(tmp_path, "--jobs", "2", "--preload", "pre", *[a for n in names for a in ("--import", n)],
                        pythonpath=str(m))
    assert res.returncode == 0, res.stderr
    rcs = [(out / f"{i}.rc").read_text() for i in range(len(names))]
    assert rcs == ["0\n", "0\n", "1\n", "1\n", "0\n", "0\n"]
    assert "other says hello" in (out / "0.out").read_text()
    assert "RuntimeError: bad module for the test" in (out / "2.out").read_text()
    assert "the process ended with status -9" in (out / "3.out").read_text()
    # The preload ran once for the whole pass, not once per module.
    assert (tmp_path / "pre.log").read_text() == "imported\n"


def test_an_import_that_hangs_is_killed_after_its_time_and_fails(tmp_path):
    m = mods(tmp_path / "mods")
    res, out = run_pass(tmp_path, "--jobs", "2", "--timeout", "1.5", "--import", "hangs", "--import", "other",
                        pythonpath=str(m))
    assert res.returncode == 0, res.stderr
    assert (out / "0.rc").read_text() == "1\n" and (out / "1.rc").read_text() == "0\n"
    assert "not done after 1.5 s: killed" in (out / "0.out").read_text()
    assert "hangs " in (out / "seconds").read_text()


def test_a_failing_preload_fails_every_import_naming_it(tmp_path):
    m = mods(tmp_path / "mods")
    res, out = run_pass(tmp_path, "--preload", "bad", "--import", "other", "--import", "clean", pythonpath=str(m))
    assert res.returncode == 0, res.stderr
    for i in (0, 1):
        assert (out / f"{i}.rc").read_text() == "1\n"
        assert "the preload `import bad` failed" in (out / f"{i}.out").read_text()


@pytest.mark.parametrize("args,said", [(["--import", "os; import x"], "is not a module name"),
                                       (["--import=-c"], "is not a module name"),
                                       (["--jobs", "0"], "is not a number of jobs"),
                                       (["--timeout", "nan"], "is not a timeout"),
                                       (["--catalog-out", "x.json"], "--catalog-out needs --slime")])
def test_bad_arguments_exit_2_before_anything_runs(tmp_path, args, said):
    res, out = run_pass(tmp_path, *args, pythonpath="")
    assert res.returncode == 2 and said in res.stderr
    assert list(out.iterdir()) == []


def standin(root: Path) -> tuple[Path, Path]:
    return (fs.write(root / "slime", fs.slime_files(inline_megatron=False)),
            fs.write(root / "Megatron-LM", fs.MEGATRON_FILES))


def catalog_args(slime: Path, megatron: Path, out: Path) -> list[str]:
    return ["--catalog-out", str(out), "--slime", str(slime), "--megatron", str(megatron),
            "--slime-commit", "1" * 40, "--megatron-commit", "2" * 40]


def test_the_catalog_of_the_pass_is_flag_catalogs_byte_for_byte_and_its_import_counts(tmp_path):
    slime, megatron = standin(tmp_path / "co")
    m = mods(tmp_path / "mods")
    # The venv finds slime and Megatron where the checkouts are (editable installs): one import for both.
    path = os.pathsep.join(map(str, (m, slime, megatron)))
    res, out = run_pass(tmp_path, "--preload", "pre", "--import", "other", "--import", "slime.utils.arguments",
                        *catalog_args(slime, megatron, tmp_path / "flags.json"), pythonpath=path)
    assert res.returncode == 0, res.stderr
    assert (out / "catalog.rc").read_text() == "0\n" and (out / "catalog.same").read_text() == "1\n"
    assert (out / "1.rc").read_text() == "0\n"
    assert (out / "1.out").read_text() == "imported by the flag catalog's child\n"
    ref = tmp_path / "ref.json"
    made = subprocess.run([sys.executable, str(TARGET_SCRIPTS["flag_catalog.py"]), "--slime", str(slime),
                           "--megatron", str(megatron), "--slime-commit", "1" * 40, "--megatron-commit", "2" * 40,
                           "--out", str(ref)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "flags.json").read_bytes() == ref.read_bytes()
    assert json.loads(ref.read_text())["slime_commit"] == "1" * 40
    assert not list(tmp_path.glob("flags.json.tmp*"))


def test_a_catalog_import_of_other_code_leaves_the_smoke_import_its_own_child(tmp_path):
    slime, megatron = standin(tmp_path / "co")
    # The venv would import another copy of slime than the checkout the catalog reads.
    other = tmp_path / "elsewhere"
    shutil.copytree(slime, other / "slime-copy")
    path = os.pathsep.join(map(str, (other / "slime-copy", megatron)))
    res, out = run_pass(tmp_path, "--import", "slime.utils.arguments",
                        *catalog_args(slime, megatron, tmp_path / "flags.json"), pythonpath=path)
    assert res.returncode == 0, res.stderr
    assert (out / "catalog.rc").read_text() == "0\n" and (out / "catalog.same").read_text() == "0\n"
    assert (out / "0.rc").read_text() == "0\n"
    assert "flag catalog" not in (out / "0.out").read_text()  # imported by a child of its own


def test_a_catalog_that_cannot_be_made_fails_alone_and_writes_nothing(tmp_path):
    slime, megatron = standin(tmp_path / "co")
    (slime / "slime" / "utils" / "arguments.py").write_text("import no_such_module_for_the_test\n")
    m = mods(tmp_path / "mods")
    path = os.pathsep.join(map(str, (m, slime, megatron)))
    res, out = run_pass(tmp_path, "--import", "other", "--import", "slime.utils.arguments",
                        *catalog_args(slime, megatron, tmp_path / "flags.json"), pythonpath=path)
    assert res.returncode == 0, res.stderr
    assert (out / "catalog.rc").read_text() == "1\n"
    assert "flag catalog: slime.utils.arguments:parse_args needs a module this Python lacks" in (
        out / "catalog.out").read_text()
    assert not (tmp_path / "flags.json").exists() and not list(tmp_path.glob("flags.json.tmp*"))
    # The module's smoke import is its own, and fails on its own; the others pass.
    assert (out / "0.rc").read_text() == "0\n" and (out / "1.rc").read_text() == "1\n"
    assert "No module named 'no_such_module_for_the_test'" in (out / "1.out").read_text()


# --- the step library: finalize's pass, reported by the smoke test -----------------------------


def lib(state: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", 'source "$1"; shift; "$@"', "sf", str(LIB), *args], capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", "SF_STATE": str(state), "HOME": str(state),
                                          "PRE_LOG": str(state / "pre.log")})


def venv_of(tmp_path: Path, site: str) -> Path:
    """A stand-in venv whose python finds `site` (its site-packages): sf_import_pass clears the
    caller's PYTHONPATH, so its python is a wrapper that sets it. The scripts go to SF_STATE."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/bash\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    (venv / "bin" / "python").chmod(0o755)
    for name in ("smoke_imports.py", "flag_catalog.py", "kernel_check.py"):
        (tmp_path / name).write_bytes(TARGET_SCRIPTS[name].read_bytes())
    return venv


def test_the_smoke_test_reports_finalizes_pass_and_imports_nothing_again(tmp_path):
    m = mods(tmp_path / "mods")
    venv = venv_of(tmp_path, str(m))
    imports = ["--import", "other", "--import", "bad", "--import", "gpu_only", "--needs-gpu", "gpu_only",
               "--preload", "pre"]
    done = lib(tmp_path, "sf_import_pass", "--venv", str(venv), "--results", str(tmp_path / "pass"), *imports)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "pass" / "plan").read_text() == "import other\nimport bad\nskip gpu_only\n"
    assert (tmp_path / "pre.log").read_text() == "imported\n"
    res = lib(tmp_path, "sf_smoke", "--venv", str(venv), *imports, "--imports-from", str(tmp_path / "pass"))
    assert res.returncode != 0 and "smoke test failed" in res.stderr
    assert "smoke: imports from finalize's pass in this run" in res.stderr
    said = [line for line in res.stderr.splitlines() if "smoke: " in line and " import " in line]
    assert said[0].endswith("smoke: import other ok")
    assert "smoke: import bad failed:" in said[1] and "RuntimeError: bad module for the test" in res.stderr
    assert said[2].endswith("SKIPPED import gpu_only: it needs a GPU and none is present")
    assert (tmp_path / "pre.log").read_text() == "imported\n"  # nothing imported again
    assert not (tmp_path / "pass").exists()  # the pass's results are removed once reported


@pytest.mark.parametrize("spoil", ["no-done", "other-modules"])
def test_a_pass_that_did_not_finish_or_of_other_modules_is_not_taken(tmp_path, spoil):
    m = mods(tmp_path / "mods")
    venv = venv_of(tmp_path, str(m))
    done = lib(tmp_path, "sf_import_pass", "--venv", str(venv), "--results", str(tmp_path / "pass"),
               "--import", "other", "--preload", "pre")
    assert done.returncode == 0, done.stderr
    wanted = ["--import", "other"]
    if spoil == "no-done":
        (tmp_path / "pass" / "done").unlink()
    else:
        wanted += ["--import", "clean"]
    res = lib(tmp_path, "sf_smoke", "--venv", str(venv), *wanted, "--preload", "pre",
              "--imports-from", str(tmp_path / "pass"))
    assert res.returncode == 0, res.stderr
    assert "did not finish or imported other modules: importing here" in res.stderr
    assert (tmp_path / "pre.log").read_text() == "imported\nimported\n"  # the smoke test's own pass


def test_finalize_makes_the_catalog_in_the_pass_and_fails_when_it_cannot(tmp_path):
    slime, megatron = standin(tmp_path / "co")
    m = mods(tmp_path / "mods")
    venv = venv_of(tmp_path, os.pathsep.join(map(str, (m, slime, megatron))))
    for repo in (slime, megatron):
        subprocess.run(["git", "-C", str(repo), "init", "-q"], check=True)
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "s"],
                       check=True)
    (tmp_path / "venvlock.py").write_bytes((ROOT / "slimeforge" / "scripts" / "venvlock.py").read_bytes())
    flags = tmp_path / "flags.json"
    pass_args = ["--imports-to", str(tmp_path / "pass"), "--import", "other", "--import", "slime.utils.arguments",
                 "--preload", "pre"]
    # finalize's lock steps are not under test here: only its catalog phase (the function as defined).
    body = 'source "$1"; shift; sf_lock_verify() { :; }; "$@"'
    env = {"PATH": "/usr/bin:/bin", "SF_STATE": str(tmp_path), "HOME": str(tmp_path),
           "PRE_LOG": str(tmp_path / "p.log")}
    (venv / "bin" / "uv").write_text("#!/bin/sh\nexit 0\n")
    (venv / "bin" / "uv").chmod(0o755)
    (tmp_path / "in.json").write_text("{}\n")
    res = subprocess.run(["bash", "-c", body, "sf", str(LIB), "sf_finalize", str(venv), str(tmp_path / "in.json"),
                          str(tmp_path / "lock.json"), str(flags), "--slime", str(slime), "--megatron", str(megatron),
                          *pass_args], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    doc = json.loads(flags.read_text())
    assert doc["slime_commit"] and doc["megatron_commit"] and doc["version"] == 2
    assert (tmp_path / "pass" / "1.out").read_text() == "imported by the flag catalog's child\n"
    assert "slimeforge: phase finalize imports " in res.stderr
    # A catalog that cannot be made whole fails finalize, with the catalog's own error.
    flags.unlink()
    (slime / "slime" / "utils" / "arguments.py").write_text("import no_such_module_for_the_test\n")
    bad = subprocess.run(["bash", "-c", body, "sf", str(LIB), "sf_finalize", str(venv), str(tmp_path / "in.json"),
                          str(tmp_path / "lock.json"), str(flags), "--slime", str(slime), "--megatron", str(megatron),
                          *pass_args], capture_output=True, text=True, env=env)
    assert bad.returncode != 0 and "could not read slime's parsers" in bad.stderr
    assert "needs a module this Python lacks" in bad.stderr and not flags.exists()



def test_warm_compiles_what_the_pass_imports_and_runs_nothing(tmp_path):
    """--warm: each module reached from the roots at module level (the entry module's functions
    too, nothing under `if TYPE_CHECKING:`) gets the .pyc an import would write, from the checkouts
    (--slime) or the venv; nothing is executed."""
    import importlib.util

    slime = tmp_path / "slime"
    pkg = slime / "slime" / "utils"
    pkg.mkdir(parents=True)
    marker = tmp_path / "ran"
    run = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    (slime / "slime" / "__init__.py").write_text(run)
    (pkg / "__init__.py").write_text(run)
    (pkg / "arguments.py").write_text(run + "from typing import TYPE_CHECKING\nimport near\n"
                                      "if TYPE_CHECKING:\n    import typed_only\n"
                                      "def parse_args():\n    import called\n")
    for name, body in {"near": "from ns.sub import deep\ndef later():\n    import lazy\n", "called": "",
                       "typed_only": "", "lazy": "", "root": "import near\n"}.items():
        (slime / f"{name}.py").write_text(run + body)
    (slime / "ns" / "sub").mkdir(parents=True)  # a namespace package (no __init__.py)
    (slime / "ns" / "sub" / "deep.py").write_text(run)
    res = subprocess.run([sys.executable, "-I", str(SCRIPT), "--warm", "--import", "root", "--slime", str(slime)],
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "bytecode warm-up: " in res.stderr
    compiled = {p.relative_to(slime).as_posix() for p in slime.rglob("*.py")
                if Path(importlib.util.cache_from_source(str(p))).is_file()}
    assert compiled == {"slime/__init__.py", "slime/utils/__init__.py", "slime/utils/arguments.py", "near.py",
                        "called.py", "root.py", "ns/sub/deep.py"}
    assert not marker.exists()
    # The bytecode is the import's own: an import after it finds it valid and runs the module.
    ok = subprocess.run([sys.executable, "-c", "import root"], cwd=slime, capture_output=True, text=True,
                        env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})
    assert ok.returncode == 0 and marker.read_text() == "root\nnear\nns.sub.deep\n"
