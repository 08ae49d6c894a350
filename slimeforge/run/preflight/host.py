"""Host checks: GPUs (count, driver, architecture) through the node agent's one nvidia-smi query,
/dev/shm, ulimits and free ports. Each `*_findings` function reads through a `run(argv) -> stdout`,
so the same code checks this machine (`invoke doctor`) and, over ssh, every host of a cluster."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ...errors import CommandError
from ...image.stack import Stack, available_flavors, load_stack
from ...scripts.node_agent import QUERY_GPU, parse_gpus
from ..headstate import recorded_head
from .findings import Context, Finding, Run, check, describe_failure, error, ok, warning
from .toolfix import known_fix

SHM_MIN_GIB = 1  # NCCL and Ray's object store fail outright below this
SHM_GOOD_GIB = 16  # SGLang and NCCL's shared-memory transport want this much or more
NOFILE_GOOD = 65536  # Ray opens a socket and files per worker; its docs ask for this or more


# --- GPUs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    driver: str
    memory_mib: int
    compute_cap: str


def query_gpus(run: Run) -> list[Gpu]:
    """The GPUs the host `run` reaches, through the node agent's query and parser (one of each)."""
    return [Gpu(g["index"], g["name"], g["uuid"], g["driver"], g["memory_mib"],
                g["compute_cap"]) for g in parse_gpus(run(QUERY_GPU))]


def gpu_findings(gpus: list[Gpu] | Exception, need: int, where: str = "") -> list[Finding]:
    at = f" on {where}" if where else ""
    if isinstance(gpus, Exception):
        if isinstance(gpus, CommandError) and gpus.returncode == 127:
            return [error("gpus", f"nvidia-smi not found{at}: no NVIDIA driver",
                          "install the NVIDIA driver (it provides nvidia-smi), or run on a GPU host")]
        return [error("gpus", f"cannot list GPUs{at}: {describe_failure(gpus)}",
                      known_fix(gpus,
                                "what nvidia-smi said above is the cause (`nvidia-smi` on the host shows it again)"))]
    if len(gpus) < need:
        return [error("gpus", f"{len(gpus)} GPU(s){at}, the recipe needs {need} per host",
                      f"run on a host with {need} GPUs, or set num_gpus: {len(gpus)} in the recipe (tp_size and "
                      "rollout_gpus_per_engine must divide it)")]
    names = sorted({g.name for g in gpus})
    return [ok("gpus", f"{len(gpus)} x {', '.join(names)}{at} (need {need})")]


def driver_findings(gpus: list[Gpu] | Exception, stack: Stack, where: str = "") -> list[Finding]:
    at = f" on {where}" if where else ""
    if isinstance(gpus, Exception) or not gpus:
        return [warning("driver", f"not checked{at}: no GPU information")]
    if stack.driver_min is None:
        return [ok("driver", f"{gpus[0].driver}{at} (stack {stack.id} names no minimum)")]
    need = stack.driver_min
    bad = sorted({g.driver for g in gpus if _driver_major(g.driver) < need})
    if bad:
        return [error("driver",
                      f"driver {', '.join(bad)}{at} is too old for CUDA {stack.cuda} (stack {stack.name} needs "
                      f"R{stack.driver_min} or newer)",
                      f"install an R{stack.driver_min}+ NVIDIA driver{_older_stacks(stack)}")]
    return [ok("driver", f"{gpus[0].driver}{at} >= R{stack.driver_min} (CUDA {stack.cuda})")]


def _older_stacks(stack: Stack) -> str:
    """The flavors an older driver can run, each with its minimum as its stack says (never a copy here)."""
    need = stack.driver_min or 0
    older = sorted((s.driver_min, s.name) for s in map(load_stack,
                                                       available_flavors()) if s.driver_min and s.driver_min < need)
    return ", or use a stack built for an older CUDA (" + "; ".join(f"--set stack={n} needs R{d}+" for d,
                                                                    n in older) + ")" if older else ""


