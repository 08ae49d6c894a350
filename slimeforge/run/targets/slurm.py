"""The Slurm target: Ray started inside an `sbatch` allocation, on the host or in the image (pyxis).

Order: check the options (grammar) -> plan: the run directory, plus `slurm.sbatch` and the node
agent, and the sbatch argv -> preflight: the recipe's checks (model, data, flags, AWS) and the
cluster's (targets/slurm_checks.py) -> write the run directory -> `sbatch --parsable` -> record the
job id in <run dir>/slurm_job_id -> follow the job's output file until the job ends -> its exit code.

Inside the allocation (templates/slurm.sbatch.j2) the node agent checks every node, starts the
Ray head on the first node and a worker on each other (srun --overlap, one task per node; the
argv is `ray_argv` here), holds the job behind the health gate of `cluster.up`, then runs
launch.sh against that cluster.

We cancel only the job id we recorded (`scancel -- ID`), after proving it is this run's: the
caller's job, named sf-<exp_id>, with the comment slimeforge:<run token> given at submit, the run
directory as working directory and the recorded submit time (run/ownership.py); never by name or user.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal, NotRequired, TypedDict

from ... import __version__, rayports, readback, scripts
from ...atomic import write_file
from ...errors import ConfigError, OperationFailed, Problem, SlimeforgeError
from ...proc import Runner
from ...schema import printable
from ...templating import render
from .. import ownership
from ..recipe import Recipe
from ..rundir import amend_plan, build_run_dir, read_plan, write_run_dir
from ..runrecord import (
    JOB_ID_RE,
    RunRecord,
    Unreachable,
    guard_render,
    job_info,
    new_run_token,
    read_run,
    slurm_check,
    write_run_token,
)
from . import enroot
from .base import Command, LaunchPlan, Mount, ResolvedRun, RunStatus, Say, Target, layout_line
from .local import ContainerTarget, host_tools
from .mounts import container_mounts, pyxis_mounts_arg
from .slurm_checks import cluster_findings, enroot_findings

IMAGE_PLACEHOLDER = ContainerTarget.IMAGE_PLACEHOLDER  # a dry run without an image, as `invoke run --dry-run` shows it

# Grammars (re.fullmatch): what Slurm accepts for these names, less anything a shell or an
# #SBATCH line could read as syntax.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
TIME_RE = re.compile(r"(?:([0-9]{1,3})-)?([0-9]{1,2}):([0-5][0-9]):([0-5][0-9])")
MAX_NODES = 4096
# every port fixed as cluster.up does (rayports.py), so the checks can test them
RAY_AGENT_PORT = rayports.DEFAULTS["dashboard_agent_listen_port"]
START_TIMEOUT_S = 300
VISIBLE = "visible.token"  # in the run directory: each node reads it back (the run directory is shared)
# Bounded waits: sbatch retries a controller that does not answer for a while (MessageTimeout,
# its own retries), then gives up; an import pulls the whole image once (tens of GB at worst).
SBATCH_TIMEOUT_S = 300
IMPORT_TIMEOUT_S = 4 * 3600
UNANSWERED_S = 600.0  # follow: how long Slurm may leave the job's state untold before we stop following
ENDED = ownership.SLURM_ENDED


@dataclass(frozen=True)
class Options:
    """`invoke run --slurm` options; None means: the cluster's default (partition, account, time)
    or the recipe's `num_nodes`."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    nodes: int | None = None
    system_python: str = "python3"  # runs the node agent on each node (standard library only)
    start_timeout: int = START_TIMEOUT_S  # seconds for the head, then for every node, to be ALIVE in Ray
    squashfs_dir: str | None = None  # container mode: import the image once to a squashfs here (shared by every node)


