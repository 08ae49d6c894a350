"""slimeforge's node agent: the few things `cluster.up/status/down` need done ON a host.

It is sent over ssh on stdin (`python3 - COMMAND 'JSON'`), so nothing has to be installed on a
host beforehand, and it uses only the standard library of Python >= 3.8 (the hosts' python3, not
slimeforge's). Every command prints exactly one JSON object on stdout.

Commands:
  facts  hostname, addresses, GPUs (nvidia-smi), the route to the head, busy ports, TCP reachability,
         what we started earlier (from the state directory)
  start  start a long-running command (`ray start --block`) detached from the ssh session, record
         its pid (or container id) in the state directory, wait until it prints its ready marker
         (or, with wait_tcp alone, until a port opens)
  wait   wait for the marker of what `start` started
  stop   SIGTERM exactly the recorded process (`ray start --block` then stops every process it
         started) or `docker stop` the recorded container; nothing else
  nodes  GET a Ray dashboard's node list (run on the head, so the dashboard need not be exposed)
  runcheck  a recipe's paths on this host before a job is submitted (cluster/runcheck.py): a model
         dir with its config.json and weight sizes, files the job reads, the checkpoint dir writable,
         its free space, and the one-filesystem marker (written on one host, read on all)

Inside a Slurm allocation (templates/slurm.sbatch.j2 sends it to every node on srun's stdin, so a
node that cannot see the run directory still answers; the other Slurm commands: slurm_agent.py):
  slurm-check  this node's facts checked against what the job needs (GPUs, ports, route to the head),
               and the run's files as this node sees them (run directory, model, data, checkpoints)
"""

from __future__ import annotations

import fcntl
import getpass
import importlib
import json
import os
import platform
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import time

LOG = "ray.log"
# The one GPU query of slimeforge: the node agent asks it on every cluster host, and preflight
# (slimeforge/run/preflight/host.py) asks it on this one; both read it with parse_gpus.
NVIDIA_QUERY = "index,name,uuid,driver_version,memory.total,compute_cap,pci.bus_id"
QUERY_GPU = ["nvidia-smi", "--query-gpu=" + NVIDIA_QUERY, "--format=csv"]


# --- what we started (hostrecord: the record and its proofs) -----------------------------------

try:
    from . import awscheck, hostrecord, pathcheck, raynodes  # imported as slimeforge.scripts.node_agent
except ImportError:  # on a host: one program (slimeforge.scripts.program) that registered them first
    hostrecord = importlib.import_module("hostrecord")
    raynodes = importlib.import_module("raynodes")
    pathcheck = importlib.import_module("pathcheck")
    awscheck = importlib.import_module("awscheck")

RECORD, BadRecord = hostrecord.RECORD, hostrecord.BadRecord
tail, record_state = hostrecord.tail, hostrecord.record_state
_stat = hostrecord.proc_stat
# The commands of their own modules: the dashboard's node list (raynodes), a recipe's paths here
# (pathcheck), AWS as the job sees it (awscheck).
cmd_nodes, cmd_awscheck = raynodes.cmd_nodes, awscheck.cmd_awscheck
cmd_runcheck, slurm_paths = pathcheck.cmd_runcheck, pathcheck.slurm_paths


# --- network ---------------------------------------------------------------------------------


def iface_addresses():
    """{interface: IPv4 address} through SIOCGIFADDR (no `ip` needed: some GPU hosts lack iproute2)."""
    out = {}
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
            except OSError:
                continue
        out[name] = socket.inet_ntoa(packed[20:24])
    return out


def hostport(host, port):
    """HOST:PORT, with an IPv6 address in brackets ([fd00::1]:6379), as URLs and Ray's --address want."""
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def route_to(ip):
    """{"dev", "src"}: the interface and source address this host uses to reach `ip`."""
    if shutil.which("ip"):
        r = subprocess.run(["ip", "-o", "route", "get", ip], capture_output=True, text=True)
        if r.returncode == 0:
            words = r.stdout.split()
            info = {k: words[words.index(k) + 1] for k in ("dev", "src") if k in words}  # type: dict[str, str | None]
            if words and words[0] == "local":
                # `ip` names `lo` for one of our own addresses; Ray traffic uses the interface holding it.
                info["dev"] = next((d for d, a in iface_addresses().items() if a == ip), info.get("dev"))
                info["src"] = ip
            if "dev" in info and "src" in info:
                return info
    # Without iproute2: a UDP "connect" picks the route (no packet is sent).
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((ip, 9))
        src = s.getsockname()[0]
    dev = next((d for d, a in iface_addresses().items() if a == src), None)
    return {"dev": dev, "src": src}


