"""The hostile-records table: record x replacement x `run.*` command -> what it answered, in how
long, and what it acted on (nothing, in every cell).

    python benchmarks/hostile_records.py [--markdown]

Each record of a Ray run directory (plan.json, run_token, submission_id, ray_address,
container.id, and the state directory's head.json) and of a Slurm run directory (plan.json,
run_token, slurm_job_id, slurm_submitted_at, submission_id) is replaced in turn by garbage,
non-UTF-8 bytes, a FIFO, a directory, a symlink to /dev/zero and 10 MB, on a fresh copy of the
directories; run.status, run.logs, run.stop, run.stop --head and `run RECIPE --dry-run --out DIR`
run in-process through the invoke tasks with a 5 s watchdog (tests/records_hostile.py; the
asserting test is tests/unit/hostile/test_records_hostile.py). The Ray record set is a launch
whose head is gone (nobody listens on its dashboard port), the Slurm set a job id Slurm is asked about.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import records_hostile as rh  # noqa: E402
from helpers import free_port  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--markdown", action="store_true", help="one markdown row per cell")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = rh.table(Path(tmp), free_port())
    times = [a.seconds for *_, a in rows]
    if args.markdown:
        print("| run dir | record | replaced by | command | exit | s | answer |")
        print("|---|---|---|---|---|---|---|")
    for kind, name, variant, cmd, ans in rows:
        text = rh.summary(ans.text).replace("|", "\\|").replace(tmp, "$TMP")
        acted = f" ACTED: {ans.acted}" if ans.acted else ""
        if args.markdown:
            print(f"| {kind} | {name} | {variant} | {cmd} | {ans.code} | {ans.seconds:.2f} | {text}{acted} |")
        else:
            print(f"{kind:5} {name:18} {variant:20} {cmd:20} exit {ans.code!s:4} {ans.seconds:5.2f}s  {text}{acted}")
    hung = sum(1 for *_, a in rows if a.code is None)
    acted = sum(1 for *_, a in rows if a.acted)
    zero = sum(1 for *_, a in rows if a.code == 0)
    print(f"\n{len(rows)} cells: answer time median {statistics.median(times):.3f} s, max {max(times):.3f} s; "
          f"hung {hung}, exit 0 {zero}, acted on something {acted}")
    return 1 if hung or acted or zero else 0


if __name__ == "__main__":
    sys.exit(main())
