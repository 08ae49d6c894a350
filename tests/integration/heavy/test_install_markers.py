"""Issue 40, markers that say "done" without proof: install.sh's step records and the smoke test's
record hold only while what they describe is there. The rendered script's runner and step library
with real bash and a real venv (python -m venv, no network), stand-in steps: a venv step, a pip-like
step whose slice names a distribution it installs, a checkout step with an output directory, and
finalize-like step that depends on every earlier one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import build_support as bs  # noqa: E402

from slimeforge.image.builder.install import render_install_script  # noqa: E402
from slimeforge.image.stack import load_stack  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
SMOKE = "c" * 64

STANDINS = r'''
sf_step_venv() {
  if [[ ! -x $VENV/bin/python ]]; then python3 -m venv --without-pip "$VENV"; _sf_venv_new_id "$VENV"; fi
  printf 'venv\n' >>"$T/events"
}
sf_step_pkg() {
  local site
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$site/demo-1.0.dist-info"
  printf 'Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n' >"$site/demo-1.0.dist-info/METADATA"
  printf 'pkg\n' >>"$T/events"
}
sf_step_co() { mkdir -p "$T/co"; printf 'co\n' >>"$T/events"; }
sf_step_fin() { printf 'lock\n' >"$T/lock.json"; printf 'fin\n' >>"$T/events"; }
'''


@pytest.fixture(scope="module")
def head() -> str:
    """The rendered install script up to its prerequisites: settings, the step library, the runner."""
    text = render_install_script(load_stack(bs.TEST_STACK), "/PREFIX", patches=[],
                                 lock=bs.render_lock(load_stack(bs.TEST_STACK)))
    return text[:text.index("# --- prerequisites")]


def run(tmp_path: Path, head: str, verify: bool = False) -> subprocess.CompletedProcess:
    prefix = tmp_path / "prefix"
    state = prefix / ".slimeforge"
    (state / "lock-in").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "slimeforge" / "scripts" / "venvlock.py", state / "venvlock.py")
    (state / "lock-in" / "pkg.txt").write_text("demo @ https://example.invalid/demo-1.0-py3-none-any.whl "
                                               f"--hash=sha256:{'a' * 64}  # ==1.0\n")
    body = head.replace("/PREFIX", str(prefix)) + STANDINS + "SF_STEPS_TOTAL=4\n" + "\n".join([
        "sf_run_step venv h-venv --in-venv -- sf_step_venv",
        f"sf_run_step pkg h-pkg --in-venv --slice {state}/lock-in/pkg.txt -- sf_step_pkg",
        f"sf_run_step co h-co --in-venv --output {tmp_path}/co -- sf_step_co",
        f"sf_run_step fin h-fin --in-venv --after-all --output {tmp_path}/lock.json -- sf_step_fin",
        f"if ((!{int(verify)})) && sf_smoke_recorded {SMOKE}; then sf_log 'smoke test: passed with these inputs "
        "before'",
        f"else printf 'smoke\\n' >>\"$T/events\"; sf_smoke_record {SMOKE}; fi", ""])
    (tmp_path / "run.sh").write_text(body)
    (tmp_path / "events").write_text("")
    return subprocess.run(["bash", str(tmp_path / "run.sh")], capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "T": str(tmp_path)})


def events(tmp_path: Path) -> list[str]:
    return (tmp_path / "events").read_text().split()


@pytest.fixture
def installed(tmp_path, head):
    first = run(tmp_path, head)
    assert first.returncode == 0, first.stderr
    assert events(tmp_path) == ["venv", "pkg", "co", "fin", "smoke"]
    again = run(tmp_path, head)
    assert again.returncode == 0 and events(tmp_path) == [], again.stderr  # nothing changed: nothing runs
    assert "passed with these inputs before" in again.stderr
    return tmp_path


def test_a_removed_venv_runs_every_step_from_the_venv_on_and_the_smoke_test(installed, head):
    shutil.rmtree(installed / "prefix" / "venv")
    res = run(installed, head)
    assert res.returncode == 0, res.stderr
    assert events(installed) == ["venv", "pkg", "co", "fin", "smoke"]
    assert "passed with these inputs before" not in res.stderr


def test_a_venv_made_again_at_the_same_path_is_not_the_one_the_steps_installed_into(installed, head):
    venv = installed / "prefix" / "venv"
    shutil.rmtree(venv)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    res = run(installed, head)
    assert res.returncode == 0, res.stderr
    # The stand-in venv step keeps a venv whose python runs; it has no identity, so it is not the
    # one recorded: every step after it runs again.
    assert events(installed)[1:] == ["pkg", "co", "fin", "smoke"]


def test_a_package_uninstalled_from_the_venv_runs_its_step_again(installed, head):
    site = next((installed / "prefix" / "venv").glob("lib/python*/site-packages"))
    shutil.rmtree(site / "demo-1.0.dist-info")
    res = run(installed, head)
    assert res.returncode == 0, res.stderr
    assert "demo is not installed" in res.stderr and "pkg.done: a distribution of its slice" in res.stderr
    assert events(installed) == ["pkg", "fin", "smoke"]  # fin depends on every earlier step


def test_a_package_at_another_version_runs_its_step_again(installed, head):
    site = next((installed / "prefix" / "venv").glob("lib/python*/site-packages"))
    # What `pip install demo==0.9` leaves: another dist-info directory, its METADATA saying so.
    (site / "demo-1.0.dist-info").rename(site / "demo-0.9.dist-info")
    (site / "demo-0.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: demo\nVersion: 0.9\n")
    res = run(installed, head)
    assert "demo is 0.9, its slice says 1.0" in res.stderr and events(installed) == ["pkg", "fin", "smoke"]


def test_a_deleted_output_runs_its_step_again(installed, head):
    shutil.rmtree(installed / "co")
    res = run(installed, head)
    assert res.returncode == 0, res.stderr
    assert events(installed) == ["co", "fin", "smoke"]
    (installed / "lock.json").write_text("edited\n")
    assert run(installed, head).returncode == 0 and events(installed) == ["fin", "smoke"]


def test_a_smoke_record_from_the_future_hides_no_step_that_ran_since(installed, head):
    far = 4_000_000_000 * 10**9
    for p in [installed / "prefix" / ".slimeforge" / "smoke.passed",
              *(installed / "prefix" / ".slimeforge" / "steps").iterdir()]:
        os.utime(p, ns=(far, far))
    assert run(installed, head).returncode == 0 and events(installed) == []  # mtimes alone change nothing
    (installed / "prefix" / ".slimeforge" / "steps" / "co.done").unlink()  # co runs again, at an old clock
    res = run(installed, head)
    assert res.returncode == 0 and events(installed) == ["co", "fin", "smoke"], res.stderr


@pytest.mark.parametrize("content", [
    "h-pkg\n",  # a record of the old form: a hash alone proves nothing
    "h-pkg\nproof " + "0" * 64 + "\nrun " + "1" * 32 + "\n",  # a proof of something else
    "h-pkg\nproof " + "0" * 64 + "\nrun " + "1" * 32 + "\n" + "x" * 600,
    "h-pkg\nproof \x1b[2J\nrun 1\n",
])
def test_a_record_that_proves_nothing_runs_its_step(installed, head, content):
    (installed / "prefix" / ".slimeforge" / "steps" / "pkg.done").write_text(content)
    res = run(installed, head)
    assert res.returncode == 0, res.stderr
    assert events(installed) == ["pkg", "fin", "smoke"] and "\x1b" not in res.stderr


def test_a_record_that_is_a_link_is_no_record(installed, head):
    steps = installed / "prefix" / ".slimeforge" / "steps"
    os.replace(steps / "co.done", installed / "elsewhere")
    (steps / "co.done").symlink_to(installed / "elsewhere")
    res = run(installed, head)
    assert res.returncode == 0 and events(installed) == ["co", "fin", "smoke"], res.stderr
    assert not (steps / "co.done").is_symlink() and (installed / "elsewhere").exists()


def test_a_venv_whose_python_no_longer_runs_is_made_again(tmp_path):
    """sf_venv (the real step): a venv whose interpreter is gone is made again, with a new identity."""
    lib = ROOT / "templates" / "steps.sh"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    env = {"PATH": os.environ["PATH"], "SF_STATE": str(tmp_path), "HOME": str(tmp_path)}
    subprocess.run(["bash", "-c", 'source "$1"; _sf_venv_new_id "$2"', "sf", str(lib), str(venv)], check=True, env=env)
    ident = subprocess.run(["bash", "-c", 'source "$1"; _sf_venv_id "$2"', "sf", str(lib), str(venv)],
                           capture_output=True, text=True,
                           env=env).stdout.strip()
    assert len(ident) == 32
    (venv / "bin" / "python").unlink()
    (venv / "bin" / "python").symlink_to(tmp_path / "gone")
    assert subprocess.run(["bash", "-c", 'source "$1"; _sf_venv_id "$2"', "sf", str(lib), str(venv)],
                          capture_output=True, text=True,
                          env=env).stdout == ""  # no identity while its python does not run


def test_sf_venv_remakes_a_venv_whose_python_does_not_run_but_never_empties_another_directory(tmp_path):
    lib = ROOT / "templates" / "steps.sh"
    env = {"PATH": os.environ["PATH"], "SF_STATE": str(tmp_path / "state"), "HOME": str(tmp_path)}
    other = tmp_path / "other"
    (other / "bin").mkdir(parents=True)
    (other / "bin" / "python").symlink_to(tmp_path / "gone")
    (other / "theirs.txt").write_text("keep\n")
    # uv's version check never comes: the broken directory is refused first.
    res = subprocess.run(["bash", "-c", 'source "$1"; sf_venv "$2" 0.0.0 python3', "sf", str(lib), str(other)],
                         capture_output=True,
                         text=True, env=env, timeout=120)
    assert res.returncode == 1 and "has no pyvenv.cfg (not a venv)" in res.stderr
    assert (other / "theirs.txt").read_text() == "keep\n"


@pytest.mark.parametrize("line", ["slimeforge: ERROR: build failed \x1b]0;owned\x07 \x1b[2J",
                                  "cc1: \x1b[31merror\u202e: x\r"])
def test_a_failed_steps_log_reaches_the_terminal_printable(tmp_path, head, line):
    """What a compiler or a package's build wrote is the log's; _sf_failed shows it without escapes."""
    (tmp_path / "said").write_text(line + "\n")
    body = head.replace("/PREFIX", str(tmp_path / "prefix")) + "SF_STEPS_TOTAL=1\n" + \
        f"sf_step_bad() {{ cat {tmp_path}/said; return 1; }}\nsf_run_step bad h -- sf_step_bad\n"
    (tmp_path / "run.sh").write_text(body)
    res = subprocess.run(["bash", str(tmp_path / "run.sh")], capture_output=True, text=True, timeout=60,
                         env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)})
    assert res.returncode == 1 and "step bad failed" in res.stderr
    assert ("\x1b" not in res.stderr and "\x07" not in res.stderr and "\u202e" not in res.stderr
            and "\r" not in res.stderr)
    assert ("build failed" in res.stderr) or ("error" in res.stderr)


@pytest.mark.parametrize("record", ["steps/co.done", "smoke.passed"])
def test_a_directory_at_a_records_name_stops_the_install_naming_it(installed, head, record):
    path = installed / "prefix" / ".slimeforge" / record
    path.unlink()
    path.mkdir()
    (path / "theirs").write_text("keep\n")
    if record == "smoke.passed":
        (installed / "prefix" / ".slimeforge" / "steps" / "fin.done").unlink()  # so that the smoke test runs
    res = run(installed, head)
    assert res.returncode == 1 and f"{path} is a directory, not a record slimeforge writes: move it away" in res.stderr
    assert (path / "theirs").read_text() == "keep\n"


@pytest.mark.parametrize("record", ["steps/co.done", "smoke.passed"])
def test_a_fifo_at_a_records_name_is_no_record_and_never_hangs(installed, head, record):
    path = installed / "prefix" / ".slimeforge" / record
    path.unlink()
    os.mkfifo(path)
    res = run(installed, head)
    assert res.returncode == 0, res.stderr
    assert events(installed)[-1] == "smoke" and path.is_file()


def test_a_step_before_the_venv_done_on_another_host_runs_here(tmp_path, head):
    """A state directory copied from another host: its system step's record stands for that host."""
    def once(other_host: bool) -> subprocess.CompletedProcess:
        body = head.replace("/PREFIX", str(tmp_path / "prefix")) + "SF_STEPS_TOTAL=1\n" + \
            "sf_step_sys() { printf 'sys\\n' >>\"$T/events\"; }\n" + \
            ("_sf_host_id() { echo another-host; }\n" if other_host else "") + "sf_run_step sys h-sys -- sf_step_sys\n"
        (tmp_path / "run.sh").write_text(body)
        (tmp_path / "events").write_text("")
        return subprocess.run(["bash", str(tmp_path / "run.sh")], capture_output=True, text=True, timeout=60,
                              env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "T": str(tmp_path)})
    assert once(False).returncode == 0 and events(tmp_path) == ["sys"]
    assert once(False).returncode == 0 and events(tmp_path) == []  # this host: done
    res = once(True)
    assert res.returncode == 0 and events(tmp_path) == ["sys"] and ("sys.done: what the step left is not there as it "
                                                                   "was") in res.stderr


