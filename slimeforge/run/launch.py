"""Launching a run: preflight, then the one executor, the rendered launch.sh; and acting on a launched run.

    launch(recipe, stack, out=None, recipe_path="(api)", *, address=None, mode=None, ...) -> exit code

Order: render the run directory in memory -> preflight (all problems at once; nothing started,
nothing written on failure) -> write the run directory -> run launch.sh: on this host (host mode,
with the install's tools first on PATH), or inside the image (container mode, `docker run`); a
Slurm job runs the same script on its head node (cluster/slurm.py). launch.sh stops the head an
earlier launch recorded, starts a Ray head (unless RAY_ADDRESS names a running cluster), waits for
its Jobs API, submits train.py, streams the log to the terminal and job.log, and exits with the
job's outcome. There is no second implementation of those steps here, so the modes cannot drift.

What slimeforge starts, it records, and only that is ever stopped: the Ray head (a head started
with `--block` stops every process it started on SIGTERM) in the state dir
`$SLIMEFORGE_STATE_DIR/ray-<port>/head.json` (pid, start time, boot id, the run it was started for;
default ~/.local/state/slimeforge), the container id in <run dir>/container.id (the container is
labelled with the run), the run token in <run dir>/run_token, the job's submission id in
<run dir>/submission_id (its metadata carries the run token) and the cluster it went to in
<run dir>/ray_address. run.status / run.logs / run.stop read those files through runrecord.py and
act only on what ownership.py proves is this run's.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import secrets
import signal
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .. import paths
from ..errors import ConfigError, Problem, SlimeforgeError
from ..image.registry import image_ref_problems
from ..image.stack import Stack, load_stack
from ..proc import Runner, pid_alive
from ..records import RecordError
from ..schema import text_problem
from . import ownership
from .headstate import HEAD_RECORD, dashboard_url, recorded_head, state_dir
from .preflight import PreflightError, run_checks
from .recipe import RUNNER_FIELDS, Recipe
from .rundir import HEAD_TIMEOUT_S, build_run_dir, write_run_dir
from .runrecord import (
    RunRecord,
    Unreachable,
    container_check,
    guard_render,
    head_check,
    head_gone,
    jobs_api,
    new_run_token,
    ray_job,
    ray_job_check,
    read_record,
    read_run,
    write_run_token,
)

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
# Secrets and credentials reach the container by name only (`-e NAME`): their values never appear
# in an argv, a log or the run directory.
PASS_THROUGH_ENV = ("WANDB_API_KEY", "WANDB_ENTITY", "HF_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                    "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


# --- where things are recorded ----------------------------------------------------------------------


def default_run_dir(recipe: Recipe) -> Path:
    return paths.run_dir(recipe.exp_id)


# --- mode -------------------------------------------------------------------------------------------


def resolve_mode(recipe: Recipe, mode: str | None = None, install_prefix: str | None = None, image: str | None = None,
                 require_image: bool = True, stack: Stack | None = None) -> Recipe:
    """Apply the command line's mode options; host mode with an install prefix takes slime and
    Megatron from the install's checkouts (paths.Prefix: <prefix>/slime, <prefix>/Megatron-LM, by
    the stack's source dirs; default stack: the recipe's) unless the recipe names them."""
    problems = []
    if mode is not None and mode not in ("container", "host"):
        problems.append(Problem("--mode", "is not a launch mode", mode, "container or host"))
    if image is not None:
        problems += image_ref_problems(image, "--image")
    if install_prefix is not None and (not install_prefix.startswith("/") or text_problem(install_prefix)):
        problems.append(Problem("--prefix", "must be an absolute path (the --prefix given to `invoke install`)", install_prefix, "/path/on/the/hosts"))
    if problems:
        raise ConfigError("command line", problems)
    update: dict[str, Any] = {}
    if mode:
        update["mode"] = mode
    if install_prefix:
        update["install_prefix"] = install_prefix
    if image:
        update["image"] = image
    r = recipe.model_copy(update=update)
    if r.mode == "host" and r.install_prefix:
        installed = paths.Prefix.at(r.install_prefix)
        sources = (stack or load_stack(r.stack)).sources
        more = {}
        for field, source in (("slime_dir", "slime"), ("megatron_dir", "megatron")):
            if getattr(r, field) == RUNNER_FIELDS[field] and source in sources:
                more[field] = installed.source(sources[source].dir)
        r = r.model_copy(update=more)
    if require_image and r.mode == "container" and not r.image:
        problems.append(Problem("image", "container mode needs an image", None, "image: REG/repo@sha256:... in the recipe, or --image", show_value=False))
    if problems:
        raise ConfigError("launch", problems)
    return r


def host_tools(recipe: Recipe) -> tuple[str, str]:
    """(python, ray) for host mode: the install's venv, else this interpreter's, else PATH's."""
    if recipe.install_prefix:
        installed = paths.Prefix.at(recipe.install_prefix)
        return installed.python, installed.ray
    here = Path(sys.executable).parent / "ray"
    return "python3", str(here) if here.exists() else "ray"


