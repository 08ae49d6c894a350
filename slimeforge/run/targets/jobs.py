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
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NotRequired, TypedDict

from ...errors import ConfigError, OperationFailed, Problem, SlimeforgeError
from ...proc import Runner
from ...readback import RecordError
from ...schema import printable
from .. import ownership
from ..headstate import HEAD_RECORD, state_dir
from ..runrecord import (
    SUBMISSION_ID_RE,
    RunRecord,
    Unreachable,
    container_check,
    head_check,
    head_gone,
    ray_job,
    ray_job_check,
    read_run,
)
from .base import RunStatus, Say, Target
from .jobsapi import TERMINAL, JobDoc, JobInfo, JobsApi, NoAnswer, TooLarge

POLL_S = 2.0  # how often a follower asks for the job's state and log
LOST_S = 90.0  # a follower gives up after the Jobs API has not answered for this long (a head restarting takes less)
LOST_S_ENV = "SLIMEFORGE_HEAD_LOST_S"


def lost_seconds(environ: dict[str, str] | None = None) -> float:
    """LOST_S, or $SLIMEFORGE_HEAD_LOST_S (whole seconds, 1..86400) where it is set."""
    value = (os.environ if environ is None else environ).get(LOST_S_ENV)
    if value is None:
        return LOST_S
    if not re.fullmatch(r"[0-9]{1,5}", value) or not 1 <= int(value) <= 86400:
        raise ConfigError("environment", [Problem(LOST_S_ENV, "is not a number of seconds", value,
                                                  "whole seconds, 1..86400")])
    return float(value)


