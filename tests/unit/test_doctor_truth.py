"""doctor tells the truth: a failing tool's own message, verbatim, and a fix only where its words name
the cause; a dry run warns (without refusing) about paths this machine lacks and about wandb
without its key. Docker's side is in tests/integration/test_doctor_engine.py (the real engine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from launch_support import make_recipe as launch_recipe

from slimeforge.run import preflight as doctor
from slimeforge.run.localpaths import dry_run_warnings, paths_missing_here
from slimeforge.run.preflight.toolfix import KNOWN, known_fix, tool_message
from slimeforge.run.recipecheck import parse_recipe
from slimeforge.run.rundir import wandb_off_warning

ROOT = Path(__file__).resolve().parents[2]

# What nvidia-smi prints when the loaded driver and its libraries differ (after a driver upgrade
# without a reboot), and when no driver is loaded: its own words, as a host prints them.
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.95\n"
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
             "NVIDIA driver is installed and running.\n\n")


def failing_nvidia_smi(bin_dir: Path, says: str, code: int) -> Path:
    """An nvidia-smi that fails as the real one does in that state: its words on stdout, its status."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "says.txt").write_text(says)
    script = bin_dir / "nvidia-smi"
    script.write_text(f"#!/bin/sh\ncat '{bin_dir / 'says.txt'}'\nexit {code}\n")
    script.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize(("says", "code", "fix"), [
    (MISMATCH, 18, "reboot, or reload the driver"),
    (NO_DRIVER, 9, "the NVIDIA driver is not loaded"),
    ("Unable to determine the device handle for GPU0000:41:00.0: Unknown Error\n", 15,
     "what nvidia-smi said above is the cause"),
])
def test_gpus_shows_nvidia_smis_own_words_and_a_fix_only_from_them(tmp_path, monkeypatch, says, code, fix):
    monkeypatch.setenv("PATH", f"{failing_nvidia_smi(tmp_path / 'bin', says, code)}:/usr/bin:/bin")
    (finding,) = doctor.run_checks(only=["gpus"]).errors
    assert f"exited with {code}:" in finding.message
    for line in says.strip().splitlines():
        if line.strip():
            assert line in finding.message.splitlines()  # verbatim, each line whole
    assert fix in finding.fix
    if "Unknown Error" in says:  # nothing matched: no cause is named
        assert "reboot" not in finding.fix and "driver" not in finding.fix.replace("nvidia-smi", "")