def options(partition: str | None = None, account: str | None = None, time: str | None = None,
            nodes: int | str | None = None,
            squashfs_dir: str | None = None) -> Options:
    """Options from the command line (strings), checked; ConfigError lists every problem."""
    if isinstance(nodes, str):
        nodes = int(nodes) if re.fullmatch(r"[1-9][0-9]{0,5}", nodes) else nodes  # else reported below
    opts = Options(partition=partition, account=account, time=time, nodes=nodes, squashfs_dir=squashfs_dir)  # type: ignore[arg-type]
    problems = check_options(opts)
    if problems:
        raise ConfigError("--slurm options", problems)
    return opts


def check_options(opts: Options) -> list[Problem]:
    problems = []
    for name in ("partition", "account"):
        value = getattr(opts, name)
        if value is not None and not NAME_RE.fullmatch(value):
            problems.append(Problem(f"--{name}", "is not a Slurm name", value,
                                    "letters, digits, '_', '.', '-' (up to 64), starting with a letter or digit"))
    if opts.time is not None and not ((m := TIME_RE.fullmatch(opts.time)) and any(int(g or 0) for g in m.groups())):
        # All zeros is no limit at all to Slurm (--time=0 means infinite), never a timeout.
        problems.append(Problem("--time", "is not a time limit", opts.time,
                                "[D-]HH:MM:SS, more than zero, e.g. 04:00:00 or 2-00:00:00"))
    if opts.nodes is not None and not (isinstance(opts.nodes, int) and not isinstance(opts.nodes, bool)
                                       and 1 <= opts.nodes <= MAX_NODES):
        problems.append(Problem("--nodes", "is not a node count", opts.nodes, f"an integer from 1 to {MAX_NODES}"))
    if not (isinstance(opts.start_timeout, int) and 1 <= opts.start_timeout <= 86400):
        problems.append(Problem("start_timeout", "is not a number of seconds", opts.start_timeout,
                                "an integer from 1 to 86400"))
    if not re.fullmatch(r"[A-Za-z0-9_./+-]{1,4096}", opts.system_python):
        problems.append(Problem("system_python", "is not a program name or path", opts.system_python,
                                "a path without spaces or shell syntax"))
    if opts.squashfs_dir is not None:
        problems += enroot.squashfs_problems(opts.squashfs_dir)
    return problems


def on_slurm(recipe: Recipe, opts: Options) -> Recipe:
    """The recipe as it runs on Slurm: --nodes as num_nodes (slime's --actor-num-nodes follows it)."""
    return recipe.model_copy(update={"num_nodes": opts.nodes}) if opts.nodes is not None else recipe


# --- rendering --------------------------------------------------------------------------------


def job_name(recipe: Recipe) -> str:
    return f"sf-{recipe.exp_id}"


def ray_argv(recipe: Recipe, ray: str, *, head: bool) -> list[str]:
    """`ray start --block` for a node of the allocation; the node agent fills in @HEAD_IP@, @NODE_IP@, @NODE@, @JOB@."""
    argv = [ray, "start", "--block"]
    if head:
        # The dashboard (Jobs API) on the cluster network only: it has no authentication.
        argv += ["--head", "--dashboard-host", "@NODE_IP@"]
    else:
        argv += ["--address", f"@HEAD_IP@:{recipe.ray_port}"]
    return argv + [
        "--node-ip-address", "@NODE_IP@",
        "--num-gpus", str(recipe.num_gpus),
        # Every port pinned, with cluster.up's defaults (rayports.py; docs/cluster.md's firewall table).
        *rayports.node_argv(ray_ports(recipe), head),
        # Short (Ray's socket paths live below it), per job and node: nodes may share /tmp.
        "--temp-dir", "/tmp/sfr-@JOB@-@NODE@",
        "--disable-usage-stats",
    ]


def ray_ports(recipe: Recipe) -> dict[str, int]:
    """cluster.up's default ports, with the recipe's GCS and dashboard ports."""
    return {**rayports.DEFAULTS, "port": recipe.ray_port, "dashboard_port": recipe.ray_dashboard_port}


