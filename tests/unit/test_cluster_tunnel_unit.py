"""The Jobs API over ssh (cluster/tunnel.py): the exact argv through the inventory's ssh settings,
when a tunnel is opened, and its life as a child process we own (ready, then stopped by pid).
The real ssh tunnel through a bastion is tests/integration/cluster/test_cluster_tunnel.py."""

from __future__ import annotations

import contextlib
import socket
import sys
from pathlib import Path

import pytest
import yaml

from slimeforge.cluster import tunnel
from slimeforge.cluster.inventory import load_inventory
from slimeforge.cluster.ssh import SSH
from slimeforge.proc import Runner, pid_alive


def inventory(tmp_path: Path, ssh: dict | None = None) -> Path:
    key = tmp_path / "id_lab"
    key.write_text("not a key\n")
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump({
        "mode": "host", "prefix": "/opt/sf",
        "ssh": {"user": "ubuntu", "port": 2222, "key": str(key), "connect_timeout": 7, **(ssh or {})},
        "hosts": [{"name": "head", "address": "10.0.0.1", "role": "head", "gpus": 8}, {"name": "b",
                                                                                       "address": "10.0.0.2",
                                                                                       "gpus": 8}],
    }))  # fmt: skip
    return path


def test_argv_goes_the_inventory_s_ssh_way_on_a_connection_of_its_own(tmp_path):
    inv = load_inventory(inventory(tmp_path, {"proxy_jump": "ops@bastion.example.com:2200", "proxy_command": None}))
    ssh = SSH(inv.head.ssh, inv.ssh_options)
    argv = tunnel.tunnel_argv(ssh, 41234, "10.0.0.1", 8265)
    assert argv[0] == "ssh" and argv[-2:] == ["--", "10.0.0.1"]
    opts = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    # Never a ControlMaster's: a forward asked of a master would outlive our process.
    assert ("ControlMaster=no" in opts and "ControlPath=none" in opts and not any(o.startswith("ControlPersist")
                                                                                  for o in opts))
    assert {"BatchMode=yes", "ConnectTimeout=7", "ExitOnForwardFailure=yes"} <= set(opts)
    assert argv[argv.index("-J") + 1] == "ops@bastion.example.com:2200"
    assert (argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-l") + 1] == "ubuntu" and argv[argv.index("-i")
        + 1] == str(tmp_path / "id_lab"))
    # Loopback only on this machine, to the head's node IP and dashboard port; no command.
    assert argv[argv.index("-L") + 1] == "127.0.0.1:41234:10.0.0.1:8265" and "-N" in argv
    assert argv.index("-L") < argv.index("--")


def test_argv_with_a_proxy_command_and_an_ipv6_head(tmp_path):
    inv = load_inventory(inventory(tmp_path, {"proxy_command": "aws ssm start-session --target %h"}))
    argv = tunnel.tunnel_argv(SSH(inv.head.ssh, inv.ssh_options), 40000, "fd00::11", 8265)
    assert "ProxyCommand=aws ssm start-session --target %h" in argv
    assert argv[argv.index("-L") + 1] == "127.0.0.1:40000:[fd00::11]:8265"


def test_ssh_tunnel_setting_is_checked(tmp_path):
    from slimeforge.errors import ConfigError

    assert load_inventory(inventory(tmp_path)).ssh_options.tunnel == "auto"
    assert load_inventory(inventory(tmp_path, {"tunnel": "always"})).ssh_options.tunnel == "always"
    with pytest.raises(ConfigError) as err:
        load_inventory(inventory(tmp_path, {"tunnel": "yes"}))
    assert "ssh.tunnel" in str(err.value) and "'auto'" in str(err.value)


@contextlib.contextmanager
def listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


def test_when_a_tunnel_is_used(tmp_path):
    inv = load_inventory(inventory(tmp_path))
    with listener() as port:
        url = f"http://127.0.0.1:{port}"
        # auto: the dashboard answers, so directly; never: directly, whatever answers.
        assert tunnel.jobs_api(inv, url, mode="auto", dry_run=False) == (url, None)
        assert tunnel.jobs_api(inv, url, mode="never", dry_run=False) == (url, None)
    # A dry run connects to nothing and starts nothing; `always` is said in the plan.
    url = "http://10.0.0.1:8265"
    assert tunnel.jobs_api(inv, url, mode="auto", dry_run=True) == (url, None)
    address, via = tunnel.jobs_api(inv, url, mode="always", dry_run=True)
    assert address == url and via is not None and "ssh tunnel to head" in via
    with pytest.raises(tunnel.TunnelError, match="not one of auto, always, never"):
        tunnel.jobs_api(inv, url, mode="sometimes", dry_run=True)


