"""Slurm's answers about a job, hostile or broken, against run.stop, run.status, the log follower and
the render guard (issue 33, item 2). Classes:

- ownership posed inside a free-text field: `Comment=slimeforge:<token>` in the JobName, the
  Command, the StdOut (scontrol -o) of a job that is not ours;
- an answer about another job id;
- no answer, an empty one, an unparsable one, an ambiguous one (a key twice), JSON nested deep,
  the job listed twice: "cannot tell", which is never "ended";
- control characters in a field: never reach the terminal.

In every case nothing is cancelled (no scancel), nothing is moved to history/, and the answer is a
clear line, never a traceback. Both dialects: squeue --json (Slurm >= 21.08) and scontrol -o."""

from __future__ import annotations

import getpass
import io
import json
import os
from pathlib import Path

import pytest
from launch_support import Canned

from slimeforge.errors import ConfigError, SlimeforgeError
from slimeforge.proc import Result, Runner
from slimeforge.run.runrecord import guard_render
from slimeforge.run.targets import slurm
from slimeforge.run.targets.slurm_job import CannotTell, from_json, from_line

TOKEN = "0123456789abcdef0123456789abcdef"
USER = getpass.getuser()
NO_JSON = (1, "", "squeue: unrecognized option '--json'\n")


def run_dir(tmp: Path) -> Path:
    plan = {"slimeforge_version": "0.1.0", "exp_id": "exp1", "recipe": {"ray_port": 6379, "ray_dashboard_port": 8265},
            "slurm": {}}
    (tmp / "plan.json").write_text(json.dumps(plan))
    (tmp / "slurm_job_id").write_text("77\n")
    (tmp / "run_token").write_text(TOKEN + "\n")
    return tmp


def line(run: Path, *, job_id: str = "77", name: str = "sf-exp1", command: str = "(null)", comment: str | None = None,
         stdout: str | None = None) -> str:
    """`scontrol show job -o` in scontrol's order (Comment, when set, between WorkDir and StdErr)."""
    out = f"{run}/slurm-77.out"
    return (f"JobId={job_id} JobName={name} UserId={USER}(0) GroupId={USER}(0) JobState=RUNNING Reason=None "
            "ExitCode=0:0 "
            f"SubmitTime=2026-11-25T08:00:00 Command={command} WorkDir={run.resolve()}"
            + (f" Comment={comment}" if comment is not None else "") + f" StdErr={out} StdIn=/dev/null "
                                                                       f"StdOut={stdout or out} Power=\n")


def job_json(run: Path, **over) -> dict:
    return {"job_id": 77, "name": "sf-exp1", "user_name": USER, "job_state": "RUNNING", "state_reason": "None",
            "exit_code": 0,
            "comment": f"slimeforge:{TOKEN}", "current_working_directory": str(run.resolve()),
            "submit_time": 1795600000, **over}


POSED = f"slimeforge:{TOKEN}"


def scontrol_cases(run: Path) -> dict[str, dict]:
    """Name -> Canned answers (squeue without --json, so scontrol -o is read)."""
    def sc(text, code=0, err=""):
        return {("squeue",): NO_JSON, ("scontrol", "show", "job"): (code, text, err)}
    return {
        "comment inside JobName": sc(line(run, name=f"sf-exp1 Comment={POSED}")),
        "comment inside Command": sc(line(run, command=f"/x Comment={POSED}", comment="mine")),
        "comment inside StdOut": sc(line(run, stdout=f"/o Comment={POSED}")),
        "another JobId": sc(line(run, job_id="78", comment=POSED)),
        "two records": sc(line(run, comment=POSED) * 2),
        "a key twice": sc(line(run, name=f"sf-exp1 UserId={USER}(0)", comment=POSED)),
        "empty answer": sc(""),
        "blank answer": sc("  \n\n"),
        "not Key=Value": sc("garbage here\n"),
        "no answer at all": {("squeue",): (1, "",
                                           "slurm_load_jobs error: Unable to contact slurm controller (connect "
                                           "failure)\n"),
                             ("scontrol",): (1, "",
                                             "slurm_load_jobs error: Unable to contact slurm controller (connect "
                                             "failure)\n")},
        "no JSON plugin, scontrol empty": {("squeue",): (1, "",
                                                         "squeue: error: No serializer found for "
                                                         "application/json\n"), ("scontrol",): ""},
        "squeue empty, no json": {("squeue",): (0, "", "")},
    }


