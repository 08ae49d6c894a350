"""Launching a run: resolve recipe + options to a target, ask it for a plan, print or apply it.

    run_recipe(LaunchRequest(...), dry_run=...)      `invoke run` and SlimeRunner.train (the one path)
    launch(recipe, stack, out=None, ...)             a parsed recipe, the same path (tests, benchmarks)
    target_of(run_dir)                               run.status / run.logs / run.stop

recipe file + --set -> (Recipe, Stack) -> ResolvedRun (mode, image, prefix, nodes applied) ->
Target (targets/: host, container, a running Ray cluster, Slurm) -> LaunchPlan -> a dry run
prints it (targets.describe) and writes the run directory; a launch applies it: preflight (all
problems at once; nothing started, nothing written on failure), write the run directory, run the
plan's commands. Both use the one plan object.
"""

from __future__ import annotations

import functools
import os
import sys
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pydantic

from .. import paths
from ..errors import ConfigError, Problem, SlimeforgeError
from ..image.stack import Stack
from ..proc import Runner
from ..yamlio import deep_merge
from .headstate import check_address
from .layout import SLIMEFORGE, layout_here, layout_of_image
from .modechoice import resolve_mode
from .recipe import EXP_ID_RE, Recipe, load_recipe_data, parse_overrides
from .recipecheck import RecipeProblems, load_recipe, parse_recipe, top
from .rundir import HEAD_TIMEOUT_S, read_plan, write_run_dir
from .targets.base import LaunchPlan, ResolvedRun, Target, describe, plan_doc
from .targets.local import ContainerTarget, HostTarget

if TYPE_CHECKING:
    from .targets.jobsubmit import Cluster
    from .targets.slurm import Options as SlurmOptions

# A cluster inventory -> the cluster (its Jobs API, environment and checks: cluster/runcheck.py;
# handed in by the caller, with whether this is a dry run: the run layer does not reach up into the cluster layer).
FindCluster = Callable[[str, bool], "Cluster"]


@dataclass(frozen=True, kw_only=True)
class LaunchRequest:
    """Every launch option, once, by keyword: `invoke run`'s command line (tasks.py) and
    `SlimeRunner.train()` build it; `resolve` checks it (strings as given) and picks the target."""

    recipe: str  # the recipe file; with `data`, where the keys came from (e.g. "SlimeRunner(...)")
    data: Mapping[str, Any] | None = None  # the recipe's keys when they are not read from the file (the API)
    overrides: tuple[str, ...] = ()  # --set key=value
    out: str | None = None
    address: str | None = None
    mode: str | None = None
    image: str | None = None
    prefix: str | None = None
    # In place (SlimeRunner without mode, image or prefix): host mode in this environment, this
    # interpreter, slime and Megatron at slime_dir / megatron_dir (slime's container, or the
    # environment its bare-metal script built).
    in_place: bool = False
    catalog: str | None = None
    skip_checks: tuple[str, ...] = ()
    network_checks: bool = True
    cluster: str | None = None
    slurm: bool = False
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    nodes: str | int | None = None
    squashfs_dir: str | None = None  # Slurm, container mode: the image imported once to a squashfs there
    # How this machine starts things (the API, tests and benchmarks; the command line keeps the defaults).
    python: str | None = None  # host mode: the interpreter of launch.sh and train.py (in place: this one)
    head_args: tuple[str, ...] | None = None  # more `ray start` options (default: $SLIMEFORGE_RAY_HEAD_ARGS)
    head_timeout: float = HEAD_TIMEOUT_S  # seconds the head has to answer
    docker: str = "docker"
    shm_size: str = "64g"
    start_timeout: int | None = None  # Slurm: seconds for the head, then each node, to join (default: the target's)
    follow_log: bool = True  # Slurm: False returns once submitted
    detach: bool = False  # a running Ray cluster: return once the job runs (Ctrl-C while following detaches too)
    # a running Ray cluster: restarts after a lost node or head (default: the recipe's max_restarts)
    max_restarts: int | None = None

    def __post_init__(self) -> None:
        # The API hands Python values (the command line's are typed by invoke): pydantic checks each
        # option's type strictly (no "30" for 30, no list for a tuple of words, no 1 for True), all at
        # once; its value is checked where it is used (resolve, the target).
        try:
            _strict_options().model_validate({f.name: getattr(self, f.name) for f in fields(self)})
        except pydantic.ValidationError as exc:
            wrong = dict.fromkeys(str(e["loc"][0]) for e in exc.errors())  # a union says once per member
            annotations = {f.name: f.type for f in fields(self)}
            raise ConfigError("launch options", [Problem(name, f"must be {annotations[name]}", getattr(self,
                                                                                                       name))
                                                 for name in wrong]) from None