class EnrootImage(TypedDict):
    """What plan.json records of the image as pyxis gets it: enroot's version and form of the
    reference; with --squashfs-dir, the file it is imported to and whether it was there already."""

    enroot: str | None
    enroot_said: str
    reference: str
    squashfs: NotRequired[str]
    squashfs_ready: NotRequired[bool]


class NodePath(TypedDict):
    """A path the node agent's slurm-check looks for on each node (or the head only)."""

    what: str  # the recipe field, for its message
    path: str
    kind: Literal["model", "file", "dir"]
    head_only: NotRequired[bool]


def node_paths(recipe: Recipe, image_file: str | None) -> list[NodePath]:
    """What each node must see before Ray starts: the model (with config.json) on every node (any
    node may load it: colocated training and rollout), the data on the head, a squashfs image on every node."""
    paths: list[NodePath] = [{"what": "model_dir", "path": recipe.model_dir, "kind": "model"},
                                   {"what": "data_path", "path": recipe.data_path, "kind": "file", "head_only": True}]
    paths += [{"what": f"eval_data.{name}", "path": p, "kind": "file", "head_only": True}
              for name, p in recipe.eval_data.items()]
    if recipe.mode == "host":  # in container mode slime is in the image
        paths.append({"what": "slime_dir", "path": recipe.slime_dir, "kind": "dir", "head_only": True})
    if image_file:
        paths.append({"what": "squashfs image", "path": image_file, "kind": "file"})
    return paths


def sbatch_vars(recipe: Recipe, run_dir: Path, opts: Options, mounts: tuple[Mount, ...], *, python: str, ray: str,
                env_bin: str | None, container_image: str | None = None, marker: str = "0" * 32) -> dict[str, object]:
    """`container_image`: pyxis's --container-image (enroot's form of recipe.image, or a squashfs file);
    `marker`: the random token of this render, in <run dir>/visible.token and checkpoint_dir's marker."""
    nodes = opts.nodes or recipe.num_nodes
    container = recipe.mode == "container"
    container_args = [f"--container-image={container_image or recipe.image or IMAGE_PLACEHOLDER}",
                      f"--container-mounts={pyxis_mounts_arg(mounts)}",
                      f"--container-workdir={run_dir}"] if container else []
    checkpoint = {"dir": recipe.resolved_checkpoint_dir, "token": marker}
    image_file = container_image if container and container_image and container_image.startswith("/") else None
    ray_cmd = "ray" if container else ray
    node_ports = rayports.fixed_ports(ray_ports(recipe), head=False)
    head_ports = [p for p in rayports.fixed_ports(ray_ports(recipe), head=True) if p not in node_ports]
    return {
        "version": __version__,
        "exp_id": recipe.exp_id,
        "job_name": job_name(recipe),
        "nodes": nodes,
        "gpus": recipe.num_gpus,
        "partition": opts.partition,
        "account": opts.account,
        "time": opts.time,
        "run_dir": str(run_dir),
        "system_python": opts.system_python,
        "checkpoint_dir": recipe.resolved_checkpoint_dir,
        "env_bin": None if container else env_bin,
        "python": "python3" if container else python,
        "dashboard_port": recipe.ray_dashboard_port,
        "container_args": container_args,
        "check_params": json.dumps({"gpus": recipe.num_gpus, "ports": node_ports, "head_ports": head_ports,
                                    "programs": [] if container else [ray],
                                    "visible": {"path": str(run_dir / VISIBLE), "token": marker},
                                    "paths": node_paths(recipe, image_file), "checkpoint": checkpoint}),
        "table_params": json.dumps({"gpus": recipe.num_gpus}),
        "mark_params": json.dumps({"checkpoint": checkpoint}),
        "unmark_params": json.dumps({"checkpoint": checkpoint, "remove": True}),
        "head_params": json.dumps({"argv": ray_argv(recipe, ray_cmd, head=True)}),
        "worker_params": json.dumps({"argv": ray_argv(recipe, ray_cmd, head=False)}),
        "gate_head": json.dumps({"gcs_port": recipe.ray_port, "timeout": opts.start_timeout}),
        "gate_all": json.dumps({"gpus": recipe.num_gpus, "dashboard_port": recipe.ray_dashboard_port,
                                "timeout": opts.start_timeout}),
    }


