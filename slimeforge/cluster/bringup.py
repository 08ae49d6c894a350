"""cluster.up's bring-up: every host's Node, the phases in order, and the default seams.

  connect      ssh reaches the host; the node agent reports what it sees (GPUs, addresses, ...)
  preflight    GPUs seen >= declared, Ray's ports free, the head reachable from each worker,
               the interface and node IP resolved, plus any injected host checks
  environment  make the environment (pull the image by digest / run the install script, both
               idempotent), then require the same image digest or install lock, Python and Ray
               everywhere; with --nccl-check, an all-reduce across each host's GPUs
  ray          the head (`ray start --head --block`), then the workers, then a health gate: the
               head's state API lists every node ALIVE with its GPUs, within a deadline

Every host runs a phase in parallel (`parallel`), and a phase in which any host failed stops the
bring-up with the table (`Bringup.stop_if_failed`).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..errors import CommandError, Problem, SlimeforgeError
from ..proc import Runner
from ..run.preflight.findings import ERROR
from ..run.preflight.host import limits_findings, shm_findings
from ..scripts.node_agent import hostport
from ..scripts.raynodes import gate
from .agent import (
    SCRIPTS,
    VERSIONS_SNIPPET,
    agent,
    first_line,
    last_json,
    put_file,
    put_secret_file,
    remove_secret_file,
    secret_file,
)
from .hosttable import FAILED, OK, RUNNING, HostTable
from .inventory import Host, Inventory
from .nodestart import READY_MARKER, ports_for, ray_env, start_argv
from .ssh import SSH

PHASES = ("connect", "preflight", "environment", "ray")
NCCL_SIZE_MB = 256


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


class HostSetup(Protocol):
    """What a bring-up does on each host between connecting and starting Ray: the one seam of
    cluster.up (raycluster.up's `setup`). DefaultSetup is what `invoke cluster.up` runs; a test
    passes its own. `remote` runs argv lists on the host (cluster/ssh.py's SSH)."""

    def checks(self, host: Host, remote: SSH) -> list[Problem]:
        """More preflight on the host, past the agent's facts: its problems fail the host."""
        ...

    def environment(self, inv: Inventory, host: Host, remote: SSH) -> EnvFacts:
        """Make the host's environment (idempotent), then say what it is."""
        ...


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
            result = remote.run([host.python or "python3", "-c", VERSIONS_SNIPPET, host.lock_path or ""],
                                step="environment", timeout=120)
        except CommandError as exc:
            if exc.returncode in (126, 127):
                raise CheckFailed([f"no environment at {host.python}: run `invoke install` on this host (or set "
                                   "install_script in the inventory)"]) from None
            raise
        facts = last_json(result.stdout)
        problems = []
        if host.lock_path and "lock_sha256" not in facts:
            problems.append(f"no install lock at {host.lock_path} ({facts.get('lock_error')}): run `invoke install` "
                            "on this host")
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
    inspect = remote.run(["docker", "image", "inspect", "--format", "{{json .RepoDigests}}", image],
                         step="docker image inspect", timeout=60)
    repo_digests = json.loads(inspect.stdout.strip() or "[]") or []
    if not any(d.endswith("@" + digest) for d in repo_digests):
        raise CheckFailed([f"the image pulled as {image} has repo digests {repo_digests}, not {digest}"])
    result = remote.run(["docker", "run", "--rm", "--entrypoint", "python3", image, "-c", VERSIONS_SNIPPET],
                        step="versions in the image", timeout=300)
    facts = last_json(result.stdout)
    if not facts.get("ray"):
        raise CheckFailed([f"Ray is not installed in {image}"])
    return EnvFacts(digest, facts["python"], facts["ray"], f"image {digest[7:19]}")


class DefaultSetup:
    """`invoke cluster.up`'s setup of a host: preflight's host checks, then the inventory's environment."""

    def checks(self, host: Host, remote: SSH) -> list[Problem]:
        return default_host_checks(host, remote)

    def environment(self, inv: Inventory, host: Host, remote: SSH) -> EnvFacts:
        return default_environment(inv, host, remote)


def make_nodes(inv: Inventory, runner: Runner | None = None, control_dir: str | None = None) -> list[Node]:
    options = inv.ssh_options
    if control_dir is not None:
        options = replace(options, control_dir=control_dir)
    return [Node(h, SSH(h.ssh, options, runner)) for h in inv.hosts]


def head_ip_of(inv: Inventory, head: Node) -> str:
    ip = inv.head.node_ip or head.facts.get("ssh_server_ip")
    if not ip:
        raise ClusterError(f"cluster {inv.name}: cannot tell the head's IP address (ssh reports no SSH_CONNECTION): "
                           f"set node_ip on the head in {inv.path}")
    return ip


@dataclass
class Bringup:
    """One run of `up`: the inventory, every host's Node, the table the phases fill in, and the
    head's address once connect has found it."""

    inv: Inventory
    nodes: list[Node]
    table: HostTable
    head_ip: str = ""
    head_ssh_port: int | None = None
    # Written into every record this bring-up starts (and the process's environment or the
    # container's labels): cluster.down stops only what carries it.
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    # The inventory's secret_env with its values (credentials.secret_values, read before any host is
    # touched): written to each host it starts Ray on, never into the table, a record or an argv.
    secret_values: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def head(self) -> Node:
        return next(n for n in self.nodes if n.host.is_head)

    def stop_if_failed(self, phase: str, failures: dict[str, str], started: bool = False) -> None:
        """Raise with the table when any host failed this phase: nothing later runs."""
        if not failures:
            return
        self.table.skip_rest(phase)
        what = ("Ray keeps running where it started; fix the host(s) and run cluster.up again (it converges), or "
                "cluster.down" if started else "Ray was not started on any host")
        raise ClusterError(f"cluster {self.inv.name}: bring-up stopped at {phase}: {len(failures)} of "
                           f"{len(self.nodes)} host(s) failed; {what}.", self.table, failures)


def connect_phase(b: Bringup) -> None:
    """ssh reaches every host and the node agent reports its facts; then the head's address."""

    def connect(node: Node) -> str:
        node.facts = agent(node.ssh, node.host, "facts", {"state_dir": node.host.state_dir},
                           timeout=b.inv.ssh_options.connect_timeout + 90)
        f = node.facts
        rec = node.record or {}
        running = f" (our Ray runs: pid {rec.get('pid') or rec.get('container', '')[:12]})" if node.ours_running else ""
        return f"{f['user']}@{f['hostname']}, python3 {f['python3']}{running}"

    b.stop_if_failed("connect", parallel(b.nodes, connect, b.table, "connect"))
    b.head_ip = head_ip_of(b.inv, b.head)
    b.head_ssh_port = b.head.facts.get("ssh_server_port")


def preflight_phase(b: Bringup, setup: HostSetup) -> None:
    """Every host's facts against what it must provide (node_problems), plus the host checks."""

    def preflight(node: Node) -> str:
        h = node.host
        reach = [] if h.is_head else [[b.head_ip, int(b.head_ssh_port)]] if b.head_ssh_port else []
        params = {"state_dir": h.state_dir, "head_ip": b.head_ip, "ports": ports_for(b.inv, h), "reach": reach,
                  "docker": h.mode == "container"}
        node.facts.update(agent(node.ssh, h, "facts", params, timeout=b.inv.ssh_options.connect_timeout + 90))
        problems = node_problems(b.inv, node, b.head_ip)
        problems += setup.checks(h, node.ssh)
        if problems:
            raise CheckFailed(problems)
        seen = len(node.facts["gpus"].get("list", []))
        return (f"{node.node_ip} via {node.interface}, {seen} GPU(s) seen"
                + (f", {h.gpus} used" if seen != h.gpus else ""))

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
        problems.append(f"interface {h.interface!r} has no IPv4 address here; interfaces: "
                        f"{', '.join(sorted(f.get('addresses', {})))}")
    if not node.interface:
        problems.append(f"cannot tell the interface that routes to {head_ip}: set interface in the inventory")
    for target, why in (f.get("reach") or {}).items():
        if why:
            problems.append(f"cannot reach the head at {target} from this host: {why}")
    if h.mode == "container" and "error" in f.get("docker", {}):
        problems.append(f"docker: {f['docker']['error']}")
    rec = node.record or {}
    if rec.get("refused"):
        problems.append(f"{rec['refused']}: run cluster.down to see it, or remove the record once you have checked")
    elif node.ours_running:
        token = rec.get("token", "")
        env_file = (node_env_file(inv, h, f.get("state_dir"), token) if re.fullmatch(r"[0-9a-f]{32}", str(token))
                    else None)
        planned = start_argv(inv, h, node.node_ip or "", head_ip, ray_env(h, node.interface or "", f.get("path")),
                             token, env_file)
        if rec.get("argv") != planned:
            problems.append("Ray started by an earlier cluster.up runs here with other settings: run cluster.down "
                            "first to apply the inventory's")
        elif sorted(rec.get("secret_env") or []) != sorted(inv.secret_env):
            problems.append("Ray started by an earlier cluster.up runs here with the secrets "
                            f"{', '.join(sorted(rec.get('secret_env') or [])) or 'none'}, "
                            f"the inventory names {', '.join(sorted(inv.secret_env)) or 'none'}: run cluster.down "
                            "first (secrets reach Ray when it starts)")
    elif f.get("ports_busy"):
        problems.append(f"port(s) {', '.join(map(str, f['ports_busy']))} in use (another Ray? we only stop what we "
                        "started): free them or change ray ports in the inventory")
    return problems


def node_env_file(inv: Inventory, host: Host, state_dir: str | None, token: str) -> str | None:
    """The secrets file `start` gets on this host (None without secret_env): container mode names it
    in `docker run --env-file`, so it is part of the recorded argv."""
    if not inv.secret_env or not state_dir or not state_dir.startswith("/"):
        return None
    return secret_file(state_dir, token)


def environment_phase(b: Bringup, setup: HostSetup, nccl_check: bool) -> None:
    """Make each host's environment, then require the head's everywhere; optionally NCCL."""

    def environment(node: Node) -> str:
        node.env = setup.environment(b.inv, node.host, node.ssh)
        return f"python {node.env.python}, ray {node.env.ray}, {node.env.detail}"

    failures = parallel(b.nodes, environment, b.table, "environment")
    if not failures:
        failures = compare_environments(b.nodes, b.head, b.table)
    if not failures and nccl_check:
        failures = parallel([n for n in b.nodes if n.host.gpus > 0], lambda n: run_nccl_check(b.inv, n), b.table,
                            "environment")
    b.stop_if_failed("environment", failures)


def ray_phase(b: Bringup) -> None:
    """The head first, until its GCS port answers; then the workers join while the head finishes
    starting (raylet, dashboard): the two overlap instead of adding up. Then the health gate."""
    inv, head_ip = b.inv, b.head_ip

    def start(node: Node) -> str:
        h = node.host
        env = ray_env(h, node.interface or "", node.facts.get("path"))
        # Not for a node already running ours (preflight proved it has these secret names): start
        # answers "already" and the values would travel for nothing.
        env_file = None if node.ours_running else node_env_file(inv, h, node.facts.get("state_dir"), b.token)
        if inv.secret_env and not node.ours_running and env_file is None:
            raise CheckFailed(["the node agent reported no absolute state directory "
                               f"({node.facts.get('state_dir')!r}) to write the secrets file in"])
        params = {
            "state_dir": h.state_dir,
            "argv": start_argv(inv, h, node.node_ip or "", head_ip, env, b.token,
                               env_file if h.mode == "container" else None),
            "token": b.token,
            "cluster": inv.name,
            # host mode: in the process's environment; container mode: already in `docker run -e`.
            "env": env if h.mode == "host" else {},
            "container": h.mode == "container",
            "marker": None if h.is_head else READY_MARKER,
            "timeout": inv.ray.start_timeout,
            "wait_tcp": [head_ip, inv.ray.port] if h.is_head else None,
            "reach_first": None if h.is_head else [head_ip, inv.ray.port],
        }
        if env_file is not None:
            params["env_file"] = env_file
            try:
                put_secret_file(node.ssh, env_file, {k: b.secret_values[k] for k in inv.secret_env})
                result = agent(node.ssh, h, "start", params, timeout=inv.ray.start_timeout + 60)
            except BaseException:
                # a partial write, or a start that never ran (the agent removes it once it runs)
                remove_secret_file(node.ssh, env_file)
                raise
        else:
            result = agent(node.ssh, h, "start", params, timeout=inv.ray.start_timeout + 60)
        check_started(result)
        node.facts["record"] = {**result["record"], "running": True}
        rec = result["record"]
        what = f"pid {rec['pid']}" if "pid" in rec else f"container {rec['container'][:12]}"
        if h.is_head:
            return ("already running, " if result.get("already") else "GCS up, ") + what
        return ("already running, " if result.get("already") else "started, ") + what + ", registering"

    def finish_head(node: Node) -> str:
        params = {"state_dir": node.host.state_dir, "marker": READY_MARKER, "timeout": inv.ray.start_timeout}
        check_started(agent(node.ssh, node.host, "wait", params, timeout=inv.ray.start_timeout + 60))
        rec = node.record or {}
        return f"started, pid {rec['pid']}" if "pid" in rec else f"started, container {rec.get('container', '')[:12]}"

    b.stop_if_failed("ray", parallel([b.head], start, b.table, "ray"), started=True)
    b.stop_if_failed("ray", parallel(b.nodes, lambda n: finish_head(n) if n.host.is_head else start(n),
                                     b.table, "ray"), started=True)
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
        env_flags = [x for k, v in env.items() for x in ("--env", f"{k}={v}")]
        argv = ["docker", "run", "--rm", "--gpus", "all", "--ipc", "host", "--network", "host", *env_flags]
        argv += [x for limit in inv.container.ulimits for x in ("--ulimit", limit)]  # as the node's container
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
    url = f"http://{hostport(head_ip, inv.ray.dashboard_port)}/api/v0/nodes?limit=10000&detail=false"
    missing = [n.name for n in nodes if not n.node_ip]
    if missing:  # preflight sets every node's IP or fails that host: this is a bug, not a host to leave out
        raise ClusterError(f"cluster {inv.name}: no node IP for {', '.join(missing)} after preflight")
    want = {n.node_ip: n for n in nodes if n.node_ip}
    done: set[str] = set()
    deadline = time.monotonic() + inv.ray.start_timeout
    last_error = ""
    for node in nodes:
        table.set(node.name, "ray", RUNNING)
    while True:
        answer = agent(head.ssh, head.host, "nodes", {"url": url, "timeout": 10}, timeout=60)
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
                tail = (agent(node.ssh, node.host, "facts", {"state_dir": node.host.state_dir},
                              timeout=60).get("record") or {}).get("log_tail", "")
            except SlimeforgeError:
                tail = ""
            if tail.strip():
                why += "; log: " + " | ".join(tail.strip().splitlines()[-4:])
        failures[node.name] = why
        table.set(node.name, "ray", FAILED, why)
    return failures
