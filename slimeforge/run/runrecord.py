"""A run directory's records, read back through the one reader, and the facts the ownership proofs
compare them with (the Ray head's process, the Jobs API, docker, Slurm), gathered at the moment of acting.

    read_run(run_dir) -> RunRecord             every record validated (RecordError names the bad file)
    read_head(state_dir) -> HeadRecord | None  the head launch.sh recorded on a GCS port
    head_check / ray_job_check / container_check / slurm_check -> ownership.Verdict
    live(rec) -> (verdict or None, what)       is the run's job still running? (guard_render's question)
    guard_render(out)                          refuse to re-render a live run's directory; keep an ended one's record

Records of a run directory and who writes them:
    plan.json            invoke run (render)             rundir.read_plan
    run_token            invoke run (launch), launch.sh  32 hex digits, the run's secret-less identity
    submission_id        launch.sh                       <exp_id>-YYYYmmdd-HHMMSS-<6 hex>
    ray_address          launch.sh                       http(s)://HOST:PORT, the Jobs API the job went to
    container.id         docker run --cidfile            64 hex digits
    slurm_job_id         slurm.submit                    digits
    slurm_submitted_at   slurm.submit                    epoch seconds
and in the state directory, per GCS port: head.json (launch.sh: pid, start time, boot id, exp_id, run token).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import readback
from ..atomic import dir_lock, write_file
from ..errors import ConfigError, Problem, SlimeforgeError
from ..proc import Runner
from ..schema import WHOLE_RE
from . import ownership
from .headstate import HEAD_RECORD, read_head, state_dir
from .ownership import HeadRecord, Verdict
from .rundir import read_plan
from .targets.jobsapi import JobDoc, JobsApi, Unreachable
from .targets.slurm_job import CannotTell, job_answer

JOB_ID_RE = re.compile(r"[1-9][0-9]{0,11}")
SUBMISSION_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}-[0-9]{8}-[0-9]{6}-[0-9a-f]{6}")
ADDRESS_RE = re.compile(r"https?://[A-Za-z0-9_.%\[\]:-]{1,253}:[0-9]{1,5}/?")
SUBMITTED_AT_RE = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,6})?")
# The records of one launch; kept under history/<n>/ when the directory is rendered again.
LAUNCH_RECORDS = ("run_token", "submission_id", "ray_address", "container.id", "slurm_job_id", "slurm_submitted_at")
HISTORY = "history"
# run.status/stop/logs ask the head about the recorded job: a head that is not there is told within
# API_CONNECT_S; one that took the connection gets API_TOTAL_S to answer, because a dashboard beside a
# busy job (or on a loaded host) can take more than 5 s to answer one job's info.
API_CONNECT_S = 5.0
API_TOTAL_S = 20.0

_LINE_RECORDS: dict[str, tuple[re.Pattern[str], str]] = {
    "run_token": (ownership.RUN_TOKEN_RE, "32 lowercase hex digits (written at launch)"),
    "submission_id": (SUBMISSION_ID_RE, "<exp_id>-YYYYmmdd-HHMMSS-<6 hex digits> (written by launch.sh)"),
    "ray_address": (ADDRESS_RE, "http://HOST:PORT of the Ray Jobs API (written by launch.sh)"),
    "container.id": (ownership.CONTAINER_ID_RE, "a full container id, 64 hex digits (docker run --cidfile)"),
    "slurm_job_id": (JOB_ID_RE, "a Slurm job id, digits (sbatch --parsable)"),
    "slurm_submitted_at": (SUBMITTED_AT_RE, "seconds since the epoch (written at sbatch)"),
}


@dataclass(frozen=True)
class RunRecord:
    run_dir: Path
    plan: dict
    exp_id: str
    ray_port: int
    dashboard_port: int
    run_token: str | None
    submission_id: str | None
    ray_address: str | None
    container_id: str | None
    slurm_job_id: str | None
    slurm_submitted_at: float | None

    @property
    def is_slurm(self) -> bool:
        return "slurm" in self.plan and self.slurm_job_id is not None

    @property
    def local_address(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def address(self) -> str:
        return self.ray_address or self.local_address

    @property
    def attached(self) -> bool:
        """Submitted to a cluster slimeforge did not start here (--address, --cluster): no head of ours."""
        return self.ray_address is not None and self.ray_address.rstrip("/") != self.local_address


def read_record(run_dir: Path, name: str) -> str | None:
    pattern, accepted = _LINE_RECORDS[name]
    return readback.read_text(run_dir / name, name, pattern, accepted)


def read_run(run_dir: str | os.PathLike[str]) -> RunRecord:
    """Every record of a rendered run directory, validated; RecordError names the first bad one."""
    run_dir = Path(run_dir)
    plan = read_plan(run_dir)
    if plan is None:
        raise ConfigError(str(run_dir), [Problem("run directory", "has no plan.json", str(run_dir),
                                                 "runs/<exp_id> of a rendered recipe")])
    values = {name: read_record(run_dir, name) for name in _LINE_RECORDS}
    sid = values["submission_id"]
    if sid is not None and not sid.startswith(plan["exp_id"] + "-"):
        raise readback.RecordError(run_dir / "submission_id", "submission_id",
                                   f"is not a submission of experiment {plan['exp_id']!r}",
                                  _LINE_RECORDS["submission_id"][1], sid)
    at = values["slurm_submitted_at"]
    return RunRecord(run_dir=run_dir.resolve(), plan=plan, exp_id=plan["exp_id"], ray_port=plan["recipe"]["ray_port"],
                     dashboard_port=plan["recipe"]["ray_dashboard_port"], run_token=values["run_token"],
                     submission_id=sid,
                     ray_address=values["ray_address"], container_id=values["container.id"],
                     slurm_job_id=values["slurm_job_id"],
                     slurm_submitted_at=float(at) if at is not None else None)


def new_run_token() -> str:
    return secrets.token_hex(16)


def write_run_token(run_dir: Path, token: str) -> None:
    if not ownership.RUN_TOKEN_RE.fullmatch(token):
        raise SlimeforgeError(f"run token {token!r} is not 32 hex digits")
    write_file(run_dir / "run_token", token + "\n")


# --- the Ray head ----------------------------------------------------------------------------------


def head_check(rec: RunRecord, state_dir: Path) -> tuple[HeadRecord | None, Verdict]:
    if rec.attached:
        return None, ownership.foreign(f"the job went to {rec.ray_address}, a cluster slimeforge did not start here: "
                                       "no Ray head of ours to stop")
    head = read_head(state_dir)
    if head is None:
        return None, ownership.ended(f"no Ray head is recorded on port {rec.ray_port} ({state_dir / HEAD_RECORD})")
    return head, ownership.head_verdict(head, ownership.proc_facts(head.pid), rec.exp_id, rec.run_token)


# --- the Ray Jobs API --------------------------------------------------------------------------------


def ray_job(rec: RunRecord) -> JobDoc | None:
    """The job's info, validated (JobInfo.parse), as a dict; None when the head does not know it."""
    assert rec.submission_id is not None
    info = JobsApi(rec.address, connect_s=API_CONNECT_S, total_s=API_TOTAL_S).job(rec.submission_id)
    return None if info is None else info.as_dict()


