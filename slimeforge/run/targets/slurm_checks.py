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
from ...schema import WHOLE_RE, printable
from ..preflight import findings as doctor
from ..recipe import Recipe

TIMEOUT_S = 60  # each of sinfo, scontrol, srun --help: a hung controller ends in an error, not a hang


class SlurmAsk(Protocol):
    """What the checks read of the options (targets/slurm.py's Options)."""

    @property
    def partition(self) -> str | None: ...
    @property
    def time(self) -> str | None: ...
    @property
    def nodes(self) -> int | None: ...


# What Slurm answers here is input like any other: bounded, read by grammar, shown printable and
# quoted as Slurm's. An answer that cannot be read is a finding (an error naming the command and
# what it said), never a traceback and never a check that passes.
ANSWER_MAX_CHARS = 4 << 20
NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
PARTITION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
STATE_RE = re.compile(r"[A-Za-z_+*~#!%$@^-]{1,64}")
GRES_MAX_CHARS = 1000
_TIME_RE = re.compile(r"(?:(\d{1,5})-)?(\d{1,7})(?::(\d{1,2}))?(?::(\d{1,2}))?")


class SlurmAnswerError(SlimeforgeError):
    """Slurm answered something this code cannot read as what it asked for."""


def said(text: str, limit: int = 200) -> str:
    """Slurm's words, quoted as theirs: printable, cut at `limit`."""
    return repr(printable(text[:limit]) + ("..." if len(text) > limit else ""))


def seconds(limit: str) -> int | None:
    """Slurm's time formats (as sinfo/scontrol print them) in seconds; None for UNLIMITED."""
    if limit in ("UNLIMITED", "INFINITE", "NONE", "n/a"):
        return None
    m = _TIME_RE.fullmatch(limit) if isinstance(limit, str) else None
    if not m:
        raise SlurmAnswerError(f"cannot read Slurm time limit {said(str(limit))}")
    d, a_, b_, c_ = m.groups()
    days, a = (int(d) if d else None), int(a_)
    b, c = (int(b_) if b_ else None), (int(c_) if c_ else None)
    if b is None:  # minutes, or days-hours
        return (days or 0) * 86400 + (a * 3600 if days is not None else a * 60)
    if c is None:  # MM:SS, or days-HH:MM
        return (days or 0) * 86400 + (a * 3600 + b * 60 if days is not None else a * 60 + b)
    return (days or 0) * 86400 + a * 3600 + b * 60 + c


def fields(line: str) -> dict[str, str]:
    """`scontrol show ... -o` output: Key=Value words (values have no spaces in the keys we read);
    SlurmAnswerError when a key appears twice (which one is Slurm's?)."""
    out: dict[str, str] = {}
    for word in line.split():
        key, sep, value = word.partition("=")
        if sep:
            if key in out:
                raise SlurmAnswerError(f"{key} appears twice in {said(line)}")
            out[key] = value
    return out


def gres_gpus(gres: str) -> int:
    """GPUs in a node's GRES string (sinfo %G): gpu:8, gpu:h100:8, gpu:8(S:0-1), ..."""
    total = 0
    for part in re.split(r",(?![^(]*\))", gres[:GRES_MAX_CHARS]):
        m = re.fullmatch(r"gpu(?::[^:(]{1,64})?:(\d{1,4})(?:\(.{0,200}\))?", part.strip())
        if m:
            total += int(m.group(1))
    return total


def _stdout(runner: Runner, argv: list[str], step: str) -> tuple[int, str, str]:
    r = runner.run(argv, step=step, check=False, timeout=TIMEOUT_S)
    if len(r.stdout) > ANSWER_MAX_CHARS:
        raise SlurmAnswerError(f"`{' '.join(argv[:3])}` answered over {ANSWER_MAX_CHARS} characters")
    return r.returncode, r.stdout, r.stderr


def cluster_findings(recipe: Recipe, opts: SlurmAsk, runner: Runner) -> list[doctor.Finding]:
    """Partition exists and is up, enough nodes with enough GPUs, the time limit allowed;
    container mode: pyxis is there. An answer of Slurm's that cannot be read is an error finding."""
    try:
        return _cluster_findings(recipe, opts, runner)
    except SlurmAnswerError as exc:
        return [doctor.Finding("slurm", doctor.ERROR, f"Slurm's answer cannot be read: {exc}",
                               "check `sinfo` and `scontrol show partition` on this login node (SLURM_CONF, a wrapper "
                               "script printing extra lines?)")]


