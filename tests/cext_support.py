"""A real C extension (sfcext) built from an sdist that a local PEP 503 index serves over HTTP on
the Docker bridge, and a stack that compiles it: shared by the compiled-cache, compiled-wheel
store tests and benchmarks/wheels_bench.py."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path

SETUP_PY = '''import os
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class CompilerFromCXX(build_ext):
    """As torch's BuildExtension: $CXX, when set, compiles (a compile queue's wrapper, in the tests)."""

    def build_extensions(self):
        if os.environ.get("CXX"):
            self.compiler.set_executable("compiler_so", [os.environ["CXX"], *self.compiler.compiler_so[1:]])
        super().build_extensions()


# The arch list this build saw, compiled into the module: what a CUDA extension's kernels are built for.
archs = os.environ.get("TORCH_CUDA_ARCH_LIST", "none")
setup(name="sfcext", version="0.1.0", cmdclass={"build_ext": CompilerFromCXX},
      ext_modules=[Extension("sfcext", ["sfcext.c"], define_macros=[("SF_ARCHS", '"%s"' % archs)])])
'''

SFCEXT_C = '''#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *archs(PyObject *self, PyObject *args) { return PyUnicode_FromString(SF_ARCHS); }
static PyMethodDef methods[] = {{"archs", archs, METH_NOARGS, "arch list of the build"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "sfcext", NULL, -1, methods};
PyMODINIT_FUNC PyInit_sfcext(void) { return PyModule_Create(&module); }
'''

STACK = """schema: 1
name: sfcext
version: "0.0.1"
python: "3.11"
base: {{image: slimeforge-test/base:bookworm, digest: null, glibc: "2.36"}}
image_root: /root
venv: /opt/venv
arch_list: {archs}
torch_index: {index}            # the extra index of the sfcext step (a test index, not torch's)
sources: {{}}
versions: {{uv: "0.9.7", setuptools: "80.9.0", wheel: "0.45.1", sfcext: "0.1.0"}}
steps:
  - name: system
    python: true
    apt: [gcc, libc6-dev]
  - name: build-tools
    pip: [setuptools, wheel]
  - name: sfcext
    pip: [sfcext]
    index: torch_index
    from_source: true
    compiles: true
smoke:
  imports: [sfcext]
"""


def make_sdist(dest: Path, heavy: int = 0) -> Path:
    """sfcext-0.1.0.tar.gz, made here (a fixed mtime: the same bytes every run). `heavy`: that many
    extra generated C functions, for a compile that takes long enough to time (the benchmark)."""
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / "sfcext-0.1.0.tar.gz"
    files = {"setup.py": SETUP_PY, "sfcext.c": SFCEXT_C + heavy_c(heavy),
             "PKG-INFO": "Metadata-Version: 2.1\nName: sfcext\nVersion: 0.1.0\n",
             "pyproject.toml": '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'}
    with tarfile.open(path, "w:gz") as tar:
        for name, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"sfcext-0.1.0/{name}")
            info.size, info.mtime, info.mode = len(data), 1_700_000_000, 0o644
            tar.addfile(info, BytesIO(data))
    return path


def docker_bridge_gateway() -> str:
    """This host's address on Docker's default bridge: where build containers reach it. Asked of
    the daemon (it is 172.17.0.1 only by default)."""
    out = subprocess.run(["docker", "network", "inspect", "bridge", "--format",
                          "{{range .IPAM.Config}}{{.Gateway}} {{end}}"],
                         capture_output=True, text=True, check=True).stdout.split()
    return out[0] if out else "172.17.0.1"



def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def heavy_c(n: int) -> str:
    """n generated functions with loops the optimiser works on (never called: compile time only)."""
    return "".join(f"double sf_heavy_{i}(double *x, int n) {{ double s = 0; for (int j = 0; j < n; j++) "
                   f"{{ s += x[j] * {i + 1}.0 / (j + 1) + (s > {i} ? x[j] : -x[j]); }} return s; "
                   "}\n" for i in range(n))


@contextlib.contextmanager
def serve_index(root: Path, heavy: int = 0) -> Iterator[str]:
    """A PEP 503 index holding only sfcext's sdist, served over HTTP on the Docker bridge; its URL."""
    sdist = make_sdist(root / "files", heavy)
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    (root / "simple" / "sfcext").mkdir(parents=True, exist_ok=True)
    (root / "simple" / "sfcext" / "index.html").write_text(
        f'<html><body><a href="../../files/{sdist.name}#sha256={sha}">{sdist.name}</a></body></html>\n')
    bridge = docker_bridge_gateway()
    port = free_port(bridge)
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", bridge, "--directory",
                               str(root)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            try:
                socket.create_connection((bridge, port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"http://{bridge}:{port}/simple"
    finally:
        server.terminate()
        server.wait(timeout=10)
