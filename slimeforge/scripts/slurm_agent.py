"""The Slurm allocation's own steps, run from the run directory (where slimeforge copies this file
and node_agent.py) by templates/slurm.sbatch.j2, after every node passed node_agent's slurm-check:

  slurm-mark   write (or remove) the one-filesystem marker in checkpoint_dir, on the batch host,
               before (after) the nodes look for it
  slurm-table  gather every node's slurm-check answer: a per-node table, the node IPs for the gate
  slurm-ray    exec `ray start --block` with this node's IP and interface filled in
  slurm-gate   the head's GCS port open; then the health gate of cluster.up: every node ALIVE in Ray
               with its GPUs, by a deadline

Standard library only (the nodes' python3), one JSON object on stdout, exit 1 when not ok.
"""

from __future__ import annotations

import importlib
import ipaddress
import json
import os
import re
import socket
import stat
import sys
import time

try:
    from . import node_agent, raynodes  # imported as slimeforge.scripts.slurm_agent
except ImportError:  # in a run directory: one program (slimeforge.scripts.program) that registered them first
    node_agent = importlib.import_module("node_agent")
    raynodes = importlib.import_module("raynodes")

_head_ip, _stat = node_agent._head_ip, node_agent._stat
cmd_nodes, cmd_runcheck = node_agent.cmd_nodes, node_agent.cmd_runcheck
gate, hostport, route_to, tcp_reach = raynodes.gate, node_agent.hostport, node_agent.route_to, node_agent.tcp_reach


def text_table(headers, rows):
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    return "\n".join("  ".join(str(r[i]).ljust(widths[i]) for i in range(len(widths))).rstrip() for r in [headers,
                                                                                                          *rows])


def cmd_slurm_mark(p):
    """On the batch host, around the checks: write (then, with "remove", delete) runcheck's
    one-filesystem marker in checkpoint_dir, which every node's slurm-check reads."""
    ck = p["checkpoint"]
    answer = cmd_runcheck({"checkpoint": {"dir": ck["dir"], "token": ck["token"],
                                          "remove" if p.get("remove") else "write": True}})
    for x in answer["problems"]:
        sys.stderr.write(f"{x['what']} {x['path']}: {x['why']} (on the batch host)\n")
    return {"ok": not answer["problems"]}


# --- the per-node table: every node's answer is input ------------------------------------------
# One answer per line of checks.jsonl, written by each node's slurm-check (srun --input=all): a
# node, its IP and interface, the GPUs it saw and its problems. Whatever a node sent is checked by
# type, bound and grammar, and the allocation's nodes must each have answered exactly once: a
# missing, unreadable, doubled or foreign answer fails the table (Ray starts on no node).
CHECKS_MAX_BYTES = 16 << 20
ANSWER_MAX_CHARS = 64 << 10
PROBLEM_MAX_CHARS = 2000
PROBLEMS_MAX = 100
NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # a Slurm node name (what scontrol show hostnames prints)
DEV_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,14}")  # a Linux interface name (IFNAMSIZ - 1)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text, limit=300):
    """A node's text, shown: control and bidirectional characters as '?', cut at `limit`."""
    text = str(text)
    return _CONTROL.sub("?", text[:limit]) + ("..." if len(text) > limit else "")


def _ip(value):
    """A node's Ray address as its answer gives it: an IPv4 or IPv6 address, else None."""
    if not isinstance(value, str) or len(value) > 45:
        return None
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return None


def _no_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def _once(pairs):
    """A JSON object whose keys each appear once: a key twice is two answers in one."""
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a key appears twice")
    return dict(pairs)


def read_answer(line):
    """(node, answer, why): one line of checks.jsonl read; `why` says what is wrong with it (node
    may still be named when only the rest is wrong)."""
    if len(line) > ANSWER_MAX_CHARS:
        return None, None, f"an answer of {len(line)} characters (at most {ANSWER_MAX_CHARS})"
    try:
        doc = json.loads(line, parse_constant=_no_constant, object_pairs_hook=_once)
    except (ValueError, RecursionError):
        return None, None, f"not a JSON answer: {printable(line, 120)!r}"
    if not isinstance(doc, dict):
        return None, None, f"not a JSON object: {printable(line, 120)!r}"
    node = doc.get("node")
    if not (isinstance(node, str) and NODE_RE.fullmatch(node)):
        return None, None, (f"an answer without a node name (node: {printable(repr(node), 80)}): "
                           f"{printable(line, 120)!r}")
    problems = doc.get("problems")
    if not (isinstance(problems, list) and len(problems) <= PROBLEMS_MAX and all(isinstance(x, str) for x in problems)):
        return node, None, (f"its answer's problems are not a list of at most {PROBLEMS_MAX} texts: "
                           f"{printable(repr(problems), 120)}")
    answer: dict = {"problems": [printable(x, PROBLEM_MAX_CHARS) for x in problems]}
    if problems:
        return node, answer, None  # its own problems fail it; the rest need not be there
    ip, dev, seen = _ip(doc.get("ip")), doc.get("dev"), doc.get("gpus_seen")
    if ip is None:
        return node, None, f"no IP address in its answer (ip: {printable(repr(doc.get('ip')), 80)})"
    if not (isinstance(dev, str) and DEV_RE.fullmatch(dev)):
        return node, None, f"no network interface name in its answer (dev: {printable(repr(dev), 80)})"
    if not (isinstance(seen, int) and not isinstance(seen, bool) and 0 <= seen <= 1024):
        return node, None, f"no GPU count in its answer (gpus_seen: {printable(repr(seen), 80)})"
    answer.update(ip=ip, dev=dev, gpus_seen=seen)
    return node, answer, None


