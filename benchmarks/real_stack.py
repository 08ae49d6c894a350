"""The real cu13 stack, installed (`invoke install`) and built (`invoke build`) end to end on this
host, with per-step times, sizes and the checks a user would make afterwards.

    python benchmarks/real_stack.py prepare   # the test copy of the stack, its lock, the base image
    python benchmarks/real_stack.py install   # invoke install, then pip check, patches, a no-op re-run
    python benchmarks/real_stack.py build     # invoke build of the same stack (see below: the store)
    python benchmarks/real_stack.py build --rebuild   # again, every layer, cache mounts warm: the store-hit build
    python benchmarks/real_stack.py all

What this workplace forces, and nothing else, is changed, in a test copy of the stack under
--work (images/cu13.yaml itself is untouched, and extended):
  - the router: slime's fork (a GitHub release) cannot be fetched here; PyPI's sglang-router 0.3.2
    stands in, and the smoke test's fork marker is off;
  - torch_memory_saver: the zhuzilin fork cannot be fetched here; its upstream, fzyzcjy's, at
    4a43c977 stands in (the source stack-facts.md measured on an H100);
  - the base: nvidia/cuda cannot be pulled; a Debian 12 base is made here (debootstrap), with this
    host's Python 3.12 and its CUDA 13.0 toolkit (assembled from NVIDIA's PyPI wheels: nvcc, crt,
    nvvm, cccl, runtime; no cuBLAS/cuSPARSE/NCCL/cuDNN headers: the venv's wheels bring those);
  - the driver: there is no GPU here; `nvidia-smi` is a stand-in on PATH that reports driver 580
    for the prerequisite and lists no GPU, so the smoke test skips its GPU imports by name.
The lock of the test copy is the committed cu13 lock with only those inputs re-stamped: the same
283 distributions, by the same URLs and sha256.

The image build takes its compiled steps from the store only once an image build filled it: on the
locally made base (no registry digest) an image build keys its compiled steps by the base image's id,
the install by the base's name (docs/install.md, "The compiled steps' keys"), so the first build
after a cold install compiles Transformer Engine, apex and torch_memory_saver again, for the store.

Sources come from local checkouts (GitHub is out of reach): SLIMEFORGE_REAL_SOURCES, a comma list
of NAME=PATH for slime, megatron, apex and torch_memory_saver (bare repositories are fine).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slimeforge.atomic import write_file  # noqa: E402
from slimeforge.image.lock.lockfile import render_lock  # noqa: E402
from slimeforge.image.lock.lockinputs import inputs  # noqa: E402
from slimeforge.image.stack import load_stack  # noqa: E402

BASE_IMAGE = "slimeforge-real/base:cu13-bookworm"
ROUTER = ("https://files.pythonhosted.org/packages/21/37/2ec21a57e77f7bb66c713a819ea6ffa94b6859c6b3ddd062d3b91d856b86/"
          "sglang_router-0.3.2-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
          "ba5a24951e5e0357fe390782fcd1abd861448a87216832dbf2e501a1dd1548eb")
TMS = ("https://github.com/fzyzcjy/torch_memory_saver.git", "4a43c97771f139db0215c1378e8a0b50e679d23d")
CUDA = Path("/usr/local/cuda-13.0")
# Libraries CPython's own modules link (ssl, ctypes, sqlite3, zlib, bz2, lzma, readline, uuid).
BASE_PACKAGES = ("ca-certificates,libssl3,libffi8,zlib1g,libbz2-1.0,liblzma5,libsqlite3-0,libreadline8,libncursesw6,"
                 "libuuid1,libgdbm6")


def sh(argv: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(map(str, argv)), flush=True)
    return subprocess.run([str(a) for a in argv], check=True, **kw)


def find_python() -> str:
    """A Python 3.12 that has venv and its headers: PATH's python3.12, else pyenv's."""
    for cand in [shutil.which("python3.12"), *sorted(Path.home().glob(".pyenv/versions/3.12.*/bin/python3.12"))]:
        if cand:
            real = subprocess.run([str(cand), "-c", "import sys, sysconfig; print(sys.executable)"],
                                  capture_output=True, text=True)
            if real.returncode == 0:
                return real.stdout.strip()
    raise SystemExit("no python3.12 on this host")


def sources() -> list[str]:
    raw = os.environ.get("SLIMEFORGE_REAL_SOURCES", "")
    out = [s for s in raw.split(",") if s]
    names = {s.split("=", 1)[0] for s in out}
    missing = {"slime", "megatron", "apex", "torch_memory_saver"} - names
    if missing:
        raise SystemExit(f"SLIMEFORGE_REAL_SOURCES lacks {sorted(missing)} (NAME=PATH of local checkouts)")
    return out


# --- prepare ---------------------------------------------------------------------------------


def test_copy(work: Path) -> Path:
    """work/stack/cu13.yaml (extends the real one) and its lock: the committed lock, re-stamped."""
    d = work / "stack"
    (d / "locks").mkdir(parents=True, exist_ok=True)
    yaml = d / "cu13.yaml"
    yaml.write_text(f"""# The real cu13 stack with only what this workplace forces changed (benchmarks/real_stack.py).
