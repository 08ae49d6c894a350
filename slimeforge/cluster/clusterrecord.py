"""The record of a bring-up on this machine (for `invoke run --cluster` and cluster.status):
the head's GCS and Jobs API addresses and each host's node IP, one file per inventory."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import readback
from ..atomic import write_file
from ..errors import SlimeforgeError
from ..scripts.node_agent import hostport
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
            n.name: {"role": n.host.role, "node_ip": n.node_ip, "interface": n.interface, "gpus": n.host.gpus,
                     "record": {k: v for k, v in (n.record or {}).items() if k != "log_tail"}}
            for n in nodes
        },
    }
    write_file(path, json.dumps(data, indent=2))
    return path


# What the state's addresses look like (cluster.up writes them from node_ip and the inventory's ports).
GCS_RE = re.compile(r"[A-Za-z0-9_.:%\[\]-]{1,253}:[0-9]{1,5}")
DASHBOARD_RE = re.compile(r"https?://[A-Za-z0-9_.:%\[\]-]{1,253}:[0-9]{1,5}")


def _state_problem(doc: Any) -> str | None:
    if not isinstance(doc, dict):
        return "is not a JSON object"
    gcs, dashboard = doc.get("gcs"), doc.get("dashboard")
    if not (isinstance(gcs, str) and GCS_RE.fullmatch(gcs)):
        return f"gcs is not HOST:PORT ({gcs!r})"
    if not (isinstance(dashboard, str) and DASHBOARD_RE.fullmatch(dashboard)):
        return f"dashboard is not http://HOST:PORT ({dashboard!r})"
    if not isinstance(doc.get("hosts", {}), dict):
        return "hosts is not an object"
    return None


def read_state(inv: Inventory) -> dict[str, Any] | None:
    """The record of the last bring-up from this machine, through the one reader (regular file,
    size cap, UTF-8, schema); None when there is none. A malformed one is an error naming the file
    (`cluster.up` writes a new one)."""
    doc = readback.read_json(state_file(inv), "cluster state", f"the state `invoke cluster.up {inv.path}` writes",
                             _state_problem)
    return doc if isinstance(doc, dict) else None


def address(inventory: Inventory | str | Path) -> ClusterAddress:
    """The head's GCS and dashboard addresses: from the last `up` run here, or from the inventory
    when the head names its node_ip."""
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    state = read_state(inv)
    if state:
        return ClusterAddress(state["gcs"], state["dashboard"])
    if inv.head.node_ip:
        return ClusterAddress(hostport(inv.head.node_ip, inv.ray.port),
                              f"http://{hostport(inv.head.node_ip, inv.ray.dashboard_port)}")
    raise SlimeforgeError(f"cluster {inv.name}: no record of a bring-up from this machine ({state_file(inv)}): run "
                          f"`invoke cluster.up {inv.path}` first, or set node_ip on the head")