def agent_files() -> dict[str, str]:
    """The node agent and the allocation's own steps, each one program with its helper modules
    inside (node_agent.py also goes to every node on srun's stdin)."""
    return {"node_agent.py": scripts.node_agent_program(),
            "slurm_agent.py": scripts.program("slurm_agent", "hostrecord", "node_agent")}


def sbatch_argv(run_dir: Path, run_token: str | None = None) -> list[str]:
    # --chdir: the job runs in the run directory, where #SBATCH --output puts slurm-<jobid>.out.
    # --comment: the run token, which run.stop compares before it cancels (a reused job id lacks it).
    comment = [f"--comment={ownership.SLURM_COMMENT_PREFIX}{run_token}"] if run_token else []
    return ["sbatch", "--parsable", f"--chdir={run_dir}", *comment, "--", str(run_dir / "slurm.sbatch")]


# --- the target -------------------------------------------------------------------------------


class SlurmTarget(Target):
    name = "slurm"

    def __init__(self, opts: Options, *, follow_log: bool = True, probe: Runner | None = None):
        """probe: runs `enroot version` on this (login) node (default: a real Runner, also in dry runs: it only
        reads)."""
        problems = check_options(opts)
        if problems:
            raise ConfigError("--slurm options", problems)
        self.opts, self.follow_log, self.probe = opts, follow_log, probe or Runner()

    def container_image(self, recipe: Recipe) -> tuple[str | None, EnrootImage | None]:
        """pyxis's --container-image: the image in this login node's enroot's form, or (--squashfs-dir)
        the squashfs file it is imported to; and what plan.json records of it."""
        if recipe.mode != "container" or recipe.image is None:
            return None, None
        version, said = enroot.read_version(self.probe)
        ref = enroot.reference(recipe.image,
                               version or enroot.DOCKER_FORM)  # unknown: enroot 4's form; preflight refuses
        info: EnrootImage = {"enroot": enroot.show(version) if version else None, "enroot_said": said, "reference": ref}
        if self.opts.squashfs_dir is None:
            return ref, info
        sqsh = enroot.squashfs_file(self.opts.squashfs_dir, recipe.image)
        # What is at the digest's name is judged by its content and slimeforge's record of it: the
        # pinned image as imported (used), nothing (imported), anything else (refused, named).
        info["squashfs"], info["squashfs_ready"] = str(sqsh), enroot.squashfs_ready(sqsh, recipe.image)
        return str(sqsh), info

    def mounts(self, run: ResolvedRun) -> tuple[Mount, ...]:
        return container_mounts(run.recipe, run.out) if run.recipe.mode == "container" else ()

    def plan(self, run: ResolvedRun) -> LaunchPlan:
        """The run directory of `invoke run`, plus slurm.sbatch and the node agent; the sbatch argv."""
        recipe, opts = run.recipe, self.opts
        mounts = self.mounts(run)
        # pyxis reads --container-mounts as SRC:DST[:FLAGS][,...]: no way to escape these two.
        problems = [Problem(m.what, "cannot be mounted with pyxis (--container-mounts splits at ',' and ':')", m.path,
                            "a path without ',' and ':'")
                    for m in mounts if "," in m.path or ":" in m.path]
        if opts.squashfs_dir is not None and recipe.mode != "container":
            problems.append(Problem("--squashfs-dir", "goes with container mode (it holds the image pyxis runs)",
                                    opts.squashfs_dir,
                                    "--mode container, or leave it out"))
        if problems:
            raise ConfigError("--slurm options", problems)
        rundir = build_run_dir(recipe, run.stack, run.out, run.recipe_path, run.environ, run.layout)
        py, ray = host_tools(recipe)
        python = run.environ.get("SLIMEFORGE_PYTHON") or py
        env_bin = str(Path(ray).parent) if os.sep in ray else None
        image, image_info = self.container_image(recipe)
        marker = new_run_token()  # random: a node that reads it back sees this render of the run directory
        files = {"slurm.sbatch": render("slurm.sbatch.j2", sbatch_vars(recipe, rundir.path, opts, mounts,
                                                                       python=python, ray=ray, env_bin=env_bin,
                                                                       container_image=image, marker=marker)),
                 **agent_files(), VISIBLE: marker + "\n"}
        # this submission's identity: the job's comment, launch.sh's head record and job metadata
        token = new_run_token()
        argv = sbatch_argv(rundir.path, token)
        commands = []
        sqsh = image_info.get("squashfs") if image_info else None
        # one pull, here, for every node (and every later run, while the record holds)
        if image_info and sqsh and not image_info.get("squashfs_ready"):
            partial = enroot.partial(Path(sqsh), token)
            commands.append(Command(tuple(enroot.import_argv(image_info["reference"], partial)), "enroot import"))
        # sbatch hands its environment to the job (--export=ALL, Slurm's default): launch.sh reads the token there.
        commands.append(Command(tuple(argv), "sbatch", (("SLIMEFORGE_RUN_TOKEN", token),)))
        rundir = amend_plan(rundir, files, target=self.name, commands=[list(c.argv) for c in commands],
                            slurm={"partition": opts.partition, "account": opts.account, "time": opts.time,
                                   "nodes": opts.nodes or recipe.num_nodes,
                                   **(image_info or {})})
        notes: tuple[str, ...] = () if image_info is None or image_info["enroot"] else (
            f"enroot's version could not be read here ({image_info['enroot_said']}): the image is named in enroot 4's "
            "form; "
            "a launch reads it first, and refuses without it",)
        if recipe.mode == "container" and not recipe.image:  # a dry run only: resolve refuses a launch without one
            notes += (f"no image given: {IMAGE_PLACEHOLDER} stands for --image, or `image:` in the recipe",)
        return LaunchPlan(self.name, run, rundir, tuple(commands), mounts, notes=notes, run_token=token)

    def preflight(self, plan: LaunchPlan, runner: Runner, say: Say) -> None:
        from .. import preflight as doctor

        run = plan.run
        # This machine is a login node: the host checks (GPUs, ports) run on each node in the allocation,
        # and the kernel check (scope gpu) only where it is asked for (invoke doctor --kernels).
        only = [name for name, chk in doctor.CHECKS.items() if chk.scope not in ("host", "gpu") and name != "versions"]
        report = doctor.run_checks(run.recipe, run.stack, args=plan.rundir.args, catalog=run.catalog,
                                   skip=run.skip_checks, only=only,
                                   network=run.network_checks, environ=run.environ)
        report.findings += cluster_findings(run.recipe, self.opts, runner)
        report.findings += enroot_findings(run.recipe, plan.rundir.plan["slurm"], self.opts.squashfs_dir)
        if (layout := layout_line(run)) is not None:
            say(layout)
        say(report.table())
        if report.errors:
            raise doctor.PreflightError(f"preflight of {run.recipe_path} (Slurm)", report)

    def apply(self, plan: LaunchPlan, runner: Runner, say: Say, stream: IO[str]) -> int:
        """Preflight, sbatch, follow; the job's exit code (0 when not following)."""
        self.preflight(plan, runner, say)
        if not runner.dry_run:
            guard_render(plan.rundir.path, runner,
                         # a live run's directory is never rewritten; an ended one's record goes to history/<n>/
                         plan.run.recipe.exp_id)
        write_run_dir(plan.rundir)
        Path(plan.run.recipe.resolved_checkpoint_dir).mkdir(parents=True, exist_ok=True)
        run_dir = plan.rundir.path
        assert plan.run_token is not None, "a Slurm plan carries its run token"
        sqsh = plan.rundir.plan["slurm"].get("squashfs")
        for cmd in plan.commands[:-1]:  # enroot import: once, before a node is allocated
            import_squashfs(cmd, Path(sqsh), runner, say, str(plan.run.recipe.image))
        if sqsh and not runner.dry_run and not enroot.squashfs_ready(Path(sqsh), str(plan.run.recipe.image)):
            raise ConfigError("--squashfs-dir", [Problem(sqsh,
                                                         "was there when the launch was planned, and is gone now", None,
                                                         "run again: the launch imports it", show_value=False)])
        job_id = submit(run_dir, plan.commands[-1], runner, plan.run_token)
        if runner.dry_run:
            return 0
        say(f"[slimeforge] submitted Slurm job {job_id} ({job_name(plan.run.recipe)}); output "
            f"{run_dir / f'slurm-{job_id}.out'}")
        if not self.follow_log:
            return 0
        try:
            return follow(run_dir, job_id, stream, runner)
        except KeyboardInterrupt:
            say(f"\n[slimeforge] stopped following; job {job_id} keeps running: `invoke run.stop {run_dir}` cancels it")
            return 130

    def status(self, rundir: Path) -> RunStatus:
        st = status(rundir)
        reason = f" ({st['reason']})" if st["reason"] not in (None, "None") else ""
        lines = (f"Slurm job {st['slurm_job_id']}: {st['state']}" + reason
                 + (f", exit code {st['exit_code']}" if st["exit_code"] else ""),
                 f"  nodes {st['nodes']}; restarts {st['restarts']}; Ray submission "
                 f"{st['submission_id'] or '(not yet)'}",
                 f"  output {st['output']}")
        return RunStatus(lines, st)

    def logs(self, rundir: Path, follow: bool, stream: IO[str]) -> int | None:
        return logs(rundir, follow_logs=follow, stream=stream)

    def stop(self, rundir: Path, *, head: bool = False, say: Say = print, runner: Runner | None = None) -> int:
        return stop(rundir, runner=runner, say=say)  # Ray in the allocation ends with the job: `head` adds nothing