extends: {ROOT / 'images' / 'cu13.yaml'}
base:
  image: {BASE_IMAGE}
sources:
  torch_memory_saver:
    git: {TMS[0]}
    commit: {TMS[1]}
router:
  wheel: {ROUTER[0]}
smoke:
  router_fork_marker: null
""")
    stack = load_stack(yaml)
    data = tomllib.loads((ROOT / "images" / "locks" / "pylock.cu13.toml").read_text())
    tool = data["tool"]["slimeforge"]
    tool["inputs"] = inputs(stack).hash
    tool["router"] = {"url": ROUTER[0], "sha256": ROUTER[1]}
    tool["sources"]["torch_memory_saver"] = TMS[1]
    tool["base"] = {"image": BASE_IMAGE, "digest": ""}
    tool["command"] = f"invoke lock --stack {yaml}"
    (d / "locks" / "pylock.cu13.toml").write_text(render_lock(data))
    return yaml


def stand_ins(work: Path) -> Path:
    """bin/nvidia-smi: a driver for the prerequisite, no GPU for the smoke test (no GPU here)."""
    b = work / "bin"
    b.mkdir(parents=True, exist_ok=True)
    smi = b / "nvidia-smi"
    smi.write_text('#!/bin/sh\n# Test rig only: this host has no GPU and no driver.\n'
                   'case "$*" in *driver_version*) echo 580.159.04; exit 0 ;; esac\nexit 9\n')
    smi.chmod(0o755)
    return b


def base_image(work: Path, python: str) -> None:
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True).returncode == 0:
        print(f"base image {BASE_IMAGE}: present")
        return
    rootfs = work / "rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    t0 = time.time()
    sh(["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", "bookworm", rootfs,
        "http://deb.debian.org/debian"], capture_output=True)
    prefix = Path(python).resolve().parent.parent  # the interpreter's own prefix, copied to the same path
    sh(["mkdir", "-p", f"{rootfs}{prefix.parent}", f"{rootfs}/usr/local/bin"])
    sh(["cp", "-a", prefix, f"{rootfs}{prefix}"])
    sh(["ln", "-sf", f"{prefix}/bin/python3.12", f"{rootfs}/usr/local/bin/python3.12"])
    sh(["cp", "-a", CUDA, f"{rootfs}{CUDA}"])
    sh(["ln", "-sfn", CUDA, f"{rootfs}/usr/local/cuda"])
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    sh(["docker", "import", "--change",
        "ENV PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "--change", "ENV CUDA_HOME=/usr/local/cuda", "-", BASE_IMAGE], stdin=tar.stdout, capture_output=True)
    tar.wait()
    shutil.rmtree(rootfs, ignore_errors=True)
    print(f"base image {BASE_IMAGE}: made in {time.time() - t0:.0f} s")


# --- install ---------------------------------------------------------------------------------

STEP_DONE = re.compile(r"slimeforge: step (?:[0-9]+/[0-9]+ )?(\S+): done in (\d+)s")
COMPILED = re.compile(r"slimeforge: step (?:[0-9]+/[0-9]+ )?(\S+): compiled in (\d+)s")  # a piece compiled side by side


def machine() -> dict[str, object]:
    """What a figure was measured on and beside: the cores and the load average (1, 5, 15 min)."""
    return {"cores": os.cpu_count(), "loadavg": Path("/proc/loadavg").read_text().split()[:3]}


def invoke(args: list[str], env: dict[str, str], log: Path) -> tuple[int, float, str]:
    t0 = time.time()
    with log.open("w") as fh:
        proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "invoke"), *args], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        text = []
        for line in proc.stdout:
            # Each line with the seconds since the command started: where the time went, from the log alone.
            fh.write(f"[{time.time() - t0:7.1f}] {line}")
            fh.flush()
            text.append(line)
            sys.stdout.write(line)
        rc = proc.wait()
    return rc, time.time() - t0, "".join(text)


def run_env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PATH"] = f"{stand_ins(work)}:{env['PATH']}"
    env["SLIMEFORGE_COMPILED_STORE"] = str(work / "store")
    return env


def stamp() -> dict[str, object]:
    """What a result was measured on: the commit (and whether the tree had changes beside it) and
    the real stack's hash. tests/real reuses a result only when all three still hold."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=True).stdout.strip() != ""
    return {"head": head, "dirty": dirty, "stack_hash": load_stack("cu13").hash}


def current(result: dict | None, now: dict) -> bool:
    """A result stands for the code as it is now: it passed, on this commit, from a clean tree
    (a dirty tree's result says nothing about any commit), on this stack."""
    return bool(result) and result.get("rc") == 0 and result.get("stamp") == now and not now["dirty"]


def du(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True,
                              text=True).stdout.split()[0]) if path.exists() else 0


