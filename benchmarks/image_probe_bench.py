"""What the preflight of an image slimeforge did not build costs: slimeforge's probe run inside it
(a container with the image's python3, slime's parsers imported there), then the same from the
cache by the image's ID.

    .venv/bin/python benchmarks/image_probe_bench.py [--repeat 5]

It also times what planning a container-mode run of that image costs (`invoke run --dry-run
--image`'s resolve + plan: the image probed for its layout, run/layout.py, from the cache) against
the same plan without the probe (slimeforge's layout, as before the layout existed).

The image is the tests' layout of slime's official one, built here FROM the test base
(slimeforge-test/base:bookworm; the test suite's `base_image` fixture makes it): the stand-in slime
(tests/flag_standin.py: slime's parser structure) at /root/slime, the stand-in Megatron at
/root/Megatron-LM, no /opt/slimeforge. A real slime image imports torch while building its
parsers: expect seconds more on the first probe there, nothing more on a cached one. The cache is a
temporary SLIMEFORGE_CACHE_DIR, cleared before each uncached round.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import flag_standin as fs  # noqa: E402
import yaml  # noqa: E402
from launch_support import make_recipe  # noqa: E402

BASE = "slimeforge-test/base:bookworm"
TAG = "slimeforge-bench/foreign-slime:probe"


def build_image(work: Path) -> None:
    fs.write(work / "slime", fs.slime_files(inline_megatron=False))
    fs.write(work / "Megatron-LM", fs.MEGATRON_FILES)
    (work / "Dockerfile").write_text(f"FROM {BASE}\nCOPY slime /root/slime\nCOPY Megatron-LM /root/Megatron-LM\n")
    # Debian's docker client runs BuildKit without buildx (DESIGN.md).
    subprocess.run(["/usr/bin/docker", "build", "-q", "-t", TAG, str(work)], check=True, capture_output=True,
                   env={**os.environ, "DOCKER_BUILDKIT": "1"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    opts = ap.parse_args()
    if subprocess.run(["docker", "image", "inspect", BASE], capture_output=True).returncode != 0:
        sys.exit(f"no {BASE}: run the docker tests once (their base_image fixture builds it)")
    with tempfile.TemporaryDirectory(prefix="sf-probe-bench-") as tmp:
        os.environ["SLIMEFORGE_CACHE_DIR"] = str(Path(tmp) / "cache")
        build_image(Path(tmp))
        from slimeforge.run.imageprobe import cache_dir, image_facts

        cold, warm, planned, plain = [], [], [], []
        recipe_file = Path(tmp) / "recipe.yaml"
        recipe_file.write_text(yaml.safe_dump(make_recipe(Path(tmp) / "r", mode="container", slime_dir="/root/slime",
                                                          megatron_dir="/root/Megatron-LM")))
        try:
            for _ in range(opts.repeat):
                shutil.rmtree(cache_dir(), ignore_errors=True)
                t0 = time.monotonic()
                facts = image_facts(TAG, "/root/slime", "/root/Megatron-LM")
                cold.append(time.monotonic() - t0)
                assert not facts.cached and facts.catalog is not None, facts
                t0 = time.monotonic()
                again = image_facts(TAG, "/root/slime", "/root/Megatron-LM")
                warm.append(time.monotonic() - t0)
                assert again.cached and again.catalog == facts.catalog
                planned.append(plan_seconds(recipe_file, Path(tmp) / "run", probe=True))
                plain.append(plan_seconds(recipe_file, Path(tmp) / "run", probe=False))
        finally:
            subprocess.run(["docker", "image", "rm", TAG], capture_output=True)
    print(f"flag catalog of {len(facts.catalog.flags)} options from slime's parsers in the image, {opts.repeat} "
          "rounds:")
    print(f"  probed (a container):        median {statistics.median(cold):.2f} s (min {min(cold):.2f}, max "
          f"{max(cold):.2f})")
    print(f"  cached by the image's ID:    median {statistics.median(warm) * 1000:.0f} ms (min "
          f"{min(warm) * 1000:.0f}, max {max(warm) * 1000:.0f};"
          " one `docker image inspect`)")
    print("  plan of a container run (resolve + plan, a dry run):")
    print(f"    for the image's layout:    median {statistics.median(planned) * 1000:.0f} ms (min "
          f"{min(planned) * 1000:.0f}, max {max(planned) * 1000:.0f};"
          " the probe's answer cached)")
    print(f"    without the probe:         median {statistics.median(plain) * 1000:.0f} ms (min "
          f"{min(plain) * 1000:.0f}, max {max(plain) * 1000:.0f})")
    return 0


def plan_seconds(recipe_file: Path, out: Path, *, probe: bool) -> float:
    """Seconds to plan `invoke run RECIPE --image TAG --dry-run` (no file written, nothing run)."""
    from slimeforge.run import launch

    req = launch.LaunchRequest(recipe=str(recipe_file), image=TAG, out=str(out))
    t0 = time.monotonic()
    target, run = launch.resolve(req, dry_run=True, probe_image=probe)
    target.plan(run)
    seconds = time.monotonic() - t0
    assert run.layout.name == ("image" if probe else "slimeforge"), run.layout
    return seconds


if __name__ == "__main__":
    sys.exit(main())
