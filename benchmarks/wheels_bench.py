"""Compiled-wheel store benchmark on a small stack with a real C extension compiled from its sdist
(sfcext from tests/cext_support.py, made heavy with generated C so the compile takes long enough
to time), real Docker Engine, BuildKit, a loopback TLS registry:

1. cold: empty store, `--no-cache` build: the key misses, the wheels-only build compiles sfcext,
   stores it, the image installs it from the store;
2. the entry pushed to the registry; then a fresh builder: an empty store, `--no-cache` again (no
   BuildKit layer of either build is reused), the key pulled from the registry, nothing compiled.

Figures: the compiled step cold (compile in the wheels-only build + install in the image) vs from the
store (pull + install; target < 10 % of cold), and the whole build both ways (wall time of build()).

Run from the repository root:  python benchmarks/wheels_bench.py [--heavy N]
Prints a JSON object. Images it makes are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from build_support import remove_tags  # noqa: E402
from cext_support import STACK, serve_index  # noqa: E402
from publish_support import LocalRegistry  # noqa: E402

from slimeforge.image.builder.build import BuildOptions, build  # noqa: E402
from slimeforge.image.builder.buildkit import parse_progress  # noqa: E402
from slimeforge.image.lock.uvlock import LockOptions, resolve  # noqa: E402
from slimeforge.image.remote.registry import Credentials  # noqa: E402
from slimeforge.image.wheels import wheelstore  # noqa: E402

REPO = f"slimeforge-wheels-bench/sfcext-{os.getpid()}"


def step_log(build_log: str, step: str) -> str:
    """The lines BuildKit printed for one stack step's RUN."""
    vid = next(m.group(1) for m in re.finditer(r"^#(\d+) \[[^\]]*\] RUN "
                                               r".*?/opt/slimeforge/sf " + re.escape(step) + " ", build_log, re.M))
    return "\n".join(line for line in build_log.splitlines() if line.startswith(f"#{vid} "))


def step_seconds(log: Path, step: str) -> float:
    return sum(s["duration_s"] or 0.0 for s in parse_progress(log.read_text().splitlines()) if s["name"] == step)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heavy", type=int, default=6000, help="generated C functions in sfcext (compile time)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="slimeforge-wheels-bench-"))
    password = os.urandom(8).hex()
    reg = LocalRegistry(root / "registry", {"bench": password}).start()
    creds = Credentials("bench", password, "bench")
    out: dict = {"heavy_functions": args.heavy}
    try:
        with serve_index(root / "index", heavy=args.heavy) as index:
            stack = root / "sfcext.yaml"
            stack.write_text(STACK.format(archs='["9.0"]', index=index))
            resolve(LockOptions(stack=str(stack), echo=lambda s: None))

            def run(store: str, **kw) -> tuple[dict, float]:
                t = time.monotonic()
                report = build(BuildOptions(stack=str(stack), build_root=root / "out", repository=REPO, force=True,
                                            no_cache=True,
                                            store_root=root / store, echo=lambda s: None, **kw))
                return report, time.monotonic() - t

            cold, t_cold = run("store-cold")
            key = cold["compiled"]["sfcext"]["key"]
            compile_s = step_seconds(Path(cold["compiled"]["sfcext"]["log"]), "sfcext")
            install_cold_s = step_seconds(Path(cold["dir"]) / "build.log", "sfcext")
            t = time.monotonic()
            wheelstore.push(key, reg.host, creds, root / "store-cold", echo=lambda s: None)
            push_s = time.monotonic() - t
            # The image push made stays local; a fresh builder has only the registry's copy.
            subprocess.run(["docker", "rmi", str(wheelstore.remote_ref(reg.host, key))], capture_output=True,
                           check=True)

            t = time.monotonic()
            wheelstore.pull(key, reg.host, creds, root / "store-fresh", echo=lambda s: None)
            pull_s = time.monotonic() - t
            shutil.rmtree(root / "store-fresh")  # the build below pulls it itself: a fresh builder
            warm, t_warm = run("store-fresh", wheel_registry=reg.host, wheel_credentials=creds)
            assert warm["compiled"]["sfcext"]["source"] == "registry", warm["compiled"]
            install_store_s = step_seconds(Path(warm["dir"]) / "build.log", "sfcext")
            log = step_log((Path(warm["dir"]) / "build.log").read_text(), "sfcext")
            assert "built: sfcext" not in log and "from the store" in log
            entry = wheelstore.lookup(key, root / "store-fresh")
            step_cold = compile_s + install_cold_s
            step_store = pull_s + install_store_s
            out.update({
                "key": key,
                "wheel_bytes": entry.size if entry else None,
                "compiled_step_cold_s": round(step_cold, 2),
                "cold_compile_in_wheels_build_s": round(compile_s, 2),
                "cold_install_in_image_s": round(install_cold_s, 2),
                "compiled_step_from_store_s": round(step_store, 2),
                "store_pull_from_registry_s": round(pull_s, 2),
                "store_install_in_image_s": round(install_store_s, 2),
                "store_share_of_cold_pct": round(100 * step_store / step_cold, 1) if step_cold else None,
                "push_s": round(push_s, 2),
                "whole_build_cold_s": round(t_cold, 2),
                "whole_build_from_store_s": round(t_warm, 2),
                # The store build's compiled step: no compiler, no sdist build in its log.
                "no_compile_in_store_step": not re.search(r"gcc|built: sfcext|Building", log),
            })
    finally:
        reg.stop()
        remove_tags(REPO, f"{reg.host}/")
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
