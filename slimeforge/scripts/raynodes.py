"""The Ray dashboard's node list, read on the head by the node agent's `nodes` command, and the
health gate that holds it against what was started: which node IPs are ALIVE with exactly the
GPUs they must register with (cluster.up, a Slurm allocation, a run's submission).

Standard library only, Python >= 3.8: it runs on the hosts, inside the node agent's program
(slimeforge.scripts.program); cluster/agent.py reads the agent's answers with node_problem.
"""

from __future__ import annotations

import importlib
import re
import urllib.request

try:
    from . import procproof  # imported as slimeforge.scripts.raynodes
except ImportError:  # on a host: one program (slimeforge.scripts.program) that registered it first
    procproof = importlib.import_module("procproof")

loads_strict = procproof.loads_strict

NODES_MAX_BYTES = 32 << 20  # the dashboard's node list: ~1 KiB a node; more is not a node list
NODE_IP_RE = re.compile(r"[0-9A-Fa-f.:]{2,45}")
NODE_STATE_RE = re.compile(r"[A-Z_]{1,32}")
NODE_ID_RE = re.compile(r"[0-9A-Za-z_-]{1,128}")
MAX_NODE_GPUS = 4096
ODD_SHOWN = 10


def node_gpus(node):
    """The GPUs a node registered (resources_total.GPU), or None when that is not a count."""
    res = node.get("resources_total")
    if res is None:
        return 0
    if not isinstance(res, dict):
        return None
    g = res.get("GPU", 0)
    if isinstance(g, bool) or not isinstance(g, (int, float)) or g != g or not 0 <= g <= MAX_NODE_GPUS:
        return None
    return int(g)


def node_problem(n):
    """Why one entry of the dashboard's node list is not a node we can read, or None."""
    if not isinstance(n, dict):
        return "is not an object"
    ip, state = n.get("node_ip"), n.get("state")
    if not (isinstance(ip, str) and NODE_IP_RE.fullmatch(ip)):
        return "node_ip is not an IP address: " + ascii(ip)[:80]
    if not (isinstance(state, str) and NODE_STATE_RE.fullmatch(state)):
        return "state is not a node state: " + ascii(state)[:80]
    if node_gpus(n) is None:
        return "resources_total.GPU is not a GPU count: " + ascii(n.get("resources_total"))[:80]
    nid = n.get("node_id")
    if nid is not None and not (isinstance(nid, str) and NODE_ID_RE.fullmatch(nid)):
        return "node_id is not a node id: " + ascii(nid)[:80]
    return None


def dashboard_nodes(body):
    """(nodes, odd, error) from the state API's answer: each readable node as {node_id, node_ip,
    is_head_node, state, resources_total: {GPU}}; odd: why the other entries were left out."""
    try:
        entries = body["data"]["result"]["result"]
    except (TypeError, KeyError, IndexError):
        return [], [], "not a node list (no data.result.result): " + ascii(body)[:200]
    if not isinstance(entries, list):
        return [], [], "data.result.result is not a list: " + ascii(entries)[:200]
    nodes, odd = [], []
    for i, n in enumerate(entries):
        why = node_problem(n)
        if why:
            odd.append(f"entry {i} {why}")
            continue
        nodes.append({"node_id": n.get("node_id"), "node_ip": n["node_ip"],
                      "is_head_node": n.get("is_head_node") is True,
                      "state": n["state"], "resources_total": {"GPU": node_gpus(n)}})
    return nodes, odd[:ODD_SHOWN] + ([f"... {len(odd) - ODD_SHOWN} more"] if len(odd) > ODD_SHOWN else []), None


def cmd_nodes(p):
    url = p["url"]
    try:
        # No proxy: this is the head asking its own dashboard, and http_proxy may be set for the internet.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url, timeout=p.get("timeout", 10)) as r:
            raw = r.read(NODES_MAX_BYTES + 1)
    except (OSError, ValueError) as exc:  # not up yet, or not answering: the caller polls again
        return {"error": f"{url}: {exc}"}
    if len(raw) > NODES_MAX_BYTES:
        return {"error": f"{url}: answered more than {NODES_MAX_BYTES} bytes: not a node list"}
    try:
        body = loads_strict(raw.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError included
        return {"error": f"{url}: not JSON ({exc}): " + ascii(raw[:200])}
    nodes, odd, why = dashboard_nodes(body)
    if why:
        return {"error": f"{url}: {why}"}
    return {"nodes": nodes, "odd": odd}


def gate(nodes, want):
    """The health gate's test, for cluster.up, for a Slurm allocation, and before a run is submitted.

    nodes: the dashboard's node list (cmd_nodes); want: {node IP: GPUs it must register with}.
    Returns {ip: (ok, detail)}: ok when an ALIVE node has that IP and exactly those GPUs. Entries
    that are not nodes (cmd_nodes leaves them out; a caller may pass the raw list) count for nothing."""
    readable = [n for n in nodes if node_problem(n) is None] if isinstance(nodes, list) else []
    alive = {n["node_ip"]: n for n in readable if n["state"] == "ALIVE"}
    other = {n["node_ip"]: n["state"] for n in readable if n["state"] != "ALIVE"}
    out = {}
    for ip, gpus in want.items():
        node = alive.get(ip)
        if node is None:
            out[ip] = (False, f"no ALIVE node with IP {ip}" + (f" (Ray lists it {other[ip]})" if ip in other else ""))
            continue
        got = node_gpus(node)
        out[ip] = (True, f"{ip} ALIVE, {got} GPU(s)") if got == gpus else (False,
                                                                           f"registered from {ip} with {got} GPU(s), "
                                                                           f"expected {gpus}")
    return out
