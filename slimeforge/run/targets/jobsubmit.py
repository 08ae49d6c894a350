"""A running Ray cluster (`invoke run --cluster INVENTORY`, or `--address http://HEAD:8265`):
the job is submitted FROM THIS MACHINE through Ray's Jobs API. Nothing runs here but the client:
no container, no GPU, no image. The entrypoint (job.sh, templates/job.sh.j2) runs on the head in
the cluster's own environment (cluster.up runs Ray in the inventory's image, or from its prefix).

The run directory's files the job reads (job.sh, agentcore.yaml) travel with the submission as
the runtime env's `working_dir` (only those: not job.log, history/ or the records), and the flags
that named them in the run directory name them relative to the working directory, where Ray
unpacks them on every node that runs a task of the job. A flag naming any other file of the run
directory is refused: it would exist only on this machine.

What the inventory says (mode, image, prefix; the recipe's paths against its volumes, hosts and
GPUs; the live checks on every host) comes in as a `Cluster` built by the cluster layer, its checks a
`ClusterChecks` (cluster/runcheck.py, handed in by tasks.py): this layer never imports that one. With `--address`
there is no inventory, so nothing is compared (a note says so).

status, logs and stop read the Jobs API records (targets/jobs.py); the job's metadata carries the
run token (ownership.py), so run.stop proves the job is this run's before stopping it.
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Protocol

from ... import __version__, paths
from ...atomic import write_file
from ...errors import ConfigError, OperationFailed, Problem, SlimeforgeError
from ...image.stack import Stack
from ...proc import Runner
from ...templating import render
from .. import ownership
from ..headstate import check_address
from ..modechoice import resolve_mode
from ..modelscript import MODEL_ARGS_BASH
from ..recipe import Recipe
from ..rundir import RunDir, amend_plan, build_run_dir
from ..runrecord import new_run_token
from . import jobs
from .base import Command, LaunchPlan, Mount, ResolvedRun, Say
from .jobsapi import JobInfo, JobsApi, NoAnswer, check_versions

JOB_FILES = ("job.sh", "agentcore.yaml")  # the working_dir: what the job reads of the run directory
ENTRYPOINT = "bash job.sh"
# Checks of the doctor that mean the same on a cluster as here (the rest read this host's GPUs,
# ports and paths: the cluster's hosts are checked by Cluster.checks.preflight instead).
LOCAL_CHECKS = ("flags", "versions", "aws-credentials", "s3", "agentcore", "wandb")
# With an inventory, AWS is checked on every host (cluster/credentials.py), never with this machine's credentials.
CLUSTER_CHECKS = ("flags", "versions", "wandb")
HEAL_WAIT_S = 600  # --max-restarts: how long the cluster has to be whole again
PENDING_WAIT_S = 300  # --detach: returns when the job runs, or says it is still PENDING after this long


class ClusterChecks(Protocol):
    """What an inventory knows of its cluster, asked by the run layer at each step of a launch
    (cluster/runcheck.InventoryChecks implements it over the inventory, ssh and the node agents;
    this layer never imports that one). Each raises naming the hosts and the fix when it refuses."""

    def adopt(self, recipe: Recipe, mode_given: bool) -> Recipe:
        """The recipe with the cluster's mode/image/prefix where it names none (`mode_given`: the recipe or the command
        line chose)."""
        ...

    def check(self, recipe: Recipe) -> list[Problem]:
        """Static, from the inventory alone (dry runs too): the recipe's fit (paths, nodes, GPUs, secrets)."""
        ...

    def preflight(self, recipe: Recipe, say: Say) -> None:
        """Live, on every host: Ray's ALIVE nodes cover the recipe (the gate), then its paths; again before a
        restart."""
        ...

    def credentials(self, recipe: Recipe, say: Say, network: bool) -> None:
        """Live, on every host in the job's own environment: secrets delivered, AWS."""
        ...

    def heal(self, say: Say) -> None:
        """--max-restarts: bring lost hosts back (cluster.up's own repair)."""
        ...