def test_the_table_shows_every_line_of_the_tools_message(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{failing_nvidia_smi(tmp_path / 'bin', MISMATCH, 18)}:/usr/bin:/bin")
    table = doctor.run_checks(only=["gpus"]).table()
    assert "Failed to initialize NVML: Driver/library version mismatch" in table
    assert "NVML library version: 580.95" in table


def test_a_fix_is_named_only_for_what_was_matched():
    from slimeforge.errors import CommandError

    said = ('Unable to find image \'registry.invalid/x:1\' locally\ndocker: Error response from daemon: Get '
            '"https://registry.invalid/v2/": dial tcp: lookup registry.invalid on 10.0.0.53:53: no such host.\n'
            "Run 'docker run --help' for more information\n")
    exc = CommandError("docker run", ["docker", "run", "registry.invalid/x:1"], 125, said)
    message = tool_message(exc)
    assert message.splitlines()[0] == "`docker run registry.invalid/x:1` exited with 125:"
    assert message.splitlines()[1:] == [line for line in said.splitlines() if line]
    assert "does not resolve" in known_fix(exc, "FALLBACK")
    quiet = CommandError("docker run", ["docker", "run", "x"], 125, "docker: something nobody has seen before\n")
    assert known_fix(quiet, "FALLBACK") == "FALLBACK"
    assert tool_message(CommandError("x", ["x"], 3, "")) == "`x` exited with 3 and printed nothing"


def test_every_known_pattern_names_a_fix():
    assert len(KNOWN) >= 10
    for pattern, fix in KNOWN:
        assert pattern.pattern and len(fix) > 20, pattern.pattern


def test_a_tools_flood_is_cut_to_its_end_and_its_control_characters_dropped():
    from slimeforge.errors import CommandError

    flood = "".join(f"line {i}\n" for i in range(100)) + "last \x1b[31mred\x1b[0m words\n"
    message = tool_message(CommandError("x", ["x"], 1, flood))
    assert "line 99" in message and "line 80" not in message
    assert "\x1b" not in message and "last" in message.splitlines()[-1]


# --- the dry run's warnings -----------------------------------------------------------------------


def parsed(data: dict):
    recipe, _stack = parse_recipe(data, "test")
    return recipe


def make_recipe(tmp: Path, **over) -> dict:
    """The launch tests' recipe (host mode, in place), its Megatron-LM checkout present too."""
    (tmp / "Megatron-LM").mkdir(parents=True, exist_ok=True)
    return launch_recipe(tmp, **over)


def test_paths_missing_here_are_named_by_key(tmp_path):
    data = make_recipe(tmp_path)
    rec = parsed({**data, "model_dir": str(tmp_path / "nowhere"), "eval_data": {"gsm8k": str(tmp_path / "no.jsonl")}})
    warned = paths_missing_here(rec)
    assert [w.split(" ", 1)[0] for w in warned] == ["model_dir", "eval_data.gsm8k"]
    assert all("fine if the run goes to other hosts" in w for w in warned)
    assert paths_missing_here(parsed(data)) == []  # all present: nothing to say


def test_host_mode_names_the_install_prefix_or_the_checkouts(tmp_path):
    data = make_recipe(tmp_path)
    rec = parsed({**data, "mode": "host", "install_prefix": str(tmp_path / "no-prefix")})
    assert [w.split(" ", 1)[0] for w in paths_missing_here(rec)] == ["install_prefix"]
    rec = parsed({**data, "mode": "host", "megatron_dir": str(tmp_path / "no-megatron")})
    assert [w.split(" ", 1)[0] for w in paths_missing_here(rec)] == ["megatron_dir"]


def test_wandb_without_its_key_is_one_warning(tmp_path):
    data = make_recipe(tmp_path)
    rec = parsed({**data, "wandb_project": "gsm8k"})
    said = wandb_off_warning(rec, {})
    assert said is not None and "'gsm8k'" in said and "WANDB_API_KEY" in said
    assert wandb_off_warning(rec, {"WANDB_API_KEY": "k"}) is None
    assert wandb_off_warning(parsed(data), {}) is None  # no project: nothing asked for
    assert dry_run_warnings(rec, {}) == [said]
    # The preflight says it too, once, as a warning (a real launch prints the preflight's table).
    report = doctor.run_checks(rec, only=["wandb"], environ={})
    assert [(f.level, f.message) for f in report.findings] == [(doctor.WARNING, said)]
    assert doctor.run_checks(rec, only=["wandb"], environ={"WANDB_API_KEY": "k"}).findings[0].level == doctor.OK


def test_a_dry_run_warns_about_missing_paths_and_wandb_and_refuses_nothing(tmp_path):
    recipe = tmp_path / "r.yaml"
    data = make_recipe(tmp_path)
    data.update(model_dir=str(tmp_path / "models" / "absent"), wandb_project="gsm8k")
    recipe.write_text(json.dumps(data))
    env = {k: v for k, v in __import__("os").environ.items() if k != "WANDB_API_KEY"}
    out = subprocess.run([sys.executable, "-m", "invoke", "run", str(recipe), "--dry-run", "--out",
                          str(tmp_path / "run")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "run" / "plan.json").is_file()  # rendered: the run may go to hosts that have the path
    warnings = [line for line in out.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2
    assert warnings[0].startswith(f"warning: model_dir {tmp_path / 'models' / 'absent'}: no such directory on this "
                                  "machine")
    assert "wandb_project is 'gsm8k' but WANDB_API_KEY is not set" in warnings[1]
    assert "valid as a recipe, 2 warning(s)" in out.stdout.splitlines()[0]
