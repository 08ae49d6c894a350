"""Preflight checks without Ray or AWS: GPUs from real nvidia-smi captures, the model script against
config.json, data rows, the flag catalog, ports, skips, and that a failing preflight starts nothing."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from launch_support import FIXTURES, fake_nvidia_smi, make_recipe, write_catalog

from slimeforge.image.stack import load_stack
from slimeforge.paths import SCRIPTS
from slimeforge.proc import Runner
from slimeforge.run import preflight as doctor
from slimeforge.run.launch import launch
from slimeforge.run.modelscript import eval_model_script, model_script
from slimeforge.run.preflight import host
from slimeforge.run.preflight import versions as pf_versions
from slimeforge.run.recipecheck import parse_recipe
from slimeforge.scripts.node_agent import QUERY_GPU

CU13 = load_stack("cu13")


def host_versions(run, python: str = "python3") -> tuple[str, str]:
    """(Ray version, Python version) of the interpreter `python` on the host `run` reaches, read by
    the one versions probe (scripts/env_probe.py, which cluster.up runs on every host too)."""
    facts = json.loads(run([python, "-c", (SCRIPTS / "env_probe.py").read_text()]).strip().splitlines()[-1])
    return facts["ray"] or "(none)", facts["python"]


def fixture_runner(capture: str, shm_kib: int = 134217728, ulimits: str = "unlimited\n20000\n"):
    """A command runner as an SSH transport would be: argv in, stdout out (real captures)."""
    answers = {
        "nvidia-smi": (FIXTURES / "gpu" / capture / "query-gpu.csv").read_text(),
        "df": f"Filesystem     1024-blocks  Used Available Capacity Mounted on\ntmpfs {shm_kib} 0 {shm_kib} 0% "
              "/dev/shm\n",
        "sh": ulimits,
        "python3": '{"python": "3.12.3", "ray": "2.60.0", "executable": "/usr/bin/python3"}\n',
    }
    calls = []

    def run(argv):
        calls.append(argv)
        if argv[0] == "python3" and "bind" in argv[2]:
            return ""  # every port free
        return answers[argv[0]]

    run.calls = calls
    return run


def levels(findings, name):
    return [f.level for f in findings if f.check == name]


def host_findings(run, stack, num_gpus, where, versions, ports=None):
    """The host checks' findings for one host, each fed by `run` (captured outputs)."""
    gpus = host.query_gpus(run)
    found = host.gpu_findings(gpus, num_gpus, where) + host.driver_findings(gpus, stack,
                                                                            where) + host.arch_findings(gpus, stack,
                                                                                                        where)
    found += host.shm_findings(run, where) + host.limits_findings(run, "host", where)
    if ports:
        found += host.port_findings(run, ports, "python3", where)
    return found + pf_versions.version_findings(host_versions(run), versions, where)


def test_host_checks_read_an_h200_x2_through_an_injected_runner():
    run = fixture_runner("h200-x2")
    found = host_findings(run, CU13, 2, "gpu-2", ("2.60.0", "3.12.8"), ports={"ray_port": 6379})
    # The captured host has 20000 open files (ulimit -n): a warning, not an error.
    assert [f.check for f in found if f.level != doctor.OK] == ["limits"], [str(f) for f in found]
    gpus = next(f for f in found if f.check == "gpus")
    assert gpus.message == "2 x NVIDIA H200 on gpu-2 (need 2)"
    assert run.calls[0] == QUERY_GPU


def test_host_checks_report_count_driver_arch_and_versions_together():
    old = CU13.model_copy(update={"driver_min": 590, "arch_list": ["10.0"]})
    found = host_findings(fixture_runner("h100-x1", shm_kib=65536, ulimits="64\n1024\n"), old, 8, "h1", ("2.59.0",
                                                                                                         "3.11.2"))
    errors = {f.check: f for f in found if f.level == doctor.ERROR}
    assert set(errors) == {"gpus", "driver", "gpu-arch", "shm", "versions"}
    assert "1 GPU(s) on h1, the recipe needs 8" in errors["gpus"].message
    assert "580.159.04" in errors["driver"].message and "R590" in errors["driver"].message
    assert "compute capability 9.0" in errors["gpu-arch"].message and "'9.0'" in errors["gpu-arch"].fix
    assert levels(found, "limits") == [doctor.WARNING, doctor.WARNING]
    assert all(f.fix for f in found if f.level == doctor.ERROR)


def test_fake_nvidia_smi_on_path_feeds_the_registered_checks(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path / 'bin', 'h200-x2')}:{Path('/usr/bin')}:{Path('/bin')}")
    report = doctor.run_checks(only=["gpus", "driver", "gpu-arch"])
    assert [f.level for f in report.findings] == [doctor.OK] * 3
    assert "2 x NVIDIA H200" in report.findings[0].message


