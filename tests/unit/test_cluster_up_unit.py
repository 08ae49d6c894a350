"""cluster.up's preflight verdict per host, a pure function of the node agent's facts (no ssh):
the facts here are shaped as the agent reports them, GPUs from a real 2 x H200 capture."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from slimeforge.cluster.bringup import Node, node_problems
from slimeforge.cluster.inventory import load_inventory
from slimeforge.cluster.nodestart import ray_env, start_argv
from slimeforge.scripts.node_agent import parse_gpus

ROOT = Path(__file__).resolve().parents[2]
H200 = parse_gpus((ROOT / "tests" / "fixtures" / "gpu" / "h200-x2" / "query-gpu.csv").read_text())
HEAD_IP = "10.0.0.11"


@pytest.fixture
def inv():
    return load_inventory(ROOT / "recipes" / "clusters" / "example.yaml")


def worker_host(inv):
    return next(h for h in inv.hosts if not h.is_head)


def facts(**over):
    base = {"gpus": {"list": H200}, "route": {"dev": "ens5", "src": "10.0.0.12"}, "addresses": {"ens5": "10.0.0.12",
                                                                                                "lo": "127.0.0.1"},
            "reach": {f"{HEAD_IP}:22": None}, "docker": {"version": "28.2.2"}, "path": "/usr/bin:/bin",
            "ports_busy": []}
    return {**base, **over}


def worker(inv, gpus=2, **over) -> Node:
    host = replace(worker_host(inv), gpus=gpus)
    return Node(host, ssh=None, facts=facts(**over))


def test_a_healthy_worker_has_no_problem_and_gets_its_ip_and_interface(inv):
    node = worker(inv)
    assert node_problems(inv, node, HEAD_IP) == []
    assert (node.node_ip, node.interface) == ("10.0.0.12", "ens5")


def test_the_head_uses_its_own_address(inv):
    node = Node(replace(inv.head, gpus=2), ssh=None, facts=facts(route={"dev": "lo", "src": "127.0.0.1"}))
    assert node_problems(inv, node, HEAD_IP) == [] and node.node_ip == HEAD_IP


def test_every_problem_of_a_host_is_named_at_once(inv):
    node = worker(inv, gpus=8, route={"error": "Network is unreachable"}, reach={f"{HEAD_IP}:22": "timed out"},
                  docker={"error": "Cannot connect to the Docker daemon"}, ports_busy=[6379, 52365])
    problems = node_problems(inv, node, HEAD_IP)
    assert problems == [
        "declares 8 GPU(s) but nvidia-smi shows 2",
        "no route to the head 10.0.0.11: Network is unreachable",
        "cannot tell the interface that routes to 10.0.0.11: set interface in the inventory",
        f"cannot reach the head at {HEAD_IP}:22 from this host: timed out",
        "docker: Cannot connect to the Docker daemon",
        "port(s) 6379, 52365 in use (another Ray? we only stop what we started): free them or change ray ports in the "
        "inventory",
    ]


def test_no_nvidia_smi_and_a_missing_interface(inv):
    node = Node(replace(worker_host(inv), gpus=2, interface="ib0"), ssh=None,
                facts=facts(gpus={"error": "nvidia-smi not found on PATH"}))
    assert node_problems(inv, node, HEAD_IP) == [
        "declares 2 GPU(s) but nvidia-smi not found on PATH",
        "interface 'ib0' has no IPv4 address here; interfaces: ens5, lo",
    ]


def test_our_earlier_ray_converges_or_asks_for_down(inv):
    node = worker(inv)
    node_problems(inv, node, HEAD_IP)
    token = "ab" * 16
    planned = start_argv(inv, node.host, node.node_ip, HEAD_IP, ray_env(node.host, node.interface, node.facts["path"]),
                         token)
    same = worker(inv, record={"running": True, "argv": planned, "token": token}, ports_busy=[52365])
    assert node_problems(inv, same, HEAD_IP) == []  # its ports are held by our own Ray, started the same way
    other = worker(inv, record={"running": True, "argv": [*planned, "--num-cpus", "4"], "token": token})
    assert node_problems(inv, other, HEAD_IP) == [
        "Ray started by an earlier cluster.up runs here with other settings: run cluster.down first to apply the "
        "inventory's"]
