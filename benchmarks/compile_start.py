"""Seconds from a compiled piece's build start to its first compile: `pip wheel` against build_wheel.py.

    python benchmarks/compile_start.py --sources DIR --work /tmp/probe --out START.json [--repeat 2]

Each run unpacks the piece afresh (apex, Transformer Engine's torch extension: compile_bench.py's
PIECES and archives) and builds it with compiler wrappers as CXX and PYTORCH_NVCC that write the time
of the first compile (`-c`) and fail it, so the build stops there; anything else (torch's compiler
checks) runs the real compiler. What it measures is everything before the first compile: pip, the
backend's hooks, setup.py's imports (torch) and probes (nvcc). Also the seconds of `import torch` in a
fresh process, twice. Run on the GPU build host (torch and the CUDA toolkit installed), nothing beside.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compile_bench import BUILD_WHEEL, PIECES, nvidia_include_dirs  # noqa: E402

STAMP = """#!/bin/bash
for a in "$@"; do if [[ $a == -c ]]; then date +%s.%N >>"$PROBE_FILE"; exit 1; fi; done
exec {real} "$@"
"""


def first_compile(front: str, piece: str, sources: Path, work: Path, wrappers: Path) -> float | None:
    pattern, env_piece = PIECES[piece]
    (archive,) = sorted(sources.glob(pattern))
    d = Path(work / f"{front}-{piece}-{time.monotonic_ns()}")
    d.mkdir(parents=True)
    with tarfile.open(archive) as t:
        t.extractall(d, filter="data")
    (src,) = [p for p in d.iterdir() if p.is_dir()]
    stamp = d / "stamp"
    env = {**os.environ, **env_piece, "MAX_JOBS": "64", "APEX_PARALLEL_BUILD": "16", "PROBE_FILE": str(stamp),
           "CXX": str(wrappers / "g++"), "PYTORCH_NVCC": str(wrappers / "nvcc")}
    if piece == "te":
        env["CPATH"] = ":".join(nvidia_include_dirs())
    cmd = ([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--no-build-isolation", "--no-deps",
            "--no-index", "--wheel-dir", str(d / "wheels"), str(src)] if front == "pip" else
           [sys.executable, str(BUILD_WHEEL), "--wheel-dir", str(d / "wheels"), "--", str(src)])
    t0 = time.time()
    with open(d / "log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    while not stamp.exists() and proc.poll() is None and time.time() - t0 < 120:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return round(float(stamp.read_text().split()[0]) - t0, 2) if stamp.exists() else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sources", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    wrappers = args.work / "bin"
    wrappers.mkdir(parents=True)
    for name, real in (("g++", shutil.which("g++")), ("nvcc", shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")):
        (wrappers / name).write_text(STAMP.format(real=real))
        (wrappers / name).chmod(0o755)
    result: dict = {"import_torch_s": []}
    for _ in range(2):
        t = time.time()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        result["import_torch_s"].append(round(time.time() - t, 2))
    runs = []
    for n in range(args.repeat):
        for front in ("pip", "build_wheel"):
            for piece in ("apex", "te"):
                runs.append({"front_end": front, "piece": piece, "n": n,
                             "first_compile_s": first_compile(front, piece, args.sources, args.work, wrappers)})
                print(runs[-1], flush=True)
    result["runs"] = runs
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all(r["first_compile_s"] is not None for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
