"""The launch target interface: how a run reaches its hosts, as one concept with four implementations.

    recipe + options --resolve--> ResolvedRun --Target.plan--> LaunchPlan --Target.apply--> exit code

Like Ray's cluster-launcher command runners (SSH and Docker behind one interface), each target
(targets/local.py: host, container, a running Ray cluster; targets/slurm.py: Slurm) owns:
  - the per-node `ray start` argv (launch.sh's head for host and container; the allocation's
    nodes for Slurm; none for a running Ray cluster, which is already up),
  - its mounts (targets/mounts.py: one function for every container target),
  - the checks it needs before anything starts (`preflight`),
  - where its state lives (the run directory's records, the head's state directory),
  - how a job is submitted, followed and stopped (`apply`, `logs`, `stop`),
  - what `run.status`, `run.logs` and `run.stop` read back, and how it proves that what they act
    on is this run's (run/ownership.py: the head's pid + start time + boot id + run token, the
    job's metadata, the container's labels, the Slurm job's user, name, comment, directory, time).

A plan is data: the run directory's files, the exact argv lists in order and the environment each
one gets (values we set, names passed through, names removed). `invoke run --dry-run` prints it
(`describe`); a launch applies the same object. There is no second code path for the dry run.
"""

from __future__ import annotations

import shlex
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypedDict

from ...console import shell_lines
from ...image.stack import Stack
from ...proc import Runner
from ..layout import SLIMEFORGE, Layout
from ..recipe import Recipe
from ..rundir import RunDir

Say = Callable[[str], None]


@dataclass(frozen=True)
class Mount:
    """A host path the run needs inside a container, at the same path."""

    path: str
    writable: bool
    what: str  # the recipe field it comes from, for error messages


@dataclass(frozen=True)
class Command:
    """One argv of a plan, with the environment it runs in: this process's, plus `set`, less `unset`.
    Values in `set` are ours (paths, ports): a secret is never one; secrets pass by name in the argv."""

    argv: tuple[str, ...]
    step: str
    set_env: tuple[tuple[str, str], ...] = ()
    unset_env: tuple[str, ...] = ()

    def environment(self, environ: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in environ.items() if k not in self.unset_env}
        env.update(self.set_env)
        return env

    def text(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.set_env)
        unset = " ".join(f"-u {k}" for k in self.unset_env)
        prefix = f"env {unset} {env} ".replace("  ", " ") if (env or unset) else ""
        return prefix + shlex.join(self.argv)

    def shell(self) -> str:
        """The same command as `text`, as multi-line shell a person reads and pastes (console.shell_lines)."""
        env = [*(w for k in self.unset_env for w in ("-u", k)), *(f"{k}={v}" for k, v in self.set_env)]
        return shell_lines([*(["env", *env] if env else []), *self.argv])


@dataclass(frozen=True)
class ResolvedRun:
    """A recipe with the command line applied: what every target plans from."""

    recipe: Recipe  # mode, image, install prefix and node count as the command line set them
    stack: Stack
    out: Path  # the run directory
    recipe_path: str
    environ: dict[str, str] = field(repr=False)  # the launching process's environment (read, never written)
    catalog: str | None = None
    skip_checks: tuple[str, ...] = ()
    network_checks: bool = True
    # Host mode: the interpreter that runs launch.sh and train.py when the request named one (in
    # place: this one); the preflight reads the flag catalog and the versions with it.
    python: str | None = None
    # slimeforge's layout or the image's (run/layout.py): what the run directory is rendered for;
    # `layout_note` says why the image's layout could not be learned, when it could not.
    layout: Layout = SLIMEFORGE
    layout_note: str | None = None


@dataclass(frozen=True, repr=False)
class LaunchPlan:
    """Everything a launch will do, computed before anything is done."""

    target: str  # Target.name
    run: ResolvedRun
    rundir: RunDir  # the files to write (plan.json holds `commands` too)
    commands: tuple[Command, ...]  # run in order; the last one's exit code is the launch's
    mounts: tuple[Mount, ...] = ()
    notes: tuple[str, ...] = ()  # what the reader of a dry run should know (placeholders, ...)
    container: str | None = None  # the name of the container the commands start (recorded id: <run dir>/container.id)
    # This launch's identity (32 hex digits), carried by everything it starts: the head record, the
    # Ray job's metadata, the container's labels, the Slurm job's comment; kept in <run dir>/run_token.
    run_token: str | None = None

    def __repr__(self) -> str:
        # Short: the whole plan is in the attributes (rundir.files, commands) and in describe().
        return (f"LaunchPlan(target={self.target!r}, run_dir='{self.rundir.path}', files={len(self.rundir.files)}, "
                f"commands={len(self.commands)}, mounts={len(self.mounts)}, notes={len(self.notes)})")


