"""Time a no-op re-publish: `invoke publish` of an image the registry already holds.

Starts a local TLS registry with htpasswd auth (tests/publish_support.py), builds a small image on
the test base (slimeforge-test/base:bookworm, made by the test suite's `base_image` fixture),
publishes it once, then times `--runs` re-publishes of the unchanged image, each a fresh CLI
process as a user would run it (the time includes Python start-up and imports).

    python benchmarks/publish_noop.py --runs 5
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from publish_support import LocalRegistry  # noqa: E402

BASE = "slimeforge-test/base:bookworm"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    import docker

    client = docker.from_env()
    client.images.get(BASE)  # raises if missing: run the test suite once (its base_image fixture makes it)
    password = uuid.uuid4().hex
    marker = uuid.uuid4().hex
    repo, tag = "slimeforge-bench/cu13", marker[:12]
    image, _ = client.images.build(fileobj=io.BytesIO(f"FROM {BASE}\nRUN echo {marker} > /bench\n".encode()),
                                   tag=f"{repo}:{tag}")
    with tempfile.TemporaryDirectory(prefix="slimeforge-bench-") as tmp:
        registry = LocalRegistry(Path(tmp) / "registry", {"bench": password}).start()
        try:
            build = Path(tmp) / "build" / f"cu13-{tag}"
            build.mkdir(parents=True)
            (build / "report.json").write_text(json.dumps({"tag": f"{repo}:{tag}",
                                                           "human_tags": [f"{repo}:2026.11.1-cu13"],
                                                           "image_id": image.id, "digest": None}))
            (build / "stack.lock.json").write_text(json.dumps({"stack": "cu13", "digest": None}))
            argv = [sys.executable, "-m", "invoke", "publish", "--cuda", "cu13", "--build-dir", str(build.parent),
                    "--registry", f"{registry.host}/bench/cu13", "--username", "bench", "--password-env",
                    "BENCH_PASSWORD"]
            env = {**os.environ, "BENCH_PASSWORD": password}
            start = time.perf_counter()
            first = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
            print(f"first publish: {time.perf_counter() - start:.2f} s ({first.stdout.splitlines()[-1]})")
            times = []
            for _ in range(args.runs):
                start = time.perf_counter()
                out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
                times.append(time.perf_counter() - start)
                assert "nothing to push" in out.stdout, out.stdout
            print(f"no-op re-publish ({args.runs} runs, 2 tags): median {statistics.median(times):.3f} s, "
                  f"min {min(times):.3f} s, max {max(times):.3f} s")
            print("command: " + " ".join(argv[1:]).replace(str(build.parent), "<build root>"))
        finally:
            registry.stop()
            client.api.remove_image(image.id, force=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
