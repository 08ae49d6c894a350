"""Launch targets: every container target mounts the same paths for the same recipe (eval sets
included), and the plan `invoke run --dry-run` prints is the plan a launch executes, argv for argv."""

from __future__ import annotations

import io
import re
import shlex
from pathlib import Path

import pytest
import yaml
from launch_support import fake_nvidia_smi, make_recipe, write_catalog, write_data

from slimeforge.proc import Runner
from slimeforge.run import launch as launcher
from slimeforge.run.recipecheck import parse_recipe
from slimeforge.run.targets import jobsubmit, local, slurm
from slimeforge.run.targets.base import ResolvedRun, describe
from slimeforge.run.targets.mounts import container_mounts

IMAGE = "registry.example:5000/slimeforge@sha256:" + "a" * 64


@pytest.fixture
def gpu_host(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path / 'bin', 'h100-x1')}:/usr/bin:/bin")
    monkeypatch.setenv("SLIMEFORGE_STATE_DIR", str(tmp_path / "state"))
    for key in local.PASS_THROUGH_ENV:
        monkeypatch.delenv(key, raising=False)
    return tmp_path


def with_evals(tmp: Path, **over) -> dict:
    """A container recipe with two eval sets, one beside the training data and one elsewhere."""
    evals = {"gsm8k_test": str(write_data(tmp / "evals" / "gsm8k_test.jsonl")),
             "same_dir": str(write_data(tmp / "data" / "more.jsonl"))}
    return make_recipe(tmp, mode="container", image=IMAGE, num_gpus=2, eval_data=evals, **over)


def docker_mounts(argv) -> set[str]:
    return {argv[i + 1].split(":")[0] for i, a in enumerate(argv) if a == "-v"}


def pyxis_mounts(sbatch: str) -> set[str]:
    (value,) = re.findall(r"--container-mounts=([^'\s]+)", sbatch)
    return {m.split(":")[0] for m in value.split(",")}


def test_every_container_target_mounts_the_same_paths(tmp_path):
    recipe, stack = parse_recipe(with_evals(tmp_path), "test")
    run = ResolvedRun(recipe, stack, (tmp_path / "run").resolve(), "test", {})
    want = {m.path for m in container_mounts(recipe, run.out)}
    assert str(tmp_path / "evals") in want and str(tmp_path / "data") in want  # eval sets' directories, each once

    container = local.ContainerTarget().plan(run)
    cluster = jobsubmit.ClusterTarget(jobsubmit.Cluster("http://10.0.0.1:8265", "http://10.0.0.1:8265")).plan(run)
    on_slurm = slurm.SlurmTarget(slurm.Options(nodes=1)).plan(run)
    assert docker_mounts(container.commands[0].argv) == want
    assert pyxis_mounts(on_slurm.rundir.files["slurm.sbatch"]) == want  # the Slurm container once missed the eval sets
    assert {m.path for m in container.mounts} == {m.path for m in on_slurm.mounts} == want
    # A running Ray cluster is submitted to from here: nothing is mounted or run in a container here.
    assert cluster.mounts == () and cluster.commands[0].argv[:3] == ("ray", "job", "submit")
    # Read-only and writable alike everywhere: data read-only, checkpoints and the run directory writable.
    ro = {m.path for m in container_mounts(recipe, run.out) if not m.writable}
    assert {a.split(":")[0] for a in container.commands[0].argv if a.endswith(":ro")} == ro
    assert {m.split(":")[0] for m in re.findall(r"--container-mounts=([^'\s]+)",
                                                on_slurm.rundir.files["slurm.sbatch"])[0].split(",")
            if m.endswith(":ro")} == ro
    # A host run mounts nothing: every path is read where it is.
    assert local.HostTarget().mounts(run) == ()