def read_checks(path, nodes, gpus=0):
    """Every node's answer in `path` against the allocation's `nodes`: {node: answer}, each answer
    with "problems" (empty when the node passed), and the lines that named no node of the allocation."""
    problems: dict = {n: [] for n in nodes}
    answers: dict = {}
    stray: list = []
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        return {n: {"problems": [f"no answers file {path}: {exc.strerror}"]} for n in nodes}, stray
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {n: {"problems": [f"{path} is not a regular file"]} for n in nodes}, stray
        chunks, size = [], 0
        while size <= CHECKS_MAX_BYTES and (chunk := os.read(fd, 1 << 20)):
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > CHECKS_MAX_BYTES:
        return {n: {"problems": [f"{path} is over {CHECKS_MAX_BYTES} bytes: not the nodes' "
                                 "answers"]} for n in nodes}, stray
    count: dict = {}
    for raw in data.decode("utf-8", errors="replace").splitlines():
        if not raw.strip():
            continue
        node, answer, why = read_answer(raw.strip())
        if node is None or node not in problems:
            stray.append(why or f"an answer from {node}, which is not a node of this allocation")
            continue
        count[node] = count.get(node, 0) + 1
        if count[node] == 1:
            answers[node] = answer or {"problems": []}
            if why:
                problems[node].append(why)
        elif count[node] == 2:
            problems[node].append("answered more than once (which answer is this node's?)")
    by_ip: dict = {}
    for node in nodes:
        a = answers.get(node)
        if a is None and not problems[node]:
            problems[node].append("no answer from this node (srun could not run the check there)")
        elif a is not None and not a["problems"] and not problems[node]:
            if gpus and a["gpus_seen"] < gpus:
                problems[node].append(f"saw {a['gpus_seen']} GPU(s), needs {gpus}")
            by_ip.setdefault(a["ip"], []).append(node)
    for ip, same in by_ip.items():
        if len(same) > 1:  # the health gate counts nodes by IP: two under one would pass as one
            for node in same:
                problems[node].append(f"the same IP {ip} as {', '.join(n for n in same if n != node)}")
    out = {}
    for node in nodes:
        a = dict(answers.get(node) or {"problems": []})
        a["problems"] = list(a["problems"]) + problems[node]
        out[node] = a
    return out, stray


def allocation_nodes():
    """SF_NODES (scontrol show hostnames, head first): node names, each once; ValueError otherwise."""
    nodes = os.environ.get("SF_NODES", "").split()
    if not nodes or len(nodes) > 65536:
        raise ValueError(f"SF_NODES names {len(nodes)} node(s)")
    bad = [n for n in nodes if not NODE_RE.fullmatch(n)]
    if bad:
        raise ValueError(f"SF_NODES holds {printable(bad[0], 80)!r}, not a node name")
    if len(set(nodes)) != len(nodes):
        raise ValueError("SF_NODES names a node twice")
    return nodes


def cmd_slurm_table(p):
    """Every node's slurm-check answer (JSON lines in $SF_STEP_DIR/checks.jsonl) against the
    allocation's nodes: print the per-node table, keep {node: ip} and the head's IP. Fails
    unless every node answered exactly once, well-formed, without problems."""
    step_dir = os.environ["SF_STEP_DIR"]
    try:
        nodes = allocation_nodes()
    except ValueError as exc:
        sys.stderr.write(f"cannot read the allocation's nodes: {exc}\n")
        return {"ok": False, "failed": []}
    gpus = p.get("gpus") if isinstance(p.get("gpus"), int) else 0
    answers, stray = read_checks(os.path.join(step_dir, "checks.jsonl"), nodes, gpus)
    rows, failed = [], []
    for node in nodes:
        a = answers[node]
        if a["problems"]:
            failed.append(node)
        rows.append([node, "FAILED" if a["problems"] else "ok", a.get("ip") or "-", a.get("dev") or "-",
                     "; ".join(a["problems"]) or f"{a.get('gpus_seen')} GPU(s) seen"])
    sys.stderr.write(text_table(["node", "checks", "ip", "interface", "detail"], rows) + "\n")
    for why in stray[:20]:
        sys.stderr.write(f"an answer that is no node's: {why}\n")
    ok = not failed and not stray
    # Only a table that passed gives the gate its addresses: a failed one leaves none to start Ray on.
    ips = {n: answers[n]["ip"] for n in nodes} if ok else {}
    with open(os.path.join(step_dir, "nodes.json"), "w") as f:
        json.dump(ips, f)
    with open(os.path.join(step_dir, "head_ip"), "w") as f:
        f.write((ips.get(nodes[0]) or "") + "\n")
    return {"ok": ok, "failed": failed}


