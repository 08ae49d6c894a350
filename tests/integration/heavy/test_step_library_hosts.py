"""templates/steps.sh on the hosts people have, with real bash, gcc, patch, pip and unshare: a host
without apt, an interpreter from elsewhere, a toolkit of nvcc alone (headers and libcuda from the
venv and a stub), failures that name what failed, stacked patches checked as a stack, and compiles
that reach nothing but the files the lock names."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from cext_support import make_sdist  # noqa: E402
from helpers import in_ci  # noqa: E402

LIB = Path(__file__).resolve().parents[3] / "templates" / "steps.sh"


def sf(*args: str, state: Path, path: str = "/usr/bin:/bin",
       env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", 'source "$1"; shift; "$@"', "sf", str(LIB), *args], capture_output=True,
                          text=True, env={"PATH": path, "SF_STATE": str(state), "HOME": str(state), **(env or {})})


def bin_dir(tmp_path: Path, *commands: str) -> Path:
    """A PATH directory holding only these commands (links to the real ones): a host without apt."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    for c in commands:
        real = shutil.which(c)
        assert real, c
        (d / c).symlink_to(real)
    return d


# --- the system step ------------------------------------------------------------------------


def test_a_host_without_apt_is_told_what_is_missing_with_dnf_names(tmp_path):
    path = bin_dir(tmp_path, "bash", "cat", "grep", "sed", "awk", "id", "git", "gcc")
    res = sf("sf_system", "--need", "git:git::git", "--need", "build-essential:gcc,g++,make::gcc,gcc-c++,make",
             "--need", "rsync:rsync::rsync", "--need", "ca-certificates::/nonexistent/ca.crt,/also/not:ca-certificates",
             state=tmp_path, path=str(path))
    assert res.returncode == 1
    err = res.stderr
    assert "this host has no apt-get" in err and "build-essential rsync ca-certificates" in err
    assert "dnf install -y gcc gcc-c++ make rsync ca-certificates" in err
    assert "git" not in err.split("missing:")[1].split("(apt names)")[0]  # git is there


def test_an_optional_package_is_named_and_skipped_where_it_cannot_be_installed(tmp_path):
    """ccache only makes a compile faster: a host without apt goes on without it; a required package
    that is missing still stops the step, and the optional one is not in its list."""
    path = bin_dir(tmp_path, "bash", "cat", "grep", "sed", "awk", "id", "git")
    res = sf("sf_system", "--need", "git:git::git", "--need", "ccache:sf-no-such-ccache::ccache:optional",
             state=tmp_path, path=str(path))
    assert res.returncode == 0, res.stderr
    assert ("system: optional, not installed (no apt-get here, or not root): ccache; the install goes on without them"
            in res.stderr)
    assert "system: all required packages present" in res.stderr
    bad = sf("sf_system", "--need", "rsync:sf-no-such-rsync::rsync", "--need",
             "ccache:sf-no-such-ccache::ccache:optional",
             state=tmp_path, path=str(path))
    assert bad.returncode == 1 and ("these are missing: rsync (apt "
                                   "names)") in bad.stderr and "dnf install -y rsync\n" in bad.stderr + "\n"
    # Present (its command is here): neither installed nor named.
    ok = sf("sf_system", "--need", "git:git::git:optional", state=tmp_path, path=str(path))
    assert ok.returncode == 0 and "optional" not in ok.stderr


