"""The ownership proofs, case by case (pure functions: the facts are given)."""

from __future__ import annotations

import subprocess
from datetime import datetime

import pytest

from slimeforge.run import ownership as own
from slimeforge.run.ownership import ENDED, FOREIGN, OURS, HeadRecord, ProcFacts

TOKEN, OTHER = "a" * 32, "b" * 32
BOOT = "0f0e0d0c-0b0a-4908-8706-050403020100"
REC = HeadRecord(pid=4242, start_time=1000, boot_id=BOOT, exp_id="exp1", run_token=TOKEN)
HEAD_ARGV = ("/venv/bin/python", "ray", "start", "--head", "--block")


@pytest.mark.parametrize("now,exp_id,token,state,says", [
    (ProcFacts(4242, 1000, BOOT, HEAD_ARGV), "exp1", TOKEN, OURS, "start time and boot id match"),
    (None, "exp1", TOKEN, ENDED, "has exited"),
    (ProcFacts(4242, 1000, BOOT, HEAD_ARGV, zombie=True), "exp1", TOKEN, ENDED, "has exited"),
    (ProcFacts(4242, 9999, BOOT, HEAD_ARGV), "exp1", TOKEN, ENDED, "another process now"),  # the pid was reused
    (ProcFacts(4242, 1000, "f" * 8 + BOOT[8:], HEAD_ARGV), "exp1", TOKEN, ENDED, "rebooted"),
    (ProcFacts(4242, 1000, BOOT, ("sleep", "100")), "exp1", TOKEN, FOREIGN, "is not the `ray start --head` recorded"),
    (ProcFacts(4242, 1000, BOOT, HEAD_ARGV), "exp2", TOKEN, FOREIGN, "was started for run 'exp1'"),
    (ProcFacts(4242, 1000, BOOT, HEAD_ARGV), "exp1", OTHER, FOREIGN, "not this one"),
    (ProcFacts(4242, 1000, BOOT, HEAD_ARGV), "exp1", None, FOREIGN, "not this one"),
])
def test_head_verdict(now, exp_id, token, state, says):
    v = own.head_verdict(REC, now, exp_id, token)
    assert v.state == state and says in v.reason


def test_start_time_from_proc_stat_with_a_hostile_command_name():
    text = ("4242 (ray ) S 1 2 3) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 5 0 987654 1000 200 "
           "18446744073709551615\n")
    assert own.stat_start_time(text) == (987654, "S")
    assert own.stat_start_time("garbage") is None


def test_proc_facts_of_a_real_process_and_of_one_that_ended():
    p = subprocess.Popen(["sleep", "30"])
    try:
        facts = own.proc_facts(p.pid)
        while facts is not None and not facts.argv:  # between fork and exec the child has no argv yet
            facts = own.proc_facts(p.pid)
        assert facts is not None and facts.argv == ("sleep", "30") and facts.boot_id == own.boot_id()
        rec = HeadRecord(p.pid, facts.start_time, facts.boot_id, "exp1", TOKEN)
        assert own.head_verdict(rec, own.proc_facts(p.pid), "exp1", TOKEN).state == FOREIGN  # not a Ray head
        assert own.proc_facts(p.pid).start_time == facts.start_time  # stable for the process's life
    finally:
        p.kill()
        p.wait()
    assert own.proc_facts(p.pid) is None


@pytest.mark.parametrize("meta,status,state", [
    ({"slimeforge_exp_id": "exp1", "slimeforge_run_token": TOKEN}, "RUNNING", OURS),
    ({"slimeforge_exp_id": "exp1", "slimeforge_run_token": TOKEN}, "SUCCEEDED", ENDED),
    ({"slimeforge_exp_id": "exp1", "slimeforge_run_token": OTHER}, "RUNNING", FOREIGN),
    ({"slimeforge_exp_id": "exp1"}, "RUNNING", FOREIGN),  # submitted by an older slimeforge or by hand
    ({}, "RUNNING", FOREIGN),
    (None, None, ENDED),  # 404: the head does not know it (replaced or restarted)
])
def test_ray_job_verdict(meta, status, state):
    assert own.ray_job_verdict("exp1-20261125-080000-abcdef", meta, status, "exp1", TOKEN).state == state


CID = "c" * 64


