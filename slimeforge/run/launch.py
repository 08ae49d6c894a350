"""Launching a run: resolve recipe + options to a target, ask it for a plan, print or apply it.

    run_recipe(LaunchRequest(...), dry_run=...)      `invoke run` (the task's one call)
    launch(recipe, stack, out=None, ...)             the Python API (SlimeRunner.train, tests)
    target_of(run_dir)                               run.status / run.logs / run.stop

recipe file + --set -> (Recipe, Stack) -> ResolvedRun (mode, image, prefix, nodes applied) ->
Target (targets/: host, container, a running Ray cluster, Slurm) -> LaunchPlan -> a dry run
prints it (targets.describe) and writes the run directory; a launch applies it: preflight (all
problems at once; nothing started, nothing written on failure), write the run directory, run the
plan's commands. Both use the one plan object.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .. import paths
from ..errors import ConfigError, Problem
from ..image.stack import Stack
from ..proc import Runner
from .headstate import check_address
from .recipe import EXP_ID_RE, Recipe, load_recipe, load_recipe_data, parse_overrides
from .resolve import resolve_mode
from .rundir import HEAD_TIMEOUT_S, read_plan, write_run_dir
from .targets.base import LaunchPlan, ResolvedRun, Target, describe
from .targets.local import ContainerTarget, HostTarget

if TYPE_CHECKING:
    from .targets.jobsubmit import Cluster
    from .targets.slurm import Options as SlurmOptions

# A cluster inventory -> the cluster (its Jobs API, environment and checks: cluster/runcheck.py;
# handed in by the caller, with whether this is a dry run: the run layer does not reach up into the cluster layer).
FindCluster = Callable[[str, bool], "Cluster"]


@dataclass(frozen=True)
class LaunchRequest:
    """`invoke run`'s command line, as given (strings; checked by `resolve`)."""

    recipe: str
    out: str | None = None
    overrides: tuple[str, ...] = ()
    address: str | None = None
    mode: str | None = None
    image: str | None = None
    prefix: str | None = None
    catalog: str | None = None
    skip_checks: tuple[str, ...] = ()
    network_checks: bool = True
    cluster: str | None = None
    slurm: bool = False
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    nodes: str | None = None


def resolve(req: LaunchRequest, *, dry_run: bool, find_cluster: FindCluster | None = None,
            environ: dict[str, str] | None = None) -> tuple[Target, ResolvedRun]:
    """The target `req` names and the run it plans from; ConfigError for bad options."""
    environ = dict(os.environ if environ is None else environ)
    slurm_only = {"--partition": req.partition, "--account": req.account, "--time": req.time, "--nodes": req.nodes}
    if not req.slurm and any(v is not None for v in slurm_only.values()):
        raise ConfigError("command line", [Problem(k, "goes with --slurm", v, "--slurm, or leave it out") for k, v in slurm_only.items() if v is not None])
    if req.slurm and (req.address or req.cluster):
        raise ConfigError("command line", [Problem("--address/--cluster", "--slurm starts its own Ray cluster in the allocation",
                                                   req.address or req.cluster, "leave out --address/--cluster")])
    recipe, stack = load_recipe(req.recipe, parse_overrides(list(req.overrides)))
    target: Target
    if req.slurm:
        from .targets import slurm  # only then: sbatch's template and the node agent

        opts = slurm.options(req.partition, req.account, req.time, req.nodes)
        target = slurm.SlurmTarget(opts)
        recipe = slurm.on_slurm(resolve_mode(recipe, req.mode, req.prefix, req.image, stack=stack), opts)
    elif req.cluster or recipe.cluster or req.address:
        from .targets.jobsubmit import ClusterTarget, find_cluster_of, on_cluster

        # First: a cluster that is not up (or an inventory that does not load) is the first thing to fix.
        cluster = find_cluster_of(req.address, req.cluster or recipe.cluster, find_cluster, dry_run)
        recipe = on_cluster(recipe, cluster, mode=req.mode, prefix=req.prefix, image=req.image, dry_run=dry_run, stack=stack)
        target = ClusterTarget(cluster)
    else:
        recipe = resolve_mode(recipe, req.mode, req.prefix, req.image, require_image=not dry_run, stack=stack)
        target = local_target(recipe, None)
    out = Path(req.out) if req.out else paths.run_dir(recipe.exp_id)
    return target, ResolvedRun(recipe, stack, out.resolve(), req.recipe, environ, req.catalog, tuple(req.skip_checks), req.network_checks)


def local_target(recipe: Recipe, address: str | None, cluster: str | None = None, **options: Any) -> Target:
    """Host or container mode; a running Ray cluster's Jobs API, from here, when it has an address."""
    if address:
        from .targets.jobsubmit import Cluster, ClusterTarget

        check_address(address)
        return ClusterTarget(Cluster(cluster or address, address))
    make = HostTarget if recipe.mode == "host" else ContainerTarget
    return make(None, **options)