def test_compiles_in_place_go_through_ccache_where_it_is_installed(tmp_path):
    """_sf_with_ccache: ccache's compiler links (lib/ccache beside its bin/) first on PATH, so `gcc`
    is ccache's and the command is the same; untouched where ccache or its links are absent."""
    show = ["bash", "-c", 'printf "gcc=[%s] CC=[%s]\\n" "$(command -v gcc)" "${CC-unset}"']
    host = tmp_path / "host"
    (host / "bin").mkdir(parents=True)
    for tool in ("bash", "gcc", "mktemp", "timeout", "rm", "grep", "head", "tr", "as",
                 "ld"):  # and what its ccache probe runs
        if shutil.which(tool):
            (host / "bin" / tool).symlink_to(shutil.which(tool) or "/bin/false")
    path = str(host / "bin")
    without = sf("_sf_with_ccache", *show, state=tmp_path, path=path)
    assert without.returncode == 0 and without.stdout == f"gcc=[{host}/bin/gcc] CC=[unset]\n", without.stderr
    # A stand-in that compiles as ccache does through its links: the real compiler, by its name.
    (host / "bin" / "ccache").write_text(f"#!{shutil.which('bash')}\nexec {shutil.which('gcc')} \"$@\"\n")
    (host / "bin" / "ccache").chmod(0o755)
    no_links = sf("_sf_with_ccache", *show, state=tmp_path, path=path)
    assert no_links.stdout == f"gcc=[{host}/bin/gcc] CC=[unset]\n"  # a ccache without its links: compiles as before
    (host / "lib" / "ccache").mkdir(parents=True)
    for tool in ("gcc", "g++"):
        (host / "lib" / "ccache" / tool).symlink_to("../../bin/ccache")
    linked = sf("_sf_with_ccache", *show, state=tmp_path, path=path)
    assert linked.stdout == f"gcc=[{host}/lib/ccache/gcc] CC=[unset]\n", linked.stderr
    theirs = sf("_sf_with_ccache", *show, state=tmp_path, path=path, env={"CC": "clang"})
    assert theirs.stdout == f"gcc=[{host}/lib/ccache/gcc] CC=[clang]\n"  # the user's CC is theirs


def test_an_interpreter_that_is_there_is_never_installed(tmp_path):
    # This very interpreter (a venv's or pyenv's, never apt's) has venv and its headers.
    python = sys.executable
    res = sf("sf_system", "--python", python, "--python-package", "python9.99", "--python-package", "python9.99-dev",
             "--need", "git:git::git", state=tmp_path, path=f"{bin_dir(tmp_path, 'git', 'id', 'grep')}:/usr/bin:/bin")
    if not subprocess.run([python, "-c", "import ensurepip, sysconfig, os, sys; "
                           "sys.exit(not os.path.isfile(sysconfig.get_paths()['include'] + "
                           "'/Python.h'))"]).returncode == 0:
        pytest.skip("this interpreter has no headers")
    assert res.returncode == 0, res.stderr
    assert "no interpreter is installed" in res.stderr and "python9.99" not in res.stderr


def test_a_missing_interpreter_without_apt_names_dnf_and_the_option(tmp_path):
    path = bin_dir(tmp_path, "bash", "grep", "sed", "awk", "id", "git")
    res = sf("sf_system", "--python", "python9.99", "--python-package", "python9.99", "--need", "git:git::git",
             state=tmp_path, path=str(path))
    assert res.returncode == 1
    assert "dnf install -y python9.99 python9.99-devel" in res.stderr and "invoke install --python" in res.stderr


# --- compiling with a toolkit of nvcc alone ----------------------------------------------------


def test_headers_and_libraries_come_from_the_venv_and_libcuda_from_a_stub(tmp_path):
    """An extension built the way the compiled steps build (setuptools, `libraries=["cuda"]`, one
    driver call, headers from the venv's wheels) on a host with no driver: it links against the
    stub and still names libcuda.so.1, which the driver provides at run time. An empty stub alone
    is dropped by the linker's --as-needed (torch_memory_saver failed with `undefined symbol:
    cuMemCreate` on an H100 that way)."""
    venv, env = build_venv(tmp_path)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    for d in ("nvidia/cu13/include", "nvidia/cu13/lib", "nvidia/nccl/include", "nvidia/nccl/lib"):
        (site / d).mkdir(parents=True)
    (site / "nvidia/nccl/include/nccl.h").write_text("#define SF_NCCL_FROM_THE_VENV 1\n")
    src = tmp_path / "drvext"
    src.mkdir()
    (src / "setup.py").write_text("from setuptools import Extension, setup\n"
                                  "setup(name='drvext', version='1', ext_modules=[Extension('drvext', ['d.c'], "
                                  "libraries=['cuda'])])\n")
    (src / "d.c").write_text("#include <Python.h>\n#include <nccl.h>\nextern int cuDriverGetVersion(int *);\n"
                             "static PyObject *v(PyObject *s, PyObject *a) { int x = SF_NCCL_FROM_THE_VENV; "
                             "cuDriverGetVersion(&x); "
                             "return PyLong_FromLong(x); }\n"
                             "static PyMethodDef m[] = {{\"v\", v, METH_NOARGS, \"\"}, {NULL, NULL, 0, NULL}};\n"
                             "static struct PyModuleDef d = {PyModuleDef_HEAD_INIT, \"drvext\", NULL, -1, m};\n"
                             "PyMODINIT_FUNC PyInit_drvext(void) { return PyModule_Create(&d); }\n")
    script = (f'_sf_compile_env {venv} && SF_COMPILED_WHEELS={tmp_path}/wheels _sf_store_make {venv} drvext {src} '
              '&& echo "$CPATH" && echo "$LIBRARY_PATH"')
    res = subprocess.run(["bash", "-c", f'source "$1"; {script}', "sf", str(LIB)], capture_output=True, text=True,
                         env={"PATH": f"{venv}/bin:/usr/bin:/bin", "SF_STATE": str(tmp_path / "state"),
                              "HOME": str(tmp_path),
                              "CUDA_HOME": str(tmp_path / "nvcc-only"), "SF_COMPILE_OFFLINE": "0", **env})
    if "linking against a stub" not in res.stderr:
        pytest.skip("this host has a libcuda (a driver): no stub is needed")
    assert res.returncode == 0, res.stderr
    cpath, library_path = res.stdout.split()
    assert "nvidia/nccl/include" in cpath and "nvidia/cu13/include" in cpath
    assert str(tmp_path / "state" / "stubs") in library_path and "nvidia/nccl/lib" in library_path
    soname = subprocess.run(["objdump", "-p", str(tmp_path / "state" / "stubs" / "libcuda.so")], capture_output=True,
                            text=True).stdout
    assert "SONAME               libcuda.so.1" in soname
    wheel = next((tmp_path / "wheels").glob("drvext-*.whl"))
    subprocess.run(["python3", "-m", "zipfile", "-e", str(wheel), str(tmp_path / "unzipped")], check=True)
    so = next((tmp_path / "unzipped").glob("drvext*.so"))
    needed = subprocess.run(["objdump", "-p", str(so)], capture_output=True, text=True).stdout
    assert "NEEDED               libcuda.so.1" in needed and "stubs" not in needed


