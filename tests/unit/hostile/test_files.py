"""What happens around the files: --out refused unless it is ours, one writer at a time, a failed
re-render changes nothing, files read back (plan.json, config.json) checked; and the command-line
options a dry run used to ignore."""

from __future__ import annotations

import hashlib
import inspect
import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SEED_RECIPE
from launch_support import make_recipe

from slimeforge import atomic
from slimeforge.api import SlimeRunner
from slimeforge.errors import ConfigError
from slimeforge.run import preflight as doctor
from slimeforge.run.recipe import RUNNER_FIELDS, Recipe
from slimeforge.run.recipecheck import parse_recipe
from slimeforge.run.rundir import RUN_FILES, build_run_dir, write_run_dir
from slimeforge.run.targets.jobs import recorded

ROOT = Path(__file__).resolve().parents[3]


def invoke(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def render(out: Path, **changes):
    recipe, stack = parse_recipe({**SEED_RECIPE, **changes}, "test")
    run = build_run_dir(recipe, stack, out, environ={})
    write_run_dir(run)
    return run


def files_of(path: Path) -> dict[str, bytes]:
    return {n: (path / n).read_bytes() for n in RUN_FILES}


# --- --out -----------------------------------------------------------------------------------------


def test_out_on_a_foreign_directory_is_refused_and_untouched(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="is not a slimeforge run directory"):
        render(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_out_dot_is_refused_on_the_command_line(tmp_path):
    (tmp_path / "README").write_text("x")
    out = invoke("--search-root", str(ROOT), "run", str(ROOT / "recipes" / "gsm8k.yaml"), "--dry-run", "--out", ".",
                 cwd=tmp_path)
    assert out.returncode == 2 and "is not a slimeforge run directory" in out.stderr and "Traceback" not in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README"]


@pytest.mark.parametrize("shape", ["file", "under-a-file"])
def test_out_that_is_a_file_or_under_one_is_a_clear_error(tmp_path, shape):
    (tmp_path / "f").write_text("x")
    out = tmp_path / "f" if shape == "file" else tmp_path / "f" / "run"
    with pytest.raises(ConfigError, match="is a file"):
        render(out)
    assert (tmp_path / "f").read_text() == "x"


def test_rendering_b_over_as_run_directory_is_refused_and_keeps_as_record(tmp_path):
    run = render(tmp_path / "run")
    (run.path / "submission_id").write_text("gsm8k-3b-smoke-20261123-000000-abcdef\n")
    before = files_of(run.path)
    with pytest.raises(ConfigError, match="is the run directory of experiment 'gsm8k-3b-smoke'"):
        render(tmp_path / "run", exp_id="other-exp")
    assert files_of(run.path) == before and recorded(run.path).submission_id.startswith("gsm8k-3b-smoke-")


def test_rerendering_the_same_experiment_is_allowed(tmp_path):
    render(tmp_path / "run")
    run = render(tmp_path / "run", num_rollout=3)
    assert json.loads((run.path / "plan.json").read_text())["recipe"]["num_rollout"] == 3


def test_a_failed_rerender_leaves_the_old_complete_set(tmp_path, monkeypatch):
    run = render(tmp_path / "run")
    before = files_of(run.path)
    real, calls = atomic._write, []

    def fail_on_the_third(path, content, mode):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real(path, content, mode)

    monkeypatch.setattr(atomic, "_write", fail_on_the_third)
    with pytest.raises(ConfigError, match="No space left on device"):
        render(tmp_path / "run", num_rollout=5)
    assert files_of(run.path) == before
    assert sorted(p.name for p in run.path.iterdir()) == sorted([*RUN_FILES, atomic.LOCK_NAME])  # no temporary left


def _render_in_process(out: str, rollouts: int) -> None:
    render(Path(out), num_rollout=rollouts)


def test_concurrent_renders_serialize_and_agree_with_plan_json(tmp_path):
    out = tmp_path / "run"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_render_in_process, args=(str(out), n)) for n in range(1, 7)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 6
    plan = json.loads((out / "plan.json").read_text())
    for name, digest in plan["files"].items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest, name


def test_lock_is_held_by_one_writer(tmp_path):
    with atomic.dir_lock(tmp_path):
        with pytest.raises(ConfigError, match="another slimeforge process"):
            with atomic.dir_lock(tmp_path, timeout=0):  # a second open file description: flock is per description
                pass


# --- files read back ---------------------------------------------------------------------------------


@pytest.mark.parametrize("content", ["[1, 2]", "{not json", '{"exp_id": "x"}',
                                     '{"slimeforge_version": "1", "exp_id": "x", "recipe": {"ray_port": 1e9}}',
                                     "\udcff", "[" * 100000])
def test_run_status_on_a_malformed_or_foreign_plan_is_refused(tmp_path, content):
    (tmp_path / "plan.json").write_text(content, errors="surrogateescape")
    out = invoke("run.status", str(tmp_path))
    assert out.returncode == 2 and "plan.json" in out.stderr and "Traceback" not in out.stderr


def test_config_json_that_is_a_list_is_an_error_not_a_traceback(tmp_path):
    recipe, stack = parse_recipe(make_recipe(tmp_path), "test")
    (Path(recipe.model_dir) / "config.json").write_text("[1, 2, 3]")
    errors = doctor.run_checks(recipe, stack, only=["model-config"]).errors
    assert any("holds a JSON list, not an object" in e.message for e in errors)


# --- the command line --------------------------------------------------------------------------------


def test_dry_run_honours_mode_prefix_and_image(tmp_path):
    out = invoke("run", "recipes/gsm8k.yaml", "--dry-run", "--out", str(tmp_path / "h"), "--mode", "host", "--prefix",
                 "/opt/sf")
    assert out.returncode == 0, out.stderr
    rec = json.loads((tmp_path / "h" / "plan.json").read_text())["recipe"]
    assert (rec["mode"], rec["install_prefix"], rec["slime_dir"]) == ("host", "/opt/sf", "/opt/sf/slime")
    image = "reg.example.com/slimeforge/cu13@sha256:" + "c" * 64
    out = invoke("run", "recipes/gsm8k.yaml", "--dry-run", "--out", str(tmp_path / "c"), "--image", image)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "c" / "plan.json").read_text())["recipe"]["image"] == image