def stop_recorded_head(sdir: Path, say=print, timeout: float = 60) -> int | None:
    """SIGTERM the head an earlier launch recorded in `sdir` if that very process (pid, start time,
    boot id) still runs, as launch.sh does before starting its own; nothing else."""
    pid = recorded_head(sdir)
    if pid:
        say(f"[slimeforge] stopping the Ray head of an earlier launch (pid {pid})")
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.2)
    (sdir / HEAD_RECORD).unlink(missing_ok=True)
    return pid


# --- following a job (run.logs, run.stop) ----------------------------------------------------------


def follow(client, submission_id: str, log_path: Path, stream: IO[str]) -> None:
    """Stream the job's logs to `stream` and append them to `log_path` until the job ends."""

    async def tail():
        with log_path.open("a", encoding="utf-8") as log:
            async for chunk in client.tail_job_logs(submission_id):
                stream.write(chunk)
                stream.flush()
                log.write(chunk)
                log.flush()

    try:
        asyncio.run(tail())
    except Exception as exc:  # noqa: BLE001 - the log stream broke; the job's status still decides
        stream.write(f"[slimeforge] log stream ended: {exc}\n")


# --- launch -------------------------------------------------------------------------------------------


def launch(recipe: Recipe, stack: Stack, out: str | os.PathLike | None = None, recipe_path: str = "(api)", *,
           address: str | None = None, mode: str | None = None, image: str | None = None, install_prefix: str | None = None,
           catalog: str | None = None, skip_checks: Iterable[str] = (), network_checks: bool = True,
           runner: Runner | None = None, stream: IO[str] | None = None, environ: dict[str, str] | None = None,
           head_args: Iterable[str] | None = None, python: str | None = None, docker: str = "docker",
           shm_size: str = "64g", head_timeout: float = HEAD_TIMEOUT_S) -> int:
    """Preflight, then launch; returns the job's exit code (0 = SUCCEEDED).

    Every mode runs the one executor, the rendered launch.sh: on this host (host mode), inside the
    image (container mode), or on a Slurm allocation's head node (cluster.slurm).
    address: the Ray dashboard (Jobs API) of a running cluster, e.g. "http://10.0.0.1:8265"; the
    job is submitted there and no head is started or stopped. Without it a head is started here.
    mode / image / install_prefix override the recipe's. skip_checks: preflight checks whose errors
    become warnings. runner: a proc.Runner (a dry-run one records argv lists and starts nothing).
    head_args: more `ray start` options (default: $SLIMEFORGE_RAY_HEAD_ARGS). head_timeout: seconds
    the head has to answer. Raises PreflightError (every problem, each with its fix) before anything starts."""
    stream = stream or sys.stdout
    environ = dict(os.environ if environ is None else environ)
    runner = runner or Runner()

    def say(text: str) -> None:
        stream.write(text + "\n")
        stream.flush()

    recipe = resolve_mode(recipe, mode, install_prefix, image, stack=stack)
    extra = None if head_args is None else list(head_args)
    if extra is not None:
        problems = [Problem("head_args", "must be single words without whitespace or control characters", a, "e.g. --temp-dir /tmp/ray-x")
                    for a in extra if not a or re.search(r"[\s\x00-\x1f\x7f]", a)]
        if problems:
            raise ConfigError("launch", problems)
    run = build_run_dir(recipe, stack, out or default_run_dir(recipe), recipe_path, environ)
    sdir = state_dir(recipe.ray_port, environ)
    report = run_checks(recipe, stack, args=run.args, address=address, catalog=catalog, skip=skip_checks,
                        network=network_checks, state_dir=sdir, environ=environ)
    say(report.table())
    if report.errors:
        raise PreflightError(f"preflight of {recipe_path}", report)
    if not runner.dry_run:
        guard_render(run.path)  # a live run's directory is never rewritten; an ended one's record goes to history/<n>/
    write_run_dir(run)
    token = new_run_token()
    if not runner.dry_run:
        write_run_token(run.path, token)  # before anything starts: the head, job and container carry it
    if recipe.mode == "container":
        return launch_container(recipe, run.path, runner=runner, address=address, environ=environ, docker=docker, shm_size=shm_size, say=say,
                                run_token=token)
    py, ray = host_tools(recipe)
    env = launch_env(environ, sdir, python or environ.get("SLIMEFORGE_PYTHON") or py, ray, address, extra, head_timeout)
    env["SLIMEFORGE_RUN_TOKEN"] = token
    return runner.stream(["bash", str(run.path / "launch.sh")], lambda line: say(line), step="launch.sh", env=env, forward_signals=True)


