"""A Ray cluster on the hosts of an inventory, over SSH: `up`, `status`, `down`, `address`.

`up` runs in phases, every host in parallel within a phase, and stops at the first phase in which
any host failed, with a table of hosts and what failed:

  connect      ssh reaches the host; the node agent reports what it sees (GPUs, addresses, ...)
  preflight    GPUs seen >= declared, Ray's ports free, the head reachable from each worker,
               the interface and node IP resolved, plus any injected host checks
  environment  make the environment (pull the image by digest / run the install script, both
               idempotent), then require the same image digest or install lock, Python and Ray
               everywhere; with --nccl-check, an all-reduce across each host's GPUs
  ray          the head (`ray start --head --block`), then the workers, then a health gate: the
               head's state API lists every node ALIVE with its GPUs, within a deadline

Nothing starts Ray before every host has passed every check. Each `ray start --block` runs
detached on its host with its pid (or container id) recorded in that host's state directory;
`down` signals exactly those, and `ray start --block` stops every process it started on SIGTERM.
So we stop what we started and nothing else. Running `up` again converges: a host already running
our Ray with the same settings is left as it is, and the others are brought up.

Seams (the defaults are what `invoke cluster.up` runs; tests inject others):
  host_checks(host, remote) -> list[Problem]                 more preflight per host; default:
                                                             preflight's /dev/shm and ulimit checks
  make_environment(inventory, host, remote) -> EnvFacts      make the environment, report it
`remote` is an `slimeforge.cluster.ssh.SSH`, whose `.run(argv, ...)` matches `proc.Runner.run`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from .. import paths, records
from ..atomic import write_file
from ..errors import CommandError, Problem, SlimeforgeError
from ..proc import Runner
from ..run.preflight.findings import ERROR
from ..run.preflight.host import limits_findings, shm_findings
from ..scripts.node_agent import gate
from .hosttable import FAILED, OK, RUNNING, HostTable
from .inventory import Host, Inventory, load_inventory
from .ssh import SSH, HostUnreachable

PHASES = ("connect", "preflight", "environment", "ray")
SCRIPTS = paths.SCRIPTS
READY_MARKER = "Ray runtime started."  # printed by `ray start` once its processes are up
NCCL_SIZE_MB = 256

# Versions and install lock of an environment, read with ITS python: the one versions probe.
VERSIONS_SNIPPET = (SCRIPTS / "env_probe.py").read_text()


class ClusterError(SlimeforgeError):
    """A bring-up, status or teardown that failed on some hosts; the message holds the table."""

    def __init__(self, message: str, table: HostTable | None = None, failures: dict[str, str] | None = None):
        self.failures = dict(failures or {})
        self.table = table
        parts = [message]
        if table is not None:
            parts += ["", table.text()]
        elif self.failures:
            parts += ["", *(f"{host}: {why}" for host, why in self.failures.items())]
        super().__init__("\n".join(parts))


class CheckFailed(SlimeforgeError):
    """A host failed checks; holds every problem found on it."""

    def __init__(self, problems: Sequence[Problem | str]):
        self.problems = list(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


@dataclass(frozen=True)
class EnvFacts:
    """What an environment is, as far as hosts must agree: identity is the image digest or the
    install lock's sha256 (None when there is nothing to compare: host mode without a prefix)."""

    identity: str | None
    python: str
    ray: str
    detail: str = ""


HostChecks = Callable[[Host, SSH], list[Problem]]
MakeEnvironment = Callable[[Inventory, Host, SSH], EnvFacts]


@dataclass
class Node:
    """A host during a bring-up: its connection and what we learnt about it."""

    host: Host
    ssh: SSH
    facts: dict[str, Any] = field(default_factory=dict)
    node_ip: str | None = None
    interface: str | None = None
    env: EnvFacts | None = None

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def record(self) -> dict[str, Any] | None:
        return self.facts.get("record")

    @property
    def ours_running(self) -> bool:
        return bool(self.record and self.record.get("running"))


@dataclass(frozen=True)
class ClusterAddress:
    gcs: str  # HEAD_IP:PORT, for `ray start --address` and ray.init
    dashboard: str  # http://HEAD_IP:PORT, for the Jobs API (JobSubmissionClient)


# --- the node agent and helpers ---------------------------------------------------------------


@cache
def agent_source() -> str:
    return (SCRIPTS / "node_agent.py").read_text()


