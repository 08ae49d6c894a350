"""The checks a Slurm launch needs on the login node, and the reading of Slurm's answers:
partition up, enough nodes with enough GPUs, the time limit allowed, pyxis for container mode
(`scontrol show partition`, `sinfo`, `srun --help`). The host checks (GPUs, ports) run on each
node inside the allocation (the node agent, templates/slurm.sbatch.j2)."""

from __future__ import annotations

import os
import re
from typing import Protocol

from ...errors import CommandError, SlimeforgeError
from ...proc import Runner
from ...schema import WHOLE_RE
from ..preflight import findings as doctor
from ..recipe import Recipe


class SlurmAsk(Protocol):
    """What the checks read of the options (targets/slurm.py's Options)."""

    @property
    def partition(self) -> str | None: ...
    @property
    def time(self) -> str | None: ...
    @property
    def nodes(self) -> int | None: ...


def seconds(limit: str) -> int | None:
    """Slurm's time formats (as sinfo/scontrol print them) in seconds; None for UNLIMITED."""
    if limit in ("UNLIMITED", "INFINITE", "NONE", "n/a"):
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", limit)
    if not m:
        raise SlimeforgeError(f"cannot read Slurm time limit {limit!r}")
    d, a_, b_, c_ = m.groups()
    days, a = (int(d) if d else None), int(a_)
    b, c = (int(b_) if b_ else None), (int(c_) if c_ else None)
    if b is None:  # minutes, or days-hours
        return (days or 0) * 86400 + (a * 3600 if days is not None else a * 60)
    if c is None:  # MM:SS, or days-HH:MM
        return (days or 0) * 86400 + (a * 3600 + b * 60 if days is not None else a * 60 + b)
    return (days or 0) * 86400 + a * 3600 + b * 60 + c


def fields(line: str) -> dict[str, str]:
    """`scontrol show ... -o` output: Key=Value words (values have no spaces in the keys we read)."""
    out = {}
    for word in line.split():
        key, sep, value = word.partition("=")
        if sep:
            out[key] = value
    return out


def gres_gpus(gres: str) -> int:
    """GPUs in a node's GRES string (sinfo %G): gpu:8, gpu:h100:8, gpu:8(S:0-1), ..."""
    total = 0
    for part in re.split(r",(?![^(]*\))", gres):
        m = re.fullmatch(r"gpu(?::[^:(]+)?:(\d+)(?:\(.*\))?", part.strip())
        if m:
            total += int(m.group(1))
    return total