def _cluster_findings(recipe: Recipe, opts: SlurmAsk, runner: Runner) -> list[doctor.Finding]:
    F = doctor.Finding
    nodes = opts.nodes or recipe.num_nodes
    try:
        partition = opts.partition or default_partition(runner)
    except CommandError as exc:
        return [F("slurm", doctor.ERROR, f"cannot reach Slurm: {printable(exc.output.strip()[-300:]) or exc}",
                  "run on a Slurm login node (sinfo must work; SLURM_CONF if needed)")]
    if partition is None:
        return [F("slurm-partition", doctor.ERROR, "no --partition given and the cluster has no default partition",
                  "--partition NAME (see `sinfo -s`)")]
    code, out, _ = _stdout(runner, ["scontrol", "show", "partition", "-o", "--", partition], "scontrol show partition")
    lines = [line for line in out.splitlines() if line.strip()]
    if code != 0 or not lines:
        _, known_out, _ = _stdout(runner, ["sinfo", "-h", "-o", "%R"], "sinfo")
        known = sorted({n for n in known_out.split() if PARTITION_RE.fullmatch(n)})
        return [F("slurm-partition", doctor.ERROR, f"partition {partition!r} does not exist",
                  f"one of: {', '.join(known[:50]) or '(none)'}")]
    if len(lines) > 1:
        raise SlurmAnswerError(f"`scontrol show partition -o {partition}` answered {len(lines)} lines, not one")
    part = fields(lines[0])
    if part.get("PartitionName") != partition:
        raise SlurmAnswerError(f"asked about partition {partition}, scontrol answered about "
                               f"{said(part.get('PartitionName', '(none)'))}")
    state, max_time, max_nodes = part.get("State", ""), part.get("MaxTime", "UNLIMITED"), part.get("MaxNodes",
                                                                                                   "UNLIMITED")
    if not STATE_RE.fullmatch(state):
        raise SlurmAnswerError(f"partition {partition}'s State is {said(state)}")
    if not (WHOLE_RE.fullmatch(max_nodes) and len(max_nodes) <= 9 or max_nodes == "UNLIMITED"):
        raise SlurmAnswerError(f"partition {partition}'s MaxNodes is {said(max_nodes)}")
    limit = seconds(max_time)  # unreadable: SlurmAnswerError
    found = [F("slurm-partition", doctor.OK, f"{partition}: State={state}, MaxTime={max_time}, MaxNodes={max_nodes}")]
    if state != "UP":
        found[0] = F("slurm-partition", doctor.ERROR, f"partition {partition} is {state}",
                     "another partition, or ask the admins")
    if max_nodes != "UNLIMITED" and nodes > int(max_nodes):
        found.append(F("slurm-nodes", doctor.ERROR,
                       f"{nodes} node(s) asked, partition {partition} allows {max_nodes} per "
                       "job", "--nodes, or another partition"))
    _, rows_out, _ = _stdout(runner, ["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%G|%t"], "sinfo")
    per_node: dict[str, int] = {}
    unusable: set[str] = set()
    unreadable = []
    for row in rows_out.splitlines():
        if not row.strip():
            continue
        cols = row.split("|")
        if (len(cols) != 3 or not NODE_RE.fullmatch(cols[0]) or not STATE_RE.fullmatch(cols[2])
                or len(cols[1]) > GRES_MAX_CHARS):
            unreadable.append(row)
            continue
        name, gres, node_state = cols
        gpus = gres_gpus(gres)
        # A node listed twice (sinfo prints a node once per partition and state): the fewest GPUs, the worst state.
        per_node[name] = min(per_node.get(name, gpus), gpus)
        if any(bad in node_state.lower() for bad in ("down", "drain", "fail", "inval", "maint", "unk", "futr", "npc",
                                                     "pow", "boot")):
            unusable.add(name)
    if unreadable:
        raise SlurmAnswerError(f"`sinfo -N -p {partition}` printed {len(unreadable)} line(s) that are not "
                               "NODE|GRES|STATE, "
                               f"e.g. {said(unreadable[0])}")
    fit = [n for n, g in per_node.items() if n not in unusable and g >= recipe.num_gpus]
    if len(fit) < nodes:
        listed = sorted(per_node.items())
        found.append(F("slurm-nodes", doctor.ERROR,
                       f"{nodes} node(s) with {recipe.num_gpus} GPU(s) each asked; partition {partition} has "
                       f"{len(fit)} such node(s) in service "
                       f"(of {len(per_node)}: " + ", ".join(f"{n} gpu:{g}" for n,
                                                            g in listed[:20]) + (", "
                                                                                 "..." if len(listed) > 20 else "")
                       + ")",
                       "--nodes / num_gpus that fit, or another partition"))
    else:
        found.append(F("slurm-nodes", doctor.OK,
                       f"{nodes} node(s) x {recipe.num_gpus} GPU(s): {len(fit)} node(s) of {partition} fit"))
    if recipe.mode == "container":
        # pyxis adds --container-image to srun (a SPANK plugin): without it the steps would fail in the allocation.
        _, help_out, help_err = _stdout(runner, ["srun", "--help"], "srun --help")
        if re.search(r"(?m)^\s*--container-image[=\s]", help_out + "\n" + help_err):
            found.append(F("slurm-container", doctor.OK, "srun has pyxis's --container-image"))
        else:
            found.append(F("slurm-container", doctor.ERROR,
                           "container mode needs the pyxis plugin, but `srun --help` has no --container-image",
                           "--mode host with an install prefix on the shared filesystem, or ask the admins for "
                           "pyxis/enroot"))
    asked = seconds(opts.time) if opts.time is not None else None
    if opts.time is not None and limit is not None and asked is not None and asked > limit:
        found.append(F("slurm-time", doctor.ERROR,
                       f"--time {opts.time} is over partition {partition}'s MaxTime "
                       f"{max_time}", f"--time {max_time} or less"))
    elif opts.time is not None:
        found.append(F("slurm-time", doctor.OK, f"--time {opts.time} within MaxTime {max_time}"))
    return found