def import_squashfs(cmd: Command, sqsh: Path, runner: Runner, say: Say, image: str) -> None:
    """`enroot import` to a partial file beside `sqsh`, checked (a whole squashfs), hashed, linked
    into place and recorded (enroot.record_import: all or nothing); a file another run put there
    meanwhile is used only when it is the recorded import of this image."""
    partial = Path(cmd.argv[cmd.argv.index("--output") + 1])
    say(f"[slimeforge] importing the image once, for every node: {sqsh}")
    try:
        runner.run(list(cmd.argv), step=cmd.step, capture=False, timeout=IMPORT_TIMEOUT_S)
        if not runner.dry_run:
            enroot.record_import(partial, sqsh, image)
    finally:
        if os.path.lexists(partial) and not os.path.islink(partial) and os.path.isfile(partial):
            partial.unlink()  # ours: its name carries this launch's token


def submit(run_dir: Path, sbatch: Command, runner: Runner, run_token: str) -> str:
    """sbatch (its argv carries the run token as --comment, its environment as SLIMEFORGE_RUN_TOKEN);
    records the run token first, then the job id and when it was submitted, before returning the id."""
    if not runner.dry_run:
        write_run_token(run_dir, run_token)
    submitted_at = time.time()
    result = runner.run(list(sbatch.argv), step=sbatch.step, env=dict(sbatch.set_env), timeout=SBATCH_TIMEOUT_S)
    if runner.dry_run:
        return "DRYRUN"
    lines = [line.strip() for line in result.stdout[:1 << 16].splitlines() if line.strip()]
    m = re.fullmatch(r"([0-9]{1,12})(?:;[A-Za-z0-9_.-]{1,64})?",
                     lines[0]) if len(lines) == 1 else None  # --parsable: "ID" or "ID;CLUSTER"
    job_id = m.group(1) if m else ""
    if not JOB_ID_RE.fullmatch(job_id):
        # sbatch exited 0: a job may be queued that this run cannot name. Say so, never guess its id.
        raise OperationFailed("sbatch: expected a job id (--parsable: ID or ID;CLUSTER), got "
                              f"{printable(result.stdout[:300])!r}; "
                              "a job may have been queued all the same: `squeue --me -o '%i %j %k'` lists your jobs "
                              "with their comments "
                              f"(this run's is {ownership.SLURM_COMMENT_PREFIX}{run_token}); `scancel ID` it if it is "
                              "there")
    write_file(run_dir / "slurm_job_id", job_id + "\n")
    write_file(run_dir / "slurm_submitted_at", f"{submitted_at:.3f}\n")
    return job_id


