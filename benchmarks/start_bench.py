"""CPU time a command costs before it does anything: `--help`, `--list` and a dry run, through
`invoke` in the checkout and the installed `slimeforge` command (issue 42: a dry run at most
0.6 CPU-seconds, `--help` at most 0.3).

    python benchmarks/start_bench.py [--runs 10] [--no-bytecode]

Each run is a fresh process, as a user types it; its user+sys CPU seconds are the difference of
getrusage(RUSAGE_CHILDREN) around it. CPU time, not wall time: on a busy host the wall time is the
CPU time plus the wait for a core. A loaded host still inflates CPU time (shared caches, SMT
siblings), so the minimum is the figure to compare; the median shows the spread.

Bytecode: the runs write and read __pycache__ as an installed package does (pip compiles it at
install time). PYTHONDONTWRITEBYTECODE is removed from the children's environment: with it every
run compiles every module again and costs about twice as much (`--no-bytecode` measures that case:
no bytecode read or written, as with PYTHONDONTWRITEBYTECODE=1 and no __pycache__). The first run
of each command is a warm-up, not counted.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RECIPE = ROOT / "recipes" / "gsm8k.yaml"
LIMITS = {"help": 0.3, "dry run": 0.6}  # CPU-seconds (issue 42, item 2)


def cpu_seconds(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        sys.exit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stderr}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--no-bytecode", action="store_true",
                        help="compile every module on every run (no __pycache__ read or written)")
    opts = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    with tempfile.TemporaryDirectory() as tmp:
        if opts.no_bytecode:  # bytecode looked for in an empty directory, and never written there
            env.update(PYTHONDONTWRITEBYTECODE="1", PYTHONPYCACHEPREFIX=f"{tmp}/no-pycache")
        empty = Path(tmp) / "elsewhere"  # the slimeforge command's runs: from a directory that holds only the recipe
        empty.mkdir()
        shutil.copy(RECIPE, empty / RECIPE.name)
        cases = [
            ("help", "invoke --help", [str(BIN / "invoke"), "--help"], ROOT),
            ("help", "invoke --list", [str(BIN / "invoke"), "--list"], ROOT),
            ("dry run", "invoke run recipes/gsm8k.yaml --dry-run", [str(BIN / "invoke"), "run", "recipes/gsm8k.yaml",
                                                                    "--dry-run", "--out",
                                                                   f"{tmp}/run"], ROOT),
        ]
        if (BIN / "slimeforge").exists():
            cases += [
                ("help", "slimeforge --help", [str(BIN / "slimeforge"), "--help"], empty),
                ("help", "slimeforge run --help", [str(BIN / "slimeforge"), "run", "--help"], empty),
                ("dry run", "slimeforge run gsm8k.yaml --dry-run", [str(BIN / "slimeforge"), "run", "gsm8k.yaml",
                                                                    "--dry-run"], empty),
            ]
        else:
            print(f"(no {BIN / 'slimeforge'}: install the package to measure the slimeforge command)")
        print(f"CPU seconds (user+sys) per command, {opts.runs} runs each after one warm-up"
              f"{', no bytecode' if opts.no_bytecode else ''}; limit: help {LIMITS['help']}, dry run "
              f"{LIMITS['dry run']}")
        for kind, name, argv, cwd in cases:
            cpu_seconds(argv, cwd, env)  # warm-up: bytecode written
            times = [cpu_seconds(argv, cwd, env) for _ in range(opts.runs)]
            verdict = "ok" if min(times) <= LIMITS[kind] else "OVER"
            print(f"  {name:<42} min {min(times):.3f}  median {statistics.median(times):.3f}  ({kind} limit "
                  f"{LIMITS[kind]}: {verdict})")


if __name__ == "__main__":
    main()
