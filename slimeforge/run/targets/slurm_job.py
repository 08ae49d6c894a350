"""What Slurm says about one job, read as data: the answer run.status, run.logs, run.stop and the
render guard act on (their ownership proof is run/ownership.slurm_verdict).

    job_answer(job_id, runner) -> {"JobId": ..., "JobName": ..., ...}
        {}          Slurm answered, and it does not know the job (it ended a while ago: MinJobAge)
        CannotTell  no answer, an empty or unparsable one, one about another job, or an ambiguous
                    one: never read as "ended", never a reason to act or to move records

`squeue --json` first (Slurm >= 21.08; scontrol learned --json only in 23.02): its fields are typed and nothing in a
name or a comment can pose as another field (when it fails for another reason than an unknown job id: no --json before
21.08, no JSON plugin in the build, scontrol is asked). Slurm 22.05 ignores --jobs under --json and lists every job it
knows, so the job is picked by its job_id, and exactly one must match. Where squeue has no --json, `scontrol show job
-o` is read with the knowledge of its free-text fields (JobName, Comment, Command, WorkDir, StdOut, Reason, ...): their
values may hold " Key=" themselves, so a key seen twice, or a Comment where scontrol does not print it (between WorkDir
and StdErr), makes the answer ambiguous, and an ambiguous answer is CannotTell.

The keys returned are scontrol's (JobState, ExitCode "N:S", SubmitTime as local
YYYY-mm-ddTHH:MM:SS, ...), whichever way Slurm was asked; control characters become '?'.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

from ...errors import SlimeforgeError
from ...proc import Runner
from ...readback import json_loads
from ...schema import printable

MAX_ANSWER_CHARS = 64 << 20  # Slurm 22.05 lists every job it knows: tens of thousands fit
TIMEOUT_S = 30
# The keys the callers read, and where they come from in squeue's JSON.
JSON_KEYS = {"JobName": "name", "UserId": "user_name", "JobState": "job_state", "Reason": "state_reason",
             "Comment": "comment",
             "WorkDir": "current_working_directory", "NodeList": "nodes"}
REQUIRED = ("JobId", "JobName", "UserId", "JobState")
_KEY_AT = re.compile(r"(?:^| )([A-Za-z][A-Za-z0-9_:/]*)=")


class CannotTell(SlimeforgeError):
    """Slurm's answer does not say what the job is: no answer, empty, unparsable, about another job, or ambiguous."""


def job_answer(job_id: str, runner: Runner | None = None) -> dict[str, str]:
    runner = runner or Runner()
    r = runner.run(["squeue", "--json", "--states=all", f"--jobs={job_id}"], step="squeue --json", check=False,
                   timeout=TIMEOUT_S)
    if r.returncode != 0 and "Invalid job id" not in r.stdout + r.stderr:
        # No --json in this squeue (before 21.08), or no JSON plugin in this build: scontrol's line then.
        r = runner.run(["scontrol", "show", "job", "-o", "--", job_id], step="scontrol show job", check=False,
                       timeout=TIMEOUT_S)
        return _answered(job_id, r.returncode, r.stdout, r.stderr, from_line)
    return _answered(job_id, r.returncode, r.stdout, r.stderr, from_json)


def _answered(job_id: str, code: int, out: str, err: str, parse) -> dict[str, str]:
    if code != 0:
        if "Invalid job id" in out + err:
            return {}
        raise CannotTell(f"Slurm does not answer about job {job_id}: "
                         f"{_clean((err or out).strip()[-300:]) or f'exit {code}, no output'}")
    return parse(job_id, out)


def _clean(text: str) -> str:
    return printable(text)  # control and bidirectional characters as '?': Slurm's text never forges a line


def _number(value: Any) -> int | None:
    """Slurm's JSON numbers: 5, or {"set": true, "number": 5} (data_parser 0.0.39 and later)."""
    if isinstance(value, dict):
        if value.get("set") is False or value.get("infinite") is True:
            return None
        value = value.get("number")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _exit_code(value: Any) -> str | None:
    """scontrol's ExitCode N:S from squeue's exit_code: a wait status (0.0.38), or
    {"return_code": ..., "signal": {"id": ...}} (0.0.39 and later)."""
    status = _number(value)
    if status is not None:
        return f"{(status >> 8) & 0xFF}:{status & 0x7F}"
    if isinstance(value, dict):
        code = _number(value.get("return_code"))
        signal = value.get("signal")
        sig = _number(signal.get("id")) if isinstance(signal, dict) else None
        if code is not None:
            return f"{code}:{sig or 0}"
    return None


