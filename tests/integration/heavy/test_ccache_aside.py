"""Issue 40, false refusals: a ccache whose cache cannot be written, whose configuration is bad, or
that is broken never makes a compile fail that works without it (_sf_with_ccache steps aside, with
a note saying why). Real bash and gcc; ccache as a stand-in with its failure modes, and the real one
where it is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[3] / "templates" / "steps.sh"
GCC = shutil.which("gcc")
pytestmark = pytest.mark.skipif(GCC is None, reason="needs gcc")

# The compile the step runs (a checkout's extension, here one C file); it prints which gcc it used.
COMPILE = ["bash", "-c", 'printf "%s\\n" "$(command -v gcc)"; gcc -c "$1" -o "$1.o"', "compile"]


def host_with(tmp_path: Path, ccache_body: str) -> Path:
    """A prefix with a ccache (this body) and its compiler links in lib/ccache, as Debian lays them out."""
    host = tmp_path / "host"
    (host / "bin").mkdir(parents=True)
    (host / "lib" / "ccache").mkdir(parents=True)
    (host / "bin" / "ccache").write_text(f"#!{shutil.which('bash')}\n{ccache_body}\n")
    (host / "bin" / "ccache").chmod(0o755)
    for tool in ("gcc", "g++"):
        (host / "lib" / "ccache" / tool).symlink_to("../../bin/ccache")
    return host


def compile_with(tmp_path: Path, host: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    src = tmp_path / "ext.c"
    src.write_text("int ext(void) { return 42; }\n")
    return subprocess.run(["bash", "-c", 'source "$1"; shift; "$@"', "sf", str(LIB), "_sf_with_ccache", *COMPILE,
                           str(src)],
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": f"{host / 'bin'}:/usr/bin:/bin", "SF_STATE": str(tmp_path),
                               "HOME": str(tmp_path), **(env or {})})


# Each stand-in fails every compile as ccache does in that case (its message, exit 1).
BROKEN = {
    "cache not writable": 'echo "ccache: error: Failed to create directory /cache/tmp: Permission denied" >&2; exit 1',
    "bad config": 'echo "ccache: error: /etc/ccache.conf:1: invalid size: \\"banana\\"" >&2; exit 1',
    "crashes": "kill -SEGV $$",
    "writes nothing": "exit 0",
    "escapes in its error": 'printf "ccache: error: \\033[2Jbad \\001 thing\\n" >&2; exit 1',
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_ccache_that_cannot_compile_steps_aside_with_a_note(tmp_path, case):
    host = host_with(tmp_path, BROKEN[case])
    res = compile_with(tmp_path, host)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() != str(host / "lib" / "ccache" / "gcc")  # compiled by the plain gcc
    assert (tmp_path / "ext.c.o").stat().st_size > 0
    assert "ccache: not used for this compile: a test compile through it failed" in res.stderr
    assert "compiling without it" in res.stderr and "\x1b" not in res.stderr and "\x01" not in res.stderr


def test_a_working_ccache_is_used(tmp_path):
    host = host_with(tmp_path, f'exec {GCC} "$@"')
    res = compile_with(tmp_path, host)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(host / "lib" / "ccache" / "gcc") and "not used" not in res.stderr


REAL = shutil.which("ccache")


@pytest.mark.skipif(REAL is None, reason="ccache is not installed here")
@pytest.mark.parametrize("case", ["cache dir missing", "bad config"])
def test_the_real_ccache_with_a_bad_cache_or_config_steps_aside(tmp_path, case):
    links = next((d for d in (Path(REAL).parent.parent / "lib" / "ccache",
                              Path(REAL).parent.parent / "lib64" / "ccache")
                  if (d / "gcc").exists()), None)
    if links is None:
        pytest.skip("ccache's compiler links are not installed")
    bad_conf = tmp_path / "ccache.conf"
    bad_conf.write_text("max_size = banana\n")
    env = ({"CCACHE_DIR": "/proc/sf-no-such-dir"} if case == "cache dir missing"
           else {"CCACHE_CONFIGPATH": str(bad_conf)})
    src = tmp_path / "ext.c"
    src.write_text("int ext(void) { return 42; }\n")
    res = subprocess.run(["bash", "-c", 'source "$1"; shift; "$@"', "sf", str(LIB), "_sf_with_ccache", *COMPILE,
                          str(src)],
                         capture_output=True, text=True, timeout=120,
                         env={"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", ""),
                              "SF_STATE": str(tmp_path), "HOME": str(tmp_path), **env})
    assert res.returncode == 0, res.stderr
    assert "ccache: not used for this compile" in res.stderr and "ccache: error" in res.stderr