def json_cases(run: Path) -> dict[str, dict]:
    def sq(doc):
        return {("squeue",): doc if isinstance(doc, str) else json.dumps(doc)}
    return {
        "json: not JSON": sq("{jobs: [77]"),
        "json: deep nesting": sq("[" * 100000 + "]" * 100000),
        "json: jobs not a list": sq({"errors": [], "jobs": {"77": job_json(run)}}),
        "json: job listed twice": sq({"errors": [], "jobs": [job_json(run), job_json(run)]}),
        "json: errors": sq({"errors": [{"error": "Unable to contact slurm controller"}], "jobs": []}),
        "json: no name": sq({"errors": [], "jobs": [job_json(run, name=None)]}),
        "json: state of the wrong type": sq({"errors": [], "jobs": [job_json(run, job_state={"RUNNING": 1})]}),
    }


def all_cases(run: Path) -> dict[str, dict]:
    return {**scontrol_cases(run), **json_cases(run)}


CASES = list(all_cases(Path("/x")))


@pytest.mark.parametrize("case", CASES)
def test_stop_cancels_nothing_and_says_why(tmp_path, case):
    run = run_dir(tmp_path)
    runner = Canned({**all_cases(run)[case], ("scancel",): ""})
    said: list[str] = []
    assert slurm.stop(run, runner, say=said.append) == 1
    assert not any(a[0] == "scancel" for a in runner.history)
    assert len(said) == 1 and said[0].startswith(("failed: ", "refused: ")) and not said[0].startswith("ended"), said


@pytest.mark.parametrize("case", CASES)
def test_no_render_moves_the_records_of_a_job_it_cannot_tell_about(tmp_path, case):
    run = run_dir(tmp_path)
    before = sorted(os.listdir(run))
    with pytest.raises(ConfigError, match="--out: is the run directory of Slurm job 77"):
        guard_render(run, Canned(all_cases(run)[case]), "exp1")
    assert sorted(os.listdir(run)) == before and not (run / "history").exists()


@pytest.mark.parametrize("case", CASES)
def test_status_says_it_cannot_tell(tmp_path, case):
    run = run_dir(tmp_path)
    with pytest.raises(SlimeforgeError) as exc:
        slurm.status(run, Canned(all_cases(run)[case]))
    assert "Traceback" not in str(exc.value) and str(run.resolve()) in str(exc.value)


def test_the_log_follower_keeps_asking_when_it_cannot_tell(tmp_path):
    """An empty answer, then the job's end: following goes on through the first (never 'ended')."""
    run = run_dir(tmp_path)
    answers = iter([(0, "", ""), (0, json.dumps({"errors": [], "jobs": [job_json(run, job_state="COMPLETED",
                                                                                 exit_code=7 << 8)]}), "")])

    class Sequence(Runner):
        def run(self, argv, **kwargs):
            return Result(list(argv), *next(answers))

    out = io.StringIO()
    assert slurm.follow(run, "77", out, Sequence(), poll=0) == 7
    assert "answered nothing about job 77; asking again" in out.getvalue() and "COMPLETED" in out.getvalue()


def test_ours_in_both_dialects_for_contrast(tmp_path):
    """The same job, answered plainly: ours (so the cases above fail for their hostile part alone)."""
    run = run_dir(tmp_path)
    for answers in ({("squeue",): NO_JSON, ("scontrol", "show", "job"): line(run, comment=POSED), ("scancel",): ""},
                    {("squeue",): json.dumps({"errors": [], "jobs": [job_json(run, job_id=5), job_json(run)]}),
                     ("scancel",): ""}):
        runner = Canned(answers)
        assert slurm.stop(run, runner, say=lambda s: None) == 0 and runner.history[-1] == ["scancel", "--", "77"]


def test_control_characters_never_reach_the_terminal(tmp_path):
    run = run_dir(tmp_path)
    info = from_json("77", json.dumps({"errors": [], "jobs": [job_json(run, state_reason="x\x1b]0;pwned\x07y",
                                                                       nodes="h\r1")]}))
    assert info["Reason"] == "x?]0;pwned?y" and info["NodeList"] == "h?1"
    assert from_line("77", line(run, name="a\x1bb"))["JobName"] == "a?b"


