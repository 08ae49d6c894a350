"""What cluster.up would run where: Ray and docker argv lists, the dry run, environment comparison."""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from slimeforge.cluster import agent, bringup, clusterrecord, nodestart
from slimeforge.cluster.hosttable import FAILED, OK, HostTable
from slimeforge.cluster.inventory import load_inventory

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "recipes" / "clusters" / "example.yaml"


@pytest.fixture
def host_inventory(tmp_path):
    data = {
        "name": "lab",
        "mode": "host",
        "prefix": "/opt/sf",
        "ray": {"num_cpus": 1, "object_store_memory": 100 * 1024 * 1024},
        "hosts": [
            {"name": "a", "address": "10.0.0.1", "role": "head", "gpus": 8},
            {"name": "b", "address": "10.0.0.2", "gpus": 0, "env": {"NCCL_IB_HCA": "mlx5"}},
        ],
    }
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_inventory(path)


def test_ray_start_argv_head_and_worker(host_inventory):
    inv = host_inventory
    head, worker = inv.hosts
    assert nodestart.ray_start_argv(inv, head, "10.0.0.1", "10.0.0.1") == [
        "/opt/sf/venv/bin/ray", "start", "--block", "--head", "--dashboard-host", "10.0.0.1",
        "--node-ip-address", "10.0.0.1", "--num-gpus", "8",
        # Every port pinned (rayports.py): the head's own, then every node's, then the worker range.
        "--port", "6379", "--dashboard-port", "8265", "--ray-client-server-port", "10001",
        "--node-manager-port", "10004", "--object-manager-port", "10005", "--runtime-env-agent-port", "10006",
        "--dashboard-agent-grpc-port", "10007", "--dashboard-agent-listen-port", "10008", "--metrics-export-port",
                                                                           "10009",
        "--min-worker-port", "10100", "--max-worker-port", "19999",
        "--temp-dir", head.temp_dir, "--disable-usage-stats", "--num-cpus", "1", "--object-store-memory", "104857600",
    ]  # fmt: skip
    argv = nodestart.ray_start_argv(inv, worker, "10.0.0.2", "10.0.0.1")
    assert argv[:5] == ["/opt/sf/venv/bin/ray", "start", "--block", "--address", "10.0.0.1:6379"]
    assert "--head" not in argv and "--dashboard-host" not in argv
    # A worker pins every node's ports, not the head's own (GCS, dashboard, client server).
    assert not {"--port", "--dashboard-port", "--ray-client-server-port"} & set(argv)
    assert (argv[argv.index("--node-manager-port") + 1] == "10004" and argv[argv.index("--max-worker-port")
                                                                            + 1] == "19999")
    assert argv[argv.index("--node-ip-address") + 1] == "10.0.0.2" and argv[argv.index("--num-gpus") + 1] == "0"


def test_ray_env_names_the_interface_and_puts_the_environment_first(host_inventory):
    worker = host_inventory.hosts[1]
    env = nodestart.ray_env(worker, "ens5", "/usr/bin:/bin")
    assert env == {"GLOO_SOCKET_IFNAME": "ens5", "NCCL_SOCKET_IFNAME": "ens5",
                   "PATH": "/opt/sf/venv/bin:/usr/bin:/bin", "NCCL_IB_HCA": "mlx5"}


def test_container_start_argv_runs_ray_in_the_pinned_image():
    inv = load_inventory(EXAMPLE)
    head = inv.head
    env = nodestart.ray_env(head, "eth0", None)
    argv = nodestart.start_argv(inv, head, "10.0.0.11", "10.0.0.11", env, "0f" * 16)
    assert argv[:4] == ["docker", "run", "--detach", "--name"] and argv[4] == "sf-ray-example-gpu-a"
    # The labels the node agent proves before it stops or removes the container.
    assert argv[5:9] == ["--label", "slimeforge.cluster=example", "--label", "slimeforge.cluster_token=" + "0f" * 16]
    for pair in (["--network", "host"], ["--ipc", "host"], ["--gpus", "all"], ["--env", "NCCL_SOCKET_IFNAME=eth0"],
                 ["--env", "NCCL_IB_HCA=mlx5"], ["--ulimit", "memlock=-1"]):  # NCCL over IB/EFA pins its buffers
        assert any(argv[i : i + 2] == pair for i in range(len(argv))), pair
    image_at = argv.index(inv.image)
    # container.ulimits replaces the default ([] where Docker may not raise rlimits); docker_args
    # come after it, so a --ulimit there of the same name wins in docker's own parsing.
    bare = dataclasses.replace(inv, container=inv.container.model_copy(update={"ulimits": []}))
    assert "--ulimit" not in nodestart.start_argv(bare, head, "10.0.0.11", "10.0.0.11", env, "0f" * 16)
    assert argv[image_at + 1 : image_at + 4] == ["ray", "start", "--block"]
    assert "PATH" not in " ".join(argv)  # the image's own PATH


