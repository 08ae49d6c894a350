"""scripts/headrecord.py, the head record launch.sh writes and the proof it acts on before it stops
an earlier launch's head (issue 41: the program that was inside templates/launch.sh.j2), behaviour
by behaviour: each proof (pid, start time, boot id, argv, run token), a record that is not ours,
an ended process; and the program launch.sh runs, with the standard library only."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from slimeforge import scripts
from slimeforge.scripts import headrecord as hr
from slimeforge.scripts import procproof

TOKEN, OTHER = "a" * 32, "b" * 32
BOOT = "0f0e0d0c-0b0a-4908-8706-050403020100"
ARGV = ("ray", "start", "--head", "--block", "--port", "6379")
LIVE = ("/venv/bin/python3", "/venv/bin/ray", *ARGV[1:])  # `ray` is a #! script: its interpreter comes first
ENV = ("PATH=/usr/bin", f"SLIMEFORGE_RUN_TOKEN={TOKEN}")
REC = hr.HeadRecord(pid=4242, start_time=1000, boot_id=BOOT, exp_id="exp1", run_token=TOKEN, argv=ARGV)
FACTS = hr.ProcFacts(4242, 1000, BOOT, LIVE, environ=ENV)


# --- the proof, pure: one case per fact --------------------------------------------------------------


def test_a_head_proved_by_pid_start_time_boot_id_argv_and_run_token_is_ours():
    assert hr.head_state(REC, FACTS) == (hr.OURS, "Ray head pid 4242 (start time, boot id, argv and run token match)")
    assert hr.head_state(REC, replace(FACTS, argv=ARGV))[0] == hr.OURS  # started without an interpreter in front


@pytest.mark.parametrize("now,says", [
    (None, "the Ray head (pid 4242) has exited"),
    (replace(FACTS, zombie=True), "the Ray head (pid 4242) has exited"),
    # The pid is another process's now: another start time.
    (replace(FACTS, start_time=1001), "pid 4242 is another process now (started at tick 1001, the head at 1000)"),
    # The same start time after a reboot means nothing.
    (replace(FACTS, boot_id="f" * 8 + BOOT[8:]), "recorded before the host rebooted"),
])
def test_a_head_whose_process_has_ended(now, says):
    state, why = hr.head_state(REC, now)
    assert state == hr.ENDED and says in why


@pytest.mark.parametrize("argv", [
    ("python3", "-c", "import time; time.sleep(300)", "--head"),  # `--head` is one of its words
    ("/venv/bin/python3", "/venv/bin/ray", "start", "--head", "--block", "--port", "6380"),  # another head
    ("/venv/bin/python3", "/opt/evil", "start", "--head", "--block", "--port", "6379"),  # not `ray`
    ("a", "b", "c", *ARGV),  # more than an interpreter in front
    ("sleep", "300"),
    (),  # a kernel thread: no argv
])
def test_a_process_that_started_with_the_head_but_runs_another_argv_is_not_ours(argv):
    state, why = hr.head_state(REC, replace(FACTS, argv=argv))
    assert state == hr.FOREIGN and "is not the `ray start --head` recorded" in why


@pytest.mark.parametrize("environ", [(), ("PATH=/usr/bin",), (f"SLIMEFORGE_RUN_TOKEN={OTHER}",),
                                     (f"X=SLIMEFORGE_RUN_TOKEN={TOKEN}",)])
def test_the_recorded_argv_without_the_recorded_run_token_is_not_ours(environ):
    """The exact argv of a head, started by hand or by another launch: the token is the proof."""
    state, why = hr.head_state(REC, replace(FACTS, environ=environ))
    assert state == hr.FOREIGN and "does not carry the run token" in why


def test_a_record_older_than_issue_33_is_proved_by_head_among_the_words():
    """run.status/run.stop still read records without argv (launch.sh never acts on them)."""
    old = replace(REC, argv=())
    assert hr.head_state(old, replace(FACTS, environ=()))[0] == hr.OURS
    assert hr.head_state(old, replace(FACTS, argv=("sleep", "300")))[0] == hr.FOREIGN


# --- the record's grammar ----------------------------------------------------------------------------


def doc(**over) -> dict:
    return {"pid": 4242, "start_time": 1000, "boot_id": BOOT, "exp_id": "exp1", "run_token": TOKEN, "argv": list(ARGV),
            **over}


def test_a_record_launch_sh_writes_is_accepted():
    assert hr.record_problem(doc()) is None
    assert hr.from_doc(doc()) == REC


@pytest.mark.parametrize("bad,says", [
    ([], "is not a head record"),
    ({**doc(), "extra": 1}, "is not a head record"),
    ({k: v for k, v in doc().items() if k != "argv"}, "is not a head record"),  # no argv: launch.sh refuses it
    (doc(pid=True), "malformed pid"),
    (doc(pid=0), "malformed pid"),
    (doc(pid="4242"), "malformed pid"),
    (doc(pid=1 << 23), "malformed pid"),
    (doc(start_time=-1), "malformed start_time"),
    (doc(start_time=1.0), "malformed start_time"),
    (doc(boot_id=BOOT.upper()), "malformed boot_id"),
    (doc(exp_id="-rf"), "malformed exp_id"),
    (doc(exp_id=7), "malformed exp_id"),
    (doc(run_token=TOKEN.upper()), "malformed run_token"),
    (doc(run_token=TOKEN + "\n"), "malformed run_token"),
    (doc(argv=["sleep", "300"]), "malformed argv"),
    (doc(argv=["ray", "start", "--head", 7]), "malformed argv"),
    (doc(argv=["ray", "start", "--head", "a\0b"]), "malformed argv"),
    (doc(argv=["ray", "start", "--head", *["x"] * 600]), "malformed argv"),
])
def test_a_record_that_is_not_one_launch_sh_writes_is_named(bad, says):
    assert says in (hr.record_problem(bad) or "")


def test_legacy_records_are_accepted_only_when_asked():
    old = {k: v for k, v in doc().items() if k != "argv"}
    assert hr.record_problem(old, legacy=True) is None and hr.from_doc(old).argv == ()


def test_reading_a_record_that_is_not_a_regular_file_json_record_is_a_record_error(tmp_path):
    path = tmp_path / "head.json"
    assert hr.read(str(path)) is None  # nothing recorded
    for content in (b"\xff\xfe", b"{" * 100, b"not json", json.dumps(doc(pid=-1)).encode(), b" " * (hr.MAX_RECORD + 1)):
        path.write_bytes(content)
        with pytest.raises(procproof.BadRecord, match="head.json"):
            hr.read(str(path))
    path.unlink()
    os.mkfifo(path)  # never opened for reading by name alone: a FIFO would block the reader
    with pytest.raises(procproof.BadRecord, match="FIFO"):
        hr.read(str(path))
    path.unlink()
    (tmp_path / "real.json").write_text(json.dumps(doc()))
    path.symlink_to(tmp_path / "real.json")
    with pytest.raises(procproof.BadRecord, match="symlink"):
        hr.read(str(path))


def test_stat_text_with_a_hostile_command_name():
    text = ("4242 (ray ) S 1 2 3) S 77 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 5 0 987654 1000 200 "
           "18446744073709551615\n")
    assert procproof.parse_stat(text) == ("S", 77, 987654)
    for garbage in ("garbage", "4242 (ray) S 1", "4242 (ray) S x 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"):
        assert procproof.parse_stat(garbage) is None


# --- real processes: write, then check, as launch.sh does ---------------------------------------------


@pytest.fixture
def stand_in_ray(tmp_path):
    """A `ray` #! script that sleeps: started with a head's argv, it looks like one to /proc."""
    ray = tmp_path / "bin" / "ray"
    ray.parent.mkdir()
    ray.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(120)\n")
    ray.chmod(0o755)
    started = []

    def start(token: str | None = TOKEN, argv=ARGV) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if k != "SLIMEFORGE_RUN_TOKEN"}
        if token:
            env["SLIMEFORGE_RUN_TOKEN"] = token
        proc = subprocess.Popen([str(ray), *argv[1:]], env=env)
        started.append(proc)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # between fork and exec the child's argv is not the script's yet
            facts = hr.proc_facts(proc.pid)
            if facts is not None and facts.argv[-len(argv) + 1:] == tuple(argv[1:]):
                return proc
            time.sleep(0.01)
        raise AssertionError("the stand-in ray did not start")

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_the_head_recorded_by_write_is_proved_ours_by_check(tmp_path, stand_in_ray):
    head = stand_in_ray()
    path = str(tmp_path / "head.json")
    rec = hr.write(path, "exp1", TOKEN, head.pid, list(ARGV))
    assert hr.read(path) == rec and rec.boot_id == procproof.boot_id()
    assert json.loads(Path(path).read_text()) == {"pid": head.pid, "start_time": rec.start_time, "boot_id": rec.boot_id,
                                                  "exp_id": "exp1", "run_token": TOKEN, "argv": list(ARGV)}
    assert not (tmp_path / ".head.json.tmp").exists()
    assert hr.check(path) == (hr.EXIT_OURS, str(head.pid))