def default_partition(runner: Runner) -> str | None:
    """The partition sinfo marks as the default ('*'); None when none is (or more than one is)."""
    r = runner.run(["sinfo", "-h", "-o", "%P"], step="sinfo", timeout=TIMEOUT_S)
    marked = ({name[:-1] for name in r.stdout[:ANSWER_MAX_CHARS].split() if name.endswith("*")
               and PARTITION_RE.fullmatch(name[:-1])})
    return marked.pop() if len(marked) == 1 else None


def enroot_findings(recipe: Recipe, planned: dict, squashfs_dir: str | None) -> list[doctor.Finding]:
    """Container mode: the login node's enroot, whose version decided the image reference's form
    (`planned`: plan.json's "slurm" record); with --squashfs-dir, the directory the image goes to."""
    F = doctor.Finding
    if recipe.mode != "container":
        return []
    found = []
    sqsh = planned.get("squashfs")
    # judged by content at plan time (enroot.squashfs_ready)
    have_file = isinstance(sqsh, str) and planned.get("squashfs_ready") is True
    if planned.get("enroot"):
        there = " (there: nothing to pull)" if have_file else " (imported once, before sbatch)"
        form = f"squashfs {sqsh}" + there if sqsh else planned["reference"]
        found.append(F("slurm-enroot", doctor.OK,
                       f"enroot {planned['enroot']} on this login node: the image as {form}"))
    elif not have_file:
        found.append(F("slurm-enroot", doctor.ERROR,
                       f"cannot read enroot's version on this login node ({planned.get('enroot_said')}): "
                       "it decides how the image is named to pyxis (enroot 3: REG#repo, 4: REG/repo)",
                       "run from a login node with enroot (`enroot version`), or --squashfs-dir DIR holding the "
                       "imported image"))
    if sqsh and not have_file:
        parent = os.path.dirname(sqsh)
        if not (os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK)):
            found.append(F("slurm-squashfs", doctor.ERROR, f"--squashfs-dir {parent} is not a writable directory here",
                           "a directory on a filesystem every node mounts, e.g. on the shared scratch"))
    return found
