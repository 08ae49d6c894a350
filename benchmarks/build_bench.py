"""Build benchmarks on the small test stack (real Docker Engine, BuildKit, PyPI):

1. full build time (--no-cache) of the test stack;
2. rebuild after changing only the last source (a new slime commit), as a share of (1)  (target < 20 %);
3. no-op `invoke build` of an already built stack, wall time of the CLI  (target < 3 s);
4. image size with the cache hygiene (BuildKit cache mounts for uv/pip) and without it (the same
   Dockerfile with the cache mounts removed, so the package caches stay in the layers).

Run from the repository root:  python benchmarks/build_bench.py
Prints a JSON object with the figures. Images it builds are removed at the end (by id).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import build_support as bs  # noqa: E402

from slimeforge.image.builder.build import BuildOptions, build, docker_cli  # noqa: E402

REPO = f"slimeforge-build-bench/sftest-{os.getpid()}"


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="slimeforge-build-bench-"))
    repos = bs.make_repos(root / "repos")
    made: list[str] = []
    sources = [f"slime={repos['slime']}", f"libdemo={repos['libdemo']}"]

    def run(stack: Path, **kw) -> tuple[dict, float]:
        t = time.monotonic()
        built = build(BuildOptions(stack=str(stack), sources=sources, build_root=root / "out", repository=REPO,
                                   echo=lambda s: None, **kw))
        report = built.to_json()  # report.json's keys (build() returns the BuildReport)
        made.append(report["image_id"])
        return report, time.monotonic() - t

    try:
        full, t_full = run(bs.TEST_STACK, no_cache=True, force=True)
        # A new commit of the last source only (a fresh commit on a branch from S1).
        fresh = _fresh_commit(repos["slime"])
        last, t_last = run(bs.derived_stack(root / "fresh.yaml", fresh))
        noop_times = []
        for _ in range(3):
            t = time.monotonic()
            subprocess.run([sys.executable, "-m", "invoke", "build", "--stack", str(root / "fresh.yaml"),
                            "--repository", REPO,
                            "--source", sources[0], "--source", sources[1]], cwd=ROOT, check=True, capture_output=True)
            noop_times.append(time.monotonic() - t)
        size_with = full["size"]
        size_without, plain_id = _size_without_cache_mounts(Path(full["dir"]), full["command"])
        made.append(plain_id)
        base_size = _size("slimeforge-test/base:bookworm")
        print(json.dumps({
            "full_build_s": round(t_full, 2),
            "last_source_rebuild_s": round(t_last, 2),
            "last_source_rebuild_share": round(t_last / t_full, 3),
            "last_source_rebuild_cache_hits": f"{last['cache']['hits']}/{last['cache']['steps']}",
            "noop_invoke_build_s": [round(x, 2) for x in noop_times],
            "image_size_mb_with_cache_mounts": round(size_with / 1e6, 1),
            "image_size_mb_without_cache_mounts": round(size_without / 1e6, 1),
            "base_image_size_mb": round(base_size / 1e6, 1),
            "added_by_steps_mb": {"with_cache_mounts": round((size_with - base_size) / 1e6, 1),
                                  "without_cache_mounts": round((size_without - base_size) / 1e6, 1)},
        }, indent=2))
    finally:
        refs = subprocess.run(["docker", "images", REPO, "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True,
                              text=True).stdout.split()
        subprocess.run(["docker", "rmi", *refs, *made[-1:]],
                       capture_output=True)  # our tags, and the untagged no-cache-mounts image


def _fresh_commit(slime: Path) -> str:
    env = {**os.environ, **bs.GIT_ENV}
    subprocess.run(["git", "-C", str(slime), "checkout", "-q", "-b", "bench", bs.SLIME_S1], check=True, env=env)
    (slime / "slime" / "bench.py").write_text(f"NONCE = {time.time_ns()}\n")
    subprocess.run(["git", "-C", str(slime), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(slime), "commit", "-q", "-m", "bench"], check=True, env=env)
    return subprocess.run(["git", "-C", str(slime), "rev-parse", "HEAD"], check=True, env=env, capture_output=True,
                          text=True).stdout.strip()


def _size(ref: str) -> int:
    return int(subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", ref], capture_output=True,
                              text=True, check=True).stdout)


def _size_without_cache_mounts(build_dir: Path, argv: list[str]) -> tuple[int, str]:
    """The same Dockerfile with every `--mount=type=cache` removed: pip/uv caches stay in the layers."""
    text = (build_dir / "Dockerfile").read_text()
    plain = re.sub(r"--mount=type=cache,[^ ]+ \\\n\s*", "", text)
    assert "type=cache" not in plain
    path = build_dir / "Dockerfile.no-cache-mounts"
    path.write_text(plain)
    iid = build_dir / "image.no-cache-mounts.id"
    cmd = [docker_cli(), "build", "--no-cache", "-q", "--iidfile", str(iid), "-f", str(path)]
    i = 0
    while i < len(argv):  # keep the build args and the CA secret of the real build
        if argv[i] in ("--build-arg", "--secret"):
            cmd += argv[i:i + 2]
            i += 2
        else:
            i += 1
    cmd.append(str(build_dir / "context"))
    subprocess.run(cmd, env={**os.environ, "DOCKER_BUILDKIT": "1"}, check=True, capture_output=True)
    image_id = iid.read_text().strip()
    return _size(image_id), image_id


if __name__ == "__main__":
    main()