# --- failures that tell the truth -----------------------------------------------------------


@pytest.mark.parametrize("out, says, never", [
    ("  × Failed to build `apex @ file:///x`\n  ╰─▶ ...\ncsrc/a.cu(12): error: identifier \"x\" is undefined\nerror: "
     "command 'nvcc' failed",
     "apex failed to compile: csrc/a.cu(12): error: identifier \"x\" is undefined", "sha256"),
    ("error: Hash mismatch for `six==1.17.0`\n\nExpected:\n  sha256:aa\nComputed:\n  sha256:bb",
     "six differs from its sha256 in the lock", "compile"),
    ("error: Failed to download `six==1.17.0`\n  Caused by: dns error", "six cannot be fetched", "sha256"),
])
def test_a_failure_says_what_failed_and_only_a_hash_mismatch_speaks_of_sha256(tmp_path, out, says, never):
    res = sf("_sf_explain_uv_failure", "demo", out, state=tmp_path)
    assert res.returncode == 1
    assert says in res.stderr and never not in res.stderr


def build_venv(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A venv with pip and uv, and the test runner's setuptools on PYTHONPATH (a compile without
    build isolation needs it installed; this one is, and no index is asked for it)."""
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    (venv / "bin" / "uv").symlink_to(uv)
    return venv, {"PYTHONPATH": sysconfig.get_paths()["purelib"]}


def test_a_compile_error_names_the_package_its_first_error_and_the_log(tmp_path):
    venv, env = build_venv(tmp_path)
    src = tmp_path / "brokenext"
    src.mkdir()
    (src / "setup.py").write_text("from setuptools import Extension, setup\n"
                                  "setup(name='brokenext', version='1', ext_modules=[Extension('brokenext', "
                                  "['b.c'])])\n")
    (src / "b.c").write_text("#include <no_such_header_here.h>\n")
    res = sf("_sf_store_make", str(venv), "demo", str(src), state=tmp_path,
             env={"SF_COMPILE_OFFLINE": "0", "SF_COMPILED_WHEELS": str(tmp_path / "wheels"), **env})
    assert res.returncode == 1
    assert "step demo: brokenext failed to compile: " in res.stderr
    assert "no_such_header_here.h" in res.stderr.split("failed to compile: ")[1].splitlines()[0]
    assert ("full output: "
           f"{tmp_path}/logs/compile-demo.log") in res.stderr and "differs from its sha256" not in res.stderr


# --- stacked patches ------------------------------------------------------------------------


def make_stack_of_patches(tmp_path: Path) -> tuple[Path, list[Path]]:
    """Two patches of one file, the second's context made by the first (like slime's sglang ones)."""
    tree = tmp_path / "site" / "pkg"
    tree.mkdir(parents=True)
    lines = [f"line {i}\n" for i in range(12)]
    stages = [lines, [*lines[:5], "first patch\n", *lines[5:]], None]
    stages[2] = [*stages[1][:6], "second patch\n", *stages[1][6:]]
    patches = []
    for i in (0, 1):
        a, b = tmp_path / f"a{i}" / "pkg" / "mod.py", tmp_path / f"b{i}" / "pkg" / "mod.py"
        for f, text in ((a, stages[i]), (b, stages[i + 1])):
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text("".join(text))
        diff = subprocess.run(["diff", "-u", "--label", "a/pkg/mod.py", "--label", "b/pkg/mod.py", str(a), str(b)],
                              capture_output=True, text=True).stdout
        p = tmp_path / f"p{i}.patch"
        p.write_text(diff)
        patches.append(p)
    (tree / "mod.py").write_text("".join(stages[2]))  # both applied
    return tree.parent, patches


def test_stacked_patches_are_verified_as_a_stack_and_the_tree_is_left_alone(tmp_path):
    site, (p0, p1) = make_stack_of_patches(tmp_path)
    before = (site / "pkg" / "mod.py").read_text()
    alone = subprocess.run(["patch", "-d", str(site), "-p1", "--fuzz=0", "--reverse", "--batch", "--dry-run", "-i",
                            str(p0)],
                           capture_output=True, text=True)
    assert alone.returncode != 0  # the first one alone no longer reverses: the old check's false failure
    res = sf("sf_patches_applied", f"p0:patch:1:{p0}:{site}", f"p1:patch:1:{p1}:{site}", state=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "patch p0 present" in res.stderr and "patch p1 present" in res.stderr
    assert (site / "pkg" / "mod.py").read_text() == before


def test_a_missing_patch_in_a_stack_is_named(tmp_path):
    site, (p0, p1) = make_stack_of_patches(tmp_path)
    text = (site / "pkg" / "mod.py").read_text().replace("second patch\n", "")
    (site / "pkg" / "mod.py").write_text(text)  # only the first applied
    res = sf("sf_patches_applied", f"p0:patch:1:{p0}:{site}", f"p1:patch:1:{p1}:{site}", state=tmp_path)
    assert res.returncode == 1
    assert "patch p1 is not present" in res.stderr


# --- compiles reach nothing the lock does not name ------------------------------------------------


def test_fetch_locked_takes_exactly_the_lock_files(tmp_path):
    sdist = make_sdist(tmp_path / "files")
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text(f"# --- built from source\nsfcext @ file://{sdist} --hash=sha256:{sha}  # ==0.1.0\n")
    bad.write_text(f"sfcext @ file://{sdist} --hash=sha256:{'0' * 64}\n")
    ok = sf("_sf_fetch_locked", str(Path(sys.executable).parent.parent), "demo", str(good), str(tmp_path / "dl"),
            state=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "dl" / sdist.name).read_bytes() == sdist.read_bytes()
    no = sf("_sf_fetch_locked", str(Path(sys.executable).parent.parent), "demo", str(bad), str(tmp_path / "dl2"),
            state=tmp_path)
    assert no.returncode == 1 and "differs from its sha256 in the lock" in no.stderr
    assert not list((tmp_path / "dl2").iterdir())


def can_unshare() -> bool:
    return subprocess.run(["unshare", "--net", "--", "true"],
                          capture_output=True).returncode == 0 and shutil.which("ip") is not None


def in_loopback_only_netns(tmp_path: Path, index: Path, script: str, env: dict[str,
                                                                               str]) -> subprocess.CompletedProcess:
    """Run `script` (bash, with the step library sourced and $URL set) in a new network namespace
    whose only interface is loopback, with a PEP 503-style file server on it: the index is all
    the network there is."""
    port = 8765
    driver = f"""set -u
