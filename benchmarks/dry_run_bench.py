"""Wall time of `invoke run recipes/gsm8k.yaml --dry-run` (target: under 1 s).

    python benchmarks/dry_run_bench.py [--runs 10]

Each run is a fresh process, as a user types it; prints min / median / max.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    opts = parser.parse_args()
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(opts.runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "invoke", "run", "recipes/gsm8k.yaml", "--dry-run", "--out",
                            f"{tmp}/run{i}"],
                           cwd=ROOT, check=True, capture_output=True)
            times.append(time.perf_counter() - start)
    print(f"invoke run recipes/gsm8k.yaml --dry-run, {opts.runs} runs: "
          f"min {min(times):.3f} s, median {statistics.median(times):.3f} s, max {max(times):.3f} s")


if __name__ == "__main__":
    main()