def terminal_text(text: str) -> str:
    """A job's log as it may reach a terminal: line by line, every control character but the line
    ends replaced (schema.printable): a log cannot move the cursor, recolour or retitle the terminal.
    job.log keeps the bytes as they came."""
    return "\n".join(printable(line) for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"))


class JobVanished(OperationFailed):
    """The head no longer knows a job it ran a moment ago: it was restarted or replaced (exit 1)."""


def follow(api: JobsApi, sid: str, log_path: Path | None, stream: IO[str], say: Say = print, *,
           poll_s: float | None = None,
           lost_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> JobInfo:
    """Print the job's log as it grows (and append it to `log_path`) until the job has ended; its
    final info. The log is read again whenever the job still runs: a stream that ends early is never
    an end. NoAnswer when the Jobs API has not answered for `lost_s` seconds; JobVanished when the
    head no longer knows the job."""
    lost_s = lost_seconds() if lost_s is None else lost_s
    poll_s = POLL_S if poll_s is None else poll_s
    shown, logs_ok, last_answer, said_quiet = 0, True, clock(), False
    while True:
        try:
            info = api.job(sid)
            if info is None:
                raise JobVanished(f"job {sid} is no longer known to the Ray head at {api.address}: the head was "
                                  "restarted or replaced, "
                                  "and the job with it")
            if logs_ok:
                try:
                    text = api.logs(sid)
                except TooLarge as exc:
                    logs_ok = False
                    say(f"[slimeforge] {exc}; following the job's state only (the whole log stays on the head)")
                else:
                    if len(text) < shown:  # not the log we were printing (the head's log was replaced): print it anew
                        say(f"[slimeforge] the log of job {sid} started over on the head; printing it from its start")
                        shown = 0
                    new = text[shown:]
                    shown = len(text)
                    if new:
                        if log_path is not None:
                            with log_path.open("a", encoding="utf-8") as log:
                                log.write(new)
                        stream.write(terminal_text(new))
                        stream.flush()
            last_answer, said_quiet = clock(), False
        except NoAnswer as exc:
            if clock() - last_answer >= lost_s:
                raise NoAnswer(f"{exc}; no answer for {lost_s:g} s while following job {sid}") from None
            if not said_quiet:
                say(f"[slimeforge] the Jobs API does not answer ({exc}); asking again for up to {lost_s:g} s")
                said_quiet = True
            time.sleep(poll_s)
            continue
        if info.ended:
            return info
        time.sleep(poll_s)


def wait_running(api: JobsApi, sid: str, *, timeout: float, poll_s: float = 0.5) -> JobInfo:
    """The job's info once it runs or has ended (or is still PENDING after `timeout` s)."""
    deadline = time.monotonic() + timeout
    while True:
        info = api.job(sid)
        if info is None:
            raise JobVanished(f"job {sid} is not known to the Ray head at {api.address} right after its submission")
        if info.status != "PENDING" or time.monotonic() > deadline:
            return info
        time.sleep(poll_s)


def exit_code(info: JobInfo) -> int:
    """0 when the job SUCCEEDED; else the entrypoint's exit code when Ray knows it (1..255), else 1."""
    if info.status == "SUCCEEDED":
        return 0
    code = info.driver_exit_code
    return code if code is not None and 0 < code < 256 else 1


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
        raise ConfigError(str(rec.run_dir), [Problem("submission_id",
                                                     "this run directory was never launched (no job recorded)", None,
                                                     "`invoke run RECIPE` first", show_value=False)])
    return rec.submission_id


def _proved_job(rec: RunRecord) -> tuple[JobDoc | None, ownership.Verdict]:
    """The job and its verdict; a foreign job is refused here (never shown or acted on as ours)."""
    _launched(rec)
    try:
        job, verdict = ray_job_check(rec)
    except Unreachable as exc:
        raise NoAnswer(f"{rec.run_dir}: {exc}; the head that ran job {rec.submission_id} is gone or unreachable "
                       "(its job.log is in the run directory)") from None
    if verdict.state == ownership.FOREIGN:
        raise SlimeforgeError(f"{rec.run_dir}: refused: {verdict.reason}")
    return job, verdict


class AttemptDoc(TypedDict):
    submission_id: str
    attempt: str
    status: str
    message: NotRequired[str]
    start_time: NotRequired[int | None]
    end_time: NotRequired[int | None]


class JobStatusDoc(TypedDict):
    """run.status --json of a Ray job (slimeforge.run-status/1, docs/json.md); a job found by its
    metadata (no run directory) has the keys only a run directory knows null."""

    run_dir: str | None
    exp_id: str
    submission_id: str | None
    address: str
    container_id: str | None
    ray_port: int | None
    run_token: str | None
    attached: bool
    status: str
    message: str
    start_time: int | None
    end_time: int | None
    head_pid: int | None
    driver_exit_code: NotRequired[int | None]
    attempts: NotRequired[list[AttemptDoc]]


def status_data(run_dir: str | os.PathLike[str]) -> JobStatusDoc:
    rec = read_run(run_dir)
    job, verdict = _proved_job(rec)
    head = None
    if not rec.attached and rec.container_id is None:
        try:
            h, hv = head_check(rec, state_dir(rec.ray_port))
            head = h.pid if h is not None and hv.ours else None
        except RecordError:
            head = None
    doc: JobStatusDoc = {"run_dir": str(rec.run_dir), "exp_id": rec.exp_id, "submission_id": rec.submission_id,
                         "address": rec.address,
                          "container_id": rec.container_id, "ray_port": rec.ray_port, "run_token": rec.run_token,
                         "attached": rec.attached,
                          "status": "GONE", "message": verdict.reason, "start_time": None, "end_time": None,
                         "head_pid": head}
    if job is not None:
        doc["status"], doc["message"] = job["status"], job["message"] or ""
        doc["start_time"], doc["end_time"] = job["start_time"], job["end_time"]
    return doc


def status(run_dir: str | os.PathLike[str]) -> RunStatus:
    st = status_data(run_dir)
    head = ("a cluster slimeforge did not start (no head of ours)" if st["attached"]
            else f"Ray head pid {st['head_pid']} (started by slimeforge for this run)" if st["head_pid"]
            else "in container " + st["container_id"][:12] if st["container_id"] else "no live Ray head of this run "
                                                                                      "here")
    said = printable(st["message"].strip())[:2000]
    lines = [f"{st['submission_id']}: {st['status']}" + (f' (Ray says: "{said}")' if said else ""),
             f"  cluster {st['address']}; {head}", f"  run directory {st['run_dir']} (job.log)"]
    if st["attached"] and st["run_token"] and st["status"] != "GONE":  # --max-restarts: every attempt of this run
        attempts = attempts_of(JobsApi(st["address"]), st["exp_id"], st["run_token"])
        st["attempts"] = [{"submission_id": a.submission_id, "attempt": a.metadata.get(META_ATTEMPT, "1"),
                           "status": a.status} for a in attempts]
        if len(attempts) > 1:
            lines.append(f"  attempts ({len(attempts)}, --max-restarts): "
                         + "; ".join(f"{a.metadata.get(META_ATTEMPT, '?')}. {a.submission_id} "
                                     f"{a.status}" for a in attempts))
    return RunStatus(tuple(lines), st)


def logs(run_dir: str | os.PathLike[str], follow_logs: bool = False, stream: IO[str] | None = None) -> None:
    stream = stream or sys.stdout
    rec = read_run(run_dir)
    job, verdict = _proved_job(rec)
    if job is None:
        raise SlimeforgeError(f"{rec.run_dir}: {verdict.reason}; its log up to then is in {rec.run_dir / 'job.log'}")
    api = JobsApi(rec.address)
    if follow_logs:
        follow(api, _launched(rec), None, stream, lambda text: print(text, file=sys.stderr))
        return
    stream.write(terminal_text(api.logs(_launched(rec))))


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


def stop(run_dir: str | os.PathLike[str], head: bool = False, say=print, runner: Runner | None = None,
         docker: str = "docker") -> int:
    """Stop the recorded job; with `head`, also the Ray head slimeforge started for this run and the
    container it started for it. Each is first proved to be this run's (ownership.py); anything
    else is refused with what was found. Returns the exit code (StopReport.code)."""
    rec = read_run(run_dir)
    runner = runner or Runner()
    report = StopReport()
    if rec.submission_id is None and rec.container_id is None:
        report.add("none", f"{rec.run_dir}: never launched (no job recorded); nothing to stop", say)
        return 2  # nothing to act on: as run.status and run.logs say of it (docs/exit-codes.md, one rule)
    if rec.submission_id is not None:
        _stop_job(rec, report, say, head)
    if head:
        if rec.attached:
            report.add("none", f"the job went to {rec.ray_address}, a Ray cluster slimeforge did not start here: "
                       "there is no head of ours to stop (stop that cluster where it was started, e.g. `invoke "
                       "cluster.down`)", say)
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
    assert sid is not None
    try:
        answer = {"stopped": JobsApi(rec.address).stop(sid)}
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
        report.add("stopped",
                   f"container {cid[:12]} (the Ray head inside it with it); docker said: {said or '(nothing)'}", say)
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


# --- a job found on the cluster, from any machine (no run directory) -------------------------------
#
# What ownership needs travels with the job: its metadata carries the exp_id and the run token
# (jobsubmit.submit), so run.status/run.logs/run.stop work from any machine that can reach the
# Jobs API (`--cluster INVENTORY` or `--address`), given the exp_id or the submission id.

EXP_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # recipe.EXP_ID_RE (recipe pulls in the stack)
META_ATTEMPT = "slimeforge_attempt"  # 1, 2, ...: which submission of the run (--max-restarts)


def _ref_problem(ref: str) -> ConfigError:
    return ConfigError("command line", [Problem("RUN", "is neither an exp_id nor a submission id", ref,
                                                "the recipe's exp_id, e.g. gsm8k-3b, or a submission id "
                                                "<exp_id>-YYYYmmdd-HHMMSS-<6 hex>")])


def attempts_of(api: JobsApi, exp_id: str, run_token: str | None = None) -> list[JobInfo]:
    """The jobs of experiment `exp_id` on the cluster (of one run, when `run_token` is given), oldest first."""
    found = [j for j in api.jobs() if j.metadata.get(ownership.META_EXP_ID) == exp_id
             and (run_token is None or j.metadata.get(ownership.META_RUN_TOKEN) == run_token)]
    return sorted(found, key=lambda j: (j.start_time or 0, j.submission_id))


def find_job(api: JobsApi, ref: str) -> tuple[JobInfo, ownership.Verdict]:
    """The job `ref` names on the cluster (a submission id, or the newest job of an exp_id), proved
    to be slimeforge's job of that experiment by its metadata (ownership.ray_job_verdict)."""
    if len(ref) > 200 or not (SUBMISSION_ID_RE.fullmatch(ref) or EXP_ID_RE.fullmatch(ref)):
        raise _ref_problem(ref)
    if SUBMISSION_ID_RE.fullmatch(ref):
        info = api.job(ref)
        exp_id = ref[: -len("-YYYYmmdd-HHMMSS-abcdef")]
        if info is None:
            raise ConfigError(api.address, [Problem("RUN",
                                                    "is a job the Ray head does not know (it was never submitted "
                                                    "there, or the head "
                                                    "was restarted since)", ref,
                                                    "an exp_id or submission id shown by `invoke run.status`")])
    else:
        exp_id = ref
        jobs = attempts_of(api, ref)
        if not jobs:
            raise ConfigError(api.address, [Problem("RUN",
                                                    "names no job slimeforge submitted to this cluster (no job's "
                                                    "metadata carries "
                                                    "this exp_id)", ref, "the exp_id of a run launched there")])
        info = jobs[-1]
    token = info.metadata.get(ownership.META_RUN_TOKEN)
    token = token if token is not None and ownership.RUN_TOKEN_RE.fullmatch(token) else None
    verdict = ownership.ray_job_verdict(info.submission_id, info.metadata, info.status, exp_id, token)
    if verdict.state == ownership.FOREIGN or token is None:
        raise SlimeforgeError(f"job {info.submission_id} at {api.address}: refused: " +
                              (verdict.reason if verdict.state == ownership.FOREIGN else "it carries no slimeforge "
                                                                                         "run token: slimeforge did "
                                                                                         "not submit it"))
    return info, verdict


def remote_status(address: str, ref: str) -> RunStatus:
    api = JobsApi(address)
    info, _ = find_job(api, ref)
    exp_id = info.metadata[ownership.META_EXP_ID]
    attempts = attempts_of(api, exp_id, info.metadata[ownership.META_RUN_TOKEN])
    # The keys of a run directory's status (docs/json.md), those only a run directory knows null.
    data: JobStatusDoc = {"run_dir": info.metadata.get("slimeforge_run_dir"), "exp_id": exp_id,
                          "submission_id": info.submission_id, "address": api.address,
            "container_id": None, "ray_port": None, "run_token": info.metadata[ownership.META_RUN_TOKEN],
                          "attached": True,
            "status": info.status, "message": info.message, "start_time": info.start_time, "end_time": info.end_time,
                          "head_pid": None,
            "driver_exit_code": info.driver_exit_code,
            "attempts": [{"submission_id": a.submission_id, "attempt": a.metadata.get(META_ATTEMPT, "1"),
                          "status": a.status,
                          "message": a.message, "start_time": a.start_time, "end_time": a.end_time} for a in attempts]}
    lines = [f"{info.submission_id}: {info.status}" + (f" ({info.shown_message})" if info.shown_message else ""),
             f"  experiment {exp_id} on the cluster at {api.address} (found by the job's metadata; no run directory "
             "needed)"]
    if len(attempts) > 1:
        lines.append(f"  attempts ({len(attempts)}, --max-restarts):")
        lines += [f"    {a.metadata.get(META_ATTEMPT, '?')}. {a.submission_id}: "
                  f"{a.status}" + (f" ({a.shown_message})" if a.shown_message else "")
                  for a in attempts]
    return RunStatus(tuple(lines), data)


def remote_logs(address: str, ref: str, follow_logs: bool, stream: IO[str], say: Say) -> int | None:
    api = JobsApi(address)
    info, _ = find_job(api, ref)
    if not follow_logs:
        stream.write(terminal_text(api.logs(info.submission_id)))
        return None
    final = follow(api, info.submission_id, None, stream, say)
    say(f"[slimeforge] job {final.submission_id}: "
        f"{final.status}" + (f" ({final.shown_message})" if final.shown_message else ""))
    return None


def remote_stop(address: str, ref: str, say: Say = print, timeout: float = 120) -> int:
    """Stop the job `ref` names on the cluster, once proved slimeforge's job of that experiment."""
    api = JobsApi(address)
    report = StopReport()
    info, verdict = find_job(api, ref)
    sid = info.submission_id
    if verdict.state == ownership.ENDED:
        report.add("ended", verdict.reason, say)
        return report.code
    stopped = api.stop(sid)
    deadline = time.monotonic() + timeout
    final: JobInfo | None = info
    while time.monotonic() < deadline:
        final = api.job(sid)
        if final is None or final.ended:
            break
        time.sleep(0.5)
    state = "GONE" if final is None else final.status
    if final is None or final.ended:
        report.add("stopped" if stopped else "ended", f"job {sid}: {state}", say)
    else:
        report.add("failed", f"job {sid}: stop requested, still {state} after {timeout:g} s", say)
    return report.code
