"""run.stop's head proof against real processes (a recycled pid is never signalled), and the
guard that keeps a live run's directory from being rendered over (Slurm answers from a table
here; tests/integration/ run both against real Ray and Slurm)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import SEED_RECIPE, free_port

from slimeforge.errors import ConfigError
from slimeforge.proc import Result, Runner, pid_alive
from slimeforge.run import ownership
from slimeforge.run.recipecheck import parse_recipe
from slimeforge.run.rundir import build_run_dir, write_run_dir
from slimeforge.run.runrecord import guard_render, read_run
from slimeforge.run.targets import jobs

TOKEN = "0123456789abcdef0123456789abcdef"


def rendered(tmp: Path, **over) -> Path:
    port = free_port()
    recipe, stack = parse_recipe({**SEED_RECIPE, "ray_port": port, "ray_dashboard_port": free_port(), **over}, "test")
    run = build_run_dir(recipe, stack, tmp / "run", environ={})
    write_run_dir(run)
    (run.path / "run_token").write_text(TOKEN + "\n")
    # its head (nobody listens) is gone
    (run.path / "submission_id").write_text(f"{recipe.exp_id}-20261125-080000-abcdef\n")
    return run.path


@pytest.fixture
def sleeper():
    p = subprocess.Popen(["sleep", "300"])
    while not (f := ownership.proc_facts(p.pid)) or not f.argv:
        pass
    yield p
    p.kill()
    p.wait()


def head_record(run_dir: Path, tmp: Path, monkeypatch, **fields) -> Path:
    rec = read_run(run_dir)
    sdir = tmp / "state" / f"ray-{rec.ray_port}"
    sdir.mkdir(parents=True)
    monkeypatch.setenv("SLIMEFORGE_STATE_DIR", str(tmp / "state"))
    (sdir / "head.json").write_text(json.dumps({"exp_id": rec.exp_id, "run_token": TOKEN,
                                                "boot_id": ownership.boot_id(), **fields}))
    return sdir


def test_a_recycled_pid_is_never_signalled(tmp_path, monkeypatch, sleeper):
    """The head record names a live pid whose start time is not the head's: the head has exited."""
    run_dir = rendered(tmp_path)
    head_record(run_dir, tmp_path, monkeypatch, pid=sleeper.pid,
                start_time=ownership.proc_facts(sleeper.pid).start_time + 1)
    said: list[str] = []
    assert jobs.stop(run_dir, head=True, say=said.append) == 0
    assert said[-1].startswith(f"ended: the Ray head (pid {sleeper.pid}) has exited; pid {sleeper.pid} is another "
                               "process now")
    assert pid_alive(sleeper.pid)


def test_a_live_process_that_is_not_a_ray_head_is_refused(tmp_path, monkeypatch, sleeper):
    """pid, start time and boot id all match (an edited record), but it is not `ray start --head`."""
    run_dir = rendered(tmp_path)
    head_record(run_dir, tmp_path, monkeypatch, pid=sleeper.pid,
                start_time=ownership.proc_facts(sleeper.pid).start_time)
    said: list[str] = []
    assert jobs.stop(run_dir, head=True, say=said.append) == 1
    assert said[-1].startswith(f"refused: pid {sleeper.pid} started when the head did but is not the `ray start "
                               "--head` recorded")
    assert pid_alive(sleeper.pid)


def test_a_head_started_for_another_run_is_refused(tmp_path, monkeypatch, sleeper):
    run_dir = rendered(tmp_path)
    facts = ownership.proc_facts(sleeper.pid)
    sdir = head_record(run_dir, tmp_path, monkeypatch, pid=sleeper.pid, start_time=facts.start_time)
    doc = json.loads((sdir / "head.json").read_text())
    (sdir / "head.json").write_text(json.dumps({**doc, "run_token": "f" * 32}))
    said: list[str] = []
    assert jobs.stop(run_dir, head=True, say=said.append) == 1
    assert "was started for run" in said[-1] and pid_alive(sleeper.pid)