def _driver_major(version: str) -> int:
    m = re.match(r"(\d+)", version)
    return int(m.group(1)) if m else 0


def arch_findings(gpus: list[Gpu] | Exception, stack: Stack, where: str = "") -> list[Finding]:
    at = f" on {where}" if where else ""
    if isinstance(gpus, Exception) or not gpus:
        return [warning("gpu-arch", f"not checked{at}: no GPU information")]
    bad = sorted({(g.compute_cap, g.name) for g in gpus if g.compute_cap not in stack.arch_list})
    if bad:
        seen = ", ".join(f"{name} (compute capability {cap})" for cap, name in bad)
        return [error("gpu-arch",
                      f"{seen}{at} is not among the architectures the {stack.name} image is compiled for "
                      f"({', '.join(stack.arch_list)})",
                      f"add {', '.join(sorted({c for c, _ in bad}))!r} to arch_list in images/common.yaml and "
                      "rebuild, or run on GPUs of a listed architecture")]
    return [ok("gpu-arch",
               f"compute capability {', '.join(sorted({g.compute_cap for g in gpus}))}{at} is in arch_list")]


# --- host resources -------------------------------------------------------------------------------


def shm_findings(run: Run, where: str = "") -> list[Finding]:
    at = f" on {where}" if where else ""
    try:
        lines = run(["df", "-Pk", "/dev/shm"]).strip().splitlines()
        kib = int(lines[-1].split()[1])
    except Exception as exc:  # noqa: BLE001
        return [error("shm", f"cannot read the size of /dev/shm{at}: {describe_failure(exc)}",
                      "mount a tmpfs at /dev/shm (NCCL and Ray's object store need it)")]
    gib = kib / 2**20
    fix = ("mount -o remount,size=64G /dev/shm (host mode); container mode runs with --ipc=host, which uses the host's "
          "/dev/shm")
    if gib < SHM_MIN_GIB:
        return [error("shm",
                      f"/dev/shm{at} is {gib:.2f} GiB; NCCL and Ray's object store need at least {SHM_MIN_GIB} "
                      "GiB", fix)]
    if gib < SHM_GOOD_GIB:
        return [warning("shm",
                        f"/dev/shm{at} is {gib:.1f} GiB; {SHM_GOOD_GIB} GiB or more is recommended for SGLang and "
                        "NCCL", fix)]
    return [ok("shm", f"/dev/shm{at} is {gib:.0f} GiB")]


def limits_findings(run: Run, mode: str = "host", where: str = "") -> list[Finding]:
    at = f" on {where}" if where else ""
    try:
        memlock, nofile = run(["sh", "-c", "ulimit -l; ulimit -n"]).split()[:2]
    except Exception as exc:  # noqa: BLE001
        return [warning("limits", f"cannot read ulimits{at}: {describe_failure(exc)}")]
    out = []
    if memlock != "unlimited":
        if mode == "container":
            out.append(ok("limits", f"memlock {memlock} KiB{at}; the container runs with --ulimit memlock=-1"))
        else:
            out.append(warning("limits",
                               f"max locked memory{at} is {memlock} KiB; NCCL over InfiniBand/EFA needs it unlimited",
                               "`ulimit -l unlimited` (root), or `* - memlock unlimited` in /etc/security/limits.conf"))
    if nofile != "unlimited" and int(nofile) < NOFILE_GOOD:
        if mode == "container":
            out.append(ok("limits", f"open files {nofile}{at}; the container gets dockerd's limit for containers"))
        else:
            out.append(warning("limits", f"open files limit{at} is {nofile}; Ray wants {NOFILE_GOOD} or more",
                               "`ulimit -n 1048576` before launching, or `* - nofile 1048576` in "
                               "/etc/security/limits.conf"))
    return out or [ok("limits", f"memlock {memlock}, open files {nofile}{at}")]