def cmd_slurm_ray(p):
    """Exec `ray start --block` (p["argv"]; @HEAD_IP@, @NODE_IP@, @NODE@ and @JOB@ filled in) with
    GLOO and NCCL pinned to the interface that routes to the head, as cluster.up does."""
    head_ip = _head_ip()
    route = route_to(head_ip)
    # Job ids repeat across clusters (and test labs) that may share a /tmp: the cluster's name too.
    cluster = os.environ.get("SLURM_CLUSTER_NAME", "")[:16]
    job = f"{cluster}-{os.environ.get('SLURM_JOB_ID', '0')}-{os.environ.get('SLURM_RESTART_COUNT') or '0'}"
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    env = dict(os.environ, GLOO_SOCKET_IFNAME=route["dev"], NCCL_SOCKET_IFNAME=route["dev"])
    fill = {"@HEAD_IP@": head_ip, "@NODE_IP@": route["src"], "@NODE@": node, "@JOB@": job}
    argv = [re.sub("|".join(fill), lambda m: fill[m.group(0)], a) for a in p["argv"]]
    sys.stdout.flush()
    os.execvpe(argv[0], argv, env)


def cmd_slurm_gate(p):
    """With p["gcs_port"]: wait until the head's GCS port answers (the workers may join from then
    on, while the head finishes starting, as in cluster.up). Else: poll the head's dashboard until
    every node is ALIVE with p["gpus"] GPUs; print a per-node table when the deadline passes first."""
    step_dir, nodes = os.environ["SF_STEP_DIR"], os.environ["SF_NODES"].split()
    with open(os.path.join(step_dir, "nodes.json")) as f:
        ips = json.load(f)
    deadline = time.time() + p["timeout"]
    if p.get("gcs_port"):
        # The head's srun (a child of the batch script): when it has ended, nothing will answer.
        watch = int(os.environ.get("SF_WATCH_PID") or 0)
        while True:
            why = tcp_reach(ips[nodes[0]], p["gcs_port"], 1.0)
            if why is None:
                return {"ok": True}
            st = _stat(watch) if watch else ("R",)
            if st is None or st[0] == "Z":
                sys.stderr.write(f"the Ray head on {nodes[0]} exited before its GCS port {p['gcs_port']} answered\n")
                return {"ok": False, "failed": [nodes[0]]}
            if time.time() > deadline:
                sys.stderr.write(f"the Ray head's GCS port {hostport(ips[nodes[0]], p['gcs_port'])} did not answer "
                                 f"within {p['timeout']}s: {why}\n")
                return {"ok": False, "failed": [nodes[0]]}
            time.sleep(0.2)
    url = f"http://{hostport(ips[nodes[0]], p['dashboard_port'])}/api/v0/nodes?limit=10000&detail=false"
    want = {ip: p["gpus"] for ip in ips.values()}
    while True:
        answer = cmd_nodes({"url": url, "timeout": 10})
        verdict = gate(answer.get("nodes", []), want)
        if all(ok for ok, _ in verdict.values()):
            return {"ok": True}
        if time.time() > deadline:
            break
        time.sleep(1)  # the poll interval of the gate, not a wait for a guess
    error = answer.get("error", "")
    rows = [[n, "ok" if verdict[ip][0] else "FAILED",
             verdict[ip][1] + ("" if verdict[ip][0] or not error else f" ({error})")] for n, ip in ips.items()]
    sys.stderr.write(f"not every node joined Ray within {p['timeout']}s:\n" + text_table(["node", "ray", "detail"],
                                                                                         rows) + "\n")
    return {"ok": False, "failed": [n for n, ip in ips.items() if not verdict[ip][0]]}


COMMANDS = {"slurm-mark": cmd_slurm_mark, "slurm-table": cmd_slurm_table, "slurm-ray": cmd_slurm_ray,
            "slurm-gate": cmd_slurm_gate}


def main(argv):
    if len(argv) != 3 or argv[1] not in COMMANDS:
        sys.stderr.write("usage: slurm_agent.py {" + ",".join(COMMANDS) + "} JSON\n")
        return 2
    try:
        result = COMMANDS[argv[1]](json.loads(argv[2]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        # One line for the job's output, never a traceback: the batch script stops on the exit status.
        sys.stderr.write(f"slurm_agent {argv[1]}: {type(exc).__name__}: {printable(exc)}\n")
        sys.stdout.write(json.dumps({"ok": False, "error": printable(exc)}) + "\n")
        return 1
    sys.stdout.write(json.dumps(result) + "\n")
    return 0 if result.get("ok", True) else 1  # each gates the batch script


if __name__ == "__main__":
    sys.exit(main(sys.argv))