def test_a_run_that_was_never_launched_stops_nothing_and_says_so(tmp_path):
    run_dir = rendered(tmp_path)
    (run_dir / "submission_id").unlink()
    said: list[str] = []
    assert jobs.stop(run_dir, head=True,
                     say=said.append) == 2 and said == [f"none: {run_dir.resolve()}: never launched (no job "
                                                        "recorded); nothing to stop"]


class Slurm(Runner):
    """scontrol's answer for the recorded job, from a table, on a Slurm whose squeue has no --json
    (the JSON dialect: tests/unit/hostile/test_slurm_answers.py; the real one: tests/integration/slurm)."""

    def __init__(self, code: int, out: str):
        super().__init__()
        self.answer = (code, out)

    def run(self, argv, **kw):
        self.history.append(list(argv))
        if argv[:2] == ["squeue", "--json"]:
            return Result(list(argv), 1, "", "squeue: unrecognized option '--json'\n")
        assert argv[:3] == ["scontrol", "show", "job"], argv
        return Result(list(argv), self.answer[0], self.answer[1], self.answer[1])


def slurm_dir(tmp: Path) -> Path:
    run_dir = rendered(tmp)
    plan = json.loads((run_dir / "plan.json").read_text())
    (run_dir / "plan.json").write_text(json.dumps({**plan, "slurm": {}}))
    (run_dir / "slurm_job_id").write_text("77\n")
    return run_dir


def job(run_dir: Path, state: str) -> str:
    import getpass

    return (f"JobId=77 JobName=sf-{SEED_RECIPE['exp_id']} UserId={getpass.getuser()}(0) JobState={state} "
            f"WorkDir={run_dir.resolve()} Comment=slimeforge:{TOKEN} StdErr={run_dir.resolve()}/slurm-77.out\n")


@pytest.mark.parametrize("answer,says", [((0, "RUNNING"), "which is still running"),
                                         ((1, "Unable to contact slurm controller"),
                                          "may still be running (its state cannot be learned)")])
def test_a_live_or_unknown_slurm_run_directory_is_not_rendered_over(tmp_path, answer, says):
    run_dir = slurm_dir(tmp_path)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    code, out = answer
    runner = Slurm(code, job(run_dir, out) if code == 0 else out)
    with pytest.raises(ConfigError) as err:
        guard_render(run_dir, runner)
    assert says in str(err.value) and "Slurm job 77" in str(err.value) and ("invoke run.stop "
                                                                           f"{run_dir.resolve()}`") in str(err.value)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before


def test_an_ended_run_keeps_its_record_in_history(tmp_path):
    run_dir = slurm_dir(tmp_path)
    plan = (run_dir / "plan.json").read_bytes()
    assert guard_render(run_dir, Slurm(0, job(run_dir, "COMPLETED"))) == 1
    kept = run_dir / "history" / "1"
    assert (kept / "slurm_job_id").read_text() == "77\n" and (kept / "run_token").read_text() == TOKEN + "\n"
    assert (kept / "plan.json").read_bytes() == plan and (kept / "launch.sh").exists()
    # the render replaces plan.json next
    assert not (run_dir / "slurm_job_id").exists() and (run_dir / "plan.json").exists()
    (run_dir / "slurm_job_id").write_text("78\n")
    (run_dir / "run_token").write_text(TOKEN + "\n")
    # forgotten by Slurm: ended
    assert guard_render(run_dir, Slurm(1, "slurm_load_jobs error: Invalid job id specified")) == 2


def test_a_run_directory_without_a_job_renders_as_before(tmp_path):
    run_dir = rendered(tmp_path)
    (run_dir / "submission_id").unlink()
    assert guard_render(run_dir, Runner()) is None and not (run_dir / "history").exists()
    assert guard_render(tmp_path / "new", Runner()) is None
    assert os.listdir(tmp_path / "run")


def test_another_experiments_ended_run_is_left_untouched(tmp_path):
    """Its records are not moved to history: the render refuses the directory (out_problems)."""
    run_dir = slurm_dir(tmp_path)
    before = sorted(p.name for p in run_dir.iterdir())
    assert guard_render(run_dir, Slurm(0, job(run_dir, "COMPLETED")), exp_id="another-exp") is None
    assert sorted(p.name for p in run_dir.iterdir()) == before and not (run_dir / "history").exists()
