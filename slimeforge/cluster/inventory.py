"""Cluster inventories (recipes/clusters/*.yaml): which hosts, how to reach them, how they run Ray.

`load_inventory(path)` validates everything before anything is touched and reports every problem
at once (pydantic for types and unknown keys, then the rules between fields: exactly one head,
unique names and addresses, an image pinned by digest, ...). The result is an `Inventory` whose
`hosts` carry their effective settings (cluster defaults with per-host overrides applied), so the
code that acts on a host never has to merge settings again.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import Field

from .. import paths, rayports
from ..errors import ConfigError, Problem
from ..image.imageref import image_ref_problems
from ..schema import ENV_NAME_RE, Model, model_problems, secret_name, secret_value, text_problem
from ..yamlio import load_with_extends
from .addresses import address_problem, hostport, jump_hosts, ssh_address, unique_key
from .dockerargs import container_problems
from .ssh import SSHOptions, SSHTarget
from .sshconfig import OPTIONS, config_problems, option_problem

# Whole-value grammars (re.fullmatch: `$` would let a trailing newline through).
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")  # used in paths and container names
USER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
IFACE_RE = re.compile(r"[A-Za-z0-9_.:@-]{1,15}")  # Linux IFNAMSIZ - 1
MAX_GPUS = 64


class SSHSettings(Model):
    config: str | None = None  # an ssh config file for this cluster (ssh -F); default: ~/.ssh/config
    user: str | None = None  # default: the ssh config's, else your login name
    port: int | None = Field(None, ge=1, le=65535)
    key: str | None = None  # an identity file; default: the agent and the ssh config
    connect_timeout: int = Field(10, ge=1, le=600)
    options: dict[str, str] = Field(default_factory=dict)  # extra `-o Key=Value`: the allow list of sshconfig.OPTIONS
    proxy_jump: str | None = None  # a bastion: `ssh -J [user@]host[:port][,...]`
    # a command proxy (e.g. AWS SSM), run by ssh on this machine: explicit, shown by cluster.up --dry-run
    proxy_command: str | None = None
    # the Jobs API over ssh (tunnel.py); auto: when the dashboard does not answer directly
    tunnel: Literal["auto", "always", "never"] = "auto"


class RaySettings(Model):
    # Every port a Ray node listens on, pinned (rayports.py: the defaults, one range, the firewall
    # table of docs/cluster.md); the rules between them are rayports.port_problems.
    port: int = Field(rayports.DEFAULTS["port"], ge=1, le=65535)  # GCS, on the head
    # dashboard and Jobs API, on the head
    dashboard_port: int = Field(rayports.DEFAULTS["dashboard_port"], ge=1, le=65535)
    client_port: int = Field(rayports.DEFAULTS["client_port"], ge=1, le=65535)  # Ray Client server, on the head
    # these two on the head, by environment
    autoscaler_metrics_port: int = Field(rayports.DEFAULTS["autoscaler_metrics_port"], ge=1, le=65535)
    dashboard_metrics_port: int = Field(rayports.DEFAULTS["dashboard_metrics_port"], ge=1, le=65535)
    node_manager_port: int = Field(rayports.DEFAULTS["node_manager_port"], ge=1, le=65535)  # on every node, as the rest
    object_manager_port: int = Field(rayports.DEFAULTS["object_manager_port"], ge=1, le=65535)
    runtime_env_agent_port: int = Field(rayports.DEFAULTS["runtime_env_agent_port"], ge=1, le=65535)
    dashboard_agent_grpc_port: int = Field(rayports.DEFAULTS["dashboard_agent_grpc_port"], ge=1, le=65535)
    dashboard_agent_listen_port: int = Field(rayports.DEFAULTS["dashboard_agent_listen_port"], ge=1, le=65535)
    metrics_export_port: int = Field(rayports.DEFAULTS["metrics_export_port"], ge=1, le=65535)
    min_worker_port: int = Field(rayports.DEFAULTS["min_worker_port"], ge=1, le=65535)
    max_worker_port: int = Field(rayports.DEFAULTS["max_worker_port"], ge=1, le=65535)
    num_cpus: int | None = Field(None, ge=0, le=4096)  # default: Ray counts the host's cores
    object_store_memory: int | None = Field(None, ge=78643200, le=1 << 50)  # bytes; Ray's minimum is 75 MiB
    temp_dir: str | None = None  # default: /tmp/sfr-<8 hex digits of cluster and host name>
    start_timeout: float = Field(180, gt=0, le=3600)  # seconds for each node to start and for all to register
    env: dict[str, str] = Field(default_factory=dict)  # extra environment for `ray start` everywhere


class ContainerSettings(Model):
    # `-v SRC:DST[:ro|rw]` for model, data and checkpoint paths (dockerargs.py)
    volumes: list[str] = Field(default_factory=list)
    shm_size: str = "16g"
    # `docker run --ulimit` of every node's container: locked memory unlimited, which NCCL over
    # InfiniBand/EFA needs (it pins its buffers). A Docker that may not raise rlimits (Docker inside
    # a container) refuses to start a container with it: `ulimits: []` there.
    ulimits: list[str] = Field(default_factory=lambda: ["memlock=-1"])
    # `docker run` options of dockerargs.DOCKER_RUN_OPTIONS, each with its value
    docker_args: list[str] = Field(default_factory=list)
    # extra environment of the container (no secrets: secret_env carries those)
    env: dict[str, str] = Field(default_factory=dict)


class HostSpec(Model):
    name: str
    address: str
    role: Literal["head", "worker"] = "worker"
    gpus: int = Field(ge=0, le=MAX_GPUS)
    interface: str = "auto"  # or a name; auto: the interface that routes to the head
    node_ip: str | None = None  # default: the head's is the address ssh reached; a worker's, its route's source
    user: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    key: str | None = None
    prefix: str | None = None
    python: str | None = None
    system_python: str | None = None
    num_cpus: int | None = Field(None, ge=0, le=4096)
    temp_dir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)


class InventoryFile(Model):
    name: str | None = None  # default: the file name without .yaml
    mode: Literal["container", "host"]
    image: str | None = None  # container mode: REGISTRY/REPO@sha256:DIGEST
    prefix: str | None = None  # host mode: the prefix of `invoke install` (holds stack.lock.json)
    python: str | None = None  # host mode: default <prefix>/venv/bin/python
    install_script: str | None = None  # host mode: a local script run on each host (idempotent)
    system_python: str = "python3"  # runs slimeforge's node agent on each host (stdlib only)
    state_dir: str = "~/.slimeforge/clusters"  # on each host: pids and logs of what we started
    ssh: SSHSettings = Field(default_factory=SSHSettings)
    ray: RaySettings = Field(default_factory=RaySettings)
    container: ContainerSettings = Field(default_factory=ContainerSettings)
    # Names of secrets read from the environment of `invoke cluster.up` and delivered to every host's
    # Ray (an env file of mode 0600, removed once read): cluster/credentials.py.
    secret_env: list[str] = Field(default_factory=list)
    hosts: list[HostSpec]


@dataclass(frozen=True)
class Host:
    """One host with its effective settings."""

    name: str
    address: str
    role: str
    gpus: int
    interface: str
    node_ip: str | None
    ssh: SSHTarget
    mode: str
    image: str | None
    prefix: str | None
    python: str | None  # host mode: the environment's python
    system_python: str
    num_cpus: int | None
    temp_dir: str
    state_dir: str  # this host's own directory (hosts may share a home directory over NFS)
    env: dict[str, str]

    @property
    def is_head(self) -> bool:
        return self.role == "head"

    @property
    def ray(self) -> str:
        """host mode: `ray` beside the environment's python (a venv's bin directory)."""
        return str(PurePosixPath(self.python or "python").parent / "ray")

    @property
    def lock_path(self) -> str | None:
        return paths.Prefix.at(self.prefix).lock if self.prefix else None


@dataclass(frozen=True)
class Inventory:
    path: Path
    name: str
    mode: str
    image: str | None
    install_script: Path | None
    ssh_options: SSHOptions
    ray: RaySettings
    container: ContainerSettings
    hosts: tuple[Host, ...]
    secret_env: tuple[str, ...] = ()

    @property
    def head(self) -> Host:
        return next(h for h in self.hosts if h.is_head)

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)


def default_temp_dir(cluster: str, host: str) -> str:
    # Short on purpose: Ray puts Unix sockets under <temp>/session_<date>_<pid>/sockets/, and a
    # socket path must fit in 107 bytes. One per host, as hosts may share /tmp (and do in tests).
    return "/tmp/sfr-" + hashlib.sha256(f"{cluster}\0{host}".encode()).hexdigest()[:8]


def _resolve(base: Path, value: str) -> Path:
    """A local file named in the inventory: `~` expanded, relative to the inventory's directory."""
    p = Path(value).expanduser()
    return p if p.is_absolute() else base / p


