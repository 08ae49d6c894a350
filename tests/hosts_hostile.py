"""Issue 33's corpus of the hosts side, case by class, and the harness that judges each answer.

Black-box on purpose (the node agent as cluster.up sends it, `load_inventory`), so the same cases
run against an older checkout to count the "before": `PYTHONPATH=OLD python benchmarks/hostile_hosts.py`.

  agent     a host's record (ray.json) replaced by a hostile one; `stop` then `facts` run as
            cluster.down and cluster.up run them (python3 - COMMAND JSON, the agent on stdin,
            10 s watchdog). Judged: answered, no traceback, refused (never "stopped"), the `sleep
            300` it names still alive, no docker command reached with a name or an option.
  inventory an inventory (or the ssh config file it names) with a hostile value: load_inventory,
            5 s watchdog. Judged: a ConfigError naming the field, or, for the good neighbours
            (IPv6 hosts and bastions, allowed options), accepted.

Outcomes: refused / accepted (right), and the wrong ones: acted, injection (accepted a way to
run or shift a command), silent (accepted other bad input), traceback, hang, false refusal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

TOKEN = "5f" * 16
GOOD, WRONG = ("refused", "accepted"), ("acted", "injection", "silent", "traceback", "hang", "false refusal")


def _start_time(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _process(pid_: int, **fields: Any) -> dict[str, Any]:
    pid = pid_
    rec = {"pid": pid, "starttime": _start_time(pid), "boot_id": _boot_id(), "argv": ["/opt/sf/venv/bin/ray", "start",
                                                                                      "--block"],
           "token": TOKEN, "cluster": "lab", "started_at": 1.0}
    rec.update(fields)
    return rec


def _container(cid: str) -> dict[str, Any]:
    return {"container": cid, "argv": ["docker", "run"], "token": TOKEN, "cluster": "lab", "started_at": 1.0}


def _write(doc: Any) -> Callable[[Path, int], None]:
    return lambda path, pid: path.write_text(json.dumps(doc(pid) if callable(doc) else doc))


def _nest(path: Path, pid: int) -> None:
    path.write_text("[" * 30000 + "]" * 30000)  # under the size cap: the depth is what is refused


# (id, class, make(record path, sleeper pid)): every one names or breaks the record of a host.
AGENT_CASES: list[tuple[str, str, Callable[[Path, int], None]]] = [
    ("sleep-with-ray-argv", "acts on another's process", _write(lambda pid: _process(pid))),
    ("sleep-own-argv", "acts on another's process", _write(lambda pid: _process(pid, argv=["sleep", "300"]))),
    ("sleep-no-token", "acts on another's process", _write(lambda pid: {k: v for k,
                                                                        v in _process(pid).items() if k != "token"})),
    ("sleep-legacy-record", "acts on another's process", _write(lambda pid: {"pid": pid, "starttime": _start_time(pid),
                                                                             "argv": ["ray"]})),
    ("container-registry-name", "acts on another's container",
     _write(_container(f"registry-sf-hostile-{os.getpid()}"))),
    ("container-option", "acts on another's container", _write(_container("--all"))),
    ("container-short-id", "acts on another's container", _write(_container("0123456789ab"))),
    ("fifo", "hang", lambda path, pid: os.mkfifo(path)),
    ("directory", "traceback", lambda path, pid: path.mkdir()),
    ("dev-zero", "traceback", lambda path, pid: path.symlink_to("/dev/zero")),
    ("not-utf8", "traceback", lambda path, pid: path.write_bytes(b'{"pid": "\xff"}')),
    ("deep-nesting", "traceback", _nest),
    ("string-pid", "traceback", _write(lambda pid: _process(pid, pid=str(pid)))),
    ("bool-pid", "traceback", _write(lambda pid: _process(pid, pid=True))),
    ("huge", "traceback", lambda path, pid: path.write_text(json.dumps(_process(pid, argv=["x" * (1 << 20)])))),
    ("list", "traceback", _write([1, 2])),
]


def agent_program() -> str:
    from slimeforge.cluster.agent import agent_source

    return agent_source()


def run_agent(source: str, command: str, params: dict[str, Any], timeout: float = 10) -> tuple[int | None, str]:
    try:
        r = subprocess.run([sys.executable, "-", command, json.dumps(params)], input=source, capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, ""
    return r.returncode, r.stdout + r.stderr


def judge_agent(tmp: Path, case: tuple[str, str, Callable[[Path, int], None]], source: str) -> tuple[str, str]:
    """(outcome, detail) of one agent case: stop, then facts, on a state directory holding it."""
    _, _, make = case
    state = tmp / case[0]
    state.mkdir()
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        make(state / "ray.json", sleeper.pid)
        outcome, detail = "refused", ""
        for command in ("stop", "facts"):
            code, out = run_agent(source, command, {"state_dir": str(state), "timeout": 1, "cluster": "lab"})
            if code is None:
                if (state / "ray.json").exists() and Path(state / "ray.json").is_fifo():
                    _unblock(state / "ray.json")
                return "hang", f"{command} did not answer in 10 s"
            if "Traceback" in out:
                return "traceback", f"{command}: {out.strip().splitlines()[-1][:160]}"
            answer = json.loads(out.strip().splitlines()[-1])
            if sleeper.poll() is not None:
                return "acted", f"{command} killed the recorded sleep"
            if command == "stop":
                if answer.get("stopped") or "container" in answer:
                    return "acted", f"stop: {json.dumps(answer)[:160]}"
                if not answer.get("refused") and answer.get("ok", True):
                    outcome, detail = "silent", f"stop: {json.dumps(answer)[:160]}"
                else:
                    detail = str(answer.get("refused") or answer.get("error"))[:160]
        return outcome, detail
    finally:
        sleeper.kill()
        sleeper.wait()


def _unblock(fifo: Path) -> None:
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    except OSError:
        pass


BASE_INVENTORY: dict[str, Any] = {
    "name": "lab",
    "mode": "container",
    "image": "reg.example.com/slimeforge/cu13@sha256:" + "b" * 64,
    "hosts": [{"name": "gpu-a", "address": "10.0.0.11", "role": "head", "gpus": 8}, {"name": "gpu-b",
                                                                                     "address": "10.0.0.12",
                                                                                     "gpus": 8}],
}


def _ssh(**ssh: Any) -> dict[str, Any]:
    return {"ssh": ssh}


def _config(text: str) -> dict[str, Any]:
    return {"ssh": {"config": "ssh_config"}, "__file__": text}


def _fifo_config() -> dict[str, Any]:
    return {"ssh": {"config": "ssh_config"}, "__fifo__": True}


def _addr(a: str, b: str = "10.0.0.12") -> dict[str, Any]:
    return {"hosts": [{"name": "gpu-a", "address": a, "role": "head", "gpus": 8}, {"name": "gpu-b", "address": b,
                                                                                   "gpus": 8}]}


def _args(*args: str) -> dict[str, Any]:
    return {"container": {"docker_args": list(args)}}


# (id, class, changes, the field the error names; None: must be accepted)
INVENTORY_CASES: list[tuple[str, str, dict[str, Any], str | None]] = [
    # ssh.options: an allow list
    *[(f"option-{k}", "runs commands", _ssh(options={k: v}), f"ssh.options.{k}") for k, v in [
        ("XAuthLocation", "/tmp/x; touch MARK"), ("ForwardAgent", "yes"), ("RemoteForward", "8080 localhost:80"),
            ("SendEnv", "AWS_*"),
        ("Hostname", "evil.example.com"), ("SetEnv", "A=1"), ("LocalForward", "1 h:2"), ("DynamicForward", "1080"),
            ("ProxyCommand", "touch MARK"),
        ("LocalCommand", "touch MARK"), ("KnownHostsCommand", "touch MARK"), ("PermitLocalCommand", "yes"),
            ("proxycommand", "touch MARK"),
        ("Include", "/tmp/x"), ("Match", "exec touch MARK"), ("ControlPath", "/tmp/x"), ("ForwardX11", "yes")]],
    ("option-value-newline", "runs commands", _ssh(options={"UserKnownHostsFile": "/k\nProxyCommand touch MARK"}),
     "ssh.options.UserKnownHostsFile"),
    # an ssh config file named by the inventory: the same list
    *[(f"config-{d.split()[0]}", "runs commands", _config(f"Host *\n  {d}\n"), "ssh.config") for d in [
        "ProxyCommand touch MARK", "LocalCommand touch MARK", "PermitLocalCommand yes",
            "KnownHostsCommand /bin/touch MARK",
        "XAuthLocation /tmp/x", "ForwardAgent yes", "RemoteForward 1 h:2", "LocalForward 1 h:2", "DynamicForward 1080",
            "SendEnv *",
        "SetEnv A=1", "Include /etc/ssh/ssh_config.d/*", "Match exec \"touch MARK\"", "proxycommand=touch MARK",
            "HostName $(touch MARK)"]],
    ("config-fifo", "hang", _fifo_config(), "ssh.config"),
    # docker_args and volumes: no image or option shift
    ("docker-args-image", "image or option shift", _args("busybox:latest"), "container.docker_args.0"),
    ("docker-args-entrypoint", "image or option shift", _args("--entrypoint", "sh"), "container.docker_args.0"),
    ("docker-args-volume", "image or option shift", _args("-v", "/:/host"), "container.docker_args.0"),
    ("docker-args-label", "image or option shift", _args("--label", "slimeforge.cluster_token=x"),
     "container.docker_args.0"),
    ("docker-args-value-option", "image or option shift", _args("--cap-add", "--privileged"),
     "container.docker_args.0"),
    ("docker-args-switch-value", "image or option shift", _args("--privileged", "busybox"), "container.docker_args.1"),
    ("docker-args-network", "image or option shift", _args("--network=bridge"), "container.docker_args.0"),
    ("volume-colon", "image or option shift", {"container": {"volumes": ["/data/a:b:/data:ro"]}},
     "container.volumes.0"),
    ("volume-comma", "image or option shift", {"container": {"volumes": ["/data,x:/data"]}}, "container.volumes.0"),
    ("volume-relative", "image or option shift", {"container": {"volumes": ["data:/data"]}}, "container.volumes.0"),
    ("volume-option", "image or option shift", {"container": {"volumes": ["--privileged"]}}, "container.volumes.0"),
    ("volume-mode", "image or option shift", {"container": {"volumes": ["/a:/b:z"]}}, "container.volumes.0"),
    ("ulimit-option", "image or option shift", {"container": {"ulimits": ["--privileged"]}}, "container.ulimits.0"),
    ("ulimit-image", "image or option shift", {"container": {"ulimits": ["memlock=-1 busybox"]}},
     "container.ulimits.0"),
    ("ulimit-twice", "silent", {"container": {"ulimits": ["memlock=-1", "memlock=1024"]}}, "container.ulimits.1"),
    # addresses: IPv6 accepted (validated by ipaddress), junk refused
    ("ipv6-host", "false refusal", _addr("fd00::11", "fd00::12"), None),
    ("ipv6-bracketed", "false refusal", _addr("[fd00::11]", "[2001:db8::12]"), None),
    ("ipv6-link-local-zone", "false refusal", _addr("fe80::1%eth0"), None),
    ("ipv6-bastion", "false refusal", _ssh(proxy_jump="ops@[fd00::1]:2222"), None),
    ("ipv6-bastion-bare", "false refusal", _ssh(proxy_jump="fd00::1"), None),
    ("ipv6-same-host", "silent", _addr("fd00::11", "fd00:0::11"), "hosts.1 (gpu-b).address"),
    ("ipv6-bad", "silent", _addr("fd00::zz"), "hosts.0 (gpu-a).address"),
    ("address-with-port", "silent", _addr("10.0.0.11:22"), "hosts.0 (gpu-a).address"),
    ("address-option", "silent", _addr("-oProxyCommand=x"), "hosts.0 (gpu-a).address"),
    # good neighbours
    ("allowed-options", "false refusal", _ssh(options={"StrictHostKeyChecking": "accept-new",
                                                       "userknownhostsfile": "/k", "IdentitiesOnly": "yes"}), None),
    ("allowed-config", "false refusal",
     _config("Host *\n  User root\n  IdentityFile ~/.ssh/id\nHost a\n  HostName 10.0.0.11\n  Port 2222\n"), None),
    ("allowed-docker-args", "false refusal", _args("--cap-add", "SYS_PTRACE", "--ulimit=memlock=-1:-1",
                                                   "--privileged"), None),
    ("allowed-volume", "false refusal", {"container": {"volumes": ["/data/models:/models:ro"]}}, None),
    ("allowed-ulimits", "false refusal", {"container": {"ulimits": ["memlock=-1", "stack=67108864"]}}, None),
    ("no-ulimits", "false refusal", {"container": {"ulimits": []}}, None),
]


def _merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(base))
    for k, v in changes.items():
        if k.startswith("__"):
            continue
        out[k] = {**out[k], **v} if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def judge_inventory(tmp: Path, case: tuple[str, str, dict[str, Any], str | None]) -> tuple[str, str]:
    from slimeforge.cluster.inventory import load_inventory
    from slimeforge.errors import ConfigError

    name, klass, changes, field = case
    d = tmp / name
    d.mkdir()
    path = d / "lab.yaml"
    path.write_text(yaml.safe_dump(_merge(BASE_INVENTORY, changes)))
    if "__file__" in changes:
        (d / "ssh_config").write_text(changes["__file__"].replace("MARK", str(d / "MARK")))
    if changes.get("__fifo__"):
        os.mkfifo(d / "ssh_config")
    box: dict[str, Any] = {}

    def load() -> None:
        try:
            box["inv"] = load_inventory(path)
        except ConfigError as exc:
            box["error"] = exc
        except Exception as exc:  # what the corpus looks for: judged below, never raised
            box["traceback"] = f"{type(exc).__name__}: {exc}"

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(5)
    if t.is_alive():
        _unblock(d / "ssh_config")
        t.join(5)
        return "hang", "load_inventory did not answer in 5 s"
    if "traceback" in box:
        return "traceback", box["traceback"][:160]
    if (d / "MARK").exists():
        return "injection", "a command ran"
    if "error" in box:
        err = box["error"]
        if field is None:
            return "false refusal", str(err).splitlines()[-1][:160]
        named = any(p.where.startswith(field) for p in err.problems)
        return ("refused", str(err).splitlines()[-1][:160]) if named else ("silent",
                                                                           f"refused, but not for {field}: "
                                                                           f"{str(err)[:160]}")
    if field is None:
        return "accepted", ""
    return ("injection" if klass in ("runs commands", "image or option shift") else "silent"), "accepted"


def table(tmp: Path) -> list[tuple[str, str, str, str, str]]:
    """(kind, class, case, outcome, detail) for every case."""
    rows = []
    source = agent_program()
    for case in AGENT_CASES:
        rows.append(("agent", case[1], case[0], *judge_agent(tmp, case, source)))
    for case in INVENTORY_CASES:
        rows.append(("inventory", case[1], case[0], *judge_inventory(tmp, case)))
    return rows
