"""A Ray cluster on the hosts of an inventory, over SSH: `up`, `down` and the dry run's plan.

The concepts, one module each: bringup.py (the phases of `up`, each host's Node, the default
seams), agent.py (the node agent protocol over ssh), nodestart.py (each node's `ray start` argv
and environment), clusterrecord.py (this machine's record of a bring-up: the head's addresses, read by
`invoke run --cluster`), statustable.py (cluster.status's table).

`up` runs in phases (connect, preflight, environment, ray: cluster/bringup.py names what each
does), every host in parallel within a phase, and stops at the first phase in which any host
failed, with a table of hosts and what failed.

Nothing starts Ray before every host has passed every check. Each `ray start --block` runs
detached on its host with its pid (or container id) recorded in that host's state directory,
with the proof that it is ours (scripts/hostrecord.py: start time, boot id, the exact argv and a
cluster token in the process's environment, or the container's full id and labels); `down`
signals exactly those once proved, and `ray start --block` stops every process it started on
SIGTERM. So we stop what we started and nothing else: a record naming anything else is refused,
and the refusal is a row of down's table. Running `up` again converges: a host already running
our Ray with the same settings is left as it is, and the others are brought up.

The seam (bringup.HostSetup; DefaultSetup is what `invoke cluster.up` runs, tests pass another):
  setup.checks(host, remote) -> list[Problem]                 more preflight per host; default:
                                                              preflight's /dev/shm and ulimit checks
  setup.environment(inventory, host, remote) -> EnvFacts      make the environment, report it
`remote` is an `slimeforge.cluster.ssh.SSH`, a `proc.CommandRunner` as `proc.Runner` is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ..proc import Runner
from ..scripts.node_agent import hostport
from .agent import agent
from .bringup import (
    NCCL_SIZE_MB,
    PHASES,
    Bringup,
    CheckFailed,
    ClusterError,
    DefaultSetup,
    HostSetup,
    Node,
    connect_phase,
    environment_phase,
    make_nodes,
    parallel,
    preflight_phase,
    ray_phase,
)
from .clusterrecord import ClusterAddress, state_file, write_state
from .credentials import secret_values
from .hosttable import HostTable
from .inventory import Inventory, load_inventory
from .nodestart import ports_for, ray_env, start_argv


def up(
    inventory: Inventory | str | Path,
    *,
    nccl_check: bool = False,
    setup: HostSetup | None = None,
    runner: Runner | None = None,
    control_dir: str | None = None,
    stream=None,
    live: bool | None = None,
) -> ClusterAddress:
    """Bring the cluster up (see the module docstring); returns its address. The dry run: `plan`."""
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    host_setup = setup or DefaultSetup()
    values = secret_values(inv, os.environ)  # a secret named but not exported stops here, before any host is touched
    b = Bringup(inv, make_nodes(inv, runner, control_dir),
                HostTable(f"cluster {inv.name}", [(h.name, h.role) for h in inv.hosts], PHASES, stream=stream,
                          live=live),
                secret_values=values)
    with b.table:
        connect_phase(b)
        preflight_phase(b, host_setup)
        environment_phase(b, host_setup, nccl_check)
        ray_phase(b)
    address = ClusterAddress(hostport(b.head_ip, inv.ray.port), f"http://{hostport(b.head_ip, inv.ray.dashboard_port)}")
    write_state(inv, b.nodes, address)
    return address


def down(inventory: Inventory | str | Path, *, runner: Runner | None = None, control_dir: str | None = None,
         stream=None, live: bool | None = None, timeout: float = 60) -> dict[str, Mapping[str, object]]:
    """Stop what `up` started: SIGTERM to each recorded `ray start --block` (or `docker stop` of
    each recorded container), workers first, then the head, each once proved ours on its host.
    Nothing else is touched: a host whose record names something else is a FAILED row
    ("refused: ..."), and down raises ClusterError with the table after trying every host."""
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    nodes = make_nodes(inv, runner, control_dir)
    table = HostTable(f"cluster {inv.name} down", [(h.name, h.role) for h in inv.hosts], ["stop"], stream=stream,
                      live=live)
    results: dict[str, Mapping[str, object]] = {}  # each host's stop answer, as the agent gave it

    def stop(node: Node) -> str:
        params = {"state_dir": node.host.state_dir, "timeout": timeout, "cluster": inv.name}
        result = agent(node.ssh, node.host, "stop", params, timeout=timeout + 60)
        results[node.name] = result
        if result.get("refused"):  # the record names something slimeforge cannot prove it started
            raise CheckFailed([f"refused: {result['refused']}"])
        if not result.get("stopped"):
            return result.get("reason", "nothing to stop")
        what = (f"pid {result['pid']} and {result['processes'] - 1} child process(es)" if "pid" in result
                else f"container {result['container'][:12]}")
        return f"stopped {what}" + (f"; forced (SIGKILL): {result['forced']}" if result.get("forced") else "")

    with table:
        failures = parallel([n for n in nodes if not n.host.is_head], stop, table, "stop")
        failures.update(parallel([n for n in nodes if n.host.is_head], stop, table, "stop"))
    for node in nodes:
        node.ssh.close()
    if failures:
        refused = sum(why.startswith("refused: ") for why in failures.values())
        what = (f"refused on {refused} host(s): the record there names a process or container slimeforge cannot prove "
                "it started (the table says what was found); it was left alone, and so was the record"
                if refused else "")
        unreachable = (f"could not stop Ray on {len(failures) - refused} host(s); run cluster.down again once they are "
                       "reachable" if len(failures) > refused else "")
        raise ClusterError(f"cluster {inv.name}: " + "; ".join(x for x in (unreachable, what) if x) + ".", table,
                           failures)
    state_file(inv).unlink(missing_ok=True)
    return results


def plan(inventory: Inventory | str | Path, *, nccl_check: bool = False, control_dir: str | None = None) -> list[str]:
    """The per-host plan, as text lines: what `up` would run where. Touches nothing."""
    inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
    runner = Runner(dry_run=True)
    nodes = make_nodes(inv, runner, control_dir)
    head_ip = inv.head.node_ip or "HEAD_IP"
    lines = [
        f"cluster {inv.name}: {len(inv.hosts)} host(s), mode {inv.mode}, {sum(h.gpus for h in inv.hosts)} GPU(s); "
        "dry run: nothing is touched",
        "  HEAD_IP: the address the head answers ssh on (set node_ip on the head to choose it);",
        "  NODE_IP, IFACE: source address and interface of `ip -o route get HEAD_IP` on each host, found in preflight",
    ]
    if inv.secret_env:
        unset = [n for n in inv.secret_env if not os.environ.get(n)]
        lines.append(f"  secrets (secret_env, names only): {', '.join(inv.secret_env)}"
                     + (f"; NOT exported here: {', '.join(unset)} (cluster.up refuses until they are)" if unset
                        else "; each exported here"))
    if inv.ssh_options.proxy_command:
        lines.append("  ssh proxy command (ssh.proxy_command; ssh runs it on THIS machine for every connection): "
                     f"{inv.ssh_options.proxy_command}")
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
        lines.append(f"  preflight    {'; '.join(checks)}; interface and node IP; /dev/shm and ulimits (the doctor's "
                     "host checks, over ssh)")
        if h.mode == "host":
            if inv.install_script:
                lines.append(f"  environment  bash -s < {inv.install_script}")
            lines.append(f"  environment  {h.python} -c <versions> "
                         f"{h.lock_path or ''}".rstrip() + "   (same lock, Python and Ray as the head)")
        else:
            lines.append(f"  environment  docker pull {h.image}; docker image inspect; versions in the image (same "
                         "digest, Python and Ray as the head)")
        if nccl_check and h.gpus > 0:
            lines.append(f"  environment  nccl_check.py --size-mb {NCCL_SIZE_MB} across {h.gpus} GPUs")
        env_file = f"{h.state_dir}/secrets-TOKEN.env" if inv.secret_env else None
        if env_file:
            reader = "docker run --env-file" if h.mode == "container" else "the node agent into ray start's environment"
            lines.append(f"  secrets      {', '.join(inv.secret_env)} (names only): values from this environment, "
                         f"over ssh's stdin into {env_file} (mode 0600), read by {reader}, then removed")
        argv = start_argv(inv, h, ip, head_ip, env, "TOKEN", env_file if h.mode == "container" else None)
        env_text = " ".join(f"{k}={v}" for k, v in env.items()) if h.mode == "host" else ""
        lines.append(f"  ray          {env_text + ' ' if env_text else ''}{' '.join(argv)}")
        lines.append("               (detached; pid, start time, boot id, argv and a cluster token recorded; ready "
                     "when it prints 'Ray runtime started.')")
    lines.append("")
    lines.append(f"then: wait up to {inv.ray.start_timeout:g}s until "
                 f"{hostport(head_ip, inv.ray.dashboard_port)}/api/v0/nodes lists every host ALIVE with its GPUs")
    return lines