def ray_job_check(rec: RunRecord) -> tuple[JobDoc | None, Verdict]:
    assert rec.submission_id is not None
    job = ray_job(rec)
    if job is None:
        return None, ownership.ray_job_verdict(rec.submission_id, None, None, rec.exp_id, rec.run_token)
    meta = job.get("metadata") if isinstance(job.get("metadata"), dict) else {}
    return job, ownership.ray_job_verdict(rec.submission_id, meta, str(job.get("status")), rec.exp_id, rec.run_token)


# --- docker --------------------------------------------------------------------------------------------


def docker_inspect(container_id: str, runner: Runner, docker: str = "docker") -> dict | None:
    r = runner.run([docker, "inspect", "--type", "container", "--", container_id], step="docker inspect", check=False,
                   timeout=30)
    if r.returncode != 0:
        if "No such" in r.stderr or "no such" in r.stderr:
            return None
        raise Unreachable(f"docker inspect {container_id[:12]} failed: {r.stderr.strip()[-300:]}")
    try:
        doc = readback.json_loads(r.stdout)
    except ValueError:
        raise Unreachable(f"docker inspect {container_id[:12]} printed something that is not JSON") from None
    return doc[0] if isinstance(doc, list) and doc and isinstance(doc[0], dict) else None


def container_check(rec: RunRecord, runner: Runner) -> Verdict:
    assert rec.container_id is not None
    return ownership.container_verdict(rec.container_id, docker_inspect(rec.container_id, runner), rec.exp_id,
                                       rec.run_token)


# --- Slurm ----------------------------------------------------------------------------------------------


def job_info(job_id: str, runner: Runner | None = None) -> dict[str, str]:
    """What Slurm says of the job (targets/slurm_job.py); {} once Slurm has forgotten it (MinJobAge).
    Raises Unreachable when Slurm does not answer, or its answer cannot tell (empty, unparsable,
    about another job, ambiguous): never taken for "ended"."""
    try:
        return job_answer(job_id, runner)
    except CannotTell as exc:
        raise Unreachable(str(exc)) from None


def slurm_check(rec: RunRecord, runner: Runner | None = None, user: str | None = None) -> tuple[dict[str, str],
                                                                                                Verdict]:
    assert rec.slurm_job_id is not None
    import getpass

    info = job_info(rec.slurm_job_id, runner)
    return info, ownership.slurm_verdict(rec.slurm_job_id, info, user=user or getpass.getuser(),
                                         job_name=f"sf-{rec.exp_id}",
                                         run_token=rec.run_token, workdir=str(rec.run_dir),
                                         submitted_at=rec.slurm_submitted_at)


