"""Launching a run: preflight, a Ray head (or an existing cluster), Jobs API submission, logs.

    launch(recipe, stack, out=None, recipe_path="(api)", *, address=None, mode=None, ...) -> exit code

Order: render the run directory in memory -> preflight (all problems at once; nothing started,
nothing written on failure) -> write the run directory -> host mode: start a Ray head (unless
`address` names a running cluster), submit train.py through the Ray Jobs SDK, stream the logs to the
terminal and job.log, return the job's outcome; container mode: run the image with the rendered
launch.sh inside it (the same steps, done by bash).

What slimeforge starts, it records, and only that is ever stopped: the Ray head's pid (a head
started with `--block` stops every process it started on SIGTERM) in the state dir
`$SLIMEFORGE_STATE_DIR/ray-<port>/head.pid` (default ~/.local/state/slimeforge), the container id in
<run dir>/container.id, the job's submission id in <run dir>/submission_id and the cluster it went
to in <run dir>/ray_address. launch.sh records the same files in the same places.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from .. import paths
from ..errors import ConfigError, Problem, SlimeforgeError
from ..image.registry import image_ref_problems
from ..image.stack import Stack
from ..proc import Runner, pid_alive
from ..schema import text_problem
from .headstate import dashboard_url, recorded_head, state_dir
from .modelscript import eval_model_script, model_script
from .preflight import PreflightError, run_checks
from .recipe import RUNNER_FIELDS, Recipe
from .rundir import HEAD_TIMEOUT_S, build_run_dir, read_plan, write_run_dir

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
# Secrets and credentials reach the container by name only (`-e NAME`): their values never appear
# in an argv, a log or the run directory.
PASS_THROUGH_ENV = ("WANDB_API_KEY", "WANDB_ENTITY", "HF_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                    "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


# --- where things are recorded ----------------------------------------------------------------------


def default_run_dir(recipe: Recipe) -> Path:
    return paths.run_dir(recipe.exp_id)


def new_submission_id(exp_id: str) -> str:
    return f"{exp_id}-{time.strftime(paths.SUBMISSION_TIME)}-{secrets.token_hex(3)}"


# --- mode -------------------------------------------------------------------------------------------


def resolve_mode(recipe: Recipe, mode: str | None = None, install_prefix: str | None = None, image: str | None = None,
                 require_image: bool = True) -> Recipe:
    """Apply the command line's mode options; host mode with an install prefix takes slime and
    Megatron from the install (<prefix>/src/slime, <prefix>/src/Megatron-LM) unless the recipe names them."""
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
        more = {}
        if r.slime_dir == RUNNER_FIELDS["slime_dir"]:
            more["slime_dir"] = f"{r.install_prefix}/src/slime"
        if r.megatron_dir == RUNNER_FIELDS["megatron_dir"]:
            more["megatron_dir"] = f"{r.install_prefix}/src/Megatron-LM"
        r = r.model_copy(update=more)
    if require_image and r.mode == "container" and not r.image:
        problems.append(Problem("image", "container mode needs an image", None, "image: REG/repo@sha256:... in the recipe, or --image", show_value=False))
    if problems:
        raise ConfigError("launch", problems)
    return r


def host_tools(recipe: Recipe) -> tuple[str, str]:
    """(python, ray) for host mode: the install's venv, else this interpreter's, else PATH's."""
    if recipe.install_prefix:
        venv = Path(recipe.install_prefix) / "venv" / "bin"
        return str(venv / "python"), str(venv / "ray")
    here = Path(sys.executable).parent / "ray"
    return "python3", str(here) if here.exists() else "ray"


# --- the Ray head we start ----------------------------------------------------------------------------


def head_argv(ray: str, recipe: Recipe, extra: Iterable[str] = ()) -> list[str]:
    return [ray, "start", "--head", "--block", "--num-gpus", str(recipe.num_gpus), "--port", str(recipe.ray_port),
            # The dashboard (and Jobs API) has no authentication: loopback only.
            "--dashboard-host", "127.0.0.1", "--dashboard-port", str(recipe.ray_dashboard_port),
            "--disable-usage-stats", *extra]


def extra_head_args(environ: dict[str, str] | None = None) -> list[str]:
    """SLIMEFORGE_RAY_HEAD_ARGS: more `ray start` options (e.g. --temp-dir, fixed ports), as launch.sh reads them."""
    env = os.environ if environ is None else environ
    return shlex.split(env.get("SLIMEFORGE_RAY_HEAD_ARGS", ""))