def test_check_refuses_a_head_started_without_the_run_token(tmp_path, stand_in_ray):
    impostor = stand_in_ray(token=None)
    path = str(tmp_path / "head.json")
    hr.write(path, "exp1", TOKEN, impostor.pid, list(ARGV))
    code, said = hr.check(path)
    assert code == hr.EXIT_FOREIGN and "does not carry the run token" in said and said.startswith(path)


def test_check_refuses_a_record_edited_to_name_another_process(tmp_path):
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        facts = hr.proc_facts(sleeper.pid)
        while facts is not None and facts.argv != ("sleep", "60"):
            facts = hr.proc_facts(sleeper.pid)
        assert facts is not None
        path = tmp_path / "head.json"
        path.write_text(json.dumps(doc(pid=sleeper.pid, start_time=facts.start_time, boot_id=facts.boot_id)))
        code, said = hr.check(str(path))
        assert code == hr.EXIT_FOREIGN and "is not the `ray start --head` recorded" in said and "'sleep 60'" in said
        path.write_text("{}")
        code, said = hr.check(str(path))
        assert code == hr.EXIT_FOREIGN and "is not a head record" in said
    finally:
        sleeper.kill()
        sleeper.wait()


def test_check_says_an_ended_head_has_ended(tmp_path, stand_in_ray):
    head = stand_in_ray()
    path = str(tmp_path / "head.json")
    rec = hr.write(path, "exp1", TOKEN, head.pid, list(ARGV))
    head.kill()
    head.wait()
    assert hr.proc_facts(head.pid) is None
    assert hr.check(path) == (hr.EXIT_ENDED, f"the Ray head (pid {head.pid}) has exited")
    # A live pid with another start time: the pid was given to another process.
    Path(path).write_text(json.dumps(doc(pid=os.getpid(), start_time=1, boot_id=rec.boot_id)))
    code, said = hr.check(path)
    assert code == hr.EXIT_ENDED and f"pid {os.getpid()} is another process now" in said
    with pytest.raises(ProcessLookupError):
        hr.write(path, "exp1", TOKEN, head.pid, list(ARGV))


