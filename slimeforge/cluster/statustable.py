"""cluster.status: one row per host (reachable?, our Ray process, its node in the cluster, GPUs,
Python and Ray versions), probed in parallel; the head's state API says which nodes are ALIVE."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NotRequired, TypedDict

from ..errors import SlimeforgeError
from ..proc import Runner
from ..scripts.node_agent import hostport
from .agent import VERSIONS_SNIPPET, RayNode, agent, first_line, last_json, read_nodes
from .bringup import Node, make_nodes
from .clusterrecord import read_state
from .inventory import Inventory, load_inventory


class StatusRow(TypedDict):
    """One host of cluster.status (COLUMNS, and docs/json.md's slimeforge.cluster-status/1 rows):
    what was learned; a host that did not answer has its error and no more."""

    host: str
    role: str
    address: str
    answered: bool
    error: NotRequired[str]
    ray_process: NotRequired[str]
    gpus_seen: NotRequired[int]
    python: NotRequired[str | None]
    ray: NotRequired[str | None]
    node_ip: NotRequired[str | None]
    node: NotRequired[str]
    gpus_ray: NotRequired[float | None]


def status(inventory: Inventory | str | Path, *, runner: Runner | None = None,
           control_dir: str | None = None) -> list[StatusRow]:
    """One row per host: reachable?, our Ray process, its node in the cluster, GPUs, versions."""
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    nodes = make_nodes(inv, runner, control_dir)
    rows: dict[str, StatusRow] = {n.name: {"host": n.name, "role": n.host.role, "address": n.host.address,
                                           "answered": False} for n in nodes}

    def probe(node: Node) -> None:
        row = rows[node.name]
        try:
            node.facts = agent(node.ssh, node.host, "facts", {"state_dir": node.host.state_dir},
                               timeout=inv.ssh_options.connect_timeout + 90)
        except SlimeforgeError as exc:
            row["error"] = first_line(exc)
            return
        row["answered"] = True
        rec = node.record or {}
        if rec.get("refused"):
            row["ray_process"] = "record refused"
            row["error"] = rec["refused"]
        elif rec:
            process = "pid " + str(rec["pid"]) if "pid" in rec else "container " + rec.get("container", "")[:12]
            row["ray_process"] = process + (" running" if rec.get("running") else " exited")
        else:
            row["ray_process"] = "not started by us"
        row["gpus_seen"] = len(node.facts["gpus"].get("list", []))
        try:
            if node.host.mode == "host":
                v = last_json(node.ssh.run([node.host.python or "python3", "-c", VERSIONS_SNIPPET], step="versions",
                                           timeout=60).stdout)
            else:
                v = last_json(node.ssh.run(["docker", "run", "--rm", "--entrypoint", "python3", node.host.image or "",
                                            "-c", VERSIONS_SNIPPET], step="versions", timeout=300).stdout)
            row["python"], row["ray"] = v.get("python"), v.get("ray")
        except SlimeforgeError as exc:
            row["python"] = row["ray"] = None
            row["error"] = "; ".join(x for x in (row.get("error"), first_line(exc)) if x)

    with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
        list(pool.map(probe, nodes))

    head = next(n for n in nodes if n.host.is_head)
    state = read_state(inv)
    dashboard = (state["dashboard"] if state else (f"http://{hostport(inv.head.node_ip, inv.ray.dashboard_port)}"
                                                   if inv.head.node_ip else None))
    cluster_nodes: dict[str, RayNode] = {}
    if dashboard and head.facts:
        try:
            answer = agent(head.ssh, head.host, "nodes", {"url": f"{dashboard}/api/v0/nodes?limit=10000&detail=false",
                                                          "timeout": 10}, timeout=60)
            ray_nodes, _ = read_nodes(answer, head.name)  # validated: every node has node_ip, state, GPUs
            # A host whose Ray was restarted has a DEAD entry beside the ALIVE one: ALIVE wins.
            for n in sorted(ray_nodes, key=lambda n: n["state"] == "ALIVE"):
                cluster_nodes[n["node_ip"]] = n
        except SlimeforgeError:
            pass
    for node in nodes:
        row = rows[node.name]
        ip = ((state or {}).get("hosts", {}).get(node.name, {}).get("node_ip") or node.host.node_ip
              or (node.facts.get("ssh_server_ip") if node.host.is_head else None))
        row["node_ip"] = ip
        seen = cluster_nodes.get(ip or "")
        row["node"] = seen["state"] if seen else "not in the cluster"
        row["gpus_ray"] = seen["resources_total"]["GPU"] if seen else None
    return [rows[n.name] for n in nodes]


class HostsDown(SlimeforgeError):
    """cluster.status found hosts that do not answer (exit 2, as a launch on the cluster would be
    refused: docs/exit-codes.md); raised after the table or document is printed."""

    def __init__(self, inventory: str, rows: list[StatusRow]):
        self.hosts = [row["host"] for row in rows if not row.get("answered")]
        super().__init__(f"cluster {inventory}: {len(self.hosts)} of {len(rows)} host(s) do not answer "
                         f"({', '.join(self.hosts)}): "
                         "their errors are in the table above; check each host is up and reachable over ssh, then run "
                         "cluster.status again")


def check_answered(inventory: str, rows: list[StatusRow]) -> None:
    """Raise HostsDown when any host did not answer."""
    if any(not row.get("answered") for row in rows):
        raise HostsDown(inventory, rows)


COLUMNS = ("host", "role", "address", "node_ip", "ray_process", "node", "gpus_ray", "gpus_seen", "python", "ray",
           "error")


def print_table(title: str, rows: list[StatusRow]) -> None:
    """The rows as a table on stdout: full width off a terminal (console.table), no cell cut."""
    from ..console import table

    table(title, COLUMNS, ([row.get(col) for col in COLUMNS] for row in rows))