def listening_ports():
    """TCP ports with a listening socket in this network namespace (/proc/net/tcp, tcp6)."""
    ports = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] == "0A":  # TCP_LISTEN
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except OSError:
            pass
    return ports


def tcp_reach(ip, port, timeout=3.0):
    """None when a TCP connection to ip:port opens, else the reason."""
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return None
    except OSError as exc:
        return str(exc) or type(exc).__name__


# --- commands --------------------------------------------------------------------------------


def parse_gpus(text):
    """QUERY_GPU's CSV (a header line, then a GPU per line) as dicts; ValueError on any other shape."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("index"):
        raise ValueError("unexpected nvidia-smi output: " + repr(text[:200]))
    out = []
    for line in lines[1:]:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 7 or not cells[0].isdigit():
            raise ValueError("unexpected nvidia-smi line: " + repr(line))
        mem = re.match(r"\d+", cells[4])
        out.append({"index": int(cells[0]), "name": cells[1], "uuid": cells[2], "driver": cells[3],
                    "memory_mib": int(mem.group(0)) if mem else 0, "compute_cap": cells[5], "pci_bus_id": cells[6]})
    return out


def gpus():
    if not shutil.which("nvidia-smi"):
        return {"error": "nvidia-smi not found on PATH"}
    try:
        r = subprocess.run(QUERY_GPU, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return {"error": "nvidia-smi did not answer within 60 s"}
    if r.returncode != 0:
        return {"error": f"nvidia-smi exited {r.returncode}: {(r.stdout + r.stderr).strip()[-300:]}"}
    try:
        return {"list": parse_gpus(r.stdout)}
    except ValueError as exc:
        return {"error": str(exc)}


def cmd_facts(p):
    state_dir = os.path.expanduser(p["state_dir"])
    conn = os.environ.get("SSH_CONNECTION", "").split()
    out = {
        "state_dir": state_dir,
        "hostname": socket.gethostname(),
        "user": getpass.getuser(),
        "ssh_server_ip": conn[2] if len(conn) == 4 else None,
        "ssh_server_port": int(conn[3]) if len(conn) == 4 else None,
        "python3": platform.python_version(),
        "kernel": platform.release(),
        "path": os.environ.get("PATH", ""),
        "addresses": iface_addresses(),
        "gpus": gpus(),
    }
    record, state, why, running = record_state(state_dir)
    if state == hostrecord.FOREIGN:  # shown by cluster.up's preflight and cluster.status, never acted on
        out["record"] = {"refused": why, "running": False}
    elif record is not None:
        out["record"] = dict(record, running=running, log_tail=tail(os.path.join(state_dir, LOG), 8))
    else:
        out["record"] = None
    if p.get("head_ip"):
        try:
            out["route"] = route_to(p["head_ip"])
        except OSError as exc:
            out["route"] = {"error": str(exc)}
    if p.get("ports"):
        busy = listening_ports()
        out["ports_busy"] = sorted(port for port in p["ports"] if port in busy)
    if p.get("reach"):
        out["reach"] = {hostport(ip, port): tcp_reach(ip, port) for ip, port in p["reach"]}
    if p.get("docker"):
        r = (subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True)
             if shutil.which("docker") else None)
        if r is not None and r.returncode == 0:
            out["docker"] = {"version": r.stdout.strip()}
        else:
            out["docker"] = {"error": r.stderr.strip() if r else "docker not found on PATH"}
    return out


def _start_problem(p):
    """Why `start` must not run p["argv"]: it starts only what `stop` can prove later."""
    if not (isinstance(p.get("token"), str) and hostrecord.TOKEN_RE.fullmatch(p["token"])):
        return "no cluster token (32 hex digits) was passed: cluster.up writes one into every record"
    if not (isinstance(p.get("cluster"), str) and hostrecord.CLUSTER_RE.fullmatch(p["cluster"])):
        return "no cluster name was passed"
    argv = p.get("argv")
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        return "argv is not a list of strings"
    if p.get("container"):
        labels = {f"{hostrecord.LABEL_CLUSTER}={p['cluster']}", f"{hostrecord.LABEL_TOKEN}={p['token']}"}
        given = {argv[i + 1] for i in range(len(argv) - 1) if argv[i] == "--label"}
        if argv[:2] == ["docker", "run"] and labels <= given:
            return None
        return "argv is not `docker run` with this cluster's labels"
    return None if hostrecord.is_ray_start(argv) else "argv is not `ray start --block ...`"


# --- secrets: the env file cluster.up writes over ssh's stdin (cluster/credentials.py) ----------

SECRET_FILE_RE = re.compile(r"secrets-[0-9a-f]{32}\.env")
ENV_LINE_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]{0,127})=([^\n\0]*)")
MAX_SECRET_FILE = 1 << 20


def secret_file_problem(path, state_dir):
    """Why `path` is not an env file cluster.up may name (in the state dir, by its token)."""
    if not (isinstance(path, str) and os.path.isabs(path) and os.path.dirname(path) == state_dir
            and SECRET_FILE_RE.fullmatch(os.path.basename(path))):
        return "env_file is not secrets-<token>.env in this host's state directory"
    return None


def read_env_file(path):
    """{NAME: value} of the env file: a regular file of ours, mode 0600, `NAME=value` lines (the
    format of `docker run --env-file`). Raises BadRecord naming the file, never showing a value."""
    data = hostrecord.read_regular(path, MAX_SECRET_FILE)
    if data is None:
        raise BadRecord(path + ": the secrets file is not there (cluster.up writes it right before the start)")
    st = os.stat(path)
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise BadRecord(path + ": the secrets file is not this user's alone (mode 0600): nothing started with it")
    out = {}
    for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        m = ENV_LINE_RE.fullmatch(line)
        if not m:
            raise BadRecord(f"{path}: line {n} is not NAME=value")
        out[m.group(1)] = m.group(2)
    return out


def remove_quietly(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def cmd_start(p):
    """start, and in every case the secrets file (if named) removed before the answer."""
    env_file = p.get("env_file")
    if env_file is None:
        return _start(p, None)
    state_dir = os.path.expanduser(p.get("state_dir", ""))
    why = secret_file_problem(env_file, state_dir)
    if why:
        return {"ok": False, "error": why + "; nothing started"}
    try:
        try:
            secrets = read_env_file(env_file)
        except BadRecord as exc:
            return {"ok": False, "error": f"{exc}; nothing started"}
        return _start(p, secrets)
    finally:
        remove_quietly(env_file)  # docker has read it (`docker run` returned) or it is in ray start's environment


def _start(p, secrets):
    why = _start_problem(p)
    if why:
        return {"ok": False, "error": why + "; nothing started"}
    state_dir = os.path.expanduser(p["state_dir"])
    os.makedirs(state_dir, exist_ok=True)
    record, state, why, running = record_state(state_dir)
    if state == hostrecord.FOREIGN:
        return {"ok": False,
                "error": f"{why}; left alone and nothing started: check it, remove {os.path.join(state_dir, RECORD)}, "
                         "run cluster.up again"}
    if running:
        return {"ok": True, "already": True, "record": record}
    if p.get("reach_first"):
        ip, port = p["reach_first"]
        why = tcp_reach(ip, port)
        if why:
            return {"ok": False, "error": f"cannot open a TCP connection to {hostport(ip, port)} from this host: {why}"}
    if record and "container" in record and state == hostrecord.OURS:
        # Ours (full id and labels proved) and stopped: remove it, so its name is free for the new one.
        hostrecord.docker("rm", "-f", "--", record["container"])
    log_path = os.path.join(state_dir, LOG)
    if os.path.lexists(log_path):
        os.replace(log_path, log_path + ".1")
    # The token in the process's environment: `stop` reads it back from /proc/PID/environ.
    env = dict(os.environ, **p.get("env", {}), **{hostrecord.TOKEN_ENV: p["token"]})
    argv = p["argv"]
    base = {"argv": argv, "token": p["token"], "cluster": p["cluster"], "started_at": time.time()}
    if secrets is not None:
        if p.get("container") and "--env-file" not in argv:
            return {"ok": False, "error": "a secrets file was sent but argv has no --env-file; nothing started"}
        if not p.get("container"):
            env.update(secrets)  # `ray start`'s environment: every raylet and worker inherits it
        base["secret_env"] = sorted(secrets)  # names only: `invoke run --cluster` compares a recipe's secret_env
    if p.get("container"):
        r = subprocess.run(argv, capture_output=True, text=True, env=env)
        cid = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
        if r.returncode != 0 or not hostrecord.CONTAINER_ID_RE.fullmatch(cid):
            return {"ok": False,
                    "error": f"docker run exited {r.returncode} without a container id: "
                             f"{(r.stdout + r.stderr).strip()[-2000:]}"}
        record = dict(base, container=cid)
        hostrecord.write_record(state_dir, record)
        return _wait_ready(p, record, log_path)
    with open(log_path, "ab") as log, open(os.devnull, "rb") as devnull:
        # A new session: no SIGHUP when the ssh connection ends, and not in ssh's process group.
        proc = subprocess.Popen(argv, stdin=devnull, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=state_dir,
                                start_new_session=True)
    st = _stat(proc.pid)
    if st is None:
        proc.wait()
        return {"ok": False, "error": "exited before it was ready", "log_tail": tail(log_path)}
    record = dict(base, pid=proc.pid, starttime=st[2], boot_id=hostrecord.boot_id())
    hostrecord.write_record(state_dir, record)
    return _wait_ready(p, record, log_path)


def _wait_ready(p, record, log_path):
    """Health gate: the marker in the output (and the port, if given) or the process's exit, by the deadline."""
    deadline = time.time() + p.get("timeout", 120)
    marker, wait_tcp = p.get("marker"), p.get("wait_tcp")
    while time.time() < deadline:
        if "container" in record:
            logs = hostrecord.docker("logs", "--", record["container"])
            text = logs.stdout + logs.stderr
            with open(log_path, "w") as f:
                f.write(text)
        else:
            text = (hostrecord.read_regular(log_path, 1 << 20, last=True) or b"").decode("utf-8", "replace")
        state, why, running = hostrecord.verdict(record)
        if not running:
            # FOREIGN here would be a process that is no longer the one started (its proof says how).
            error = "exited before it was ready" + (f" ({why})" if state == hostrecord.FOREIGN else "")
            return {"ok": False, "record": record, "error": error, "log_tail": tail(log_path)}
        if (not marker or marker in text) and (not wait_tcp or tcp_reach(wait_tcp[0], wait_tcp[1], 1.0) is None):
            return {"ok": True, "record": record}
        time.sleep(0.1)
    return {"ok": False, "record": record, "error": f"not ready after {p.get('timeout', 120)}s",
            "log_tail": tail(log_path)}


