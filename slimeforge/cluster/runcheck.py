"""A recipe held against the cluster an inventory describes, before any GPU is spent
(`invoke run RECIPE --cluster INVENTORY`).

    static(recipe, inv) -> [Problem]     from the inventory alone (dry runs too): the recipe's mode,
                                         image and prefix are the cluster's; num_nodes x num_gpus
                                         fits its hosts; in container mode every recipe path lies
                                         under a container volume (read-write for checkpoint_dir)
    live(recipe, inv) -> RunCheck        over ssh and the node agent (`runcheck`), all hosts in
                                         parallel: model_dir with its config.json on every host (any
                                         host may hold a rank: colocated training and rollout load it
                                         everywhere), the data on the head, checkpoint_dir writable
                                         and ONE filesystem (a marker with a random token written on
                                         the head, read on every host), free space for a checkpoint
    gate(recipe, inv) -> str             Ray's own view, asked of the head's node agent: its ALIVE
                                         nodes (IPs mapped to the inventory's hosts) and their GPUs
                                         cover num_nodes x num_gpus, else GateRefused naming the
                                         dead or missing hosts and the repair (cluster.up)
    read_answer(host, answer, ...)       a host's runcheck answer, validated (types, bounds, which
                                         paths it may name); its words are quoted, never our fix
    cluster_env(inventory) -> Cluster    what the run layer submits to (address, environment, and
                                         the checks above as InventoryChecks, the run layer's
                                         ClusterChecks: the run layer never imports this one)

The size of a checkpoint: Megatron's distributed checkpoint keeps, per parameter, the bf16 weight
(2 bytes), the fp32 master copy and Adam's two moments (12 bytes): 7 times the bf16 weights.
The weights are the model_dir's *.safetensors / *.bin / *.pt files (their sizes, on the head);
without any, config.json's shape (layers x (4 hidden^2 + 3 hidden x intermediate) + vocab x hidden,
twice unless the embeddings are tied; bf16).
"""

from __future__ import annotations

import re
import secrets
import sys
import threading
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TextIO, cast

from ..errors import Problem, SlimeforgeError
from ..proc import Runner
from ..run.recipe import Recipe
from ..run.targets.base import Say
from ..run.targets.jobsubmit import Cluster
from ..schema import printable
from ..scripts import pathcheck, raynodes
from ..scripts.pathcheck import checkpoint_bytes  # the one estimate: the Slurm nodes make it too
from .agent import OddAnswer, RayNode, agent, first_line, read_nodes
from .bringup import Node, make_nodes, parallel
from .hosttable import HostCellProblems, HostTable
from .inventory import Inventory, load_inventory
from .tunnel import jobs_api

SHARED_FIX = "put it on a filesystem every host mounts at this path (NFS, Lustre, ...), or copy it to each host"


@dataclass(frozen=True)
class Volume:
    source: str  # on the host
    target: str  # in the container
    writable: bool


def volumes(inv: Inventory) -> list[Volume]:
    """The inventory's container volumes (`SRC:DST[:OPTS]`; a named volume or SRC alone is not a path we can check)."""
    out = []
    for spec in inv.container.volumes:
        parts = spec.split(":")
        if len(parts) < 2 or not parts[0].startswith("/") or not parts[1].startswith("/"):
            continue
        opts = parts[2].split(",") if len(parts) > 2 else []
        out.append(Volume(parts[0].rstrip("/") or "/", parts[1].rstrip("/") or "/", "ro" not in opts))
    return out


def host_path(path: str, vols: Sequence[Volume]) -> tuple[str, Volume] | None:
    """Where a container path lives on the host, through the deepest volume holding it."""
    best: tuple[str, Volume] | None = None
    for v in vols:
        p, t = PurePosixPath(path), PurePosixPath(v.target)
        if (p == t or t in p.parents) and (best is None or len(v.target) > len(best[1].target)):
            best = (str(PurePosixPath(v.source) / p.relative_to(t)), v)
    return best


