"""Issue 33's hosts-side corpus (tests/hosts_hostile.py): each case's outcome and the counts per class.

    python benchmarks/hostile_hosts.py [--rows]
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
    args = ap.parse_args()
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
        print(f"| {klass} | {sum(counts[klass, o] for o in outcomes)} | {' | '.join(str(counts[klass, o]) for o in outcomes)} |")
    print(f"| all | {len(rows)} | {' | '.join(str(sum(counts[k, o] for k in classes)) for o in outcomes)} |")
    import slimeforge

    print(f"\n(slimeforge from {Path(slimeforge.__file__).parent})")


if __name__ == "__main__":
    main()