def cmd_wait(p):
    """Wait for what `start` started (and returned early from) to become ready."""
    state_dir = os.path.expanduser(p["state_dir"])
    record, state, why, _ = record_state(state_dir)
    if record is None or state == hostrecord.FOREIGN:
        return {"ok": False, "error": why if state == hostrecord.FOREIGN else "nothing recorded in " + state_dir}
    return _wait_ready(p, record, os.path.join(state_dir, LOG))


def cmd_stop(p):
    """Stop what the record names, once proved ours (hostrecord); refuse anything else, and say why."""
    state_dir = os.path.expanduser(p["state_dir"])
    record, state, why, running = record_state(state_dir)
    if record is not None and p.get("cluster") and record["cluster"] != p["cluster"]:
        state, why = hostrecord.FOREIGN, f"the record names cluster {record['cluster']!r}, not {p['cluster']!r}"
    if state == hostrecord.FOREIGN:
        return {"ok": False, "stopped": False, "refused": f"{why}; left alone (nothing signalled or removed)"}
    if record is None:
        return {"ok": True, "stopped": False, "reason": why}
    if state == hostrecord.ENDED:
        hostrecord.remove_record(state_dir)
        return {"ok": True, "stopped": False, "reason": why}
    if "container" in record:
        cid = record["container"]
        if running:
            hostrecord.docker("stop", "-t", str(int(p.get("timeout", 60))), "--", cid)
        hostrecord.docker("rm", "-f", "--", cid)
        hostrecord.remove_record(state_dir)
        return {"ok": True, "stopped": running, "container": cid}
    pid, start = record["pid"], record["starttime"]
    # Taken before the signal: if `ray start --block` cannot finish its own cleanup in time,
    # these (and only these: children of the proved process, by pid and start time) get SIGKILL.
    tree = hostrecord.descendants(pid)
    if not hostrecord.signal_proven(record, signal.SIGTERM):
        hostrecord.remove_record(state_dir)
        return {"ok": True, "stopped": False, "reason": f"recorded pid {pid} exited before it was signalled"}
    deadline = time.time() + p.get("timeout", 60)
    alive = hostrecord.alive
    while time.time() < deadline and (alive(pid, start) or any(alive(c, s) for c, s in tree)):
        time.sleep(0.2)
    forced = [pid] if hostrecord.signal_proven(record, signal.SIGKILL) else []
    for c, s in tree:
        if alive(c, s):
            os.kill(c, signal.SIGKILL)
            forced.append(c)
    hostrecord.remove_record(state_dir)
    return {"ok": True, "stopped": True, "pid": pid, "processes": 1 + len(tree), "forced": forced}