def _mapping(value: object) -> Mapping[str, object]:
    """A section of the raw inventory, or {} when it is missing or not a mapping (pydantic says so)."""
    return value if isinstance(value, dict) else {}


def check(data: Mapping[str, object], base: Path, trusted_config: bool = False) -> list[Problem]:
    """The rules between fields, on the raw mapping, so they are reported together with the
    type errors pydantic found (every problem at once, not one per run)."""
    p: list[Problem] = []
    hosts = data.get("hosts")
    if not isinstance(hosts, list) or not hosts:
        return [Problem("hosts", "must list at least one host", hosts, "a list of {name, address, role, gpus}")]
    hosts = [h if isinstance(h, dict) else {} for h in hosts]
    mode = data.get("mode")
    ssh = _mapping(data.get("ssh"))

    heads = [str(h.get("name", f"#{i}")) for i, h in enumerate(hosts) if h.get("role") == "head"]
    if len(heads) != 1:
        what = "no host has" if not heads else f"{len(heads)} hosts have"
        p.append(Problem("hosts", f"{what} role: head; exactly one must", heads,
                         "role: head on one host, worker (the default) on the others"))

    seen_names: dict[str, int] = {}
    seen_addr: dict[str, int] = {}
    for i, h in enumerate(hosts):
        where = f"hosts.{i}"
        name = h.get("name")
        if isinstance(name, str):
            where = f"hosts.{i} ({name})" if len(name) <= 64 and not text_problem(name) else where
            if not NAME_RE.fullmatch(name):
                p.append(Problem(f"{where}.name", "is used in paths and container names", name,
                                 "letters, digits, '.', '_', '-', starting with a letter or digit, at most 63"))
            if name in seen_names:
                p.append(Problem(f"{where}.name", f"is the same as hosts.{seen_names[name]}'s; names must be unique",
                                 name))
            seen_names.setdefault(name, i)
        address = h.get("address")
        if isinstance(address, str):
            if why := address_problem(address):
                p.append(Problem(f"{where}.address", why, address,
                                 "e.g. 10.0.0.11, fd00::11, gpu-a.example.com, or a Host alias from your ssh config"))
            # One host, however it is spelt: case and a trailing dot do not matter in DNS, an IP is
            # its canonical form, and no port is port 22.
            port = h.get("port", ssh.get("port")) or 22
            # 22.0 is port 22, as the schema reads it
            port = int(port) if isinstance(port, float) and port.is_integer() else port
            key = hostport(unique_key(address), port)
            if key in seen_addr:
                p.append(Problem(f"{where}.address",
                                 f"is the same host as hosts.{seen_addr[key]}'s; addresses must be unique", key))
            seen_addr.setdefault(key, i)
        for field in ("user",):
            value = h.get(field, ssh.get(field))
            if isinstance(value, str) and not USER_RE.fullmatch(value):
                p.append(Problem(f"{where}.{field}", "is not a user name", value, "letters, digits, '_', '.', '-'"))
        iface = h.get("interface", "auto")
        if isinstance(iface, str) and iface != "auto" and not IFACE_RE.fullmatch(iface):
            p.append(Problem(f"{where}.interface", "is not a network interface name", iface,
                             "auto, or a name such as eth0, ens5, bond0 (at most 15 characters)"))
        node_ip = h.get("node_ip")
        if isinstance(node_ip, str):
            try:
                ipaddress.ip_address(node_ip)
            except ValueError:
                p.append(Problem(f"{where}.node_ip", "is not an IP address", node_ip,
                                 "an address of this host on the cluster network, e.g. 10.0.0.11"))
        for key_field in ("key",):
            value = h.get(key_field, ssh.get(key_field))
            if isinstance(value, str) and not _resolve(base, value).is_file():
                p.append(Problem(f"{where}.{key_field}" if key_field in h else f"ssh.{key_field}",
                                 "names no file on this machine", value,
                                 "a private key file (or leave it out: the ssh agent and ssh config apply)"))
        p += env_problems(f"{where}.env", h.get("env"))
        if mode == "container":
            for field in ("prefix", "python"):
                if field in h:
                    p.append(Problem(f"{where}.{field}",
                                     "is used in host mode only; this inventory has mode: container", h[field]))
        if mode == "host" and not (h.get("prefix") or h.get("python") or data.get("prefix") or data.get("python")):
            p.append(Problem(where,
                             "host mode needs the environment to run Ray from: prefix (with python at "
                             "<prefix>/venv/bin/python) or python", show_value=False,
                             accepted="prefix: /opt/slimeforge, or python: /path/to/venv/bin/python"))
        for field in ("python", "prefix", "temp_dir"):
            value = h.get(field, data.get(field) if field != "temp_dir" else None)
            if isinstance(value, str) and not value.startswith("/"):
                p.append(Problem(f"{where}.{field}" if field in h else field, "must be an absolute path on the hosts",
                                 value, "/path/on/the/hosts"))

    if mode == "container":
        image = data.get("image")
        if not image:
            p.append(Problem("image", "is required in container mode", image,
                             "REGISTRY/REPO@sha256:<64 hex digits> (invoke publish prints it)"))
        else:  # by the OCI grammar: `-v/:/host@sha256:...` must never reach `docker pull` or `docker run` as an option
            p.extend(image_ref_problems(image, "image", require_digest=True))
        for field in ("prefix", "python", "install_script"):
            if data.get(field) is not None:
                p.append(Problem(field, "is used in host mode only; this inventory has mode: container", data[field]))
    if mode == "host" and data.get("image") is not None:
        p.append(Problem("image", "is used in container mode only; this inventory has mode: host", data["image"]))

    script = data.get("install_script")
    if isinstance(script, str) and not _resolve(base, script).is_file():
        p.append(Problem("install_script", "names no file on this machine", script,
                         "a local script (e.g. the install.sh that `invoke install --dry-run` renders); it is sent to "
                         "each host"))
    config = ssh.get("config")
    if isinstance(config, str) and not trusted_config:
        # Held to the allow list: an inventory's config must not bring back what ssh.options refuses.
        p += config_problems(_resolve(base, config))
    p += ssh_problems(ssh)
    p += container_problems(_mapping(data.get("container")))

    ray = _mapping(data.get("ray"))
    p += env_problems("ray.env", ray.get("env"))
    container = _mapping(data.get("container"))
    p += env_problems("container.env", container.get("env"))
    if mode == "host" and container.get("env"):
        p.append(Problem("container.env", "is used in container mode only; this inventory has mode: host", None,
                         "ray.env (the environment of `ray start` on every host)", show_value=False))
    p += secret_env_problems(data.get("secret_env"),
                             [("ray.env", ray.get("env")), ("container.env", container.get("env"))]
                             + [(f"hosts.{i}.env", h.get("env")) for i, h in enumerate(hosts)])
    temp_dir = ray.get("temp_dir")
    if isinstance(temp_dir, str) and not temp_dir.startswith("/"):
        p.append(Problem("ray.temp_dir", "must be an absolute path on the hosts", temp_dir,
                         "/path/on/the/hosts, e.g. /tmp/ray"))
    p += rayports.port_problems(ray)
    name = data.get("name")
    if isinstance(name, str) and not NAME_RE.fullmatch(name):
        p.append(Problem("name", "is used in paths and container names", name,
                         "letters, digits, '.', '_', '-', starting with a letter or digit"))
    return p


