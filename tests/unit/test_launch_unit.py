"""The launcher's exact commands, through a dry-run proc.Runner (its history): container mode's
`docker run`, host mode's `ray start`, and how exit codes and entrypoints are formed."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
from launch_support import fake_nvidia_smi, make_recipe, write_catalog

from slimeforge.errors import ConfigError
from slimeforge.proc import Runner
from slimeforge.run import launch as launcher
from slimeforge.run.recipe import parse_recipe

IMAGE = "registry.example:5000/slimeforge@sha256:" + "a" * 64


@pytest.fixture
def gpu_host(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path / 'bin', 'h100-x1')}:/usr/bin:/bin")
    monkeypatch.setenv("SLIMEFORGE_STATE_DIR", str(tmp_path / "state"))
    for key in launcher.PASS_THROUGH_ENV:  # other tests' fixtures may have set some (moto's AWS keys)
        monkeypatch.delenv(key, raising=False)
    return tmp_path


def test_container_mode_runs_the_image_with_launch_sh(gpu_host, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "secret-value")
    recipe, stack = parse_recipe(make_recipe(gpu_host, mode="container", image=IMAGE), "test")
    catalog = write_catalog(gpu_host / "flags.json", recipe, stack)
    runner = Runner(dry_run=True)
    run_dir = gpu_host / "run"
    code = launcher.launch(recipe, stack, out=run_dir, catalog=str(catalog), runner=runner, network_checks=False,
                           stream=open("/dev/null", "w"))
    assert code == 0 and len(runner.history) == 1
    argv = runner.history[0]
    name = argv[argv.index("--name") + 1]
    assert name.startswith("slimeforge-sf-launch-test-")
    data_dir, ckpt, model = str(Path(recipe.data_path).parent), recipe.checkpoint_dir, recipe.model_dir
    assert argv == [
        "docker", "run", "--rm", "--init", "--name", name, "--cidfile", str(run_dir.resolve() / "container.id"),
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
    recipe, _ = parse_recipe(make_recipe(gpu_host, mode="container", image=IMAGE), "test")
    argv = launcher.container_argv(recipe, gpu_host / "run", name="n", cidfile=gpu_host / "cid", address="http://10.0.0.1:8265", environ={})
    assert argv[argv.index("RAY_ADDRESS=http://10.0.0.1:8265") - 1] == "-e"


def test_container_mode_without_image_is_refused(gpu_host):
    recipe, stack = parse_recipe(make_recipe(gpu_host, mode="container"), "test")
    with pytest.raises(ConfigError, match="container mode needs an image"):
        launcher.launch(recipe, stack, out=gpu_host / "run", runner=Runner(dry_run=True), stream=open("/dev/null", "w"))


def test_host_mode_takes_slime_and_megatron_from_the_install_prefix(gpu_host):
    recipe, _ = parse_recipe(make_recipe(gpu_host, slime_dir="/root/slime", megatron_dir="/root/Megatron-LM",
                                         install_prefix="/opt/sf"), "test")
    resolved = launcher.resolve_mode(recipe, "host")
    assert (resolved.slime_dir, resolved.megatron_dir) == ("/opt/sf/src/slime", "/opt/sf/src/Megatron-LM")
    assert launcher.host_tools(resolved) == ("/opt/sf/venv/bin/python", "/opt/sf/venv/bin/ray")


def test_host_mode_starts_a_head_with_the_recipes_shape(gpu_host):
    recipe, stack = parse_recipe(make_recipe(gpu_host, num_gpus=1), "test")
    catalog = write_catalog(gpu_host / "flags.json", recipe, stack)
    runner = Runner(dry_run=True)
    launcher.launch(recipe, stack, out=gpu_host / "run", catalog=str(catalog), runner=runner, network_checks=False,
                    head_args=["--temp-dir", "/tmp/sf-x"], stream=open("/dev/null", "w"))
    head, submit = runner.history
    assert head[1:] == ["start", "--head", "--block", "--num-gpus", "1", "--port", str(recipe.ray_port), "--dashboard-host", "127.0.0.1",
                        "--dashboard-port", str(recipe.ray_dashboard_port), "--disable-usage-stats", "--temp-dir", "/tmp/sf-x"]
    assert submit[1] == f"http://127.0.0.1:{recipe.ray_dashboard_port}"
    assert shlex.split(submit[2])[:3] == ["python3", f"{recipe.slime_dir}/train.py", "--swiglu"]


@pytest.mark.parametrize(("status", "message", "interrupted", "code"), [
    ("SUCCEEDED", "Job finished successfully.", False, 0),
    ("FAILED", "Job entrypoint command failed with exit code 3, last available logs ...", False, 3),
    ("FAILED", "Job supervisor actor died", False, 1),
    ("STOPPED", "Job was intentionally stopped.", True, 130),
    ("STOPPED", "Job was intentionally stopped.", False, 1),
])
def test_exit_code(status, message, interrupted, code):
    assert launcher.exit_code(status, message, interrupted) == code


def test_entrypoint_survives_sh(tmp_path):
    hostile = ["--x", "it's $(id) `id` \"q\"\nnext", "-1", '{"a": [1]}']
    command = launcher.entrypoint("printf", "/s", [], hostile)
    out = subprocess.run(["sh", "-c", command.replace("printf /s/train.py", "printf '%s\\0'")], capture_output=True, text=True)
    assert out.stdout.split("\0")[:-1] == hostile


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