def test_a_forgotten_job_is_ended_only_when_slurm_says_so(tmp_path):
    """Slurm's own word that it does not know the id (or a job list without it) is an answer: ended."""
    run = run_dir(tmp_path)
    for answers in ({("squeue",): NO_JSON, ("scontrol", "show", "job"): (1, "",
                                                                         "slurm_load_jobs error: Invalid job id "
                                                                         "specified\n")},
                    {("squeue",): json.dumps({"errors": [], "jobs": [job_json(run, job_id=5)]})}):
        said: list[str] = []
        assert slurm.stop(run, Canned(answers), say=said.append) == 0 and said[0].startswith("ended: ")


def test_the_exit_code_from_json_is_scontrols():
    assert from_json("77", json.dumps({"errors": [], "jobs": [job_json(Path("/r"),
                                                                       exit_code=7 << 8)]}))["ExitCode"] == "7:0"
    assert from_json("77", json.dumps({"errors": [], "jobs": [job_json(Path("/r"), exit_code=9)]}))["ExitCode"] == "0:9"
    newer = {"status": ["EXITED"], "return_code": {"set": True, "number": 3}, "signal": {"id": {"set": False,
                                                                                                "number": 0}}}
    doc = {"errors": [], "jobs": [job_json(Path("/r"), exit_code=newer, job_state=["RUNNING"],
                                           submit_time={"set": True, "number": 1795600000})]}
    info = from_json("77", json.dumps(doc))
    assert info["ExitCode"] == "3:0" and info["JobState"] == "RUNNING" and info["SubmitTime"]
    with pytest.raises(CannotTell):
        from_json("77", "")


def test_an_output_file_that_never_came_back_is_explained(tmp_path):
    """The batch host could not see the run directory: the job ended and wrote its output elsewhere."""
    run = run_dir(tmp_path)
    doc = {"errors": [], "jobs": [job_json(run, job_state="FAILED", exit_code=3 << 8, nodes="h[1-3]")]}
    out = io.StringIO()
    assert slurm.follow(run, "77", out, Canned({("squeue",): json.dumps(doc)}), poll=0) == 3
    assert (f"its output {run / 'slurm-77.out'} is not here: the batch host (first of h[1-3]) could not write it "
           "there") in out.getvalue()


# What Debian's Slurm 22.05 printed here for `sbatch --job-name="x y" --comment=slimeforge:abc --wrap "sleep 30"`
# (`scontrol show job -o 1`): a name with a space, and two spaces after the Comment.
REAL_22_05 = (
    'JobId=1 JobName=x y UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 Account=(null) QOS'
    '=(null) JobState=PENDING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 '
    'RunTime=00:00:00 TimeLimit=02:00:00 TimeMin=N/A SubmitTime=2026-11-25T17:21:38 EligibleTime=2026-11-25T17:21:3'
    '8 AccrueTime=Unknown StartTime=Unknown EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSche'
    'dEval=2026-11-25T17:21:38 Scheduler=Main Partition=gpu AllocNode:Sid=localhost:14970 ReqNodeList=(null) ExcNod'
    'eList=(null) NodeList= NumNodes=1-1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=1000M,n'
    'ode=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode='
    '0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(nul'
    'l) WorkDir=/work/wt-i29-slurm Comment=slimeforge:abc  StdErr=/work/wt-i29-slurm/slurm-1.out StdIn=/dev/null St'
    'dOut=/work/wt-i29-slurm/slurm-1.out Power= '
)


def test_a_real_scontrol_line_with_free_text_is_read():
    info = from_line("1", REAL_22_05 + "\n")
    assert info["JobName"] == "x y" and info["Comment"] == "slimeforge:abc" and info["WorkDir"] == "/work/wt-i29-slurm"
    assert info["UserId"] == "root(0)" and info["JobState"] == "PENDING" and info["SubmitTime"] == "2026-11-25T17:21:38"
    with pytest.raises(CannotTell, match="about job '1', not 2"):
        from_line("2", REAL_22_05)
