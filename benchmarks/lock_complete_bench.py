"""Time `invoke lock --complete`: filling the two outside facts of a lock made where neither could
be reached (the router wheel's sha256, the base image's digest), without resolving again.

Everything is on loopback: a PEP 503/691 index (tests/lock_support.py) serving the test stack's
packages and a router wheel of --router-mib MiB, and a TLS registry with htpasswd auth
(tests/publish_support.py) holding the base image. Each run restores the lock as it was made,
then runs the CLI in a fresh process, as a user would (Python start-up and imports included);
the in-process time of `lockfacts.complete` is given too.

    python benchmarks/lock_complete_bench.py --runs 5 --router-mib 16
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from lock_support import Index, make_wheel, push_tiny_image, router_stack  # noqa: E402
from publish_support import LocalRegistry  # noqa: E402

from slimeforge.image.lock import lockfacts, lockfile, uvlock  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--router-mib", type=int, default=16,
                    help="size of the router wheel (slime's sgl-router is about that)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sf-complete-bench-") as tmp:
        work = Path(tmp)
        os.environ["UV_CACHE_DIR"] = str(work / "uv-cache")
        index = Index(work / "index")
        for name in ("sf-base", "sf-dep", "sf-extra", "sf-kern-cu13"):
            index.add(name, "1.0")
        index.add("sf-kern", "1.0", ["sf-kern-cu13==1.0"])
        index.add("sf-app", "1.0", ["sf-base>=1.0", "sf-dep", "sf-extra", "sf-kern"])
        index.start()
        reg = LocalRegistry(work / "registry", {"puller": "pull-pass-1"})
        config = work / "docker-config"
        config.mkdir()
        auth = base64.b64encode(b"puller:pull-pass-1").decode()
        (config / "config.json").write_text(json.dumps({"auths": {reg.host: {"auth": auth}}}))
        os.environ["DOCKER_CONFIG"] = str(config)
        router_url = f"{index.url.removesuffix('/simple')}/router/sf_router-0.3.2-py3-none-any.whl"
        path = router_stack(work / "s", f"{reg.host}/sf/base:v1", router_url)
        # Locked while neither answers: the registry is not started, the wheel not yet there.
        uvlock.resolve(uvlock.LockOptions(stack=str(path), index_url=index.url, echo=lambda _: None))
        lock_path = lockfile.load_lock(str(path)).path
        made = lock_path.read_text()
        make_wheel(index.root / "router", "sf-router", "0.3.2",
                   payload=f"BLOB = {os.urandom(args.router_mib << 19).hex()!r}\n")
        size = (index.root / "router" / "sf_router-0.3.2-py3-none-any.whl").stat().st_size
        reg.start()
        try:
            push_tiny_image(reg, "sf/base", "v1", "puller", "pull-pass-1")
            cli, inproc = [], []
            for _ in range(args.runs):
                lockfile.write_lock(lock_path, made)
                started = time.monotonic()
                res = subprocess.run([sys.executable, "-m", "invoke", "lock", "--stack", str(path), "--complete"],
                                     cwd=ROOT,
                                     capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
                cli.append(time.monotonic() - started)
                if res.returncode != 0:
                    raise SystemExit(f"invoke lock --complete failed:\n{res.stdout}\n{res.stderr}")
                lockfile.write_lock(lock_path, made)
                started = time.monotonic()
                filled = lockfacts.complete(str(path), echo=lambda _: None)["filled"]
                inproc.append(time.monotonic() - started)
                assert filled == ["base_digest", "router_sha256"], filled
        finally:
            reg.stop()
            index.stop()
    print(f"invoke lock --complete (router wheel {size / 2**20:.1f} MiB over loopback HTTP, base digest from a "
          "loopback TLS registry "
          f"with auth), {args.runs} runs")
    print(f"  CLI (fresh process):  median {statistics.median(cli):.2f} s  min {min(cli):.2f} s  max {max(cli):.2f} s")
    print(f"  lockfacts.complete:     median {statistics.median(inproc):.3f} s  min {min(inproc):.3f} s  max "
          f"{max(inproc):.3f} s")


if __name__ == "__main__":
    main()