def cluster_findings(recipe: Recipe, opts: SlurmAsk, runner: Runner) -> list[doctor.Finding]:
    """Partition exists and is up, enough nodes with enough GPUs, the time limit allowed;
    container mode: pyxis is there."""
    F = doctor.Finding
    nodes = opts.nodes or recipe.num_nodes
    try:
        partition = opts.partition or default_partition(runner)
    except CommandError as exc:
        return [F("slurm", doctor.ERROR, f"cannot reach Slurm: {exc.output.strip()[-300:] or exc}", "run on a Slurm login node (sinfo must work; SLURM_CONF if needed)")]
    if partition is None:
        return [F("slurm-partition", doctor.ERROR, "no --partition given and the cluster has no default partition", "--partition NAME (see `sinfo -s`)")]
    r = runner.run(["scontrol", "show", "partition", "-o", "--", partition], step="scontrol show partition", check=False)
    if r.returncode != 0 or not r.stdout.strip():
        known = runner.run(["sinfo", "-h", "-o", "%R"], step="sinfo", check=False).stdout.split()
        return [F("slurm-partition", doctor.ERROR, f"partition {partition!r} does not exist", f"one of: {', '.join(sorted(set(known))) or '(none)'}")]
    part = fields(r.stdout)
    found = [F("slurm-partition", doctor.OK, f"{partition}: State={part.get('State')}, MaxTime={part.get('MaxTime')}, MaxNodes={part.get('MaxNodes')}")]
    if part.get("State") != "UP":
        found[0] = F("slurm-partition", doctor.ERROR, f"partition {partition} is {part.get('State')}", "another partition, or ask the admins")
    max_nodes = part.get("MaxNodes", "UNLIMITED")
    if WHOLE_RE.fullmatch(max_nodes) and nodes > int(max_nodes):
        found.append(F("slurm-nodes", doctor.ERROR, f"{nodes} node(s) asked, partition {partition} allows {max_nodes} per job", "--nodes, or another partition"))
    rows = runner.run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%G|%t"], step="sinfo", check=False).stdout.splitlines()
    per_node: dict[str, int] = {}
    usable: dict[str, int] = {}
    for row in rows:
        name, gres, state = (row.split("|") + ["", "", ""])[:3]
        per_node[name] = gres_gpus(gres)
        if not any(bad in state for bad in ("down", "drain", "fail", "inval", "maint")):
            usable[name] = per_node[name]
    fit = [n for n, g in usable.items() if g >= recipe.num_gpus]
    if len(fit) < nodes:
        found.append(F("slurm-nodes", doctor.ERROR,
                       f"{nodes} node(s) with {recipe.num_gpus} GPU(s) each asked; partition {partition} has {len(fit)} such node(s) in service "
                       f"(of {len(per_node)}: " + ", ".join(f"{n} gpu:{g}" for n, g in sorted(per_node.items())) + ")",
                       "--nodes / num_gpus that fit, or another partition"))
    else:
        found.append(F("slurm-nodes", doctor.OK, f"{nodes} node(s) x {recipe.num_gpus} GPU(s): {len(fit)} node(s) of {partition} fit"))
    if recipe.mode == "container":
        # pyxis adds --container-image to srun (a SPANK plugin): without it the steps would fail in the allocation.
        helptext = runner.run(["srun", "--help"], step="srun --help", check=False)
        if "--container-image" in helptext.stdout + helptext.stderr:
            found.append(F("slurm-container", doctor.OK, "srun has pyxis's --container-image"))
        else:
            found.append(F("slurm-container", doctor.ERROR, "container mode needs the pyxis plugin, but `srun --help` has no --container-image",
                           "--mode host with an install prefix on the shared filesystem, or ask the admins for pyxis/enroot"))
    limit = seconds(part.get("MaxTime", "UNLIMITED"))
    asked = seconds(opts.time) if opts.time is not None else None
    if opts.time is not None and limit is not None and asked is not None and asked > limit:
        found.append(F("slurm-time", doctor.ERROR, f"--time {opts.time} is over partition {partition}'s MaxTime {part['MaxTime']}", f"--time {part['MaxTime']} or less"))
    elif opts.time is not None:
        found.append(F("slurm-time", doctor.OK, f"--time {opts.time} within MaxTime {part.get('MaxTime')}"))
    return found


def default_partition(runner: Runner) -> str | None:
    for name in runner.run(["sinfo", "-h", "-o", "%P"], step="sinfo").stdout.split():
        if name.endswith("*"):
            return name[:-1]
    return None




def enroot_findings(recipe: Recipe, planned: dict, squashfs_dir: str | None) -> list[doctor.Finding]:
    """Container mode: the login node's enroot, whose version decided the image reference's form
    (`planned`: plan.json's "slurm" record); with --squashfs-dir, the directory the image goes to."""
    F = doctor.Finding
    if recipe.mode != "container":
        return []
    found = []
    sqsh = planned.get("squashfs")
    have_file = isinstance(sqsh, str) and planned.get("squashfs_ready") is True  # judged by content at plan time (enroot.squashfs_ready)
    if planned.get("enroot"):
        form = f"squashfs {sqsh}" + (" (there: nothing to pull)" if have_file else " (imported once, before sbatch)") if sqsh else planned["reference"]
        found.append(F("slurm-enroot", doctor.OK, f"enroot {planned['enroot']} on this login node: the image as {form}"))
    elif not have_file:
        found.append(F("slurm-enroot", doctor.ERROR, f"cannot read enroot's version on this login node ({planned.get('enroot_said')}): "
                       "it decides how the image is named to pyxis (enroot 3: REG#repo, 4: REG/repo)",
                       "run from a login node with enroot (`enroot version`), or --squashfs-dir DIR holding the imported image"))
    if sqsh and not have_file:
        parent = os.path.dirname(sqsh)
        if not (os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK)):
            found.append(F("slurm-squashfs", doctor.ERROR, f"--squashfs-dir {parent} is not a writable directory here",
                           "a directory on a filesystem every node mounts, e.g. on the shared scratch"))
    return found
