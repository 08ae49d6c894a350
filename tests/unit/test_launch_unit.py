"""The launcher's exact commands, through a dry-run proc.Runner (its history): container mode's
`docker run` and host mode's `bash launch.sh` with its environment; and launch.sh itself, the one
executor, against a stand-in `ray`: exit codes, and the head's deadline."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from launch_support import fake_nvidia_smi, make_recipe, stop_recorded_head, write_catalog

from slimeforge.errors import ConfigError
from slimeforge.proc import Runner, pid_alive
from slimeforge.run import launch as launcher
from slimeforge.run.modechoice import resolve_mode
from slimeforge.run.recipecheck import parse_recipe
from slimeforge.run.targets import local
from slimeforge.run.targets.base import Command, ResolvedRun

IMAGE = "registry.example:5000/slimeforge@sha256:" + "a" * 64


@pytest.fixture
def gpu_host(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path / 'bin', 'h100-x1')}:/usr/bin:/bin")
    monkeypatch.setenv("SLIMEFORGE_STATE_DIR", str(tmp_path / "state"))
    for key in local.PASS_THROUGH_ENV:  # other tests' fixtures may have set some (moto's AWS keys)
        monkeypatch.delenv(key, raising=False)
    return tmp_path


def test_container_mode_runs_the_image_with_launch_sh(gpu_host, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "secret-value")
    recipe, stack = parse_recipe(make_recipe(gpu_host, mode="container", image=IMAGE), "test")
    catalog = write_catalog(gpu_host / "flags.json", recipe, stack)
    runner = Runner(dry_run=True)
    run_dir = gpu_host / "run"
    # The image is nowhere: the preflight's docker check (which pulls it once for every check that
    # needs it) would refuse the launch; skipped, as only the recorded argv is compared here.
    code = launcher.launch(recipe, stack, out=run_dir, catalog=str(catalog), runner=runner, network_checks=False,
                           skip_checks=["docker"], stream=open("/dev/null", "w"))
    assert code == 0 and len(runner.history) == 1
    argv = runner.history[0]
    name = argv[argv.index("--name") + 1]
    assert name.startswith("slimeforge-sf-launch-test-")
    data_dir, ckpt, model = str(Path(recipe.data_path).parent), recipe.checkpoint_dir, recipe.model_dir
    token = argv[argv.index(f"slimeforge.exp_id={recipe.exp_id}") + 2].split("=", 1)[1]
    assert re.fullmatch(r"[0-9a-f]{32}", token)  # the run token: labels the container, reaches launch.sh
    assert argv == [
        "docker", "run", "--rm", "--init", "--name", name, "--cidfile", str(run_dir.resolve() / "container.id"),
        "--label", f"slimeforge.exp_id={recipe.exp_id}",
        "--label", f"slimeforge.run_token={token}", "-e", f"SLIMEFORGE_RUN_TOKEN={token}",
        "--gpus", "all", "--ipc=host", "--network", "host", "--shm-size", "64g",
        "--ulimit", "memlock=-1",
        "-v", f"{model}:{model}:ro", "-v", f"{data_dir}:{data_dir}:ro", "-v", f"{ckpt}:{ckpt}:rw",
        "-v", f"{run_dir.resolve()}:{run_dir.resolve()}:rw",
        "-e", "SLIMEFORGE_STATE_DIR=/tmp/slimeforge", "-e", "WANDB_API_KEY",  # by name: the value stays out of argv
        "-w", str(run_dir.resolve()), "--entrypoint", "bash", IMAGE, str(run_dir.resolve() / "launch.sh"),
    ]
    assert "secret-value" not in " ".join(argv)
    assert (run_dir / "launch.sh").exists()  # written after preflight passed


def test_container_mode_attaches_with_address(gpu_host):
    recipe, stack = parse_recipe(make_recipe(gpu_host, mode="container", image=IMAGE), "test")
    run = ResolvedRun(recipe, stack, gpu_host / "run", "test", {})
    argv = local.ContainerTarget("http://10.0.0.1:8265").docker_argv(run, name="n", cidfile=gpu_host / "cid")
    assert argv[argv.index("RAY_ADDRESS=http://10.0.0.1:8265") - 1] == "-e"


def test_container_mode_without_image_is_refused(gpu_host):
    recipe, stack = parse_recipe(make_recipe(gpu_host, mode="container"), "test")
    with pytest.raises(ConfigError, match="container mode needs an image"):
        launcher.launch(recipe, stack, out=gpu_host / "run", runner=Runner(dry_run=True), stream=open("/dev/null", "w"))


def test_host_mode_takes_slime_and_megatron_from_the_install_prefix(gpu_host):
    recipe, _ = parse_recipe(make_recipe(gpu_host, slime_dir="/root/slime", megatron_dir="/root/Megatron-LM",
                                         install_prefix="/opt/sf"), "test")
    resolved = resolve_mode(recipe, "host")
    # Where `invoke install --prefix /opt/sf` put the checkouts (it once said /opt/sf/src/slime here,
    # while the install wrote /opt/sf/slime): both read paths.Prefix and the stack's source dirs.
    from slimeforge.image.stack import load_stack
    from slimeforge.image.steps import host_layout

    stack = load_stack(recipe.stack)
    installed = host_layout(stack, "/opt/sf")
    assert (resolved.slime_dir, resolved.megatron_dir) == (installed.source_dir(stack, "slime"),
                                                           installed.source_dir(stack, "megatron"))
    assert (resolved.slime_dir, resolved.megatron_dir) == ("/opt/sf/slime", "/opt/sf/Megatron-LM")
    assert local.host_tools(resolved) == ("/opt/sf/venv/bin/python", "/opt/sf/venv/bin/ray")


def env_of(environ, *args):
    """launch.sh's environment: `environ` with what a host launch sets and removes."""
    set_env, unset = local.launch_env(environ, *args)
    return Command(("bash",), "launch.sh", tuple(set_env.items()), unset).environment(environ)