@dataclass(frozen=True)
class Cluster:
    """The cluster a job goes to, as the caller found it (tasks.py: cluster/runcheck.cluster_env)."""

    name: str  # the inventory, or the address given
    # its Jobs API, http://HEAD:PORT (or an ssh tunnel's http://127.0.0.1:PORT, alive while the launch runs)
    address: str
    via: str | None = None  # how the Jobs API is reached when not directly (cluster/tunnel.py), for the plan's notes
    mode: str | None = None  # None: not known (--address)
    image: str | None = None
    prefix: str | None = None
    python: str | None = None  # host mode: the head's environment python (its bin is first on Ray's PATH)
    # None (--address, no inventory): nothing is compared or checked on the hosts, this machine's
    # credentials are checked instead, and before a restart the cluster is waited for, as it heals
    # by itself or by its operator.
    checks: ClusterChecks | None = None


def find_cluster_of(address: str | None, cluster: str | None, find: Callable[[str, bool], Cluster] | None,
                    dry_run: bool) -> Cluster:
    """--address (no inventory: nothing to compare), or the cluster of an inventory, found by the caller's `find`."""
    if address and cluster:
        raise ConfigError("command line", [Problem("--address/--cluster", "both name a cluster",
                                                   f"{address} / {cluster}", "one of them")])
    if address:
        return Cluster(address, check_address(address))
    assert cluster is not None
    if find is None:
        raise ConfigError("command line", [Problem("--cluster", "cannot be looked up here", cluster, "--address http://HEAD:8265")])
    return find(cluster, dry_run)


def on_cluster(recipe: Recipe, cluster: Cluster, *, mode: str | None, prefix: str | None, image: str | None,
               dry_run: bool,
               stack: Stack | None) -> Recipe:
    """The recipe as it runs on `cluster`: the command line's options, then the cluster's
    environment where neither names one; refused (ConfigError naming both values) where they
    differ, and when its paths, nodes or GPUs do not fit the inventory."""
    r = resolve_mode(recipe, mode, prefix, image, require_image=False, stack=stack)
    if cluster.checks is not None:
        r = cluster.checks.adopt(r, mode is not None or "mode" in recipe.model_fields_set)
    r = resolve_mode(r, require_image=not dry_run and cluster.mode is not None,
                     stack=stack)  # slime_dir from an adopted prefix
    problems = cluster.checks.check(r) if cluster.checks is not None else []
    if problems:
        raise ConfigError(f"recipe against cluster {cluster.name}", problems)
    return r


def ship(args: list[str], run_dir: Path) -> tuple[list[str], list[Problem]]:
    """The job's arguments with the run directory's files named where the job finds them
    (relative to its working directory); a problem for any other path into the run directory."""
    here = str(run_dir)
    out, problems = [], []
    for arg in args:
        flag, eq, value = arg.partition("=") if arg.startswith("--") and "=" in arg else ("", "", arg)
        if value == here or value.startswith(here + "/"):
            name = value[len(here) + 1:]
            if name in JOB_FILES:
                out.append(flag + eq + name)
                continue
            problems.append(Problem("extra_flags",
                                    "names a file of the run directory that does not travel with the job "
                                    f"({', '.join(JOB_FILES)} do)",
                                    arg, "a path on the cluster's hosts"))
        out.append(arg)
    return out, problems


