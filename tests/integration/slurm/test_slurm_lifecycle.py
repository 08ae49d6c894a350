"""`invoke run --slurm` on the Slurm lab (see test_slurm.py), the run's life and what every node
must see: run.stop cancelling only our job, a requeued job resuming from its checkpoint, a run
directory, model or checkpoint_dir one node cannot see refused naming it. Apart from test_slurm.py
so that CI's parallel workers run the two at once, each worker with a lab of its own."""

from __future__ import annotations

import subprocess
from pathlib import Path

from launch_support import make_recipe, wait_for, write_catalog
from slurmlab import client
from test_slurm import INVOKE, no_ray_left, recipe_for, state, submit, with_weights

from slimeforge.run.recipecheck import parse_recipe
from slimeforge.run.targets import slurm


def test_run_stop_cancels_only_our_job(env, slurm_lab):
    """run.stop proves the job is this run's (user, name, comment token, directory, submit time)
    before it cancels; an impostor with our job name, whose id a copied run directory records, is
    refused. While the job runs, no render (dry run or launch) may rewrite its run directory; once
    it has ended, the old record is kept in history/1/."""
    import shutil

    import yaml

    recipe, stack, catalog = recipe_for(env, STANDIN_SLEEP="600")
    impostor = client(slurm_lab.env, "sbatch", "--parsable", "-N1", f"--job-name=sf-{recipe.exp_id}", f"--chdir={env}",
                      f"--output={env / 'other.out'}", "--wrap", "sleep 600")
    assert impostor.returncode == 0, impostor.stderr
    other_id = impostor.stdout.strip()
    try:
        wait_for(lambda: state(other_id) == "RUNNING", 60, "the other job to run")
        code, out, run = submit(env, slurm.Options(nodes=2), follow=False, recipe=(recipe, stack, catalog))
        assert code == 0, out
        job_id = (run / "slurm_job_id").read_text().strip()
        wait_for(lambda: Path(env / "record.json").exists(), 240, "train.py to run in Ray")

        # A copy of the run directory that records the impostor's id: same job name, not our comment.
        fake = env / "copied-run"
        shutil.copytree(run, fake, ignore=shutil.ignore_patterns("slurm-*", ".slimeforge.lock"))
        (fake / "slurm_job_id").write_text(other_id + "\n")
        r = subprocess.run([*INVOKE, "run.stop", str(fake)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and f"refused: Slurm job {other_id} is not this run's" in r.stdout, r.stdout + r.stderr
        assert state(other_id) == "RUNNING"

        # The live run's directory is not rendered over: a dry run is refused, naming the job and the way to stop it.
        (env / "recipe.yaml").write_text(yaml.safe_dump(make_recipe(env, num_gpus=2)))  # the same experiment (exp_id)
        plan_before = (run / "plan.json").read_bytes()
        r = subprocess.run([*INVOKE, "run", str(env / "recipe.yaml"), "--slurm", "--dry-run", "--out", str(run)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and f"Slurm job {job_id}" in r.stderr and ("invoke run.stop "
                                                                           f"{run}") in r.stderr, r.stdout + r.stderr
        assert (run / "plan.json").read_bytes() == plan_before and (run / "slurm_job_id").read_text().strip() == job_id

        r = subprocess.run([*INVOKE, "run.stop", str(run)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and f"stopped: Slurm job {job_id}: cancel sent" in r.stdout, r.stdout + r.stderr
        wait_for(lambda: state(job_id) == "CANCELLED", 60, "our job to be cancelled")
        assert state(other_id) == "RUNNING"  # not ours: untouched
        wait_for(lambda: no_ray_left(slurm_lab), 60, "Ray to end with our job")
        said: list[str] = []
        assert slurm.stop(run,
                          # nothing sent
                          say=said.append) == 0 and said[0].startswith(f"ended: Slurm job {job_id} has ended")

        # Ended: a render is allowed, and the old record is kept.
        r = subprocess.run([*INVOKE, "run", str(env / "recipe.yaml"), "--slurm", "--dry-run", "--out", str(run)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert ((run / "history" / "1" / "slurm_job_id").read_text().strip() == job_id
                and not (run / "slurm_job_id").exists())
        assert (run / "history" / "1" / "plan.json").read_bytes() == plan_before
    finally:
        client(slurm_lab.env, "scancel", "--", other_id)  # ours to clean up: this test started it


def test_a_requeued_job_resumes_from_its_checkpoint(env, slurm_lab):
    code, out, run = submit(env, slurm.Options(nodes=1), follow=False, STANDIN_CHECKPOINT="1", STANDIN_SLEEP="600",
                            STANDIN_RESUMED=str(env / "resumed.txt"))
    assert code == 0, out
    job_id = (run / "slurm_job_id").read_text().strip()
    tracker = env / "checkpoints" / "latest_checkpointed_iteration.txt"
    wait_for(tracker.exists, 240, "the first checkpoint")
    r = client(slurm_lab.env, "scontrol", "requeue", job_id)
    assert r.returncode == 0, r.stderr
    # Slurm holds a requeued job back for about two minutes (its begin time); a test need not wait.
    wait_for(lambda: state(job_id) == "PENDING", 120, "the job to be pending again")
    r = client(slurm_lab.env, "scontrol", "update", f"JobId={job_id}", "StartTime=now")
    assert r.returncode == 0, r.stderr
    wait_for(lambda: state(job_id) == "COMPLETED", 400, "the requeued job to finish", interval=1)
    assert (env / "resumed.txt").read_text() == "resumed from 1\n"
    output = (run / f"slurm-{job_id}.out").read_text()
    assert "requeued (restart 1): resuming from the newest complete checkpoint, iteration 1" in output
    assert slurm.status(run)["restarts"] == "1"
    wait_for(lambda: no_ray_left(slurm_lab), 60, "Ray to end with the job")


def _cli_recipe(env: Path, **over) -> tuple[Path, Path]:
    import yaml

    data = with_weights(make_recipe(env, num_gpus=2, **over))
    recipe, stack = parse_recipe(data, "test")
    path = env / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, write_catalog(env / "flags.json", recipe, stack)


def _node_line(out: str, node: str) -> str:
    table = out[out.index("node  checks"):]
    return next(line for line in table.splitlines() if line.startswith(f"{node} "))


def test_a_run_directory_one_node_cannot_see_is_refused_naming_it(env, slurm_lab):
    """h3 sees an empty tmpfs over <workdir>/private (its own mount namespace): a run directory there
    exists here, on h1 and on h2, not on h3. `invoke run --slurm` (the real task) is refused by the
    allocation's checks before Ray starts, naming h3 and the fix; the same recipe with a run
    directory every node sees runs."""
    recipe, catalog = _cli_recipe(env)
    hidden = slurm_lab.private["h3"] / env.name / "run"
    argv = [*INVOKE, "run", str(recipe), "--slurm", "--nodes", "3", "--catalog", str(catalog), "--no-network"]
    r = subprocess.run([*argv, "--out", str(hidden)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 3, r.stdout + r.stderr
    h3 = _node_line(r.stdout, "h3")
    assert "FAILED" in h3 and ("cannot see the run directory "
                              f"{hidden}") in h3 and "filesystem every node mounts" in h3, h3
    assert _node_line(r.stdout, "h1").split()[1] == "ok" and _node_line(r.stdout, "h2").split()[1] == "ok"
    assert "Ray was not started on any node" in r.stdout and not (hidden / "submission_id").exists()
    assert no_ray_left(slurm_lab)

    r = subprocess.run([*argv, "--out", str(env / "run")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "standin: exiting with 0" in r.stdout, r.stdout + r.stderr
    wait_for(lambda: no_ray_left(slurm_lab), 60, "Ray to end with the job")


def test_the_model_and_checkpoints_are_checked_on_every_node(env, slurm_lab):
    """The run directory is shared, but the model is missing on h3 and checkpoint_dir there is a
    directory of its own (the lab's per-host view): both are named, on h3 alone, before Ray starts."""
    import shutil

    private = slurm_lab.private["h3"] / env.name
    model = private / "models" / "m"
    model.mkdir(parents=True)
    shutil.copy(Path(make_recipe(env)["model_dir"]) / "config.json", model / "config.json")
    (model / "model.safetensors").write_bytes(b"w" * 4096)
    recipe, stack, catalog = recipe_for(env)
    recipe = recipe.model_copy(update={"model_dir": str(model), "checkpoint_dir": str(private / "checkpoints")})
    code, out, run = submit(env, slurm.Options(nodes=3), recipe=(recipe, stack, catalog))
    assert code == 3, out
    h3 = _node_line(out, "h3")
    assert f"model_dir {model}: no such directory here" in h3, h3
    assert f"checkpoint_dir {private / 'checkpoints'}: is not the head's filesystem" in h3, h3
    assert _node_line(out, "h1").split()[1] == "ok" and _node_line(out, "h2").split()[1] == "ok"
    # the batch host's marker is removed after the checks
    assert not list((private / "checkpoints").glob(".slimeforge-fs-*"))
    assert no_ray_left(slurm_lab)