def stop_recorded_head(sdir: Path, say=print, timeout: float = 60) -> int | None:
    """SIGTERM the head an earlier launch recorded in `sdir` (if it still runs); nothing else."""
    pid = recorded_head(sdir)
    if pid:
        say(f"[slimeforge] stopping the Ray head of an earlier launch (pid {pid})")
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.2)
    (sdir / "head.pid").unlink(missing_ok=True)
    return pid


def start_head(recipe: Recipe, sdir: Path, ray: str, runner: Runner, extra: Iterable[str] = (), say=print, timeout: float = HEAD_TIMEOUT_S) -> int | None:
    """Start `ray start --head --block` in its own session, record its pid, wait for the Jobs API."""
    sdir.mkdir(parents=True, exist_ok=True)
    say(f"[slimeforge] starting a Ray head: {recipe.num_gpus} GPUs, GCS port {recipe.ray_port}, dashboard 127.0.0.1:{recipe.ray_dashboard_port}")
    proc = runner.start(head_argv(ray, recipe, extra), step="ray head", log=sdir / "head.log", new_session=True)
    if proc is None:  # dry run
        return None
    (sdir / "head.pid").write_text(f"{proc.pid}\n")
    wait_for_jobs_api(f"http://127.0.0.1:{recipe.ray_dashboard_port}", timeout, proc=proc, log=sdir / "head.log")
    return proc.pid


def wait_for_jobs_api(address: str, timeout: float, proc=None, log: Path | None = None):
    """A health gate, not a sleep: returns a client once the Jobs API answers."""
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SlimeforgeError(f"ray head: exited with {proc.returncode} before its Jobs API answered; see {log}:\n{_tail(log)}")
        try:
            client = JobSubmissionClient(address)
            client.list_jobs()
            return client
        except Exception as exc:  # noqa: BLE001 - not up yet
            last = exc
            time.sleep(0.5)
    raise SlimeforgeError(f"ray head: the Jobs API at {address} did not answer within {timeout:.0f} s ({last}); see {log}:\n{_tail(log)}")


def _tail(path: Path | None, n: int = 20) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:]) if path else ""
    except OSError:
        return ""


# --- the job ------------------------------------------------------------------------------------------


def entrypoint(python: str, slime_dir: str, model_args: list[str], args: list[str]) -> str:
    """Ray runs the entrypoint through /bin/sh: one POSIX-quoted string, MODEL_ARGS first (as upstream)."""
    return shlex.join([python, f"{slime_dir}/train.py", *model_args, *args])


def exit_code(status: str, message: str | None, interrupted: bool = False) -> int:
    """SUCCEEDED -> 0; a failed entrypoint -> its own exit code when Ray's message gives it; else 1."""
    if status == "SUCCEEDED":
        return 0
    if interrupted:
        return 130
    m = re.search(r"exit code (-?\d+)", message or "")
    if m and int(m.group(1)) > 0:
        return int(m.group(1))
    return 1


def follow(client, submission_id: str, log_path: Path, stream: IO[str], on_interrupt=None) -> bool:
    """Stream the job's logs to `stream` and append them to `log_path` until the job ends.

    SIGINT/SIGTERM (main thread only) call `on_interrupt` once and keep following until the job
    has stopped; returns whether that happened."""
    interrupted = threading.Event()

    async def tail():
        loop = asyncio.get_running_loop()
        if on_interrupt and threading.current_thread() is threading.main_thread():
            def handler():
                if not interrupted.is_set():
                    interrupted.set()
                    loop.run_in_executor(None, on_interrupt)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, handler)
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
    return interrupted.is_set()


