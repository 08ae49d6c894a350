"""The launch against a real Ray on CPU, with a stand-in train.py that records its argv and env,
S3 and AgentCore through moto's server, and GPUs from a fake nvidia-smi fed with real captures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import json_shapes
import pytest
import yaml
from launch_support import (
    ARN,
    RayHead,
    head_extra_args,
    make_recipe,
    read_args,
    short_tmp,
    stop_recorded_head,
    wait_for,
    write_catalog,
)

from slimeforge.proc import Runner, pid_alive
from slimeforge.run import launch as launcher
from slimeforge.run import preflight as doctor
from slimeforge.run.headstate import state_dir
from slimeforge.run.modelscript import eval_model_script, model_script
from slimeforge.run.preflight.versions import local_versions
from slimeforge.run.recipecheck import parse_recipe
from slimeforge.run.targets import jobs
from slimeforge.run.targets.base import ResolvedRun
from slimeforge.run.targets.local import ContainerTarget

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "it's \"quoted\" $(touch /tmp/sf-pwned) `id` $HOME  new line; rm -rf / &"  # control characters are refused
# Ray expands $NAME in runtime env values and has no escape (preflight refuses them: runtime-env);
# every other byte must arrive.
HOSTILE_ENV = HOSTILE.replace("$HOME", "$ HOME $5 $(")


@pytest.fixture(scope="session")
def ray_head():
    head = RayHead(num_gpus=1).start()
    yield head
    head.stop()


def recipe_for(tmp: Path, **over):
    recipe, stack = parse_recipe(make_recipe(tmp, **over), "test")
    catalog = write_catalog(tmp / "flags.json", recipe, stack)
    return recipe, stack, str(catalog)


def recorded_call(recipe) -> dict:
    return json.loads(Path(recipe.env["STANDIN_RECORD"]).read_text())


def expected_argv(recipe, run_dir: Path) -> list[str]:
    margs = eval_model_script(model_script(recipe), recipe.slime_dir, Runner())
    return [f"{recipe.slime_dir}/train.py", *margs, *read_args(run_dir / "slime.args")]


def test_run_on_a_running_cluster_args_env_exit_codes_and_rerun(env, ray_head, capsys):
    hostile_dir = env / f"data {HOSTILE.replace('/', '_')}"
    hostile_data = hostile_dir / "train.jsonl"
    hostile_dir.mkdir()
    hostile_data.write_text('{"prompt": "1+1?", "metadata": {"answer": "2"}}\n')
    recipe, stack, catalog = recipe_for(env, data_path=str(hostile_data),
                                        checkpoint_dir=str(env / f"ckpt {HOSTILE.replace('/', '_')}"),
                                        env={"STANDIN_RECORD": str(env / "record.json"), "STANDIN_EXIT": "3",
                                             "STANDIN_NOTE": HOSTILE_ENV})
    run_dir = env / "run"
    code = launcher.launch(recipe, stack, out=run_dir, address=ray_head.address, catalog=catalog)
    out = capsys.readouterr().out
    assert code == 3, out
    call = recorded_call(recipe)
    assert call["argv"] == expected_argv(recipe, run_dir)  # MODEL_ARGS first, then slime.args, byte for byte
    assert str(hostile_data) in call["argv"] and recipe.resolved_checkpoint_dir in call["argv"]
    assert call["env"]["STANDIN_NOTE"] == HOSTILE_ENV
    runtime_env = json.loads((run_dir / "runtime_env.json").read_text())["env_vars"]
    # Ray puts the job's working_dir (job.sh, agentcore.yaml) first on PYTHONPATH; Megatron follows.
    pythonpath = call["env"]["PYTHONPATH"].split(":")
    assert (pythonpath[-1] == runtime_env["PYTHONPATH"] and "working_dir_files" in pythonpath[0]
            and call["cwd"] == pythonpath[0])
    assert {k: call["env"][k] for k in runtime_env if k != "PYTHONPATH"} == {k: v for k,
                                                                             v in runtime_env.items()
                                                                             if k != "PYTHONPATH"}
    assert not Path("/tmp/sf-pwned").exists()
    sid = (run_dir / "submission_id").read_text().strip()
    assert (run_dir / "ray_address").read_text().strip() == ray_head.address
    assert "standin: exiting with 3" in (run_dir / "job.log").read_text()
    assert "standin: exiting with 3" in out and "left running" in out
    assert "ERROR" not in out.split("error(s)")[0]  # the preflight table passed
    assert jobs.status(run_dir).data["status"] == "FAILED"

    # A second run of the same recipe after a finished one: a new submission, exit 0, the log appended.
    recipe2 = recipe.model_copy(update={"env": {**recipe.env, "STANDIN_EXIT": "0"}})
    assert launcher.launch(recipe2, stack, out=run_dir, address=ray_head.address, catalog=catalog) == 0
    sid2 = (run_dir / "submission_id").read_text().strip()
    assert sid2 != sid
    st = jobs.status(run_dir).data
    assert st["status"] == "SUCCEEDED" and st["submission_id"] == sid2
    log = (run_dir / "job.log").read_text()
    assert log.count("--- slimeforge: submission") == 2 and "standin: exiting with 0" in log


# SIGINT to `invoke run` on a running cluster detaches (the job goes on): test_jobs_detach.py.


def head_pid(sdir: Path) -> int:
    return json.loads((sdir / "head.json").read_text())["pid"]


def test_start_head_submit_replace_and_stop(env):
    """The whole path: start our own head (recorded with its start time and the run), submit, a
    second launch replaces that head, and run.stop --head stops only the recorded one."""
    temp = short_tmp()
    try:
        recipe, stack, catalog = recipe_for(env)
        run_dir = env / "run"
        args = head_extra_args(temp)
        assert launcher.launch(recipe, stack, out=run_dir, catalog=catalog, head_args=args) == 0
        sdir = state_dir(recipe.ray_port)
        first = head_pid(sdir)
        assert pid_alive(first)
        assert recorded_call(recipe)["argv"] == expected_argv(recipe, run_dir)
        head = json.loads((sdir / "head.json").read_text())
        assert head["exp_id"] == recipe.exp_id and head["run_token"] == (run_dir / "run_token").read_text().strip()

        assert launcher.launch(recipe, stack, out=run_dir, catalog=catalog, head_args=head_extra_args(temp)) == 0
        second = head_pid(sdir)
        assert second != first and not pid_alive(first) and pid_alive(second)
        assert (run_dir / "history" / "1" / "submission_id").exists()  # the first launch's record, kept

        said: list[str] = []
        assert jobs.stop(run_dir, head=True, say=said.append) == 0
        assert said[0].startswith("ended: job ") and said[1] == (f"stopped: Ray head pid {second} (and the Ray "
                                                                "processes it started)")
        wait_for(lambda: not pid_alive(second), 90, "the head to stop")
        assert not (sdir / "head.json").exists()
    finally:
        record = state_dir(recipe.ray_port) / "head.json"
        if record.exists() and pid_alive(head_pid(record.parent)):
            os.kill(head_pid(record.parent), signal.SIGTERM)
        subprocess.run(["rm", "-rf", str(temp)], check=False)


def test_run_stop_head_stops_a_running_job_and_its_head_and_a_live_run_is_never_rendered_over(env):
    """`invoke run` (its own head), the job running: a dry run into its directory is refused with
    the job id and the run.stop that ends it; `invoke run.stop --head` stops the job and the head
    (exit 0); then a render is allowed and the old record is kept in history/1/."""
    temp = short_tmp()
    recipe_data = make_recipe(env, env={"STANDIN_RECORD": str(env / "record.json"), "STANDIN_SLEEP": "600"})
    recipe, stack = parse_recipe(recipe_data, "test")
    catalog = write_catalog(env / "flags.json", recipe, stack)
    (env / "recipe.yaml").write_text(yaml.safe_dump(recipe_data))
    run_dir = env / "run"
    sdir = state_dir(recipe.ray_port)
    cli_env = {**os.environ, "SLIMEFORGE_RAY_HEAD_ARGS": " ".join(head_extra_args(temp))}
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "run", str(env / "recipe.yaml"), "--out", str(run_dir),
                             "--catalog", catalog],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cli_env)
    try:
        wait_for(lambda: (run_dir / "job.log").exists() and "standin: waiting" in (run_dir / "job.log").read_text(),
                 240, "the job to run")
        sid = (run_dir / "submission_id").read_text().strip()
        pid = head_pid(sdir)
        plan_before = (run_dir / "plan.json").read_bytes()

        dry = subprocess.run([sys.executable, "-m", "invoke", "run", str(env / "recipe.yaml"), "--dry-run",
                              "--out", str(run_dir)],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert (dry.returncode == 2 and sid in dry.stderr
                and f"invoke run.stop {run_dir} --head" in dry.stderr), dry.stdout + dry.stderr
        assert ((run_dir / "plan.json").read_bytes() == plan_before
                and (run_dir / "submission_id").read_text().strip() == sid)

        status = subprocess.run([sys.executable, "-m", "invoke", "run.status", str(run_dir)], cwd=ROOT,
                                capture_output=True, text=True, timeout=120)
        assert (status.returncode == 0 and f"{sid}: RUNNING" in status.stdout
                and f"Ray head pid {pid} (started by slimeforge for this run)" in status.stdout)
        as_json = subprocess.run([sys.executable, "-m", "invoke", "run.status", str(run_dir), "--json"], cwd=ROOT,
                                 capture_output=True, text=True, timeout=120)
        doc = json.loads(as_json.stdout)  # stdout holds the one document (docs/json.md), nothing else
        json_shapes.check(doc, "slimeforge.run-status/1")
        assert ((doc["target"], doc["status"], doc["submission_id"], doc["head_pid"], doc["run_dir"])
                == ("ray-job", "RUNNING", sid, pid, str(run_dir)))

        stop = subprocess.run([sys.executable, "-m", "invoke", "run.stop", str(run_dir), "--head"], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert f"stopped: job {sid}: STOPPED" in stop.stdout and f"stopped: Ray head pid {pid}" in stop.stdout
        wait_for(lambda: not pid_alive(pid), 90, "the head to stop")
        out, _ = proc.communicate(timeout=300)  # launch.sh sees the job stopped (or its head gone) and exits
        assert proc.returncode != 0, out

        again = subprocess.run([sys.executable, "-m", "invoke", "run.stop", str(run_dir), "--head"], cwd=ROOT,
                               capture_output=True, text=True, timeout=120)
        assert (again.returncode == 0 and "ended: job" in again.stdout
                and "ended: no Ray head is recorded" in again.stdout), again.stdout

        dry = subprocess.run([sys.executable, "-m", "invoke", "run", str(env / "recipe.yaml"), "--dry-run",
                              "--out", str(run_dir)],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert ((run_dir / "history" / "1" / "submission_id").read_text().strip() == sid
                and not (run_dir / "submission_id").exists())
    finally:
        if proc.poll() is None:
            proc.kill()
        if (sdir / "head.json").exists() and pid_alive(head_pid(sdir)):
            os.kill(head_pid(sdir), signal.SIGTERM)
        subprocess.run(["rm", "-rf", str(temp)], check=False)


def test_a_job_that_is_not_this_runs_or_is_gone_or_on_a_cluster_we_did_not_start(env, ray_head):
    """On a running cluster (--address): a job whose metadata lacks this run's token is refused by
    stop, status and logs, and keeps running; a job the head does not know (a replaced head: 404)
    is reported as gone; --head says there is no head of ours to stop."""
    from ray.job_submission import JobSubmissionClient

    from slimeforge.run.rundir import build_run_dir, write_run_dir

    recipe, stack, _ = recipe_for(env)
    run = build_run_dir(recipe, stack, env / "run", "test")
    write_run_dir(run)
    token = "0123456789abcdef0123456789abcdef"
    (run.path / "run_token").write_text(token + "\n")
    (run.path / "ray_address").write_text(ray_head.address + "\n")
    client = JobSubmissionClient(ray_head.address)
    foreign = f"{recipe.exp_id}-20261125-080000-{os.urandom(3).hex()}"
    client.submit_job(entrypoint="sleep 300", submission_id=foreign, metadata={"slimeforge_exp_id": recipe.exp_id})
    try:
        (run.path / "submission_id").write_text(foreign + "\n")
        wait_for(lambda: str(client.get_job_status(foreign)).endswith("RUNNING"), 120, "the foreign job to run")
        for task in (["run.stop"], ["run.stop", "--head"], ["run.status"], ["run.logs"]):
            r = subprocess.run([sys.executable, "-m", "invoke", task[0], str(run.path), *task[1:]], cwd=ROOT,
                               capture_output=True, text=True, timeout=120)
            assert r.returncode != 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
            assert f"job {foreign} carries metadata" in r.stdout + r.stderr and ("it was not submitted by this "
                                                                                "run") in r.stdout + r.stderr
        assert str(client.get_job_status(foreign)).endswith("RUNNING")  # untouched

        gone = f"{recipe.exp_id}-20261125-080001-{os.urandom(3).hex()}"
        (run.path / "submission_id").write_text(gone + "\n")
        r = subprocess.run([sys.executable, "-m", "invoke", "run.status", str(run.path)], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and f"{gone}: GONE" in r.stdout and ("unknown to the Ray "
                                                                     "head") in r.stdout, r.stdout + r.stderr
        r = subprocess.run([sys.executable, "-m", "invoke", "run.stop", str(run.path), "--head"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert (f"ended: job {gone} is unknown to the Ray "
               "head") in r.stdout and "there is no head of ours to stop" in r.stdout
        r = subprocess.run([sys.executable, "-m", "invoke", "run.logs", str(run.path)], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2 and "unknown to the Ray head" in r.stderr and "Traceback" not in r.stderr
    finally:
        client.stop_job(foreign)  # ours to clean up: this test submitted it


def test_launch_sh_runs_for_real(env):
    """The rendered launch.sh, by bash, starts its own head, submits, propagates the exit code."""
    from slimeforge.run.rundir import build_run_dir, write_run_dir

    temp = short_tmp()
    recipe, stack, _ = recipe_for(env, env={"STANDIN_RECORD": str(env / "record.json"), "STANDIN_EXIT": "4",
                                            "STANDIN_NOTE": HOSTILE_ENV})
    run = build_run_dir(recipe, stack, env / "run", "test")
    write_run_dir(run)
    sh_env = {**os.environ, "SLIMEFORGE_RAY_HEAD_ARGS": " ".join(head_extra_args(temp))}
    sdir = state_dir(recipe.ray_port)
    try:
        proc = subprocess.run(["bash", str(run.path / "launch.sh")], env=sh_env, capture_output=True, text=True,
                              timeout=500)
        assert proc.returncode == 4, proc.stdout + proc.stderr
        call = recorded_call(recipe)
        assert call["argv"] == expected_argv(recipe, run.path)
        assert call["env"]["STANDIN_NOTE"] == HOSTILE_ENV
        assert (run.path / "submission_id").exists() and "standin: exiting with 4" in (run.path / "job.log").read_text()
        assert pid_alive(head_pid(sdir))
        assert (run.path / "run_token").read_text().strip() == json.loads((sdir / "head.json").read_text())["run_token"]
    finally:
        stop_recorded_head(sdir, say=lambda _: None)
        subprocess.run(["rm", "-rf", str(temp)], check=False)


def test_s3_and_agentcore_checks_against_moto(env):
    recipe, stack, _ = recipe_for(env)
    found = {f.check: f for f in doctor.run_checks(recipe, stack, only=["aws-credentials", "s3", "agentcore"]).findings}
    assert found["aws-credentials"].level == doctor.OK and found["s3"].level == doctor.OK
    assert found["agentcore"].level == doctor.OK, str(found["agentcore"])
    assert found["agentcore"].message == f"runtime {recipe.agent_runtime_arn.split('/')[-1]} is READY"
    gone, _ = parse_recipe(make_recipe(env, agent_runtime_arn=ARN), "test")
    err = doctor.run_checks(gone, stack, only=["agentcore"]).errors[0]
    assert "does not exist in us-west-2" in err.message and "deploy the agent" in err.fix
    missing, _ = parse_recipe(make_recipe(env, s3_bucket="sf-no-such-bucket"), "test")
    err = doctor.run_checks(missing, stack, only=["s3"]).errors[0]
    assert "sf-no-such-bucket does not exist" in err.message and "aws s3 mb" in err.fix


def test_versions_match_the_cluster(env, ray_head):
    report = doctor.run_checks(only=["versions"], address=ray_head.address)
    assert report.errors == [], report.table()
    assert f"Ray {local_versions()[0]}" in report.findings[0].message and "match" in report.findings[0].message


@pytest.mark.docker
def test_container_mode_real_docker_run_without_gpus(env, base_image):
    """The container argv for real (less --gpus and the memlock ulimit, which this machine cannot
    give): launch.sh runs inside from the run dir mounted at the same path, its exit code comes
    back, and the container id is recorded."""
    import secrets

    from slimeforge.run.rundir import build_run_dir, write_run_dir

    recipe, stack, _ = recipe_for(env, mode="container", image=base_image)
    run = build_run_dir(recipe, stack, env / "run", "test")
    write_run_dir(run)
    resolved = ResolvedRun(recipe, stack, run.path, "test", {})
    target = ContainerTarget(shm_size="256m", gpus=False, ulimits=())
    argv = target.docker_argv(resolved, name=f"sf-launch-test-{secrets.token_hex(4)}",
                              cidfile=run.path / "container.id")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    # The stand-in slime_dir is not in the image: launch.sh stops at its first check, inside the container.
    assert proc.returncode == 2, proc.stderr
    assert f"no model script at {recipe.slime_dir}/scripts/models/qwen2.5-3B.sh" in proc.stderr
    assert len((run.path / "container.id").read_text().strip()) == 64


@pytest.mark.docker
def test_run_stop_head_stops_only_a_container_labelled_for_this_run(env, base_image):
    """A container slimeforge started for this run (its labels) is stopped by its full id; one
    whose labels name another run is refused and keeps running."""
    from slimeforge.run.rundir import build_run_dir, write_run_dir

    recipe, stack, _ = recipe_for(env, mode="container", image=base_image)
    run = build_run_dir(recipe, stack, env / "run", "test")
    write_run_dir(run)
    token = os.urandom(16).hex()
    (run.path / "run_token").write_text(token + "\n")
    started = []

    def container(run_token: str) -> str:
        (run.path / "container.id").unlink(missing_ok=True)
        # --init, as the launch's own `docker run` has: PID 1 passes `docker stop`'s SIGTERM on to the
        # sleep (a bare `sleep` as PID 1 ignores it, and docker stop would wait its whole 60 s).
        subprocess.run(["docker", "run", "-d", "--rm", "--init", "--cidfile", str(run.path / "container.id"),
                        "--label", f"slimeforge.exp_id={recipe.exp_id}",
                        "--label", f"slimeforge.run_token={run_token}", "--entrypoint", "sleep", base_image, "300"],
                       check=True, capture_output=True)
        started.append((run.path / "container.id").read_text().strip())
        return started[-1]

    def running(cid: str) -> bool:
        r = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", "--", cid], capture_output=True, text=True)
        return r.stdout.strip() == "true"

    try:
        other = container(os.urandom(16).hex())
        r = subprocess.run([sys.executable, "-m", "invoke", "run.stop", str(run.path), "--head"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and f"refused: container {other[:12]} carries labels" in r.stdout, r.stdout + r.stderr
        assert running(other)

        ours = container(token)
        r = subprocess.run([sys.executable, "-m", "invoke", "run.stop", str(run.path), "--head"], cwd=ROOT,
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0 and ("stopped: container "
                                     f"{ours[:12]}") in r.stdout and ("docker said: "
                                                                     f"{ours}") in r.stdout, r.stdout + r.stderr
        assert not running(ours) and running(other)
    finally:
        for cid in started:  # only the containers this test started, by id
            subprocess.run(["docker", "rm", "-f", "--", cid], capture_output=True)