ip link set lo up
{sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {index} >/dev/null 2>&1 &
server=$!
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && break; sleep 0.1; done
URL=http://127.0.0.1:{port}
source {LIB}
set +e
( {script} )
rc=$?
kill $server
exit $rc
"""
    return subprocess.run(["unshare", "--net", "--", "bash", "-c", driver], capture_output=True, text=True,
                          env={"SF_STATE": str(tmp_path), "HOME": str(tmp_path), **env})


@pytest.mark.skipif(not can_unshare() and not in_ci(),
                    reason="unshare --net is not permitted here (not root), or no ip")
def test_a_compiled_step_builds_where_only_the_loopback_index_is_reachable_and_its_setup_cannot_fetch(tmp_path):
    """The whole compiled step runs where the loopback index is the only network: its sdist comes
    from there by sha256, then the compile runs with no network at all, so an sdist whose setup.py
    fetches something of its own (as TE's and flash-attn's do unless told not to) fails, although
    the address it asks for answers the step."""
    venv, env = build_venv(tmp_path)
    env = {"PATH": f"{venv}/bin:/usr/bin:/bin", "MAX_JOBS": "1", "NVCC_THREADS": "1", **env}
    index = tmp_path / "index"
    sdist = make_sdist(index)
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    slice_ = tmp_path / "sfcext.txt"
    slice_.write_text(f"# --- built from source\nsfcext @ http://127.0.0.1:8765/{sdist.name} --hash=sha256:{sha}  # "
                      "==0.1.0\n")
    res = in_loopback_only_netns(tmp_path, index,
                                 f"sf_compiled --key t-sfcext-0 -- lock_install {venv} sfcext {slice_}", env)
    assert res.returncode == 0, res.stderr
    assert "compiling with no network (unshare --net)" in (tmp_path / "logs" / "compile-sfcext.log").read_text()
    assert subprocess.run([str(venv / "bin" / "python"), "-c", "import sfcext"], env={**os.environ,
                                                                                      **env}).returncode == 0

    fetching = tmp_path / "fetching"
    fetching.mkdir()
    (fetching / "setup.py").write_text(
        "import urllib.request\nfrom setuptools import setup\n"
        "urllib.request.urlopen('http://127.0.0.1:8765/', timeout=5)  # a prebuilt binary, fetched on its own\n"
        "setup(name='fetching', version='1')\n")
    res = in_loopback_only_netns(tmp_path, index, "(exec 3<>/dev/tcp/127.0.0.1/8765) && echo index-reachable; "
                                                  f"SF_COMPILED_WHEELS={tmp_path}/w2 _sf_store_make {venv} fetching "
                                                  f"{fetching}", env)
    assert "index-reachable" in res.stdout  # the step itself reaches the index ...
    assert res.returncode == 1 and "fetching failed to compile" in res.stderr  # ... its compile does not
    log = (tmp_path / "logs" / "compile-fetching.log").read_text()
    assert "URLError" in log or "Network is unreachable" in log or "Connection refused" in log, log[-2000:]


def make_creating_patch(tmp_path: Path) -> tuple[Path, Path]:
    """A patch that changes pkg/mod.py and creates pkg/new.py (as sglang-pull_weights.patch creates
    weight_sync/local_checkpoint.py), and the directory it applies to."""
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "mod.py").write_text("".join(f"line {i}\n" for i in range(8)))
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        (d / "pkg").mkdir(parents=True)
    (a / "pkg" / "mod.py").write_text((site / "pkg" / "mod.py").read_text())
    (b / "pkg" / "mod.py").write_text((site / "pkg" / "mod.py").read_text().replace("line 4\n", "line 4 patched\n"))
    (b / "pkg" / "new.py").write_text("CREATED = True\n")
    diff = subprocess.run(["diff", "-ruN", "a", "b"], cwd=tmp_path, capture_output=True, text=True).stdout
    patch = tmp_path / "creating.patch"
    patch.write_text(diff.replace("--- a/pkg/new.py", "--- /dev/null"))
    return site, patch


def test_a_reinstalled_package_gets_its_patch_again_despite_the_file_the_patch_left(tmp_path):
    """The real install's re-run: the package was re-installed (its own files back, unpatched) and
    the file the patch had created is still there. The patch must be applied again, not taken
    for applied (what `patch --reverse --batch` answered)."""
    site, patch = make_creating_patch(tmp_path)
    first = sf("sf_apply_patch", "creating.patch", "patch", "1", str(patch), str(site), state=tmp_path)
    assert first.returncode == 0, first.stderr
    original = "".join(f"line {i}\n" for i in range(8))
    (site / "pkg" / "mod.py").write_text(original)  # the re-install
    again = sf("sf_apply_patch", "creating.patch", "patch", "1", str(patch), str(site), state=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "already applied" not in again.stderr and ("removed pkg/new.py, left by an earlier "
                                                     "application") in again.stderr
    assert "line 4 patched" in (site / "pkg" / "mod.py").read_text() and (site / "pkg" / "new.py").exists()
    assert sf("sf_patches_applied", f"creating.patch:patch:1:{patch}:{site}", state=tmp_path).returncode == 0
    # Applied in full, a third run recognises it.
    third = sf("sf_apply_patch", "creating.patch", "patch", "1", str(patch), str(site), state=tmp_path)
    assert third.returncode == 0 and "already applied" in third.stderr


def test_a_file_in_the_way_that_the_patch_did_not_write_is_never_removed(tmp_path):
    site, patch = make_creating_patch(tmp_path)
    (site / "pkg" / "new.py").write_text("SOMEONE_ELSES = True\n")
    res = sf("sf_apply_patch", "creating.patch", "patch", "1", str(patch), str(site), state=tmp_path)
    assert res.returncode == 1
    assert "pkg/new.py exists with content the patch does not give it" in res.stderr
    assert (site / "pkg" / "new.py").read_text() == "SOMEONE_ELSES = True\n"


def test_a_compiled_checkout_is_compiled_again_from_clean_not_from_its_old_build_dir(tmp_path):
    """pip builds a checkout in place and setuptools takes build/'s extension for up to date when the
    sources did not change: the second compile (other flags, another torch) shipped the first
    one's binary (seen in the real install). The step resets the checkout first."""
    venv, env = build_venv(tmp_path)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "setup.py").write_text(
        "import os\nfrom setuptools import Extension, setup\n"
        "setup(name='flagged', version='1', ext_modules=[Extension('flagged', ['f.c'], "
        "define_macros=[('SF_FLAG', '\"%s\"' % os.environ['SF_TEST_FLAG'])])])\n")
    (repo / "f.c").write_text(
        "#include <Python.h>\nstatic PyObject *flag(PyObject *s, PyObject *a) { return PyUnicode_FromString(SF_FLAG); "
        "}\n"
        "static PyMethodDef m[] = {{\"flag\", flag, METH_NOARGS, \"\"}, {NULL, NULL, 0, NULL}};\n"
        "static struct PyModuleDef d = {PyModuleDef_HEAD_INIT, \"flagged\", NULL, -1, m};\n"
        "PyMODINIT_FUNC PyInit_flagged(void) { return PyModule_Create(&d); }\n")
    for argv in (["init", "-q"], ["add", "."], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m",
                                                "x"]):
        subprocess.run(["git", "-C", str(repo), *argv], check=True)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    # The venv's own distributions are the lock of this test (sf_lock_verify allows nothing else).
    have = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"], capture_output=True,
                          text=True).stdout
    (tmp_path / "lock").mkdir()
    (tmp_path / "lock" / "base.txt").write_text(have + "flagged==1\n")
    dest = tmp_path / "checkout"

    def compile_with(flag: str) -> str:
        res = sf("sf_compiled", "--key", "t-flagged-0", "--", "source_step", "--venv", str(venv), "--step", "flagged",
                 "--name",
                 "flagged", "--url", str(repo), "--commit", commit, "--dest", str(dest), state=tmp_path,
                 env={**env, "PATH": f"{venv}/bin:/usr/bin:/bin", "SF_TEST_FLAG": flag, "MAX_JOBS": "1",
                      "NVCC_THREADS": "1",
                      "SF_COMPILE_OFFLINE": "0"})
        assert res.returncode == 0, res.stderr
        return subprocess.run([str(venv / "bin" / "python"), "-c", "import flagged; print(flagged.flag())"],
                              capture_output=True, text=True, env={**os.environ, **env}).stdout.strip()

    assert compile_with("first") == "first"
    assert (dest / "build").exists()  # pip built it in place
    assert compile_with("second") == "second"


def test_a_full_disk_is_named_as_such():
    out = ("error: Failed to install: torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl (torch==2.11.0)\n"
           "  Caused by: failed to copy file from /root/.cache/uv/archive-v0/x/libtorch_cuda.so to "
           "/opt/venv/libtorch_cuda.so: "
           "No space left on device (os error 28)\n")
    res = subprocess.run(["bash", "-c", 'source "$1"; _sf_explain_uv_failure torch "$2"', "sf", str(LIB), out],
                         capture_output=True, text=True)
    assert res.returncode == 1
    assert "step torch: installing its slice of the lock failed: failed to copy file" in res.stderr
    assert "No space left on device" in res.stderr and "sha256" not in res.stderr
