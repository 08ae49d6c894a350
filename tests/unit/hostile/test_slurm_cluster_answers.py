"""What Slurm answers on the login node, hostile or broken (issue 40): `sinfo`, `scontrol show
partition` and `srun --help` for the preflight, and sbatch's job id. An answer that cannot be read
is an error finding naming the command and what it said (quoted, printable), never a traceback and
never a check that passes; sbatch's unreadable answer is a failure that says a job may be queued."""

from __future__ import annotations

import json

import pytest
from launch_support import Canned, make_recipe

from slimeforge.errors import OperationFailed
from slimeforge.run.recipecheck import parse_recipe
from slimeforge.run.targets import slurm, slurm_checks
from slimeforge.run.targets.base import Command

PART = "PartitionName=gpu State=UP MaxTime=02:00:00 MaxNodes=4 TotalNodes=3\n"
ROWS = "n1|gpu:2|idle\nn2|gpu:2|mix\n"


def findings(tmp_path, *, part=PART, rows=ROWS, default="gpu*\n", nodes=2, time=None):
    rec, _ = parse_recipe(make_recipe(tmp_path, num_gpus=2), "test")
    runner = Canned({("sinfo", "-h", "-o", "%P"): default, ("sinfo", "-h", "-o", "%R"): "gpu\n",
                     ("scontrol", "show", "partition"): part, ("sinfo", "-h", "-N"): rows})
    return slurm_checks.cluster_findings(rec, slurm.Options(nodes=nodes, time=time), runner)


def test_plain_answers_pass(tmp_path):
    assert all(f.level == "ok" for f in findings(tmp_path, time="01:00:00"))


HOSTILE = {
    "partition line: a key twice": {"part": "PartitionName=gpu State=DOWN State=UP MaxTime=1:00:00\n"},
    "partition line: another partition": {"part": "PartitionName=cpu State=UP\n"},
    "partition line: two lines": {"part": PART * 2},
    "partition line: State with escapes": {"part": "PartitionName=gpu State=UP\x1b[2J MaxTime=1:00:00\n"},
    "partition line: MaxTime unreadable": {"part": "PartitionName=gpu State=UP MaxTime=soon\n"},
    "partition line: MaxTime of 5000 digits": {"part": "PartitionName=gpu State=UP MaxTime=" + "9" * 5000 + "\n"},
    "partition line: MaxNodes not a number": {"part": "PartitionName=gpu State=UP MaxNodes=lots\n"},
    "partition line: MaxNodes of 5000 digits": {"part": "PartitionName=gpu State=UP MaxNodes=" + "9" * 5000 + "\n"},
    "partition: over the size bound": {"part": "PartitionName=gpu State=UP " + "x" * (5 << 20) + "\n"},
    "sinfo rows: not NODE|GRES|STATE": {"rows": "n1 gpu:2 idle\nn2|gpu:2|mix\n"},
    "sinfo rows: a node name with shell syntax": {"rows": "n1|gpu:2|idle\n$(reboot)|gpu:2|idle\n"},
    "sinfo rows: GPUs of 5000 digits": {"rows": "n1|gpu:" + "9" * 5000 + "|idle\nn2|gpu:2|idle\n"},
    "sinfo rows: the same node twice": {"rows": "n1|gpu:2|idle\nn1|gpu:2|idle\n"},
    "sinfo rows: the same node twice, once drained": {"rows": "n1|gpu:2|idle\nn2|gpu:2|idle\nn2|gpu:2|drain\n"},
    "sinfo rows: a state of escapes": {"rows": "n1|gpu:2|idle\nn2|gpu:2|\x1b]0;x\x07\n"},
    "sinfo rows: nothing": {"rows": ""},
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_an_unreadable_or_short_answer_is_an_error_finding(tmp_path, case):
    found = findings(tmp_path, **HOSTILE[case])
    errors = [f for f in found if f.level == "error"]
    assert errors, [(f.check, f.level, f.message) for f in found]
    for f in found:
        assert "\x1b" not in f.message and "\x07" not in f.message and len(f.message) < 2000


@pytest.mark.parametrize("default", ["gpu*\ncpu*\n", "-rf*\n", "\x1b[2J*\n", ""])
def test_no_single_readable_default_partition_is_none(tmp_path, default):
    rec, _ = parse_recipe(make_recipe(tmp_path, num_gpus=2), "test")
    assert slurm_checks.default_partition(Canned({("sinfo",): default})) is None
    found = findings(tmp_path, default=default)
    assert [f.check for f in found] == ["slurm-partition"] and found[0].level == "error"


@pytest.mark.parametrize("answer", ["", "\n\n", "Submitted batch job 77\n", "77\n78\n", "77;clu ster\n", "0\n",
                                    "77\x1b[2J\n",
                                    "9" * 5000 + "\n", "-77\n"])
def test_an_unreadable_sbatch_answer_fails_saying_a_job_may_be_queued(tmp_path, answer):
    cmd = Command(("sbatch", "--parsable", "--", str(tmp_path / "slurm.sbatch")), "sbatch")
    with pytest.raises(OperationFailed) as exc:
        slurm.submit(tmp_path, cmd, Canned({("sbatch",): answer}), "0" * 32)
    text = str(exc.value)
    assert "expected a job id" in text and "may have been queued" in text and "\x1b" not in text and len(text) < 1000
    assert not (tmp_path / "slurm_job_id").exists()


@pytest.mark.parametrize(("answer", "job_id"), [("77\n", "77"), ("77;cluster1\n", "77"), ("  12345  \n", "12345")])
def test_a_plain_sbatch_answer_is_the_job_id(tmp_path, answer, job_id):
    cmd = Command(("sbatch", "--parsable", "--", str(tmp_path / "slurm.sbatch")), "sbatch")
    assert slurm.submit(tmp_path, cmd, Canned({("sbatch",): answer}), "0" * 32) == job_id
    assert (tmp_path / "slurm_job_id").read_text() == job_id + "\n"


@pytest.mark.parametrize("submit_time", [10**20, -5, 2**63, {"set": True, "number": 10**30}])
def test_a_submit_time_out_of_range_is_cannot_tell(submit_time):
    from slimeforge.run.targets.slurm_job import CannotTell, from_json

    job = {"job_id": 77, "name": "sf-x", "user_name": "u", "job_state": "RUNNING", "submit_time": submit_time}
    with pytest.raises(CannotTell, match="submit_time out of range"):
        from_json("77", json.dumps({"errors": [], "jobs": [job]}))