# --- a live run's directory is never rewritten ----------------------------------------------------------


def stop_hint(rec: RunRecord) -> str:
    return f"invoke run.stop {rec.run_dir}" + ("" if rec.is_slurm or rec.attached else " --head")


def live(rec: RunRecord, runner: Runner | None = None) -> tuple[bool | None, str]:
    """Whether the job this directory recorded still runs: True, False, or None (cannot be learned)."""
    runner = runner or Runner()
    try:
        if rec.slurm_job_id is not None and "slurm" in rec.plan:
            _, v = slurm_check(rec, runner)
            return (v.state != ownership.ENDED), f"Slurm job {rec.slurm_job_id}: {v.reason}"
        if rec.container_id is not None:
            v = container_check(rec, runner)
            if v.state != ownership.ENDED:
                return True, f"container {rec.container_id[:12]}: {v.reason}"
        if rec.submission_id is not None:
            _, v = ray_job_check(rec)
            return (v.state != ownership.ENDED), f"Ray job {rec.submission_id}: {v.reason}"
    except Unreachable as exc:
        if head_gone(rec):
            return False, f"Ray job {rec.submission_id}: the Ray head it ran on is gone"
        return None, str(exc)
    return False, "no job recorded"


def head_gone(rec: RunRecord) -> bool:
    """A job on our own head on this host ran nowhere else: when that head is proved gone (no
    record, or the recorded process has exited), so is the job. Not for a cluster we did not
    start, nor a head inside a container, nor when the head record is unreadable."""
    if rec.submission_id is None or rec.attached or rec.container_id is not None or "slurm" in rec.plan:
        return False  # the head was elsewhere: a cluster we did not start, a container, a Slurm allocation
    try:
        head = read_head(state_dir(rec.ray_port))
    except readback.RecordError:
        return False
    return head is None or not ownership.head_alive(head, ownership.proc_facts(head.pid))


def guard_render(out: str | os.PathLike[str], runner: Runner | None = None, exp_id: str | None = None) -> int | None:
    """Before a render of experiment `exp_id` (dry run or launch) into `out`: refuse when the job
    recorded there still runs or its state cannot be learned; when it has ended, move its records
    to history/<n>/ (and copy the rendered files beside them) so nothing about a past job is lost.
    Returns n, or None. Another experiment's directory is left as it is (the render refuses it)."""
    out = Path(out)
    try:
        plan = None if not out.is_dir() or out.is_symlink() else read_plan(out)
    except ConfigError:
        return None  # not a run directory: out_problems refuses it with its reason
    if plan is None or (exp_id is not None and plan["exp_id"] != exp_id):
        return None
    rec = read_run(out)
    if not any(getattr(rec, f) is not None for f in ("submission_id", "container_id", "slurm_job_id")):
        return None
    running, what = live(rec, runner)
    if running is not False:
        job = rec.slurm_job_id and f"Slurm job {rec.slurm_job_id}" or rec.submission_id or rec.container_id
        state = "is still running" if running else "may still be running (its state cannot be learned)"
        raise ConfigError(str(out), [Problem("--out",
                                             f"is the run directory of {job}, which {state}: {what}; rendering here "
                                             "would lose "
                                             "the record that stops it", str(out),
                                             f"`{stop_hint(rec)}` first, or another --out")])
    with dir_lock(out):
        return archive(out)


def archive(run_dir: Path) -> int:
    """Move this launch's records into history/<n>/ (n = 1, 2, ...), with a copy of what was rendered."""
    hist = run_dir / HISTORY
    if hist.is_symlink() or (hist.exists() and not hist.is_dir()):
        raise ConfigError(str(run_dir), [Problem(HISTORY, "is not a directory", str(hist),
                                                 "a directory slimeforge keeps past launches in")])
    hist.mkdir(exist_ok=True)
    # Only names of ASCII digits count (`history/²` is someone else's: str.isdigit() took it, int() did not).
    taken = [int(p.name) for p in hist.iterdir() if WHOLE_RE.fullmatch(p.name)]
    n = max(taken, default=0) + 1
    # A fresh staging name: a left-over `.1.tmp` (a file, a symlink, someone's directory) is not ours to remove.
    tmp = Path(tempfile.mkdtemp(prefix=f".{n}.", suffix=".tmp", dir=hist))
    for name in os.listdir(run_dir):
        path = run_dir / name
        if (path.is_file() and not path.is_symlink() and name not in LAUNCH_RECORDS and not name.startswith(".")
                and name != "job.log" and not name.startswith("slurm-")):
            shutil.copy2(path, tmp / name)  # what was rendered: plan.json, launch.sh, slime.args, ...
    os.rename(tmp, hist / str(n))
    for name in LAUNCH_RECORDS:  # moved last: until here, the records still stand where run.stop looks
        if (run_dir / name).is_file():
            os.replace(run_dir / name, hist / str(n) / name)
    return n
