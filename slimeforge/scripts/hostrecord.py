"""What the node agent started on a host, and the proof that a thing is still that: the record
(ray.json in the host's state directory) and the verdicts the agent acts on.

Standard library only, Python >= 3.8: it runs on the hosts, inside the node agent's program
(slimeforge.scripts.program) with procproof.py, which reads records and proves pids for it and
for headrecord.py (the head a launch starts). The proofs, applied to what `cluster.up` starts on
each host:

- a process: its pid AND its start time (field 22 of /proc/PID/stat) AND the boot id (a start
  time means nothing after a reboot) AND the exact `ray start --block` argv recorded (the live
  /proc/PID/cmdline, the script's interpreter in front) AND the cluster token `cluster.up` wrote
  into the record and into the process's environment (SLIMEFORGE_CLUSTER_TOKEN);
- a container: its full id AND slimeforge's labels on it (the cluster's name and the token),
  asked of docker with `--` before the id.

A verdict is OURS (act on it), ENDED (gone: nothing to act on; the record can go) or FOREIGN
(something else holds the pid or id, or the record was edited: refuse and say why). A record
that is not one this module writes (a FIFO, a device, too big, not UTF-8, nested, mistyped) is a
BadRecord naming the file: read before anything is signalled, never a traceback or a hang.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import subprocess
import time

try:
    from . import procproof  # imported as slimeforge.scripts.hostrecord
except ImportError:  # on a host: one program (slimeforge.scripts.program) that registered it first
    procproof = importlib.import_module("procproof")

RECORD = "ray.json"
MAX_RECORD = 64 * 1024  # an argv and a few ids; a bigger file is not ours
MAX_DEPTH = 4  # {"argv": [...]} is 2 deep
MAX_ARGV, MAX_ARG = 512, 8192
PID_MAX = procproof.PID_MAX
TOKEN_ENV = "SLIMEFORGE_CLUSTER_TOKEN"
LABEL_CLUSTER, LABEL_TOKEN = "slimeforge.cluster", "slimeforge.cluster_token"
TOKEN_RE, BOOT_ID_RE = procproof.TOKEN_RE, procproof.BOOT_ID_RE
CONTAINER_ID_RE = re.compile(r"[0-9a-f]{64}")
CLUSTER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")  # inventory.NAME_RE
OURS, ENDED, FOREIGN = procproof.OURS, procproof.ENDED, procproof.FOREIGN
# The NAMES of the secrets `start` put in Ray's environment (never a value): optional, as records
# written before it have none.
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MAX_SECRETS = 64
PROCESS_KEYS = {"pid", "starttime", "boot_id", "argv", "token", "cluster", "started_at"}
CONTAINER_KEYS = {"container", "argv", "token", "cluster", "started_at"}


# The safe reading of a record and the proofs about a pid: procproof.py, shared with headrecord.py
# (the names stay here for the node agent).
BadRecord, read_regular = procproof.BadRecord, procproof.read_regular
proc_stat, boot_id = procproof.proc_stat, procproof.boot_id
argv_matches, proc_words = procproof.argv_matches, procproof.proc_words


# --- the record ----------------------------------------------------------------------------------


def tail(path, lines=25, cap=64 * 1024):
    """The last lines of a log we write (empty when it is missing or not a regular file)."""
    try:
        data = read_regular(path, cap, last=True)
    except BadRecord:
        return ""
    return "".join((data or b"").decode("utf-8", "replace").splitlines(True)[-lines:])


def is_ray_start(argv):
    """`ray start --block ...`: the only command the agent starts on a host (or `docker run` around it)."""
    return len(argv) >= 3 and os.path.basename(argv[0]) == "ray" and argv[1:3] == ["start", "--block"]


def record_problem(doc):
    """Why `doc` is not a record the agent writes (None when it is one)."""
    if not isinstance(doc, dict):
        return "is not a JSON object"
    keys = PROCESS_KEYS if "pid" in doc else CONTAINER_KEYS
    if set(doc) - {"secret_env"} != keys:
        return f"has the keys {sorted(doc)[:12]}, not {sorted(keys)} (and secret_env)"
    names = doc.get("secret_env", [])
    if not (isinstance(names, list) and len(names) <= MAX_SECRETS and all(isinstance(n, str)
                                                                          and ENV_NAME_RE.fullmatch(n) for n in names)):
        return "has a secret_env that is not a list of environment variable names"
    argv = doc["argv"]
    if not (isinstance(argv, list) and 1 <= len(argv) <= MAX_ARGV
            and all(isinstance(a, str) and len(a) <= MAX_ARG and "\0" not in a for a in argv)):
        return "has an argv that is not a list of strings"
    bad = []
    if not (isinstance(doc["token"], str) and TOKEN_RE.fullmatch(doc["token"])):
        bad.append("token (32 hex digits)")
    if not (isinstance(doc["cluster"], str) and CLUSTER_RE.fullmatch(doc["cluster"])):
        bad.append("cluster (a cluster name)")
    if not (type(doc["started_at"]) in (int, float) and 0 <= doc["started_at"] < 1e11):
        bad.append("started_at (seconds)")
    if "pid" in doc:
        if not procproof.whole(doc["pid"], 1, PID_MAX):
            bad.append(f"pid (a whole number 1..{PID_MAX})")
        if not procproof.whole(doc["starttime"], 0, 1 << 63):
            bad.append("starttime (clock ticks)")
        if not (isinstance(doc["boot_id"], str) and BOOT_ID_RE.fullmatch(doc["boot_id"])):
            bad.append("boot_id")
        if not is_ray_start(argv):
            bad.append("argv (`ray start --block ...`)")
    else:
        if not (isinstance(doc["container"], str) and CONTAINER_ID_RE.fullmatch(doc["container"])):
            bad.append("container (a full id: 64 hex digits)")
        if argv[:2] != ["docker", "run"]:
            bad.append("argv (`docker run ...`)")
    return f"has a malformed {', '.join(bad)}" if bad else None


def read_record(state_dir):
    """The validated record of what `start` started here; None when there is none."""
    return procproof.read_json(os.path.join(state_dir, RECORD), MAX_RECORD, MAX_DEPTH, record_problem)


def write_record(state_dir, record):
    """All or nothing: a whole record under a temporary name, then renamed over the old one."""
    tmp = os.path.join(state_dir, RECORD + ".tmp")
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, os.path.join(state_dir, RECORD))


def remove_record(state_dir):
    try:
        os.remove(os.path.join(state_dir, RECORD))
    except FileNotFoundError:
        pass


# --- processes -----------------------------------------------------------------------------------


def process_verdict(record):
    """(verdict, reason) for a process record, from what /proc says now."""
    pid = record["pid"]
    st = proc_stat(pid)
    if st is None or st[0] == "Z":
        return ENDED, f"recorded pid {pid} is no longer running"
    if boot_id() != record["boot_id"]:
        return ENDED, f"recorded pid {pid} was started before this host rebooted; pid {pid} is another process now"
    if st[2] != record["starttime"]:
        return ENDED, (f"recorded pid {pid} is no longer running (pid {pid} is another process now, started at tick "
                      f"{st[2]}, ours at {record['starttime']})")
    live = procproof.proc_words(pid, "cmdline")
    # Right after Popen returns (the exec has closed the parent's pipe), the kernel has not yet set
    # up the new argv: /proc/PID/cmdline reads empty for a moment. No process we start has none.
    deadline = time.monotonic() + 2
    while live == [] and time.monotonic() < deadline:
        time.sleep(0.01)
        live = procproof.proc_words(pid, "cmdline")
    if not argv_matches(record["argv"], live):
        return FOREIGN, f"pid {pid} is not the `ray start` slimeforge recorded: it runs {' '.join(live or [])[:160]!r}"
    env = procproof.proc_words(pid, "environ")
    if env is None or f"{TOKEN_ENV}={record['token']}" not in env:
        return FOREIGN, (f"pid {pid} runs `ray start` but without this cluster's token ({TOKEN_ENV}): another "
                        "cluster.up or a hand started it")
    return OURS, f"pid {pid} (start time, boot id, argv and cluster token match)"


def descendants(root):
    """[(pid, starttime)] of every process below `root`, found through /proc parent links."""
    children = {}  # type: dict[int, list[tuple[int, int]]]
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None:
                children.setdefault(st[1], []).append((int(name), st[2]))
    out, todo = [], [root]
    while todo:
        for pid, start in children.get(todo.pop(), []):
            out.append((pid, start))
            todo.append(pid)
    return out


def alive(pid, starttime):
    """`pid` still is the process seen earlier: same start time (pids are reused), not a zombie."""
    st = proc_stat(pid)
    return st is not None and st[2] == starttime and st[0] != "Z"


def signal_proven(record, sig):
    """Send `sig` to the recorded process only if it is still proven ours at the moment of sending.
    With a pidfd (Linux 5.3, Python 3.9) the proof and the signal are about the same process even if
    it exits in between and its pid is given to another: the pidfd keeps naming the first."""
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(record["pid"])
        except OSError:
            return False
    try:
        if process_verdict(record)[0] != OURS:
            return False
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(record["pid"], sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


# --- containers ----------------------------------------------------------------------------------


def docker(*args):
    """`docker ARGS` (every id after `--`, by the callers), captured."""
    return subprocess.run(["docker", *args], capture_output=True, text=True)


def container_verdict(record):
    """(verdict, reason, running) for a container record: `docker inspect` of the full id, its labels."""
    cid = record["container"]
    r = docker("inspect", "--type", "container", "--format", "{{json .}}", "--", cid)
    if r.returncode != 0:
        if "no such" in r.stderr.lower():
            return ENDED, f"container {cid[:12]} no longer exists", False
        raise BadRecord(f"docker inspect {cid[:12]} failed: {r.stderr.strip()[-300:]}")
    try:
        info = json.loads(r.stdout)
    except ValueError:
        raise BadRecord(f"docker inspect {cid[:12]} did not answer JSON") from None
    if not isinstance(info, dict) or info.get("Id") != cid:
        return FOREIGN, f"docker answered for another container than {cid[:12]}", False
    labels = (info.get("Config") or {}).get("Labels") or {}
    want = {LABEL_CLUSTER: record["cluster"], LABEL_TOKEN: record["token"]}
    got = {k: labels.get(k) for k in want}
    if got != want:
        return FOREIGN, (f"container {cid[:12]} ({str(info.get('Name', ''))[:64]}) carries labels {got}, not this "
                        f"cluster's {want}: slimeforge did not start it"), False
    return OURS, f"container {cid[:12]} (full id and labels match)", bool((info.get("State") or {}).get("Running"))


def verdict(record):
    """(verdict, reason, running) for any record."""
    if "container" in record:
        return container_verdict(record)
    state, why = process_verdict(record)
    return state, why, state == OURS


def record_state(state_dir):
    """(record or None, verdict, reason, running): a record that is not ours to read is FOREIGN."""
    try:
        record = read_record(state_dir)
        if record is None:
            return None, ENDED, "nothing recorded", False
        state, why, running = verdict(record)
    except BadRecord as exc:
        return None, FOREIGN, str(exc), False
    return record, state, why, running
