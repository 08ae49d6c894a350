"""Hostile values for Ray's port keys and ssh.tunnel: each refused naming its key, before anything
runs, and none reaches a `ray start` or `ssh` argv."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slimeforge.cluster.inventory import load_inventory
from slimeforge.errors import ConfigError


def inventory(tmp_path: Path, ray: dict | None = None, ssh: dict | None = None) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"mode": "host", "prefix": "/opt/sf", "ray": ray or {}, "ssh": ssh or {},
                                    "hosts": [{"name": "a", "address": "10.0.0.1", "role": "head", "gpus": 8}]}))
    return path


@pytest.mark.parametrize(("ray", "ssh", "where"), [
    ({"node_manager_port": True}, None, "ray.node_manager_port"),  # YAML's yes: not port 1
    ({"object_manager_port": "10005\n--head"}, None, "ray.object_manager_port"),
    ({"metrics_export_port": 10009.5}, None, "ray.metrics_export_port"),
    ({"min_worker_port": -1}, None, "ray.min_worker_port"),
    ({"max_worker_port": 10**30}, None, "ray.max_worker_port"),
    ({"dashboard_agent_grpc_port": [10007]}, None, "ray.dashboard_agent_grpc_port"),
    ({"autoscaler_metrics_port": "--port"}, None, "ray.autoscaler_metrics_port"),
    ({"min_worker_port": 20000, "max_worker_port": 10100}, None, "ray.min_worker_port"),
    (None, {"tunnel": "always\n"}, "ssh.tunnel"),
    (None, {"tunnel": "-oProxyCommand=touch /tmp/x"}, "ssh.tunnel"),
    (None, {"tunnel": True}, "ssh.tunnel"),
])  # fmt: skip
def test_refused_naming_the_key(tmp_path, ray, ssh, where):
    with pytest.raises(ConfigError) as err:
        load_inventory(inventory(tmp_path, ray, ssh))
    assert where in {p.where for p in err.value.problems}, err.value.problems


def test_a_float_that_is_a_whole_number_is_that_port(tmp_path):
    inv = load_inventory(inventory(tmp_path, {"node_manager_port": 31000.0}))
    assert inv.ray.node_manager_port == 31000