@pytest.mark.parametrize("inspect,state", [
    ({"Id": CID, "Config": {"Labels": {"slimeforge.exp_id": "exp1", "slimeforge.run_token": TOKEN}},
      "State": {"Running": True}}, OURS),
    ({"Id": CID, "Config": {"Labels": {"slimeforge.exp_id": "exp1", "slimeforge.run_token": TOKEN}},
      "State": {"Running": False}}, ENDED),
    ({"Id": CID, "Config": {"Labels": {"slimeforge.exp_id": "exp1"}}, "State": {"Running": True}}, FOREIGN),
    ({"Id": CID, "Config": {"Labels": None}, "State": {"Running": True}}, FOREIGN),
    ({"Id": "d" * 64, "Config": {"Labels": {"slimeforge.exp_id": "exp1", "slimeforge.run_token": TOKEN}},
      "State": {"Running": True}}, FOREIGN),
    (None, ENDED),
])
def test_container_verdict(inspect, state):
    assert own.container_verdict(CID, inspect, "exp1", TOKEN).state == state


def slurm_info(**over) -> dict[str, str]:
    return {"JobId": "77", "JobName": "sf-exp1", "UserId": "alice(1000)", "JobState": "RUNNING",
            "Comment": f"slimeforge:{TOKEN}",
            "WorkDir": "/runs/exp1", "SubmitTime": "2026-11-25T08:00:00", **over}


AT = datetime(2026, 11, 25, 8, 0, 2).timestamp()


@pytest.mark.parametrize("over,token,state", [
    ({}, TOKEN, OURS),
    ({"JobState": "CANCELLED"}, TOKEN, ENDED),
    ({"UserId": "bob(1001)"}, TOKEN, FOREIGN),
    ({"JobName": "sf-exp2"}, TOKEN, FOREIGN),
    ({"Comment": "(null)"}, TOKEN, FOREIGN),
    ({}, None, FOREIGN),  # a record without a token is never enough
    ({"WorkDir": "/runs/other"}, TOKEN, FOREIGN),
    ({"SubmitTime": "2026-11-24T08:00:00"}, TOKEN, FOREIGN),
])
def test_slurm_verdict(over, token, state):
    v = own.slurm_verdict("77", slurm_info(**over), user="alice", job_name="sf-exp1", run_token=token,
                          workdir="/runs/exp1/", submitted_at=AT)
    assert v.state == state, v.reason
    assert own.slurm_verdict("77", {}, user="alice", job_name="sf-exp1", run_token=TOKEN, workdir="/r",
                             submitted_at=None).state == ENDED



def test_a_head_with_its_recorded_argv_is_proved_by_that_argv():
    """launch.sh records the exact `ray start --head ...` (issue 33): `--head` among the words is not enough."""
    from dataclasses import replace

    rec = replace(REC, argv=("ray", "start", "--head", "--block", "--port", "6379"))
    live = ("/venv/bin/python3", "/venv/bin/ray", "start", "--head", "--block", "--port", "6379")
    env = ("PATH=/usr/bin", f"SLIMEFORGE_RUN_TOKEN={TOKEN}")
    assert own.head_verdict(rec, ProcFacts(4242, 1000, BOOT, live, environ=env), "exp1", TOKEN).state == OURS
    assert own.head_alive(rec, ProcFacts(4242, 1000, BOOT, live, environ=env))
    # The exact argv without the run token in its environment: started by hand, or by another launch.
    assert own.head_verdict(rec, ProcFacts(4242, 1000, BOOT, live, environ=("PATH=/usr/bin",)), "exp1",
                            TOKEN).state == FOREIGN
    for other in (("python3", "-c", "import time; time.sleep(300)", "--head"),  # --head is one of its words
                  ("/venv/bin/python3", "/venv/bin/ray", "start", "--head", "--block", "--port",
                   "6380"),  # another head
                  ("/venv/bin/python3", "/opt/evil", "start", "--head", "--block", "--port", "6379"),  # not `ray`
                  ("sleep", "300")):
        verdict = own.head_verdict(rec, ProcFacts(4242, 1000, BOOT, other, environ=env), "exp1", TOKEN)
        assert verdict.state == FOREIGN and "is not the `ray start --head` recorded" in verdict.reason, other
        assert not own.head_alive(rec, ProcFacts(4242, 1000, BOOT, other, environ=env))
