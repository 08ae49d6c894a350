"""Restarts (issue 39, item 4) on the lab's three hosts, end to end through `invoke run --cluster
INV --max-restarts 1` (host mode, the cluster cluster.up brought up).

The stand-in train.py trains STANDIN_STEPS steps, saving its step counter into checkpoint_dir
(--save) after each, and fails as soon as a Ray node it started with is lost. Once it has saved a
step, one worker's Ray is stopped through the node agent's record (as test_run_gate does: never a
pkill); the job fails, `invoke run` heals the cluster with cluster.up's own repair, runs the gate
and the host checks again, and submits the same run, which resumes from the saved step and
finishes. run.status shows both attempts. A job that fails by its own error is not restarted.
The time from the worker's stop to the resumed job and to the run's end is printed (`pytest -s`)
as the figure for docs/multinode.md.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
import test_run_cluster as base
from test_run_cluster import ROOT, invoke, recipe_file, run_cmd
from test_run_gate import ray_states

from slimeforge.cluster.agent import agent
from slimeforge.cluster.bringup import make_nodes
from slimeforge.cluster.inventory import load_inventory

pytestmark = [pytest.mark.ssh, pytest.mark.slow]
# test_run_cluster's lab and cluster, shared with it (SHARED_BY there).
up, _shared_cluster_closer, _cluster_state_home = base.up, base._shared_cluster_closer, base._cluster_state_home
# The job fails 2-3 s after the stop (docs/multinode.md): 10 steps of 3 s leave it that time, and keep
# the resumed half short (it runs the steps left after the lost one).
STEPS = 10


def saved_step(ckpt) -> int:
    try:
        return int((ckpt / "step").read_text())
    except (FileNotFoundError, ValueError):
        return 0


def log_text(out) -> str:
    return (out / "job.log").read_text() if (out / "job.log").exists() else ""


def test_a_lost_worker_heals_and_the_run_resumes_from_its_saved_step(up):
    lab, inv_path = up["lab"], up["inventory"]
    ckpt = up["shared"] / "ckpt" / "sf-restart"
    out = up["tmp"] / "run-restart"
    recipe = recipe_file(up, "restart", exp_id="sf-restart", checkpoint_dir=str(ckpt),
                         env={"STANDIN_STEPS": str(STEPS), "STANDIN_STEP_S": "3", "STANDIN_WATCH_NODES": "1"})
    said = up["tmp"] / "run-restart.out"  # a file, not a pipe: nobody reads it while the run goes on
    with said.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "invoke", *run_cmd(up, recipe, out, "--max-restarts", "1")],
                                cwd=ROOT,
                                stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 400
        while not ("standin: watching 3 node(s)" in log_text(out) and saved_step(ckpt) >= 1):
            assert proc.poll() is None and time.monotonic() < deadline, said.read_text() + log_text(out)
            time.sleep(0.5)
        inv = load_inventory(inv_path)
        h3 = next(n for n in make_nodes(inv, control_dir=lab.control_dir) if n.name == "h3")
        # Stop h3's Ray exactly as recorded: the node agent proves the pid is the `ray start` it started.
        t_stop = time.monotonic()  # the loss starts with the stop's signal: its own round trip counts
        stopped = agent(h3.ssh, h3.host, "stop", {"state_dir": h3.host.state_dir, "cluster": inv.name}, timeout=120)
        assert stopped["stopped"] and stopped["ok"], stopped
        at_stop = saved_step(ckpt)
        marks: dict[str,
                    float] = {}  # when each phase first shows in job.log (followed from here: within about a second)
        deadline = time.monotonic() + 900
        while proc.poll() is None:
            now, seen = time.monotonic(), log_text(out)
            for key, line in (("failed", "standin: a node was lost"), ("submitted", "(attempt 2)"), ("resumed",
                                                                                                     "(resumed from "
                                                                                                     "the "
                                                                                                     "checkpoint)")):
                if key not in marks and line in seen:
                    marks[key] = now
            assert time.monotonic() < deadline, log_text(out)
            time.sleep(0.5)
        t_end = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
    log, text = log_text(out), said.read_text()
    assert proc.returncode == 0, text + log
    assert list(marks) == ["failed", "submitted", "resumed"], (marks, log)
    assert "were lost; restart 1 of 1" in text and "bringing lost hosts back with cluster.up's repair" in text, text
    assert "Traceback" not in text + log
    # The second attempt resumed from the step the first saved (never from 0) and finished.
    assert "(attempt 2)" in log and "(attempt 3)" not in log, log
    first, second = log.split("(attempt 2)", 1)
    lost_at = int(re.search(r"standin: a node was lost during step (\d+)", first)[1])
    resumed_at = int(re.search(r"standin: starting at step (\d+) of \d+ \(resumed from the checkpoint\)", second)[1])
    assert at_stop >= 1 and resumed_at == lost_at - 1 >= at_stop, log
    assert f"standin: saved step {resumed_at + 1}\n" in second and f"standin: finished {STEPS} steps" in second, second
    assert saved_step(ckpt) == STEPS
    # run.status shows both attempts: the first FAILED (the lost node), the second SUCCEEDED.
    st = invoke("run.status", str(out), "--json")
    assert st.returncode == 0, st.stdout + st.stderr
    attempts = json.loads(st.stdout)["attempts"]
    assert [(a["attempt"], a["status"]) for a in attempts] == [("1", "FAILED"), ("2", "SUCCEEDED")], attempts
    shown = invoke("run.status", str(out))
    assert re.search(r"attempts \(2, --max-restarts\): 1\. sf-restart-\S+ FAILED; 2\. sf-restart-\S+ SUCCEEDED",
                     shown.stdout), shown.stdout
    # The healed worker is ALIVE again (cluster.up's repair brought it back).
    assert ray_states(up).get(lab.hosts[2].ip) == "ALIVE"
    print("\n" + "\n".join(x for x in text.splitlines() if re.search(r"lost|heal|alive again|ALIVE "
                                                                     r"node|submitting|SUCCEEDED", x)))
    since = {key: t - t_stop for key, t in marks.items()}
    print(f"\n[figure] --max-restarts on 3 lab hosts (host mode): worker h3's Ray stopped at step {at_stop}; "
          f"resumed job RUNNING from step {resumed_at} after {since['resumed']:.1f} s (the job failed on the lost "
          "node at "
          f"{since['failed']:.1f} s; healed, gated and resubmitted at {since['submitted']:.1f} s); "
          f"run ended after {t_end - t_stop:.1f} s ({STEPS - resumed_at} steps of 3 s left)")


def test_a_job_failing_by_its_own_error_is_not_restarted(up):
    out = up["tmp"] / "run-own-error"
    r = invoke(*run_cmd(up, recipe_file(up, "own-error", exp_id="sf-own-error",
                                        checkpoint_dir=str(up["shared"] / "ckpt" / "sf-own-error"),
                                        env={"STANDIN_EXIT": "7"}), out, "--max-restarts", "1"))
    text = r.stdout + r.stderr
    assert r.returncode == 7, text
    assert "exit code 7" in text and "restart 1 of 1" not in text and "bringing lost hosts back" not in text, text
    log = log_text(out)
    assert "(attempt 1)" in log and "(attempt 2)" not in log, log
    st = invoke("run.status", str(out), "--json")
    attempts = json.loads(st.stdout)["attempts"]
    assert [(a["attempt"], a["status"]) for a in attempts] == [("1", "FAILED")], attempts
