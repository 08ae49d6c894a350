"""What validating hostile input costs, and that it is bounded.

    python benchmarks/hostile_bench.py [--runs 5] [--root CHECKOUT] [--fuzz]

* `invoke run recipes/gsm8k.yaml --dry-run` wall time, fresh process each run (min / median / max),
  in this checkout or another one (`--root`, e.g. an export of main, to compare);
* in-process time to refuse inputs that once hung or ate memory: a YAML alias bomb (10^10 values
  once expanded), 5,000 levels of nesting, num_gpus = 10^12, an extends chain of 40 files, and a
  file of the largest accepted size in PyYAML's costliest shape (one long flow list);
* with --fuzz: wall time of the property-based tests (tests/unit/hostile/test_fuzz.py) as CI
  runs them.
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
sys.path.insert(0, str(ROOT / "tests"))


def dry_run(root: Path, runs: int) -> list[float]:
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "invoke", "run", "recipes/gsm8k.yaml", "--dry-run", "--out",
                            f"{tmp}/run{i}"],
                           cwd=root, check=True, capture_output=True)
            times.append(time.perf_counter() - start)
    return times


def refusals(runs: int) -> dict[str, list[float]]:
    import yaml
    from helpers import SEED_RECIPE

    from slimeforge.errors import ConfigError
    from slimeforge.run.recipecheck import load_recipe

    bomb = "a: &a [x,x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(9))
    cases = {
        "alias bomb (10^10 values expanded)": bomb,
        "5,000 levels of nesting": "x: " + "[" * 5000 + "]" * 5000 + "\n",
        "num_gpus = 10^12": yaml.safe_dump({**SEED_RECIPE, "num_gpus": 10**12, "tp_size": 7}),
        "64 KiB flow list (the costliest accepted size)": ("x: [" + "a," * 40000)[: (64 << 10) - 2] + "]\n",
    }
    out: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(40):
            Path(tmp, f"chain{i}.yaml").write_text(f"extends: chain{i + 1}.yaml\n" if i < 39 else "exp_id: x\n")
        paths = {"extends chain of 40 files": Path(tmp, "chain0.yaml")}
        for name, text in cases.items():
            paths[name] = Path(tmp, f"{len(paths)}.yaml")
            paths[name].write_text(text)
        for name, path in paths.items():
            out[name] = []
            for _ in range(runs):
                start = time.perf_counter()
                try:
                    load_recipe(path)
                except ConfigError:
                    pass
                else:
                    raise SystemExit(f"{name}: was accepted")
                out[name].append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose dry run is timed")
    parser.add_argument("--fuzz", action="store_true", help="also time the property-based tests")
    opts = parser.parse_args()
    t = dry_run(opts.root, opts.runs)
    print(f"invoke run recipes/gsm8k.yaml --dry-run ({opts.root}), {opts.runs} runs: "
          f"min {min(t):.3f} s, median {statistics.median(t):.3f} s, max {max(t):.3f} s")
    for name, times in refusals(opts.runs).items():
        print(f"refused: {name}: median {statistics.median(times) * 1000:.1f} ms, max {max(times) * 1000:.1f} ms")
    if opts.fuzz:
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "tests/unit/hostile/test_fuzz.py"],
                              cwd=ROOT, capture_output=True, text=True)
        took = time.perf_counter() - start
        print(f"fuzz tests (CI settings): {proc.stdout.strip().splitlines()[-1]} in {took:.1f} s wall")


if __name__ == "__main__":
    main()
