"""Following a job never owns it, on a real Ray (CPU) through the real tasks (`python -m invoke`):

- `invoke run --detach` returns once the job runs; from another directory, without the run
  directory, run.status / run.logs / run.stop find it by its exp_id, through an inventory
  (--cluster, its head's node_ip) or the address, and prove it slimeforge's by its metadata;
- SIGINT to a following `invoke run` detaches: the job keeps running (run.stop stops it);
- a head killed under a following `invoke run`: a clear message naming the Jobs API and the
  deadline, exit 3 (docs/exit-codes.md), no traceback.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from launch_support import RayHead, make_recipe, wait_for, write_catalog

from slimeforge.run.recipecheck import parse_recipe
from slimeforge.run.targets.jobsapi import JobsApi, NoAnswer

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
EXP = "sf-detach-test"


def node_alive(address: str) -> bool:
    try:
        return any(state == "ALIVE" for state, _ in JobsApi(address).nodes().values())
    except NoAnswer:
        return False


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def steady_head(tries: int = 3) -> RayHead:
    """A head whose node has registered and that stays up: on a loaded machine `ray start --block`
    can give up on its own subprocesses in its first minute (ray_client_server: "Timed out waiting
    for node info") and stop everything; such a head is started again."""
    for _ in range(tries):
        head = RayHead(num_gpus=1).start()
        try:
            wait_for(lambda address=head.address: node_alive(address), 180, "the head's node")
            # The client server listens only once it has the node's info (ray's proxier asks the GCS
            # for 30 s at most, then exits, and `ray start --block` stops everything): listening, it
            # is past that deadline. A short wait after shows a head that went down all the same.
            port = int(head.argv[head.argv.index("--ray-client-server-port") + 1])
            wait_for(lambda port=port, proc=head.proc: listening(port) or proc.poll() is not None, 120,
                     "the head's Ray client server")
            time.sleep(2)
            JobsApi(head.address).version()
            if head.proc is not None and head.proc.poll() is None:
                return head
        except Exception:  # noqa: BLE001 - it died while starting: try again
            pass
        head.stop()
    raise RuntimeError(f"no Ray head stayed up in {tries} tries")


@pytest.fixture(scope="module")
def ray_head():
    head = steady_head()
    yield head
    head.stop()


def invoke(*args: str, cwd: Path = ROOT, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(ROOT), *args], cwd=cwd,
                          capture_output=True, text=True,
                          timeout=timeout, env=env or os.environ.copy())


def launch_args(env: Path, address: str, exp_id: str = EXP, **recipe_env: str) -> list[str]:
    data = make_recipe(env, exp_id=exp_id, env={"STANDIN_SLEEP": "600", **recipe_env})
    recipe, stack = parse_recipe(data, "test")
    catalog = write_catalog(env / "flags.json", recipe, stack)
    (env / "recipe.yaml").write_text(yaml.safe_dump(data))
    return ["run", str(env / "recipe.yaml"), "--out", str(env / "run"), "--address", address, "--catalog", str(catalog)]


def status_of(address: str, exp_id: str = EXP) -> str:
    jobs = [j for j in JobsApi(address).jobs() if j.metadata.get("slimeforge_exp_id") == exp_id]
    return max(jobs, key=lambda j: j.start_time or 0).status