def test_dry_run_cli_prints_the_plan_and_touches_nothing(tmp_path):
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "SLIMEFORGE_STATE_HOME": str(tmp_path / "state")}
    r = subprocess.run([sys.executable, "-m", "invoke", "cluster.up", str(EXAMPLE), "--dry-run", "--nccl-check"],
                       cwd=ROOT, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "dry run: nothing is touched" in out
    assert "gpu-a (head, 10.0.0.11, 8 GPU(s))" in out and "gpu-b (worker, gpu-b, 8 GPU(s))" in out
    assert "docker pull 123456789012.dkr.ecr.us-west-2.amazonaws.com/slimeforge/slime@sha256:" in out
    assert "nccl_check.py --size-mb 256 across 8 GPUs" in out
    assert "ray start --block --address HEAD_IP:6379 --node-ip-address NODE_IP" in out
    assert list(tmp_path.iterdir()) == []  # no state, no ssh control directory in $HOME


def test_cli_refuses_a_bad_inventory_with_every_problem(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("mode: host\nhosts:\n  - {name: a, address: a, gpus: 1}\n  - {name: a, address: a, gpus: x}\n")
    r = subprocess.run([sys.executable, "-m", "invoke", "cluster.up", str(bad)], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 2
    assert "problem(s):" in r.stderr and ("no host has role: "
                                         "head") in r.stderr and "hosts.1.gpus" in r.stderr and ("names must be "
                                                                                                "unique") in r.stderr
    assert "Traceback" not in r.stderr


def test_environments_must_match_the_head(host_inventory):
    nodes = bringup.make_nodes(host_inventory)
    head, worker = nodes
    table = HostTable("t", [("a", "head"), ("b", "worker")], bringup.PHASES, stream=io.StringIO(), live=False)
    head.env = bringup.EnvFacts("aaa", "3.12.3", "2.60.0")
    worker.env = bringup.EnvFacts("aaa", "3.12.3", "2.60.0")
    assert bringup.compare_environments(nodes, head, table) == {}
    worker.env = bringup.EnvFacts("bbb", "3.11.9", "2.59.0")
    failures = bringup.compare_environments(nodes, head, table)
    assert list(failures) == ["b"]
    assert "install lock (sha256 of stack.lock.json) bbb differs from the head's aaa" in failures["b"]
    assert ("Python 3.11.9 differs from the head's "
           "3.12.3") in failures["b"] and "Ray 2.59.0 differs from the head's 2.60.0" in failures["b"]
    assert table.cells["b"]["environment"] == FAILED


def test_host_table_plain_lines_and_text():
    out = io.StringIO()
    table = HostTable("cluster lab", [("gpu-a", "head"), ("gpu-b", "worker")], ["connect", "preflight"], stream=out,
                      live=False)
    with table:
        table.set("gpu-a", "connect", OK, "ubuntu@a")
        table.set("gpu-b", "connect", FAILED, "ssh: connect to host gpu-b port 22: No route to host")
        table.skip_rest("connect")
    assert out.getvalue().splitlines()[1] == ("[cluster lab] gpu-b connect     FAILED  ssh: connect to host gpu-b port "
                                             "22: No route to host")
    assert table.text().splitlines() == [
        "host   role    connect  preflight  detail",
        "gpu-a  head    ok       -          ubuntu@a",
        "gpu-b  worker  FAILED   -          ssh: connect to host gpu-b port 22: No route to host",
    ]
    assert table.failed() == ["gpu-b"]


def test_last_json_skips_login_banners():
    assert agent.last_json("Welcome to Ubuntu\n{not json\n{\"a\": 1}\n") == {"a": 1}
    with pytest.raises(agent.SlimeforgeError, match="expected a JSON line"):
        agent.last_json("motd only\n")


def test_nccl_check_is_standalone():
    script = ROOT / "slimeforge" / "scripts" / "nccl_check.py"
    r = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--size-mb" in r.stdout
    source = script.read_text()
    assert "slimeforge" not in source.split('"""', 2)[2]  # nothing of slimeforge is imported
    r = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True)
    if r.returncode != 0:  # no torch here: a clear message, not a traceback
        r = subprocess.run([sys.executable, str(script), "--size-mb", "1"], capture_output=True, text=True)
        assert r.returncode == 1 and "torch is not installed" in r.stderr and "Traceback" not in r.stderr


def test_host_table_live_mode_renders_with_rich():
    out = io.StringIO()
    with HostTable("cluster lab", [("gpu-a", "head")], ["connect"], stream=out, live=True) as table:
        table.set("gpu-a", "connect", OK, "ubuntu@a")
    assert "gpu-a" in out.getvalue() and "ubuntu@a" in out.getvalue()
    assert "[cluster lab] gpu-a" not in out.getvalue()  # no plain lines in live mode


def test_run_task_resolves_the_cluster_head_and_passes_it_on(tmp_path, monkeypatch):
    """`invoke run RECIPE --cluster INVENTORY` hands launch() the head's Jobs API address."""
    import json

    from invoke import Exit, MockContext

    import slimeforge.run.launch

    monkeypatch.syspath_prepend(str(ROOT))  # tasks.py is not a package; `pytest` alone may not have ROOT on sys.path
    import tasks

    monkeypatch.setenv("SLIMEFORGE_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(ROOT)
    # No bring-up recorded: a clear error before anything is launched.
    with pytest.raises(Exit) as err:
        tasks.run_start.body(MockContext(), "recipes/gsm8k.yaml", out=str(tmp_path / "run"), cluster=str(EXAMPLE))
    assert err.value.code == 2 and "run `invoke cluster.up" in str(err.value.message)

    inv = load_inventory(EXAMPLE)
    path = clusterrecord.state_file(inv)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"gcs": "10.0.0.11:6379", "dashboard": "http://10.0.0.11:8265"}))
    seen = {}
    monkeypatch.setattr(slimeforge.run.launch, "apply", lambda target, plan, runner,
                        stream: seen.update(plan=plan) or 0)
    # The seed recipe's paths lie outside the example's volumes: refused from the inventory alone, each named.
    with pytest.raises(Exit) as err:
        tasks.run_start.body(MockContext(), "recipes/gsm8k.yaml", out=str(tmp_path / "run"), cluster=str(EXAMPLE))
    message = str(err.value.message)
    assert err.value.code == 2 and "model_dir: lies outside every container volume of cluster example" in message
    assert "data_path: lies outside every container volume" in message and not seen
    # Another image than the cluster's: refused, naming both.
    other = "reg.example/slimeforge@sha256:" + "0123456789abcdef" * 4
    fixed = ["model_dir=/models/Qwen2.5-3B-Instruct", "data_path=/data/gsm8k_tiny.jsonl", "num_nodes=2"]
    with pytest.raises(Exit) as err:
        tasks.run_start.body(MockContext(), "recipes/gsm8k.yaml", out=str(tmp_path / "run"), cluster=str(EXAMPLE),
                             set_=fixed, image=other)
    assert err.value.code == 2 and ("image: is not the image cluster "
                                   "example") in str(err.value.message) and other in str(err.value.message)
    # In the volumes, on both hosts: the cluster's image is used, and the job goes to its Jobs API from here.
    tasks.run_start.body(MockContext(), "recipes/gsm8k.yaml", out=str(tmp_path / "run"), cluster=str(EXAMPLE),
                         set_=fixed)
    plan = seen["plan"]
    assert plan.target == "ray-cluster" and plan.commands[0].argv[:5] == ("ray", "job", "submit", "--address", "http://10.0.0.11:8265")
    assert plan.run.recipe.image == load_inventory(EXAMPLE).image and plan.mounts == ()
