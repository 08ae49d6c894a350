"""A cluster this machine reaches only through a bastion: `invoke run --cluster` submits through an
ssh tunnel, and Ray listens on exactly the ports the inventory pins.

The lab: h1 is the head, h3 a worker, h2 the bastion (`ssh.proxy_jump`, for both). A firewall
rule in h1's network namespace (iptables there only) drops everything from this machine (the lab's
gateway address): ssh to h1 goes through h2 (`-J`), and the head's dashboard does not answer from
here, so the Jobs API goes through `ssh -N -L` over the same jump, started and stopped by the launch.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cluster_helpers import inventory_data, write_inventory
from launch_support import FIXTURES, write_catalog
from netlab import NetLab, can_create_namespaces, sh

from slimeforge import rayports
from slimeforge.cluster import raycluster as cluster
from slimeforge.proc import pid_alive
from slimeforge.run.recipecheck import parse_recipe

pytestmark = [pytest.mark.ssh, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]
MODEL = "Qwen2.5-3B-Instruct"


@pytest.fixture(scope="module")
def walled(tmp_path_factory):
    """The lab, the head walled off from this machine, a cluster up on it, a recipe for it."""
    why = can_create_namespaces()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to create network namespaces with sshd: {why}")
        pytest.skip(f"cannot create network namespaces with sshd here: {why}")
    lab = NetLab(3).start()
    home = tmp_path_factory.mktemp("state-home")
    old = os.environ.get("SLIMEFORGE_STATE_HOME")
    os.environ["SLIMEFORGE_STATE_HOME"] = str(home)
    inv = None
    try:
        head, bastion, _ = lab.hosts
        # Only in the head's own network namespace: nothing from this machine gets in.
        sh("ip", "netns", "exec", head.netns, "iptables", "-A", "INPUT", "-s", lab.gateway, "-j", "DROP")
        w = lab.workdir
        shutil.copytree(FIXTURES / "slime", w / "slime")
        (w / "models" / MODEL).mkdir(parents=True)
        shutil.copy(FIXTURES / "models" / MODEL / "config.json", w / "models" / MODEL / "config.json")
        # Weights of a few KiB: the checkpoint room asked of the hosts follows them (7 x 4 KiB), not
        # config.json's 3.35B parameters (43.7 GiB, more than a CI machine's /tmp may have free).
        (w / "models" / MODEL / "model.safetensors").write_bytes(b"w" * 4096)
        (w / "data").mkdir()
        (w / "data" / "train.jsonl").write_text('{"prompt": "1 + 1?", "metadata": {"answer": "2"}}\n')
        data = inventory_data(lab, f"{lab.tag}-tn", gpus=2)
        data["hosts"] = [data["hosts"][0], data["hosts"][2]]  # h1 and h3; h2 is the bastion
        data["ssh"]["proxy_jump"] = bastion.ip  # User and host key from the lab's ssh config
        inv = write_inventory(w / "walled.yaml", data)
        tmp = tmp_path_factory.mktemp("recipes")
        recipe = {
            "exp_id": "sf-tunnel-run",
            "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/gsm8k_agent-a1B2c3D4e5",
            "s3_bucket": "sf-cluster-test", "model_dir": str(w / "models" / MODEL),
            "data_path": str(w / "data" / "train.jsonl"),
            "model_type": "qwen2.5-3B", "num_gpus": 2, "num_nodes": 1, "tp_size": 1, "rollout_batch_size": 8,
            "rollout_gpus_per_engine": 1,
            "slime_dir": str(w / "slime"), "megatron_dir": str(w / "Megatron-LM"), "mode": "host",
            "checkpoint_dir": str(w / "ckpt" / "sf-tunnel-run"), "env": {"STANDIN_CHECK_FLAGS": "1"},
        }
        parsed, stack = parse_recipe({**recipe, "install_prefix": str(w / "prefix")}, "test")
        catalog = write_catalog(tmp / "flags.json", parsed, stack)
        (tmp / "tunnel.yaml").write_text(yaml.safe_dump(recipe))
        address = cluster.up(inv, control_dir=lab.control_dir, stream=io.StringIO())
        yield {"lab": lab, "home": home, "inventory": inv, "recipe": tmp / "tunnel.yaml", "catalog": catalog,
               "tmp": tmp, "address": address}
    finally:
        try:
            if inv is not None:
                cluster.down(inv, control_dir=lab.control_dir, stream=io.StringIO())
        finally:
            lab.stop()
            if old is None:
                os.environ.pop("SLIMEFORGE_STATE_HOME", None)
            else:
                os.environ["SLIMEFORGE_STATE_HOME"] = old


@pytest.fixture(autouse=True)
def _cluster_state_home(request, monkeypatch):
    # cluster.up recorded the head's address in the module's state home (conftest gives each test its own).
    if "walled" in request.fixturenames:
        monkeypatch.setenv("SLIMEFORGE_STATE_HOME", str(request.getfixturevalue("walled")["home"]))


def listening(netns: str) -> dict[int, tuple[str, str]]:
    """{port: (address, program)} of the TCP sockets listening in a network namespace (ss -ltnpH)."""
    out = sh("ip", "netns", "exec", netns, "ss", "-ltnpH").stdout
    found = {}
    for line in out.splitlines():
        fields = line.split()
        address, _, port = fields[3].rpartition(":")
        m = re.search(r'users:\(\("([^"]+)",pid=(\d+)', line)
        program = m.group(1) if m else "?"
        if m:
            try:
                cmdline = Path(f"/proc/{m.group(2)}/cmdline").read_bytes()
                program += " " + cmdline.replace(b"\0", b" ").decode(errors="replace")[:300]
            except OSError:
                pass
        found[int(port)] = (address.strip("[]"), program)
    return found


@pytest.mark.parametrize("which", [0, 2], ids=["head", "worker"])
def test_ray_listens_on_the_pinned_ports_and_no_others(walled, which):
    host = walled["lab"].hosts[which]
    is_head = which == 0
    ports = listening(host.netns)
    outside = {p: v for p,
               v in ports.items() if not v[0].startswith("127.") and v[0] != "::1" and not v[1].startswith("sshd")}
    fixed = set(rayports.fixed_ports(rayports.DEFAULTS, head=is_head))
    workers = range(rayports.DEFAULTS["min_worker_port"], rayports.DEFAULTS["max_worker_port"] + 1)
    # Every port Ray listens on beyond loopback is one the inventory pinned (or a worker's, in the range).
    strays = {p: v for p, v in outside.items() if p not in fixed and p not in workers}
    assert not strays, f"Ray listens on ports nobody pinned: {strays} (all: {ports})"
    # And the pinned ones are Ray's, each listening: on every node the raylet, object manager, both
    # agents and metrics; on the head also GCS, dashboard, client server and the two metrics exporters.
    keys = [p.key for p in rayports.PORTS if is_head or p.hosts == rayports.ALL]
    assert len(keys) == (11 if is_head else 6)
    for key in keys:
        assert rayports.DEFAULTS[key] in ports, (f"{key} {rayports.DEFAULTS[key]} is not listening on {host.name}: "
                                                f"{ports}")


def test_run_goes_through_an_ssh_tunnel_over_the_bastion(walled):
    dashboard = walled["address"].dashboard
    host, port = dashboard.removeprefix("http://").rsplit(":", 1)
    with pytest.raises(OSError):  # the wall: the dashboard does not answer from here
        socket.create_connection((host, int(port)), timeout=2).close()
    out = walled["tmp"] / "run-tunnel"
    r = subprocess.run([sys.executable, "-m", "invoke", "run", str(walled["recipe"]), "--cluster",
                        str(walled["inventory"]), "--out", str(out),
                        "--catalog", str(walled["catalog"]), "--no-network"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    text = r.stdout + r.stderr
    assert r.returncode == 0, text
    said = re.search(rf"the Jobs API through an ssh tunnel to h1 \({re.escape(host)}:{port} does not answer from here "
                     r"within 3s\): "
                     rf"(http://127\.0\.0\.1:\d+) -> {re.escape(host)}:{port} \(ssh pid (\d+)\)", text)
    assert said, text
    local, pid = said.group(1), int(said.group(2))
    assert "submitting sf-tunnel-run-" in text and f"to {local}" in text
    assert "standin: 2 node(s) read every path and wrote a shard" in text and "exit code 0" in text  # a task on h3 too
    # the logs came back through the tunnel
    assert "standin: 2 node(s) read every path" in (out / "job.log").read_text()
    assert not pid_alive(pid)  # the launch stopped its tunnel
    assert (out / "submission_id").is_file()
