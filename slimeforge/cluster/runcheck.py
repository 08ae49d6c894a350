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
    cluster_env(inventory) -> Cluster    what the run layer submits to (address, environment, the
                                         two checks above as callables: the run layer never imports
                                         this one)

The size of a checkpoint: Megatron's distributed checkpoint keeps, per parameter, the bf16 weight
(2 bytes), the fp32 master copy and Adam's two moments (12 bytes): 7 times the bf16 weights.
The weights are the model_dir's *.safetensors / *.bin / *.pt files (their sizes, on the head);
without any, config.json's shape (layers x (4 hidden^2 + 3 hidden x intermediate) + vocab x hidden,
twice unless the embeddings are tied; bf16).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from ..errors import Problem, SlimeforgeError
from ..proc import Runner
from ..run.recipe import Recipe
from ..run.targets.jobsubmit import Cluster
from ..scripts.node_agent import checkpoint_bytes  # the one estimate: the Slurm nodes make it too
from .agent import agent
from .bringup import Node, make_nodes, parallel
from .hosttable import HostTable
from .inventory import Inventory, load_inventory

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
        p.append(Problem("mode", f"differs from {where}'s mode {inv.mode!r}", recipe.mode, f"{inv.mode} (leave it out, or --mode {inv.mode})"))
    if inv.mode == "container" and recipe.image and recipe.image != inv.image:
        p.append(Problem("image", f"is not the image {where} runs ({inv.image}); a cluster runs one image", recipe.image,
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
                p.append(Problem(name, f"lies outside every container volume of {where} (volumes: {have}): the container cannot see it",
                                 path, "a path under one of those volumes, or add a volume in container.volumes"))
            elif kind == "checkpoint" and not found[1].writable:
                p.append(Problem(name, f"lies under the read-only volume {found[1].target} of {where}", path, "a writable volume (drop :ro)"))
    return p


def adopt(recipe: Recipe, inv: Inventory, mode_given: bool) -> Recipe:
    """The cluster's environment where the recipe names none: its mode (unless the recipe or
    --mode named one), its image (container mode) or prefix (host mode)."""
    update: dict[str, Any] = {}
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
        super().__init__(f"cluster {cluster}: the recipe does not hold on {len(check.failures)} host(s) ({hosts}); nothing was submitted:\n\n"
                         + check.table.text())




def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def live(recipe: Recipe, inv: Inventory, *, runner: Runner | None = None, control_dir: str | None = None, stream=None,
         live_table: bool | None = None) -> RunCheck:
    """Every host checked in parallel (see the module docstring); the RunCheck, failures included."""
    nodes = make_nodes(inv, runner, control_dir)
    vols = volumes(inv) if inv.mode == "container" else []
    token = secrets.token_hex(16)
    table = HostTable(f"run {recipe.exp_id} on cluster {inv.name}", [(h.name, h.role) for h in inv.hosts], ["paths", "checkpoint"],
                      stream=stream, live=live_table)
    check = RunCheck(table)
    answers: dict[str, dict[str, Any]] = {}

    def on_host(path: str) -> str:
        found = host_path(path, vols) if vols else None
        return found[0] if found else path

    def fix(what: str, why: str) -> str:
        if what == "checkpoint_dir" and "filesystem" in why:
            return "put checkpoint_dir on one filesystem that every host mounts at the same path (every rank writes its shard there)"
        if what == "checkpoint_dir":
            return "make it writable by the ssh user on this host"
        if what == "data_path" or what.startswith("eval_data."):
            return "put it on the head at this path (slime reads the data there), or on a filesystem the head mounts"
        return SHARED_FIX

    def problems_of(answer: dict[str, Any], back: dict[str, str]) -> list[str]:
        return [f"{p['what']} {back.get(p['path'], p['path'])}: {p['why']}; fix: {fix(p['what'], p['why'])}" for p in answer.get("problems", [])]

    ck_dir = recipe.resolved_checkpoint_dir

    def first(node: Node) -> str:
        h = node.host
        items = [(n, path, kind) for n, path, kind, where in recipe_paths(recipe) if kind != "checkpoint" and (where == "all" or h.is_head)]
        back = {on_host(path): path for _, path, _ in items} | {on_host(ck_dir): ck_dir}
        params = {"paths": [{"what": n, "path": on_host(path), "kind": kind} for n, path, kind in items],
                  "checkpoint": {"dir": on_host(ck_dir), "token": token, "write": h.is_head}}
        answer = answers[node.name] = agent(node.ssh, h, "runcheck", params, timeout=inv.ssh_options.connect_timeout + 60)
        bad = problems_of(answer, back)
        if bad:
            raise _Failed(bad)
        return f"{len(items)} path(s) found" + (", marker written" if h.is_head else "")

    def second(node: Node) -> str:
        h = node.host
        params = {"checkpoint": {"dir": on_host(ck_dir), "token": token, "read": True}}
        answer = agent(node.ssh, h, "runcheck", params, timeout=inv.ssh_options.connect_timeout + 60)
        bad = problems_of(answer, {on_host(ck_dir): ck_dir})
        free = answer.get("free_bytes")
        if check.need_bytes is not None and isinstance(free, int) and free < check.need_bytes:
            bad.append(f"checkpoint_dir {ck_dir}: {_gib(free)} free, a checkpoint needs {_gib(check.need_bytes)} ({check.how}); "
                       "fix: free space there or point checkpoint_dir at a larger filesystem")
        if bad:
            raise _Failed(bad)
        return f"one filesystem with the head's, {_gib(free) if isinstance(free, int) else '?'} free"

    with table:
        try:
            failures = parallel(nodes, first, table, "paths")
            head = answers.get(inv.head.name)
            if head is not None:
                check.need_bytes, check.how = checkpoint_bytes(int(head.get("weights_bytes") or 0), head.get("config"))
            # A host whose first round failed has said why; the others read the head's marker.
            # Without the head's marker there is nothing to compare against.
            if inv.head.name not in failures:
                failures.update(parallel([n for n in nodes if n.name not in failures], second, table, "checkpoint"))
        finally:
            if inv.head.name in answers:  # the head wrote the marker: the head removes it
                head_node = next(n for n in nodes if n.host.is_head)
                try:
                    agent(head_node.ssh, head_node.host, "runcheck", {"checkpoint": {"dir": on_host(ck_dir), "token": token, "remove": True}},
                          timeout=inv.ssh_options.connect_timeout + 60)
                except SlimeforgeError:
                    pass  # a leftover marker is a dot file named by its token: harmless, and never read again
    if failures:
        table.skip_rest("checkpoint")
    check.failures = failures
    return check


class _Failed(SlimeforgeError):
    """One host's problems, one per line in the table's detail (bringup.parallel prints str())."""

    def __init__(self, problems: list[str]):
        super().__init__(" | ".join(problems))


def cluster_env(inventory: str, *, dry_run: bool, ssh_config: str | None = None, runner: Runner | None = None,
                control_dir: str | None = None, stream=None) -> Cluster:
    """`invoke run --cluster INVENTORY`'s cluster: its Jobs API (from cluster.up's record), its
    environment, and the recipe checks above as the run layer's callables."""
    from .record import address

    inv = load_inventory(inventory, ssh_config=ssh_config)  # --ssh-config: the user's own, as is
    try:
        dashboard = address(inv).dashboard
    except SlimeforgeError:
        if not dry_run:
            raise
        dashboard = f"<Jobs API of cluster {inv.name}: run cluster.up first>"  # a dry run shows the plan all the same

    def preflight(recipe: Recipe, say) -> None:
        check = live(recipe, inv, runner=runner, control_dir=control_dir, stream=stream, live_table=False if stream is not None else None)
        if check.failures:
            raise RunCheckFailed(inv.name, check)
        say(f"[slimeforge] cluster {inv.name}: every host holds the recipe's paths; checkpoint_dir is one filesystem"
            + (f" with room for a checkpoint ({_gib(check.need_bytes)}: {check.how})" if check.need_bytes else " (checkpoint size unknown: " + check.how + ")"))

    def heal(say) -> None:  # --max-restarts: cluster.up converges (hosts running our Ray are left as they are)
        from .raycluster import up

        say(f"[slimeforge] cluster {inv.name}: bringing lost hosts back with cluster.up's repair")
        up(inv, runner=runner, control_dir=control_dir, stream=stream)

    return Cluster(name=str(inventory), address=dashboard, mode=inv.mode, image=inv.image, prefix=inv.head.prefix,
                   python=inv.head.python, adopt=lambda r, mode_given: adopt(r, inv, mode_given), check=lambda r: static(r, inv), preflight=preflight,
                   heal=heal)