# --- a recorded Slurm run ---------------------------------------------------------------------


def is_slurm_run(run_dir: str | os.PathLike) -> bool:
    """A run directory whose last render was for Slurm (a later plain `invoke run` rewrites
    plan.json without the "slurm" key) and that was submitted. Its records are judged by the reader
    of whichever kind it is: a bad one is an error there, naming the file."""
    try:
        plan = read_plan(run_dir)
    except ConfigError:
        return False
    return plan is not None and "slurm" in plan and (Path(run_dir) / "slurm_job_id").is_file()


def exit_code(info: dict[str, str]) -> int:
    """ExitCode=N:S of the batch script: N, or 128+S when a signal ended it; 1 if unknown."""
    m = re.fullmatch(r"(\d+):(\d+)", info.get("ExitCode", ""))
    if not m:
        return 1
    code, sig = int(m.group(1)), int(m.group(2))
    return code if code or not sig else 128 + sig


def follow(run_dir: Path, job_id: str, stream: IO[str], runner: Runner | None = None, poll: float = 1.0) -> int:
    """Copy the job's output file to `stream` as it grows, until the job has ended; its exit code."""
    out_file = run_dir / f"slurm-{job_id}.out"
    pos = 0
    last_state = ""
    silent_since: float | None = None  # since when Slurm has not answered clearly
    while True:
        try:
            info = job_info(job_id, runner)
            silent_since = None
        except Unreachable as exc:
            # Cannot tell is not "ended": keep following, and give up only after a long silence.
            if silent_since is None:
                silent_since = time.monotonic()
                stream.write(f"[slimeforge] job {job_id}: {exc}; asking again\n")
            if time.monotonic() - silent_since >= UNANSWERED_S:
                raise SlimeforgeError(f"Slurm has not answered clearly about job {job_id} for {UNANSWERED_S:.0f}s: "
                                      f"{exc}; "
                                      f"`invoke run.status {run_dir}` asks again") from None
            time.sleep(poll)
            continue
        state = info.get("JobState", "")
        if state != last_state:
            stream.write(f"[slimeforge] job {job_id}: "
                         f"{state or 'unknown to Slurm'}" + (f" ({info['Reason']})" if info.get("Reason",
                                                                                                "None") != "None"
                                                             else "") + "\n")
            last_state = state
        if stat.S_ISREG(os.lstat(out_file).st_mode) if os.path.lexists(out_file) else False:  # never a FIFO or a link
            with out_file.open(errors="replace") as f:
                f.seek(pos)
                chunk = f.read()
                pos = f.tell()
            if chunk:
                stream.write(chunk)
        stream.flush()
        if not info or state in ENDED:
            if info and not os.path.lexists(out_file) and info.get("NodeList"):
                # The batch host writes it in the run directory: not here means it sees another one.
                stream.write(f"[slimeforge] job {job_id} ended ({state}) and its output {out_file} is not here: the "
                             "batch host "
                             f"(first of {info['NodeList']}) could not write it there; put --out on a filesystem "
                             "every node mounts\n")
            return exit_code(info) if info else 1
        time.sleep(poll)