def recipe_paths(recipe: Recipe) -> list[tuple[str, str, str, str]]:
    """(field, path, kind, where) of every path the job reads or writes: where is "all" or "head"."""
    items = [("model_dir", recipe.model_dir, "model", "all"), ("data_path", recipe.data_path, "file", "head")]
    items += [(f"eval_data.{name}", p, "file", "head") for name, p in recipe.eval_data.items()]
    if recipe.mode == "host":  # in container mode slime is in the image
        items.append(("slime_dir", recipe.slime_dir, "dir", "head"))
    items.append(("checkpoint_dir", recipe.resolved_checkpoint_dir, "checkpoint", "all"))
    return items


def static(recipe: Recipe, inv: Inventory) -> list[Problem]:
    """The recipe against the inventory alone: every problem at once."""
    where = f"cluster {inv.name} ({inv.path})"
    p: list[Problem] = []
    if recipe.mode != inv.mode:
        p.append(Problem("mode", f"differs from {where}'s mode {inv.mode!r}", recipe.mode,
                         f"{inv.mode} (leave it out, or --mode {inv.mode})"))
    if inv.mode == "container" and recipe.image and recipe.image != inv.image:
        p.append(Problem("image", f"is not the image {where} runs ({inv.image}); a cluster runs one image",
                         recipe.image,
                         f"{inv.image} (or leave image out: the cluster's is used)"))
    prefix = inv.head.prefix
    if inv.mode == "host" and recipe.install_prefix and prefix and recipe.install_prefix != prefix:
        p.append(Problem("install_prefix", f"is not the prefix {where} runs Ray from ({prefix})", recipe.install_prefix,
                         f"{prefix} (or leave it out: the cluster's is used)"))
    fit = [h for h in inv.hosts if h.gpus >= recipe.num_gpus]
    if recipe.num_nodes > len(fit):
        have = ", ".join(f"{h.name}: {h.gpus}" for h in inv.hosts)
        p.append(Problem("num_nodes", f"x num_gpus ({recipe.num_nodes} x {recipe.num_gpus}) does not fit {where}: "
                         f"{len(fit)} host(s) have {recipe.num_gpus} GPU(s) or more ({have})", recipe.num_nodes,
                         f"at most {len(fit)} with num_gpus {recipe.num_gpus}, or add hosts to the inventory"))
    if inv.mode == "container":
        vols = volumes(inv)
        for name, path, kind, _ in recipe_paths(recipe):
            if kind == "dir":
                continue
            found = host_path(path, vols)
            if found is None:
                have = ", ".join(f"{v.target}" for v in vols) or "none"
                p.append(Problem(name,
                                 f"lies outside every container volume of {where} (volumes: {have}): the container "
                                 "cannot see it",
                                 path, "a path under one of those volumes, or add a volume in container.volumes"))
            elif kind == "checkpoint" and not found[1].writable:
                p.append(Problem(name, f"lies under the read-only volume {found[1].target} of {where}", path,
                                 "a writable volume (drop :ro)"))
    return p


def adopt(recipe: Recipe, inv: Inventory, mode_given: bool) -> Recipe:
    """The cluster's environment where the recipe names none: its mode (unless the recipe or
    --mode named one), its image (container mode) or prefix (host mode)."""
    update: dict[str, str | None] = {}
    if not mode_given:
        update["mode"] = inv.mode
    mode = update.get("mode", recipe.mode)
    if mode == "container" and inv.mode == "container" and not recipe.image:
        update["image"] = inv.image
    if mode == "host" and inv.mode == "host" and not recipe.install_prefix and inv.head.prefix:
        update["install_prefix"] = inv.head.prefix
    return recipe.model_copy(update=update)


@dataclass
class RunCheck:
    """What the live check found: per host, the problems; the table; the checkpoint size wanted."""

    table: HostTable
    failures: dict[str, str] = field(default_factory=dict)
    need_bytes: int | None = None
    how: str = ""  # how need_bytes was found