@functools.cache
def _strict_options() -> type[pydantic.BaseModel]:
    """LaunchRequest's fields and types as a strict pydantic model (a dataclass validated by its own
    type would construct itself again: this model only checks)."""
    hints = typing.get_type_hints(LaunchRequest)
    return pydantic.create_model("LaunchOptions", __config__=pydantic.ConfigDict(strict=True),
                                 **{f.name: (hints[f.name], ...) for f in fields(LaunchRequest)})  # type: ignore[call-overload]


LAUNCH_OPTIONS = tuple(f.name for f in fields(LaunchRequest) if f.name not in ("recipe", "data", "in_place"))


def load(req: LaunchRequest) -> tuple[Recipe, Stack]:
    """The request's recipe, validated: its keys (the API) or its file, with --set applied."""
    overrides = parse_overrides(list(req.overrides))
    if req.data is not None:
        return parse_recipe(deep_merge(dict(req.data), overrides), req.recipe, overrides)
    return load_recipe(req.recipe, overrides)


def in_place(recipe: Recipe, source: str, dry_run: bool = False) -> Recipe:
    """Host mode where this process runs, once slime is proved to be at slime_dir here (a dry run
    plans it all the same, and says so: resolve's layout note; a launch refuses)."""
    if not dry_run and not slime_here(recipe):
        raise ConfigError(source, [Problem("slime_dir",
                                           "has no slime here (no train.py and slime/ package), so it cannot run in "
                                           "place",
                                           recipe.slime_dir,
                                           "slime_dir= where slime is installed; image=REG/repo@sha256:... for "
                                           "container mode; or install_prefix= of `invoke install`")])
    return recipe.model_copy(update={"mode": "host"})


def slime_here(recipe: Recipe) -> bool:
    slime = Path(recipe.slime_dir)
    return (slime / "train.py").is_file() and (slime / "slime").is_dir()


def sequences_as_tuples(options: dict[str, Any]) -> dict[str, Any]:
    """Python callers pass lists for the word-list options; the frozen request holds tuples (a
    single string stays one, and is refused: it is not a list of words)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}


def local_target_of(req: LaunchRequest, recipe: Recipe) -> Target:
    """The host or container target, with the request's options for it."""
    if recipe.mode == "host":
        return local_target(recipe, None, head_args=None if req.head_args is None else list(req.head_args),
                            head_timeout=req.head_timeout)
    return local_target(recipe, None, docker=req.docker, shm_size=req.shm_size)


