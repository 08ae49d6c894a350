"""The node agent on this machine (as cluster.up sends it: `python3 - COMMAND JSON` on stdin)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slimeforge.cluster.agent import agent_source
from slimeforge.scripts import hostrecord

TOKEN, OTHER_TOKEN = "5f" * 16, "a0" * 16


def agent(command: str, params: dict) -> dict:
    r = subprocess.run([sys.executable, "-", command, json.dumps(params)], input=agent_source(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def fake_ray(tmp_path: Path, body: str) -> list[str]:
    """A `ray` script (the shape of the real one: a #! python script) and its `ray start --block` argv:
    the node agent starts nothing else, and stops only that, with the recorded argv."""
    ray = tmp_path / "bin" / "ray"
    ray.parent.mkdir(exist_ok=True)
    ray.write_text(f"#!{sys.executable}\n{body}")
    ray.chmod(0o755)
    return [str(ray), "start", "--block", "--num-gpus", "0"]


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
        facts = agent("facts", {"state_dir": str(tmp_path / "state"), "head_ip": "127.0.0.1", "ports": [busy, closed],
                                "reach": [["127.0.0.1", busy], ["127.0.0.1", closed]]})
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
    params = {"state_dir": str(state), "argv": fake_ray(tmp_path, TREE), "env": {"SF_TEST": "1"}, "marker": "READY",
              "timeout": 120,
              "token": TOKEN, "cluster": "lab"}
    started = agent("start", params)
    assert started["ok"] and not started.get("already")
    pid = started["record"]["pid"]
    child = int((state / "child.pid").read_text())  # cwd is the state directory
    assert alive(pid) and alive(child)
    assert os.getsid(pid) == pid  # its own session: the ssh session ending does not hang it up
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert environ.count(b"SF_TEST=1") == 1 and environ.count(f"SLIMEFORGE_CLUSTER_TOKEN={TOKEN}".encode()) == 1
    record = json.loads((state / "ray.json").read_text())
    assert record["argv"] == params["argv"] and record["token"] == TOKEN and record["boot_id"] == hostrecord.boot_id()

    again = agent("start", params)  # converges: the recorded process runs, nothing new starts
    assert again["already"] and again["record"]["pid"] == pid
    facts = agent("facts", {"state_dir": str(state)})
    assert facts["record"]["running"] and "READY" in facts["record"]["log_tail"]

    # Another cluster's down (another name) is refused, and nothing is signalled.
    refused = agent("stop", {"state_dir": str(state), "timeout": 3, "cluster": "other"})
    assert not refused["stopped"] and "names cluster 'lab', not 'other'" in refused["refused"] and alive(pid)

    stopped = agent("stop", {"state_dir": str(state), "timeout": 3, "cluster": "lab"})
    # python exits on SIGTERM at once; its child was in the tree taken before the signal.
    assert stopped["stopped"] and stopped["pid"] == pid and stopped["processes"] == 2
    # Unlike `ray start --block`, this parent does not stop its child: after the timeout the
    # child, recorded in the tree before the signal, gets SIGKILL by pid.
    assert stopped["forced"] == [child]
    assert not alive(pid) and not alive(child)
    assert not (state / "ray.json").exists()
    assert agent("stop", {"state_dir": str(state)}) == {"ok": True, "stopped": False, "reason": "nothing recorded"}


def test_start_reports_an_early_exit_with_the_log(tmp_path):
    argv = fake_ray(tmp_path, "print('bad flag --foo'); raise SystemExit(3)")
    result = agent("start", {"state_dir": str(tmp_path), "argv": argv, "marker": "READY", "timeout": 60,
                             "token": TOKEN, "cluster": "lab"})
    assert not result["ok"] and result["error"] == "exited before it was ready"
    assert "bad flag --foo" in result["log_tail"]


def test_start_refuses_when_the_head_is_unreachable(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = fake_ray(tmp_path, "")
    result = agent("start", {"state_dir": str(tmp_path), "argv": argv, "reach_first": ["127.0.0.1", port],
                             "timeout": 10, "token": TOKEN, "cluster": "lab"})
    assert not result["ok"] and f"127.0.0.1:{port}" in result["error"] and "refused" in result["error"]
    assert not (tmp_path / "ray.json").exists()


def forged(pid: int, **fields) -> dict:
    """A record as the agent writes it, naming `pid` with its real start time and boot id."""
    st = Path(f"/proc/{pid}/stat").read_text()
    start = int(st[st.rindex(")") + 2 :].split()[19])
    return {"pid": pid, "starttime": start, "boot_id": hostrecord.boot_id(), "argv": ["/opt/sf/venv/bin/ray", "start",
                                                                                      "--block"],
            "token": TOKEN, "cluster": "lab", "started_at": 1.0, **fields}


@pytest.fixture
def sleeper():
    """A `sleep 300` slimeforge did not start: no stop may touch it."""
    proc = subprocess.Popen(["sleep", "300"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_stop_never_signals_a_reused_pid(tmp_path, sleeper):
    # A record whose pid now belongs to another process (same pid, other start time): gone, left alone.
    (tmp_path / "ray.json").write_text(json.dumps(forged(sleeper.pid, starttime=1)))
    result = agent("stop", {"state_dir": str(tmp_path)})
    assert not result["stopped"] and "no longer running" in result["reason"]
    assert sleeper.poll() is None
    assert not (tmp_path / "ray.json").exists()  # a record of what has ended is ours to remove


@pytest.mark.parametrize("case", ["argv", "not-ray", "string-pid", "pid-true"])
def test_stop_refuses_a_recorded_sleep_that_is_not_our_ray(tmp_path, sleeper, case):
    # pid, start time and boot id all match; the argv is not what runs there, or not a record at all.
    record = forged(sleeper.pid)
    record.update({"argv": {}, "not-ray": {"argv": ["sleep", "300"]}, "string-pid": {"pid": str(sleeper.pid)},
                   "pid-true": {"pid": True}}[case])
    (tmp_path / "ray.json").write_text(json.dumps(record))
    result = agent("stop", {"state_dir": str(tmp_path), "timeout": 1})
    assert result["ok"] is False and not result["stopped"] and "left alone" in result["refused"]
    assert (str(tmp_path / "ray.json") in result["refused"]) if case != "argv" else (f"pid {sleeper.pid} is not the "
                                                                                     "`ray start`" in result["refused"])
    assert sleeper.poll() is None  # still alive
    assert (tmp_path / "ray.json").exists()  # the evidence is kept


def test_stop_refuses_a_ray_start_without_this_clusters_token(tmp_path):
    # The exact `ray start --block` argv, pid, start time and boot id: started by hand (or another
    # cluster.up), so its environment lacks the record's token.
    argv = fake_ray(tmp_path, "import time; time.sleep(300)")
    proc = subprocess.Popen(argv, env=dict(os.environ, SLIMEFORGE_CLUSTER_TOKEN=OTHER_TOKEN))
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[1:2] != [argv[0].encode()]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        (tmp_path / "ray.json").write_text(json.dumps(forged(proc.pid, argv=argv)))
        result = agent("stop", {"state_dir": str(tmp_path), "timeout": 1})
        assert "without this cluster's token" in result["refused"] and proc.poll() is None
        facts = agent("facts", {"state_dir": str(tmp_path)})
        assert facts["record"]["running"] is False and "without this cluster's token" in facts["record"]["refused"]
    finally:
        proc.kill()
        proc.wait()


def test_nodes_reports_an_unreachable_dashboard_as_an_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = agent("nodes", {"url": f"http://127.0.0.1:{port}/api/v0/nodes", "timeout": 5})
    assert "refused" in result["error"]


@pytest.mark.docker
def test_container_start_and_stop_by_recorded_id(tmp_path, base_image):
    name = f"sfc-agent-{os.getpid()}"
    argv = ["docker", "run", "--detach", "--name", name, "--label", "slimeforge.cluster=lab", "--label",
            f"slimeforge.cluster_token={TOKEN}",
            base_image, "sh", "-c", "echo READY; exec sleep 600"]
    try:
        started = agent("start", {"state_dir": str(tmp_path), "argv": argv, "container": True, "marker": "READY",
                                  "timeout": 120, "token": TOKEN, "cluster": "lab"})
        assert started["ok"], started
        cid = started["record"]["container"]
        assert len(cid) == 64
        running = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}} {{.Name}}", cid], capture_output=True,
                                 text=True)
        assert running.stdout.split() == ["true", f"/{name}"]
        assert "READY" in (tmp_path / "ray.log").read_text()

        stopped = agent("stop", {"state_dir": str(tmp_path), "timeout": 1})
        assert stopped["stopped"] and stopped["container"] == cid
        assert subprocess.run(["docker", "inspect", cid], capture_output=True).returncode != 0  # removed
    finally:
        subprocess.run(["docker", "rm", "-f", "--", name], capture_output=True)


@pytest.fixture
def unlabelled(base_image):
    """A throwaway container slimeforge did not start, named like the registry people run beside it."""
    name = f"registry-sf-{os.getpid()}"
    cid = subprocess.run(["docker", "run", "--detach", "--name", name, "--label", "slimeforge.cluster=lab", base_image,
                          "sleep", "600"],
                         capture_output=True, text=True, check=True).stdout.strip()
    try:
        yield cid
    finally:
        subprocess.run(["docker", "rm", "-f", "--", cid], capture_output=True)


@pytest.mark.docker
def test_container_stop_refuses_a_container_without_our_labels(tmp_path, unlabelled):
    # Its full id, the cluster's label, but not this cluster's token: not ours. Stopped neither by
    # down nor by a start that would clear the name.
    record = {"container": unlabelled, "argv": ["docker", "run"], "token": TOKEN, "cluster": "lab", "started_at": 1.0}
    (tmp_path / "ray.json").write_text(json.dumps(record))
    for command in ("stop", "start"):
        result = agent(command, {"state_dir": str(tmp_path), "timeout": 1, "token": TOKEN, "cluster": "lab",
                                 "container": True,
                                 "argv": ["docker", "run", "--label", "slimeforge.cluster=lab", "--label",
                                          f"slimeforge.cluster_token={TOKEN}", "x"]})
        assert result["ok"] is False
        assert "carries labels" in (result.get("refused") or result.get("error"))
    state = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", unlabelled], capture_output=True,
                           text=True)
    assert state.stdout.strip() == "true"


@pytest.mark.docker
def test_container_record_by_name_or_option_is_refused_before_docker(tmp_path, unlabelled):
    name = subprocess.run(["docker", "inspect", "-f", "{{.Name}}", unlabelled], capture_output=True,
                          text=True).stdout.strip().lstrip("/")
    for cid in (name, "--all", unlabelled[:12]):
        (tmp_path / "ray.json").write_text(json.dumps({"container": cid, "argv": ["docker", "run"], "token": TOKEN,
                                                       "cluster": "lab", "started_at": 1.0}))
        result = agent("stop", {"state_dir": str(tmp_path), "timeout": 1})
        assert "container (a full id: 64 hex digits)" in result["refused"]
    state = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", unlabelled], capture_output=True,
                           text=True)
    assert state.stdout.strip() == "true"