def test_write_refuses_fields_that_make_no_record(tmp_path, stand_in_ray):
    head = stand_in_ray()
    path = tmp_path / "head.json"
    for exp_id, token, argv in (("exp1", "nope", ARGV), ("-x", TOKEN, ARGV), ("exp1", TOKEN, ("sleep", "1"))):
        with pytest.raises(ValueError, match="head record has malformed"):
            hr.write(str(path), exp_id, token, head.pid, list(argv))
    assert not path.exists()


# --- the program launch.sh embeds ---------------------------------------------------------------------


def run_program(*args: str) -> subprocess.CompletedProcess:
    """headrecord.py as launch.sh runs it: one program on stdin. -I -S: no site-packages, no
    current directory: slimeforge cannot be imported, only the standard library."""
    return subprocess.run([sys.executable, "-I", "-S", "-", *args], input=scripts.headrecord_program(),
                          capture_output=True,
                          text=True, timeout=60, cwd="/")


def test_the_program_launch_sh_runs_needs_only_the_standard_library(tmp_path, stand_in_ray):
    head = stand_in_ray()
    path = str(tmp_path / "head.json")
    r = run_program("record", path, "exp1", TOKEN, str(head.pid), *ARGV)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    rec = hr.read(path)
    assert rec is not None and (rec.pid, rec.exp_id, rec.run_token, rec.argv) == (head.pid, "exp1", TOKEN, ARGV)
    r = run_program("check", path)
    assert (r.returncode, r.stdout) == (0, f"{head.pid}\n"), r.stderr
    head.kill()
    head.wait()
    r = run_program("check", path)
    assert (r.returncode, r.stdout) == (3, f"the Ray head (pid {head.pid}) has exited\n")
    Path(path).write_text('{"pid": 1}')
    r = run_program("check", path)
    assert r.returncode == 1 and "is not a head record" in r.stdout and "Traceback" not in r.stdout + r.stderr
    r = run_program("record", path, "exp1", TOKEN, str(head.pid), *ARGV)
    assert r.returncode == 3 and "has already exited" in r.stderr
    for bad in (["check"], ["stop", path], ["record", path, "exp1", TOKEN, "-1", *ARGV]):
        r = run_program(*bad)
        assert r.returncode == 2 and r.stderr and "Traceback" not in r.stderr, bad
    assert all(line != "PY" for line in scripts.headrecord_program().splitlines())  # launch.sh's heredoc ends at PY


def test_every_script_a_script_imports_travels_in_its_program():
    """A script imports another by name (registered by scripts.program): NEEDS must say so, or the
    program sent to a host lacks it."""
    for path in sorted(scripts.HERE.glob("*.py")):
        imported = set(re.findall(r'import_module\("([a-z_]+)"\)', path.read_text()))
        assert imported == set(scripts.NEEDS.get(path.stem, ())), path.name
        program = scripts.program(path.stem) if path.stem != "__init__" else ""
        assert all(f"'{name}'" in program for name in imported), path.name
