"""cluster.up / status / down against real sshd hosts (network namespaces) and a real Ray cluster.

Each test stands alone, in any order (`pytest -p random_order`): the ones that use the shared
cluster ask for `running` (cluster.up, which converges: a no-op when it is up, a bring-up when a
test before took it down), the ones that need the lab without Ray ask for `idle_lab`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shlex
import signal
import time

import pytest
from cluster_helpers import environment_python, inventory_data, write_inventory, write_lock

from slimeforge.cluster import agent, bringup, clusterrecord, statustable
from slimeforge.cluster import raycluster as cluster
from slimeforge.cluster.inventory import load_inventory
from slimeforge.errors import Problem, SlimeforgeError
from slimeforge.proc import pid_alive

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def records(lab, name: str) -> dict[str, dict]:
    """What the node agent recorded on each host (the lab's hosts share this filesystem)."""
    out = {}
    for h in lab.hosts:
        path = lab.workdir / "state" / name / h.name / "ray.json"
        if path.exists():
            out[h.name] = json.loads(path.read_text())
    return out


@contextlib.contextmanager
def state_home(home):
    """SLIMEFORGE_STATE_HOME for a module fixture (monkeypatch is per test)."""
    old = os.environ.get("SLIMEFORGE_STATE_HOME")
    os.environ["SLIMEFORGE_STATE_HOME"] = str(home)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SLIMEFORGE_STATE_HOME", None)
        else:
            os.environ["SLIMEFORGE_STATE_HOME"] = old


@pytest.fixture(scope="module")
def shared(lab, tmp_path_factory):
    """The inventory of a 3-node Ray cluster the tests share; taken down at the end whatever happened."""
    name = f"{lab.tag}-run"
    home = tmp_path_factory.mktemp("state-home")
    inv = write_inventory(tmp_path_factory.mktemp("inv") / "lab.yaml", inventory_data(lab, name))
    try:
        yield {"inventory": inv, "name": name, "home": home}
    finally:
        with state_home(home):
            cluster.down(inv, control_dir=lab.control_dir, stream=io.StringIO())


@pytest.fixture
def running(lab, shared, monkeypatch):
    """The shared cluster, up: cluster.up converges, so this is cheap when a test before left it up."""
    monkeypatch.setenv("SLIMEFORGE_STATE_HOME", str(shared["home"]))
    out = io.StringIO()
    address = cluster.up(shared["inventory"], control_dir=lab.control_dir, stream=out)
    return {**shared, "address": address, "log": out.getvalue()}


@pytest.fixture
def idle_lab(lab, shared):
    """The lab without Ray (these tests count Ray's processes and need its ports free): the shared
    cluster is taken down if a test before brought it up."""
    if records(lab, shared["name"]):
        with state_home(shared["home"]):
            cluster.down(shared["inventory"], control_dir=lab.control_dir, stream=io.StringIO())
    assert lab.ray_processes() == {}
    return lab


def test_unreachable_host_is_named_and_nothing_starts(idle_lab, tmp_path):
    lab = idle_lab
    name = f"{lab.tag}-unr"
    dead = {"name": "h9", "address": lab.unused_ip(), "gpus": 2, "temp_dir": f"{lab.workdir}/unrh9"}
    inv = write_inventory(tmp_path / "inv.yaml", inventory_data(lab, name, extra_hosts=[dead]))
    out = io.StringIO()

    with pytest.raises(bringup.ClusterError) as err:
        cluster.up(inv, control_dir=lab.control_dir, stream=out)

    assert set(err.value.failures) == {"h9"}
    message = str(err.value)
    assert "stopped at connect" in message and "Ray was not started on any host" in message
    assert lab.unused_ip() in err.value.failures["h9"]  # ssh's own words: which address, what went wrong
    row = next(line for line in message.splitlines() if line.startswith("h9 "))
    assert "FAILED" in row
    assert all("FAILED" not in line for line in message.splitlines() if line.startswith(("h1 ", "h2 ", "h3 ")))
    assert records(lab, name) == {}
    assert lab.ray_processes() == {}
    assert "h9" in out.getvalue()  # the plain progress lines name every host as it goes


def test_failed_checks_stop_before_ray_and_name_the_host(idle_lab, tmp_path):
    lab = idle_lab
    name = f"{lab.tag}-chk"
    # h3 declares more GPUs than nvidia-smi shows: preflight stops everything.
    inv = write_inventory(tmp_path / "gpus.yaml", inventory_data(lab, name, overrides={"h3": {"gpus": 4}}))
    with pytest.raises(bringup.ClusterError) as err:
        cluster.up(inv, control_dir=lab.control_dir, stream=io.StringIO())
    assert err.value.failures == {"h3": "declares 4 GPU(s) but nvidia-smi shows 2"}
    assert "stopped at preflight" in str(err.value)

    # h2 has another install (a different stack lock): the environment phase names it.
    other = write_lock(lab.workdir / "prefix-other", {"stack": "cu129", "note": "not the head's"})
    overrides = {"h2": {"prefix": str(other), "python": environment_python()}}
    inv = write_inventory(tmp_path / "lock.yaml", inventory_data(lab, name, overrides=overrides))
    with pytest.raises(bringup.ClusterError) as err:
        cluster.up(inv, control_dir=lab.control_dir, stream=io.StringIO())
    assert list(err.value.failures) == ["h2"]
    assert ("install lock (sha256 of stack.lock.json)" in err.value.failures["h2"]
            and "differs from the head's" in err.value.failures["h2"])

    # h1's install is missing its lock: named with what to do.
    missing = lab.workdir / "prefix-empty"
    missing.mkdir(exist_ok=True)
    overrides = {"h1": {"prefix": str(missing), "python": environment_python()}}
    inv = write_inventory(tmp_path / "nolock.yaml", inventory_data(lab, name, overrides=overrides))
    with pytest.raises(bringup.ClusterError) as err:
        cluster.up(inv, control_dir=lab.control_dir, stream=io.StringIO())
    assert f"no install lock at {missing}/stack.lock.json" in err.value.failures["h1"]

    # The host-setup seam (where the doctor's checks plug in) runs its commands over ssh.
    class ShmCheck(bringup.DefaultSetup):
        def checks(self, host, remote):
            df = remote.run(["df", "-P", "/dev/shm"], step="df /dev/shm", timeout=60)
            kib = int(df.stdout.splitlines()[1].split()[1])
            return [Problem("/dev/shm", "is smaller than the check requires", f"{kib} KiB",
                            ">= 1 PiB")] if host.name == "h2" else []

    inv = write_inventory(tmp_path / "ok.yaml", inventory_data(lab, name))
    with pytest.raises(bringup.ClusterError) as err:
        cluster.up(inv, control_dir=lab.control_dir, stream=io.StringIO(), setup=ShmCheck())
    assert (list(err.value.failures) == ["h2"]
            and err.value.failures["h2"].startswith("/dev/shm: is smaller than the check requires (got '"))

    # --nccl-check copies nccl_check.py to every host and runs it with the environment's python;
    # this environment has no torch (and there is no GPU here), which every host must report.
    if importlib.util.find_spec("torch") is None:
        with pytest.raises(bringup.ClusterError) as err:
            cluster.up(inv, control_dir=lab.control_dir, stream=io.StringIO(), nccl_check=True)
        assert "stopped at environment" in str(err.value)
        assert set(err.value.failures) == {"h1", "h2", "h3"}
        assert all(why.startswith("NCCL all-reduce failed: nccl_check: torch is not installed")
                   for why in err.value.failures.values())
        copied = lab.workdir / "state" / name / "h1" / "nccl_check.py"
        assert copied.read_text() == (agent.SCRIPTS / "nccl_check.py").read_text()

    assert records(lab, name) == {}
    assert lab.ray_processes() == {}


def test_job_runs_a_task_on_every_node(lab, running):
    from ray.job_submission import JobStatus, JobSubmissionClient

    ips = sorted(h.ip for h in lab.hosts)
    assert running["address"] == clusterrecord.ClusterAddress(f"{lab.hosts[0].ip}:6379",
                                                              f"http://{lab.hosts[0].ip}:8265")
    # What `invoke run --cluster INVENTORY` passes on: resolved from the inventory and the state.
    assert clusterrecord.address(running["inventory"]) == running["address"]

    code = "\n".join(
        [
            "import json, ray",
            "from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy",
            "ray.init()",
            "@ray.remote(num_cpus=1)",
            "def where():",
            "    return ray.util.get_node_ip_address()",
            "nodes = [n for n in ray.nodes() if n['Alive']]",
            "refs = [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n['NodeID'], "
            "soft=False)).remote() for n in nodes]",
            "print('NODE_IPS=' + json.dumps(sorted(ray.get(refs))))",
            "print('GPUS=' + json.dumps(ray.cluster_resources().get('GPU')))",
        ]
    )
    client = JobSubmissionClient(running["address"].dashboard)
    job = client.submit_job(entrypoint=shlex.join([environment_python(), "-c", code]))
    deadline = time.monotonic() + 300
    while client.get_job_status(job) not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
        assert time.monotonic() < deadline, client.get_job_logs(job)
        time.sleep(1)
    logs = client.get_job_logs(job)
    assert client.get_job_status(job) == JobStatus.SUCCEEDED, logs
    line = next(x for x in logs.splitlines() if x.startswith("NODE_IPS="))
    assert json.loads(line.split("=", 1)[1]) == ips
    assert "GPUS=6.0" in logs


def test_status_shows_every_host(lab, running):
    rows = statustable.status(running["inventory"], control_dir=lab.control_dir)
    assert [r["host"] for r in rows] == ["h1", "h2", "h3"]
    for row, host in zip(rows, lab.hosts, strict=True):
        assert row["node_ip"] == host.ip
        assert row["node"] == "ALIVE"
        assert row["gpus_ray"] == 2 and row["gpus_seen"] == 2
        assert row["ray"] == "2.60.0" and row["python"]
        assert row["ray_process"].endswith("running")
        assert "error" not in row


def test_rerun_converges_restarting_only_what_is_missing(lab, running):
    before = records(lab, running["name"])
    assert set(before) == {"h1", "h2", "h3"}
    # h3's Ray goes away (a crash, a reboot): up again brings back h3 alone.
    os.kill(before["h3"]["pid"], signal.SIGTERM)
    deadline = time.monotonic() + 60
    while pid_alive(before["h3"]["pid"]):
        assert time.monotonic() < deadline
        time.sleep(0.2)

    out = io.StringIO()
    address = cluster.up(running["inventory"], control_dir=lab.control_dir, stream=out)
    after = records(lab, running["name"])
    assert address == running["address"]
    assert after["h1"]["pid"] == before["h1"]["pid"] and after["h2"]["pid"] == before["h2"]["pid"]
    assert after["h3"]["pid"] != before["h3"]["pid"] and pid_alive(after["h3"]["pid"])
    log = out.getvalue()
    assert f"already running, pid {before['h1']['pid']}" in log
    assert f"started, pid {after['h3']['pid']}" in log
    rows = statustable.status(running["inventory"], control_dir=lab.control_dir)
    assert [r["node"] for r in rows] == ["ALIVE"] * 3


def test_dry_run_of_the_running_cluster_touches_nothing(lab, running):
    inv = load_inventory(running["inventory"])
    lines = cluster.plan(inv, control_dir=str(lab.workdir / "cm-dry"))
    assert not (lab.workdir / "cm-dry").exists()
    text = "\n".join(lines)
    for h in inv.hosts:
        assert f"{h.name} ({h.role}, {h.address}, 2 GPU(s))" in text
    assert "--head" in text and "--address HEAD_IP:6379" in text


def test_down_stops_exactly_what_up_started(lab, running):
    started = records(lab, running["name"])
    pids = {name: rec["pid"] for name, rec in started.items()}
    assert lab.ray_processes(), "Ray should be running before cluster.down"

    results = cluster.down(running["inventory"], control_dir=lab.control_dir, stream=io.StringIO())

    assert {n: r["pid"] for n, r in results.items()} == pids
    assert all(r["stopped"] and not r["forced"] for r in results.values())
    assert not any(pid_alive(pid) for pid in pids.values())
    assert lab.ray_processes() == {}  # no gcs_server, raylet, dashboard or worker left in any namespace
    assert records(lab, running["name"]) == {}
    assert all(lab.netns_processes(h) for h in lab.hosts), "the hosts' sshd must still run: down touches only Ray"
    with pytest.raises(SlimeforgeError, match="no record of a bring-up"):
        clusterrecord.address(running["inventory"])
    # Idempotent: nothing left to stop is not an error.
    again = cluster.down(running["inventory"], control_dir=lab.control_dir, stream=io.StringIO())
    assert all(not r["stopped"] for r in again.values())
