"""Targets that run launch.sh from this machine: on the host, or in the image (`docker run`).
A running Ray cluster (`--address`, `--cluster`) is targets/jobsubmit.py's: submitted from here.

launch.sh (templates/launch.sh.j2) owns the head's `ray start` for these targets: it stops the
head an earlier launch recorded, starts a head (unless RAY_ADDRESS names a running cluster), waits
for its Jobs API, submits train.py, streams the log and exits with the job's outcome. The
targets differ only in where launch.sh runs and with which environment; status, logs and stop
read the Jobs API records (targets/jobs.py).
"""

from __future__ import annotations

import math
import os
import re
import secrets
import signal
import sys
import threading
from pathlib import Path
from typing import IO, Any

from ... import paths
from ...errors import ConfigError, Problem
from ...proc import Runner
from ...readback import RecordError
from .. import ownership
from ..headstate import dashboard_url, state_dir
from ..recipe import Recipe
from ..rundir import HEAD_TIMEOUT_S, RunDir, amend_plan, build_run_dir, write_run_dir
from ..runrecord import guard_render, read_record, write_run_token
from . import jobs
from .base import Command, LaunchPlan, Mount, ResolvedRun, Say, layout_line
from .mounts import container_mounts, docker_volume_args

# Secrets and credentials reach the container by name only (`-e NAME`): their values never appear
# in an argv, a log or the run directory.
PASS_THROUGH_ENV = ("WANDB_API_KEY", "WANDB_ENTITY", "HF_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                    "AWS_SESSION_TOKEN",
                    "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


def host_tools(recipe: Recipe, python: str | None = None) -> tuple[str, str]:
    """(python, ray) for host mode: the install's venv; else `python` (in place: this interpreter)
    and the `ray` beside it; else python3 and this interpreter's `ray`, else PATH's."""
    if recipe.install_prefix:
        installed = paths.Prefix.at(recipe.install_prefix)
        return installed.python, installed.ray
    here = Path(python or sys.executable).parent / "ray"
    return python or "python3", str(here) if here.exists() else "ray"


class LocalTarget(jobs.JobsApiTarget):
    """What host and container mode share: preflight here, the Jobs API records."""

    address: str | None = None  # a running cluster's dashboard; None: launch.sh starts a head

    def render(self, run: ResolvedRun) -> RunDir:
        return build_run_dir(run.recipe, run.stack, run.out, run.recipe_path, run.environ, run.layout)

    def preflight(self, plan: LaunchPlan, runner: Runner, say: Say) -> None:
        from ..preflight import PreflightError, run_checks  # only a launch needs it; dry runs stay fast

        run = plan.run
        report = run_checks(run.recipe, run.stack, args=plan.rundir.args, address=self.address, catalog=run.catalog,
                            skip=run.skip_checks, network=run.network_checks, state_dir=state_dir(run.recipe.ray_port,
                                                                                                  run.environ),
                            environ=run.environ, python=run.python)
        if (layout := layout_line(run)) is not None:
            say(layout)
        say(report.table())
        if report.errors:
            raise PreflightError(f"preflight of {run.recipe_path}", report)


class HostTarget(LocalTarget):
    """launch.sh on this host, with the install's tools first on PATH."""

    name = "host"

    def __init__(self, address: str | None = None, *, head_args: list[str] | None = None,
                 head_timeout: float = HEAD_TIMEOUT_S):
        if head_args is not None:
            problems = [Problem("head_args", "must be single words without whitespace or control characters", a,
                                "e.g. --temp-dir /tmp/ray-x")
                        for a in head_args if not a or re.search(r"[\s\x00-\x1f\x7f]", a)]
            if problems:
                raise ConfigError("launch", problems)
        self.address, self.head_args, self.head_timeout = address, head_args, head_timeout

    def mounts(self, run: ResolvedRun) -> tuple[Mount, ...]:
        return ()  # every path is read where it is

    def plan(self, run: ResolvedRun) -> LaunchPlan:
        rundir = self.render(run)
        py, ray = host_tools(run.recipe, run.python)
        set_env, unset = launch_env(run.environ, state_dir(run.recipe.ray_port, run.environ),
                                    run.python or run.environ.get("SLIMEFORGE_PYTHON") or py, ray, self.address,
                                    self.head_args, self.head_timeout)
        # this launch's identity: launch.sh puts it in the head record and the job's metadata
        token = secrets.token_hex(16)
        set_env["SLIMEFORGE_RUN_TOKEN"] = token
        cmd = Command(("bash", str(rundir.path / "launch.sh")), "launch.sh", tuple(set_env.items()), unset)
        return LaunchPlan(self.name, run, amend_plan(rundir, target=self.name, commands=[list(cmd.argv)]), (cmd,),
                          run_token=token)

    def apply(self, plan: LaunchPlan, runner: Runner, say: Say, stream: IO[str]) -> int:
        self.preflight(plan, runner, say)
        write_launch_records(plan, runner)
        (cmd,) = plan.commands
        return runner.stream(list(cmd.argv), say, step=cmd.step, env=cmd.environment(plan.run.environ),
                             forward_signals=True)


def write_launch_records(plan: LaunchPlan, runner: Runner) -> None:
    """Write the run directory, never over a live run's record (an ended one's goes to
    history/<n>/ first), and the plan's run token beside it, before anything starts."""
    if not runner.dry_run:
        guard_render(plan.rundir.path, runner, plan.run.recipe.exp_id)
    write_run_dir(plan.rundir)
    if not runner.dry_run:
        assert plan.run_token is not None, "a launch plan of a local target carries its run token"
        write_run_token(plan.rundir.path, plan.run_token)


def launch_env(environ: dict[str, str], sdir: Path, python: str, ray: str, address: str | None,
               head_args: list[str] | None,
               head_timeout: float) -> tuple[dict[str, str], tuple[str, ...]]:
    """What a host launch sets in launch.sh's environment (and removes from it)."""
    env: dict[str, str] = {}
    if "/" in ray:  # `ray`, `python3` and `ray job` in launch.sh: the install's (or this interpreter's) own
        env["PATH"] = f"{Path(ray).parent}:{environ.get('PATH', os.defpath)}"
    env["SLIMEFORGE_STATE_DIR"] = str(sdir.parent)  # launch.sh adds ray-<port>, as headstate.state_dir does
    env["SLIMEFORGE_PYTHON"] = python
    env["SLIMEFORGE_HEAD_TIMEOUT"] = str(max(1, math.ceil(head_timeout)))
    if head_args is not None:
        env["SLIMEFORGE_RAY_HEAD_ARGS"] = " ".join(head_args)
    if address:
        env["RAY_ADDRESS"] = dashboard_url(address)
        return env, ()
    return env, ("RAY_ADDRESS",)  # a stale RAY_ADDRESS must not turn "start a head here" into "attach"


class ContainerTarget(LocalTarget):
    """launch.sh inside the recipe's image: `docker run` with every path at the same place."""

    name = "container"
    IMAGE_PLACEHOLDER = "<IMAGE>"

    def __init__(self, address: str | None = None, *, docker: str = "docker", shm_size: str = "64g", gpus: bool = True,
                 ulimits: tuple[str, ...] = ("memlock=-1",)):
        self.address, self.docker, self.shm_size, self.gpus, self.ulimits = address, docker, shm_size, gpus, ulimits

    def mounts(self, run: ResolvedRun) -> tuple[Mount, ...]:
        return container_mounts(run.recipe, run.out)

    def plan(self, run: ResolvedRun) -> LaunchPlan:
        rundir = self.render(run)
        name = f"slimeforge-{run.recipe.exp_id}-{secrets.token_hex(3)}"
        # this launch's identity: the container's label, launch.sh's head record and job metadata
        token = secrets.token_hex(16)
        argv = self.docker_argv(run, name=name, cidfile=rundir.path / "container.id", run_token=token)
        notes = () if run.recipe.image else (f"no image given: {self.IMAGE_PLACEHOLDER} stands for --image, or "
                                             "`image:` in the recipe",)
        cmd = Command(tuple(argv), "docker run")
        return LaunchPlan(self.name, run, amend_plan(rundir, target=self.name, commands=[argv]), (cmd,),
                          self.mounts(run), notes, name,
                          run_token=token)

    def docker_argv(self, run: ResolvedRun, *, name: str, cidfile: Path, run_token: str | None = None) -> list[str]:
        """`docker run` of the image with launch.sh inside.

        `ulimits`: memlock=-1 because NCCL over InfiniBand/EFA pins memory (a daemon that may not
        raise rlimits, e.g. Docker inside a container, refuses it: pass ()). Open files: dockerd's
        default for containers (1048576 on usual installs) is kept, since asking for more than the
        daemon's hard limit fails the start."""
        recipe, run_dir = run.recipe, run.out
        argv = [self.docker, "run", "--rm", "--init",  # --init: Ctrl-C reaches launch.sh's trap through a real PID 1
                "--name", name, "--cidfile", str(cidfile),
                # run.stop stops only a container labelled with this run.
                "--label", f"{ownership.LABEL_EXP_ID}={recipe.exp_id}"]
        if run_token is not None:
            argv += ["--label", f"{ownership.LABEL_RUN_TOKEN}={run_token}", "-e", f"SLIMEFORGE_RUN_TOKEN={run_token}"]
        if self.gpus:
            argv += ["--gpus", "all"]
        argv += ["--ipc=host",  # NCCL and SGLang share memory between processes
                 "--network", "host",  # Ray, SGLang and the gateway bind ports other hosts reach
                 "--shm-size", self.shm_size]
        for limit in self.ulimits:
            argv += ["--ulimit", limit]
        argv += docker_volume_args(self.mounts(run))
        # The head's records live inside the container, which goes away with it.
        argv += ["-e", "SLIMEFORGE_STATE_DIR=/tmp/slimeforge"]
        if self.address:
            argv += ["-e", f"RAY_ADDRESS={self.address}"]
        # By name only (`-e NAME`): docker copies the value from its own environment, so no value is in the argv.
        argv += [x for k in dict.fromkeys((*PASS_THROUGH_ENV, *recipe.secret_env)) if k in run.environ for x in ("-e",
                                                                                                                 k)]
        argv += ["-w", str(run_dir), "--entrypoint", "bash", recipe.image or self.IMAGE_PLACEHOLDER,
                 str(run_dir / "launch.sh")]
        return argv

    def apply(self, plan: LaunchPlan, runner: Runner, say: Say, stream: IO[str]) -> int:
        if not plan.run.recipe.image:
            raise ConfigError("launch", [Problem("image", "container mode needs an image", None,
                                                 "image: REG/repo@sha256:... in the recipe, or --image",
                                                 show_value=False)])
        self.preflight(plan, runner, say)
        write_launch_records(plan, runner)
        cidfile, name = plan.rundir.path / "container.id", plan.container or ""
        cidfile.unlink(missing_ok=True)  # docker refuses to overwrite an old one
        Path(plan.run.recipe.resolved_checkpoint_dir).mkdir(parents=True,
                                                            exist_ok=True)  # else docker creates it as root
        (cmd,) = plan.commands
        proc = runner.start(list(cmd.argv), step=cmd.step)
        if proc is None:
            return 0
        stopping = threading.Event()

        def on_signal(_signum: int, _frame: Any) -> None:
            # Stop only our container (its id was recorded); docker forwards SIGTERM to launch.sh,
            # whose trap stops the job first.
            if stopping.is_set():
                return
            stopping.set()
            say(f"\n[slimeforge] interrupted: stopping container {name}")
            try:  # the full id docker recorded (through the one reader), else the name we gave it
                cid = read_record(cidfile.parent, "container.id") or name
            except RecordError:
                cid = name
            runner.run([self.docker, "stop", "--time", "60", "--", cid], step="docker stop", check=False)

        old = {}
        if threading.current_thread() is threading.main_thread():
            old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            code = proc.wait()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        say(f"[slimeforge] container {name} exited with {code}; the Ray head inside it is gone with it")
        return 130 if stopping.is_set() and code != 0 else code

