"""Ray's ports (slimeforge/rayports.py): every port `ray start` can pin is pinned from the inventory,
the rules between them hold, and docs/cluster.md's firewall table is the one the code generates."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from slimeforge import rayports
from slimeforge.cluster import nodestart
from slimeforge.cluster.inventory import RaySettings, load_inventory
from slimeforge.errors import ConfigError
from slimeforge.run.targets import slurm

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "cluster.md"


def inventory(tmp_path: Path, ray: dict | None = None) -> Path:
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump({
        "mode": "host", "prefix": "/opt/sf", "ray": ray or {},
        "hosts": [{"name": "a", "address": "10.0.0.1", "role": "head", "gpus": 8}, {"name": "b", "address": "10.0.0.2",
                                                                                    "gpus": 8}],
    }))  # fmt: skip
    return path


def problems(err: ConfigError) -> dict[str, str]:
    return {p.where: f"{p.message} ({p.accepted})" for p in err.problems}


def test_every_listening_port_ray_start_takes_is_an_inventory_key():
    """The ray we run: each `--*-port` option of its `ray start` is pinned by a key of the
    inventory (`--worker-port-list`, an alternative to the range, is not a port option)."""
    ray = Path(sys.executable).parent / "ray"
    text = subprocess.run([str(ray), "start", "--help"], capture_output=True, text=True, check=True).stdout
    flags = set(re.findall(r"^\s+(--[a-z-]+-port|--port) ", text, re.M))
    pinned = {p.flag for p in (*rayports.PORTS, rayports.WORKERS, rayports.MAX_WORKER) if p.flag}
    assert flags == pinned
    assert set(rayports.ALL_KEYS) <= set(RaySettings.model_fields)
    assert {k: RaySettings.model_fields[k].default for k in rayports.ALL_KEYS} == rayports.DEFAULTS


def test_the_defaults_are_ray_s_two_well_known_ports_and_one_range():
    d = rayports.DEFAULTS
    assert (d["port"], d["dashboard_port"]) == (6379, 8265)
    rest = [v for k, v in d.items() if k not in ("port", "dashboard_port")]
    assert min(rest) == 10001 and max(rest) == 19999
    assert rayports.port_problems({}) == []


def test_head_and_worker_argv_pin_every_port(tmp_path):
    inv = load_inventory(inventory(tmp_path, {"node_manager_port": 31000, "min_worker_port": 40000,
                                              "max_worker_port": 40999}))
    head, worker = inv.hosts

    def pinned(argv: list[str]) -> dict[str, str]:
        return {a: argv[i + 1] for i, a in enumerate(argv) if a.endswith("-port")}

    on_head = pinned(nodestart.ray_start_argv(inv, head, "10.0.0.1", "10.0.0.1"))
    on_worker = pinned(nodestart.ray_start_argv(inv, worker, "10.0.0.2", "10.0.0.1"))
    assert on_head == {"--port": "6379", "--dashboard-port": "8265", "--ray-client-server-port": "10001",
                       "--node-manager-port": "31000",
                       "--object-manager-port": "10005", "--runtime-env-agent-port": "10006",
                       "--dashboard-agent-grpc-port": "10007",
                       "--dashboard-agent-listen-port": "10008", "--metrics-export-port": "10009",
                       "--min-worker-port": "40000",
                       "--max-worker-port": "40999"}
    assert on_worker == {k: v for k, v in on_head.items() if k not in ("--port", "--dashboard-port",
                                                                       "--ray-client-server-port")}
    # What preflight checks free: each fixed port of the node (the head's own on the head only).
    assert nodestart.ports_for(inv, head) == [6379, 8265, 10001, 10002, 10003, 31000, 10005, 10006, 10007, 10008, 10009]
    assert nodestart.ports_for(inv, worker) == [31000, 10005, 10006, 10007, 10008, 10009]
    # The head's two metrics exporters have no `ray start` option: the head's environment pins them.
    assert head.env["AUTOSCALER_METRIC_PORT"] == "10002" and head.env["DASHBOARD_METRIC_PORT"] == "10003"
    assert "AUTOSCALER_METRIC_PORT" not in worker.env


@pytest.mark.parametrize(("ray", "where", "says"), [
    ({"port": 8265}, "ray.dashboard_port", "must differ"),
    ({"metrics_export_port": 10004}, "ray.metrics_export_port", "same port as ray.node_manager_port"),
    ({"dashboard_metrics_port": 6379}, "ray.dashboard_metrics_port", "same port as ray.port"),
    ({"min_worker_port": 20000, "max_worker_port": 20000}, "ray.min_worker_port",
     "must be below ray.max_worker_port (20000)"),
    ({"min_worker_port": 30000, "max_worker_port": 20000}, "ray.min_worker_port", "must be below"),
    ({"min_worker_port": 6000, "max_worker_port": 7000}, "ray.port", "inside the worker port range 6000-7000"),
    ({"min_worker_port": 10000}, "ray.client_port", "inside the worker port range 10000-19999"),
    ({"object_manager_port": 0}, "ray.object_manager_port", "greater than or equal to 1"),
    ({"max_worker_port": 65536}, "ray.max_worker_port", "less than or equal to 65535"),
    ({"runtime_env_agent_port": "10004; x"}, "ray.runtime_env_agent_port", "not a number"),
    ({"dashboard_agent_port": 52365}, "ray.dashboard_agent_port", "dashboard_agent"),  # the old key: did you mean
])  # fmt: skip
def test_bad_ports_are_refused_naming_the_key(tmp_path, ray, where, says):
    with pytest.raises(ConfigError) as err:
        load_inventory(inventory(tmp_path, ray))
    found = problems(err.value)
    assert where in found, found
    assert says in found[where] or says in str(err.value), found


def test_every_problem_between_ports_at_once(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_inventory(inventory(tmp_path, {"port": 8265, "node_manager_port": 10005, "min_worker_port": 10000}))
    assert {"ray.dashboard_port", "ray.object_manager_port", "ray.client_port"} <= set(problems(err.value))


def test_slurm_starts_ray_with_the_same_ports():
    recipe = type("R", (), {"ray_port": 6380, "ray_dashboard_port": 8266, "num_gpus": 8})()
    head = slurm.ray_argv(recipe, "ray", head=True)  # type: ignore[arg-type]
    worker = slurm.ray_argv(recipe, "ray", head=False)  # type: ignore[arg-type]
    ports = {**rayports.DEFAULTS, "port": 6380, "dashboard_port": 8266}
    assert rayports.node_argv(ports, True) == head[head.index("--port"):head.index("--temp-dir")]
    assert rayports.node_argv(ports, False) == worker[worker.index("--node-manager-port"):worker.index("--temp-dir")]
    assert slurm.RAY_AGENT_PORT == rayports.DEFAULTS["dashboard_agent_listen_port"]


def test_the_firewall_table_in_docs_is_the_generated_one():
    text = DOC.read_text()
    found = re.search(r"<!-- ports-table: generated by slimeforge.rayports.firewall_table\(\) -->\n(.*?)\n<!-- "
                      r"/ports-table -->", text, re.S)
    assert found, "docs/cluster.md lost its ports table markers"
    assert found.group(1) == rayports.firewall_table(), ("docs/cluster.md's ports table differs: paste "
                                                        "rayports.firewall_table()'s output")


def test_the_firewall_table_follows_the_values():
    table = rayports.firewall_table({"min_worker_port": 30000, "max_worker_port": 30999, "metrics_export_port": 9090})
    assert "| 30000-30999 | `min_worker_port`, `max_worker_port` |" in table
    assert "| 9090 | `metrics_export_port` | `--metrics-export-port` | every host |" in table
    assert ("on every host (the head too), TCP 10004-10008, 30000-30999 from every host of the cluster; metrics (9090, "
           "10002-10003)") in table
