"""What the one reader (slimeforge/readback.py) costs per file, over the repository's real files.

    python benchmarks/reader_bench.py [--runs 50]

For every recipe (recipes/*.yaml), inventory (recipes/clusters/*.yaml), stack (images/*.yaml,
tests/stacks/*.yaml) and lock (images/locks/*.toml, tests/stacks/locks/*.toml), timed in-process,
`--runs` times each (median and worst per file):

* read: readback.read_bytes alone (stat, open O_NONBLOCK|O_NOFOLLOW, fstat, bounded read): what
  the reader adds before any parser runs;
* parse: the whole read of that kind of file: yamlio.read_yaml (the reader, strict UTF-8, the
  depth and size bounds, PyYAML) for YAML; readback.parse_toml plus lockfile.shape_problems
  (depth bound, tomllib, every used field typed) for a lock.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slimeforge import readback  # noqa: E402
from slimeforge.image.lock.lockfile import LOCK_ACCEPTED, shape_problems  # noqa: E402
from slimeforge.yamlio import MAX_FILE_BYTES, read_yaml  # noqa: E402


def files() -> list[tuple[str, Path]]:
    out = [("recipe", p) for p in sorted((ROOT / "recipes").glob("*.yaml"))]
    out += [("inventory", p) for p in sorted((ROOT / "recipes" / "clusters").glob("*.yaml"))]
    out += [("stack", p) for p in sorted([*(ROOT / "images").glob("*.yaml"),
                                          *(ROOT / "tests" / "stacks").glob("*.yaml")])]
    out += [("lock", p) for p in sorted([*(ROOT / "images" / "locks").glob("*.toml"),
                                         *(ROOT / "tests" / "stacks" / "locks").glob("*.toml")])]
    return out


def timed(fn, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def parse_lock(path: Path) -> None:
    raw = readback.read_bytes(path, "lock", LOCK_ACCEPTED, max_bytes=readback.MAX_TOML_RECORD, follow_symlinks=True)
    assert raw is not None
    doc = readback.parse_toml(path, "lock", LOCK_ACCEPTED, readback.decode(path, "lock", LOCK_ACCEPTED, raw))
    assert not shape_problems(doc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=50, help="reads of each file (default 50)")
    args = ap.parse_args()
    print(f"{'kind':<10} {'file':<40} {'bytes':>8}  {'read median/worst (us)':>24}  {'parse median/worst (ms)':>24}")
    reads: list[float] = []
    parses: dict[str, list[float]] = {}
    for kind, path in files():
        limit = readback.MAX_TOML_RECORD if kind == "lock" else MAX_FILE_BYTES
        read = timed(lambda p=path, n=limit: readback.read_bytes(p, "file", "a file", max_bytes=n,
                                                                 follow_symlinks=True), args.runs)
        parse = timed((lambda p=path: parse_lock(p)) if kind == "lock" else (lambda p=path: read_yaml(p)), args.runs)
        reads += read
        parses.setdefault(kind, []).extend(parse)
        print(f"{kind:<10} {str(path.relative_to(ROOT)):<40} {path.stat().st_size:>8}  "
              f"{statistics.median(read) * 1e6:>11.1f} / {max(read) * 1e6:>9.1f}  "
              f"{statistics.median(parse) * 1e3:>11.2f} / {max(parse) * 1e3:>9.2f}")
    print(f"\nread_bytes over all {len(files())} files: median {statistics.median(reads) * 1e6:.1f} us, worst "
          f"{max(reads) * 1e6:.1f} us")
    for kind, times in parses.items():
        print(f"whole read of a {kind}: median {statistics.median(times) * 1e3:.2f} ms, worst {max(times) * 1e3:.2f} "
              "ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