def launch_env(environ: dict[str, str], sdir: Path, python: str, ray: str, address: str | None, head_args: list[str] | None,
               head_timeout: float) -> dict[str, str]:
    """The environment launch.sh reads, for a host launch: the install's tools first on PATH."""
    env = dict(environ)
    if "/" in ray:  # `ray`, `python3` and `ray job` in launch.sh: the install's (or this interpreter's) own
        env["PATH"] = f"{Path(ray).parent}:{environ.get('PATH', os.defpath)}"
    env["SLIMEFORGE_STATE_DIR"] = str(sdir.parent)  # launch.sh adds ray-<port>, as headstate.state_dir does
    env["SLIMEFORGE_PYTHON"] = python
    env["SLIMEFORGE_HEAD_TIMEOUT"] = str(max(1, math.ceil(head_timeout)))
    if head_args is not None:
        env["SLIMEFORGE_RAY_HEAD_ARGS"] = " ".join(head_args)
    if address:
        env["RAY_ADDRESS"] = dashboard_url(address)
    else:
        env.pop("RAY_ADDRESS", None)  # a stale RAY_ADDRESS must not turn "start a head here" into "attach"
    return env


def container_argv(recipe: Recipe, run_dir: Path, *, docker: str = "docker", name: str, cidfile: Path, address: str | None = None,
                   environ: dict[str, str] | None = None, shm_size: str = "64g", gpus: bool = True,
                   ulimits: Iterable[str] = ("memlock=-1",), run_token: str | None = None) -> list[str]:
    """`docker run` of the image with launch.sh inside; every path at the same place as on the host.

    `ulimits`: memlock=-1 because NCCL over InfiniBand/EFA pins memory (a daemon that may not raise
    rlimits, e.g. Docker inside a container, refuses it: pass ()). Open files: dockerd's default
    for containers (1048576 on usual installs) is kept, since asking for more than the daemon's
    hard limit fails the start."""
    env = os.environ if environ is None else environ
    argv = [docker, "run", "--rm", "--init",  # --init: Ctrl-C reaches launch.sh's trap through a real PID 1
            "--name", name, "--cidfile", str(cidfile),
            # What run.stop proves before it stops a container: it was started for this run.
            "--label", f"{ownership.LABEL_EXP_ID}={recipe.exp_id}"]
    if run_token is not None:
        argv += ["--label", f"{ownership.LABEL_RUN_TOKEN}={run_token}", "-e", f"SLIMEFORGE_RUN_TOKEN={run_token}"]
    if gpus:
        argv += ["--gpus", "all"]
    argv += ["--ipc=host",  # NCCL and SGLang share memory between processes
             "--network", "host",  # Ray, SGLang and the gateway bind ports other hosts reach
             "--shm-size", shm_size]
    for limit in ulimits:
        argv += ["--ulimit", limit]
    mounts = [(recipe.model_dir, "ro"), (str(Path(recipe.data_path).parent), "ro"),
              *((str(Path(p).parent), "ro") for p in recipe.eval_data.values()),
              (recipe.resolved_checkpoint_dir, "rw"), (str(run_dir), "rw")]
    seen: dict[str, str] = {}
    for path, how in mounts:
        seen[path] = "rw" if "rw" in (how, seen.get(path)) else "ro"
    for path, how in seen.items():
        argv += ["-v", f"{path}:{path}:{how}"]
    # The head's records live inside the container, which goes away with it.
    argv += ["-e", "SLIMEFORGE_STATE_DIR=/tmp/slimeforge"]
    if address:
        argv += ["-e", f"RAY_ADDRESS={address}"]
    # By name only (`-e NAME`): docker copies the value from its own environment, so no value is in the argv.
    argv += [x for k in dict.fromkeys((*PASS_THROUGH_ENV, *recipe.secret_env)) if k in env for x in ("-e", k)]
    argv += ["-w", str(run_dir), "--entrypoint", "bash", str(recipe.image), str(run_dir / "launch.sh")]
    return argv