def wait_terminal(client, submission_id: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    status = str(client.get_job_status(submission_id))
    while not any(t in status for t in TERMINAL) and time.monotonic() < deadline:
        time.sleep(0.5)
        status = str(client.get_job_status(submission_id))
    return status.rsplit(".", 1)[-1]


# --- launch -------------------------------------------------------------------------------------------


def launch(recipe: Recipe, stack: Stack, out: str | os.PathLike | None = None, recipe_path: str = "(api)", *,
           address: str | None = None, mode: str | None = None, image: str | None = None, install_prefix: str | None = None,
           catalog: str | None = None, skip_checks: Iterable[str] = (), network_checks: bool = True,
           runner: Runner | None = None, stream: IO[str] | None = None, environ: dict[str, str] | None = None,
           head_args: Iterable[str] | None = None, python: str | None = None, docker: str = "docker",
           shm_size: str = "64g", head_timeout: float = HEAD_TIMEOUT_S) -> int:
    """Preflight, then launch; returns the job's exit code (0 = SUCCEEDED).

    address: the Ray dashboard (Jobs API) of a running cluster, e.g. "http://10.0.0.1:8265"; the
    job is submitted there and no head is started or stopped. Without it a head is started here.
    mode / image / install_prefix override the recipe's. skip_checks: preflight checks whose errors
    become warnings. runner: a proc.Runner (a dry-run one records argv lists and starts nothing).
    Raises PreflightError (every problem, each with its fix) before anything starts."""
    stream = stream or sys.stdout
    environ = dict(os.environ if environ is None else environ)
    runner = runner or Runner()

    def say(text: str) -> None:
        stream.write(text + "\n")
        stream.flush()

    recipe = resolve_mode(recipe, mode, install_prefix, image)
    run = build_run_dir(recipe, stack, out or default_run_dir(recipe), recipe_path, environ)
    sdir = state_dir(recipe.ray_port, environ)
    report = run_checks(recipe, stack, args=run.args, address=address, catalog=catalog, skip=skip_checks,
                               network=network_checks, state_dir=sdir, environ=environ)
    say(report.table())
    if report.errors:
        raise PreflightError(f"preflight of {recipe_path}", report)
    write_run_dir(run)
    if recipe.mode == "container":
        return launch_container(recipe, run.path, runner=runner, address=address, environ=environ, docker=docker, shm_size=shm_size, say=say)
    py, ray = host_tools(recipe)
    return launch_host(recipe, run.path, run.args, json.loads(run.files["runtime_env.json"]), runner=runner, address=address,
                       sdir=sdir, python=python or environ.get("SLIMEFORGE_PYTHON") or py, ray=ray, extra=list(head_args) if head_args is not None else extra_head_args(environ),
                       stream=stream, say=say, head_timeout=head_timeout)


def launch_host(recipe: Recipe, run_dir: Path, args: list[str], runtime_env: dict, *, runner: Runner, address: str | None,
                sdir: Path, python: str, ray: str, extra: list[str], stream: IO[str], say, head_timeout: float = HEAD_TIMEOUT_S) -> int:
    started_pid = None
    if address:
        say(f"[slimeforge] attaching to the running cluster at {address}")
        target = dashboard_url(address)
    else:
        if not runner.dry_run:
            stop_recorded_head(sdir, say)
        started_pid = start_head(recipe, sdir, ray, runner, extra, say, head_timeout)
        target = f"http://127.0.0.1:{recipe.ray_dashboard_port}"
    # Read even on a dry run (the plan shows the real MODEL_ARGS), so not through `runner`.
    model_args = eval_model_script(model_script(recipe), recipe.slime_dir, Runner())
    command = entrypoint(python, recipe.slime_dir, model_args, args)
    if runner.dry_run:
        runner.history.append(["ray-job-submit", target, command])
        return 0
    client = wait_for_jobs_api(target, head_timeout)
    sid = new_submission_id(recipe.exp_id)
    (run_dir / "submission_id").write_text(sid + "\n")
    (run_dir / "ray_address").write_text(target + "\n")
    log_path = run_dir / "job.log"
    with log_path.open("a") as log:
        log.write(f"--- slimeforge: submission {sid} at {time.strftime('%Y-%m-%d %H:%M:%S')} ---\n")
    say(f"[slimeforge] submitting {sid} to {target}")
    client.submit_job(entrypoint=command, submission_id=sid, runtime_env=runtime_env,
                      metadata={"slimeforge_exp_id": recipe.exp_id, "slimeforge_run_dir": str(run_dir)})

    def on_interrupt():
        say(f"\n[slimeforge] interrupted: stopping job {sid}")
        client.stop_job(sid)

    interrupted = follow(client, sid, log_path, stream, on_interrupt)
    status = wait_terminal(client, sid)
    message = client.get_job_info(sid).message
    code = exit_code(status, message, interrupted)
    say(f"[slimeforge] job {sid}: {status}" + (f" ({message})" if message and status != "SUCCEEDED" else "") + f"; exit code {code}")
    say("[slimeforge] " + cluster_state(address, started_pid, sdir, recipe))
    return code


def cluster_state(address: str | None, started_pid: int | None, sdir: Path, recipe: Recipe) -> str:
    if address:
        return f"the cluster at {address} is left running, as it was (slimeforge did not start it)"
    return (f"the Ray head (pid {started_pid}, dashboard http://127.0.0.1:{recipe.ray_dashboard_port}) stays up for "
            f"`invoke run.status/run.logs`; the next launch replaces it, `invoke run.stop --head` stops it")


def container_argv(recipe: Recipe, run_dir: Path, *, docker: str = "docker", name: str, cidfile: Path, address: str | None = None,
                   environ: dict[str, str] | None = None, shm_size: str = "64g", gpus: bool = True,
                   ulimits: Iterable[str] = ("memlock=-1",)) -> list[str]:
    """`docker run` of the image with launch.sh inside; every path at the same place as on the host.

    `ulimits`: memlock=-1 because NCCL over InfiniBand/EFA pins memory (a daemon that may not raise
    rlimits, e.g. Docker inside a container, refuses it: pass ()). Open files: dockerd's default
    for containers (1048576 on usual installs) is kept, since asking for more than the daemon's
    hard limit fails the start."""
    env = os.environ if environ is None else environ
    argv = [docker, "run", "--rm", "--init",  # --init: Ctrl-C reaches launch.sh's trap through a real PID 1
            "--name", name, "--cidfile", str(cidfile)]
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
                     docker: str, shm_size: str, say) -> int:
    cidfile = run_dir / "container.id"
    cidfile.unlink(missing_ok=True)  # docker refuses to overwrite an old one
    Path(recipe.resolved_checkpoint_dir).mkdir(parents=True, exist_ok=True)  # else docker creates it as root
    name = f"slimeforge-{recipe.exp_id}-{secrets.token_hex(3)}"
    argv = container_argv(recipe, run_dir, docker=docker, name=name, cidfile=cidfile, address=address, environ=environ, shm_size=shm_size)
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
        cid = cidfile.read_text().strip() if cidfile.exists() else name
        runner.run([docker, "stop", "--time", "60", cid], step="docker stop", check=False)

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