SECRET_FIX = ("list its NAME under the inventory's secret_env and export it where you run `invoke cluster.up` "
              "(it reaches every host's Ray in a file of mode 0600, never an argv), or give the hosts an instance role")


def env_problems(where: str, env: Any) -> list[Problem]:
    """ray.env, container.env and hosts[].env alike: names by grammar, and no secret by its name
    or its value's shape (these values are shown by dry runs and land in argv lists and records)."""
    p: list[Problem] = []
    for key, value in env.items() if isinstance(env, dict) else ():
        if not (isinstance(key, str) and ENV_NAME_RE.fullmatch(key)):
            p.append(Problem(where, "is not an environment variable name", key,
                             "letters, digits and '_', not starting with a digit"))
        elif secret_name(key) or secret_value(value):
            p.append(Problem(f"{where}.{key}",
                             "looks like a secret; its value would be shown by dry runs, in `ps` and in records",
                             None, SECRET_FIX, show_value=False))
    return p


MAX_SECRETS = 64


def secret_env_problems(names: Any, envs: list[tuple[str, Any]]) -> list[Problem]:
    """secret_env: names only (as a recipe's), each once, none also set with a value in an env section."""
    if names is None or not isinstance(names, list):
        return []  # pydantic names a wrong type
    p: list[Problem] = []
    if len(names) > MAX_SECRETS:
        return [Problem("secret_env", f"lists {len(names)} names", len(names), f"at most {MAX_SECRETS}")]
    seen: set[str] = set()
    for i, name in enumerate(names):
        if not (isinstance(name, str) and ENV_NAME_RE.fullmatch(name)):
            p.append(Problem(f"secret_env.{i}", "is not an environment variable name", name,
                             "letters, digits and '_', not starting with a digit"))
            continue
        if name in seen:
            p.append(Problem(f"secret_env.{i}", "is listed twice", name, "each name once"))
        seen.add(name)
        if name in RESERVED_SECRET_ENV:
            p.append(Problem(f"secret_env.{i}", "is set by cluster.up itself and may not be replaced", name,
                             "any other name"))
        for where, env in envs:
            if isinstance(env, dict) and name in env:
                p.append(Problem(f"secret_env.{i}",
                                 f"is also set in {where}; a secret's value never goes into an inventory", name,
                                 f"remove it from {where}"))
    return p


