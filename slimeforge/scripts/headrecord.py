"""The Ray head a launch starts, and the proof that a process still is that head: the record
(head.json, in the state directory of the head's GCS port), written and read here, and the verdict
launch.sh acts on before it stops the head of an earlier launch. slimeforge/run/ownership.py makes
the same proof for run.status and run.stop (and then asks whether the head is this run's), and
slimeforge/run/headstate.py holds the record to the same grammar.

Standard library only, Python >= 3.8: launch.sh runs it with the job's Python, where slimeforge
need not be installed, as one program with procproof.py (slimeforge.scripts.program):

    python3 - check RECORD
        exit 0, the pid printed: the recorded head still runs, proved (stop it);
        exit 3, why printed: it has ended (the record can go);
        exit 1, why printed: the record or the process is not one slimeforge can prove it started
        (leave both alone).
    python3 - record RECORD EXP_ID RUN_TOKEN PID ARGV...
        records the head just started as PID with ARGV (its start time and the boot id read here);
        exit 3 when PID has already exited, 2 for arguments that make no record.

The head is proved by its pid AND its start time AND the boot id AND the exact `ray start --head`
argv recorded (its `#!` interpreter in front) AND the run token in its environment
(SLIMEFORGE_RUN_TOKEN, which launch.sh gives it): a pid the kernel gave to another process, or a
record edited to name one, fails.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

try:
    from . import procproof  # imported as slimeforge.scripts.headrecord
except ImportError:  # in launch.sh: one program (slimeforge.scripts.program) that registered it first
    procproof = importlib.import_module("procproof")

OURS, ENDED, FOREIGN = procproof.OURS, procproof.ENDED, procproof.FOREIGN
RECORD = "head.json"
MAX_RECORD = 64 * 1024  # an argv and a few ids; a bigger file is not ours
MAX_DEPTH = 4  # {"argv": [...]} is 2 deep
MAX_ARGV, MAX_ARG = 512, 8192
TOKEN_ENV = "SLIMEFORGE_RUN_TOKEN"
HEAD_ARGV = ["ray", "start", "--head"]
# run/recipe.EXP_ID_RE (scripts import nothing of slimeforge)
EXP_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
KEYS = ("pid", "start_time", "boot_id", "exp_id", "run_token", "argv")
ACCEPTED = "a head record {" + ", ".join(KEYS) + "}"
# Exit codes of `check` and `record`, read by launch.sh.
EXIT_OURS, EXIT_FOREIGN, EXIT_USAGE, EXIT_ENDED = 0, 1, 2, 3


@dataclass(frozen=True)
class HeadRecord:
    """What launch.sh records about the head it started (head.json)."""

    pid: int
    start_time: int  # clock ticks after boot, /proc/PID/stat field 22
    boot_id: str
    exp_id: str
    run_token: str
    argv: tuple[str, ...] = ()  # the exact `ray start --head ...`; () in records older than issue 33


@dataclass(frozen=True)
class ProcFacts:
    """What the kernel says about a pid now."""

    pid: int
    start_time: int
    boot_id: str
    argv: tuple[str, ...]
    zombie: bool = False
    environ: tuple[str, ...] = ()  # its initial environment (/proc/PID/environ): launch.sh puts the run token there


def record_problem(doc: Any, legacy: bool = False) -> str | None:
    """Why `doc` is not a head record launch.sh writes (None when it is one). legacy=True also
    accepts a record without argv (written before issue 33): run.status and run.stop still read
    those; launch.sh never stops the head such a record names."""
    if not isinstance(doc, dict) or set(doc) not in ({*KEYS}, {*KEYS} - {"argv"} if legacy else {*KEYS}):
        return f"is not {ACCEPTED}"
    argv = doc.get("argv", HEAD_ARGV)
    if not (isinstance(argv, list) and len(argv) <= MAX_ARGV and all(isinstance(a, str) and len(a) <= MAX_ARG
                                                                     and "\0" not in a for a in argv)
            and argv[:3] == HEAD_ARGV):
        return "has malformed argv (the `ray start --head ...` launch.sh ran)"
    checks = {"pid": procproof.whole(doc["pid"], 1, procproof.PID_MAX),
              "start_time": procproof.whole(doc["start_time"], 0, 1 << 63),
              "boot_id": isinstance(doc["boot_id"], str) and procproof.BOOT_ID_RE.fullmatch(doc["boot_id"]) is not None,
              "exp_id": isinstance(doc["exp_id"], str) and EXP_ID_RE.fullmatch(doc["exp_id"]) is not None,
              "run_token": isinstance(doc["run_token"],
                                      str) and procproof.TOKEN_RE.fullmatch(doc["run_token"]) is not None}
    bad = [k for k, ok in checks.items() if not ok]
    return f"has malformed {', '.join(bad)}" if bad else None


def from_doc(doc: dict) -> HeadRecord:
    """The record of a document record_problem accepts."""
    return HeadRecord(doc["pid"], doc["start_time"], doc["boot_id"], doc["exp_id"], doc["run_token"],
                      tuple(doc.get("argv", ())))


def read(path: str, legacy: bool = False) -> HeadRecord | None:
    """The validated record at `path` (procproof.read_json: a regular file, capped); None when there
    is none; a procproof.BadRecord naming the file when it is not one launch.sh writes."""
    doc = procproof.read_json(path, MAX_RECORD, MAX_DEPTH, lambda d: record_problem(d, legacy))
    return None if doc is None else from_doc(doc)


def proc_facts(pid: int) -> ProcFacts | None:
    """The pid's start time, argv and environment from /proc; None when no such process runs (a
    zombie counts as gone)."""
    st = procproof.proc_stat(pid)
    if st is None or st[0] == "Z":
        return None
    argv = procproof.proc_words(pid, "cmdline")
    if argv is None:
        return None
    try:
        boot = procproof.boot_id()
    except OSError:
        return None
    # Another user's process cannot be read (None): it cannot carry our token either.
    environ = procproof.proc_words(pid, "environ") or []
    return ProcFacts(pid, st[2], boot, tuple(argv), zombie=False, environ=tuple(environ))


def runs_recorded_argv(record: HeadRecord, now: ProcFacts) -> bool:
    """The live argv is the recorded `ray start --head ...` (its #! interpreter in front); a record
    older than issue 33 (no argv): `--head` among the words."""
    return procproof.argv_matches(list(record.argv), list(now.argv)) if record.argv else "--head" in now.argv


def carries_token(record: HeadRecord, now: ProcFacts) -> bool:
    """The record's run token is in the process's environment (records older than issue 33 name no argv
    and were started without one)."""
    return not record.argv or f"{TOKEN_ENV}={record.run_token}" in now.environ


def is_recorded_head(record: HeadRecord, now: ProcFacts) -> bool:
    return runs_recorded_argv(record, now) and carries_token(record, now)


def head_state(record: HeadRecord, now: ProcFacts | None) -> tuple[str, str]:
    """(OURS, ENDED or FOREIGN, why) for the head `record` names, from what the kernel says `now`
    (proc_facts of its pid), whatever run it was started for."""
    pid = record.pid
    if now is None or now.zombie:
        return ENDED, f"the Ray head (pid {pid}) has exited"
    if now.boot_id != record.boot_id:
        return ENDED, (f"the Ray head (pid {pid}) was recorded before the host rebooted; pid {pid} is another process "
                      "now")
    if now.start_time != record.start_time:
        return ENDED, (f"the Ray head (pid {pid}) has exited; pid {pid} is another process now "
                       f"(started at tick {now.start_time}, the head at {record.start_time})")
    if not runs_recorded_argv(record, now):
        return FOREIGN, (f"pid {pid} started when the head did but is not the `ray start --head` recorded "
                        f"({' '.join(now.argv)[:120]!r})")
    if not carries_token(record, now):
        return FOREIGN, (f"pid {pid} runs the `ray start --head` recorded but does not carry the run token its record "
                         "names "
                         f"({TOKEN_ENV}): it was started by hand or by another launch")
    return OURS, f"Ray head pid {pid} (start time, boot id, argv and run token match)"


def check(path: str) -> tuple[int, str]:
    """(exit code, what to print) for `check`: what launch.sh does with the head `path` records."""
    try:
        record = read(path)
    except procproof.BadRecord as exc:
        return EXIT_FOREIGN, f"{exc}; not a head slimeforge can prove it started"
    if record is None:
        return EXIT_ENDED, f"{path}: nothing is recorded there"
    state, why = head_state(record, proc_facts(record.pid))
    if state == OURS:
        return EXIT_OURS, str(record.pid)
    if state == ENDED:
        return EXIT_ENDED, why
    return EXIT_FOREIGN, f"{path}: {why}: not a head slimeforge can prove it started"


def write(path: str, exp_id: str, run_token: str, pid: int, argv: list[str]) -> HeadRecord:
    """Record the head just started as `pid` with `argv`: all or nothing (a whole record under a
    temporary name, then renamed over the old one). ValueError when the fields make no record;
    ProcessLookupError when `pid` has already exited."""
    st = procproof.proc_stat(pid)
    if st is None or st[0] == "Z":
        raise ProcessLookupError(pid)
    doc = {"pid": pid, "start_time": st[2], "boot_id": procproof.boot_id(), "exp_id": exp_id, "run_token": run_token,
           "argv": argv}
    why = record_problem(doc)
    if why:
        raise ValueError(f"the head record {why}")
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(doc) + "\n")
    os.replace(tmp, path)
    return from_doc(doc)


USAGE = "usage: headrecord.py check RECORD | headrecord.py record RECORD EXP_ID RUN_TOKEN PID ARGV..."


def main(args: list[str]) -> int:
    if len(args) == 2 and args[0] == "check":
        code, said = check(args[1])
        print(said)
        return code
    if len(args) >= 5 and args[0] == "record":
        path, exp_id, token, pid = args[1:5]
        if not re.fullmatch(r"[1-9][0-9]{0,6}", pid):
            print(f"record: PID must be a process id, got {pid[:40]!r}", file=sys.stderr)
            return EXIT_USAGE
        try:
            write(path, exp_id, token, int(pid), args[5:])
        except ProcessLookupError:
            print(f"the Ray head (pid {pid}) has already exited", file=sys.stderr)
            return EXIT_ENDED
        except (ValueError, OSError) as exc:
            print(f"{path}: cannot record the Ray head (pid {pid}): {exc}", file=sys.stderr)
            return EXIT_USAGE
        return EXIT_OURS
    print(USAGE, file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