def recorded(run_dir: str | os.PathLike) -> dict[str, Any]:
    """What a launch recorded in a run directory (by launch() or launch.sh)."""
    run_dir = Path(run_dir)
    plan = read_plan(run_dir)
    if plan is None:
        raise ConfigError(str(run_dir), [Problem("run directory", "has no plan.json", str(run_dir), "runs/<exp_id> of a rendered recipe")])
    rec = plan["recipe"]

    def read(name: str) -> str | None:
        p = run_dir / name
        return p.read_text().strip() or None if p.is_file() else None

    return {
        "run_dir": str(run_dir.resolve()),
        "exp_id": plan["exp_id"],
        "submission_id": read("submission_id"),
        "address": read("ray_address") or f"http://127.0.0.1:{rec['ray_dashboard_port']}",
        "container_id": read("container.id"),
        "ray_port": rec["ray_port"],
    }


def _client(info: dict[str, Any]):
    from ray.job_submission import JobSubmissionClient

    if not info["submission_id"]:
        raise ConfigError(info["run_dir"], [Problem("submission_id", "this run directory was never launched", None, "`invoke run RECIPE` first", show_value=False)])
    try:
        return JobSubmissionClient(info["address"])
    except Exception as exc:  # noqa: BLE001
        raise SlimeforgeError(f"{info['run_dir']}: the Ray cluster at {info['address']} does not answer ({exc}); "
                              "the head that ran this job is gone (its job.log is in the run directory)") from None


def status(run_dir: str | os.PathLike) -> dict[str, Any]:
    info = recorded(run_dir)
    job = _client(info).get_job_info(info["submission_id"])
    sdir = state_dir(info["ray_port"])
    return {**info, "status": str(job.status).rsplit(".", 1)[-1], "message": job.message,
            "start_time": job.start_time, "end_time": job.end_time, "head_pid": recorded_head(sdir)}


def logs(run_dir: str | os.PathLike, follow_logs: bool = False, stream: IO[str] | None = None) -> None:
    stream = stream or sys.stdout
    info = recorded(run_dir)
    client = _client(info)
    if follow_logs:
        follow(client, info["submission_id"], Path(info["run_dir"]) / "job.log", stream)
    else:
        stream.write(client.get_job_logs(info["submission_id"]))


def stop(run_dir: str | os.PathLike, head: bool = False, say=print, runner: Runner | None = None) -> None:
    """Stop the recorded job; with `head`, also the Ray head that slimeforge started (its recorded
    pid) and the recorded container. Nothing that slimeforge did not record is touched."""
    info = recorded(run_dir)
    if info["submission_id"]:
        try:
            client = _client(info)
            stopped = client.stop_job(info["submission_id"])
            say(f"job {info['submission_id']}: " + ("stop requested" if stopped else "already ended"))
            if stopped:
                say(f"job {info['submission_id']}: {wait_terminal(client, info['submission_id'])}")
        except SlimeforgeError as exc:
            say(str(exc))
    if head:
        pid = stop_recorded_head(state_dir(info["ray_port"]), say)
        say(f"Ray head pid {pid} stopped" if pid else "no running Ray head was recorded for this port")
        if info["container_id"]:
            (runner or Runner()).run(["docker", "stop", "--time", "60", info["container_id"]], step="docker stop", check=False)
            say(f"container {info['container_id'][:12]} stopped")