def last_json(text: str) -> dict[str, Any]:
    """The last line of output that is a JSON object (login shells may print banners first)."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    raise SlimeforgeError(f"expected a JSON line in the output, got: {text.strip()[-500:]!r}")


def agent(node: Node | SSH, host: Host, command: str, params: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run the node agent on the host: `python3 - COMMAND JSON` with the agent's source on stdin."""
    ssh = node.ssh if isinstance(node, Node) else node
    result = ssh.run([host.system_python, "-", command, json.dumps(params, sort_keys=True)], step=f"node agent {command}", input=agent_source(), timeout=timeout)
    return last_json(result.stdout)


def put_file(ssh: SSH, path: str, text: str) -> None:
    """Write `text` to `path` on the host (through stdin: no scp, no quoting of the content)."""
    ssh.run(["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", path], step=f"write {path}", input=text, timeout=60)


def first_line(exc: BaseException) -> str:
    if isinstance(exc, HostUnreachable):  # ssh's own words say it all: host, port, reason
        lines = [line for line in exc.output.strip().splitlines() if line.strip()]
        return lines[-1] if lines else f"ssh failed (exit {exc.returncode})"
    if isinstance(exc, CommandError):
        tail = [line for line in exc.output.strip().splitlines() if line.strip()]
        return f"{exc.step.split(': ', 1)[-1]}: " + (tail[-1] if tail else f"exit {exc.returncode}")
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def parallel(nodes: Sequence[Node], fn: Callable[[Node], str], table: HostTable, column: str) -> dict[str, str]:
    """Run fn on every node at once; each sets its cell. Returns {host: why} for the failures."""
    failures: dict[str, str] = {}

    def one(node: Node) -> None:
        table.set(node.name, column, RUNNING)
        try:
            detail = fn(node)
        except SlimeforgeError as exc:
            failures[node.name] = str(exc) if isinstance(exc, CheckFailed) else first_line(exc)
            table.set(node.name, column, FAILED, failures[node.name])
        except Exception as exc:  # a bug or an unexpected answer: show it on that host, stop the rest
            failures[node.name] = f"{type(exc).__name__}: {exc}"
            table.set(node.name, column, FAILED, failures[node.name])
        else:
            table.set(node.name, column, OK, detail)

    if nodes:
        with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
            list(pool.map(one, nodes))
    return failures


# --- what runs where --------------------------------------------------------------------------


