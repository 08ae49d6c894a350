"""Issue 33's hosts-side corpus (tests/hosts_hostile.py): each case's outcome and the counts per class.

    python benchmarks/hostile_hosts.py [--rows] [--cost]
    PYTHONPATH=/path/to/an/older/checkout python benchmarks/hostile_hosts.py   # the "before" of a change

The node agent runs as cluster.up sends it (python3 - COMMAND JSON, 10 s watchdog) on a state
directory whose record is hostile, beside a `sleep 300` the record names; inventories load with a
5 s watchdog. The asserting test is tests/unit/hostile/test_hosts_hostile.py.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "tests"))

import hosts_hostile as hh  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", action="store_true", help="print every case's outcome too")
    ap.add_argument("--cost", action="store_true",
                    help="also time the node agent's record reader per file (median and worst)")
    args = ap.parse_args()
    if args.cost:
        cost()
    with tempfile.TemporaryDirectory() as tmp:
        rows = hh.table(Path(tmp))
    if args.rows:
        for kind, klass, case, outcome, detail in rows:
            print(f"{kind:<9} {klass:<28} {case:<28} {outcome:<13} {detail[:100]}")
        print()
    outcomes = [*hh.GOOD, *hh.WRONG]
    counts = collections.Counter((klass, outcome) for _, klass, _, outcome, _ in rows)
    classes = list(dict.fromkeys(klass for _, klass, *_ in rows))
    print(f"| class | cases | {' | '.join(outcomes)} |")
    print(f"|---|---|{'---|' * len(outcomes)}")
    for klass in classes:
        print(f"| {klass} | {sum(counts[klass, o] for o in outcomes)} | "
              f"{' | '.join(str(counts[klass, o]) for o in outcomes)} |")
    print(f"| all | {len(rows)} | {' | '.join(str(sum(counts[k, o] for k in classes)) for o in outcomes)} |")
    import slimeforge

    print(f"\n(slimeforge from {Path(slimeforge.__file__).parent})")


def cost(reps: int = 300) -> None:
    """hostrecord.read_record per file: a record the agent wrote, and each hostile one of the corpus."""
    import json
    import os
    import statistics
    import subprocess
    import time

    from slimeforge.scripts import hostrecord

    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cases = [("written by the agent", lambda path, pid: path.write_text(json.dumps(hh._process(pid))))]
            cases += [(name, make) for name, _, make in hh.AGENT_CASES]
            print("| record | median µs | worst µs |\n|---|---|---|")
            for name, make in cases:
                d = Path(tmp) / name.replace(" ", "-")
                d.mkdir()
                make(d / "ray.json", sleeper.pid)
                times = []
                for _ in range(reps):
                    t0 = time.perf_counter()
                    try:
                        hostrecord.read_record(str(d))
                    except hostrecord.BadRecord:
                        pass
                    times.append((time.perf_counter() - t0) * 1e6)
                print(f"| {name} | {statistics.median(times):.0f} | {max(times):.0f} |")
                if (d / "ray.json").is_fifo():
                    os.unlink(d / "ray.json")
    finally:
        sleeper.kill()
        sleeper.wait()
    print()


if __name__ == "__main__":
    main()