def launch_container(recipe: Recipe, run_dir: Path, *, runner: Runner, address: str | None, environ: dict[str, str],
                     docker: str, shm_size: str, say, run_token: str | None = None) -> int:
    cidfile = run_dir / "container.id"
    cidfile.unlink(missing_ok=True)  # docker refuses to overwrite an old one
    Path(recipe.resolved_checkpoint_dir).mkdir(parents=True, exist_ok=True)  # else docker creates it as root
    name = f"slimeforge-{recipe.exp_id}-{secrets.token_hex(3)}"
    argv = container_argv(recipe, run_dir, docker=docker, name=name, cidfile=cidfile, address=address, environ=environ, shm_size=shm_size,
                          run_token=run_token)
    proc = runner.start(argv, step="docker run")
    if proc is None:
        return 0
    stopping = threading.Event()

    def on_signal(signum, frame):
        # Stop only our container (its id was recorded); docker forwards SIGTERM to launch.sh,
        # whose trap stops the job first.
        if stopping.is_set():
            return
        stopping.set()
        say(f"\n[slimeforge] interrupted: stopping container {name}")
        try:  # the full id docker recorded (through the one reader), else the name we gave it
            cid = read_record(run_dir, "container.id") or name
        except RecordError:
            cid = name
        runner.run([docker, "stop", "--time", "60", "--", cid], step="docker stop", check=False)

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


# --- acting on a recorded run ----------------------------------------------------------------------------
# Every call reads the run's records through runrecord (validated) and proves, at the moment of
# acting, that what it acts on is this run's (ownership.py); anything else is refused, saying why.