def test_detach_then_reattach_from_another_directory_by_exp_id(env, ray_head, tmp_path_factory):
    r = invoke(*launch_args(env, ray_head.address), "--detach")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "detached (--detach)" in r.stdout and (f"  stop:    invoke run.stop {EXP} --address "
                                                 f"{ray_head.address}") in r.stdout
    assert status_of(ray_head.address) == "RUNNING"

    # Elsewhere: no run directory, only the inventory (its head's node_ip and dashboard port) and the exp_id.
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    port = ray_head.address.rsplit(":", 1)[1]
    inv = elsewhere / "local.yaml"
    inv.write_text(yaml.safe_dump({"name": "local", "mode": "host", "python": sys.executable,
                                   "ray": {"port": ray_head.port, "dashboard_port": int(port)},
                                   "hosts": [{"name": "here", "address": "127.0.0.1", "node_ip": "127.0.0.1",
                                              "role": "head", "gpus": 1}]}))
    st = invoke("run.status", EXP, "--cluster", str(inv), cwd=elsewhere)
    assert st.returncode == 0 and f"{EXP}-" in st.stdout and ": RUNNING" in st.stdout, st.stdout + st.stderr
    wait_for(lambda: "standin: waiting" in invoke("run.logs", EXP, "--address", ray_head.address,
                                                  cwd=elsewhere).stdout, 120, "the job's log")
    stop = invoke("run.stop", EXP, "--cluster", str(inv), cwd=elsewhere)
    assert stop.returncode == 0 and ("stopped: "
                                    "job ") in stop.stdout and "STOPPED" in stop.stdout, stop.stdout + stop.stderr
    assert status_of(ray_head.address) == "STOPPED"
    again = invoke("run.stop", EXP, "--address", ray_head.address, cwd=elsewhere)
    assert again.returncode == 0 and "ended: job" in again.stdout
    unknown = invoke("run.status", "no-such-exp", "--address", ray_head.address, cwd=elsewhere)
    assert unknown.returncode == 2 and ("names no job slimeforge "
                                       "submitted") in unknown.stderr and "Traceback" not in unknown.stderr


def signal_masks(pid: int) -> str:
    """Each thread's ignored, blocked and caught signals (/proc), for a failure's message."""
    lines = []
    try:
        tasks = sorted(Path(f"/proc/{pid}/task").iterdir())
    except OSError as exc:  # it ended already: what the test then asserts says more
        return f"(no /proc/{pid}/task: {exc})"
    for task in tasks:
        try:
            status = (task / "status").read_text()
            comm = (task / "comm").read_text().strip()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if line.startswith("Sig"))
        lines.append(f"{task.name} {comm}: " + " ".join(f"{k}={v}" for k, v in fields.items()
                                                         if k in ("SigBlk", "SigIgn", "SigCgt")))
    return "\n".join(lines)


def test_ctrl_c_while_following_detaches_and_the_job_keeps_running(env, ray_head):
    exp = "sf-detach-sigint"
    # `invoke run` as a terminal starts it: Ctrl-C's SIGINT handled by Python. A process inherits an
    # ignored SIGINT (bash ignores SIGINT and SIGQUIT in what it starts with `&` when there is no job
    # control, as when CI itself is started in the background), and Python then leaves it ignored:
    # the invoke process measured SigIgn 0x...1006 here and followed on for 60 s. So the child sets the
    # handler a terminal's shell would have left it, then runs invoke as `python -m invoke` does.
    # PYTHONFAULTHANDLER: a run that does not end after the SIGINT is sent SIGABRT, and Python prints
    # every thread's stack first (where it waits is the failure's message).
    as_from_a_terminal = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                          "sys.argv[0] = 'invoke'; runpy.run_module('invoke', run_name='__main__', alter_sys=True)")
    proc = subprocess.Popen([sys.executable, "-c", as_from_a_terminal, *launch_args(env, ray_head.address, exp_id=exp)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONFAULTHANDLER": "1", "PYTHONUNBUFFERED": "1"})
    try:
        wait_for(lambda: (env / "run" / "job.log").exists() and "standin: "
                                                                "waiting" in (env / "run" / "job.log").read_text(),
                 180, "the job to run")
        masks = signal_masks(proc.pid)
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            out, _ = proc.communicate(timeout=30)
            pytest.fail(f"`invoke run` still ran 60 s after its SIGINT; its signal masks then:\n{masks}\n"
                        f"its output and stacks:\n{out}")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    assert "interrupted: detached from job" in out and "Ctrl-C never stops it" in out and (f"invoke run.stop {exp} "
                                                                                          "--address") in out, out
    assert status_of(ray_head.address, exp) == "RUNNING"
    stop = invoke("run.stop", str(env / "run"))  # here, the run directory names it too
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert status_of(ray_head.address, exp) == "STOPPED"


def test_a_head_killed_under_a_following_run_is_a_clear_exit_3(env):
    head = steady_head()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "invoke", *launch_args(env, head.address,
                                                                              exp_id="sf-head-killed")], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "SLIMEFORGE_HEAD_LOST_S": "5"})
        wait_for(lambda: (env / "run" / "job.log").exists() and "standin: "
                                                                "waiting" in (env / "run" / "job.log").read_text(),
                 180, "the job to run")
        assert head.proc is not None
        os.killpg(head.proc.pid, signal.SIGKILL)  # the head and everything it started: its own process group
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        head.stop()
    assert proc.returncode == 3, out + err
    assert "Traceback" not in out + err
    assert f"the Ray Jobs API at {head.address}" in err and "while following job sf-head-killed-" in err, err
    assert "does not answer" in err and "no answer for 5 s" in err and "run.status sf-head-killed" in err, err


