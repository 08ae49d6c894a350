"""Inventory validation: every problem reported at once, effective per-host settings."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slimeforge.cluster.inventory import default_temp_dir, load_inventory
from slimeforge.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32


def write(tmp_path: Path, data: dict, name: str = "lab.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def problems(exc: ConfigError) -> dict[str, str]:
    return {p.where: str(p) for p in exc.problems}


def test_example_inventory_is_valid():
    inv = load_inventory(ROOT / "recipes" / "clusters" / "example.yaml")
    assert inv.name == "example" and inv.mode == "container"
    assert inv.head.name == "gpu-a" and [h.name for h in inv.hosts if not h.is_head] == ["gpu-b"]
    assert all(h.image == inv.image and h.image.endswith(inv.image.rsplit("@", 1)[1]) for h in inv.hosts)
    assert inv.head.ssh.user == "ubuntu" and inv.head.ssh.port is None  # left to ~/.ssh/config


def test_every_problem_is_reported_at_once(tmp_path):
    data = {
        "mode": "container",
        "image": "registry.example/slime:latest",
        "ssh": {"key": "no-such-key", "options": {"Strict Host": "x"}},
        "ray": {"port": 8265},
        "hosts": [
            {"name": "a", "address": "10.0.0.1", "role": "head", "gpus": 8},
            {"name": "a", "address": "10.0.0.1", "role": "head", "gpu": 8},
            {"name": "c d", "address": "-oProxyCommand=x", "gpus": 8, "interface": "a-very-long-interface-name",
             "node_ip": "10.0.0.300"},
            {"name": "e", "address": "10.0.0.5", "gpus": -1, "role": "master", "prefix": "/opt/sf"},
        ],
    }
    with pytest.raises(ConfigError) as err:
        load_inventory(write(tmp_path, data))
    found = problems(err.value)
    text = str(err.value)
    # pydantic: types, unknown keys (with a did-you-mean), enums
    assert "did you mean 'gpus'" in found["hosts.1.gpu"]
    assert "hosts.1.gpus" in found  # missing
    assert "hosts.3.gpus" in found and "hosts.3.role" in found
    # the rules between fields
    assert "2 hosts have role: head; exactly one must" in found["hosts"]
    assert "names must be unique" in found["hosts.1 (a).name"]
    assert "addresses must be unique" in found["hosts.1 (a).address"]
    assert "is used in paths" in found["hosts.2 (c d).name"]
    assert "-oProxyCommand=x" in found["hosts.2 (c d).address"]
    assert "network interface name" in found["hosts.2 (c d).interface"]
    assert "not an IP address" in found["hosts.2 (c d).node_ip"]
    assert "host mode only" in found["hosts.3 (e).prefix"]
    assert "pinned by digest" in found["image"]
    assert "names no file" in found["ssh.key"]
    assert "is not an ssh option slimeforge passes" in found["ssh.options"]
    assert "must differ" in found["ray.dashboard_port"]
    assert text.startswith(f"{tmp_path / 'lab.yaml'}: {len(err.value.problems)} problem(s):")


def test_no_head_and_host_mode_without_environment(tmp_path):
    data = {"mode": "host", "hosts": [{"name": "a", "address": "a", "gpus": 1}, {"name": "b", "address": "b",
                                                                                 "gpus": 1,
                                                                                 "python": "venv/bin/python"}]}
    with pytest.raises(ConfigError) as err:
        load_inventory(write(tmp_path, data))
    found = problems(err.value)
    assert "no host has role: head" in found["hosts"]
    assert "host mode needs the environment" in found["hosts.0 (a)"]
    assert "absolute path" in found["hosts.1 (b).python"]


def test_container_mode_needs_an_image(tmp_path):
    data = {"mode": "container", "hosts": [{"name": "a", "address": "a", "role": "head", "gpus": 0}]}
    with pytest.raises(ConfigError) as err:
        load_inventory(write(tmp_path, data))
    assert "is required in container mode" in problems(err.value)["image"]


@pytest.mark.parametrize("image", [f"-v/:/host@{DIGEST}", f"--privileged@{DIGEST}", f"Registry.example/Slime@{DIGEST}",
                                   f"registry.example/slime@{DIGEST}\n", f"registry.example/slime @{DIGEST}"])
def test_an_image_that_is_no_image_reference_is_refused(tmp_path, image):
    """By the OCI grammar, not by its tail: `-v/:/host@sha256:...` would reach `docker pull` and
    `docker run` as an option (a bind mount of the host's root)."""
    data = {"mode": "container", "image": image, "hosts": [{"name": "a", "address": "a", "role": "head", "gpus": 0}]}
    with pytest.raises(ConfigError) as err:
        load_inventory(write(tmp_path, data))
    assert list(problems(err.value)) == ["image"] and "[registry[:port]/]name[:tag][@sha256:<64 hex>]" in str(err.value)


def test_effective_settings_per_host(tmp_path):
    script = tmp_path / "install.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    data = {
        "mode": "host",
        "prefix": "/opt/sf",
        "install_script": "install.sh",
        "state_dir": "/var/lib/sf",
        "ssh": {"user": "ubuntu", "port": 2222},
        "ray": {"num_cpus": 4, "env": {"NCCL_IB_HCA": "mlx5", "X": "cluster"}},
        "hosts": [
            {"name": "a", "address": "10.0.0.1", "role": "head", "gpus": 8},
            {"name": "b", "address": "b-alias", "gpus": 4, "user": "root", "port": 22,
             "python": "/other/venv/bin/python", "num_cpus": 2, "env": {"X": "host"}},
        ],
    }
    inv = load_inventory(write(tmp_path, data))
    a, b = inv.hosts
    assert inv.install_script == script
    assert (a.ssh.user, a.ssh.port, b.ssh.user, b.ssh.port) == ("ubuntu", 2222, "root", 22)
    assert a.python == "/opt/sf/venv/bin/python" and a.ray == "/opt/sf/venv/bin/ray"
    assert b.python == "/other/venv/bin/python" and b.ray == "/other/venv/bin/ray"
    assert a.lock_path == "/opt/sf/stack.lock.json"
    assert (a.num_cpus, b.num_cpus) == (4, 2)
    # The head's also pins the two metrics ports `ray start` has no option for (rayports.py).
    assert a.env == {"NCCL_IB_HCA": "mlx5", "X": "cluster", "AUTOSCALER_METRIC_PORT": "10002",
                     "DASHBOARD_METRIC_PORT": "10003"} and b.env["X"] == "host"
    # Per-host state and temp dirs: hosts may share a home directory or /tmp.
    assert (a.state_dir, b.state_dir) == ("/var/lib/sf/lab/a", "/var/lib/sf/lab/b")
    assert a.temp_dir == default_temp_dir("lab", "a") != b.temp_dir
    assert len(a.temp_dir) <= 17


def test_yaml_errors_and_missing_files_are_config_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_inventory(bad)
    with pytest.raises(ConfigError, match="cannot be read"):
        load_inventory(tmp_path / "absent.yaml")
    data = {"mode": "host", "prefix": "/opt/sf", "install_script": "nope.sh", "ssh": {"config": "nope_config"},
            "hosts": [{"name": "a", "address": "a", "role": "head", "gpus": 0}]}
    with pytest.raises(ConfigError) as err:
        load_inventory(write(tmp_path, data))
    found = problems(err.value)
    assert "names no file" in found["install_script"] and "names no file" in found["ssh.config"]
