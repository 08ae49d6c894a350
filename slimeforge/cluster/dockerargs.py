"""The inventory's `container` section by grammar: what it adds to cluster.up's `docker run`.

`docker run [OPTIONS] IMAGE [COMMAND]` reads its first bare word as the image and the rest as the
command: a `docker_args` entry that is not an option, or the value of one, would put another image
(`busybox:latest`) in front of the pinned one, and `--entrypoint`, `--volume /:/host` or a label of
ours would change what runs or what slimeforge takes for its own. So docker_args is an allow list
of options, each with its value's grammar (`--opt=value` or `--opt value`; a value never starts with
`-`), and a volume is `SRC:DST[:ro|rw]` of absolute paths without `:` or `,` (docker splits there).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..errors import Problem
from ..schema import text_problem

INT = re.compile(r"-?[0-9]{1,12}")
SIZE = re.compile(r"[1-9][0-9]{0,12}[bkmgBKMG]?")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# `docker run --ulimit NAME=SOFT[:HARD]` (-1: unlimited): container.ulimits, and docker_args' --ulimit.
ULIMIT_RE = re.compile(r"(?P<name>[a-z]{2,12})=-?[0-9]{1,20}(?::-?[0-9]{1,20})?")
# option -> the grammar of its value (None: a switch without one). Anything else is refused: the
# network, IPC, GPUs, name, labels, init and shm size are cluster.up's; mounts are `volumes`.
DOCKER_RUN_OPTIONS: dict[str, re.Pattern[str] | None] = {
    "--cap-add": re.compile(r"[A-Za-z_]{1,40}"),
    "--cap-drop": re.compile(r"[A-Za-z_]{1,40}"),
    "--device": re.compile(r"/dev/[A-Za-z0-9_./-]{1,250}(?::/dev/[A-Za-z0-9_./-]{1,250})?(?::[rwm]{1,3})?"),
    "--device-cgroup-rule": re.compile(r"[abc] (?:[0-9]{1,10}|\*):(?:[0-9]{1,10}|\*) [rwm]{1,3}"),
    "--ulimit": ULIMIT_RE,
    "--security-opt": re.compile(r"[a-z-]{1,32}(?:[=:][A-Za-z0-9_.,/=-]{1,256})?"),
    "--privileged": None,
    "--pids-limit": INT,
    "--memory": SIZE,
    "--memory-swap": re.compile(r"-1|[1-9][0-9]{0,12}[bkmgBKMG]?"),
    "--cpus": re.compile(r"[0-9]{1,4}(?:\.[0-9]{1,3})?"),
    "--cpuset-cpus": re.compile(r"[0-9]{1,4}(?:-[0-9]{1,4})?(?:,[0-9]{1,4}(?:-[0-9]{1,4})?){0,255}"),
    "--cpuset-mems": re.compile(r"[0-9]{1,4}(?:-[0-9]{1,4})?(?:,[0-9]{1,4}(?:-[0-9]{1,4})?){0,63}"),
    "--oom-score-adj": INT,
    "--sysctl": re.compile(r"[a-z0-9_.]{1,128}=[A-Za-z0-9_.,/-]{0,256}"),
    "--group-add": NAME,
    "--user": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?"),
    "--add-host": re.compile(r"[A-Za-z0-9_.-]{1,253}:[0-9A-Fa-f:.]{2,45}"),
    "--dns": re.compile(r"[0-9A-Fa-f:.]{2,45}"),
    "--dns-search": re.compile(r"[A-Za-z0-9_.-]{1,253}"),
    "--dns-option": re.compile(r"[A-Za-z0-9_:.-]{1,64}"),
    "--tmpfs": re.compile(r"/[^\s:,]{0,4095}(?::[A-Za-z0-9=,_-]{1,256})?"),
    "--log-driver": NAME,
    "--log-opt": re.compile(r"[A-Za-z0-9_.-]{1,64}=[A-Za-z0-9_.,:/@%+-]{0,256}"),
    "--runtime": NAME,
    "--stop-timeout": INT,
    "--stop-signal": re.compile(r"(?:SIG)?[A-Z0-9+]{1,12}"),
}
VOLUME_RE = re.compile(r"(?P<src>/[^:,]{0,4095}):(?P<dst>/[^:,]{0,4095})(?::(?:ro|rw))?")
SHM_RE = re.compile(r"[1-9][0-9]{0,12}[bkmgBKMG]?")


def docker_args_problems(args: list[Any]) -> list[Problem]:
    """Every entry of container.docker_args that is not an allowed option or its value."""
    p: list[Problem] = []
    accepted = ", ".join(DOCKER_RUN_OPTIONS)
    i = 0
    while i < len(args):
        field, arg = f"container.docker_args.{i}", args[i]
        if not isinstance(arg, str) or text_problem(arg):
            p.append(Problem(field, "is not one line of text", arg, "a `docker run` option"))
            i += 1
            continue
        if not arg.startswith("--"):
            p.append(Problem(field,
                             "is a bare word that is not the value of an option: docker would take it for the image "
                             "(or the command)",
                             arg, f"options of `docker run`: {accepted}"))
            i += 1
            continue
        name, eq, value = arg.partition("=")
        if name not in DOCKER_RUN_OPTIONS:
            p.append(Problem(field,
                             "is not a `docker run` option slimeforge passes from an inventory (the network, IPC, "
                             "GPUs, "
                             "labels, init and entrypoint are cluster.up's; mounts are container.volumes)", name,
                             accepted))
            i += 1
            continue
        pattern = DOCKER_RUN_OPTIONS[name]
        if pattern is None:
            if eq:
                p.append(Problem(field, f"{name} is a switch: it takes no value", arg, name))
            i += 1
            continue
        if not eq:
            if i + 1 >= len(args) or not isinstance(args[i + 1], str) or args[i + 1].startswith("-"):
                p.append(Problem(field, f"{name} needs a value (a value that starts with '-' is written {name}=VALUE)",
                                 args[i + 1] if i + 1 < len(args) else None, f"{name} VALUE or {name}=VALUE"))
                i += 1
                continue
            value, i = args[i + 1], i + 1
            field = f"container.docker_args.{i}"
        if text_problem(value) or not pattern.fullmatch(value):
            p.append(Problem(field, f"is not a value of {name}", value, pattern.pattern))
        i += 1
    return p


# Docker's volume names ([a-zA-Z0-9][a-zA-Z0-9_.-]+), then an absolute target and an optional mode.
NAMED_VOLUME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}:/[^:,\s]{0,4095}(?::(?:ro|rw))?")


def volume_problem(index: int, value: Any) -> Problem | None:
    field = f"container.volumes.{index}"
    accepted = "SRC:DST[:ro|rw], both absolute paths without ':' or ',' (e.g. /data/models:/models:ro)"
    m = VOLUME_RE.fullmatch(value) if isinstance(value, str) and not text_problem(value) else None
    if m is None and isinstance(value, str) and not text_problem(value) and NAMED_VOLUME_RE.fullmatch(value):
        # Docker would take it: a named volume. It lives inside one host's Docker, so every node
        # of the cluster would mount its own, different (likely empty) data under that name.
        return Problem(field,
                       f"names a Docker volume ({value.split(':', 1)[0]!r}): a named volume lives inside one host's "
                       "Docker "
                              "and is not the same data on every host of a cluster", value,
                       "a host path on a filesystem every host shares (NFS, Lustre), e.g. /shared/models:/models:ro")
    if m is None:
        return Problem(field, "is not a bind mount docker reads as given", value, accepted)
    for part in ("src", "dst"):
        if ".." in m.group(part).split("/"):
            return Problem(field, f"its {'source' if part == 'src' else 'target'} has a '..' component", value,
                           accepted)
    if m.group("dst").rstrip("/") == "":
        return Problem(field, "mounts over the container's /", value, accepted)
    return None


def container_problems(container: Mapping[str, object]) -> list[Problem]:
    """docker_args and volumes by grammar (the schema has checked they are lists of strings)."""
    p: list[Problem] = []
    args = container.get("docker_args")
    if isinstance(args, list):
        p += docker_args_problems(args)
    volumes = container.get("volumes")
    for i, vol in enumerate(volumes if isinstance(volumes, list) else []):
        if (problem := volume_problem(i, vol)) is not None:
            p.append(problem)
    ulimits = container.get("ulimits")
    seen: set[str] = set()
    for i, limit in enumerate(ulimits if isinstance(ulimits, list) else []):
        m = ULIMIT_RE.fullmatch(limit) if isinstance(limit, str) and not text_problem(limit) else None
        if m is None:
            p.append(Problem(f"container.ulimits.{i}", "is not a `docker run --ulimit` value", limit,
                             "NAME=SOFT[:HARD], -1 for unlimited, e.g. memlock=-1 or nofile=1048576:1048576"))
        elif m.group("name") in seen:
            p.append(Problem(f"container.ulimits.{i}", "sets a limit an earlier entry sets", limit, "each limit once"))
        else:
            seen.add(m.group("name"))
    shm = container.get("shm_size")
    if shm is not None and not (isinstance(shm, str) and SHM_RE.fullmatch(shm)):
        p.append(Problem("container.shm_size", "is not a size", shm, "e.g. 16g, 512m"))
    return p