class RunCheckFailed(SlimeforgeError):
    def __init__(self, cluster: str, check: RunCheck):
        self.check = check
        hosts = ", ".join(check.failures)
        super().__init__(f"cluster {cluster}: the recipe does not hold on {len(check.failures)} host(s) ({hosts}); "
                         "nothing was submitted:\n\n"
                         + check.table.text())


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def live(recipe: Recipe, inv: Inventory, *, runner: Runner | None = None, control_dir: str | None = None, stream=None,
         live_table: bool | None = None) -> RunCheck:
    """Every host checked in parallel (see the module docstring); the RunCheck, failures included."""
    nodes = make_nodes(inv, runner, control_dir)
    vols = volumes(inv) if inv.mode == "container" else []
    token = secrets.token_hex(16)
    table = HostTable(f"run {recipe.exp_id} on cluster {inv.name}", [(h.name, h.role) for h in inv.hosts], ["paths",
                                                                                                            "checkpoint"],
                      stream=stream, live=live_table)
    check = RunCheck(table)
    answers: dict[str, RunAnswer] = {}
    answered: set[str] = set()  # hosts whose agent ran the first round (the head's wrote the marker)

    def on_host(path: str) -> str:
        found = host_path(path, vols) if vols else None
        return found[0] if found else path

    def fix(what: str, why: str) -> str:
        if what == "checkpoint_dir" and "filesystem" in why:
            return ("put checkpoint_dir on one filesystem that every host mounts at the same path (every rank writes "
                   "its shard there)")
        if what == "checkpoint_dir":
            return "make it writable by the ssh user on this host"
        if what == "data_path" or what.startswith("eval_data."):
            return "put it on the head at this path (slime reads the data there), or on a filesystem the head mounts"
        return SHARED_FIX

    def problems_of(host: str, answer: RunAnswer, back: dict[str, str]) -> list[str]:
        return [f"{what} {printable(back.get(path, path))}: {host_words(host, why)}; fix: {fix(what, why)}" for what,
                path, why in answer.problems]

    ck_dir = recipe.resolved_checkpoint_dir
    head_weights: dict[str, int] | None = None  # the head's weight files, once its first round answered
    head_done = threading.Event()

    def first(node: Node) -> str:
        nonlocal head_weights
        h = node.host
        try:
            items = [(n, path, kind) for n, path, kind,
                     where in recipe_paths(recipe) if kind != "checkpoint" and (where == "all" or h.is_head)]
            back = {on_host(path): path for _, path, _ in items} | {on_host(ck_dir): ck_dir}
            params = {"paths": [{"what": n, "path": on_host(path), "kind": kind} for n, path, kind in items],
                      "checkpoint": {"dir": on_host(ck_dir), "token": token, "write": h.is_head}}
            raw = agent(node.ssh, h, "runcheck", params, timeout=inv.ssh_options.connect_timeout + 60)
            answered.add(node.name)
            answer = answers[node.name] = read_answer(node.name, raw, {on_host(path) for _, path,
                                                                       _ in items} | {on_host(ck_dir)},
                                                      {n for n, _, _ in items} | {"checkpoint_dir"})
            bad = problems_of(node.name, answer, back)
            if h.is_head and not bad:
                head_weights = answer.weights
        finally:
            if h.is_head:
                head_done.set()
        if not h.is_head and not bad:
            # Every rank loads the model: a worker's copy is the head's, file for file and byte for byte.
            head_done.wait(inv.ssh_options.connect_timeout + 120)
            if head_weights is not None:
                differ = weights_differ(head_weights, answer.weights)
                if differ:
                    bad.append(f"model_dir {recipe.model_dir}: its weight files are not the head's ({differ}); "
                               f"fix: copy the head's {on_host(recipe.model_dir)} to this host (same files, same "
                               "sizes), or put it on a filesystem every host mounts")
        if bad:
            raise HostCellProblems(bad)
        return (f"{len(items)} path(s) found, {len(answer.weights)} weight "
               "file(s)") + (", marker written" if h.is_head else " as the head's")

    def second(node: Node) -> str:
        h = node.host
        params = {"checkpoint": {"dir": on_host(ck_dir), "token": token, "read": True}}
        raw = agent(node.ssh, h, "runcheck", params, timeout=inv.ssh_options.connect_timeout + 60)
        answer = read_answer(node.name, raw, {on_host(ck_dir)}, {"checkpoint_dir"})
        bad = problems_of(node.name, answer, {on_host(ck_dir): ck_dir})
        free = answer.free_bytes
        if not bad and free is None:
            raise OddAnswer(node.name, "runcheck", "has no free_bytes for a checkpoint_dir it found writable")
        if check.need_bytes is not None and free is not None and free < check.need_bytes:
            bad.append(f"checkpoint_dir {ck_dir}: {_gib(free)} free, a checkpoint needs {_gib(check.need_bytes)} "
                       f"({check.how}); "
                       "fix: free space there or point checkpoint_dir at a larger filesystem")
        if bad:
            raise HostCellProblems(bad)
        return f"one filesystem with the head's, {_gib(free) if free is not None else '?'} free"

    with table:
        try:
            # The head first: the workers wait for its weight list, and the pool runs at most 32 at once.
            failures = parallel(sorted(nodes, key=lambda n: not n.host.is_head), first, table, "paths")
            head = answers.get(inv.head.name)
            if head is not None:
                check.need_bytes, check.how = checkpoint_bytes(head.weights_bytes, head.config)
            # A host whose first round failed has said why; the others read the head's marker.
            # Without the head's marker there is nothing to compare against.
            if inv.head.name not in failures:
                failures.update(parallel([n for n in nodes if n.name not in failures], second, table, "checkpoint"))
        finally:
            if inv.head.name in answered:  # the head wrote the marker: the head removes it
                head_node = next(n for n in nodes if n.host.is_head)
                try:
                    agent(head_node.ssh, head_node.host, "runcheck", {"checkpoint": {"dir": on_host(ck_dir),
                                                                                     "token": token, "remove": True}},
                          timeout=inv.ssh_options.connect_timeout + 60)
                except SlimeforgeError:
                    pass  # a leftover marker is a dot file named by its token: harmless, and never read again
    if failures:
        table.skip_rest("checkpoint")
    check.failures = failures
    return check