class ClusterTarget(jobs.JobsApiTarget):
    """Submit to a running Ray cluster's Jobs API from here (see the module docstring)."""

    name = "ray-cluster"

    def __init__(self, cluster: Cluster, *, detach: bool = False, max_restarts: int = 0):
        self.cluster = cluster
        self.detach = detach
        self.max_restarts = max_restarts

    def mounts(self, run: ResolvedRun) -> tuple[Mount, ...]:
        return ()  # nothing runs here: the cluster's own volumes apply (checked against the recipe)

    def job_files(self, run: ResolvedRun, rundir: RunDir) -> tuple[list[str], dict[str, str]]:
        args, problems = ship(rundir.args, rundir.path)
        if problems:
            raise ConfigError(f"run directory {rundir.path}", problems)
        r = run.recipe
        python = "python3"  # container mode: the image's
        if r.mode == "host":  # the cluster's environment: the inventory's python, else the recipe's prefix's
            python = (self.cluster.python or (paths.Prefix.at(r.install_prefix).python if r.install_prefix
                                              else "python3"))
        job = render("job.sh.j2", {"version": __version__, "stack_id": run.stack.id, "exp_id": r.exp_id,
                                   "slime_dir": r.slime_dir,
                                   "model_type": r.model_type, "python": python, "model_args_bash": MODEL_ARGS_BASH,
                                   "args": args})
        return args, {"job.sh": job, "slime.args": "".join(shlex.quote(a) + "\n" for a in args)}

    def plan(self, run: ResolvedRun) -> LaunchPlan:
        rundir = build_run_dir(run.recipe, run.stack, run.out, run.recipe_path, run.environ, run.layout)
        args, files = self.job_files(run, rundir)
        rundir = RunDir(rundir.path, args, rundir.env, rundir.files, rundir.plan)
        content = {**rundir.files, **files}
        working = {name: hashlib.sha256(content[name].encode()).hexdigest() for name in JOB_FILES}
        argv = ("ray", "job", "submit", "--address", self.cluster.address, "--working-dir",
                f"<{', '.join(JOB_FILES)} of {run.out}>",
                "--runtime-env", str(run.out / "runtime_env.json"), "--no-wait", "--", *shlex.split(ENTRYPOINT))
        cmd = Command(argv, "Jobs API submit")
        notes = [f"the job goes to the running Ray cluster {self.cluster.name} through its Jobs API, from this machine "
                 "(no container, GPU or image here); the entrypoint runs on its head in the cluster's environment",
                 f"working_dir: {', '.join(JOB_FILES)} travel with the submission; secrets: "
                 + (f"{', '.join(run.recipe.secret_env)} (names only), delivered to every host's Ray by cluster.up "
                    "(the inventory's secret_env)"
                    if run.recipe.secret_env else "none named; AWS credentials are the hosts' own (instance role, "
                                                  "~/.aws or the inventory's secret_env)")]
        env = (f"image {run.recipe.image}" if run.recipe.mode == "container"
               else f"prefix {run.recipe.install_prefix or '(none)'}")
        notes.append(f"{run.recipe.mode} mode, {env}" + (" (the cluster's)" if self.cluster.mode else ""))
        if self.cluster.via:
            notes.append(self.cluster.via)
        if self.cluster.mode is None:
            notes.append(f"{self.cluster.name} names no inventory: the recipe's mode, image, prefix and paths are not "
                         "checked against the cluster")
        rundir = amend_plan(rundir, files=files, target=self.name, commands=[list(argv)], cluster=self.cluster.name,
                            entrypoint=shlex.split(ENTRYPOINT), working_dir={"files": working})
        return LaunchPlan(self.name, run, rundir, (cmd,), (), tuple(notes), None, run_token=new_run_token())

    def preflight(self, plan: LaunchPlan, runner: Runner, say: Say) -> None:
        from ..preflight import PreflightError, run_checks  # only a launch needs it; dry runs stay fast

        run = plan.run
        # Without the image: the checks here never `docker run` it (it is the cluster's, maybe 14 GB);
        # the flag catalog comes from --catalog or a local build of the stack.
        here = run.recipe.model_copy(update={"image": None})
        report = run_checks(here, run.stack, args=plan.rundir.args, address=self.cluster.address, catalog=run.catalog,
                            skip=run.skip_checks, only=LOCAL_CHECKS if self.cluster.checks is None else CLUSTER_CHECKS,
                            network=run.network_checks, environ=run.environ,
                            runner=runner)
        say(report.table())
        if report.errors:
            raise PreflightError(f"preflight of {run.recipe_path}", report)
        if self.cluster.checks is not None:
            self.cluster.checks.preflight(run.recipe, say)
            self.cluster.checks.credentials(run.recipe, say, run.network_checks)

    def apply(self, plan: LaunchPlan, runner: Runner, say: Say, stream: IO[str]) -> int:
        from .local import write_launch_records

        # first: a cluster of another Ray, or one that does not answer, is the first thing to fix
        if not runner.dry_run:
            try:
                check_versions(JobsApi(self.cluster.address), f"cluster {self.cluster.name}")
            except NoAnswer as exc:
                raise SlimeforgeError(f"{exc}; nothing was submitted: is the cluster up (`invoke "
                                      "cluster.status`)?") from None
        self.preflight(plan, runner, say)
        write_launch_records(plan, runner)
        if runner.dry_run:
            runner.history.append(list(plan.commands[0].argv))
            return 0
        return submit(plan, self.cluster, say, stream, detach=self.detach, max_restarts=self.max_restarts)