def _proved(run_dir: str | os.PathLike, runner: Runner | None) -> tuple[RunRecord, dict[str, str], ownership.Verdict]:
    rec = read_run(run_dir)
    if rec.slurm_job_id is None:
        raise ConfigError(str(run_dir), [Problem("slurm_job_id", "this run directory was never submitted to Slurm",
                                                 None,
                                                 "`invoke run RECIPE --slurm` first", show_value=False)])
    try:
        info, verdict = slurm_check(rec, runner)
    except Unreachable as exc:
        raise SlimeforgeError(f"{rec.run_dir}: {exc}") from None
    if verdict.state == ownership.FOREIGN:
        raise SlimeforgeError(f"{rec.run_dir}: refused: {verdict.reason}")
    return rec, info, verdict


class SlurmStatusDoc(TypedDict):
    """run.status --json of a Slurm run (slimeforge.run-status/1, docs/json.md): Slurm's words as it said them."""

    run_dir: str
    slurm_job_id: str | None
    state: str
    reason: str | None
    nodes: str | None
    exit_code: str | None
    restarts: str | None
    submission_id: str | None
    verdict: str
    output: str


def status(run_dir: str | os.PathLike, runner: Runner | None = None) -> SlurmStatusDoc:
    rec, info, verdict = _proved(run_dir, runner)
    return {"run_dir": str(rec.run_dir), "slurm_job_id": rec.slurm_job_id, "state": info.get("JobState",
                                                                                             "unknown to Slurm (ended "
                                                                                             "a while ago?)"),
            "reason": info.get("Reason"), "nodes": info.get("NodeList"), "exit_code": info.get("ExitCode"),
            "restarts": info.get("Restarts"), "submission_id": rec.submission_id, "verdict": verdict.reason,
            "output": str(rec.run_dir / f"slurm-{rec.slurm_job_id}.out")}