def run_recipe(req: LaunchRequest, *, dry_run: bool, find_cluster: FindCluster | None = None, stream: IO[str] | None = None) -> int:
    """`invoke run`: plan; then print it (dry run: the run directory is written, nothing starts) or apply it."""
    stream = stream or sys.stdout
    target, run = resolve(req, dry_run=dry_run, find_cluster=find_cluster)
    plan = target.plan(run)
    if dry_run:
        from .runrecord import guard_render

        # A dry run renders into the run directory too: never over a live run's record; an ended one's goes to history/<n>/.
        kept = guard_render(plan.rundir.path, exp_id=plan.run.recipe.exp_id)
        write_run_dir(plan.rundir)
        if kept:
            stream.write(f"the record of the earlier launch is kept in {plan.rundir.path / 'history' / str(kept)}\n")
        stream.write("\n".join(describe(plan)) + "\n")
        print(f"  (train.py and {len(plan.rundir.args)} arguments; see {plan.rundir.path / 'slime.args'})", file=sys.stderr)
        return 0
    return apply(target, plan, Runner(), stream)


def apply(target: Target, plan: LaunchPlan, runner: Runner, stream: IO[str]) -> int:
    def say(text: str) -> None:
        stream.write(text + "\n")
        stream.flush()

    return target.apply(plan, runner, say, stream)


def launch(recipe: Recipe, stack: Stack, out: str | os.PathLike | None = None, recipe_path: str = "(api)", *,
           address: str | None = None, mode: str | None = None, image: str | None = None, install_prefix: str | None = None,
           catalog: str | None = None, skip_checks: Iterable[str] = (), network_checks: bool = True,
           runner: Runner | None = None, stream: IO[str] | None = None, environ: dict[str, str] | None = None,
           head_args: Iterable[str] | None = None, python: str | None = None, docker: str = "docker",
           shm_size: str = "64g", head_timeout: float = HEAD_TIMEOUT_S, slurm_options: SlurmOptions | None = None,
           follow_log: bool = True) -> int:
    """Preflight, then launch; returns the job's exit code (0 = SUCCEEDED).

    The target: this machine (host or container mode), or with `address` the Jobs API of that
    running Ray cluster, e.g. "http://10.0.0.1:8265" (no head is started), or with `slurm_options`
    an sbatch allocation (follow_log=False: return once submitted).

    mode / image / install_prefix override the recipe's. skip_checks: preflight checks whose errors
    become warnings. runner: a proc.Runner (a dry-run one records argv lists and starts nothing).
    head_args: more `ray start` options (default: $SLIMEFORGE_RAY_HEAD_ARGS). head_timeout: seconds
    the head has to answer. Raises PreflightError (every problem, each with its fix) before anything starts."""
    recipe = resolve_mode(recipe, mode, install_prefix, image, stack=stack)
    target: Target
    if slurm_options is not None:
        from .targets import slurm

        target = slurm.SlurmTarget(slurm_options, follow_log=follow_log)
        recipe = slurm.on_slurm(recipe, slurm_options)
    else:
        options = ({"head_args": None if head_args is None else list(head_args), "python": python, "head_timeout": head_timeout}
                   if recipe.mode == "host" else {"docker": docker, "shm_size": shm_size})
        target = local_target(recipe, address, **options)
    run = ResolvedRun(recipe, stack, Path(out or paths.run_dir(recipe.exp_id)).resolve(), recipe_path,
                      dict(os.environ if environ is None else environ), catalog, tuple(skip_checks), network_checks)
    return apply(target, target.plan(run), runner or Runner(), stream or sys.stdout)


# --- a launched run -------------------------------------------------------------------------------


def run_dir_of(run: str) -> Path:
    """A recorded run: its run directory, or the recipe that was launched (runs/<exp_id>)."""
    if Path(run).is_dir():
        return Path(run)
    exp_id = load_recipe_data(run).get("exp_id")
    if not isinstance(exp_id, str) or not EXP_ID_RE.fullmatch(exp_id):
        raise ConfigError(run, [Problem("exp_id", "names no run directory", exp_id, "the exp_id of a launched recipe")])
    return paths.run_dir(exp_id)


def target_of(run_dir: Path) -> Target:
    """The target that launched this run directory, to read its status and logs or stop it."""
    from .targets import slurm

    if slurm.is_slurm_run(run_dir):
        return slurm.SlurmTarget(slurm.Options())
    plan = read_plan(run_dir)
    if plan is None:
        raise ConfigError(str(run_dir), [Problem("run directory", "has no plan.json", str(run_dir), "runs/<exp_id> of a rendered recipe")])
    if plan.get("target") == "ray-cluster":
        from .targets.jobs import recorded
        from .targets.jobsubmit import Cluster, ClusterTarget

        address = recorded(run_dir).address
        return ClusterTarget(Cluster(address, address))
    return HostTarget() if plan["recipe"].get("mode") == "host" else ContainerTarget()