def test_host_mode_runs_launch_sh_with_the_install_first_on_path(gpu_host):
    recipe, stack = parse_recipe(make_recipe(gpu_host, num_gpus=1, install_prefix="/opt/sf"), "test")
    catalog = write_catalog(gpu_host / "flags.json", recipe, stack)
    runner = Runner(dry_run=True)
    run_dir = gpu_host / "run"
    launcher.launch(recipe, stack, out=run_dir, catalog=str(catalog), runner=runner, network_checks=False,
                    head_args=["--temp-dir", "/tmp/sf-x"], stream=open("/dev/null", "w"))
    assert runner.history == [["bash", str(run_dir.resolve() / "launch.sh")]]  # the one executor; nothing else
    env = env_of({"PATH": "/usr/bin:/bin", "RAY_ADDRESS": "http://stale:8265"}, gpu_host / "state" / "ray-1",
                              "/opt/sf/venv/bin/python", "/opt/sf/venv/bin/ray", None, ["--temp-dir", "/tmp/sf-x"], 7.5)
    assert env["PATH"] == "/opt/sf/venv/bin:/usr/bin:/bin"
    assert (env["SLIMEFORGE_PYTHON"] == "/opt/sf/venv/bin/python"
            and env["SLIMEFORGE_STATE_DIR"] == str(gpu_host / "state"))
    assert env["SLIMEFORGE_RAY_HEAD_ARGS"] == "--temp-dir /tmp/sf-x" and env["SLIMEFORGE_HEAD_TIMEOUT"] == "8"
    assert "RAY_ADDRESS" not in env  # without --address a head is started here, whatever the shell holds
    attach = env_of({"PATH": "/bin"}, gpu_host, "python3", "ray", "10.0.0.1:8265", None, 1)
    assert (attach["RAY_ADDRESS"] == "http://10.0.0.1:8265" and attach["PATH"] == "/bin"
            and "SLIMEFORGE_RAY_HEAD_ARGS" not in attach)


