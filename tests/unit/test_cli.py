"""The command line as a user runs it: `invoke ...` from the repository root."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def invoke(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_list_shows_every_task_with_help():
    out = invoke("--list")
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("  ") and line.strip()]
    names = [line.split()[0] for line in lines if not line.startswith("   ")]
    assert {"run.start", "stack.show"} <= set(names)
    for line in lines:
        if not line.startswith("   "):
            assert len(line.split()) > 1 or "(" in line, f"task without help: {line!r}"


def test_dry_run_writes_the_five_files(tmp_path):
    out = invoke("run", "recipes/gsm8k.yaml", "--dry-run", "--out", str(tmp_path / "run"))
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == sorted(
        ["slime.args", "agentcore.yaml", "runtime_env.json", "launch.sh", "plan.json", ".slimeforge.lock"])
    assert "bash " in out.stdout and "launch.sh" in out.stdout


def test_set_override_reaches_the_files(tmp_path):
    out = invoke("run", "recipes/gsm8k.yaml", "--dry-run", "--out", str(tmp_path / "run"), "--set", "num_rollout=3",
                 "--set", "lr=2e-6")
    assert out.returncode == 0, out.stderr
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["recipe"]["num_rollout"] == 3 and plan["recipe"]["lr"] == 2e-6


def test_refused_recipe_leaves_no_run_directory(tmp_path):
    bad = tmp_path / "bad.yaml"
    text = re.sub(r"(?m)^tp_size: .*$", "tp_size: 3", (ROOT / "recipes" / "gsm8k.yaml").read_text())
    bad.write_text(text + "rollout_batchsize: 4\n")
    out = invoke("run", str(bad), "--dry-run", "--out", str(tmp_path / "run"))
    assert out.returncode == 2
    assert "tp_size" in out.stderr and "did you mean 'rollout_batch_size'" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run")]


def test_stack_show_prints_pins():
    out = invoke("stack.show", "--cuda", "cu129")
    assert out.returncode == 0, out.stderr
    assert ("a74ae3a0ad16bd8b769d5386738e8ae3d1269d7e" in out.stdout and "transformer_engine[pytorch]==2.16.1"
            in out.stdout)


def test_wheels_tasks_refuse_a_bad_registry_and_list_keys(tmp_path):
    env_store = {"SLIMEFORGE_COMPILED_STORE": str(tmp_path / "store")}
    for task in ("wheels.push", "wheels.pull"):
        out = subprocess.run([sys.executable, "-m", "invoke", task, "--cuda", "cu13", "--registry", "myhost/team"],
                             cwd=ROOT,
                             capture_output=True, text=True, timeout=120, env={**os.environ, **env_store})
        assert out.returncode == 2 and ("--registry: is not a registry host[:port][/path] (got "
                                       "'myhost/team')") in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "invoke", "wheels.ls", "--cuda", "cu13", "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env={**os.environ, **env_store})
    assert out.returncode == 0, out.stderr
    rows = {r["step"]: r for r in json.loads(out.stdout)["keys"]}
    assert rows["apex"]["status"] == "miss" and rows["flash-attn"]["status"] == "not stored"
    assert not (tmp_path / "store").exists()  # listing writes nothing