def test_no_nvidia_smi_is_an_error_with_a_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    report = doctor.run_checks(only=["gpus", "driver"])
    assert report.errors[0].check == "gpus" and "nvidia-smi not found" in report.errors[0].message
    assert "install the NVIDIA driver" in report.errors[0].fix


@pytest.fixture
def recipe_3b(tmp_path):
    return parse_recipe(make_recipe(tmp_path), "test")


def test_qwen25_32b_norm_epsilon_trap_is_caught(tmp_path):
    recipe, stack = parse_recipe(make_recipe(tmp_path, model="Qwen2.5-32B-Instruct", model_type="qwen2.5-32B"), "test")
    report = doctor.run_checks(recipe, stack, only=["model-config"])
    assert len(report.errors) == 1, report.table()
    err = report.errors[0]
    assert "--norm-epsilon 1e-5" in err.message and "rms_norm_eps: 1e-06" in err.message
    assert '["--norm-epsilon", "1e-06"]' in err.fix
    # The fix works: extra_flags come after MODEL_ARGS, and the last value wins.
    fixed, _ = parse_recipe(make_recipe(tmp_path, model="Qwen2.5-32B-Instruct", model_type="qwen2.5-32B",
                                        extra_flags=["--norm-epsilon", "1e-06"]), "test")
    assert doctor.run_checks(fixed, stack, only=["model-config"]).errors == []


def test_model_script_against_the_wrong_checkpoint_lists_every_difference(tmp_path):
    recipe, stack = parse_recipe(make_recipe(tmp_path, model="Qwen2.5-32B-Instruct", model_type="qwen2.5-3B"), "test")
    errors = doctor.run_checks(recipe, stack, only=["model-config"]).errors
    flags = {e.message.split(":")[0] for e in errors}
    assert flags == {"--hidden-size", "--num-layers", "--num-attention-heads", "--ffn-hidden-size", "--vocab-size",
                     "--num-query-groups", "embeddings"}


def test_model_script_is_real_bash(tmp_path, monkeypatch, recipe_3b):
    recipe, stack = recipe_3b
    monkeypatch.setenv("MODEL_ARGS_ROTARY_BASE", "10000")  # the fixture script appends a second --rotary-base
    margs = eval_model_script(model_script(recipe), recipe.slime_dir, Runner())
    assert margs[-2:] == ["--rotary-base", "10000"]
    errors = doctor.run_checks(recipe, stack, only=["model-config"]).errors
    assert [e.message.split(":")[0] for e in errors] == ["--rotary-base"]


def test_bad_data_rows_are_reported_with_line_numbers(tmp_path, recipe_3b):
    recipe, stack = recipe_3b
    Path(recipe.data_path).write_text('{"prompt": "a", "metadata": {}}\n\nnot json\n{"question": "b"}\n[1]\n')
    err = doctor.run_checks(recipe, stack, only=["data"]).errors[0]
    assert "line 3: not JSON" in err.message
    assert "line 4: no 'prompt' and no 'metadata' key (keys: question)" in err.message
    assert "line 5: a list" in err.message


def test_flags_outside_the_catalog_are_errors_and_values_are_not_flags(tmp_path):
    recipe, stack = parse_recipe(make_recipe(tmp_path, extra_flags=["--rollout-seed", "-1", "--use-dynamic-batchsize",
                                                                    "--sglang-json", '{"--x": 1}',
                                                                    "--normlization=RMSNorm"]), "test")
    catalog = write_catalog(tmp_path / "flags.json", recipe, stack, drop=("--swiglu",))
    doc = json.loads(catalog.read_text())
    doc["flags"] += ["--rollout-seed", "--sglang-json"]
    catalog.write_text(json.dumps(doc))
    errors = doctor.run_checks(recipe, stack, only=["flags"], catalog=str(catalog)).errors
    named = sorted(e.message.split(" ")[0] for e in errors)
    assert named == ["--normlization", "--swiglu", "--use-dynamic-batchsize"]
    by = {e.message.split(" ")[0]: e for e in errors}
    assert "(from the model script)" in by["--swiglu"].message
    assert "did you mean --normalization?" in by["--normlization"].fix


def test_no_catalog_is_an_error_that_says_how_to_get_one(recipe_3b):
    recipe, stack = recipe_3b
    err = doctor.run_checks(recipe, stack, only=["flags"]).errors[0]
    assert "build or install first" in err.fix and "--skip-check flags" in err.fix
    report = doctor.run_checks(recipe, stack, only=["flags"], skip=["flags"])
    assert report.errors == [] and report.warnings[0].message.startswith("(skipped)")