class StandInSSH(Runner):
    """Runs a stand-in for ssh: it listens on -L's local port (as ssh does once logged in), or
    exits at once with ssh's message (as ssh does when it cannot log in)."""

    def __init__(self, fail: str | None = None):
        super().__init__()
        self.fail = fail
        self.asked: list[list[str]] = []  # the argv ssh was started with

    def start(self, argv, **kw):  # type: ignore[override]
        self.asked.append(list(argv))
        local = int(argv[argv.index("-L") + 1].split(":")[1])
        code = (f"import sys; sys.stderr.write({self.fail!r} + chr(10)); sys.exit(255)" if self.fail else
                f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {local})); s.listen(); "
                "time.sleep(600)")
        return super().start([sys.executable, "-c", code], **kw)


def test_tunnel_is_ready_when_its_port_answers_and_stopped_by_pid(tmp_path):
    inv = load_inventory(inventory(tmp_path))
    runner, said = StandInSSH(), []
    with contextlib.ExitStack() as stack:
        address, via = tunnel.jobs_api(inv, "http://10.0.0.1:8265", mode="always", dry_run=False, stack=stack,
                                       runner=runner, say=said.append)
        assert address.startswith("http://127.0.0.1:") and via
        port = int(address.rsplit(":", 1)[1])
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # it forwards (here: answers)
        # The argv it ran is the tunnel's: -L to the head's dashboard.
        assert f"127.0.0.1:{port}:10.0.0.1:8265" in runner.asked[-1] and runner.asked[-1][0] == "ssh"
        assert said[0].startswith("[slimeforge] cluster lab: the Jobs API through an ssh tunnel to head (asked for "
                                  f"(ssh.tunnel: always or --tunnel)): {address} -> 10.0.0.1:8265 (ssh pid ")
        pid = int(said[0].rsplit("ssh pid ", 1)[1].rstrip(")"))
        assert pid_alive(pid)
    assert not pid_alive(pid)  # stopped by its pid when the launch's `with` ended


def test_tunnel_that_cannot_log_in_says_what_ssh_said(tmp_path):
    inv = load_inventory(inventory(tmp_path))
    runner = StandInSSH(fail="ssh: connect to host 10.0.0.1 port 2222: Connection refused")
    with pytest.raises(tunnel.TunnelError) as err:
        tunnel.jobs_api(inv, "http://10.0.0.1:8265", mode="always", dry_run=False, runner=runner, say=lambda _: None)
    text = str(err.value)
    assert ("head: cannot tunnel to the Jobs API at 10.0.0.1:8265 over ssh: ssh: connect to host 10.0.0.1 port 2222: "
           "Connection refused") in text
    assert "docs/cluster.md#ports" in text


def test_run_cluster_dry_run_says_the_jobs_api_goes_through_a_tunnel(tmp_path):
    """cluster_env (what `invoke run --cluster` resolves): ssh.tunnel or --tunnel reach the Cluster and
    the plan's notes; a dry run starts nothing."""
    from launch_support import make_recipe

    from slimeforge.cluster import runcheck
    from slimeforge.run.recipecheck import parse_recipe
    from slimeforge.run.targets import jobsubmit
    from slimeforge.run.targets.base import ResolvedRun

    path = inventory(tmp_path, {"tunnel": "always"})
    data = yaml.safe_load(path.read_text())
    data["hosts"][0]["node_ip"] = "10.0.0.1"  # the address without a record of cluster.up
    path.write_text(yaml.safe_dump(data))
    cluster = runcheck.cluster_env(str(path), dry_run=True)
    assert cluster.address == "http://10.0.0.1:8265" and cluster.via and "ssh tunnel to head" in cluster.via
    assert runcheck.cluster_env(str(path), dry_run=True, tunnel="never").via is None  # the command line's word wins
    r, stack = parse_recipe(make_recipe(tmp_path, mode="host"), "test")
    plan = jobsubmit.ClusterTarget(cluster).plan(ResolvedRun(r, stack, (tmp_path / "run").resolve(), "test", {}, None,
                                                             (), False))
    assert cluster.via in plan.notes