class Worker:
    """A second Ray node on this machine (`ray start --address HEAD --block`), killed with its process group."""

    def __init__(self, head: RayHead):
        from launch_support import VENV_BIN, free_port

        self.argv = [str(VENV_BIN / "ray"), "start", "--block", "--address", f"127.0.0.1:{head.port}", "--num-cpus",
                     "1",
                     "--node-manager-port", str(free_port()), "--object-manager-port", str(free_port()),
                     "--dashboard-agent-listen-port", str(free_port()), "--metrics-export-port", str(free_port()),
                     "--runtime-env-agent-port", str(free_port()), "--min-worker-port", "0", "--max-worker-port", "0",
                     "--object-store-memory", str(100 * 2**20), "--disable-usage-stats"]
        self.head = head
        self.proc: subprocess.Popen | None = None

    def start(self) -> Worker:
        before = alive_count(self.head.address)
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        wait_for(lambda: alive_count(self.head.address) > before, 240, "the worker node to join")
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=60)


def alive_count(address: str) -> int:
    try:
        return sum(1 for state, _ in JobsApi(address).nodes().values() if state == "ALIVE")
    except NoAnswer:
        return -1


def test_a_lost_worker_restarts_the_run_which_resumes_from_its_checkpoint(env, ray_head):
    """--max-restarts 1: the worker's Ray is killed mid-run; the stand-in trainer (which saved
    iteration 1 as its checkpoint) fails on the lost node; once the node is back (no inventory:
    waited for), the same run is submitted again and resumes from iteration 1."""
    worker = Worker(ray_head).start()
    resumed = env / "resumed.txt"
    args = launch_args(env, ray_head.address, exp_id="sf-restart", STANDIN_CHECKPOINT="1", STANDIN_RESUMED=str(resumed),
                       STANDIN_WATCH_NODES="1")
    proc = subprocess.Popen([sys.executable, "-m", "invoke", *args, "--max-restarts", "1"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: (env / "run" / "job.log").exists() and "standin: watching 2 "
                                                                "node(s)" in (env / "run" / "job.log").read_text(),
                 240, "the job to watch both nodes")
        worker.kill()
        wait_for(lambda: alive_count(ray_head.address) == 1, 180, "Ray to see the worker's node dead")
        worker = Worker(ray_head).start()  # the node comes back (an inventory's cluster.up would bring it)
        out, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
        worker.kill()
    assert proc.returncode == 0, out
    assert "were lost; restart 1 of 1" in out and "(attempt 2)" in (env / "run" / "job.log").read_text(), out
    assert resumed.read_text() == "resumed from 1\n"
    st = invoke("run.status", "sf-restart", "--address", ray_head.address)
    assert ("attempts (2, --max-restarts):" in st.stdout and "1. sf-restart-" in st.stdout
            and ": FAILED" in st.stdout and ": SUCCEEDED" in st.stdout), st.stdout