def test_head_args_with_whitespace_are_refused_before_anything_runs(gpu_host):
    recipe, stack = parse_recipe(make_recipe(gpu_host), "test")
    runner = Runner(dry_run=True)
    with pytest.raises(ConfigError, match="head_args") as err:
        launcher.launch(recipe, stack, out=gpu_host / "run", runner=runner, head_args=["--temp-dir", "/tmp/a b"],
                        stream=open("/dev/null", "w"))
    assert "'/tmp/a b'" in str(err.value) and runner.history == [] and not (gpu_host / "run").exists()


def stand_in_ray(bin_dir: Path, status: str, head: str = "answers") -> Path:
    """A `ray` that says `status` for `ray job status`; its head either answers `ray job list` at
    once or never does (`ray start` then just sleeps)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    list_exit = 0 if head == "answers" else 1
    # A #! python script like Ray's own: `ray start --head` keeps its argv (launch.sh proves the head by it).
    (bin_dir / "ray").write_text(f"""#!{sys.executable}
import sys, time
words = " ".join(sys.argv[1:3])
if words == "start --head":
    time.sleep(300)
elif words == "job list":
    sys.exit({list_exit})
elif words == "job status":
    print({status!r})
""")
    (bin_dir / "ray").chmod(0o755)
    return bin_dir


def run_launch_sh(gpu_host, bin_dir: Path, **env) -> subprocess.CompletedProcess:
    import os
    import sys

    from slimeforge.run.rundir import build_run_dir, write_run_dir

    recipe, stack = parse_recipe(make_recipe(gpu_host), "test")
    run = build_run_dir(recipe, stack, gpu_host / "run", "test")
    write_run_dir(run)
    full = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "SLIMEFORGE_PYTHON": sys.executable, **env}
    return subprocess.run(["bash", str(run.path / "launch.sh")], env=full, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("status", "code"), [
    ("Job 'x' succeeded", 0),
    ("Job 'x' failed\nStatus message: Job entrypoint command failed with exit code 3, last available logs ...", 3),
    ("Job 'x' failed\nStatus message: Job supervisor actor died", 1),
    ("Job 'x' was stopped", 1),
])
def test_launch_sh_exits_with_the_jobs_outcome(gpu_host, status, code):
    proc = run_launch_sh(gpu_host, stand_in_ray(gpu_host / "bin", status), RAY_ADDRESS="http://127.0.0.1:1")
    assert proc.returncode == code, proc.stderr
    assert f"exit code {code}" in proc.stderr and "is left running, as it was" in proc.stderr


def test_the_head_deadline_is_one_value_and_a_silent_head_fails_by_it(gpu_host):
    """launch.py's host path and launch.sh once waited 180 s and 120 s for the Ray head. Now
    launch.sh is the only waiter: launch() hands it its deadline, whose default is the one that is
    rendered (rundir.HEAD_TIMEOUT_S), and a head that never answers fails the launch at that deadline."""
    import os
    import sys
    import time

    from slimeforge.run.rundir import HEAD_TIMEOUT_S

    assert launcher.LaunchRequest(recipe="r").head_timeout == HEAD_TIMEOUT_S  # the one options dataclass
    # Through launch() itself, as `invoke run` goes: the install's `ray` (a silent head) first on PATH.
    prefix = gpu_host / "prefix"
    venv_bin = stand_in_ray(prefix / "venv" / "bin", "unused", head="silent")
    (venv_bin / "python").symlink_to(sys.executable)
    recipe, stack = parse_recipe(make_recipe(gpu_host, install_prefix=str(prefix)), "test")
    catalog = write_catalog(gpu_host / "flags.json", recipe, stack)
    out = io.StringIO()
    t0 = time.monotonic()
    code = launcher.launch(recipe, stack, out=gpu_host / "run", catalog=str(catalog), network_checks=False, stream=out,
                           head_timeout=2,
                           environ={**os.environ, "PATH": f"/usr/bin:/bin:{os.environ['PATH']}"})
    elapsed = time.monotonic() - t0
    assert code == 1, out.getvalue()
    assert "the Ray head did not answer within 2 s" in out.getvalue()
    assert elapsed < HEAD_TIMEOUT_S / 2  # the passed deadline, not the default, governed the wait
    pid = json.loads((gpu_host / "state" / f"ray-{recipe.ray_port}" / "head.json").read_text())["pid"]
    assert stop_recorded_head(gpu_host / "state" / f"ray-{recipe.ray_port}", say=lambda _: None, timeout=10) == pid
    assert not pid_alive(pid)


def test_launch_sh_passes_bash_n_and_shellcheck(gpu_host):
    import shutil

    from slimeforge.run.rundir import build_run_dir

    recipe, stack = parse_recipe(make_recipe(gpu_host), "test")
    script = gpu_host / "launch.sh"
    script.write_text(build_run_dir(recipe, stack, gpu_host / "run").files["launch.sh"])
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    if shutil.which("shellcheck"):
        res = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout


def _start_time(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def test_launch_sh_stops_only_the_head_its_record_proves(gpu_host):
    """launch.sh's own stop of an earlier head (issue 33): pid, start time and boot id are not
    enough; the live argv must be the recorded `ray start --head ...` and carry the record's run token."""
    import os

    from slimeforge.run.ownership import boot_id
    from slimeforge.run.rundir import build_run_dir, write_run_dir

    bin_dir = stand_in_ray(gpu_host / "bin", "unused", head="silent")
    recipe, stack = parse_recipe(make_recipe(gpu_host), "test")
    rundir = build_run_dir(recipe, stack, gpu_host / "run", "test")
    write_run_dir(rundir)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "SLIMEFORGE_PYTHON": sys.executable,
           "SLIMEFORGE_HEAD_TIMEOUT": "1"}

    def launch() -> subprocess.CompletedProcess:  # the same run directory (and ports) every time
        return subprocess.run(["bash", str(rundir.path / "launch.sh")], env=env, capture_output=True, text=True,
                              timeout=120)

    sdir = gpu_host / "state" / f"ray-{recipe.ray_port}"
    token = "c3" * 16
    argv = ["ray", "start", "--head", "--block", "--port", str(recipe.ray_port)]
    impostors = {
        # `--head` is one of its words, and it was recorded with the right pid, start time and boot id.
        "is not the `ray start --head` recorded": [sys.executable, "-c", "import time; time.sleep(300)", "--head"],
        # The exact argv of a head (the stand-in `ray`), started by hand: no run token in its environment.
        "does not carry the run token": [str(bin_dir / "ray"), *argv[1:]],
    }
    for why, cmd in impostors.items():
        proc = subprocess.Popen(cmd, env={**os.environ, "SLIMEFORGE_RUN_TOKEN": "d4" * 16})
        try:
            sdir.mkdir(parents=True, exist_ok=True)
            (sdir / "head.json").write_text(json.dumps({"pid": proc.pid, "start_time": _start_time(proc.pid),
                                                        "boot_id": boot_id(),
                                                        "exp_id": "test", "run_token": token, "argv": argv}))
            run = launch()
            assert why in run.stderr and "left alone (no process stopped)" in run.stderr, run.stderr
            assert proc.poll() is None, run.stderr  # not signalled
        finally:
            proc.kill()
            proc.wait()
        _stop_head(sdir)  # the silent head this launch started
    # The head an earlier launch started (its argv, its token): the next launch stops it.
    first = launch()
    earlier = json.loads((sdir / "head.json").read_text())
    assert earlier["argv"][:3] == ["ray", "start", "--head"] and "did not answer within 1 s" in first.stderr
    second = launch()
    assert f"stopping the Ray head of an earlier launch (pid {earlier['pid']})" in second.stderr, second.stderr
    assert not pid_alive(earlier["pid"])
    _stop_head(sdir)


