"""The flag catalog of a slime checkout: options per parser, and the time `invoke flags.catalog` takes.

    python benchmarks/catalog_bench.py --python PY --slime DIR --megatron DIR [--runs 3]

Each run is a fresh `invoke flags.catalog` process, as a user types it (the target interpreter
imports slime's argument code, torch and sglang: that is most of the time). Prints the parsers of
the last run with their option counts (`--sglang-*` and `--router-*` shown for each), the total,
and min / median / max wall time. With no checkouts given it uses the stand-in slime of the tests.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--slime")
    parser.add_argument("--megatron")
    parser.add_argument("--runs", type=int, default=3)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if not opts.slime:
            sys.path.insert(0, str(ROOT / "tests"))
            import flag_standin as fs

            opts.slime = str(fs.write(Path(tmp) / "slime", fs.slime_files(inline_megatron=False)))
            opts.megatron = str(fs.write(Path(tmp) / "Megatron-LM", fs.MEGATRON_FILES))
        out = Path(tmp) / "flags.json"
        argv = [sys.executable, "-m", "invoke", "flags.catalog", "--python", opts.python, "--slime", opts.slime,
                "--out", str(out)]
        if opts.megatron:
            argv += ["--megatron", opts.megatron]
        times = []
        for _ in range(opts.runs):
            start = time.perf_counter()
            res = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
            times.append(time.perf_counter() - start)
            if res.returncode != 0:
                sys.exit(res.stderr)
        doc = json.loads(out.read_text())
    print(f"slime {doc.get('slime_commit')}, Megatron-LM {doc.get('megatron_commit')}, Python {doc['python']}")
    for p in doc["parsers"]:
        opts_ = p["options"]
        sg = sum(o.startswith("--sglang-") for o in opts_)
        rt = sum(o.startswith("--router-") for o in opts_)
        print(f"  {len(opts_):>4} options ({sg} --sglang-*, {rt} --router-*)  add_help={p['add_help']!s:<5}  "
              f"{p['built_by']}")
    print(f"  {len(doc['flags'])} distinct --options in all; stopped_by: {doc['stopped_by']}")
    print(f"invoke flags.catalog, {opts.runs} runs: min {min(times):.1f} s, median {statistics.median(times):.1f} s, "
          f"max {max(times):.1f} s")


if __name__ == "__main__":
    main()
