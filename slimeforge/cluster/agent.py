"""The node agent protocol: slimeforge/scripts/node_agent.py run on a host over ssh.

`python3 - COMMAND JSON` with the agent's source on stdin (standard library only, no copy on the
host); it answers with one JSON line (login shells may print banners first: the last JSON line
counts). Commands: facts (GPUs, addresses, routes, ports, our records), start, wait, stop, nodes,
runcheck (a recipe's paths on the host: cluster/runcheck.py), awscheck (the secrets and AWS
credentials of the job's environment there: cluster/credentials.py). Secrets never enter the JSON
argument: `put_secret_file` writes them over stdin into a 0600 file that `start` reads and removes.
Every answer is input: last_json reads it bounded and strict, read_nodes and runcheck.read_answer
validate it, and an answer that is not the agent's is an OddAnswer naming the host (exit 2).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from typing import Any, TypedDict, cast

from .. import paths, scripts
from ..errors import CommandError, SlimeforgeError, shown
from ..schema import printable
from ..scripts.procproof import loads_strict
from ..scripts.raynodes import node_problem
from .inventory import Host
from .ssh import SSH, HostUnreachable

SCRIPTS = paths.SCRIPTS
# Versions and install lock of an environment, read with ITS python: the one versions probe.
VERSIONS_SNIPPET = (SCRIPTS / "env_probe.py").read_text()


@cache
def agent_source() -> str:
    return scripts.node_agent_program()


ANSWER_MAX_CHARS = 16 << 20  # the largest answer read: a runcheck of 10,000 weight files is ~1 MiB


class OddAnswer(SlimeforgeError):
    """A host's answer that is not what the node agent sends (exit 2: nothing was started on it).
    Names the host, the command and what came back, quoted (shown: no control characters)."""

    def __init__(self, host: str, command: str, why: str, value: object = ...):
        self.host, self.command = host, command
        got = f" (got {shown(value)})" if value is not ... else ""
        super().__init__(f"host {host}: the node agent's {command} answer {why}{got}; nothing was done with it: "
                         f"check what runs as python3 there (the node agent runs with it) and what prints at login")


def last_json(text: str) -> dict[str, Any]:
    """The last line of output that is a JSON object (login shells may print banners first): no
    NaN or Infinity, nesting the parser can hold, at most ANSWER_MAX_CHARS read."""
    if len(text) > ANSWER_MAX_CHARS:  # the answer is the last line: a flood before it is a banner
        text = text[-ANSWER_MAX_CHARS:]
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                doc = loads_strict(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                return doc
    raise SlimeforgeError(f"expected a JSON line (one object) in the output, got: {shown(text.strip()[-500:], 600)}")


def agent(ssh: SSH, host: Host, command: str, params: Mapping[str, object], timeout: float) -> dict[str, Any]:
    """Run the node agent on the host: `python3 - COMMAND JSON` with the agent's source on stdin."""
    result = ssh.run([host.system_python, "-", command, json.dumps(params, sort_keys=True)],
                     step=f"node agent {command}", input=agent_source(), timeout=timeout)
    try:
        return last_json(result.stdout)
    except SlimeforgeError as exc:
        raise OddAnswer(host.name, command, "is not one JSON object line: " + str(exc)) from None


class RayNode(TypedDict):
    """One entry of the dashboard's node list, as read_nodes let it through (node_agent.node_problem)."""

    node_ip: str
    state: str
    is_head_node: bool
    resources_total: dict[str, float]


def read_nodes(answer: Mapping[str, object], host: str) -> tuple[list[RayNode], str | None]:
    """The `nodes` answer, validated: (nodes, None), or ([], the dashboard's error, printable).
    Every node has node_ip, state, is_head_node and resources_total.GPU as the agent writes them."""
    if "error" in answer:
        err = answer["error"]
        if not isinstance(err, str):
            raise OddAnswer(host, "nodes", "has an error that is not text", err)
        return [], printable(err[:1000])
    nodes = answer.get("nodes")
    if not isinstance(nodes, list) or len(nodes) > 100_000:
        raise OddAnswer(host, "nodes", "has no list of nodes", nodes)
    for i, n in enumerate(nodes):
        why = node_problem(n)
        if why is None and not isinstance(n.get("is_head_node"), bool):
            why = "is_head_node is not true or false"
        if why:
            raise OddAnswer(host, "nodes", f"has a node {i} that {why}", n)
    return cast(list[RayNode], nodes), None  # each one checked above


def put_file(ssh: SSH, path: str, text: str) -> None:
    """Write `text` to `path` on the host (through stdin: no scp, no quoting of the content)."""
    ssh.run(["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", path], step=f"write {path}", input=text,
            timeout=60)


# --- secrets: over ssh's stdin into a 0600 file the node agent's `start` reads and removes -------
# Written by `sh` on the host: umask first, so the file is 0600 from the moment it exists; an
# old file of that name is removed and `set -C` refuses to write through anything made since.
PUT_SCRIPT = 'umask 077 && mkdir -p -- "${1%/*}" && rm -f -- "$1" && set -C && cat > "$1"'


def secret_file(state_dir: str, token: str) -> str:
    """The env file on a host: in its (expanded) state directory, named by the bring-up's token."""
    assert state_dir.startswith("/") and re.fullmatch(r"[0-9a-f]{32}", token)
    return f"{state_dir.rstrip('/')}/secrets-{token}.env"


def env_file_text(values: Mapping[str, str]) -> str:
    """`NAME=value` lines: the format of `docker run --env-file`, and what the node agent reads."""
    return "".join(f"{k}={v}\n" for k, v in values.items())


def put_secret_file(ssh: SSH, path: str, values: Mapping[str, str]) -> None:
    """The values to `path` on the host through ssh's stdin (never an argv), mode 0600."""
    ssh.run(["sh", "-c", PUT_SCRIPT, "sh", path], step="write the secrets file (names: " + ", ".join(values) + ")",
            input=env_file_text(values), timeout=60)


def remove_secret_file(ssh: SSH, path: str) -> None:
    """Best effort, after a start that may not have reached the agent (which removes it itself)."""
    try:
        ssh.run(["rm", "-f", "--", path], step="remove the secrets file", check=False, timeout=30)
    except SlimeforgeError:
        pass


def first_line(exc: BaseException) -> str:
    if isinstance(exc, HostUnreachable):  # ssh's own words say it all: host, port, reason
        lines = [line for line in exc.output.strip().splitlines() if line.strip()]
        return lines[-1] if lines else f"ssh failed (exit {exc.returncode})"
    if isinstance(exc, CommandError):
        tail = [line for line in exc.output.strip().splitlines() if line.strip()]
        return f"{exc.step.split(': ', 1)[-1]}: " + (tail[-1] if tail else f"exit {exc.returncode}")
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