# --- the node agent's runcheck answer, read as input ---------------------------------------------

SIZE_MAX = 1 << 60  # bytes: a size beyond an exbibyte is not a file's or a filesystem's
MAX_PROBLEMS = 1000
# What the agent says, word for word, and what it says before a detail (an OS error, a name): the
# rest of any text is the host's own words, shown quoted (printable) and never read as a fix.
AGENT_WHY = frozenset({
    "is not a path", "is not an absolute path", "no such file here", "is not a readable file", "no such directory here",
    "has no readable config.json here", "is not an absolute path with a 32-hex-digit token",
    "is not the head's filesystem: the marker the head wrote there is not here", "config.json is not a regular file",
    "config.json is not a JSON object", pathcheck.UNUSABLE_PATH,
    f"has more than {pathcheck.MAX_WEIGHT_FILES} weights files",
})
AGENT_WHY_PREFIX = ("config.json cannot be opened: ", "config.json cannot be read: ", "config.json is not JSON: ",
                    "config.json is ",
                    "has a weights file whose name is not plain text: ", "cannot be listed: ", "is not writable here: ",
                    )
WEIGHT_SEP = re.compile(r"has a weights file ([A-Za-z0-9][A-Za-z0-9._+-]{0,254}) that cannot be read: (.*)", re.S)


def host_words(host: str, why: str) -> str:
    """A problem as the agent states it; text it does not state is quoted as the host's."""
    if why in AGENT_WHY:
        return why
    m = WEIGHT_SEP.fullmatch(why)
    if m:
        return f"has a weights file {m.group(1)} that cannot be read: {printable(m.group(2)[:300])!r}"
    for prefix in AGENT_WHY_PREFIX:
        if why.startswith(prefix) and len(why) > len(prefix):
            return prefix + repr(printable(why[len(prefix):][:300]))
    return f"{host} says {printable(why[:300])!r}"


@dataclass(frozen=True)
class RunAnswer:
    """One host's runcheck answer, validated: problems as (what, path, why) over the paths asked."""

    problems: list[tuple[str, str, str]]
    weights: dict[str, int]
    weights_bytes: int
    config: dict[str, int | bool] | None
    free_bytes: int | None