# --- inside a Slurm allocation ---------------------------------------------------------------
# The batch script exports what is only known inside the allocation (srun passes it to every task):
# SF_STEP_DIR (this job's directory in the run directory), SF_NODES (the allocation's nodes, head
# first), SF_HEAD_NODE and SF_HEAD_ADDR (its NodeAddr). The JSON parameters are fixed at render time.


def _head_ip():
    return socket.gethostbyname(os.environ["SF_HEAD_ADDR"])


def cmd_slurm_check(p):
    """One node's checks before Ray starts: GPUs seen >= needed, Ray's ports free, a route to the
    head (whose source address becomes this node's Ray IP), the job's programs present."""
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    try:
        head_ip = _head_ip()
    except OSError as exc:
        return {"node": node, "problems": [f"cannot resolve the head's address {os.environ['SF_HEAD_ADDR']!r}: {exc}"]}
    is_head = node == os.environ["SF_HEAD_NODE"]
    facts = cmd_facts({"state_dir": "~", "head_ip": head_ip,
                       "ports": p["ports"] + (p["head_ports"] if is_head else [])})
    problems = []
    found = facts["gpus"]
    seen = len(found.get("list", []))
    if p["gpus"] and "error" in found:
        problems.append(f"needs {p['gpus']} GPU(s) but {found['error']}")
    elif p["gpus"] > seen:
        problems.append(f"needs {p['gpus']} GPU(s) but nvidia-smi shows {seen}")
    if facts.get("ports_busy"):
        problems.append(f"port(s) {', '.join(map(str, facts['ports_busy']))} in use: Ray needs them (another job or "
                        "Ray on this node?)")
    route = facts.get("route", {})
    if "error" in route or not route.get("src") or not route.get("dev"):
        problems.append(f"no route to the head {head_ip}: {route.get('error', route)}")
    for program in p.get("programs", []):
        if not (os.path.isfile(program) and os.access(program, os.X_OK)) and not shutil.which(program):
            problems.append(f"{program}: not found or not executable on this node")
    problems += slurm_paths(p, is_head)
    return {"node": node, "ip": route.get("src"), "dev": route.get("dev"), "gpus_seen": seen, "problems": problems}


COMMANDS = {"facts": cmd_facts, "start": cmd_start, "wait": cmd_wait, "stop": cmd_stop, "nodes": cmd_nodes,
            "runcheck": cmd_runcheck,
            "awscheck": cmd_awscheck, "slurm-check": cmd_slurm_check}


def main(argv):
    if len(argv) != 3 or argv[1] not in COMMANDS:
        sys.stderr.write("usage: node_agent.py {" + ",".join(COMMANDS) + "} JSON\n")
        return 2
    try:
        result = COMMANDS[argv[1]](json.loads(argv[2]))
    except Exception as exc:  # whatever this host holds, the caller gets one JSON answer naming it
        result = {"ok": False,
                  "error": f"node agent {argv[1]} failed on this host: {type(exc).__name__}: {str(exc)[:500]}"}
    sys.stdout.write(json.dumps(result) + "\n")
    # The Slurm commands gate a batch script: their exit status says whether to go on.
    return 1 if argv[1].startswith("slurm-") and not result.get("ok", True) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