def describe(plan: LaunchPlan) -> list[str]:
    """The plan as `invoke run --dry-run` prints it."""
    from ..localpaths import dry_run_warnings

    rec = plan.run.recipe
    warned = len(dry_run_warnings(rec, plan.run.environ))
    # "valid" only where nothing is in doubt: a path missing here is a warning (stderr), not a refusal.
    verdict = f"valid as a recipe, {warned} warning(s) (stderr)" if warned else "valid"
    lines = [f"recipe {plan.run.recipe_path}: {verdict} ({rec.exp_id}, stack {plan.run.stack.id}); target "
             f"{plan.target}",
             f"run directory {plan.rundir.path}:", *(f"  {name}" for name in plan.rundir.files)]
    if plan.mounts:
        lines.append("mounts (same path inside):")
        lines += [f"  {m.path} ({'rw' if m.writable else 'ro'}; {m.what})" for m in plan.mounts]
    if (layout := layout_line(plan.run, always_when_probed=True)) is not None:
        lines.append(layout)
    lines.append("would run:")
    lines += [f"  {line}" for c in plan.commands for line in c.shell().splitlines()]
    if plan.rundir.args:
        lines.append(f"  (train.py and {len(plan.rundir.args)} arguments; see {plan.rundir.path / 'slime.args'})")
    lines += [f"note: {n}" for n in plan.notes]
    return lines


class MountDoc(TypedDict):
    path: str
    writable: bool
    what: str


class CommandDoc(TypedDict):
    step: str
    argv: list[str]
    set_env: dict[str, str]
    unset_env: list[str]


class PlanDoc(TypedDict):
    """`invoke run --dry-run --json`'s plan (slimeforge.run-plan/1, docs/json.md)."""

    recipe: str
    exp_id: str
    stack: str
    target: str
    run_dir: str
    files: list[str]
    mounts: list[MountDoc]
    commands: list[CommandDoc]
    train_args: int
    notes: list[str]


def plan_doc(plan: LaunchPlan) -> PlanDoc:
    """The plan as `invoke run --dry-run --json` prints it (slimeforge.run-plan/1, docs/json.md):
    what describe() says, as data. plan.json in the run directory stays the full record."""
    rec = plan.run.recipe
    return {
        "recipe": plan.run.recipe_path, "exp_id": rec.exp_id, "stack": plan.run.stack.id, "target": plan.target,
        "run_dir": str(plan.rundir.path), "files": list(plan.rundir.files),
        "mounts": [{"path": m.path, "writable": m.writable, "what": m.what} for m in plan.mounts],
        "commands": [{"step": c.step, "argv": list(c.argv), "set_env": dict(c.set_env), "unset_env": list(c.unset_env)}
                     for c in plan.commands],
        "train_args": len(plan.rundir.args), "notes": list(plan.notes),
    }


def layout_line(run: ResolvedRun, *, always_when_probed: bool = False) -> str | None:
    """What the run directory is rendered for (run/layout.py), one line: a dry run says it whenever
    the image was probed; a launch, before its preflight, when it is not slimeforge's layout or the
    image's could not be learned."""
    said = run.layout_note or not run.layout.is_slimeforge or (always_when_probed and run.layout != SLIMEFORGE)
    return f"layout: {run.layout_note or run.layout.why}" if said else None


@dataclass(frozen=True)
class RunStatus:
    """What `run.status` reads back: lines for people, a dict for --json (docs/json.md)."""

    lines: tuple[str, ...]
    data: Mapping[str, object]  # a target's own document (JobStatusDoc, SlurmStatusDoc)


class Target(ABC):
    """One way a run reaches its hosts."""

    name: str

    @abstractmethod
    def plan(self, run: ResolvedRun) -> LaunchPlan:
        """The launch, computed: files, argv lists, environment. Touches nothing."""

    @abstractmethod
    def mounts(self, run: ResolvedRun) -> tuple[Mount, ...]:
        """The paths a container of this target mounts (none on a bare host)."""

    @abstractmethod
    def preflight(self, plan: LaunchPlan, runner: Runner, say: Say) -> None:
        """Every check this target needs, all problems at once; raises PreflightError. Starts nothing."""

    @abstractmethod
    def apply(self, plan: LaunchPlan, runner: Runner, say: Say, stream: IO[str]) -> int:
        """Preflight, write the run directory, run the commands; the job's exit code."""

    @abstractmethod
    def status(self, rundir: Path) -> RunStatus: ...

    @abstractmethod
    def logs(self, rundir: Path, follow: bool, stream: IO[str]) -> int | None: ...

    @abstractmethod
    def stop(self, rundir: Path, *, head: bool = False, say: Say = print, runner: Runner | None = None) -> int:
        """Stop what this run launched, each thing first proved to be this run's (run/ownership.py);
        says what it did, one `outcome: ...` line each. The exit code: 0 when what was asked for was
        stopped or had already ended; 1 when something was refused or failed; 2 when nothing was ever launched."""