@dataclass
class StopReport:
    """What run.stop did, one line per thing it was asked to stop; exit 0 only when each was
    stopped, or had already ended, and at least one thing was recorded."""

    lines: list[tuple[str, str]] = field(default_factory=list)  # (outcome, text): stopped, ended, refused, none, failed

    def add(self, outcome: str, text: str, say) -> None:
        self.lines.append((outcome, text))
        say(f"{outcome}: {text}")

    @property
    def code(self) -> int:
        outcomes = {o for o, _ in self.lines}
        if outcomes & {"refused", "failed"} or not outcomes & {"stopped", "ended"}:
            return 1
        return 0


def recorded(run_dir: str | os.PathLike) -> dict[str, Any]:
    """What a launch recorded in a run directory (by launch() or launch.sh), validated."""
    rec = read_run(run_dir)
    return {"run_dir": str(rec.run_dir), "exp_id": rec.exp_id, "submission_id": rec.submission_id, "address": rec.address,
            "container_id": rec.container_id, "ray_port": rec.ray_port, "run_token": rec.run_token, "attached": rec.attached}


def _launched(rec: RunRecord) -> str:
    if not rec.submission_id:
        raise ConfigError(str(rec.run_dir), [Problem("submission_id", "this run directory was never launched (no job recorded)", None,
                                                     "`invoke run RECIPE` first", show_value=False)])
    return rec.submission_id


def _proved_job(rec: RunRecord) -> tuple[dict | None, ownership.Verdict]:
    """The job and its verdict; a foreign job is refused here (never shown or acted on as ours)."""
    _launched(rec)
    try:
        job, verdict = ray_job_check(rec)
    except Unreachable as exc:
        raise SlimeforgeError(f"{rec.run_dir}: {exc}; the head that ran job {rec.submission_id} is gone or unreachable "
                              "(its job.log is in the run directory)") from None
    if verdict.state == ownership.FOREIGN:
        raise SlimeforgeError(f"{rec.run_dir}: refused: {verdict.reason}")
    return job, verdict


def status(run_dir: str | os.PathLike) -> dict[str, Any]:
    rec = read_run(run_dir)
    job, verdict = _proved_job(rec)
    head = None
    if not rec.attached and rec.container_id is None:
        try:
            h, hv = head_check(rec, state_dir(rec.ray_port))
            head = h.pid if h is not None and hv.ours else None
        except RecordError:
            head = None
    info = recorded(rec.run_dir)
    if job is None:
        return {**info, "status": "GONE", "message": verdict.reason, "start_time": None, "end_time": None, "head_pid": head}
    return {**info, "status": str(job.get("status")), "message": job.get("message") or "", "start_time": job.get("start_time"),
            "end_time": job.get("end_time"), "head_pid": head}


def logs(run_dir: str | os.PathLike, follow_logs: bool = False, stream: IO[str] | None = None) -> None:
    stream = stream or sys.stdout
    rec = read_run(run_dir)
    job, verdict = _proved_job(rec)
    if job is None:
        raise SlimeforgeError(f"{rec.run_dir}: {verdict.reason}; its log up to then is in {rec.run_dir / 'job.log'}")
    if follow_logs:
        from ray.job_submission import JobSubmissionClient

        follow(JobSubmissionClient(rec.address), rec.submission_id, rec.run_dir / "job.log", stream)
        return
    doc = jobs_api(rec.address, "GET", f"/api/jobs/{rec.submission_id}/logs", timeout=60)
    stream.write(doc.get("logs", "") if isinstance(doc, dict) else "")


