"""Figures for the cu13 lock: how long `invoke lock --cuda cu13` takes (cold: an empty uv cache;
warm: the cache of the cold run), whether it reproduces the committed file byte for byte, how long
`invoke lock --check --cuda cu13` takes (the CLI, as CI runs it), and what the lock holds.

    .venv/bin/python benchmarks/lock_bench.py [--skip-cold] [--checks N]

Needs PyPI (the resolutions); the check is offline. Writes nothing under images/: the
resolutions go to a temporary directory.
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
sys.path.insert(0, str(ROOT))

from slimeforge.image.lock import lockcheck, lockfile, lockinputs, uvlock  # noqa: E402
from slimeforge.image.stack import load_stack  # noqa: E402


def timed_lock(out: Path, cache: Path, committed: Path) -> float:
    """A re-lock of the committed file, as `invoke lock --cuda cu13` in the repository does: the lock it
    replaces is the committed one (its cutoff and versions are reused while the inputs are unchanged)."""
    os.environ["UV_CACHE_DIR"] = str(cache)
    shutil.copyfile(committed, out)
    started = time.monotonic()
    uvlock.resolve(uvlock.LockOptions(stack="cu13", out=out, echo=lambda _: None))
    return time.monotonic() - started


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-cold", action="store_true",
                    help="only the warm resolution (the cold one downloads metadata)")
    ap.add_argument("--checks", type=int, default=5)
    args = ap.parse_args()
    committed = lockfile.lock_path("cu13")
    with tempfile.TemporaryDirectory(prefix="sf-lock-bench-") as tmp:
        cache = Path(tmp) / "uv-cache"
        out = Path(tmp) / "pylock.cu13.toml"
        if not args.skip_cold:
            print(f"invoke lock --cuda cu13, cold uv cache: {timed_lock(out, cache, committed):.1f} s")
        print(f"invoke lock --cuda cu13, warm uv cache: {timed_lock(out, cache, committed):.1f} s")
        same = out.read_text() == committed.read_text()
        print(f"re-lock equals the committed {committed.relative_to(ROOT)}: {same}")
    times = []
    for _ in range(args.checks):
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "invoke", "lock", "--check", "--cuda", "cu13"], cwd=ROOT, check=True,
                       capture_output=True)
        times.append(time.monotonic() - started)
    print(f"invoke lock --check --cuda cu13 (CLI, {args.checks} runs): median {statistics.median(times):.2f} s, "
          f"min {min(times):.2f} s")
    stack = load_stack("cu13")
    lock = lockfile.load_lock("cu13", stack)
    s = lockcheck.summarize(lock, stack)
    named = {lockinputs.req_name(r) for r in lockinputs.inputs(stack).requirements}
    print(f"distributions in the lock: {s['packages']} ({sum(1 for n in lock.packages if n in named)} named by the "
          "stack, "
          f"{sum(1 for n in lock.packages if n not in named)} fixed only by the lock); sdists built: "
          f"{', '.join(s['sdists'])}")
    print("distributions of the cu13 set not fixed by the lock: "
          f"{len([p for p in lock.packages.values() if not p.sha256])}")
    print(f"total download size: {s['bytes'] / 1e9:.2f} GB ({s['bytes']} bytes); largest: "
          + ", ".join(f"{p.name} {p.size / 1e9:.2f} GB" for p in sorted(lock.packages.values(),
                                                                        key=lambda p: -(p.size or 0))[:4]))
    print(f"steps: {len(lock.steps)}; pre-releases allowed: {s['prereleases']}")


if __name__ == "__main__":
    main()
