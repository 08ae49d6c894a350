"""Every TCP port a Ray node listens on, as data: the inventory's `ray:` keys and their defaults,
the `ray start` option that pins each, where it listens and who connects to it.

One table serves four readers, so they cannot drift: the inventory's schema (cluster/inventory.py),
each node's `ray start` argv and the ports preflight checks free (cluster/nodestart.py), a Slurm
allocation's `ray start` (run/targets/slurm.py), and the firewall table of docs/cluster.md
(`firewall_table()`, compared with the page by tests/unit/test_ray_ports.py).

The defaults: GCS 6379 and the dashboard 8265 are Ray's own (every Ray tool and page assumes them:
`ray job submit --address http://HEAD:8265`); everything else lies in ONE range, 10001-19999, the
range Ray already uses for its client server (10001) and its worker ports (10002-19999). A security
group then needs three rules: 6379 and 8265 on the head, 10001-19999 on every host (from the
cluster's hosts). Left to Ray, the node manager, object manager, metrics and agent ports are random
(or 52365 and friends), so no firewall could be written ahead of time.

Core module: imports nothing of slimeforge but errors (the run and cluster layers both read it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import Problem

HEAD = "head"
ALL = "all"


@dataclass(frozen=True)
class RayPort:
    key: str  # the inventory's key under `ray:`
    flag: str | None  # the `ray start` option that pins it, or None: set by `env` instead
    default: int
    hosts: str  # HEAD: listens on the head only; ALL: on every node (the head too)
    peers: str  # who connects to it: what a firewall must let in
    what: str
    env: str | None = None  # the environment variable Ray reads it from, where no option of `ray start` sets it


# Order: head-only first, then every node's, as the firewall table lists them.
PORTS: tuple[RayPort, ...] = (
    RayPort("port", "--port", 6379, HEAD, "all nodes", "GCS: the cluster's state (every node's raylet and workers)"),
    RayPort("dashboard_port", "--dashboard-port", 8265, HEAD, "the submitting machine (and the head itself)",
            "dashboard and Jobs API (`invoke run --cluster`, run.status/logs/stop)"),
    RayPort("client_port", "--ray-client-server-port", 10001, HEAD, "Ray Client users (`ray://HEAD:10001`)",
            "Ray Client server"),
    # Two Prometheus exporters of the head that `ray start` has no option for (Ray's own defaults,
    # 44217 and 44227, on every interface): pinned through the variables Ray reads at start.
    RayPort("autoscaler_metrics_port", None, 10002, HEAD, "your Prometheus, if any", "autoscaler (monitor) metrics",
            env="AUTOSCALER_METRIC_PORT"),
    RayPort("dashboard_metrics_port", None, 10003, HEAD, "your Prometheus, if any", "dashboard metrics",
            env="DASHBOARD_METRIC_PORT"),
    RayPort("node_manager_port", "--node-manager-port", 10004, ALL, "all nodes",
            "raylet (node manager): task and actor scheduling"),
    RayPort("object_manager_port", "--object-manager-port", 10005, ALL, "all nodes",
            "object manager: objects moved between nodes"),
    RayPort("runtime_env_agent_port", "--runtime-env-agent-port", 10006, ALL, "the node itself",
            "runtime env agent (its raylet asks it for a job's working_dir)"),
    RayPort("dashboard_agent_grpc_port", "--dashboard-agent-grpc-port", 10007, ALL, "the head, the node itself",
            "dashboard agent, gRPC (metrics from the node's processes; logs and state for the head)"),
    RayPort("dashboard_agent_listen_port", "--dashboard-agent-listen-port", 10008, ALL, "the head",
            "dashboard agent, HTTP (the Jobs API starts a job's driver through it)"),
    RayPort("metrics_export_port", "--metrics-export-port", 10009, ALL, "your Prometheus, if any",
            "metrics of the node's processes, for Prometheus"),
)
# Worker processes (one per task or actor) each bind one port of this range; Ray skips a port
# that is already taken, so the range is not checked port by port before Ray starts.
WORKERS = RayPort("min_worker_port", "--min-worker-port", 10100, ALL, "all nodes",
                  "worker processes (tasks, actors), one port each")
MAX_WORKER = RayPort("max_worker_port", "--max-worker-port", 19999, ALL, "all nodes",
                     "the last port of the worker range")

FIXED_KEYS = tuple(p.key for p in PORTS)
ALL_KEYS = (*FIXED_KEYS, WORKERS.key, MAX_WORKER.key)
DEFAULTS: dict[str, int] = {p.key: p.default for p in (*PORTS, WORKERS, MAX_WORKER)}


def _as_port(value: Any) -> int | None:
    """A port as the schema reads it (6379.0 is 6379), else None (the schema reports it)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and 1 <= value <= 65535 else None