def install(work: Path, results: dict, at_once: int | None = None) -> None:
    stack = work / "stack" / "cu13.yaml"
    prefix = work / "prefix"
    args = ["install", "--stack", str(stack), "--prefix", str(prefix), "--python", find_python()]
    for s in sources():
        args += ["--source", s]
    env = run_env(work)
    if at_once is not None:  # the compiled pieces at most this many at once (1: one after another)
        env["SF_COMPILE_AT_ONCE"] = str(at_once)
    before = machine()
    rc, secs, out = invoke(args, env, work / "install.log")
    steps = {m.group(1): int(m.group(2)) for m in STEP_DONE.finditer(out)}
    results["install"] = {"rc": rc, "seconds": round(secs), "at_once": at_once, "steps": steps, "stamp": stamp(),
                          "before": before,
                          "after": machine(),
                          "compiled": {m.group(1): int(m.group(2)) for m in COMPILED.finditer(out)}}
    if rc != 0:
        raise SystemExit(f"install failed (exit {rc}); log {work / 'install.log'}")
    venv = prefix / "venv"
    check = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "check"], capture_output=True, text=True)
    results["install"]["pip_check"] = (check.stdout + check.stderr).strip()
    applied = (prefix / ".slimeforge" / "patches.applied").read_text().splitlines()
    results["install"]["patches_applied"] = [line.split("\t")[0] + " " + line.split("\t")[3] for line in applied]
    rc2, secs2, out2 = invoke(args, env, work / "install-rerun.log")
    results["install"]["rerun"] = {"rc": rc2, "seconds": round(secs2, 1),
                                   "steps_run": sorted(set(re.findall(r"step (\S+): running", out2)))}
    results["install"]["venv_bytes"] = du(venv)
    results["install"]["prefix_bytes"] = du(prefix)
    results["store"] = {p.name: du(p) for p in sorted((work / "store").iterdir())} if (work / "store").exists() else {}


# --- build -----------------------------------------------------------------------------------


def build(work: Path, results: dict, rebuild: bool = False) -> None:
    args = ["build", "--stack", str(work / "stack" / "cu13.yaml"), *(["--force"] if rebuild else [])]
    if rebuild:
        # Every layer again with the cache mounts (uv, ccache) kept: BuildKit's layer records pruned,
        # not `--no-cache`, which on Docker 20.10's BuildKit also starts every cache mount empty (uv
        # then downloads the lock's 5 GB again: measured, docs/build.md).
        sh(["docker", "builder", "prune", "--force", "--filter", "type=regular"], capture_output=True)
    for s in sources():
        args += ["--source", s]
    before = machine()
    rc, secs, out = invoke(args, run_env(work), work / "build.log")
    results["build"] = {"rc": rc, "seconds": round(secs), "stamp": stamp(), "before": before, "after": machine()}
    if rc != 0:
        raise SystemExit(f"build failed (exit {rc}); log {work / 'build.log'}")
    m = re.search(r"^report (\S+) ", out, re.M)
    report = json.loads(Path(m.group(1)).read_text())
    results["build"].update({"image": report["tag"], "image_bytes": report["size"],
                             "build_seconds": report["build_duration_s"],
                             "compiled": report["compiled"],
                             "steps": {s["name"]: s.get("duration_s") for s in report["steps"]}})
    # The image by layer, directory and duplicate (benchmarks/image_size.py), beside its log.
    from image_size import measure
    from image_size import report as size_report
    try:
        sizes = measure(report["tag"], 15)
    except SystemExit as exc:  # a measurement: its failure is said, the build's result stands
        results["build"]["image_size"] = {"error": str(exc)}
        return
    write_file(work / "image-size.txt", size_report(sizes) + "\n")
    results["build"]["image_size"] = {k: sizes[k] for k in ("files_bytes", "layers_bytes", "hidden_by_later_layers",
                                                            "duplicates_extra", "duplicate_libraries_extra",
                                                            "leftovers")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("phase", choices=["prepare", "install", "build", "all"])
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/slimeforge-real"))
    ap.add_argument("--rebuild", action="store_true",
                    help="build: every layer again, BuildKit's cache mounts (uv, ccache) kept: the store-hit figure "
                         "(`docker builder prune --filter type=regular`, then `invoke build --force`: it prunes every "
                         "layer record of this engine, not only this stack's; `--no-cache` would empty the mounts)")
    ap.add_argument("--at-once", type=int, choices=range(1, 10), metavar="N",
                    help="install: the compiled pieces at most N at once (1: one after another, each with the whole "
                         "host's jobs); default: the host's rule")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    res_file = a.work / "results.json"
    results = json.loads(res_file.read_text()) if res_file.exists() else {}
    if a.phase in ("prepare", "all"):
        print(test_copy(a.work))
        base_image(a.work, find_python())
    try:
        if a.phase in ("install", "all"):
            install(a.work, results, a.at_once)
        if a.phase in ("build", "all"):
            build(a.work, results, a.rebuild)
    finally:
        write_file(res_file, json.dumps(results, indent=2) + "\n")
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