def _stop_head(sdir: Path) -> None:
    """The stand-in head a launch started and recorded (its pid proved as launch.sh does)."""
    assert stop_recorded_head(sdir, say=lambda _: None, timeout=10)


# --- the API on `invoke run`'s path (issue 34): in place, one request, the same errors ---------------


def in_place_kwargs(tmp: Path) -> dict:
    """The guide's keyword arguments for an environment like slime's container under `tmp`: no
    mode, image or install_prefix (make_recipe's own mode is left out)."""
    data = make_recipe(tmp)
    del data["mode"]
    return data


def capture_apply(monkeypatch) -> dict:
    """launch.apply through the real target with a recording runner: the plan, the argv, the output."""
    seen: dict = {}

    def apply(target, plan, runner, stream):
        seen["plan"], seen["runner"] = plan, Runner(dry_run=True)
        return target.apply(plan, seen["runner"], lambda s: seen.setdefault("said", []).append(s), stream)

    monkeypatch.setattr(launcher, "apply", apply)
    return seen


def test_slimerunner_without_mode_image_or_prefix_trains_in_place(gpu_host, monkeypatch):
    """The guide's call (no mode, no image, no prefix) plans a host launch with this interpreter, and
    the preflight reads the flag catalog from slime_dir with it: no catalog is given."""
    import sys

    from launch_support import slime_in_place

    from slimeforge import SlimeRunner

    kwargs = in_place_kwargs(gpu_host)
    runner = SlimeRunner(**kwargs)
    slime_in_place(Path(kwargs["slime_dir"]), runner.recipe, runner.stack)
    seen = capture_apply(monkeypatch)
    assert runner.train(num_rollout=1, out=str(gpu_host / "run"), network_checks=False) == 0
    plan = seen["plan"]
    assert plan.target == "host" and plan.run.recipe.mode == "host" and plan.run.python == sys.executable
    env = dict(plan.commands[0].set_env)
    assert env["SLIMEFORGE_PYTHON"] == sys.executable
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)  # this environment's `ray` starts the head
    assert seen["runner"].history == [["bash", str((gpu_host / "run").resolve() / "launch.sh")]]
    # First the layout (this environment's own where slimeforge did not build it: run/layout.py), then the preflight's
    # table.
    table = next(text for text in seen["said"] if "error(s)" in text)
    if not Path("/opt/slimeforge").is_dir():
        assert seen["said"][0].startswith("layout: this environment's own layout (in place"), seen["said"]
    assert f"slime at {kwargs['slime_dir']}, read with {sys.executable}" in table and "0 error(s)" in table
    assert '"--num-rollout"' not in table and (gpu_host / "run" / "plan.json").is_file()


