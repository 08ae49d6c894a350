"""The run gate (issue 39, item 2) on the lab's three hosts: before `invoke run --cluster` submits,
Ray's own view of the cluster (the head's node list, asked of the head's node agent over ssh) must
cover num_nodes x num_gpus, and every worker's model weights must be the head's.

One worker's Ray is stopped through the node agent's record (its `stop` signals exactly the
recorded `ray start --block` process, proved by pid, start time and token: never a pkill), Ray
lists that node DEAD, and `invoke run --cluster` refuses naming that host with the repair, exit 2,
nothing submitted; `cluster.up` brings it back and the gate passes. A worker with config.json and
no weights, or other weights, is refused naming it. The gate's time on the three hosts is printed
(`pytest -s`) as the figure for docs/cluster.md.
"""

from __future__ import annotations

import io
import statistics
import time

import pytest
import test_run_cluster as base
from test_run_cluster import MODEL, invoke, jobs_on, put_model, recipe_file, run_cmd

from slimeforge.cluster import raycluster as cluster
from slimeforge.cluster import runcheck
from slimeforge.cluster.agent import agent, read_nodes
from slimeforge.cluster.bringup import make_nodes
from slimeforge.cluster.inventory import load_inventory
from slimeforge.run.recipecheck import parse_recipe

pytestmark = [pytest.mark.ssh, pytest.mark.slow]
# test_run_cluster's lab and cluster, shared with it (SHARED_BY there).
up, _shared_cluster_closer, _cluster_state_home = base.up, base._shared_cluster_closer, base._cluster_state_home


def timed_gate(up, runs: int = 5) -> list[float]:
    """The gate alone (one ssh round trip to the head's node agent, which asks the dashboard)."""
    inv = load_inventory(up["inventory"])
    recipe, _ = parse_recipe(up["recipe"] | {"install_prefix": str(up["lab"].workdir / "prefix")}, "test")
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        runcheck.gate(recipe, inv, control_dir=up["lab"].control_dir)
        out.append(time.perf_counter() - t)
    return out


def ray_states(up) -> dict[str, str]:
    inv = load_inventory(up["inventory"])
    head = next(n for n in make_nodes(inv, control_dir=up["lab"].control_dir) if n.host.is_head)
    answer = agent(head.ssh, head.host, "nodes", {"url": up["address"].dashboard + runcheck.NODES_PATH, "timeout": 10},
                   timeout=60)
    nodes, error = read_nodes(answer, head.name)
    assert error is None, error
    states: dict[str, str] = {}
    for n in sorted(nodes, key=lambda n: n["state"] == "ALIVE"):  # ALIVE wins over an older DEAD entry
        states[n["node_ip"]] = n["state"]
    return states


def test_a_dead_worker_is_refused_by_name_and_cluster_up_brings_it_back(up):
    lab, inv_path = up["lab"], up["inventory"]
    times = timed_gate(up)
    print(f"\n[figure] run gate on 3 lab hosts, all ALIVE: median {statistics.median(times) * 1000:.0f} ms "
          f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}; {len(times)} runs)")
    before = jobs_on(up)
    inv = load_inventory(inv_path)
    h3 = next(n for n in make_nodes(inv, control_dir=lab.control_dir) if n.name == "h3")
    # Stop h3's Ray exactly as recorded: the node agent proves the pid is the `ray start` it started.
    stopped = agent(h3.ssh, h3.host, "stop", {"state_dir": h3.host.state_dir, "cluster": inv.name}, timeout=120)
    assert stopped["stopped"] and stopped["ok"], stopped
    ip3 = lab.hosts[2].ip
    deadline = time.monotonic() + 120
    while ray_states(up).get(ip3) == "ALIVE":
        assert time.monotonic() < deadline, "Ray still lists h3 ALIVE two minutes after its raylet stopped"
        time.sleep(1)
    try:
        t = time.perf_counter()
        with pytest.raises(runcheck.GateRefused) as e:
            timed_gate(up, runs=1)
        print(f"[figure] run gate refusing (h3 dead): {(time.perf_counter() - t) * 1000:.0f} ms")
        assert f"h3 ({ip3}): no ALIVE node with IP {ip3}" in str(e.value)

        r = invoke(*run_cmd(up, recipe_file(up, "dead"), up["tmp"] / "run-dead"))
        text = r.stdout + r.stderr
        assert r.returncode == 2, text
        assert "do not cover num_nodes x num_gpus (3 x 2): 2 node(s) with 2 GPU(s) or more" in text
        assert f"  h3 ({ip3}): no ALIVE node with IP {ip3}" in text and "h1 (" not in text and "h2 (" not in text
        assert f"fix: `invoke cluster.up {inv_path}`" in text and "Traceback" not in text
        assert jobs_on(up) == before  # nothing was submitted
        # Two nodes are enough for a recipe of two: h3 is named, not needed.
        two, _ = parse_recipe(up["recipe"] | {"num_nodes": 2, "install_prefix": str(lab.workdir / "prefix")}, "test")
        line = runcheck.gate(two, load_inventory(inv_path), control_dir=lab.control_dir)
        assert "covers num_nodes x num_gpus (2 x 2); not ALIVE, not needed: h3 (" in line
    finally:
        cluster.up(inv_path, control_dir=lab.control_dir, stream=io.StringIO())  # the repair the refusal names
    assert ray_states(up).get(ip3) == "ALIVE"
    times = timed_gate(up, runs=3)
    assert all(t < 30 for t in times)


def test_a_worker_without_the_heads_weights_is_refused(up):
    lab, local = up["lab"], up["local"]
    before = jobs_on(up)
    h2 = lab.hosts[1]
    model = local / "models" / MODEL
    lab.run_in(h2, ["rm", "-f", "--", str(model / "model.safetensors")])  # config.json stays: the old check passed it
    try:
        r = invoke(*run_cmd(up, recipe_file(up, "noweights"), up["tmp"] / "run-noweights"))
        text = r.stdout + r.stderr
        assert r.returncode == 2, text
        line = next(x for x in text.splitlines() if x.startswith("h2 "))
        assert "FAILED" in line and "its weight files are not the head's (missing here: model.safetensors)" in line
        assert all("FAILED" not in x for x in text.splitlines() if x.startswith(("h1 ", "h3 ")))

        lab.run_in(h2, ["sh", "-c", 'printf x > "$1"', "sh", str(model / "model.safetensors")])  # a copy cut short
        r = invoke(*run_cmd(up, recipe_file(up, "shortweights"), up["tmp"] / "run-shortweights"))
        text = r.stdout + r.stderr
        assert r.returncode == 2, text
        line = next(x for x in text.splitlines() if x.startswith("h2 "))
        assert "other sizes: model.safetensors (1 B here, 4096 B on the head)" in line
        assert jobs_on(up) == before
    finally:
        put_model(lab, h2, model)