@pytest.mark.parametrize(("option", "value", "named"), [("--mode", "bogus", "--mode"), ("--image", "-evil", "--image"),
                                                        ("--prefix", "relative/dir", "--prefix")])
def test_dry_run_refuses_bad_options(tmp_path, option, value, named):
    out = invoke("run", "recipes/gsm8k.yaml", "--dry-run", "--out", str(tmp_path / "run"), option, value)
    assert out.returncode == 2 and named in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()


def test_set_problem_blames_the_command_line(tmp_path):
    out = invoke("run", "recipes/gsm8k.yaml", "--dry-run", "--out", str(tmp_path / "run"), "--set", "save=no")
    assert out.returncode == 2 and out.stderr.startswith("error: command line:") and "--set save" in out.stderr


def test_build_with_a_missing_ca_bundle_writes_nothing(tmp_path):
    out = invoke("build", "--stack", "tests/stacks/test.yaml", "--dry-run", "--out", str(tmp_path / "b"),
                 "--ca-bundle", "/nonexistent")
    assert out.returncode == 2 and "--ca-bundle" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "b").exists()


# --- SlimeRunner -------------------------------------------------------------------------------------


def test_slimerunner_signature_shows_every_field_with_its_default():
    sig = inspect.signature(SlimeRunner)
    params = sig.parameters
    assert list(params) == [n for n in Recipe.model_fields if Recipe.model_fields[n].is_required()] + \
        [n for n in Recipe.model_fields if not Recipe.model_fields[n].is_required()]
    for name, default in RUNNER_FIELDS.items():
        p = params[name]
        assert p.kind is inspect.Parameter.KEYWORD_ONLY
        assert p.default is inspect.Parameter.empty if default is ... else p.default == default, name
    assert params["num_rollout"].default == 1 and params["extra_flags"].default == []
    assert "num_gpus: int = 8" in str(sig)


def test_to_yaml_on_a_directory_is_a_clear_error(tmp_path):
    runner = SlimeRunner(**SEED_RECIPE)
    with pytest.raises(ConfigError, match="is a directory"):
        runner.to_yaml(tmp_path)
    path = runner.to_yaml(tmp_path / "r.yaml")
    assert SlimeRunner.from_yaml(path).recipe == runner.recipe


# --- secrets reach the job by name -------------------------------------------------------------------