def _wait_ended(rec: RunRecord, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    status = "?"
    while time.monotonic() < deadline:
        job = ray_job(rec)
        status = "GONE" if job is None else str(job.get("status"))
        if status in (*TERMINAL, "GONE"):
            break
        time.sleep(0.5)
    return status


def stop(run_dir: str | os.PathLike, head: bool = False, say=print, runner: Runner | None = None, docker: str = "docker") -> int:
    """Stop the recorded job; with `head`, also the Ray head slimeforge started for this run and the
    container it started for it. Each is first proved to be this run's (ownership.py); anything
    else is refused with what was found. Returns the exit code (StopReport.code)."""
    rec = read_run(run_dir)
    runner = runner or Runner()
    report = StopReport()
    if rec.submission_id is None and rec.container_id is None:
        report.add("none", f"{rec.run_dir}: never launched (no job recorded); nothing to stop", say)
        return report.code
    if rec.submission_id is not None:
        _stop_job(rec, report, say, head)
    if head:
        if rec.attached:
            report.add("none", f"the job went to {rec.ray_address}, a Ray cluster slimeforge did not start here: "
                       "there is no head of ours to stop (stop that cluster where it was started, e.g. `invoke cluster.down`)", say)
        elif rec.container_id is not None:
            _stop_container(rec, report, say, runner, docker)
        else:
            _stop_head(rec, report, say)
    return report.code


def _stop_job(rec: RunRecord, report: StopReport, say, head: bool) -> None:
    sid = rec.submission_id
    try:
        job, verdict = ray_job_check(rec)
    except Unreachable as exc:
        if head_gone(rec):  # our own head on this host is proved gone: the job went with it
            report.add("ended", f"job {sid}: the Ray head it ran on is gone ({exc})", say)
        else:
            report.add("failed", f"job {sid}: {exc}; nothing stopped", say)
        return
    if verdict.state == ownership.FOREIGN:
        report.add("refused", f"job {sid}: {verdict.reason}", say)
        return
    if verdict.state == ownership.ENDED:
        report.add("ended", verdict.reason, say)
        return
    try:
        answer = jobs_api(rec.address, "POST", f"/api/jobs/{sid}/stop", timeout=30)
        final = _wait_ended(rec)
    except Unreachable as exc:
        report.add("failed", f"job {sid}: {exc}", say)
        return
    stopped = isinstance(answer, dict) and answer.get("stopped")
    if final in TERMINAL or final == "GONE":
        report.add("stopped" if stopped else "ended", f"job {sid}: {final}", say)
    else:
        report.add("failed", f"job {sid}: stop requested, still {final} after 120 s", say)


def _stop_head(rec: RunRecord, report: StopReport, say, timeout: float = 60) -> None:
    sdir = state_dir(rec.ray_port)
    try:
        head, verdict = head_check(rec, sdir)
    except RecordError as exc:
        report.add("refused", f"the head record is not one slimeforge wrote, so no process is stopped: {exc}", say)
        return
    if head is None or verdict.state == ownership.ENDED:
        report.add("ended", verdict.reason, say)
        return
    if not verdict.ours:
        report.add("refused", verdict.reason, say)
        return
    os.kill(head.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and ownership.head_alive(head, ownership.proc_facts(head.pid)):
        time.sleep(0.2)
    if ownership.head_alive(head, ownership.proc_facts(head.pid)):
        report.add("failed", f"Ray head pid {head.pid} still runs {timeout:g} s after SIGTERM", say)
        return
    (sdir / HEAD_RECORD).unlink(missing_ok=True)
    report.add("stopped", f"Ray head pid {head.pid} (and the Ray processes it started)", say)


def _stop_container(rec: RunRecord, report: StopReport, say, runner: Runner, docker: str) -> None:
    cid = rec.container_id
    assert cid is not None
    try:
        verdict = container_check(rec, runner)
    except Unreachable as exc:
        report.add("failed", str(exc), say)
        return
    if verdict.state != ownership.OURS:
        report.add("ended" if verdict.state == ownership.ENDED else "refused", verdict.reason, say)
        return
    r = runner.run([docker, "stop", "--time", "60", "--", cid], step="docker stop", check=False, timeout=120)
    said = (r.stdout + r.stderr).strip()[-300:]
    if r.returncode == 0:
        report.add("stopped", f"container {cid[:12]} (the Ray head inside it with it); docker said: {said or '(nothing)'}", say)
    else:
        report.add("failed", f"docker stop {cid[:12]} exited with {r.returncode}: {said}", say)
