"""The rendered install script of the test stack, run with real bash inside a container from the
local Debian base (real pip/uv from PyPI, real git sources and patches): fresh install, no-op
re-run (the smoke test not run again; --verify runs it), a failing step resumed, an already-patched
tree recognised."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import build_support as bs
import pytest

from slimeforge.image.builder.build import default_ca_bundle
from slimeforge.image.builder.install import render_install_script
from slimeforge.image.sources import parse_sources
from slimeforge.image.stack import load_stack

pytestmark = [pytest.mark.docker, pytest.mark.slow]
PREFIX = "/opt/sf"


@pytest.fixture(scope="module")
def host(base_image, tmp_path_factory):
    """A container from the base image standing in for a host; the fixture repos are mounted read-only."""
    root = tmp_path_factory.mktemp("install")
    repos = bs.make_repos(root / "repos")
    argv = ["docker", "run", "-d", "--name", f"slimeforge-build-install-{os.getpid()}", "-v", f"{root}:{root}:ro"]
    ca = default_ca_bundle()
    if ca:
        argv += ["-v", f"{ca}:/etc/slimeforge-ca.crt:ro", "-e", "SF_CA_BUNDLE=/etc/slimeforge-ca.crt"]
    cid = subprocess.run([*argv, base_image, "sleep", "infinity"], capture_output=True, text=True,
                         check=True).stdout.strip()
    try:
        yield {"root": root, "repos": repos, "cid": cid}
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)


def script_for(host, stack_path=bs.TEST_STACK, name="install.sh", lock=None) -> Path:
    stack = load_stack(str(stack_path))
    local = parse_sources(stack, [f"slime={host['repos']['slime']}", f"libdemo={host['repos']['libdemo']}"])
    path = host["root"] / name
    path.write_text(render_install_script(stack, PREFIX, None, local, host["root"] / "cache", lock=lock))
    return path


def run(host, script: Path, *args: str, env: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "exec", *[f"-e{e}" for e in env], host["cid"], "bash", str(script), *args],
                          capture_output=True, text=True, timeout=900)


def cat(host, path: str) -> str:
    return subprocess.run(["docker", "exec", host["cid"], "cat", path], capture_output=True, text=True,
                          check=True).stdout


@pytest.fixture(scope="module")
def installed(host):
    script = script_for(host)
    res = run(host, script)
    assert res.returncode == 0, res.stderr[-3000:]
    return script, res


def test_script_passes_bash_n_and_shellcheck(host):
    script = script_for(host, name="lint.sh")
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    res = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


def test_fresh_install(installed, host):
    _, res = installed
    # The image's order: slime's requirements at slime's place, the patches and slime's checkout last.
    steps = ("venv", "build-tools", "six", "libdemo", "idna", "slime-requirements", "patches", "slime", "finalize")
    at = [re.search(rf"step [0-9]+/[0-9]+ {step}: running \(log: {PREFIX}/\.slimeforge/logs/{step}\.log\)",
                    res.stderr) for step in steps]
    assert all(at), [s for s, m in zip(steps, at, strict=True) if not m]
    assert [m.start() for m in at] == sorted(m.start() for m in at)
    assert "smoke test passed" in res.stderr
    # Finalize made the flag catalog in this run: the smoke test does not make it again to compare.
    assert (f"smoke: flag catalog {PREFIX}/flags.json made from slime's parsers by finalize in this run: not made "
           "again") in res.stderr
    flags = json.loads(cat(host, f"{PREFIX}/flags.json"))
    assert (flags["slime_commit"] == bs.SLIME_S1 and "--lr" in flags["flags"] and "--sglang-mem-fraction-static"
            in flags["flags"])
    assert "smoke: every pinned version is installed" in res.stderr
    lock = json.loads(cat(host, f"{PREFIX}/stack.lock.json"))
    assert lock["installed"]["six"] == "1.17.0" and lock["checkouts"]["libdemo"] == bs.LIBDEMO_COMMIT
    assert "PATCHED = True" in cat(host, f"{PREFIX}/libdemo/libdemo/__init__.py")


def test_rerun_is_a_noop(installed, host):
    script, _ = installed
    res = run(host, script)
    assert res.returncode == 0, res.stderr
    assert "running" not in res.stderr
    assert res.stderr.count(": done\n") == 9
    # Its pass is recorded with every step's hash: nothing changed, so the smoke test is not run again.
    assert "smoke test: passed with these inputs before, and no step ran since: not run again" in res.stderr
    assert "smoke test passed" not in res.stderr and "smoke: import" not in res.stderr


@pytest.mark.parametrize("args, env", [(("--verify",), ()), ((), ("SLIMEFORGE_VERIFY=1",))])
def test_verify_runs_the_smoke_test_again(installed, host, args, env):
    script, _ = installed
    res = run(host, script, *args, env=env)
    assert res.returncode == 0, res.stderr
    assert "running" not in res.stderr and "smoke: import six ok" in res.stderr and "smoke test passed" in res.stderr
    assert f"smoke: flag catalog {PREFIX}/flags.json matches slime's parsers" in res.stderr  # made again and compared
    assert cat(host,
               f"{PREFIX}/.slimeforge/smoke.passed").split("\n")[0] == re.search(r"sf_smoke_record ([0-9a-f]{64})",
                                                                                 script.read_text())[1]


def test_failing_step_stops_and_the_next_run_resumes_there(installed, host):
    script, _ = installed
    # A lock whose idna file has another sha256 (the file on the index was replaced, or the lock
    # was tampered with): the idna step refuses it, naming the package and the step.
    broken = script_for(host, name="broken.sh", lock=bs.tampered_lock(host["root"] / "tampered", "idna"))
    res = run(host, broken)
    assert res.returncode != 0
    assert f"step idna failed (log: {PREFIX}/.slimeforge/logs/idna.log)" in res.stderr
    assert "it resumes at idna" in res.stderr
    assert "step idna: idna differs from its sha256 in the lock (a changed or corrupted file): refused" in res.stderr
    for step in ("venv", "build-tools", "six", "libdemo"):
        assert re.search(rf"step [0-9]+/9 {step}: done\n", res.stderr), step  # earlier steps kept, not re-run
    assert "step slime" not in res.stderr
    assert "Hash mismatch" in cat(host, f"{PREFIX}/.slimeforge/logs/idna.log")
    fixed = run(host, script)
    assert fixed.returncode == 0, fixed.stderr
    assert "step 4/9 libdemo: done\n" in fixed.stderr and "step 5/9 idna: running" in fixed.stderr


def test_already_patched_tree_is_recognised(installed, host):
    script, _ = installed
    subprocess.run(["docker", "exec", host["cid"], "rm", f"{PREFIX}/.slimeforge/steps/libdemo.done"], check=True)
    res = run(host, script)
    assert res.returncode == 0, res.stderr
    assert "patch libdemo.patch: already applied" in cat(host, f"{PREFIX}/.slimeforge/logs/libdemo.log")
    assert "smoke test passed" in res.stderr  # a step ran after the smoke test's record: it runs again
    assert cat(host, f"{PREFIX}/libdemo/libdemo/__init__.py").count("PATCHED") == 1


def test_a_removed_venv_is_installed_again_and_the_smoke_test_runs(installed, host):
    """Issue 40: the steps' records and the smoke test's record prove what they stand for: after
    `rm -rf <venv>` (and the smoke record dated in the future), every step from the venv on runs
    again, and so does the smoke test."""
    script, _ = installed
    subprocess.run(["docker", "exec", host["cid"], "rm", "-rf", f"{PREFIX}/venv"], check=True)
    subprocess.run(["docker", "exec", host["cid"], "touch", "-d", "2099-01-01", f"{PREFIX}/.slimeforge/smoke.passed"],
                   check=True)
    res = run(host, script)
    assert res.returncode == 0, res.stderr[-3000:]
    for step in ("venv", "build-tools", "six", "libdemo", "idna", "slime-requirements", "patches", "slime", "finalize"):
        assert re.search(rf"step [0-9]+/9 {step}: running", res.stderr), step
    assert "smoke test passed" in res.stderr and "passed with these inputs before" not in res.stderr
    assert subprocess.run(["docker", "exec", host["cid"], f"{PREFIX}/venv/bin/python", "-c",
                           "import six, libdemo"]).returncode == 0
    again = run(host, script)  # and then nothing runs
    assert (again.returncode == 0 and "running" not in again.stderr
            and again.stderr.count(": done\n") == 9), again.stderr[-3000:]
