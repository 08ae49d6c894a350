"""Issue 33, the hosts side, unit by unit: IPv6 addresses where ssh and host:port need them, an
inventory's ssh config file held to the allow list (and --ssh-config, the user's own, as is),
the node agent's record and its proofs (scripts/hostrecord.py), and down's and status's report
of a refusal."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from slimeforge.cluster import addresses, clusterrecord, nodestart, statustable
from slimeforge.cluster import raycluster as cluster
from slimeforge.cluster.bringup import ClusterError
from slimeforge.cluster.inventory import load_inventory
from slimeforge.cluster.ssh import SSH
from slimeforge.cluster.sshconfig import config_problems
from slimeforge.errors import ConfigError
from slimeforge.proc import Result
from slimeforge.scripts import hostrecord


def write(tmp_path: Path, hosts: list[dict], **top) -> Path:
    data = {"name": "lab", "mode": "host", "prefix": "/opt/sf", "hosts": hosts, **top}
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


V6 = [{"name": "a", "address": "[fd00::11]", "role": "head", "gpus": 1, "node_ip": "fd00::11"},
      {"name": "b", "address": "fd00::12", "gpus": 1}]


def test_ipv6_hosts_reach_ssh_bare_and_host_port_bracketed(tmp_path):
    inv = load_inventory(write(tmp_path, V6, ssh={"proxy_jump": "ops@fd00::1"}))
    head, worker = inv.hosts
    assert head.ssh.address == "fd00::11" and worker.ssh.address == "fd00::12"
    argv = SSH(head.ssh, inv.ssh_options).command(["true"])
    assert argv[argv.index("--") + 1] == "fd00::11"  # after `--`: never an option
    assert argv[argv.index("-J") + 1] == "ops@[fd00::1]"  # ssh needs the brackets to tell a port
    ray = nodestart.ray_start_argv(inv, worker, "fd00::12", "fd00::11")
    assert ray[ray.index("--address") + 1] == "[fd00::11]:6379"
    assert clusterrecord.address(inv) == clusterrecord.ClusterAddress("[fd00::11]:6379", "http://[fd00::11]:8265")
    assert "until [fd00::11]:8265/api/v0/nodes" in "\n".join(cluster.plan(inv, control_dir=str(tmp_path)))


@pytest.mark.parametrize("a,b", [("fd00::11", "fd00:0::11"), ("[fd00::11]", "FD00::11"), ("10.0.0.1", "10.0.0.1.")])
def test_one_host_however_it_is_spelt(tmp_path, a, b):
    hosts = [{"name": "a", "address": a, "role": "head", "gpus": 1}, {"name": "b", "address": b, "gpus": 1}]
    with pytest.raises(ConfigError, match="is the same host as hosts.0's"):
        load_inventory(write(tmp_path, hosts))


@pytest.mark.parametrize("bad", ["fd00::zz", "[fd00::1", "10.0.0.1:22", "[10.0.0.1]", "fe80::1%eth0;x",
                                 "-oProxyCommand=x", "a b", "::ffff:1.2.3.4.5"])
def test_addresses_that_are_not_one_are_refused(tmp_path, bad):
    with pytest.raises(ConfigError) as err:
        load_inventory(write(tmp_path, [{"name": "a", "address": bad, "role": "head", "gpus": 1}]))
    assert any(p.where == "hosts.0 (a).address" and p.value == bad for p in err.value.problems)


def test_hostport_and_jump_forms():
    assert addresses.hostport("fd00::1", 22) == "[fd00::1]:22" and addresses.hostport("10.0.0.1", 22) == "10.0.0.1:22"
    assert addresses.jump_hosts("a@b:2222,[fd00::1]:22,fe80::1%eth0") == "a@b:2222,[fd00::1]:22,[fe80::1%eth0]"
    assert addresses.jump_hosts("fd00::1:22") == "[fd00::1:22]"  # bare IPv6 has no port: it is all address
    for bad in ("h:0", "h:65536", "[fd00::1]x", "@h", "a@b@c", "[h]:22", "a,,b"):
        assert addresses.jump_hosts(bad) is None, bad


def test_an_inventorys_ssh_config_is_held_to_the_allow_list(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text('# ours\nHost *\n  User root\n  IdentityFile="~/.ssh/id ed"\n  StrictHostKeyChecking=accept-new\n'
                      'Host gpu-*\n  HostName %h.example.com\n  Port 2222\n  ProxyJump ops@[fd00::1]:22\n')
    assert config_problems(config) == []
    config.write_text("Host *\n  ProxyCommand touch /tmp/x\n  HostName 10.0.0.1 ; touch x\n\tforwardagent "
                      "yes\nnot-a-line\n")
    problems = config_problems(config)
    assert [p.where for p in problems] == [f"ssh.config (ssh_config line {n})" for n in (2, 3, 4, 5)]
    assert "ssh.proxy_command" in problems[0].message and "is not a value of HostName" in problems[1].message
    assert problems[2].value == "forwardagent" and "StrictHostKeyChecking" in problems[2].accepted
    path = write(tmp_path, [{"name": "a", "address": "gpu-a", "role": "head", "gpus": 1}], ssh={"config": "ssh_config"})
    with pytest.raises(ConfigError, match=r"ssh.config \(ssh_config line 2\)"):
        load_inventory(path)
    # The user's own config, passed by the user: ssh reads it as is, in place of the inventory's.
    inv = load_inventory(path, ssh_config=config)
    assert inv.ssh_options.config_file == str(config.resolve())
    with pytest.raises(ConfigError, match="--ssh-config"):
        load_inventory(path, ssh_config=tmp_path / "missing")


def test_an_ssh_config_that_is_a_fifo_or_not_utf8_is_an_error_not_a_hang(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (bad,) = config_problems(fifo)
    assert "FIFO" in bad.message
    (tmp_path / "bin").write_bytes(b"Host \xff\n")
    (bad,) = config_problems(tmp_path / "bin")
    assert "not UTF-8" in bad.message


def test_the_ssh_config_option_of_the_tasks(tmp_path):
    config = tmp_path / "mine"
    config.write_text("Host *\n  ProxyCommand nc %h %p\n")
    path = write(tmp_path, [{"name": "a", "address": "gpu-a", "role": "head", "gpus": 1}], ssh={"config": "mine"})
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "SLIMEFORGE_STATE_HOME": str(tmp_path / "state")}
    refused = subprocess.run([sys.executable, "-m", "invoke", "cluster.up", str(path), "--dry-run"], cwd=root,
                             capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and ("ssh.config (mine line "
                                       "2)") in refused.stderr and "Traceback" not in refused.stderr
    ok = subprocess.run([sys.executable, "-m", "invoke", "cluster.up", str(path), "--dry-run", "--ssh-config",
                         str(config)], cwd=root,
                        capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    assert f"-F {config.resolve()}" in ok.stdout


# --- the node agent's record (scripts/hostrecord.py) ---------------------------------------------


def test_argv_matches_only_the_recorded_ray_start():
    rec = ["/v/bin/ray", "start", "--block", "--num-gpus", "1"]
    assert hostrecord.argv_matches(rec, ["/v/bin/python3", *rec])
    assert hostrecord.argv_matches(rec, rec)
    assert hostrecord.argv_matches(["ray", "start", "--block"], ["/usr/bin/env", "python3", "/v/bin/ray", "start",
                                                                 "--block"])
    for live in ([], None, ["sleep", "300"], ["/v/bin/python3", *rec, "--extra"], ["/v/bin/python3", "/x/ray",
                                                                                   *rec[1:]],
                 ["a", "b", "c", *rec]):
        assert not hostrecord.argv_matches(rec, live), live


def test_record_fields_are_typed():
    good = {"pid": 42, "starttime": 7, "boot_id": "0f0e0d0c-0b0a-4908-8706-050403020100", "argv": ["/v/ray", "start",
                                                                                                   "--block"],
            "token": "ab" * 16, "cluster": "lab", "started_at": 1.5}
    assert hostrecord.record_problem(good) is None
    for change in ({"pid": "42"}, {"pid": True}, {"pid": 1 << 23}, {"pid": 4.0}, {"starttime": -1}, {"boot_id": "x"},
                   {"argv": ["sleep", "300"]}, {"argv": "ray start --block"}, {"token": "AB" * 16}, {"cluster": "a b"},
                   {"extra": 1}):
        assert hostrecord.record_problem({**good, **change}) is not None, change
    container = {"container": "f" * 64, "argv": ["docker", "run"], "token": "ab" * 16, "cluster": "lab",
                 "started_at": 1}
    assert hostrecord.record_problem(container) is None
    for cid in ("registry", "--all", "f" * 12, "F" * 64):
        assert "container (a full id" in hostrecord.record_problem({**container, "container": cid})


@pytest.mark.parametrize("make,says", [
    (lambda p: os.mkfifo(p), "is a FIFO"), (lambda p: p.mkdir(), "is a directory"),
                                       (lambda p: p.symlink_to("/dev/zero"), "is a symlink"),
    (lambda p: p.write_bytes(b"\xff"), "not UTF-8"), (lambda p: p.write_text("[" * 20 + "]" * 20), "nests deeper"),
    (lambda p: p.write_text("x" * 70000), "more than a record holds"), (lambda p: p.write_text("{"), "is not JSON"),
])
def test_a_bad_record_is_an_error_naming_the_file(tmp_path, make, says):
    make(tmp_path / "ray.json")
    with pytest.raises(hostrecord.BadRecord) as err:
        hostrecord.read_record(str(tmp_path))
    assert str(err.value).startswith(str(tmp_path / "ray.json")) and says in str(err.value)


# --- what down and status say about a refusal ----------------------------------------------------


class AgentAnswers:
    """A runner standing in for ssh: each host's node agent answers what it is given."""

    def __init__(self, answers: dict[str, dict]):
        self.answers, self.dry_run = answers, False

    def run(self, argv, **kw):
        host = next(h for h in self.answers if kw.get("step", "").startswith(f"{h}: "))
        if "-O" in argv:
            return Result(argv, 0, "", "")
        return Result(argv, 0, json.dumps(self.answers[host]) + "\n", "")


