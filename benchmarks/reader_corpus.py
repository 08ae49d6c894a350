"""Issue 33's corpus of files and values (tests/reader_hostile.py), counted by outcome per class.

    python benchmarks/reader_corpus.py [--root CHECKOUT] [--cases]

Every case runs in-process with a 5 s watchdog against the slimeforge package of this checkout,
or of `--root` (e.g. an export of main with this file and tests/reader_hostile.py copied in, for
the "before" counts). Prints, per class of the issue (hang, traceback, silent, data loss, wrong
hint, good), how many cases ended in each outcome; --cases lists every case.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                    help="the checkout whose slimeforge is judged")
    ap.add_argument("--cases", action="store_true", help="list every case with its outcome")
    args = ap.parse_args()
    root = args.root.resolve()
    sys.path[:0] = [str(root), str(root / "tests")]
    import reader_hostile as rh

    import slimeforge

    print(f"slimeforge from {Path(slimeforge.__file__).parent}")
    table: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    start = time.perf_counter()
    for case in rh.CASES:
        with tempfile.TemporaryDirectory() as tmp:
            outcome, detail = rh.judge(case, Path(tmp))
        table[case.kind][outcome] += 1
        if args.cases:
            print(f"  {case.kind:<10} {case.name:<32} {outcome:<13} {detail[:110]!r}")
    print(f"{len(rh.CASES)} cases in {time.perf_counter() - start:.1f} s")
    print("| class | cases | right (refused/accepted/ok) | wrong: outcomes |")
    print("|---|---|---|---|")
    for kind, counts in sorted(table.items()):
        right = sum(n for o, n in counts.items() if o in rh.RIGHT)
        wrong = ", ".join(f"{o} {n}" for o, n in sorted(counts.items()) if o not in rh.RIGHT) or "-"
        print(f"| {kind} | {sum(counts.values())} | {right} | {wrong} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