# Set by cluster.up in every node's environment (nodestart.ray_env, the record's token).
RESERVED_SECRET_ENV = frozenset({"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "PATH", "SLIMEFORGE_CLUSTER_TOKEN"})


def ssh_problems(ssh: Mapping[str, object]) -> list[Problem]:
    """ssh.options are on the allow list (sshconfig.OPTIONS); proxy_jump is a host list; proxy_command is one line."""
    p = []
    options = ssh.get("options")
    for key, value in (options if isinstance(options, dict) else {}).items():
        # the name is shown as a value
        where = f"ssh.options.{key}" if re.fullmatch(r"[A-Za-z0-9]{1,64}", str(key)) else "ssh.options"
        if (problem := option_problem(where, str(key), value, OPTIONS)) is not None:
            p.append(problem)
    jump = ssh.get("proxy_jump")
    if jump is not None and not (isinstance(jump, str) and not text_problem(jump) and jump_hosts(jump)):
        p.append(Problem("ssh.proxy_jump", "is not a bastion list", jump,
                         "[user@]host[:port], comma-separated for a chain; IPv6 as [fd00::1]:22"))
    command = ssh.get("proxy_command")
    if command is not None and (not isinstance(command, str) or not command.strip() or text_problem(command)):
        p.append(Problem("ssh.proxy_command", "must be one line of text (ssh runs it with your shell)", command,
                         "e.g. aws ssm start-session --target %h --document-name AWS-StartSSHSession --parameters "
                         "portNumber=%p"))
    return p


def load_inventory(path: str | Path, ssh_config: str | Path | None = None) -> Inventory:
    """The inventory at `path`, validated. `ssh_config`: an ssh config file the user passed on the
    command line (--ssh-config): used in place of the inventory's ssh.config, as is (theirs)."""
    path = Path(path)
    data = load_with_extends(path)
    base = path.resolve().parent
    problems: list[Problem] = []
    spec, problems = model_problems(InventoryFile, data)
    if ssh_config is not None and not Path(ssh_config).expanduser().is_file():
        problems.append(Problem("--ssh-config", "names no file on this machine", str(ssh_config),
                                "your ssh config file"))
    problems += check(data, base, trusted_config=ssh_config is not None)
    if problems or spec is None:
        raise ConfigError(str(path), problems)

    name = spec.name or path.stem.replace("_", "-")
    if not NAME_RE.fullmatch(name):
        raise ConfigError(str(path), [Problem("name", "the file name is not a usable cluster name: set name:", name,
                                              "letters, digits, '.', '_', '-'")])
    config = (Path(ssh_config).expanduser().resolve() if ssh_config is not None
              else _resolve(base, spec.ssh.config) if spec.ssh.config is not None else None)
    options = SSHOptions(config_file=str(config) if config else None, connect_timeout=spec.ssh.connect_timeout,
                         extra=dict(spec.ssh.options),
                         proxy_jump=jump_hosts(spec.ssh.proxy_jump) if spec.ssh.proxy_jump else None,
                         proxy_command=spec.ssh.proxy_command,
                         tunnel=spec.ssh.tunnel)
    hosts = []
    for h in spec.hosts:
        prefix = h.prefix or spec.prefix
        python = h.python or spec.python or (paths.Prefix.at(prefix).python if prefix else None)
        key = h.key or spec.ssh.key
        hosts.append(
            Host(
                name=h.name,
                address=h.address,
                role=h.role,
                gpus=h.gpus,
                interface=h.interface,
                node_ip=h.node_ip,
                ssh=SSHTarget(
                    name=h.name,
                    address=ssh_address(h.address),
                    user=h.user or spec.ssh.user,
                    port=h.port or spec.ssh.port,
                    key=str(_resolve(base, key)) if key else None,
                ),
                mode=spec.mode,
                image=spec.image,
                prefix=prefix if spec.mode == "host" else None,
                python=python if spec.mode == "host" else None,
                system_python=h.system_python or spec.system_python,
                num_cpus=h.num_cpus if h.num_cpus is not None else spec.ray.num_cpus,
                temp_dir=h.temp_dir or spec.ray.temp_dir or default_temp_dir(name, h.name),
                state_dir=f"{spec.state_dir.rstrip('/')}/{name}/{h.name}",
                # The head's ports `ray start` has no option for (rayports.node_env): the inventory's, whatever ray.env
                # says.
                env={**spec.ray.env, **(spec.container.env if spec.mode == "container" else {}), **h.env,
                     **(rayports.node_env(spec.ray.model_dump()) if h.role == "head" else {})},
            )
        )
    return Inventory(
        path=path,
        name=name,
        mode=spec.mode,
        image=spec.image,
        install_script=_resolve(base, spec.install_script) if spec.install_script is not None else None,
        ssh_options=options,
        ray=spec.ray,
        container=spec.container,
        hosts=tuple(hosts),
        secret_env=tuple(spec.secret_env),
    )