def test_down_reports_each_refusal_in_its_table_and_keeps_the_state(tmp_path, monkeypatch):
    monkeypatch.setenv("SLIMEFORGE_STATE_HOME", str(tmp_path / "state"))
    hosts = [{"name": "a", "address": "10.0.0.1", "role": "head", "gpus": 1}, {"name": "b", "address": "10.0.0.2",
                                                                               "gpus": 1}]
    inv = load_inventory(write(tmp_path, hosts))
    clusterrecord.state_file(inv).parent.mkdir(parents=True)
    clusterrecord.state_file(inv).write_text(json.dumps({"gcs": "10.0.0.1:6379", "dashboard": "http://10.0.0.1:8265"}))
    answers = {"a": {"ok": True, "stopped": True, "pid": 7, "processes": 3, "forced": []},
               "b": {"ok": False, "stopped": False,
                     "refused": "pid 9 is not the `ray start` slimeforge recorded: it runs 'sleep 300'; left alone"}}
    with pytest.raises(ClusterError) as err:
        cluster.down(inv, runner=AgentAnswers(answers), control_dir=str(tmp_path / "cm"), stream=io.StringIO())
    text = str(err.value)
    assert "refused on 1 host(s)" in text and "could not stop" not in text
    row = next(line for line in text.splitlines() if line.startswith("b "))
    assert "FAILED" in row and "refused: pid 9 is not the `ray start`" in row
    assert "stopped pid 7 and 2 child process(es)" in next(line for line in text.splitlines() if line.startswith("a "))
    assert clusterrecord.state_file(inv).exists()  # down did not finish: its record of the cluster stays


def test_status_shows_a_refused_record(tmp_path, monkeypatch):
    monkeypatch.setenv("SLIMEFORGE_STATE_HOME", str(tmp_path / "state"))
    inv = load_inventory(write(tmp_path, [{"name": "a", "address": "10.0.0.1", "role": "head", "gpus": 0}]))
    facts = {"user": "u", "hostname": "a", "python3": "3.11", "gpus": {"list": []},
             "record": {"refused": "ray.json: is a FIFO", "running": False}}
    runner = AgentAnswers({"a": facts})
    (row,) = statustable.status(inv, runner=runner, control_dir=str(tmp_path / "cm"))
    assert row["ray_process"] == "record refused" and row["error"].startswith("ray.json: is a FIFO")