def logs(run_dir: str | os.PathLike, follow_logs: bool = False, stream: IO[str] | None = None,
         runner: Runner | None = None) -> int | None:
    stream = stream or sys.stdout
    rec, _, _ = _proved(run_dir, runner)
    job_id = rec.slurm_job_id
    assert job_id is not None
    if follow_logs:
        return follow(rec.run_dir, job_id, stream, runner)
    out = rec.run_dir / f"slurm-{job_id}.out"
    try:
        data = readback.read_bytes(out, out.name, "the job's output file", max_bytes=1 << 30)
    except readback.RecordError as exc:
        raise SlimeforgeError(str(exc)) from None
    stream.write(data.decode(errors="replace") if data is not None else f"(no output yet: {out})\n")
    return None


def stop(run_dir: str | os.PathLike, runner: Runner | None = None, say=print) -> int:
    """scancel the recorded job, and only it: its id, after proving it is this run's (user, name,
    comment token, working directory, submit time). Returns the exit code: 0 when it was cancelled
    or had already ended, 1 when it was refused or not recorded."""
    runner = runner or Runner()
    rec = read_run(run_dir)
    job_id = rec.slurm_job_id
    if job_id is None:
        say(f"none: {rec.run_dir}: no Slurm job recorded; nothing to stop")
        return 1
    try:
        _, verdict = slurm_check(rec, runner)
    except Unreachable as exc:
        say(f"failed: {exc}")
        return 1
    if verdict.state == ownership.ENDED:
        say(f"ended: {verdict.reason}")
        return 0
    if verdict.state == ownership.FOREIGN:
        say(f"refused: {verdict.reason}; not cancelled")
        return 1
    r = runner.run(["scancel", "--", job_id], step="scancel", check=False, timeout=60)
    if r.returncode != 0:
        say(f"failed: scancel {job_id} exited with {r.returncode}: "
            f"{printable((r.stderr or r.stdout).strip()[-300:])!r}")
        return 1
    say(f"stopped: Slurm job {job_id}: cancel sent (Ray and the job in the allocation stop with it)")
    return 0
