"""What a run that went through Ray's Jobs API recorded, and acting on it (host, container and
Ray-cluster targets): run.status, run.logs and run.stop.

A launch records the run token in <run dir>/run_token, the job's submission id in
<run dir>/submission_id (its metadata carries the run token), the cluster it went to in
<run dir>/ray_address, the container id in <run dir>/container.id (the container is labelled with
the run), and the Ray head in the state dir `$SLIMEFORGE_STATE_DIR/ray-<port>/head.json` (pid,
start time, boot id, the run; default ~/.local/state/slimeforge). Every call reads those records
through runrecord.py (validated) and proves, at the moment of acting, that what it acts on is this
run's (ownership.py); anything else is refused, saying what was found and what was expected.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ...errors import ConfigError, Problem, SlimeforgeError
from ...proc import Runner
from ...records import RecordError
from .. import ownership
from ..headstate import HEAD_RECORD, state_dir
from ..runrecord import RunRecord, Unreachable, container_check, head_check, head_gone, jobs_api, ray_job, ray_job_check, read_run
from .base import RunStatus, Say, Target

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


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


def recorded(run_dir: str | os.PathLike[str]) -> RunRecord:
    """What a launch recorded in a run directory (by the target or launch.sh), validated."""
    return read_run(run_dir)


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


def status_data(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    rec = read_run(run_dir)
    job, verdict = _proved_job(rec)
    head = None
    if not rec.attached and rec.container_id is None:
        try:
            h, hv = head_check(rec, state_dir(rec.ray_port))
            head = h.pid if h is not None and hv.ours else None
        except RecordError:
            head = None
    info = {"run_dir": str(rec.run_dir), "exp_id": rec.exp_id, "submission_id": rec.submission_id, "address": rec.address,
            "container_id": rec.container_id, "ray_port": rec.ray_port, "run_token": rec.run_token, "attached": rec.attached}
    if job is None:
        return {**info, "status": "GONE", "message": verdict.reason, "start_time": None, "end_time": None, "head_pid": head}
    return {**info, "status": str(job.get("status")), "message": job.get("message") or "", "start_time": job.get("start_time"),
            "end_time": job.get("end_time"), "head_pid": head}


def status(run_dir: str | os.PathLike[str]) -> RunStatus:
    st = status_data(run_dir)
    head = ("a cluster slimeforge did not start (no head of ours)" if st["attached"]
            else f"Ray head pid {st['head_pid']} (started by slimeforge for this run)" if st["head_pid"]
            else "in container " + st["container_id"][:12] if st["container_id"] else "no live Ray head of this run here")
    lines = (f"{st['submission_id']}: {st['status']}" + (f" ({st['message']})" if st["message"] else ""),
             f"  cluster {st['address']}; {head}", f"  run directory {st['run_dir']} (job.log)")
    return RunStatus(lines, st)


def logs(run_dir: str | os.PathLike[str], follow_logs: bool = False, stream: IO[str] | None = None) -> None:
    stream = stream or sys.stdout
    rec = read_run(run_dir)
    job, verdict = _proved_job(rec)
    if job is None:
        raise SlimeforgeError(f"{rec.run_dir}: {verdict.reason}; its log up to then is in {rec.run_dir / 'job.log'}")
    if follow_logs:
        from ray.job_submission import JobSubmissionClient

        follow(JobSubmissionClient(rec.address), _launched(rec), rec.run_dir / "job.log", stream)
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


def stop(run_dir: str | os.PathLike[str], head: bool = False, say=print, runner: Runner | None = None, docker: str = "docker") -> int:
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


class JobsApiTarget(Target):
    """status, logs and stop of a run whose job went through a Ray Jobs API (launch.sh's head here,
    or a running cluster's): read from the run's records, each proved this run's first."""

    def status(self, rundir: Path) -> RunStatus:
        return status(rundir)

    def logs(self, rundir: Path, follow: bool, stream: IO[str]) -> int | None:
        logs(rundir, follow, stream)
        return None

    def stop(self, rundir: Path, *, head: bool = False, say: Say = print, runner: Runner | None = None) -> int:
        return stop(rundir, head=head, say=say, runner=runner)
