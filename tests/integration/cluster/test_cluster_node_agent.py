"""The node agent on this machine (as cluster.up sends it: `python3 - COMMAND JSON` on stdin)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from slimeforge.cluster.agent import SCRIPTS, agent_source

AGENT = SCRIPTS / "node_agent.py"


def agent(command: str, params: dict) -> dict:
    r = subprocess.run([sys.executable, "-", command, json.dumps(params)], input=agent_source(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


# A process that starts a child, then says it is ready and waits: a small `ray start --block`.
TREE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open("child.pid", "w").write(str(child.pid))
print("READY", flush=True)
time.sleep(600)
"""


def test_facts_ports_and_reachability(tmp_path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        busy = server.getsockname()[1]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed = s.getsockname()[1]
        facts = agent("facts", {"state_dir": str(tmp_path / "state"), "head_ip": "127.0.0.1", "ports": [busy, closed], "reach": [["127.0.0.1", busy], ["127.0.0.1", closed]]})
    assert facts["hostname"] == socket.gethostname()
    assert facts["addresses"]["lo"] == "127.0.0.1"
    assert facts["route"] == {"dev": "lo", "src": "127.0.0.1"}
    assert facts["ports_busy"] == [busy]
    assert facts["reach"][f"127.0.0.1:{busy}"] is None
    assert "refused" in facts["reach"][f"127.0.0.1:{closed}"]
    assert facts["record"] is None
    assert facts["state_dir"] == str(tmp_path / "state")


def test_start_waits_for_the_marker_and_stop_ends_the_whole_tree(tmp_path):
    state = tmp_path / "state"
    params = {"state_dir": str(state), "argv": [sys.executable, "-c", TREE], "env": {"SF_TEST": "1"}, "marker": "READY", "timeout": 120}
    started = agent("start", params)
    assert started["ok"] and not started.get("already")
    pid = started["record"]["pid"]
    child = int((state / "child.pid").read_text())  # cwd is the state directory
    assert alive(pid) and alive(child)
    assert os.getsid(pid) == pid  # its own session: the ssh session ending does not hang it up
    assert Path(f"/proc/{pid}/environ").read_bytes().split(b"\0").count(b"SF_TEST=1") == 1

    again = agent("start", params)  # converges: the recorded process runs, nothing new starts
    assert again["already"] and again["record"]["pid"] == pid
    facts = agent("facts", {"state_dir": str(state)})
    assert facts["record"]["running"] and "READY" in facts["record"]["log_tail"]

    stopped = agent("stop", {"state_dir": str(state), "timeout": 3})
    # python exits on SIGTERM at once; its child was in the tree taken before the signal.
    assert stopped["stopped"] and stopped["pid"] == pid and stopped["processes"] == 2
    # Unlike `ray start --block`, this parent does not stop its child: after the timeout the
    # child, recorded in the tree before the signal, gets SIGKILL by pid.
    assert stopped["forced"] == [child]
    assert not alive(pid) and not alive(child)
    assert not (state / "ray.json").exists()
    assert agent("stop", {"state_dir": str(state)}) == {"ok": True, "stopped": False, "reason": "nothing recorded"}


def test_start_reports_an_early_exit_with_the_log(tmp_path):
    result = agent("start", {"state_dir": str(tmp_path), "argv": [sys.executable, "-c", "print('bad flag --foo'); raise SystemExit(3)"], "marker": "READY", "timeout": 60})
    assert not result["ok"] and result["error"] == "exited before it was ready"
    assert "bad flag --foo" in result["log_tail"]


def test_start_refuses_when_the_head_is_unreachable(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = agent("start", {"state_dir": str(tmp_path), "argv": ["true"], "reach_first": ["127.0.0.1", port], "timeout": 10})
    assert not result["ok"] and f"127.0.0.1:{port}" in result["error"] and "refused" in result["error"]
    assert not (tmp_path / "ray.json").exists()


def test_stop_never_signals_a_reused_pid(tmp_path):
    # A record whose pid now belongs to another process (same pid, other start time): left alone.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        (tmp_path / "ray.json").write_text(json.dumps({"pid": other.pid, "starttime": 1, "argv": ["ray"]}))
        result = agent("stop", {"state_dir": str(tmp_path)})
        assert not result["stopped"] and "no longer running" in result["reason"]
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_nodes_reports_an_unreachable_dashboard_as_an_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = agent("nodes", {"url": f"http://127.0.0.1:{port}/api/v0/nodes", "timeout": 5})
    assert "refused" in result["error"]


@pytest.mark.docker
def test_container_start_and_stop_by_recorded_id(tmp_path, base_image):
    name = f"sfc-agent-{os.getpid()}"
    argv = ["docker", "run", "--detach", "--name", name, "--label", "slimeforge.test=cluster", base_image, "sh", "-c", "echo READY; exec sleep 600"]
    try:
        started = agent("start", {"state_dir": str(tmp_path), "argv": argv, "container": True, "marker": "READY", "timeout": 120})
        assert started["ok"], started
        cid = started["record"]["container"]
        running = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}} {{.Name}}", cid], capture_output=True, text=True)
        assert running.stdout.split() == ["true", f"/{name}"]
        assert "READY" in (tmp_path / "ray.log").read_text()

        stopped = agent("stop", {"state_dir": str(tmp_path), "timeout": 1})
        assert stopped["stopped"] and stopped["container"] == cid
        assert subprocess.run(["docker", "inspect", cid], capture_output=True).returncode != 0  # removed
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