def test_secret_env_passes_names_never_values(tmp_path):
    from slimeforge.run.targets.base import ResolvedRun
    from slimeforge.run.targets.local import ContainerTarget

    recipe, stack = parse_recipe({**SEED_RECIPE, "image": "reg.example.com/x@sha256:" + "a" * 64,
                                  "secret_env": ["OPENAI_API_KEY"]}, "t")
    run = build_run_dir(recipe, stack, tmp_path / "run", environ={"OPENAI_API_KEY": "sk-live-value"})
    write_run_dir(run)
    resolved = ResolvedRun(recipe, stack, run.path, "t", {"OPENAI_API_KEY": "sk-live-value"})
    argv = ContainerTarget().docker_argv(resolved, name="n", cidfile=tmp_path / "cid")
    assert argv[argv.index("OPENAI_API_KEY") - 1] == "-e" and "sk-live-value" not in " ".join(argv)
    assert not any(b"sk-live-value" in (run.path / n).read_bytes() for n in RUN_FILES)
    assert json.loads((run.path / "plan.json").read_text())["recipe"]["secret_env"] == ["OPENAI_API_KEY"]


def test_secret_env_names_are_checked():
    with pytest.raises(ConfigError, match="secret_env.0"):
        parse_recipe({**SEED_RECIPE, "secret_env": ["NOT-A-NAME"]}, "t")


@pytest.mark.parametrize("task", ["build", "install"])
def test_build_and_install_out_that_is_a_file_is_a_clear_error(tmp_path, task):
    (tmp_path / "f").write_text("x")
    extra = ["--prefix", str(tmp_path / "prefix")] if task == "install" else []
    out = invoke(task, "--stack", "tests/stacks/test.yaml", "--dry-run", "--out", str(tmp_path / "f" / "sub"), *extra)
    assert out.returncode == 2 and "--out: cannot be created" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "prefix").exists()


@pytest.mark.parametrize("task", ["build", "install"])
def test_out_of_someones_files_is_refused_with_exit_2_and_left_as_it_was(tmp_path, task):
    """Issue 33: `build --dry-run --out DIR` replaced DIR's Dockerfile and deleted its context/lock/."""
    mine = tmp_path / "mine"
    (mine / "context" / "lock").mkdir(parents=True)
    for name, text in (("Dockerfile", "FROM my-own\n"), ("install.sh", "echo mine\n"), ("context/lock/notes.txt",
                                                                                        "mine\n")):
        (mine / name).write_text(text)
    before = {str(p.relative_to(mine)): p.read_bytes() for p in mine.rglob("*") if p.is_file()}
    extra = ["--prefix", str(tmp_path / "prefix")] if task == "install" else []
    out = invoke(task, "--stack", "tests/stacks/test.yaml", "--dry-run", "--out", str(mine), *extra)
    assert out.returncode == 2 and ("--out: is a directory slimeforge did not "
                                   "write") in out.stderr and "Traceback" not in out.stderr
    assert {str(p.relative_to(mine)): p.read_bytes() for p in mine.rglob("*") if p.is_file()} == before
    # An empty directory is taken and marked; the next run into it is accepted (it is ours now).
    empty = tmp_path / "empty"
    empty.mkdir()
    for _ in range(2):
        out = invoke(task, "--stack", "tests/stacks/test.yaml", "--dry-run", "--out", str(empty), *extra)
        assert out.returncode == 0, out.stderr
    assert (empty / atomic.OUTPUT_MARKER).is_file()


def test_doctor_finds_the_catalog_of_a_local_build_of_this_stack(tmp_path):
    """`build` names its directory by the build hash; doctor finds it by the stack id in its report
    (it once looked for build/<flavor>-<stack hash> and never found one)."""
    from launch_support import write_catalog

    from slimeforge import paths

    recipe, stack = parse_recipe(make_recipe(tmp_path, mode="host"), "test")
    build = paths.build_dir(tmp_path / "build", stack.name, "f" * 64)  # a build hash, not the stack's
    build.mkdir(parents=True)
    write_catalog(build / "flags.json", recipe, stack)
    (build / paths.BUILD_REPORT).write_text(json.dumps({"stack": stack.id}))
    other = paths.build_dir(tmp_path / "build", stack.name, "e" * 64)  # a build of another stack of this flavor
    other.mkdir()
    (other / paths.BUILD_REPORT).write_text(json.dumps({"stack": f"{stack.name}-000000000000"}))
    found = doctor.run_checks(recipe, stack, only=["flags"], build_root=tmp_path / "build")
    assert found.errors == [] and "flags are in the catalog" in found.table()
    (build / paths.BUILD_REPORT).unlink()  # an incomplete build is no catalog; the other stack's is not this one's
    assert "no flag catalog found" in doctor.run_checks(recipe, stack, only=["flags"],
                                                        build_root=tmp_path / "build").errors[0].message