def _size(host: str, name: str, value: object, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if type(value) is not int or not 0 <= value <= SIZE_MAX:  # bool, float (1e400 is inf), str, list: not a size
        raise OddAnswer(host, "runcheck", f"has a {name} that is not a byte count (0 to 2**60)", value)
    return value


def read_answer(host: str, answer: Mapping[str, object], paths: set[str], whats: set[str]) -> RunAnswer:
    """The runcheck answer of `host`, checked field by field (types, bounds, grammar): a problem may
    name only a path and field it was asked about. Anything else is an OddAnswer naming the host."""
    if "error" in answer:  # the agent itself failed there (main's catch-all): its words, quoted
        err = answer["error"]
        if isinstance(err, str):
            raise OddAnswer(host, "runcheck", f"is the agent's own failure there: {printable(err[:500])!r}")
        raise OddAnswer(host, "runcheck", "is an error that is not text", err)
    raw = answer.get("problems")
    if not isinstance(raw, list) or len(raw) > MAX_PROBLEMS:
        raise OddAnswer(host, "runcheck", f"has no list of problems (at most {MAX_PROBLEMS})", raw)
    problems = []
    for p in raw:
        if not (isinstance(p, dict) and isinstance(p.get("what"), str) and isinstance(p.get("path"),
                                                                                      str) and isinstance(p.get("why"),
                                                                                                          str)
                and len(p["why"]) <= 2000):
            raise OddAnswer(host, "runcheck", "has a problem that is not {what, path, why} as text", p)
        if p["what"] not in whats or p["path"] not in paths:
            raise OddAnswer(host, "runcheck", "names a field or path it was not asked about", {"what": p["what"],
                                                                                               "path": p["path"]})
        problems.append((p["what"], p["path"], p["why"]))
    weights = answer.get("weights")
    if not isinstance(weights, dict) or len(weights) > pathcheck.MAX_WEIGHT_FILES:
        raise OddAnswer(host, "runcheck", "has no weights {file: bytes}", weights)
    for name, size in weights.items():
        if not pathcheck.WEIGHT_NAME_RE.fullmatch(name):
            raise OddAnswer(host, "runcheck", "names a weights file that is not a plain file name", name)
        _size(host, f"size of {name}", size)
    total = _size(host, "weights_bytes", answer.get("weights_bytes"))
    assert total is not None
    if total != sum(weights.values()):
        raise OddAnswer(host, "runcheck",
                        f"has a weights_bytes that is not the sum of its weights ({sum(weights.values())})", total)
    config = answer.get("config")
    if config is not None:
        ok = isinstance(config, dict) and all(
            k in pathcheck.CONFIG_KEYS and (isinstance(v, bool) if k == "tie_word_embeddings" else type(v) is int
                                            and 0 < v < pathcheck.CONFIG_INT_MAX)
            for k, v in config.items())
        if not ok:
            raise OddAnswer(host, "runcheck", "has a config that is not config.json's shape (positive integers)",
                            config)
    config_read = cast(dict[str, int | bool] | None, config)  # each key and value checked above
    return RunAnswer(problems, dict(weights), total, config_read, _size(host, "free_bytes", answer.get("free_bytes"),
                                                                        optional=True))


def weights_differ(head: dict[str, int], here: dict[str, int]) -> str:
    """How a worker's weight files differ from the head's, in a few words ("" when they do not)."""
    missing = sorted(set(head) - set(here))
    extra = sorted(set(here) - set(head))
    sized = sorted(n for n in set(head) & set(here) if head[n] != here[n])

    def few(names: list[str]) -> str:
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    parts = []
    if missing:
        parts.append(f"missing here: {few(missing)}")
    if sized:
        parts.append("other sizes: " + few([f"{n} ({here[n]} B here, {head[n]} B on the head)" for n in sized]))
    if extra:
        parts.append(f"not on the head: {few(extra)}")
    return "; ".join(parts)


# --- the gate: Ray's ALIVE nodes cover the recipe --------------------------------------------------

NODES_PATH = "/api/v0/nodes?limit=10000&detail=false"


def _repair(inv: Inventory) -> str:
    return (f"`invoke cluster.up {inv.path}` starts Ray again on the hosts where it is not running (`invoke "
           f"cluster.status {inv.path}` shows each)")


class GateRefused(SlimeforgeError):
    """Ray's ALIVE nodes do not cover num_nodes x num_gpus: nothing was submitted (exit 2)."""


def gate(recipe: Recipe, inv: Inventory, *, runner: Runner | None = None, control_dir: str | None = None) -> str:
    """Ask the cluster's Ray, through the head's node agent (the dashboard need not be reachable from
    here), for its ALIVE nodes and their GPUs; refuse when they do not cover the recipe's
    num_nodes x num_gpus, naming the hosts that are dead or missing. Returns a line for the log.
    Callable again at any time (before a restart too): it only reads."""
    from .clusterrecord import address, read_state

    url = address(inv).dashboard.rstrip("/") + NODES_PATH
    state = read_state(inv) or {}
    recorded = state.get("hosts")
    recorded = recorded if isinstance(recorded, dict) else {}
    ip_of: dict[str, str | None] = {}
    for h in inv.hosts:
        rec = recorded.get(h.name)
        ip = rec.get("node_ip") if isinstance(rec, dict) else None
        ip = ip if isinstance(ip, str) and raynodes.NODE_IP_RE.fullmatch(ip) else h.node_ip
        if ip is None and h.is_head:
            ip = url.split("//", 1)[1].rsplit(":", 1)[0].strip("[]")  # the dashboard is the head's
        ip_of[h.name] = ip
    head = next(n for n in make_nodes(inv, runner, control_dir) if n.host.is_head)
    try:
        answer = agent(head.ssh, head.host, "nodes", {"url": url, "timeout": 10},
                       timeout=inv.ssh_options.connect_timeout + 30)
        nodes, error = read_nodes(answer, head.name)
    except OddAnswer:
        raise
    except SlimeforgeError as exc:
        raise GateRefused(f"cluster {inv.name}: cannot ask Ray which nodes are alive: the head {head.name} did not "
                          "answer "
                          f"({first_line(exc)}); nothing was submitted. fix: check the head with `invoke "
                          f"cluster.status {inv.path}`") from None
    if error is not None:
        raise GateRefused(f"cluster {inv.name}: Ray's dashboard on the head {head.name} does not answer ({head.name} "
                          f"says {error!r}); "
                          f"nothing was submitted. fix: {_repair(inv)}")
    odd = answer.get("odd")
    odd = [printable(x[:200]) for x in odd[:20] if isinstance(x, str)] if isinstance(odd, list) else []
    return judge(recipe, inv, ip_of, nodes, odd)


def judge(recipe: Recipe, inv: Inventory, ip_of: dict[str, str | None], nodes: list[RayNode],
          odd: Sequence[str] = ()) -> str:
    """The gate's verdict on Ray's node list (read_nodes'): a line when the ALIVE nodes cover the
    recipe, else GateRefused naming every inventory host that is not ALIVE with its GPUs."""
    need = f"num_nodes x num_gpus ({recipe.num_nodes} x {recipe.num_gpus})"
    verdict = raynodes.gate(nodes, {ip: h.gpus for h in inv.hosts if (ip := ip_of[h.name])})
    alive = [n for n in nodes if n["state"] == "ALIVE"]
    by_ip = {ip: name for name, ip in ip_of.items() if ip}
    fits = [n for n in alive if raynodes.node_gpus(n) >= recipe.num_gpus]
    down = {h.name: (verdict[ip][1] if (ip := ip_of[h.name]) else "its node IP is not known here (no bring-up record "
                                                                  "from this machine)")
            for h in inv.hosts if not (ip_of[h.name] and verdict[ip_of[h.name]][0])}
    gpus = sum(raynodes.node_gpus(n) or 0 for n in alive)
    if len(fits) < recipe.num_nodes or gpus < recipe.num_nodes * recipe.num_gpus:
        lines = [f"  {name} ({ip_of[name] or '?'}): {why}" for name, why in down.items()]
        if not lines:  # every host is up, with fewer GPUs than the recipe names
            lines = [f"  {by_ip.get(n['node_ip'], n['node_ip'] + ' (not in the inventory)')}: ALIVE with "
                     f"{raynodes.node_gpus(n)} GPU(s)" for n in alive]
        raise GateRefused(f"cluster {inv.name}: Ray's ALIVE nodes do not cover {need}: {len(fits)} node(s) with "
                          f"{recipe.num_gpus} GPU(s) "
                          f"or more, {gpus} GPU(s) in all; nothing was submitted (slime would wait for the missing "
                          "GPUs without end):\n"
                          + "\n".join(lines)
                          + ("".join(f"\n  (the dashboard's list, an entry left out: {x!r})" for x in odd))
                          + f"\nfix: {_repair(inv)}; or lower num_nodes")
    note = "" if not down else "; not ALIVE, not needed: " + ", ".join(f"{name} ({why})" for name, why in down.items())
    return (f"[slimeforge] cluster {inv.name}: Ray has {len(alive)} ALIVE node(s) with {gpus} GPU(s): covers "
           f"{need}{note}")


def cluster_env(inventory: str, *, dry_run: bool, ssh_config: str | None = None, runner: Runner | None = None,
                control_dir: str | None = None, stream=None, tunnel: str | None = None,
                tunnels: ExitStack | None = None) -> Cluster:
    """`invoke run --cluster INVENTORY`'s cluster: its Jobs API (from cluster.up's record; over an
    ssh tunnel that lives as long as `tunnels` when the dashboard does not answer directly, or
    `tunnel` (else ssh.tunnel) says always), its environment, and the recipe checks above
    (InventoryChecks)."""
    from .clusterrecord import address

    inv = load_inventory(inventory, ssh_config=ssh_config)  # --ssh-config: the user's own, as is
    try:
        dashboard = address(inv).dashboard
    except SlimeforgeError:
        if not dry_run:
            raise
        dashboard = f"<Jobs API of cluster {inv.name}: run cluster.up first>"  # a dry run shows the plan all the same
    via = None
    if dashboard.startswith("http"):
        dashboard, via = jobs_api(inv, dashboard, mode=tunnel or inv.ssh_options.tunnel, dry_run=dry_run,
                                  stack=tunnels, runner=runner,
                                  say=lambda line: print(line, file=stream or sys.stderr, flush=True))

    return Cluster(name=str(inventory), address=dashboard, via=via, mode=inv.mode, image=inv.image,
                   prefix=inv.head.prefix,
                   python=inv.head.python, checks=InventoryChecks(inv, runner, control_dir, stream))


@dataclass(frozen=True)
class InventoryChecks:
    """The run layer's `ClusterChecks` for a cluster an inventory describes: this module's checks,
    over ssh and the node agents with `runner` and `control_dir`; live tables go to `stream` (else stderr)."""

    inv: Inventory
    runner: Runner | None = None
    control_dir: str | None = None
    stream: TextIO | None = None

    def adopt(self, recipe: Recipe, mode_given: bool) -> Recipe:
        return adopt(recipe, self.inv, mode_given)

    def check(self, recipe: Recipe) -> list[Problem]:
        from .credentials import recipe_secret_problems

        return static(recipe, self.inv) + recipe_secret_problems(recipe, self.inv)

    def gate(self, recipe: Recipe, say: Say) -> None:
        say(gate(recipe, self.inv, runner=self.runner, control_dir=self.control_dir))

    def preflight(self, recipe: Recipe, say: Say) -> None:
        self.gate(recipe,
                  say)  # Ray's view first: one ssh round trip, and the likeliest refusal on a cluster left running
        check = live(recipe, self.inv, runner=self.runner, control_dir=self.control_dir, stream=self.stream,
                     live_table=False if self.stream is not None else None)
        if check.failures:
            raise RunCheckFailed(self.inv.name, check)
        say(f"[slimeforge] cluster {self.inv.name}: every host holds the recipe's paths; checkpoint_dir is one "
            "filesystem"
            + (f" with room for a checkpoint ({_gib(check.need_bytes)}: {check.how})" if check.need_bytes
               else " (checkpoint size unknown: " + check.how + ")"))

    def credentials(self, recipe: Recipe, say: Say, network: bool) -> None:
        from .credentials import preflight as check_credentials

        check_credentials(recipe, self.inv, say, network=network, runner=self.runner, control_dir=self.control_dir,
                          stream=self.stream)

    def heal(self,
             say: Say) -> None:  # --max-restarts: cluster.up converges (hosts running our Ray are left as they are)
        from .raycluster import up

        say(f"[slimeforge] cluster {self.inv.name}: bringing lost hosts back with cluster.up's repair")
        up(self.inv, runner=self.runner, control_dir=self.control_dir, stream=self.stream)
