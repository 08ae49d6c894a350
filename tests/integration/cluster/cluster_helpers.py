"""Helpers for the cluster tests (not in conftest.py: several conftest modules share that name)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml
from netlab import NetLab


def environment_python() -> str:
    """The python of the environment under test: the hosts run Ray from it (the filesystem is shared)."""
    return str(Path(sys.prefix) / "bin" / "python")


def write_lock(prefix: Path, content: dict[str, Any]) -> Path:
    """An install prefix with a stack lock (what `invoke install` leaves behind)."""
    prefix.mkdir(parents=True, exist_ok=True)
    (prefix / "stack.lock.json").write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
    return prefix


def inventory_data(lab: NetLab, name: str, *, gpus: int = 2, overrides: dict[str, dict[str, Any]] | None = None,
                   extra_hosts: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Host mode on the lab: h1 is the head, h2 is reached through an ssh config alias."""
    overrides = overrides or {}
    w = lab.workdir
    prefix = write_lock(w / "prefix", {"stack": "cu13", "note": "the lab's shared install"})
    hosts = []
    for i, h in enumerate(lab.hosts):
        entry = {
            "name": h.name,
            "address": f"{lab.tag}-{h.name}" if h.name == "h2" else h.ip,
            "role": "head" if i == 0 else "worker",
            "gpus": gpus,
            "temp_dir": f"{w}/{name[-6:]}{h.name}",  # short: Ray's socket paths live below it
        }
        if h.name == "h3":
            entry["system_python"] = "python3"  # the default: whatever python3 the login's PATH finds
        entry.update(overrides.get(h.name, {}))
        hosts.append(entry)
    return {
        "name": name,
        "mode": "host",
        "prefix": str(prefix),
        "python": environment_python(),
        "state_dir": str(w / "state"),
        "system_python": environment_python(),  # runs the node agent (any python >= 3.8; not a pyenv shim)
        "ssh": {"config": str(lab.ssh_config), "connect_timeout": 5},
        # One CPU per node keeps three Ray nodes light on a 2-core machine; GPUs are declared
        # (the fake nvidia-smi shows 2 per host) so GPU accounting is exercised.
        "ray": {"num_cpus": 1, "object_store_memory": 100 * 1024 * 1024, "start_timeout": 240},
        "hosts": hosts + (extra_hosts or []),
    }


def write_inventory(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
