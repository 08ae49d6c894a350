"""How long from `invoke run RECIPE` to the job RUNNING on a local Ray head, and how much of it is
Ray's own start; and how long the preflight's no-GPU, no-network checks take.

    .venv/bin/python benchmarks/launch_bench.py [--repeat 3]

Uses the tests' stand-in slime_dir (train.py records its argv and sleeps) and a fake nvidia-smi fed
with a real H100 capture, so it runs on a CPU-only machine; the AWS checks are left out
(--no-network). Each launch starts its own head (the previous one is replaced, as for users).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from launch_support import (  # noqa: E402
    VENV_BIN,
    fake_nvidia_smi,
    head_extra_args,
    make_recipe,
    short_tmp,
    stop_recorded_head,
    write_catalog,
)

from slimeforge.run import preflight as doctor  # noqa: E402
from slimeforge.run.headstate import state_dir  # noqa: E402
from slimeforge.run.recipecheck import parse_recipe  # noqa: E402

NO_GPU_NO_NETWORK = ["shm", "limits", "ports", "model-config", "data", "checkpoint", "flags"]


def one_launch(work: Path, env: dict[str, str]) -> dict[str, float]:
    from ray.job_submission import JobSubmissionClient

    data = make_recipe(work, env={"STANDIN_RECORD": str(work / "record.json"), "STANDIN_SLEEP": "3"})
    recipe, stack = parse_recipe(data, "bench")
    catalog = write_catalog(work / "flags.json", recipe, stack)
    (work / "recipe.yaml").write_text(yaml.safe_dump(data))
    run_dir = work / "run"
    temp = short_tmp()
    env = {**env, "SLIMEFORGE_RAY_HEAD_ARGS": " ".join(head_extra_args(temp))}
    marks: dict[str, float] = {}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "run", str(work / "recipe.yaml"), "--out", str(run_dir),
                             "--catalog", str(catalog), "--no-network"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)

    def read():
        for line in proc.stdout:
            now = time.monotonic() - t0
            if "starting a Ray head" in line:
                marks["head_start"] = now
            elif "submitting" in line:
                marks["submit"] = now
            elif line.startswith("check "):
                marks.setdefault("preflight_table", now)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    sid_file = run_dir / "submission_id"
    while "running" not in marks and proc.poll() is None:
        if sid_file.exists() and "submit" in marks:
            try:
                client = JobSubmissionClient(f"http://127.0.0.1:{recipe.ray_dashboard_port}")
                st = client.get_job_status(sid_file.read_text().strip())
                if str(st).endswith("RUNNING"):
                    marks["running"] = time.monotonic() - t0
            except Exception:  # noqa: BLE001 - not submitted yet
                pass
        time.sleep(0.05)
    proc.wait(timeout=300)
    reader.join(timeout=10)
    stop_recorded_head(state_dir(recipe.ray_port, env), say=lambda _: None)
    subprocess.run(["rm", "-rf", str(temp)], check=False)
    if proc.returncode != 0 or "running" not in marks:
        raise SystemExit(f"launch failed (exit {proc.returncode}): {marks}")
    return {"to_running": marks["running"], "ray_head": marks["submit"] - marks["head_start"],
            "before_head": marks["head_start"], "submit_to_running": marks["running"] - marks["submit"]}


def doctor_time(work: Path, repeat: int) -> tuple[float, float]:
    recipe, stack = parse_recipe(make_recipe(work), "bench")
    catalog = str(write_catalog(work / "flags.json", recipe, stack))
    times = []
    for _ in range(repeat):
        t = time.monotonic()
        doctor.run_checks(recipe, stack, only=NO_GPU_NO_NETWORK, catalog=catalog)
        times.append(time.monotonic() - t)
    data = make_recipe(work)
    (work / "recipe.yaml").write_text(yaml.safe_dump(data))
    t = time.monotonic()
    subprocess.run([sys.executable, "-m", "invoke", "doctor", "--recipe", str(work / "recipe.yaml"), "--catalog",
                    catalog, "--no-network"],
                   cwd=ROOT, capture_output=True, check=False)
    return statistics.median(times), time.monotonic() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sf-bench-") as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "SLIMEFORGE_STATE_DIR": str(tmp / "state"),
               "PATH": f"{fake_nvidia_smi(tmp / 'bin', 'h100-x1')}:{VENV_BIN}:/usr/bin:/bin"}
        os.environ["PATH"] = env["PATH"]
        in_process, cli = doctor_time(tmp / "doctor", opts.repeat * 5)
        print(f"doctor, no-GPU no-network checks ({', '.join(NO_GPU_NO_NETWORK)}): {in_process * 1000:.0f} ms in "
              "process (median), "
              f"{cli:.2f} s for `invoke doctor R --no-network` (whole CLI, incl. the fake nvidia-smi checks)")
        runs = [one_launch(tmp / f"launch{i}", env) for i in range(opts.repeat)]
        for key, label in (("to_running", "invoke run -> job RUNNING"), ("ray_head",
                                                                         "  of which Ray head start (to Jobs API up)"),
                           ("before_head", "  of which before the head (CLI, render, preflight)"),
                           ("submit_to_running", "  of which submit -> RUNNING (Ray's job supervisor)")):
            vals = [r[key] for r in runs]
            print(f"{label:<52} median {statistics.median(vals):6.2f} s  (min {min(vals):.2f}, max {max(vals):.2f}, "
                  f"n={len(vals)})")


if __name__ == "__main__":
    main()