@pytest.mark.parametrize("mode", ["container", "host"])
def test_dry_run_prints_the_plan_the_launch_executes(gpu_host, monkeypatch, mode):
    """One request through `invoke run`'s function twice: the dry run's printed commands, and the
    launch's executed argv (a recording runner), come from equal plans."""
    over = {"mode": mode, "image": IMAGE} if mode == "container" else {"install_prefix": "/opt/sf"}
    recipe_data = make_recipe(gpu_host, num_gpus=1, **over)
    recipe_file = gpu_host / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump(recipe_data))
    recipe, stack = parse_recipe(recipe_data, "test")
    catalog = write_catalog(gpu_host / "flags.json", recipe, stack)
    monkeypatch.setattr(local.secrets, "token_hex",
                        lambda n: "abcdef")  # the container's name: fixed for the comparison
    # The image is nowhere: the preflight's docker check, which pulls it once for every check that
    # needs it, would refuse the launch (its one error); skipped here, where only the plan is compared.
    req = launcher.LaunchRequest(recipe=str(recipe_file), out=str(gpu_host / "run"), catalog=str(catalog),
                                 network_checks=False,
                                 skip_checks=("docker",) if mode == "container" else ())

    printed = io.StringIO()
    assert launcher.run_recipe(req, dry_run=True, stream=printed) == 0
    shown = printed.getvalue().splitlines()
    would_run = shown[shown.index("would run:") + 1:]

    executed = {}

    def apply(target, plan, runner, stream):
        executed["plan"] = plan
        recording = Runner(dry_run=True)
        code = target.apply(plan, recording, lambda s: None, stream)
        executed["argv"] = recording.history
        return code

    monkeypatch.setattr(launcher, "apply", apply)
    assert launcher.run_recipe(req, dry_run=False, stream=io.StringIO()) == 0
    plan = executed["plan"]
    if mode == "container":
        # The image's layout: a dry run probes only an image on this host; a launch pulls it first,
        # as `docker run` would. This one is nowhere: both say so, each in its own words.
        dry, launched = [[line for line in lines if line.startswith("layout: ")] for lines in (shown, describe(plan))]
        assert dry == [f"layout: the image's layout is not known ({IMAGE} is not on this host (a dry run pulls "
                       "nothing)): rendered for slimeforge's layout"]
        assert len(launched) == 1 and launched[0].startswith("layout: the image's layout is not known (docker pull "
                                                             f"{IMAGE}: ")
        shown = [line for line in shown if line not in dry]
    assert [line for line in describe(plan) if not line.startswith("layout: ")] == shown  # the same plan, line for line
    assert executed["argv"] == [list(c.argv) for c in plan.commands]  # and that is what ran
    # Each command as multi-line shell (one option per line), then the count of train.py's arguments, then the notes.
    commands = [line for line in would_run if not line.startswith(("note:", "  (train.py and "))]
    assert "\n".join(commands) == "\n".join(f"  {line}" for c in plan.commands for line in c.shell().splitlines())
    # The same words once the shell joins the ` \` continuations.
    assert [shlex.split(c.shell().replace("\\\n",
                                          "")) for c in plan.commands] == [shlex.split(c.text()) for c in plan.commands]
    assert shlex.split(plan.commands[-1].text())[-1].endswith("launch.sh")
    if mode == "container":
        assert executed["argv"][0][:2] == ["docker", "run"] and IMAGE in executed["argv"][0]


def test_a_run_directory_is_read_back_by_the_target_that_launched_it(tmp_path):
    """run.status / run.logs / run.stop ask the target recorded in plan.json (Slurm: once submitted)."""
    from slimeforge.run.rundir import write_run_dir

    recipe, stack = parse_recipe(with_evals(tmp_path), "test")
    address = "http://10.0.0.1:8265"
    cases = [(local.ContainerTarget(), local.ContainerTarget), (jobsubmit.ClusterTarget(jobsubmit.Cluster(address,
                                                                                                          address)),
                                                                jobsubmit.ClusterTarget),
             (slurm.SlurmTarget(slurm.Options(nodes=1)), slurm.SlurmTarget)]
    for i, (target, kind) in enumerate(cases):
        out = (tmp_path / f"run{i}").resolve()
        plan = target.plan(ResolvedRun(recipe, stack, out, "test", {}))
        write_run_dir(plan.rundir)
        if kind is slurm.SlurmTarget:
            (out / "slurm_job_id").write_text("42\n")
        if kind is jobsubmit.ClusterTarget:
            (out / "ray_address").write_text(address + "\n")
        found = launcher.target_of(out)
        assert type(found) is kind and found.name == plan.target