def test_sf_venv_installs_the_pinned_uv_only_as_its_slice_names_it_by_sha256(tmp_path):
    """The venv step's uv is the lock's one file (its slice: `uv @ URL --hash=sha256:H`), installed
    with pip --require-hashes: a file of other bytes at that URL is refused, naming the step's slice,
    and nothing of it is installed; the right bytes give the venv that uv. A real venv and pip, a
    stand-in uv wheel served from a file URL (no network)."""
    import hashlib
    import zipfile

    lib = ROOT / "templates" / "steps.sh"
    env = {"PATH": os.environ["PATH"], "SF_STATE": str(tmp_path / "state"), "HOME": str(tmp_path),
           "PIP_NO_INDEX": "1"}
    wheel = tmp_path / "wheels" / "uv-0.0.1-py3-none-any.whl"
    wheel.parent.mkdir()
    script = "#!/bin/sh\necho 'uv 0.0.1'\n"
    with zipfile.ZipFile(wheel, "w") as zf:
        exe = zipfile.ZipInfo("uv-0.0.1.data/scripts/uv")
        exe.external_attr = 0o100755 << 16  # an executable, as uv's own wheel has it
        zf.writestr(exe, script)
        zf.writestr("uv-0.0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: uv\nVersion: 0.0.1\n")
        zf.writestr("uv-0.0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\n"
                                                "Tag: py3-none-any\n")
        zf.writestr("uv-0.0.1.dist-info/RECORD", "")
    good = hashlib.sha256(wheel.read_bytes()).hexdigest()
    venv = tmp_path / "venv"

    def sf_venv(*slice_arg: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", 'source "$1"; shift; sf_venv "$@"', "sf", str(lib), str(venv), "0.0.1",
                               sys.executable, *slice_arg], capture_output=True, text=True, env=env, timeout=300)

    res = sf_venv()
    assert res.returncode == 1 and "venv: its slice of the lock (none given) is missing" in res.stderr
    bad = tmp_path / "bad.txt"
    bad.write_text(f"uv @ {wheel.as_uri()} --hash=sha256:{'0' * 64}  # ==0.0.1\n")
    res = sf_venv(str(bad))
    assert res.returncode == 1 and f"venv: the pinned uv 0.0.1 could not be installed from its slice of the lock " \
                                   f"({bad}: uv @ {wheel.as_uri()}" in res.stderr, res.stderr
    assert "DO NOT MATCH THE HASHES" in res.stderr and not (venv / "bin" / "uv").exists()
    right = tmp_path / "venv.txt"
    right.write_text(f"# the venv's uv, by sha256\nuv @ {wheel.as_uri()} --hash=sha256:{good}  # ==0.0.1\n")
    res = sf_venv(str(right))
    assert res.returncode == 0, res.stderr
    assert subprocess.run([str(venv / "bin" / "uv"), "--version"], capture_output=True, text=True).stdout == \
        "uv 0.0.1\n"
    # Kept where every later verify reads the slices so far: the venv's uv is held at that version.
    assert (tmp_path / "state" / "lock" / "venv.txt").read_text() == right.read_text()