def from_json(job_id: str, text: str) -> dict[str, str]:
    if not text.strip():
        raise CannotTell(f"Slurm answered nothing about job {job_id}")
    if len(text) > MAX_ANSWER_CHARS:
        raise CannotTell(f"Slurm's answer about job {job_id} is over {MAX_ANSWER_CHARS} characters")
    try:
        doc = json_loads(text)  # the one reader's JSON from outside: bounded depth, a ValueError
    except ValueError:
        raise CannotTell(f"Slurm's answer about job {job_id} is not JSON") from None
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    errors = doc.get("errors") if isinstance(doc, dict) else None
    if not isinstance(jobs, list) or not isinstance(errors, list):
        raise CannotTell(f"Slurm's answer about job {job_id} has no list of jobs")
    if errors:
        said = _clean(json.dumps(errors)[:300])
        if "Invalid job id" in said:
            return {}
        raise CannotTell(f"Slurm answered with errors about job {job_id}: {said}")
    want = int(job_id)
    match = [j for j in jobs if isinstance(j, dict) and _number(j.get("job_id")) == want]
    if not match:
        return {}  # Slurm listed what it knows, and this job is not among it
    if len(match) > 1:
        raise CannotTell(f"Slurm's answer lists job {job_id} {len(match)} times")
    job = match[0]
    info = {"JobId": job_id}
    for key, name in JSON_KEYS.items():
        value = job.get(name)
        if isinstance(value, list):  # job_state: ["RUNNING", ...] from data_parser 0.0.39 on
            value = value[0] if value and all(isinstance(v, str) for v in value) else None
        if isinstance(value, str) and value:
            info[key] = _clean(value)
    submitted = _number(job.get("submit_time"))
    if submitted is not None and not 0 < submitted < 1 << 34:  # 2514: beyond, no clock's time (datetime would overflow)
        raise CannotTell(f"Slurm's answer about job {job_id} has a submit_time out of range: {str(submitted)[:40]}")
    if submitted:
        info["SubmitTime"] = datetime.fromtimestamp(submitted).strftime("%Y-%m-%dT%H:%M:%S")
    restarts = _number(job.get("restart_cnt"))
    if restarts is not None:
        info["Restarts"] = str(restarts)
    code = _exit_code(job.get("exit_code"))
    if code is not None:
        info["ExitCode"] = code
    missing = [k for k in REQUIRED if k not in info]
    if missing:
        raise CannotTell(f"Slurm's answer about job {job_id} lacks {', '.join(missing)}")
    return info


def from_line(job_id: str, text: str) -> dict[str, str]:
    """`scontrol show job -o ID`: one line of Key=Value; the values of free-text fields may hold spaces and '='."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise CannotTell(f"Slurm answered nothing about job {job_id}")
    if len(lines) > 1 or len(text) > 1 << 20:
        raise CannotTell(f"Slurm's answer about job {job_id} has {len(lines)} records (an array or heterogeneous job?)")
    line = lines[0].strip()
    marks = list(_KEY_AT.finditer(line))
    if not marks or marks[0].start() != 0:
        raise CannotTell(f"Slurm's answer about job {job_id} is not Key=Value: {_clean(line[:120])!r}")
    order = [m.group(1) for m in marks]
    twice = sorted({k for k in order if order.count(k) > 1})
    if twice:
        raise CannotTell(f"Slurm's answer about job {job_id} is ambiguous: {', '.join(twice)} appear(s) more than once "
                         "(a free-text field such as JobName or Command holds 'Key=')")
    info = {m.group(1): _clean(line[m.end():nxt.start() if nxt else len(line)].rstrip(' '))
            for m, nxt in zip(marks, [*marks[1:], None], strict=True)}
    if order[0] != "JobId" or info["JobId"] != job_id:
        raise CannotTell(f"Slurm's answer is about job {info.get(order[0])!r}, not {job_id}")
    if "Comment" in info:
        at = order.index("Comment")
        if "WorkDir" in order and at < order.index("WorkDir") or "StdErr" in order and at > order.index("StdErr"):
            raise CannotTell(f"Slurm's answer about job {job_id} has a Comment where scontrol does not print one "
                             "(inside another field)")
        if info["Comment"] == "(null)":
            del info["Comment"]
    missing = [k for k in REQUIRED if k not in info]
    if missing:
        raise CannotTell(f"Slurm's answer about job {job_id} lacks {', '.join(missing)}")
    return info
