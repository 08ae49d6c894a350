"""`invoke run RECIPE --slurm` until the job is RUNNING in Ray, on 3 nodes versus 1, split by phase.

The cluster is real Slurm on this machine (tests/integration/slurm/slurmlab.py: slurmctld and three
slurmd in network namespaces, 2 GPUs per node as GRES, the fake nvidia-smi), in host mode with this
checkout's environment and the stand-in slime (tests/fixtures/slime: train.py records its start).
Each run is a fresh `invoke run --slurm` command; the phases come from the job's own timeline
(slurm-<jobid>/timeline, written by slurm.sbatch) and the stand-in's record:

  queue     sbatch returned -> the batch script runs on the first node (allocated)
  checks    the per-node checks (srun, one task per node)
  head      the Ray head started, until its GCS port answers
  workers   the workers started (while the head finishes), until every node is ALIVE with its
            GPUs in the head's dashboard (the health gate)
  submit    launch.sh submits; until train.py runs in Ray (the job is RUNNING)
  total     the `invoke` command started -> train.py runs

Needs root (ip netns, slurmd). On a 2-core machine the three Ray nodes compete for the same cores,
which real nodes would not: the 3-node figures are an upper bound.

    python benchmarks/slurm_bench.py [--runs 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "integration" / "slurm"))

import yaml  # noqa: E402
from launch_support import VENV_BIN, make_recipe, write_catalog  # noqa: E402
from slurmlab import SlurmLab, can_run_slurm  # noqa: E402

from slimeforge.run.recipecheck import parse_recipe  # noqa: E402

PHASES = ("queue", "checks", "head", "workers", "submit", "total")


def one_run(lab: SlurmLab, nodes: int, i: int, env: dict[str, str]) -> dict[str, float]:
    work = lab.net.workdir / f"b{nodes}-{i}"
    work.mkdir()
    record = work / "record.json"
    data = make_recipe(work, num_gpus=2, exp_id=f"bench-{nodes}-{i}", env={"STANDIN_RECORD": str(record),
                                                                           "STANDIN_EXIT": "0"})
    # Small weights: each node checks checkpoint space for 7x them (config.json's shape alone: ~40 GiB).
    (Path(data["model_dir"]) / "model.safetensors").write_bytes(b"w" * 4096)
    recipe, stack = parse_recipe(data, "bench")
    catalog = write_catalog(work / "flags.json", recipe, stack)
    path = work / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    run = work / "run"
    argv = [str(VENV_BIN / "invoke"), "--search-root", str(ROOT), "run", str(path), "--slurm", "--nodes", str(nodes),
            "--out", str(run), "--catalog", str(catalog), "--no-network"]
    t0 = time.time()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError("invoke run --slurm exited "
                           f"{proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    job_id = (run / "slurm_job_id").read_text().strip()
    submitted = float((run / "slurm_submitted_at").read_text())
    marks = {name: float(t) for _, name,
             t in (line.split() for line in (run / f"slurm-{job_id}" / "timeline").read_text().splitlines())}
    running = record.stat().st_mtime  # train.py's first act in Ray
    return {
        "queue": marks["allocated"] - submitted,
        "checks": marks["checked"] - marks["allocated"],
        "head": marks["head"] - marks["checked"],
        "workers": marks["workers"] - marks["head"],
        "submit": running - marks["submit"],
        "total": running - t0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    why = can_run_slurm()
    if why:
        print(f"cannot run the Slurm lab here: {why}", file=sys.stderr)
        return 2
    lab = SlurmLab(3).start()
    try:
        env = {**os.environ, **lab.env, "PATH": f"{lab.net.workdir / 'bin'}:{VENV_BIN}:/usr/bin:/bin:/usr/sbin:/sbin",
               "SLIMEFORGE_PYTHON": str(VENV_BIN / "python")}
        env.pop("RAY_ADDRESS", None)
        results: dict[int, list[dict[str, float]]] = {1: [], 3: []}
        for i in range(args.runs):
            for nodes in (1, 3):  # interleaved: a drift in machine load hits both alike
                r = one_run(lab, nodes, i, env)
                results[nodes].append(r)
                print(f"run {i + 1}, {nodes} node(s): " + "  ".join(f"{p} {r[p]:.1f}s" for p in PHASES), flush=True)
    finally:
        lab.stop()
    print(f"\nmedian of {args.runs} run(s), seconds (cpus: {os.cpu_count()})")
    print(f"{'nodes':<6}" + "".join(f"{p:>9}" for p in PHASES))
    summary = {}
    for nodes, rows in results.items():
        summary[nodes] = {p: statistics.median(r[p] for r in rows) for p in PHASES}
        print(f"{nodes:<6}" + "".join(f"{summary[nodes][p]:>9.1f}" for p in PHASES))
    print(f"3 nodes / 1 node, total: {summary[3]['total'] / summary[1]['total']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"runs": results, "median": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
