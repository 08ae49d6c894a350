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
import json
import os
import re
import socket
import sys
import time

try:
    from . import node_agent  # imported as slimeforge.scripts.slurm_agent
except ImportError:  # in a run directory: one program (slimeforge.scripts.program) that registered node_agent first
    node_agent = importlib.import_module("node_agent")

_head_ip, _stat, cmd_nodes, cmd_runcheck = node_agent._head_ip, node_agent._stat, node_agent.cmd_nodes, node_agent.cmd_runcheck
gate, hostport, route_to, tcp_reach = node_agent.gate, node_agent.hostport, node_agent.route_to, node_agent.tcp_reach


def text_table(headers, rows):
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    return "\n".join("  ".join(str(r[i]).ljust(widths[i]) for i in range(len(widths))).rstrip() for r in [headers, *rows])


def cmd_slurm_mark(p):
    """On the batch host, around the checks: write (then, with "remove", delete) runcheck's
    one-filesystem marker in checkpoint_dir, which every node's slurm-check reads."""
    ck = p["checkpoint"]
    answer = cmd_runcheck({"checkpoint": {"dir": ck["dir"], "token": ck["token"], "remove" if p.get("remove") else "write": True}})
    for x in answer["problems"]:
        sys.stderr.write(f"{x['what']} {x['path']}: {x['why']} (on the batch host)\n")
    return {"ok": not answer["problems"]}


def cmd_slurm_table(p):
    """Every node's slurm-check answer (JSON lines in $SF_STEP_DIR/checks.jsonl) against the
    allocation's nodes: print the per-node table, keep {node: {ip, dev}} and the head's IP."""
    step_dir, nodes = os.environ["SF_STEP_DIR"], os.environ["SF_NODES"].split()
    answers = {}
    with open(os.path.join(step_dir, "checks.jsonl")) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                answer = json.loads(line)
                answers[answer["node"]] = answer
    rows, failed = [], []
    for node in nodes:
        a = answers.get(node, {"problems": ["no answer from this node (srun could not run the check there)"]})
        if a["problems"]:
            failed.append(node)
        rows.append([node, "FAILED" if a["problems"] else "ok", a.get("ip") or "-", a.get("dev") or "-", "; ".join(a["problems"]) or f"{a.get('gpus_seen')} GPU(s) seen"])
    sys.stderr.write(text_table(["node", "checks", "ip", "interface", "detail"], rows) + "\n")
    ips = {n: answers[n].get("ip") for n in nodes if n in answers}
    with open(os.path.join(step_dir, "nodes.json"), "w") as f:
        json.dump(ips, f)
    with open(os.path.join(step_dir, "head_ip"), "w") as f:
        f.write((ips.get(nodes[0]) or "") + "\n")
    return {"ok": not failed, "failed": failed}


def cmd_slurm_ray(p):
    """Exec `ray start --block` (p["argv"]; @HEAD_IP@, @NODE_IP@, @NODE@ and @JOB@ filled in) with
    GLOO and NCCL pinned to the interface that routes to the head, as cluster.up does."""
    head_ip = _head_ip()
    route = route_to(head_ip)
    # Job ids repeat across clusters (and test labs) that may share a /tmp: the cluster's name too.
    job = f"{os.environ.get('SLURM_CLUSTER_NAME', '')[:16]}-{os.environ.get('SLURM_JOB_ID', '0')}-{os.environ.get('SLURM_RESTART_COUNT') or '0'}"
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
                sys.stderr.write(f"the Ray head's GCS port {hostport(ips[nodes[0]], p['gcs_port'])} did not answer within {p['timeout']}s: {why}\n")
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
    rows = [[n, "ok" if verdict[ip][0] else "FAILED", verdict[ip][1] + ("" if verdict[ip][0] or not error else f" ({error})")] for n, ip in ips.items()]
    sys.stderr.write(f"not every node joined Ray within {p['timeout']}s:\n" + text_table(["node", "ray", "detail"], rows) + "\n")
    return {"ok": False, "failed": [n for n, ip in ips.items() if not verdict[ip][0]]}


COMMANDS = {"slurm-mark": cmd_slurm_mark, "slurm-table": cmd_slurm_table, "slurm-ray": cmd_slurm_ray, "slurm-gate": cmd_slurm_gate}


def main(argv):
    if len(argv) != 3 or argv[1] not in COMMANDS:
        sys.stderr.write("usage: slurm_agent.py {" + ",".join(COMMANDS) + "} JSON\n")
        return 2
    result = COMMANDS[argv[1]](json.loads(argv[2]))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0 if result.get("ok", True) else 1  # each gates the batch script


if __name__ == "__main__":
    sys.exit(main(sys.argv))