def follow_hints(exp_id: str, sid: str, out: Path, cluster: Cluster) -> list[str]:
    """How to follow, inspect and stop the job from here (the run directory) or any machine that
    has the inventory (or reaches the address): the job's metadata carries what those need."""
    where = f"--cluster {shlex.quote(cluster.name)}" if cluster.mode is not None else f"--address {cluster.address}"
    return [f"[slimeforge] job {sid} goes on running on the cluster; from any machine with "
            f"{'the inventory' if cluster.mode else 'its address'}:",
            f"  follow:  invoke run.logs {exp_id} {where} --follow",
            f"  inspect: invoke run.status {exp_id} {where}",
            f"  stop:    invoke run.stop {exp_id} {where}",
            f"  (on this machine the run directory names it too: invoke run.status {shlex.quote(str(out))})"]


def submit(plan: LaunchPlan, cluster: Cluster, say: Say, stream: IO[str], *, detach: bool = False,
           max_restarts: int = 0) -> int:
    """Submit with the working_dir, record the submission, follow its log until it ends (or return
    once it runs, with `detach`); its exit code. Ctrl-C detaches, never stops the job. With
    `max_restarts`, a job that ended by a lost node or head is submitted again once the cluster healed."""
    api = JobsApi(cluster.address)
    rec, out = plan.run.recipe, plan.rundir.path
    sid: str | None = None
    try:
        attempt = 1
        while True:
            alive = alive_nodes(api) if max_restarts else {}
            sid = None
            sid = submit_once(api, plan, say, attempt)
            lost: SlimeforgeError | None = None
            info: JobInfo | None = None
            try:
                if detach:
                    info = jobs.wait_running(api, sid, timeout=PENDING_WAIT_S)
                    if not info.ended:
                        say(f"[slimeforge] job {sid} is {info.status}; detached (--detach): this command returns, the "
                            "job does not stop")
                        for line in follow_hints(rec.exp_id, sid, out, cluster):
                            say(line)
                        return 0
                else:
                    info = jobs.follow(api, sid, out / "job.log", stream, say)
            except (NoAnswer, jobs.JobVanished) as exc:
                lost = exc
            if lost is None and info is not None and info.status != "FAILED":
                break
            cause = lost_node(api, sid, lost, alive) if max_restarts else None
            if cause is None or attempt > max_restarts:
                if lost is not None:
                    note = "" if cause is None or max_restarts == 0 else f"; {max_restarts} restart(s) spent"
                    raise type(lost)(f"{lost}{note}. The job's state cannot be learned from the cluster now: if its "
                                     "head was lost, the job "
                                     f"went with it. `invoke run.status {rec.exp_id} ...` tells once the cluster "
                                     "answers"
                                     + (" (--max-restarts N restarts a run whose node or head was "
                                        "lost)" if max_restarts == 0 else "")) from None
                if cause is not None:
                    say(f"[slimeforge] {cause}: all {max_restarts} restart(s) spent")
                break
            say(f"[slimeforge] {cause}; restart {attempt} of {max_restarts}: waiting for the cluster to heal, then "
                "the gate, then "
                "the same run again (it resumes from the newest checkpoint in checkpoint_dir)")
            restart_gate(api, cluster, rec, say, len(alive))
            attempt += 1
    except KeyboardInterrupt:
        if sid is None:  # between submissions, or while one was on its way: say how to find out
            say("\n[slimeforge] interrupted before a job was confirmed submitted; whether one runs: invoke "
                f"run.status {rec.exp_id} "
                + ("--cluster "
                   f"{shlex.quote(cluster.name)}" if cluster.mode is not None else f"--address {cluster.address}"))
            return 130
        say(f"\n[slimeforge] interrupted: detached from job {sid} (Ctrl-C never stops it; `run.stop` does)")
        for line in follow_hints(rec.exp_id, sid, out, cluster):
            say(line)
        return 130
    assert info is not None
    code = jobs.exit_code(info)
    say(f"[slimeforge] job {sid}: "
        f"{info.status}" + (f" ({info.shown_message})" if code and info.shown_message else "") + f"; exit code {code}")
    say(f"[slimeforge] the cluster at {cluster.address} is left running, as it was")
    return code