# Tries to bind each port on all interfaces, as Ray and the gateway will; prints the busy ones.
_PORT_PROBE = """
import socket, sys
for p in sys.argv[1:]:
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", int(p)))
    except OSError:
        print(p)
    finally:
        s.close()
"""


def busy_ports(run: Run, ports: Iterable[int], python: str = "python3") -> set[int]:
    wanted = [str(p) for p in ports if p]
    if not wanted:
        return set()
    return {int(x) for x in run([python, "-c", _PORT_PROBE, *wanted]).split()}


def port_findings(run: Run, ports: dict[str, int], python: str = "python3", where: str = "",
                  ours: dict[int, str] | None = None) -> list[Finding]:
    """`ports` maps a name (e.g. "ray_port") to a port; `ours` lists ports held by something this
    launch stops first (the Ray head that an earlier launch recorded)."""
    at = f" on {where}" if where else ""
    ours = ours or {}
    try:
        busy = busy_ports(run, ports.values(), python)
    except Exception as exc:  # noqa: BLE001
        return [warning("ports", f"cannot probe ports{at}: {describe_failure(exc)}")]
    out = []
    for name, port in ports.items():
        if port in busy and port not in ours:
            out.append(error("ports", f"{name} {port}{at} is in use by another process",
                             f"free the port (`ss -ltnp 'sport = :{port}'` shows who holds it) or set {name} to a "
                             f"free port in the recipe (--set {name}=...)"))
    notes = [f"{port} is held by {who}, which this launch stops first" for port, who in ours.items() if port in busy]
    shown = ", ".join(f"{n} {p}" for n, p in ports.items() if p)
    return out or [ok("ports", f"free{at}: {shown}" + (f" ({'; '.join(notes)})" if notes else ""))]


# --- the registered checks: host ------------------------------------------------------------------


def _need_gpus(ctx: Context) -> int:
    return ctx.recipe.num_gpus if ctx.recipe else 1


def _gpus(ctx: Context):
    return ctx.once("gpus", lambda: query_gpus(ctx.read))


@check("gpus", "host")
def check_gpus(ctx: Context) -> list[Finding]:
    """GPUs present, at least num_gpus of them (nvidia-smi)."""
    return gpu_findings(_gpus(ctx), _need_gpus(ctx))


@check("driver", "host")
def check_driver(ctx: Context) -> list[Finding]:
    """The driver supports the image's CUDA (stack driver_min)."""
    return driver_findings(_gpus(ctx), ctx.stack)


@check("gpu-arch", "host")
def check_arch(ctx: Context) -> list[Finding]:
    """Every GPU's compute capability is in the stack's arch_list."""
    return arch_findings(_gpus(ctx), ctx.stack)


@check("shm", "host")
def check_shm(ctx: Context) -> list[Finding]:
    """/dev/shm is large enough for NCCL, Ray and SGLang."""
    return shm_findings(ctx.read)


@check("limits", "host")
def check_limits(ctx: Context) -> list[Finding]:
    """memlock and open-file limits."""
    return limits_findings(ctx.read, ctx.mode)


@check("ports", "host")
def check_ports(ctx: Context) -> list[Finding]:
    """The Ray GCS, dashboard and gateway ports are free."""
    r = ctx.recipe
    if r is None:
        ports = {"ray_port": 6379, "ray_dashboard_port": 8265}
    elif ctx.address:
        ports = {"gateway_port": r.gateway_port}  # the cluster's own ports are in use by design
    else:
        ports = {"ray_port": r.ray_port, "ray_dashboard_port": r.ray_dashboard_port, "gateway_port": r.gateway_port}
    ours = {}
    pid = recorded_head(ctx.state_dir)
    if pid and r is not None and not ctx.address:
        ours = {r.ray_port: f"the Ray head of an earlier launch (pid {pid})",
                r.ray_dashboard_port: f"the Ray head of an earlier launch (pid {pid})"}
    return port_findings(ctx.read, ports, ours=ours)