def ray_start_argv(inv: Inventory, host: Host, node_ip: str, head_ip: str) -> list[str]:
    """`ray start ... --block` for this host: the exact argv, recorded and compared on re-runs."""
    r = inv.ray
    ray = host.ray if host.mode == "host" else "ray"
    argv = [ray, "start", "--block"]
    if host.is_head:
        argv += [
            "--head",
            "--port", str(r.port),
            # Reachable on the cluster network (for workers, `invoke run --cluster` and the
            # health gate), not on every interface: the dashboard has no authentication.
            "--dashboard-host", node_ip,
            "--dashboard-port", str(r.dashboard_port),
            "--ray-client-server-port", str(r.client_port),
        ]
    else:
        argv += ["--address", f"{head_ip}:{r.port}"]
    argv += [
        "--node-ip-address", node_ip,
        "--num-gpus", str(host.gpus),
        # Fixed rather than random, so preflight can check that it is free.
        "--dashboard-agent-listen-port", str(r.dashboard_agent_port),
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


def start_argv(inv: Inventory, host: Host, node_ip: str, head_ip: str, env: dict[str, str]) -> list[str]:
    """What the node agent runs on the host: `ray start` itself, or `docker run` around it."""
    ray_argv = ray_start_argv(inv, host, node_ip, head_ip)
    if host.mode == "host":
        return ray_argv
    c = inv.container
    argv = ["docker", "run", "--detach", "--name", container_name(inv, host), "--label", f"slimeforge.cluster={inv.name}"]
    # Host networking: Ray and NCCL use the host's addresses and interfaces, as on bare metal.
    argv += ["--network", "host", "--ipc", "host", "--shm-size", c.shm_size]
    # An init process as PID 1: it passes `docker stop`'s SIGTERM on to `ray start --block` and
    # reaps the processes Ray's workers leave behind.
    argv += ["--init"]
    if host.gpus:
        argv += ["--gpus", "all"]
    for key, value in env.items():
        argv += ["--env", f"{key}={value}"]
    argv += ["--volume", f"{host.temp_dir}:{host.temp_dir}"]
    for vol in c.volumes:
        argv += ["--volume", vol]
    argv += [*c.docker_args, host.image or "", *ray_argv]
    return argv


# --- default seams ----------------------------------------------------------------------------


def default_host_checks(host: Host, remote: SSH) -> list[Problem]:
    """preflight's host-resource checks (slimeforge/run/preflight/host.py, the ones `invoke doctor`
    runs here), run on the host over ssh: /dev/shm and ulimits. Their errors fail the host; the
    agent's facts already cover GPUs, ports, routes and reachability."""

    def run(argv: list[str]) -> str:
        return remote.run(argv, step=argv[0], timeout=30).stdout

    findings = shm_findings(run) + limits_findings(run, host.mode)
    return [Problem(f.check, f.message, show_value=False, accepted=f.fix) for f in findings if f.level == ERROR]


def default_environment(inv: Inventory, host: Host, remote: SSH) -> EnvFacts:
    """Make the environment (idempotent), then report what it is.

    host mode: run the inventory's install_script (if any) with bash on the host, then read the
    python and Ray versions with the environment's python and the sha256 of <prefix>/stack.lock.json.
    container mode: `docker pull IMAGE@sha256:...`, check the digest, read the versions in the image.
    """
    if host.mode == "host":
        if inv.install_script is not None:
            remote.run(["bash", "-s"], step="install script", input=inv.install_script.read_text(), timeout=6 * 3600)
        try:
            result = remote.run([host.python or "python3", "-c", VERSIONS_SNIPPET, host.lock_path or ""], step="environment", timeout=120)
        except CommandError as exc:
            if exc.returncode in (126, 127):
                raise CheckFailed([f"no environment at {host.python}: run `invoke install` on this host (or set install_script in the inventory)"]) from None
            raise
        facts = last_json(result.stdout)
        problems = []
        if host.lock_path and "lock_sha256" not in facts:
            problems.append(f"no install lock at {host.lock_path} ({facts.get('lock_error')}): run `invoke install` on this host")
        if not facts.get("ray"):
            problems.append(f"Ray is not installed in {host.python}")
        if problems:
            raise CheckFailed(problems)
        lock = facts.get("lock_sha256")
        detail = f"lock {lock[:12]}" if lock else "no prefix: install lock not compared"
        return EnvFacts(lock, facts["python"], facts["ray"], detail)

    image = host.image or ""
    digest = image.rsplit("@", 1)[-1]
    remote.run(["docker", "pull", image], step="docker pull", timeout=6 * 3600)
    inspect = remote.run(["docker", "image", "inspect", "--format", "{{json .RepoDigests}}", image], step="docker image inspect", timeout=60)
    repo_digests = json.loads(inspect.stdout.strip() or "[]") or []
    if not any(d.endswith("@" + digest) for d in repo_digests):
        raise CheckFailed([f"the image pulled as {image} has repo digests {repo_digests}, not {digest}"])
    result = remote.run(["docker", "run", "--rm", "--entrypoint", "python3", image, "-c", VERSIONS_SNIPPET], step="versions in the image", timeout=300)
    facts = last_json(result.stdout)
    if not facts.get("ray"):
        raise CheckFailed([f"Ray is not installed in {image}"])
    return EnvFacts(digest, facts["python"], facts["ray"], f"image {digest[7:19]}")


# --- up ---------------------------------------------------------------------------------------


def make_nodes(inv: Inventory, runner: Runner | None = None, control_dir: str | None = None) -> list[Node]:
    options = inv.ssh_options
    if control_dir is not None:
        options = replace(options, control_dir=control_dir)
    return [Node(h, SSH(h.ssh, options, runner)) for h in inv.hosts]


def head_ip_of(inv: Inventory, head: Node) -> str:
    ip = inv.head.node_ip or head.facts.get("ssh_server_ip")
    if not ip:
        raise ClusterError(f"cluster {inv.name}: cannot tell the head's IP address (ssh reports no SSH_CONNECTION): set node_ip on the head in {inv.path}")
    return ip


def ports_for(inv: Inventory, host: Host) -> list[int]:
    r = inv.ray
    return [r.port, r.dashboard_port, r.client_port, r.dashboard_agent_port] if host.is_head else [r.dashboard_agent_port]


@dataclass
class Bringup:
    """One run of `up`: the inventory, every host's Node, the table the phases fill in, and the
    head's address once connect has found it."""

    inv: Inventory
    nodes: list[Node]
    table: HostTable
    head_ip: str = ""
    head_ssh_port: int | None = None

    @property
    def head(self) -> Node:
        return next(n for n in self.nodes if n.host.is_head)

    def stop_if_failed(self, phase: str, failures: dict[str, str], started: bool = False) -> None:
        """Raise with the table when any host failed this phase: nothing later runs."""
        if not failures:
            return
        self.table.skip_rest(phase)
        what = ("Ray keeps running where it started; fix the host(s) and run cluster.up again (it converges), or cluster.down"
                if started else "Ray was not started on any host")
        raise ClusterError(f"cluster {self.inv.name}: bring-up stopped at {phase}: {len(failures)} of {len(self.nodes)} host(s) failed; {what}.",
                           self.table, failures)


def up(
    inventory: Inventory | str | Path,
    *,
    dry_run: bool = False,
    nccl_check: bool = False,
    host_checks: HostChecks = default_host_checks,
    make_environment: MakeEnvironment = default_environment,
    runner: Runner | None = None,
    control_dir: str | None = None,
    stream=None,
    live: bool | None = None,
) -> ClusterAddress | list[str]:
    """Bring the cluster up (see the module docstring); returns its address.
    With dry_run, returns the plan's lines and touches nothing (no ssh, no files)."""
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    if dry_run:
        return plan(inv, nccl_check=nccl_check, control_dir=control_dir)
    b = Bringup(inv, make_nodes(inv, runner, control_dir),
                HostTable(f"cluster {inv.name}", [(h.name, h.role) for h in inv.hosts], PHASES, stream=stream, live=live))
    with b.table:
        connect_phase(b)
        preflight_phase(b, host_checks)
        environment_phase(b, make_environment, nccl_check)
        ray_phase(b)
    address = ClusterAddress(f"{b.head_ip}:{inv.ray.port}", f"http://{b.head_ip}:{inv.ray.dashboard_port}")
    write_state(inv, b.nodes, address)
    return address


# --- the phases of up, in order -----------------------------------------------------------------


def connect_phase(b: Bringup) -> None:
    """ssh reaches every host and the node agent reports its facts; then the head's address."""

    def connect(node: Node) -> str:
        node.facts = agent(node, node.host, "facts", {"state_dir": node.host.state_dir}, timeout=b.inv.ssh_options.connect_timeout + 90)
        f = node.facts
        running = f" (our Ray runs: pid {node.record.get('pid') or node.record.get('container', '')[:12]})" if node.ours_running else ""
        return f"{f['user']}@{f['hostname']}, python3 {f['python3']}{running}"

    b.stop_if_failed("connect", parallel(b.nodes, connect, b.table, "connect"))
    b.head_ip = head_ip_of(b.inv, b.head)
    b.head_ssh_port = b.head.facts.get("ssh_server_port")


def preflight_phase(b: Bringup, host_checks: HostChecks) -> None:
    """Every host's facts against what it must provide (node_problems), plus the host checks."""

    def preflight(node: Node) -> str:
        h = node.host
        reach = [] if h.is_head else [[b.head_ip, int(b.head_ssh_port)]] if b.head_ssh_port else []
        params = {"state_dir": h.state_dir, "head_ip": b.head_ip, "ports": ports_for(b.inv, h), "reach": reach, "docker": h.mode == "container"}
        node.facts.update(agent(node, h, "facts", params, timeout=b.inv.ssh_options.connect_timeout + 90))
        problems = node_problems(b.inv, node, b.head_ip)
        problems += host_checks(h, node.ssh)
        if problems:
            raise CheckFailed(problems)
        seen = len(node.facts["gpus"].get("list", []))
        return f"{node.node_ip} via {node.interface}, {seen} GPU(s) seen" + (f", {h.gpus} used" if seen != h.gpus else "")

    b.stop_if_failed("preflight", parallel(b.nodes, preflight, b.table, "preflight"))


def node_problems(inv: Inventory, node: Node, head_ip: str) -> list[Problem | str]:
    """What is wrong with a host, from its agent's facts (pure: no ssh). Sets the node's IP and
    interface as found: the head's own address on the head, else the route's source."""
    h, f = node.host, node.facts
    problems: list[Problem | str] = []
    gpus = f["gpus"]
    seen = len(gpus.get("list", []))
    if h.gpus and "error" in gpus:
        problems.append(f"declares {h.gpus} GPU(s) but {gpus['error']}")
    elif h.gpus > seen:
        problems.append(f"declares {h.gpus} GPU(s) but nvidia-smi shows {seen}")
    route = f.get("route", {})
    if "error" in route or not route.get("src"):
        problems.append(f"no route to the head {head_ip}: {route.get('error', route)}")
    node.node_ip = head_ip if h.is_head else (h.node_ip or route.get("src"))
    node.interface = route.get("dev") if h.interface == "auto" else h.interface
    if h.interface != "auto" and h.interface not in f.get("addresses", {}):
        problems.append(f"interface {h.interface!r} has no IPv4 address here; interfaces: {', '.join(sorted(f.get('addresses', {})))}")
    if not node.interface:
        problems.append(f"cannot tell the interface that routes to {head_ip}: set interface in the inventory")
    for target, why in (f.get("reach") or {}).items():
        if why:
            problems.append(f"cannot reach the head at {target} from this host: {why}")
    if h.mode == "container" and "error" in f.get("docker", {}):
        problems.append(f"docker: {f['docker']['error']}")
    if node.ours_running:
        planned = start_argv(inv, h, node.node_ip or "", head_ip, ray_env(h, node.interface or "", f.get("path")))
        if node.record.get("argv") != planned:
            problems.append("Ray started by an earlier cluster.up runs here with other settings: run cluster.down first to apply the inventory's")
    elif f.get("ports_busy"):
        problems.append(f"port(s) {', '.join(map(str, f['ports_busy']))} in use (another Ray? we only stop what we started): free them or change ray ports in the inventory")
    return problems


def environment_phase(b: Bringup, make_environment: MakeEnvironment, nccl_check: bool) -> None:
    """Make each host's environment, then require the head's everywhere; optionally NCCL."""

    def environment(node: Node) -> str:
        node.env = make_environment(b.inv, node.host, node.ssh)
        return f"python {node.env.python}, ray {node.env.ray}, {node.env.detail}"

    failures = parallel(b.nodes, environment, b.table, "environment")
    if not failures:
        failures = compare_environments(b.nodes, b.head, b.table)
    if not failures and nccl_check:
        failures = parallel([n for n in b.nodes if n.host.gpus > 0], lambda n: run_nccl_check(b.inv, n), b.table, "environment")
    b.stop_if_failed("environment", failures)


def ray_phase(b: Bringup) -> None:
    """The head first, until its GCS port answers; then the workers join while the head finishes
    starting (raylet, dashboard): the two overlap instead of adding up. Then the health gate."""
    inv, head_ip = b.inv, b.head_ip

    def start(node: Node) -> str:
        h = node.host
        env = ray_env(h, node.interface or "", node.facts.get("path"))
        params = {
            "state_dir": h.state_dir,
            "argv": start_argv(inv, h, node.node_ip or "", head_ip, env),
            # host mode: in the process's environment; container mode: already in `docker run -e`.
            "env": env if h.mode == "host" else {},
            "container": h.mode == "container",
            "marker": None if h.is_head else READY_MARKER,
            "timeout": inv.ray.start_timeout,
            "wait_tcp": [head_ip, inv.ray.port] if h.is_head else None,
            "reach_first": None if h.is_head else [head_ip, inv.ray.port],
        }
        result = agent(node, h, "start", params, timeout=inv.ray.start_timeout + 60)
        check_started(result)
        node.facts["record"] = {**result["record"], "running": True}
        rec = result["record"]
        what = f"pid {rec['pid']}" if "pid" in rec else f"container {rec['container'][:12]}"
        if h.is_head:
            return ("already running, " if result.get("already") else "GCS up, ") + what
        return ("already running, " if result.get("already") else "started, ") + what + ", registering"

    def finish_head(node: Node) -> str:
        params = {"state_dir": node.host.state_dir, "marker": READY_MARKER, "timeout": inv.ray.start_timeout}
        check_started(agent(node, node.host, "wait", params, timeout=inv.ray.start_timeout + 60))
        rec = node.record or {}
        return f"started, pid {rec['pid']}" if "pid" in rec else f"started, container {rec.get('container', '')[:12]}"

    b.stop_if_failed("ray", parallel([b.head], start, b.table, "ray"), started=True)
    b.stop_if_failed("ray", parallel(b.nodes, lambda n: finish_head(n) if n.host.is_head else start(n), b.table, "ray"), started=True)
    b.stop_if_failed("ray", wait_for_nodes(inv, b.nodes, b.head, head_ip, b.table), started=True)


def check_started(result: dict[str, Any]) -> None:
    """Raise with the agent's reason and the last lines of Ray's output when a start failed."""
    if not result.get("ok"):
        tail = (result.get("log_tail") or "").strip().splitlines()[-6:]
        raise CheckFailed([result.get("error", "did not start"), *(["log: " + " | ".join(tail)] if tail else [])])


def compare_environments(nodes: Sequence[Node], head: Node, table: HostTable) -> dict[str, str]:
    """Every host must have the head's image digest or install lock, Python and Ray."""
    failures: dict[str, str] = {}
    ref = head.env
    assert ref is not None
    for node in nodes:
        env = node.env
        assert env is not None
        why = []
        if env.identity != ref.identity:
            kind = "image digest" if node.host.mode == "container" else "install lock (sha256 of stack.lock.json)"
            why.append(f"{kind} {str(env.identity)[:19]} differs from the head's {str(ref.identity)[:19]}")
        if env.python != ref.python:
            why.append(f"Python {env.python} differs from the head's {ref.python}")
        if env.ray != ref.ray:
            why.append(f"Ray {env.ray} differs from the head's {ref.ray}")
        if why:
            failures[node.name] = "; ".join(why)
            table.set(node.name, "environment", FAILED, failures[node.name])
    return failures


def run_nccl_check(inv: Inventory, node: Node) -> str:
    """The all-reduce check on one host's GPUs (the script is copied to its state directory)."""
    h = node.host
    state_dir = node.facts.get("state_dir") or h.state_dir
    script = f"{state_dir}/nccl_check.py"
    put_file(node.ssh, script, (SCRIPTS / "nccl_check.py").read_text())
    args = ["--size-mb", str(NCCL_SIZE_MB), "--json"]
    env = {"NCCL_SOCKET_IFNAME": node.interface or "", "NCCL_NVLS_ENABLE": "0"}
    if h.mode == "host":
        argv = [h.python or "python3", script, *args]
        result = node.ssh.run(argv, step="nccl check", env=env, check=False, timeout=600)
    else:
        argv = ["docker", "run", "--rm", "--gpus", "all", "--ipc", "host", "--network", "host", *(x for k, v in env.items() for x in ("--env", f"{k}={v}"))]
        argv += ["--volume", f"{state_dir}:{state_dir}", "--entrypoint", "python3", h.image or "", script, *args]
        result = node.ssh.run(argv, step="nccl check", check=False, timeout=600)
    try:
        out = last_json(result.stdout)
    except SlimeforgeError:
        out = {"ok": False, "error": (result.stdout + result.stderr).strip()[-300:]}
    if not out.get("ok"):
        raise CheckFailed([f"NCCL all-reduce failed: {out.get('error', 'no result')}"])
    node.facts["nccl"] = out
    return f"all-reduce {out['gpus']} GPUs: busbw {out['busbw_gbps']} GB/s"


def wait_for_nodes(inv: Inventory, nodes: Sequence[Node], head: Node, head_ip: str, table: HostTable) -> dict[str, str]:
    """Health gate: poll the head's state API until every host is an ALIVE node with its GPUs."""
    url = f"http://{head_ip}:{inv.ray.dashboard_port}/api/v0/nodes?limit=10000&detail=false"
    want = {n.node_ip: n for n in nodes}
    done: set[str] = set()
    deadline = time.monotonic() + inv.ray.start_timeout
    last_error = ""
    for node in nodes:
        table.set(node.name, "ray", RUNNING)
    while True:
        answer = agent(head, head.host, "nodes", {"url": url, "timeout": 10}, timeout=60)
        last_error = answer.get("error", "")
        verdict = gate(answer.get("nodes", []), {ip: node.host.gpus for ip, node in want.items()})
        for ip, node in want.items():
            ok, detail = verdict[ip]
            if ok and ip not in done:
                done.add(ip)
                table.set(node.name, "ray", OK, f"{detail}, {node.interface}")
        if len(done) == len(want):
            return {}
        if time.monotonic() > deadline:
            break
        time.sleep(1)  # the poll interval of the gate, not a wait for a guess
    failures = {}
    for ip, node in want.items():
        if ip in done:
            continue
        why = verdict[ip][1]
        if why.startswith("no ALIVE node"):
            why += f" after {inv.ray.start_timeout:g}s" + (f" ({last_error})" if last_error else "")
            try:
                tail = (agent(node, node.host, "facts", {"state_dir": node.host.state_dir}, timeout=60).get("record") or {}).get("log_tail", "")
            except SlimeforgeError:
                tail = ""
            if tail.strip():
                why += "; log: " + " | ".join(tail.strip().splitlines()[-4:])
        failures[node.name] = why
        table.set(node.name, "ray", FAILED, why)
    return failures


# --- state on this machine (for `invoke run --cluster` and status) ------------------------------


# What the state's addresses look like (cluster.up writes them from node_ip and the inventory's ports).
GCS_RE = re.compile(r"[A-Za-z0-9_.:%\[\]-]{1,253}:[0-9]{1,5}")
DASHBOARD_RE = re.compile(r"https?://[A-Za-z0-9_.:%\[\]-]{1,253}:[0-9]{1,5}")


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
    write_file(path, json.dumps(data, indent=2))
    return path


def _state_problem(doc: Any) -> str | None:
    if not isinstance(doc, dict):
        return "is not a JSON object"
    gcs, dashboard = doc.get("gcs"), doc.get("dashboard")
    if not (isinstance(gcs, str) and GCS_RE.fullmatch(gcs)):
        return f"gcs is not HOST:PORT ({gcs!r})"
    if not (isinstance(dashboard, str) and DASHBOARD_RE.fullmatch(dashboard)):
        return f"dashboard is not http://HOST:PORT ({dashboard!r})"
    return None


def read_state(inv: Inventory) -> dict[str, Any] | None:
    """The record of the last bring-up from this machine, checked; None when there is none.
    A malformed one is an error naming the file (cluster.up writes a new one)."""
    return records.read_json(state_file(inv), "cluster state", f"the state `invoke cluster.up {inv.path}` writes", _state_problem)


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


# --- status -----------------------------------------------------------------------------------


def status(inventory: Inventory | str | Path, *, runner: Runner | None = None, control_dir: str | None = None) -> list[dict[str, Any]]:
    """One row per host: reachable?, our Ray process, its node in the cluster, GPUs, versions."""
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    nodes = make_nodes(inv, runner, control_dir)
    rows: dict[str, dict[str, Any]] = {n.name: {"host": n.name, "role": n.host.role, "address": n.host.address} for n in nodes}

    def probe(node: Node) -> None:
        row = rows[node.name]
        try:
            node.facts = agent(node, node.host, "facts", {"state_dir": node.host.state_dir}, timeout=inv.ssh_options.connect_timeout + 90)
        except SlimeforgeError as exc:
            row["error"] = first_line(exc)
            return
        rec = node.record or {}
        row["ray_process"] = ("pid " + str(rec["pid"]) if "pid" in rec else "container " + rec.get("container", "")[:12]) + (" running" if rec.get("running") else " exited") if rec else "not started by us"
        row["gpus_seen"] = len(node.facts["gpus"].get("list", []))
        try:
            if node.host.mode == "host":
                v = last_json(node.ssh.run([node.host.python or "python3", "-c", VERSIONS_SNIPPET], step="versions", timeout=60).stdout)
            else:
                v = last_json(node.ssh.run(["docker", "run", "--rm", "--entrypoint", "python3", node.host.image or "", "-c", VERSIONS_SNIPPET], step="versions", timeout=300).stdout)
            row["python"], row["ray"] = v.get("python"), v.get("ray")
        except SlimeforgeError as exc:
            row["python"] = row["ray"] = None
            row["error"] = first_line(exc)

    with ThreadPoolExecutor(max_workers=min(32, len(nodes))) as pool:
        list(pool.map(probe, nodes))

    head = next(n for n in nodes if n.host.is_head)
    state = read_state(inv)
    dashboard = state["dashboard"] if state else (f"http://{inv.head.node_ip}:{inv.ray.dashboard_port}" if inv.head.node_ip else None)
    cluster_nodes: dict[str, dict[str, Any]] = {}
    if dashboard and head.facts:
        try:
            answer = agent(head, head.host, "nodes", {"url": f"{dashboard}/api/v0/nodes?limit=10000&detail=false", "timeout": 10}, timeout=60)
            # A host whose Ray was restarted has a DEAD entry beside the ALIVE one: ALIVE wins.
            for n in sorted(answer.get("nodes", []), key=lambda n: n.get("state") == "ALIVE"):
                cluster_nodes[n["node_ip"]] = n
        except SlimeforgeError:
            pass
    for node in nodes:
        row = rows[node.name]
        ip = (state or {}).get("hosts", {}).get(node.name, {}).get("node_ip") or node.host.node_ip or (node.facts.get("ssh_server_ip") if node.host.is_head else None)
        row["node_ip"] = ip
        n = cluster_nodes.get(ip or "")
        row["node"] = n["state"] if n else "not in the cluster"
        row["gpus_ray"] = int((n.get("resources_total") or {}).get("GPU", 0)) if n else None
    return [rows[n.name] for n in nodes]


# --- down -------------------------------------------------------------------------------------


def down(inventory: Inventory | str | Path, *, runner: Runner | None = None, control_dir: str | None = None, stream=None, live: bool | None = None, timeout: float = 60) -> dict[str, dict[str, Any]]:
    """Stop what `up` started: SIGTERM to each recorded `ray start --block` (or `docker stop` of
    each recorded container), workers first, then the head. Nothing else is touched."""
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    nodes = make_nodes(inv, runner, control_dir)
    table = HostTable(f"cluster {inv.name} down", [(h.name, h.role) for h in inv.hosts], ["stop"], stream=stream, live=live)
    results: dict[str, dict[str, Any]] = {}

    def stop(node: Node) -> str:
        result = agent(node, node.host, "stop", {"state_dir": node.host.state_dir, "timeout": timeout}, timeout=timeout + 60)
        results[node.name] = result
        if not result.get("stopped"):
            return result.get("reason", "nothing to stop")
        what = f"pid {result['pid']} and {result['processes'] - 1} child process(es)" if "pid" in result else f"container {result['container'][:12]}"
        return f"stopped {what}" + (f"; forced (SIGKILL): {result['forced']}" if result.get("forced") else "")

    with table:
        failures = parallel([n for n in nodes if not n.host.is_head], stop, table, "stop")
        failures.update(parallel([n for n in nodes if n.host.is_head], stop, table, "stop"))
    for node in nodes:
        node.ssh.close()
    if failures:
        raise ClusterError(f"cluster {inv.name}: could not stop Ray on {len(failures)} host(s); run cluster.down again once they are reachable.", table, failures)
    state_file(inv).unlink(missing_ok=True)
    return results


# --- dry run ----------------------------------------------------------------------------------


def plan(inv: Inventory, *, nccl_check: bool = False, control_dir: str | None = None) -> list[str]:
    """The per-host plan, as text lines: what `up` would run where. Touches nothing."""
    runner = Runner(dry_run=True)
    nodes = make_nodes(inv, runner, control_dir)
    head_ip = inv.head.node_ip or "HEAD_IP"
    lines = [
        f"cluster {inv.name}: {len(inv.hosts)} host(s), mode {inv.mode}, {sum(h.gpus for h in inv.hosts)} GPU(s); dry run: nothing is touched",
        "  HEAD_IP: the address the head answers ssh on (set node_ip on the head to choose it);",
        "  NODE_IP, IFACE: source address and interface of `ip -o route get HEAD_IP` on each host, found in preflight",
    ]
    if inv.ssh_options.proxy_command:
        lines.append(f"  ssh proxy command (ssh.proxy_command; ssh runs it on THIS machine for every connection): {inv.ssh_options.proxy_command}")
    if inv.ssh_options.proxy_jump:
        lines.append(f"  ssh bastion (ssh.proxy_jump): {inv.ssh_options.proxy_jump}")
    for node in nodes:
        h = node.host
        ip = head_ip if h.is_head else (h.node_ip or "NODE_IP")
        iface = h.interface if h.interface != "auto" else "IFACE"
        env = ray_env(h, iface, "$PATH")
        lines.append("")
        lines.append(f"{h.name} ({h.role}, {h.address}, {h.gpus} GPU(s)) state {h.state_dir}")
        lines.append(f"  ssh          {' '.join(node.ssh.base_argv())} -- {h.address} ...")
        lines.append(f"  connect      {h.system_python} - facts ...   (slimeforge's node agent, sent on stdin)")
        checks = [f"GPUs >= {h.gpus} (nvidia-smi)", f"ports {' '.join(map(str, ports_for(inv, h)))} free"]
        if not h.is_head:
            checks.append("head reachable over TCP")
        lines.append(f"  preflight    {'; '.join(checks)}; interface and node IP; /dev/shm and ulimits (the doctor's host checks, over ssh)")
        if h.mode == "host":
            if inv.install_script:
                lines.append(f"  environment  bash -s < {inv.install_script}")
            lines.append(f"  environment  {h.python} -c <versions> {h.lock_path or ''}".rstrip() + "   (same lock, Python and Ray as the head)")
        else:
            lines.append(f"  environment  docker pull {h.image}; docker image inspect; versions in the image (same digest, Python and Ray as the head)")
        if nccl_check and h.gpus > 0:
            lines.append(f"  environment  nccl_check.py --size-mb {NCCL_SIZE_MB} across {h.gpus} GPUs")
        argv = start_argv(inv, h, ip, head_ip, env)
        env_text = " ".join(f"{k}={v}" for k, v in env.items()) if h.mode == "host" else ""
        lines.append(f"  ray          {env_text + ' ' if env_text else ''}{' '.join(argv)}")
        lines.append("               (detached; pid recorded; ready when it prints 'Ray runtime started.')")
    lines.append("")
    lines.append(f"then: wait up to {inv.ray.start_timeout:g}s until {head_ip}:{inv.ray.dashboard_port}/api/v0/nodes lists every host ALIVE with its GPUs")
    return lines