def resolve(req: LaunchRequest, *, dry_run: bool, find_cluster: FindCluster | None = None,
            environ: dict[str, str] | None = None, probe_image: bool = True) -> tuple[Target, ResolvedRun]:
    """The target `req` names and the run it plans from; ConfigError for bad options. Container
    mode: the image is probed for its layout (run/layout.py; a dry run pulls nothing), unless
    `probe_image` is False (a dry-run Runner's launch: commands are recorded, none run). Slurm's
    container mode too (its preflight probes the image here as well); a running Ray cluster's image
    is the inventory's, on its hosts: rendered for slimeforge's layout."""
    environ = dict(os.environ if environ is None else environ)
    slurm_only = {"--partition": req.partition, "--account": req.account, "--time": req.time, "--nodes": req.nodes,
                  "--squashfs-dir": req.squashfs_dir}
    if not req.slurm and any(v is not None for v in slurm_only.values()):
        raise ConfigError("command line", [Problem(k, "goes with --slurm", v, "--slurm, or leave it out") for k,
                                           v in slurm_only.items() if v is not None])
    if req.slurm and (req.address or req.cluster):
        raise ConfigError("command line", [Problem("--address/--cluster",
                                                   "--slurm starts its own Ray cluster in the allocation",
                                                   req.address or req.cluster, "leave out --address/--cluster")])
    # The recipe's own problems are held until the options and the cluster's fit join them: one
    # round (Slurm and in place check theirs on a valid recipe only).
    pending: RecipeProblems | None = None
    try:
        recipe, stack = load(req)
    except RecipeProblems as exc:
        if exc.recipe is None or req.slurm or req.in_place:
            raise
        recipe, stack, pending = exc.recipe, exc.stack, exc  # type: ignore[assignment]  # never reaches a target: raised below
    if req.max_restarts is not None and not 0 <= req.max_restarts <= 100:
        raise ConfigError("command line", [Problem("--max-restarts", "is not a number of restarts", req.max_restarts,
                                                   "0..100")])
    on_a_cluster = bool(req.cluster or recipe.cluster or req.address) and not req.slurm
    if not on_a_cluster and (req.detach or req.max_restarts):
        raise ConfigError("command line", [Problem("--detach" if req.detach else "--max-restarts",
                                                   "goes with a running Ray cluster",
                                                   True if req.detach else req.max_restarts,
                                                   "--cluster INVENTORY or --address http://HEAD:8265")])
    target: Target
    layout, layout_note = SLIMEFORGE, None
    if req.in_place:
        recipe = in_place(recipe, req.recipe, dry_run)
        layout = layout_here(recipe, environ, req.python or sys.executable)
        if not slime_here(recipe):  # a dry run only (in_place refuses a launch)
            layout_note = f"{layout.why}; but slime is not at {recipe.slime_dir} here: a launch refuses it"
    if req.slurm:
        from .targets import slurm  # only then: sbatch's template and the node agent

        opts = slurm.options(req.partition, req.account, req.time, req.nodes, req.squashfs_dir)
        if req.start_timeout is not None:
            opts = replace(opts, start_timeout=req.start_timeout)
        target = slurm.SlurmTarget(opts, follow_log=req.follow_log)
        recipe = slurm.on_slurm(resolve_mode(recipe, req.mode, req.prefix, req.image, require_image=not dry_run,
                                             stack=stack), opts)
        if recipe.mode == "container" and recipe.image and probe_image:  # as the preflight's probe of it, here
            layout, recipe, layout_note = layout_of_image(recipe, pull=not dry_run, docker=req.docker)
    elif req.cluster or recipe.cluster or req.address:
        from .targets.jobsubmit import ClusterTarget, find_cluster_of, on_cluster

        # First: a cluster that is not up (or an inventory that does not load) is the first thing to fix.
        try:
            cluster = find_cluster_of(req.address, req.cluster or recipe.cluster, find_cluster, dry_run)
            if cluster.checks is None and recipe.secret_env:  # --address: no inventory, nothing delivers them
                raise ConfigError(req.recipe, [Problem(f"secret_env.{i}",
                                                       f"cannot reach a job on {cluster.name}: secrets travel only to "
                                                       "a cluster "
                                                       "cluster.up brought up with them (the inventory's secret_env)",
                                                       name,
                                                       "--cluster INVENTORY with the name in its secret_env, or "
                                                       "remove it from the recipe "
                                                       "(the hosts' own environment must then have it)") for i,
                                               name in enumerate(recipe.secret_env)])
            recipe = on_cluster(recipe, cluster, mode=req.mode, prefix=req.prefix, image=req.image, dry_run=dry_run,
                                stack=stack)
        except SlimeforgeError as exc:  # the cluster's fit, or why it has none, beside the recipe's problems
            if pending is None:
                raise
            raise joined(pending, exc, "cluster") from None
        if pending is not None:
            raise pending
        restarts = recipe.max_restarts if req.max_restarts is None else req.max_restarts
        target = ClusterTarget(cluster, detach=req.detach, max_restarts=restarts)
    else:
        try:
            recipe = resolve_mode(recipe, req.mode, req.prefix, req.image, require_image=not dry_run, stack=stack)
            if not dry_run and (missing := missing_secrets(recipe, environ)):  # a dry run warns (run_recipe)
                raise ConfigError(req.recipe, missing)
        except ConfigError as exc:  # the options' problems (container mode needs an image) beside the recipe's
            if pending is None:
                raise
            raise joined(pending, exc, "launch") from None
        if pending is not None:
            raise pending
        target = local_target_of(req, recipe)
        if recipe.mode == "container" and recipe.image and probe_image:
            layout, recipe, layout_note = layout_of_image(recipe, pull=not dry_run, docker=req.docker)
    out = Path(req.out) if req.out else paths.run_dir(recipe.exp_id)
    python = req.python or (sys.executable if req.in_place else None)
    return target, ResolvedRun(recipe, stack, out.resolve(), req.recipe, environ, req.catalog, tuple(req.skip_checks),
                               req.network_checks,
                               python=python, layout=layout, layout_note=layout_note)


def joined(pending: RecipeProblems, exc: SlimeforgeError, where: str) -> RecipeProblems:
    """The recipe's problems with what the next step found: its problems (a key of the recipe keeps
    its name, anything else names the step's source), or its message as one problem at `where`."""
    if not isinstance(exc, ConfigError):
        return pending.joined([Problem(where, exc.headline(), show_value=False)])
    return pending.joined([Problem(f"{p.where} ({exc.source})" if top(p.where) not in Recipe.model_fields else p.where,
                                   p.message, p.value, p.accepted, p.show_value) for p in exc.problems])


def missing_secrets(recipe: Recipe, environ: dict[str, str]) -> list[Problem]:
    """A local launch's secrets come from this environment: one named but not set would be missing in the job."""
    return [Problem(f"secret_env.{i}", "is not set in this environment, so the job would run without it", name,
                    f"export {name}=... in the shell that runs `invoke run`, or remove it from secret_env")
            for i, name in enumerate(recipe.secret_env) if not environ.get(name)]


