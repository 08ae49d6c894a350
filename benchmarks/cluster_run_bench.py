"""`invoke run RECIPE --cluster INVENTORY` on the 3-host lab: time to the job RUNNING, the live
preflight's cost per host, and what each refusal prints.

The lab (tests/integration/cluster/netlab.py): three network namespaces with sshd, each in a mount
namespace of its own (a private <lab>/local per host holding its model copy; the head's holds the
data), <lab>/shared for the checkpoints. Ray is brought up once with cluster.up (host mode, this
checkout's environment); then, each run cold (a new `python -m invoke` process, ssh masters
closed first):

  to RUNNING   from starting `invoke run --cluster` until the Jobs API says the job is RUNNING
               (the stand-in train.py sleeps, so RUNNING lasts); also when the head first knew the
               job (after the local checks, the live checks on every host and the upload)
  preflight    cluster/runcheck.live alone on 1, 2 and 3 hosts (all hosts in parallel): total and
               per host
  refusals     exit code and first line of each: model missing on one host, a per-host checkpoint
               dir, a path outside the container volumes (dry run), another image, too many nodes

    python benchmarks/cluster_run_bench.py [--runs 3] [--json out.json]

Needs root (ip netns, unshare, sshd). On a 2-core machine the three hosts share the cores.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "integration" / "cluster"))

import yaml  # noqa: E402
from cluster_helpers import inventory_data, write_inventory  # noqa: E402
from launch_support import FIXTURES, write_catalog  # noqa: E402
from netlab import NetLab, can_create_namespaces  # noqa: E402

from slimeforge.cluster import raycluster as cluster  # noqa: E402
from slimeforge.cluster import runcheck  # noqa: E402
from slimeforge.cluster.inventory import load_inventory  # noqa: E402
from slimeforge.run.recipecheck import parse_recipe  # noqa: E402

MODEL = "Qwen2.5-3B-Instruct"


def put(lab: NetLab, host, path: Path, text: str) -> None:
    lab.run_in(host, ["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", str(path)], input=text)


def invoke(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def first_line(r: subprocess.CompletedProcess) -> str:
    return next((x for x in (r.stderr + r.stdout).splitlines() if x.strip()), "")


def close_masters(lab: NetLab) -> None:
    for sock in Path(f"/tmp/sf-ssh-{os.getuid()}").glob("*"):
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"], capture_output=True)


def to_running(lab, inv, recipe: Path, out: Path, catalog: Path, address: str) -> dict:
    from ray.job_submission import JobSubmissionClient

    close_masters(lab)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "run", str(recipe), "--cluster", str(inv), "--out",
                             str(out), "--catalog", str(catalog),
                             "--no-network"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    client = JobSubmissionClient(address)
    marks: dict[str, float] = {}
    try:
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            sid_file = out / "submission_id"  # recorded just before the submission is sent
            if sid_file.exists():
                try:
                    status = str(client.get_job_status(sid_file.read_text().strip()))
                except RuntimeError:  # 404: not arrived yet
                    status = ""
                if status:
                    marks.setdefault("submitted", time.perf_counter() - start)
                if status.endswith("RUNNING"):
                    marks["running"] = time.perf_counter() - start
                    break
            time.sleep(0.05)
        stop = invoke(["run.stop", str(out)])
        assert stop.returncode == 0, stop.stdout + stop.stderr
        text, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    return marks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    why = can_create_namespaces()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    home = Path(tempfile.mkdtemp(prefix="sf-bench-home-"))
    os.environ["SLIMEFORGE_STATE_HOME"] = str(home)
    runs_dir = Path(tempfile.mkdtemp(prefix="sf-bench-runs-"))
    lab = NetLab(3, private=("{workdir}/local", str(runs_dir))).start()
    result: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}
    try:
        w = lab.workdir
        local, shared = w / "local", w / "shared"
        shutil.copytree(FIXTURES / "slime", shared / "slime")
        config = (FIXTURES / "models" / MODEL / "config.json").read_text()
        for h in lab.hosts:
            put(lab, h, local / "models" / MODEL / "config.json", config)
            put(lab, h, local / "models" / MODEL / "model.safetensors",
                "w" * 4096)  # the weights: what a checkpoint's size follows
        put(lab, lab.hosts[0], local / "data" / "train.jsonl", json.dumps({"prompt": "1 + 1?",
                                                                           "metadata": {"answer": "2"}}) + "\n")
        inv = write_inventory(w / "lab.yaml", inventory_data(lab, f"{lab.tag}-rb"))
        recipe = {
            "exp_id": "sf-run-bench",
            "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/gsm8k_agent-a1B2c3D4e5",
            "s3_bucket": "sf-run-bench", "model_dir": str(local / "models" / MODEL),
            "data_path": str(local / "data" / "train.jsonl"),
            "model_type": "qwen2.5-3B", "num_gpus": 2, "num_nodes": 3, "tp_size": 1, "rollout_batch_size": 24,
            "rollout_gpus_per_engine": 1,
            "slime_dir": str(shared / "slime"), "megatron_dir": str(shared / "Megatron-LM"), "mode": "host",
            "checkpoint_dir": str(shared / "ckpt"), "env": {"STANDIN_SLEEP": "300"},
        }
        parsed, stack = parse_recipe({**recipe, "install_prefix": str(w / "prefix")}, "bench")
        catalog = write_catalog(runs_dir / "flags.json", parsed, stack)

        def recipe_file(name: str, **over) -> Path:
            path = runs_dir / f"{name}.yaml"
            path.write_text(yaml.safe_dump({**recipe, **over}))
            return path

        t0 = time.perf_counter()
        address = cluster.up(inv, control_dir=lab.control_dir, stream=io.StringIO())
        result["cluster_up_s"] = round(time.perf_counter() - t0, 2)

        marks = [to_running(lab, inv, recipe_file("sleep"), runs_dir / f"run{i}", catalog,
                            address.dashboard) for i in range(args.runs)]
        result["to_running_s"] = [round(m["running"], 2) for m in marks]
        result["to_submitted_s"] = [round(m["submitted"], 2) for m in marks]
        print(f"invoke run --cluster -> job RUNNING: median {statistics.median(result['to_running_s']):.2f} s "
              f"(runs {result['to_running_s']}); the head knew the job at {result['to_submitted_s']} s")

        rec = parse_recipe({**recipe, "install_prefix": str(w / "prefix")}, "bench")[0]
        full = load_inventory(inv)
        result["preflight"] = {}
        for n in (1, 2, 3):
            sub = write_inventory(w / f"sub{n}.yaml", {**yaml.safe_load(inv.read_text()),
                                                       "hosts": yaml.safe_load(inv.read_text())["hosts"][:n]})
            times = []
            for _ in range(args.runs):
                close_masters(lab)
                t = time.perf_counter()
                check = runcheck.live(rec, load_inventory(sub), stream=io.StringIO(), live_table=False)
                times.append(time.perf_counter() - t)
                assert not check.failures, check.table.text()
            med = statistics.median(times)
            result["preflight"][n] = {"median_s": round(med, 3), "per_host_s": round(med / n, 3)}
            print(f"live preflight on {n} host(s): median {med:.2f} s, {med / n:.2f} s per host (cold ssh)")
        assert len(full.hosts) == 3

        refusals = {}
        h3 = lab.hosts[2]
        lab.run_in(h3, ["rm", "-rf", "--", str(local / "models" / MODEL)])
        r = invoke(["run", str(recipe_file("nomodel")), "--cluster", str(inv), "--out", str(runs_dir / "r1"),
                    "--catalog", str(catalog), "--no-network"])
        refusals["model missing on h3"] = (r.returncode, first_line(r),
                                           next((x for x in r.stderr.splitlines() if x.startswith("h3 ")), ""))
        put(lab, h3, local / "models" / MODEL / "config.json", config)
        r = invoke(["run", str(recipe_file("perhost", checkpoint_dir=str(local / "ckpt"))), "--cluster", str(inv),
                    "--out", str(runs_dir / "r2"),
                    "--catalog", str(catalog), "--no-network"])
        refusals["per-host checkpoint_dir"] = (r.returncode, first_line(r),
                                               next((x for x in r.stderr.splitlines() if x.startswith("h2 ")), ""))
        data = {k: v for k, v in inventory_data(lab, f"{lab.tag}-rc").items() if k not in ("prefix", "python")}
        data.update(mode="container", image="127.0.0.1:5000/slimeforge@sha256:" + "ab" * 32,
                    container={"volumes": [f"{local}:{local}", f"{shared}:{shared}"]})
        cinv = write_inventory(runs_dir / "container.yaml", data)
        outside = recipe_file("outside", mode="container", data_path="/root/data/train.jsonl")
        r = invoke(["run", str(outside), "--cluster", str(cinv), "--out", str(runs_dir / "r3"), "--dry-run"])
        refusals["path outside the volumes"] = (r.returncode, first_line(r),
                                                r.stderr.splitlines()[1] if len(r.stderr.splitlines()) > 1 else "")
        r = invoke(["run", str(recipe_file("image", mode="container")), "--cluster", str(cinv), "--out",
                    str(runs_dir / "r4"), "--dry-run",
                    "--image", "127.0.0.1:5000/slimeforge@sha256:" + "cd" * 32])
        refusals["another image"] = (r.returncode, first_line(r),
                                     r.stderr.splitlines()[1] if len(r.stderr.splitlines()) > 1 else "")
        r = invoke(["run", str(recipe_file("nodes", num_nodes=4, rollout_batch_size=48)), "--cluster", str(inv),
                    "--out", str(runs_dir / "r5"), "--dry-run"])
        refusals["num_nodes 4 on 3 hosts"] = (r.returncode, first_line(r),
                                              r.stderr.splitlines()[1] if len(r.stderr.splitlines()) > 1 else "")
        result["refusals"] = refusals
        for what, (code, line, detail) in refusals.items():
            print(f"refusal, {what}: exit {code}: {line}\n    {detail.strip()}")
    finally:
        try:
            cluster.down(inv, control_dir=lab.control_dir, stream=io.StringIO())
        except Exception as exc:  # noqa: BLE001 - the lab goes anyway
            print(f"cluster.down: {exc}", file=sys.stderr)
        lab.stop()
        shutil.rmtree(runs_dir, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
