"""The Jobs API layer's grammar (targets/jobsapi.py, targets/jobs.py): what a job's info may hold,
how a job's words reach the terminal, exit codes, how run.status/logs/stop name a job on a cluster,
and which launches --detach and --max-restarts go with. No services (the stand-in dashboard's
cases are in hostile/test_jobs_api_answers.py; a real Ray in integration/test_jobs_detach.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slimeforge.errors import ConfigError, SlimeforgeError
from slimeforge.run.targets import jobs
from slimeforge.run.targets.jobsapi import JOB_STATUSES, RAY_VERSION_RE, TERMINAL, JobInfo, JobsApi, NoAnswer
from slimeforge.run.targets.jobsubmit import Cluster, follow_hints

SID = "gsm8k-3b-20261127-230000-abcdef"


def info(**over) -> JobInfo:
    doc = {"submission_id": SID, "status": "RUNNING", "message": None, "metadata": None, "start_time": None,
           "end_time": None,
           "driver_exit_code": None, **over}
    return JobInfo.parse(doc, "test")


def test_job_statuses_are_rays_own():
    from ray.job_submission import JobStatus

    assert set(JOB_STATUSES) == {s.value for s in JobStatus}
    assert set(TERMINAL) == {s.value for s in JobStatus if s.is_terminal()}


def test_a_job_info_keeps_rays_fields_and_defaults_what_ray_leaves_out():
    i = info(metadata={"slimeforge_exp_id": "gsm8k-3b"}, start_time=1700000000000, driver_exit_code=3, status="FAILED")
    assert (i.status, i.metadata, i.start_time, i.driver_exit_code, i.message) == ("FAILED",
                                                                                   {"slimeforge_exp_id": "gsm8k-3b"},
                                                                                   1700000000000, 3, "")
    assert i.ended and jobs.exit_code(i) == 3


@pytest.mark.parametrize(("status", "code", "expected"), [("SUCCEEDED", 0, 0), ("SUCCEEDED", None, 0), ("FAILED", None,
                                                                                                        1),
                                                          ("FAILED", 0, 1), ("FAILED", -9, 1), ("FAILED", 255, 255),
                                                          ("STOPPED", None, 1)])
def test_exit_code_is_the_entrypoints_when_ray_knows_it(status, code, expected):
    assert jobs.exit_code(info(status=status, driver_exit_code=code)) == expected


@pytest.mark.parametrize("doc", [[], "RUNNING", {"submission_id": SID}, {"submission_id": SID, "status": "running"},
                                 {"submission_id": "-x", "status": "RUNNING"}, {"submission_id": SID,
                                                                                "status": "RUNNING", "end_time": 1.5}])
def test_what_is_not_a_job_info_is_refused_naming_the_field(doc):
    with pytest.raises(NoAnswer, match="test: field "):
        JobInfo.parse(doc, "test")


def test_rays_message_is_shown_quoted_and_without_control_characters():
    i = info(status="FAILED", message="Job failed \x1b[1;31mbadly\x1b[0m\r\nfake prompt$ \u202eevil")
    assert i.shown_message == 'Ray says: "Job failed ?[1;31mbadly?[0m??fake prompt$ ?evil"'
    assert info().shown_message == ""
    assert len(info(message="x" * 9000).shown_message) < 2100


def test_terminal_text_keeps_lines_and_drops_escape_sequences():
    assert jobs.terminal_text("a\r\nb\x1b]0;title\x07\rc\n") == "a\nb?]0;title?\nc\n"
    assert jobs.terminal_text("plain\n") == "plain\n"


@pytest.mark.parametrize("v", ["2.60.0", "2.9.3", "3.0.0rc1", "2.61.0.dev0"])
def test_ray_versions_by_grammar(v):
    assert RAY_VERSION_RE.fullmatch(v)


@pytest.mark.parametrize("v", ["", "2.60", "2.60.0 ", "2.60.0\n", "$(id)", "2.60.0;rm"])
def test_what_is_not_a_ray_version(v):
    assert not RAY_VERSION_RE.fullmatch(v)


@pytest.mark.parametrize("ref", ["", "-rf", "--address=http://x", "a b", "../x", "x" * 201, "ok\x1b[2J"])
def test_a_job_is_named_by_exp_id_or_submission_id_only(ref):
    with pytest.raises(ConfigError) as e:
        jobs.find_job(JobsApi("http://127.0.0.1:1"), ref)  # refused before any request: port 1 is never asked
    assert "RUN: is neither an exp_id nor a submission id" in str(e.value)


def test_an_address_that_is_not_http_is_refused():
    with pytest.raises(SlimeforgeError, match="not a Ray Jobs API address"):
        JobsApi("file:///etc/passwd")


def test_the_hints_name_the_inventory_or_the_address_and_the_exp_id():
    inv = Cluster("clusters/my lab.yaml", "http://10.0.0.1:8265", mode="host")
    lines = follow_hints("gsm8k-3b", SID, Path("/tmp/runs/gsm8k-3b"), inv)
    assert "  follow:  invoke run.logs gsm8k-3b --cluster 'clusters/my lab.yaml' --follow" in lines
    assert "invoke run.stop gsm8k-3b --cluster 'clusters/my lab.yaml'" in "\n".join(lines)
    bare = follow_hints("gsm8k-3b", SID, Path("/tmp/r"), Cluster("http://10.0.0.1:8265", "http://10.0.0.1:8265"))
    assert "  inspect: invoke run.status gsm8k-3b --address http://10.0.0.1:8265" in bare


@pytest.mark.parametrize("options", [{"detach": True}, {"max_restarts": 2}])
def test_detach_and_restarts_go_with_a_running_cluster(tmp_path, options):
    import yaml
    from launch_support import make_recipe

    from slimeforge.run import launch as launcher

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(make_recipe(tmp_path)))
    with pytest.raises(ConfigError) as e:
        launcher.run_recipe(launcher.LaunchRequest(recipe=str(recipe), **options), dry_run=True)
    assert "goes with a running Ray cluster" in str(e.value) and "--cluster INVENTORY or --address" in str(e.value)
    with pytest.raises(ConfigError, match="--max-restarts: is not a number of restarts"):
        launcher.run_recipe(launcher.LaunchRequest(recipe=str(recipe), address="http://127.0.0.1:8265",
                                                   max_restarts=101), dry_run=True)


def test_max_restarts_is_a_bounded_recipe_key(tmp_path):
    from launch_support import make_recipe

    from slimeforge.run.recipecheck import parse_recipe

    recipe, _ = parse_recipe({**make_recipe(tmp_path), "max_restarts": 3}, "test")
    assert recipe.max_restarts == 3
    with pytest.raises(ConfigError, match="max_restarts"):
        parse_recipe({**make_recipe(tmp_path), "max_restarts": -1}, "test")