def test_in_place_without_slime_here_says_so_in_one_line_with_the_two_ways_on(gpu_host):
    from slimeforge import SlimeRunner

    kwargs = {**in_place_kwargs(gpu_host), "slime_dir": str(gpu_host / "no-slime")}
    with pytest.raises(ConfigError) as err:
        SlimeRunner(**kwargs).train(num_rollout=1, out=str(gpu_host / "run"))
    (problem,) = err.value.problems
    assert problem.where == "slime_dir" and problem.value == str(gpu_host / "no-slime")
    assert "\n" not in str(problem) and "image=" in str(problem) and "install_prefix=" in str(problem)
    assert not (gpu_host / "run").exists()  # refused before anything was written


@pytest.mark.parametrize("given", [{"mode": "container"}, {"partition": "gpu"}, {"mode": "vm"}])
def test_the_api_and_the_command_line_refuse_alike(gpu_host, given):
    """One request, one resolve: the same ConfigError, problem for problem, from train() and `invoke run`."""
    import yaml

    from slimeforge import SlimeRunner

    kwargs = make_recipe(gpu_host)
    recipe_keys = {k: v for k, v in given.items() if k == "mode" and v == "container"}
    options = {k: v for k, v in given.items() if k not in recipe_keys}
    recipe_file = gpu_host / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump({**kwargs, **recipe_keys}))
    with pytest.raises(ConfigError) as cli:
        launcher.run_recipe(launcher.LaunchRequest(recipe=str(recipe_file), **options), dry_run=False)
    with pytest.raises(ConfigError) as api:
        SlimeRunner.from_yaml(recipe_file).train(num_rollout=1, **options)
    assert cli.value.problems == api.value.problems and cli.value.problems


