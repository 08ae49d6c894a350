"""Proofs that a thing slimeforge is about to act on (stop, ask the status of, read the logs of) is
the one this run launched. Each proof is a pure function of the record and of what the system says
now, so each case is unit-tested without a cluster; the callers gather the facts at the moment of
acting and act only on a verdict that is `ours`.

What is compared, per kind:
- Ray head: pid AND the process's start time (field 22 of /proc/PID/stat, in clock ticks since
  boot) AND the boot id (/proc/sys/kernel/random/boot_id: a start time means nothing after a
  reboot) AND the exact `ray start --head ...` argv launch.sh recorded, with the run token in the
  process's environment, AND the run it was started for (exp_id and the run token of the run
  directory). A pid the kernel gave to another process, or a record edited by hand, never matches
  them all. The process proof is scripts/headrecord.py's, the one launch.sh runs before it stops
  an earlier head (the node agent proves what cluster.up started the same way: scripts/hostrecord.py,
  both with scripts/procproof.py).
- Ray job: its metadata, set at submit by launch.sh (slimeforge_exp_id, slimeforge_run_token).
- Container: the labels slimeforge puts on the containers it starts (slimeforge.exp_id,
  slimeforge.run_token) and the full id docker recorded (--cidfile).
- Slurm job: the user (the caller), the job name (sf-<exp_id>), the comment slimeforge passes at
  submit (slimeforge:<run token>), the working directory (the run directory) and, when recorded,
  the submit time: a job id the controller reused for someone else's job fails each of them.

A verdict is one of: OURS (act on it), ENDED (it is gone; nothing to act on), FOREIGN (something
else holds the id: refuse, say what was found and what was expected).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..scripts import headrecord, procproof
from ..scripts.headrecord import HeadRecord, ProcFacts

OURS, ENDED, FOREIGN = procproof.OURS, procproof.ENDED, procproof.FOREIGN
RUN_TOKEN_RE, BOOT_ID_RE = procproof.TOKEN_RE, procproof.BOOT_ID_RE
CONTAINER_ID_RE = re.compile(r"[0-9a-f]{64}")
LABEL_EXP_ID, LABEL_RUN_TOKEN = "slimeforge.exp_id", "slimeforge.run_token"
META_EXP_ID, META_RUN_TOKEN = "slimeforge_exp_id", "slimeforge_run_token"
SLURM_COMMENT_PREFIX = "slimeforge:"
SUBMIT_TIME_SLACK_S = 300  # the record is written right after sbatch returns; clocks of login nodes drift a little


@dataclass(frozen=True)
class Verdict:
    state: str  # OURS, ENDED or FOREIGN
    reason: str  # what was found (and, when FOREIGN, what was expected)

    @property
    def ours(self) -> bool:
        return self.state == OURS


def ours(reason: str) -> Verdict:
    return Verdict(OURS, reason)


def ended(reason: str) -> Verdict:
    return Verdict(ENDED, reason)


def foreign(reason: str) -> Verdict:
    return Verdict(FOREIGN, reason)


# --- Ray head ------------------------------------------------------------------------------------


# The record (HeadRecord), the facts of a pid (ProcFacts) and the proof that it still is the
# recorded head: headrecord.py, the program launch.sh runs; here, whether that head is this run's.
proc_facts, boot_id, is_recorded_head = headrecord.proc_facts, procproof.boot_id, headrecord.is_recorded_head


def stat_start_time(stat_text: str) -> tuple[int, str] | None:
    """(start time, state) from the text of /proc/PID/stat, or None if it is not one."""
    parsed = procproof.parse_stat(stat_text)
    return None if parsed is None else (parsed[2], parsed[0])


def head_verdict(record: HeadRecord, now: ProcFacts | None, exp_id: str, run_token: str | None) -> Verdict:
    """Whether the head `record` names is the live process `now` and was started for this run."""
    if record.exp_id != exp_id or run_token is None or record.run_token != run_token:
        return foreign(f"the Ray head recorded on this port (pid {record.pid}) was started for run {record.exp_id!r} "
                       f"(token {record.run_token[:8]}...), not this one ({exp_id!r}, token "
                       f"{(run_token or 'none')[:8]}...)")
    state, why = headrecord.head_state(record, now)
    if state != OURS:
        return Verdict(state, why)
    return ours(f"Ray head pid {record.pid} (started for {exp_id}, start time and boot id match)")


def head_alive(record: HeadRecord, now: ProcFacts | None) -> bool:
    """The recorded head still runs (whatever run it was started for): pid, start time, boot id,
    argv and run token match."""
    return headrecord.head_state(record, now)[0] == OURS


# --- Ray job -------------------------------------------------------------------------------------


def ray_job_verdict(submission_id: str, metadata: Mapping[str, Any] | None, status: str | None, exp_id: str,
                    run_token: str | None) -> Verdict:
    """`metadata`/`status`: what the Jobs API says of the submission id (None: it does not know it)."""
    if metadata is None:
        return ended(f"job {submission_id} is unknown to the Ray head (the head was restarted or replaced, or the job "
                     "was never submitted there)")
    want = {META_EXP_ID: exp_id, META_RUN_TOKEN: run_token}
    got = {k: metadata.get(k) for k in want}
    if run_token is None or got != want:
        return foreign(f"job {submission_id} carries metadata {got}, expected {want}: it was not submitted by this run")
    if status in ("SUCCEEDED", "FAILED", "STOPPED"):
        return ended(f"job {submission_id} has ended ({status})")
    return ours(f"job {submission_id} ({status}), submitted by this run")


# --- container -----------------------------------------------------------------------------------


def container_verdict(container_id: str, inspect: Mapping[str, Any] | None, exp_id: str,
                      run_token: str | None) -> Verdict:
    """`inspect`: `docker inspect --type container` of the full id (None: docker has no such container)."""
    if inspect is None:
        return ended(f"container {container_id[:12]} no longer exists")
    if inspect.get("Id") != container_id:
        return foreign(f"docker answered for container {str(inspect.get('Id'))[:12]}, not {container_id[:12]}")
    labels = (inspect.get("Config") or {}).get("Labels") or {}
    want = {LABEL_EXP_ID: exp_id, LABEL_RUN_TOKEN: run_token}
    got = {k: labels.get(k) for k in want}
    if run_token is None or got != want:
        return foreign(f"container {container_id[:12]} carries labels {got}, expected {want}: slimeforge did not "
                       "start it for this run")
    state = inspect.get("State") or {}
    if not state.get("Running"):
        return ended(f"container {container_id[:12]} has exited ({state.get('Status', 'not running')})")
    return ours(f"container {container_id[:12]} (labels match this run)")


# --- Slurm ---------------------------------------------------------------------------------------

SLURM_ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
               "DEADLINE")


def slurm_user(info: Mapping[str, str]) -> str:
    """UserId=alice(1000) -> alice."""
    return info.get("UserId", "").split("(", 1)[0]


def parse_slurm_time(text: str) -> float | None:
    """scontrol's times (local time, 2026-11-25T08:40:00) as epoch seconds."""
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def slurm_verdict(job_id: str, info: Mapping[str, str], *, user: str, job_name: str, run_token: str | None,
                  workdir: str,
                  submitted_at: float | None) -> Verdict:
    """`info`: `scontrol show job -o ID` as key/values ({} when Slurm no longer knows the job)."""
    if not info:
        return ended(f"Slurm job {job_id} is unknown to Slurm (it ended a while ago)")
    found = {"user": slurm_user(info), "name": info.get("JobName"), "comment": info.get("Comment"),
             "workdir": os.path.normpath(info.get("WorkDir", "")) if info.get("WorkDir") else None}
    want = {"user": user, "name": job_name,
            "comment": f"{SLURM_COMMENT_PREFIX}{run_token}" if run_token else "(a run token)",
            "workdir": os.path.normpath(workdir)}
    wrong = [k for k in want if found[k] != want[k]]
    if submitted_at is not None and not wrong:
        at = parse_slurm_time(info.get("SubmitTime", ""))
        if at is None or abs(at - submitted_at) > SUBMIT_TIME_SLACK_S:
            wrong.append("submit time")
            wanted_at = datetime.fromtimestamp(submitted_at).strftime("%Y-%m-%dT%H:%M:%S")
            found["submit time"], want["submit time"] = info.get("SubmitTime"), wanted_at
    if wrong:
        return foreign(f"Slurm job {job_id} is not this "
                       "run's: " + "; ".join(f"{k} {found[k]!r}, expected {want[k]!r}" for k in wrong))
    state = info.get("JobState", "")
    if state in SLURM_ENDED:
        return ended(f"Slurm job {job_id} has ended ({state})")
    return ours(f"Slurm job {job_id} ({state}), submitted by this run")