def port_problems(ray: Mapping[str, Any], where: str = "ray") -> list[Problem]:
    """The rules between the ports (each one's range is the schema's): the fixed ports differ from
    each other, the worker range is min < max, and no fixed port lies inside it."""
    values = {k: _as_port(ray.get(k, DEFAULTS[k])) for k in ALL_KEYS}
    p: list[Problem] = []
    seen: dict[int, str] = {}
    for key in FIXED_KEYS:
        port = values[key]
        if port is None:
            continue
        if port in seen:
            p.append(Problem(f"{where}.{key}",
                             f"is the same port as {where}.{seen[port]}: the Ray ports must differ from each "
                             "other", port,
                             f"another port (defaults: {', '.join(f'{k} {DEFAULTS[k]}' for k in FIXED_KEYS)})"))
        seen.setdefault(port, key)
    lo, hi = values[WORKERS.key], values[MAX_WORKER.key]
    if lo is not None and hi is not None:
        if lo >= hi:
            p.append(Problem(f"{where}.min_worker_port", f"must be below {where}.max_worker_port ({hi})", lo,
                             f"a range such as {DEFAULTS[WORKERS.key]}-{DEFAULTS[MAX_WORKER.key]}"))
        else:
            for port, key in sorted(seen.items()):
                if lo <= port <= hi:
                    p.append(Problem(f"{where}.{key}",
                                     f"lies inside the worker port range {lo}-{hi}: a worker could take it", port,
                                     "a port outside min_worker_port..max_worker_port"))
    return p


def node_argv(ray: Mapping[str, Any], head: bool) -> list[str]:
    """The `ray start` options that pin this node's ports (head: the head's own too)."""
    argv: list[str] = []
    for p in PORTS:
        if p.flag and (head or p.hosts == ALL):
            argv += [p.flag, str(ray[p.key])]
    return argv + [WORKERS.flag or "", str(ray[WORKERS.key]), MAX_WORKER.flag or "", str(ray[MAX_WORKER.key])]


def node_env(ray: Mapping[str, Any]) -> dict[str, str]:
    """The environment that pins the ports `ray start` has no option for (read on the head only)."""
    return {p.env: str(ray[p.key]) for p in PORTS if p.env}


def fixed_ports(ray: Mapping[str, Any], head: bool) -> list[int]:
    """The node's fixed ports (not the worker range): what preflight checks free."""
    return [int(ray[p.key]) for p in PORTS if head or p.hosts == ALL]


def _spans(ports: list[int]) -> str:
    """1, 2, 3, 7 -> "1-3, 7"."""
    runs: list[list[int]] = []
    for port in sorted(set(ports)):
        if runs and port == runs[-1][1] + 1:
            runs[-1][1] = port
        else:
            runs.append([port, port])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def firewall_table(ray: Mapping[str, Any] | None = None) -> str:
    """The ports to open, as a Markdown table and its summary (docs/cluster.md holds the defaults')."""
    values = {**DEFAULTS, **(ray or {})}
    lines = ["| TCP port | inventory key (`ray:`) | `ray start` option | listens on | connected from | what |",
             "| --- | --- | --- | --- | --- | --- |"]
    for p in PORTS:
        how = f"`{p.flag}`" if p.flag else f"environment `{p.env}`"
        lines.append(f"| {values[p.key]} | `{p.key}` | {how} | {'the head' if p.hosts == HEAD else 'every host'} | "
                     f"{p.peers} | {p.what} |")
    lo, hi = values[WORKERS.key], values[MAX_WORKER.key]
    lines.append(f"| {lo}-{hi} | `{WORKERS.key}`, `{MAX_WORKER.key}` | `{WORKERS.flag}`, `{MAX_WORKER.flag}` | every "
                 f"host | {WORKERS.peers} | {WORKERS.what} |")
    every = _spans([values[p.key] for p in PORTS if p.hosts == ALL and p.key != "metrics_export_port"]
                   + list(range(lo, hi + 1)))
    metrics = _spans([values[p.key] for p in PORTS if p.env] + [values["metrics_export_port"]])
    lines += ["",
              f"In short: on the head, TCP {values['port']} from every host of the cluster, TCP "
              f"{values['dashboard_port']} from the submitting machine, TCP {values['client_port']} from Ray Client "
              f"users if you have any; on every host (the head too), TCP {every} from every host of the cluster; "
              f"metrics ({metrics}) from your Prometheus if you scrape them. Nothing else of Ray's needs to be open "
              "(ssh aside: port 22, or the inventory's, from the submitting machine or its bastion)."]
    return "\n".join(lines)