def submit_once(api: JobsApi, plan: LaunchPlan, say: Say, attempt: int) -> str:
    """One submission of the run: recorded first, then the working_dir uploaded and the job submitted; its id."""
    run, out = plan.run, plan.rundir.path
    rec = run.recipe
    sid = f"{rec.exp_id}-{datetime.now().strftime(paths.SUBMISSION_TIME)}-{new_run_token()[:6]}"
    metadata = {ownership.META_EXP_ID: rec.exp_id, "slimeforge_run_dir": str(out),
                ownership.META_RUN_TOKEN: plan.run_token or "",
                jobs.META_ATTEMPT: str(attempt)}
    # Recorded first, as launch.sh does: a launch that dies right after the submission still leaves
    # run.status/run.stop what they need (a submission that never arrived reads as GONE).
    write_file(out / "submission_id", sid + "\n")
    write_file(out / "ray_address", api.address + "\n")
    with (out / "job.log").open("a", encoding="utf-8") as log:
        log.write(f"--- slimeforge: submission {sid} (attempt {attempt}) at {time.strftime('%Y-%m-%d %H:%M:%S')} to "
                  f"{api.address} ---\n")
    with tempfile.TemporaryDirectory(prefix="sf-job-") as staged:
        for name in JOB_FILES:  # exactly these files: Ray zips the whole directory it is given
            shutil.copyfile(out / name, Path(staged) / name)
        say(f"[slimeforge] submitting {sid} to {api.address} (working_dir: {', '.join(JOB_FILES)})")
        try:
            uri = api.upload_dir(staged)
            api.submit(entrypoint=ENTRYPOINT, submission_id=sid, metadata=metadata,
                       runtime_env={"working_dir": uri, "env_vars": dict(plan.rundir.env)})
        except NoAnswer as exc:
            raise NoAnswer(f"cannot submit {sid}: {exc}; is the cluster up (`invoke cluster.status`)? "
                           f"Whether it arrived: `invoke run.status {sid} --address {api.address}`") from None
    return sid


def alive_nodes(api: JobsApi) -> dict[str, str]:
    """The nodes alive now, id -> ip ({} when the dashboard cannot tell: a later loss is then a head's only)."""
    try:
        return {nid: ip for nid, (state, ip) in api.nodes().items() if state == "ALIVE"}
    except NoAnswer:
        return {}


def lost_node(api: JobsApi, sid: str, lost: SlimeforgeError | None, alive: dict[str, str]) -> str | None:
    """Why the job ended by the loss of a node or of the head (a restart may help), or None when it
    failed by its own error while every node it started with is still alive (a restart would fail
    the same way)."""
    if lost is not None:
        return f"the Ray head was lost while job {sid} ran ({lost})"
    try:
        now = api.nodes()
    except NoAnswer as exc:
        return f"job {sid} failed and the cluster's head does not answer ({exc})"
    gone = sorted({ip for nid, ip in alive.items() if now.get(nid, ("DEAD", ip))[0] != "ALIVE"})
    return f"job {sid} failed and the Ray node(s) on {', '.join(gone)} were lost" if gone else None


def restart_gate(api: JobsApi, cluster: Cluster, recipe: Recipe, say: Say, nodes: int) -> None:
    """Before a restart: the cluster healed (cluster.up's own repair with an inventory; else waited
    for), as many nodes alive as the job started with, and the gate passed again; raises (naming what
    is missing) when it cannot be."""
    if cluster.checks is not None:
        cluster.checks.heal(say)
    deadline = time.monotonic() + HEAL_WAIT_S
    while True:
        try:
            now = sum(1 for state, _ in api.nodes().values() if state == "ALIVE")
        except NoAnswer:
            now = -1
        if now >= nodes:
            break
        if time.monotonic() > deadline:
            raise OperationFailed(f"cluster {cluster.name} did not heal within {HEAL_WAIT_S:g} s: {max(now, 0)} Ray "
                                  "node(s) alive, the job "
                                  f"started with {nodes}; bring the hosts back (`invoke cluster.up`) and run the "
                                  "recipe again: it resumes "
                                  "from checkpoint_dir")
        time.sleep(2)
    say(f"[slimeforge] cluster {cluster.name}: {now} Ray node(s) alive again")
    if cluster.checks is not None:
        cluster.checks.preflight(recipe, say)
