"""The record of a bring-up on this machine (for `invoke run --cluster` and cluster.status):
the head's GCS and Jobs API addresses and each host's node IP, one file per inventory."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SlimeforgeError
from .inventory import Inventory, load_inventory

if TYPE_CHECKING:
    from .bringup import Node

@dataclass(frozen=True)
class ClusterAddress:
    gcs: str  # HEAD_IP:PORT, for `ray start --address` and ray.init
    dashboard: str  # http://HEAD_IP:PORT, for the Jobs API (JobSubmissionClient)


def state_file(inv: Inventory) -> Path:
    base = Path(os.environ.get("SLIMEFORGE_STATE_HOME") or "~/.local/state/slimeforge").expanduser()
    # Named by the inventory's path too: two inventories may reuse a cluster name.
    tag = hashlib.sha256(str(inv.path.resolve()).encode()).hexdigest()[:8]
    return base / "clusters" / f"{inv.name}-{tag}.json"


def write_state(inv: Inventory, nodes: Sequence[Node], address: ClusterAddress) -> Path:
    path = state_file(inv)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "cluster": inv.name,
        "inventory": str(inv.path.resolve()),
        "gcs": address.gcs,
        "dashboard": address.dashboard,
        "up_at": time.time(),
        "hosts": {
            n.name: {"role": n.host.role, "node_ip": n.node_ip, "interface": n.interface, "gpus": n.host.gpus, "record": {k: v for k, v in (n.record or {}).items() if k != "log_tail"}}
            for n in nodes
        },
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)
    return path


def read_state(inv: Inventory) -> dict[str, Any] | None:
    try:
        return json.loads(state_file(inv).read_text())
    except (OSError, ValueError):
        return None


def address(inventory: Inventory | str | Path) -> ClusterAddress:
    """The head's GCS and dashboard addresses: from the last `up` run here, or from the inventory
    when the head names its node_ip."""
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    state = read_state(inv)
    if state:
        return ClusterAddress(state["gcs"], state["dashboard"])
    if inv.head.node_ip:
        return ClusterAddress(f"{inv.head.node_ip}:{inv.ray.port}", f"http://{inv.head.node_ip}:{inv.ray.dashboard_port}")
    raise SlimeforgeError(f"cluster {inv.name}: no record of a bring-up from this machine ({state_file(inv)}): run `invoke cluster.up {inv.path}` first, or set node_ip on the head")
