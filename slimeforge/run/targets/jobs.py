"""What a run that went through Ray's Jobs API recorded, and acting on it (host, container and
Ray-cluster targets): run.status, run.logs and run.stop read these records.

A launch records the job's submission id in <run dir>/submission_id, the cluster it went to in
<run dir>/ray_address, the container id in <run dir>/container.id, and the Ray head's pid in the
state dir `$SLIMEFORGE_STATE_DIR/ray-<port>/head.pid` (default ~/.local/state/slimeforge). Only what
is recorded is ever stopped.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ...errors import ConfigError, Problem, SlimeforgeError
from ...proc import Runner, pid_alive
from ..headstate import HEAD_PID, recorded_head, state_dir
from ..rundir import read_plan
from .base import RunStatus, Say

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


@dataclass(frozen=True)
class JobRecord:
    """What a launch recorded in a run directory (by the target or launch.sh)."""

    run_dir: str
    exp_id: str
    submission_id: str | None
    address: str
    container_id: str | None
    ray_port: int


def recorded(run_dir: str | os.PathLike) -> JobRecord:
    path = Path(run_dir)
    plan = read_plan(path)
    if plan is None:
        raise ConfigError(str(path), [Problem("run directory", "has no plan.json", str(path), "runs/<exp_id> of a rendered recipe")])
    rec = plan["recipe"]

    def read(name: str) -> str | None:
        p = path / name
        return (p.read_text().strip() or None) if p.is_file() else None

    return JobRecord(str(path.resolve()), plan["exp_id"], read("submission_id"),
                     read("ray_address") or f"http://127.0.0.1:{rec['ray_dashboard_port']}", read("container.id"), rec["ray_port"])


def stop_recorded_head(sdir: Path, say: Say = print, timeout: float = 60) -> int | None:
    """SIGTERM the head an earlier launch recorded in `sdir` (if it still runs); nothing else."""
    pid = recorded_head(sdir)
    if pid:
        say(f"[slimeforge] stopping the Ray head of an earlier launch (pid {pid})")
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.2)
    (sdir / HEAD_PID).unlink(missing_ok=True)
    return pid


def follow(client: Any, submission_id: str, log_path: Path, stream: IO[str]) -> None:
    """Stream the job's logs to `stream` and append them to `log_path` until the job ends."""
    import asyncio  # here: run.status and dry runs never need it

    async def tail() -> None:
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


def wait_terminal(client: Any, submission_id: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    status = str(client.get_job_status(submission_id))
    while not any(t in status for t in TERMINAL) and time.monotonic() < deadline:
        time.sleep(0.5)
        status = str(client.get_job_status(submission_id))
    return status.rsplit(".", 1)[-1]


def client(info: JobRecord) -> tuple[Any, str]:
    """The Jobs API client of the recorded cluster, and the recorded submission id."""
    from ray.job_submission import JobSubmissionClient

    if not info.submission_id:
        raise ConfigError(info.run_dir, [Problem("submission_id", "this run directory was never launched", None, "`invoke run RECIPE` first", show_value=False)])
    try:
        return JobSubmissionClient(info.address), info.submission_id
    except Exception as exc:  # noqa: BLE001
        raise SlimeforgeError(f"{info.run_dir}: the Ray cluster at {info.address} does not answer ({exc}); "
                              "the head that ran this job is gone (its job.log is in the run directory)") from None


def status(run_dir: str | os.PathLike) -> RunStatus:
    info = recorded(run_dir)
    jobs, sid = client(info)
    job = jobs.get_job_info(sid)
    head_pid = recorded_head(state_dir(info.ray_port))
    data = {**info.__dict__, "status": str(job.status).rsplit(".", 1)[-1], "message": job.message,
            "start_time": job.start_time, "end_time": job.end_time, "head_pid": head_pid}
    lines = (f"{sid}: {data['status']}" + (f" ({job.message})" if job.message else ""),
             f"  cluster {info.address}; " + (f"Ray head pid {head_pid} (started by slimeforge)" if head_pid else "no Ray head recorded by slimeforge here"),
             f"  run directory {info.run_dir} (job.log)")
    return RunStatus(lines, data)


def logs(run_dir: str | os.PathLike, follow_logs: bool, stream: IO[str]) -> None:
    info = recorded(run_dir)
    jobs, sid = client(info)
    if follow_logs:
        follow(jobs, sid, Path(info.run_dir) / "job.log", stream)
    else:
        stream.write(jobs.get_job_logs(sid))


def stop(run_dir: str | os.PathLike, head: bool = False, say: Say = print, runner: Runner | None = None) -> None:
    """Stop the recorded job; with `head`, also the Ray head that slimeforge started (its recorded
    pid) and the recorded container. Nothing that slimeforge did not record is touched."""
    info = recorded(run_dir)
    if info.submission_id:
        try:
            jobs, sid = client(info)
            stopped = jobs.stop_job(sid)
            say(f"job {sid}: " + ("stop requested" if stopped else "already ended"))
            if stopped:
                say(f"job {sid}: {wait_terminal(jobs, sid)}")
        except SlimeforgeError as exc:
            say(str(exc))
    if head:
        pid = stop_recorded_head(state_dir(info.ray_port), say)
        say(f"Ray head pid {pid} stopped" if pid else "no running Ray head was recorded for this port")
        if info.container_id:
            (runner or Runner()).run(["docker", "stop", "--time", "60", info.container_id], step="docker stop", check=False)
            say(f"container {info.container_id[:12]} stopped")