def test_launch_options_are_one_frozen_dataclass_built_by_keyword(gpu_host):
    import dataclasses

    from slimeforge import SlimeRunner

    with pytest.raises(TypeError):
        launcher.LaunchRequest("recipe.yaml", None, (), None, None, "reg/img:1", "/opt/sf")  # type: ignore[misc]
    req = launcher.LaunchRequest(recipe="recipe.yaml", image="reg/img:1", prefix="/opt/sf")
    assert (req.image, req.prefix) == ("reg/img:1", "/opt/sf")
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.image = "other"  # type: ignore[misc]
    with pytest.raises(ConfigError, match="is not a launch option") as err:
        SlimeRunner(**make_recipe(gpu_host)).train(num_rollout=1, imgae="reg/img:1")
    assert [p.where for p in err.value.problems] == ["imgae"] and "image" in (err.value.problems[0].accepted or "")
    # Python values are typed here (invoke types the command line's): a string is not a list of words.
    with pytest.raises(ConfigError, match="launch options") as err:
        SlimeRunner(**make_recipe(gpu_host)).train(num_rollout=1, head_args="--temp-dir /tmp/x", network_checks="no",
                                                   skip_checks=["flags"])
    assert [(p.where, p.value) for p in err.value.problems] == [("network_checks", "no"), ("head_args",
                                                                                           "--temp-dir /tmp/x")]


def test_reprs_are_short_and_the_content_stays_in_the_attributes(gpu_host):
    from slimeforge import SlimeRunner
    from slimeforge.run.preflight.findings import ERROR, OK, WARNING, Finding, Report

    kwargs = make_recipe(gpu_host)
    run = SlimeRunner(**kwargs).render(gpu_host / "run")
    text = repr(run)
    assert len(text) < 200 and str(run.path) in text and "launch.sh" in text and f"args={len(run.args)}" in text
    assert sum(len(t) for t in run.files.values()) > 5000 and run.plan["exp_id"] == kwargs["exp_id"]
    recipe, stack = parse_recipe(kwargs, "test")
    plan = local.HostTarget().plan(ResolvedRun(recipe, stack, gpu_host / "run2", "test", {}))
    assert repr(plan) == (f"LaunchPlan(target='host', run_dir='{plan.rundir.path}', files=5, commands=1, mounts=0, "
                         "notes=0)")
    report = Report([Finding("a", ERROR, "x", "y"), Finding("b", WARNING, "w"), Finding("c", OK, "fine")], 0.25)
    assert repr(report) == "Report(errors=1, warnings=1, ok=1, seconds=0.25)" and len(report.findings) == 3


def test_versions_in_place_need_ray_in_this_environment(gpu_host):
    """In place, the head starts with this environment's Ray: env_probe.py, run with its interpreter, says."""
    import sys

    from slimeforge.run.preflight import run_checks

    recipe, stack = parse_recipe(make_recipe(gpu_host), "test")
    (finding,) = run_checks(recipe, stack, only=["versions"], python=sys.executable).findings
    assert finding.level == "ok" and f"in this environment ({sys.executable})" in finding.message
    no_ray = gpu_host / "bare-python"
    no_ray.write_text('#!/bin/sh\necho \'{"python": "3.12.1", "ray": null, "executable": "/usr/bin/python3"}\'\n')
    no_ray.chmod(0o755)
    (finding,) = run_checks(recipe, stack, only=["versions"], python=str(no_ray)).findings
    assert finding.level == "error" and "Ray is not installed" in finding.message and "ray[default]" in finding.fix
    with_prefix = recipe.model_copy(update={"install_prefix": "/opt/sf"})  # an install's environment: not in place
    (finding,) = run_checks(with_prefix, stack, only=["versions"], python=str(no_ray)).findings
    assert finding.level == "ok" and "no --address" in finding.message