def test_unknown_skip_name_is_refused():
    with pytest.raises(Exception, match="is not a check"):
        doctor.run_checks(skip=["gpu"])


def test_busy_port_is_an_error(tmp_path, recipe_3b):
    recipe, stack = recipe_3b
    with socket.socket() as s:
        s.bind(("0.0.0.0", recipe.gateway_port))
        s.listen()
        errors = doctor.run_checks(recipe, stack, only=["ports"]).errors
    assert len(errors) == 1 and f"gateway_port {recipe.gateway_port}" in errors[0].message


def test_checkpoint_dir_not_writable(tmp_path):
    blocker = tmp_path / "a-file"  # works as root too, unlike a read-only directory
    blocker.write_text("")
    recipe, stack = parse_recipe(make_recipe(tmp_path, checkpoint_dir=str(blocker / "ckpt")), "test")
    errors = doctor.run_checks(recipe, stack, only=["checkpoint"]).errors
    assert "cannot be written" in errors[0].message and str(blocker) in errors[0].message


def test_existing_checkpoint_is_resumed(tmp_path, recipe_3b):
    recipe, stack = recipe_3b
    Path(recipe.checkpoint_dir).mkdir()
    (Path(recipe.checkpoint_dir) / "latest_checkpointed_iteration.txt").write_text("20\n")
    found = doctor.run_checks(recipe, stack, only=["checkpoint"]).findings
    assert "resumes from iteration 20" in found[0].message


def test_failing_preflight_lists_everything_and_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path / 'bin', 'h100-x1')}:/usr/bin:/bin")
    monkeypatch.setenv("SLIMEFORGE_STATE_DIR", str(tmp_path / "state"))
    recipe, stack = parse_recipe(make_recipe(tmp_path, model="Qwen2.5-32B-Instruct", model_type="qwen2.5-32B",
                                             num_gpus=2,
                                             extra_flags=["--use-dynamic-batchsize"]), "test")
    Path(recipe.data_path).write_text('{"prompt": "x"}\n')
    catalog = write_catalog(tmp_path / "flags.json", recipe, stack, drop=("--use-dynamic-batchsize",))
    runner = Runner(dry_run=True)
    out = tmp_path / "run"
    with pytest.raises(doctor.PreflightError) as info:
        launch(recipe, stack, out=out, catalog=str(catalog), runner=runner, network_checks=False,
               stream=open("/dev/null", "w"))
    failed = sorted({f.check for f in info.value.report.errors})
    assert failed == ["data", "flags", "gpus", "model-config"], info.value.report.table()
    text = str(info.value)
    assert "fix:" in text and "--norm-epsilon" in text and "line 1" in text
    assert runner.history == [] and not out.exists() and not (tmp_path / "state").exists()


def test_env_values_that_ray_would_expand_are_refused(tmp_path):
    recipe, stack = parse_recipe(make_recipe(tmp_path, env={"A": "$HOME/x", "B": "${USER}", "C": "$(id) `id` $ 5 $5"}),
                                 "test")
    errors = doctor.run_checks(recipe, stack, only=["runtime-env"]).errors
    assert [e.message.split(" ")[0] for e in errors] == ["env.A", "env.B"]
    assert "'$HOME'" in errors[0].message and "no escape" in errors[0].message


def test_cluster_up_runs_the_same_host_checks_on_every_host():
    """The doctor -> cluster seam: cluster.up's default host checks are preflight's /dev/shm and
    ulimit findings, read through the host's ssh transport (here a stand-in answering with the
    outputs a host printed); an error fails the host with its fix, a warning does not."""
    from types import SimpleNamespace

    from slimeforge.cluster.bringup import default_host_checks
    from slimeforge.cluster.inventory import load_inventory

    class Remote:
        def __init__(self, run):
            self.answer = run

        def run(self, argv, step="", timeout=None):
            return SimpleNamespace(stdout=self.answer(argv))

    host = load_inventory(Path(__file__).resolve().parents[2] / "recipes" / "clusters" / "example.yaml").hosts[0]
    assert default_host_checks(host, Remote(fixture_runner("h200-x2",
                                                           ulimits="64\n1024\n"))) == []  # low limits: warnings only
    problems = default_host_checks(host, Remote(fixture_runner("h200-x2", shm_kib=512 * 1024)))
    assert [p.where for p in problems] == ["shm"]
    assert "/dev/shm is 0.50 GiB" in str(problems[0]) and "remount" in str(problems[0])