def local_target(recipe: Recipe, address: str | None, cluster: str | None = None, **options: Any) -> Target:
    """Host or container mode; a running Ray cluster's Jobs API, from here, when it has an address."""
    if address:
        from .targets.jobsubmit import Cluster, ClusterTarget

        check_address(address)
        return ClusterTarget(Cluster(cluster or address, address))
    make = HostTarget if recipe.mode == "host" else ContainerTarget
    return make(None, **options)


def run_recipe(req: LaunchRequest, *, dry_run: bool, find_cluster: FindCluster | None = None,
               stream: IO[str] | None = None,
               runner: Runner | None = None, environ: dict[str, str] | None = None, plan_json: bool = False) -> int:
    """`invoke run` and `SlimeRunner.train()`: plan; then print it (dry run: the run directory is
    written, nothing starts; `plan_json`: as slimeforge.run-plan/1, docs/json.md) or apply it
    (preflight, write the run directory, run the plan's commands); the job's exit code. `runner`:
    a proc.Runner (a dry-run one records argv lists)."""
    stream = stream or sys.stdout
    target, run = resolve(req, dry_run=dry_run, find_cluster=find_cluster, environ=environ,
                          probe_image=not (runner and runner.dry_run))
    plan = target.plan(run)
    if dry_run:
        from .localpaths import dry_run_warnings
        from .runrecord import guard_render

        # A dry run renders into the run directory too: never over a live run's record; an ended one's goes to
        # history/<n>/.
        kept = guard_render(plan.rundir.path, exp_id=plan.run.recipe.exp_id)
        write_run_dir(plan.rundir)
        # The same warnings whether the plan is read or parsed: on stderr, and in the JSON document.
        warnings = list(dry_run_warnings(plan.run.recipe, plan.run.environ))
        if isinstance(target, (HostTarget, ContainerTarget)):
            warnings += [f"{p} (a launch refuses it)" for p in missing_secrets(plan.run.recipe, plan.run.environ)]
        from ..schema import printable

        warnings = [printable(w) for w in warnings]
        if plan_json:
            from ..console import json_doc

            stream.write(json_doc("slimeforge.run-plan/1", {**plan_doc(plan), "kept_history": kept or None,
                                                            "warnings": warnings}) + "\n")
        else:
            if kept:
                stream.write("the record of the earlier launch is kept in "
                             f"{plan.rundir.path / 'history' / str(kept)}\n")
            stream.write("\n".join(describe(plan)) + "\n")
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
        return 0
    return apply(target, plan, runner or Runner(), stream)


def apply(target: Target, plan: LaunchPlan, runner: Runner, stream: IO[str]) -> int:
    def say(text: str) -> None:
        stream.write(text + "\n")
        stream.flush()

    return target.apply(plan, runner, say, stream)


def launch(recipe: Recipe, stack: Stack, out: str | os.PathLike | None = None, recipe_path: str = "(api)", *,
           runner: Runner | None = None, stream: IO[str] | None = None, environ: dict[str, str] | None = None,
           slurm_options: SlurmOptions | None = None, **options: Any) -> int:
    """A parsed recipe (tests, benchmarks, scripts) through `invoke run`'s one path: its keys and
    `options` (LaunchRequest's fields by keyword: address, mode, image, prefix, catalog, skip_checks,
    head_args, ...) -> resolve -> the target's plan -> preflight and apply; the job's exit code
    (0 = SUCCEEDED). `slurm_options`: an sbatch allocation (targets/slurm.py's Options).
    Raises ConfigError (PreflightError: every problem, each with its fix) before anything starts."""
    del stack  # the recipe names its stack: resolve loads it again, with every check of the recipe
    if slurm_options is not None:
        o = slurm_options
        options.update(slurm=True, partition=o.partition, account=o.account, time=o.time, nodes=o.nodes,
                       start_timeout=o.start_timeout)
    options = sequences_as_tuples(options)
    req = LaunchRequest(recipe=recipe_path, data=recipe.model_dump(mode="json"), out=None if out is None else str(out),
                        **options)
    return run_recipe(req, dry_run=False, runner=runner, stream=stream, environ=environ)


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
        raise ConfigError(str(run_dir), [Problem("run directory", "has no plan.json", str(run_dir),
                                                 "runs/<exp_id> of a rendered recipe")])
    if plan.get("target") == "ray-cluster":
        from .targets.jobs import recorded
        from .targets.jobsubmit import Cluster, ClusterTarget

        address = recorded(run_dir).address
        return ClusterTarget(Cluster(address, address))
    return HostTarget() if plan["recipe"].get("mode") == "host" else ContainerTarget()
