"""What runs where on a cluster host: the exact `ray start --block` argv of each node (recorded
on the host and compared on re-runs), its environment, and `docker run` around it in container mode."""

from __future__ import annotations

from pathlib import Path

from .. import rayports
from ..scripts.hostrecord import LABEL_CLUSTER, LABEL_TOKEN
from ..scripts.node_agent import hostport
from .inventory import Host, Inventory

READY_MARKER = "Ray runtime started."  # printed by `ray start` once its processes are up


def ray_start_argv(inv: Inventory, host: Host, node_ip: str, head_ip: str) -> list[str]:
    """`ray start ... --block` for this host: the exact argv, recorded and compared on re-runs."""
    r = inv.ray
    ray = host.ray if host.mode == "host" else "ray"
    argv = [ray, "start", "--block"]
    ports = r.model_dump()
    if host.is_head:
        argv += [
            "--head",
            # Reachable on the cluster network (for workers, `invoke run --cluster` and the
            # health gate), not on every interface: the dashboard has no authentication.
            "--dashboard-host", node_ip,
        ]
    else:
        argv += ["--address", hostport(head_ip, r.port)]
    argv += [
        "--node-ip-address", node_ip,
        "--num-gpus", str(host.gpus),
        # Every port pinned (rayports.py), none left to Ray's random choice: preflight checks
        # them free, and a firewall can be written from docs/cluster.md's table ahead of time.
        *rayports.node_argv(ports, host.is_head),
        # Our own temp dir per node: several nodes may share /tmp, and `ray stop` elsewhere
        # never finds our sessions through /tmp/ray.
        "--temp-dir", host.temp_dir,
        "--disable-usage-stats",
    ]
    if host.num_cpus is not None:
        argv += ["--num-cpus", str(host.num_cpus)]
    if r.object_store_memory is not None:
        argv += ["--object-store-memory", str(r.object_store_memory)]
    return argv


def ray_env(host: Host, interface: str, path: str | None) -> dict[str, str]:
    env = {
        # torch.distributed (gloo) and NCCL pick their interface themselves and may choose docker0
        # or a management NIC that the other hosts cannot reach: name the one that routes to the head.
        "GLOO_SOCKET_IFNAME": interface,
        "NCCL_SOCKET_IFNAME": interface,
    }
    if host.mode == "host" and path is not None:
        # The environment's bin first, so `python3` and `ray` in a job's entrypoint are its own.
        env["PATH"] = f"{Path(host.ray).parent}:{path}"
    env.update(host.env)
    return env


def container_name(inv: Inventory, host: Host) -> str:
    return f"sf-ray-{inv.name}-{host.name}"


def start_argv(inv: Inventory, host: Host, node_ip: str, head_ip: str, env: dict[str, str], token: str,
               env_file: str | None = None) -> list[str]:
    """What the node agent runs on the host: `ray start` itself, or `docker run` around it.
    `token`: the cluster token of the record (host mode: the agent puts it in the environment).
    `env_file`: the secrets file on the host (credentials.secret_file): container mode names it to
    docker, which reads the values itself, so none is ever in this argv; host mode: the agent
    reads it into `ray start`'s environment."""
    ray_argv = ray_start_argv(inv, host, node_ip, head_ip)
    if host.mode == "host":
        return ray_argv
    c = inv.container
    # The labels the node agent checks before it stops or removes the container (hostrecord.py).
    argv = ["docker", "run", "--detach", "--name", container_name(inv, host),
            "--label", f"{LABEL_CLUSTER}={inv.name}", "--label", f"{LABEL_TOKEN}={token}"]
    # Host networking: Ray and NCCL use the host's addresses and interfaces, as on bare metal.
    argv += ["--network", "host", "--ipc", "host", "--shm-size", c.shm_size]
    for limit in c.ulimits:  # before docker_args: a --ulimit there of the same name wins
        argv += ["--ulimit", limit]
    # An init process as PID 1: it passes `docker stop`'s SIGTERM on to `ray start --block` and
    # reaps the processes Ray's workers leave behind.
    argv += ["--init"]
    if host.gpus:
        argv += ["--gpus", "all"]
    for key, value in env.items():
        argv += ["--env", f"{key}={value}"]
    if env_file is not None:
        argv += ["--env-file", env_file]
    argv += ["--volume", f"{host.temp_dir}:{host.temp_dir}"]
    for vol in c.volumes:
        argv += ["--volume", vol]
    argv += [*c.docker_args, host.image or "", *ray_argv]
    return argv


def ports_for(inv: Inventory, host: Host) -> list[int]:
    """The node's fixed ports, checked free before Ray starts (Ray skips a taken worker port itself)."""
    return rayports.fixed_ports(inv.ray.model_dump(), host.is_head)
