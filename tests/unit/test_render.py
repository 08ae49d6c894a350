"""The run directory: flags, AgentCore config, runtime env, launch.sh, plan.json."""

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import SEED_RECIPE, absent
from launch_support import read_args

from slimeforge import SlimeRunner
from slimeforge.atomic import LOCK_NAME
from slimeforge.run.recipecheck import load_recipe, parse_recipe
from slimeforge.run.rundir import RUN_FILES, build_run_dir, write_run_dir
from slimeforge.run.slime_facts import load_facts

ROOT = Path(__file__).resolve().parents[2]
SEED = SEED_RECIPE


def pairs(args):
    """flag -> value (None for switches) for flags that take at most one value."""
    out, i = {}, 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[args[i]] = args[i + 1]
            i += 2
        else:
            out[args[i]] = None
            i += 1
    return out


@pytest.fixture
def gsm8k(tmp_path):
    recipe, stack = load_recipe(ROOT / "recipes" / "gsm8k.yaml")
    run = build_run_dir(recipe, stack, tmp_path / "run", "recipes/gsm8k.yaml", environ={})
    write_run_dir(run)
    return run


def test_gsm8k_flags(gsm8k):
    f = pairs(gsm8k.args)
    integration = "agentcore_rl_toolkit.backends.slime.integration"
    expected = {
        "--hf-checkpoint": "/root/models/Qwen2.5-3B-Instruct",
        "--ref-load": "/root/models/Qwen2.5-3B-Instruct",
        "--prompt-data": "/root/data/gsm8k_tiny.jsonl",
        "--input-key": "prompt",
        "--num-rollout": "1",
        "--actor-num-nodes": "1",
        "--actor-num-gpus-per-node": "8",
        "--colocate": None,
        "--tensor-model-parallel-size": "2",
        "--rollout-num-gpus-per-engine": "2",
        "--rollout-batch-size": "32",
        "--n-samples-per-prompt": "8",
        "--global-batch-size": "256",
        "--rollout-max-response-len": "1024",
        "--rollout-temperature": "1.0",
        "--lr": "1e-06",
        "--eps-clip": "0.2",
        "--eps-clip-high": "0.28",
        "--weight-decay": "0.1",
        "--adam-beta2": "0.98",
        "--sglang-mem-fraction-static": "0.7",
        "--max-tokens-per-gpu": "9216",
        "--custom-generate-function-path": f"{integration}.rollout.generate",
        "--custom-reward-post-process-path": f"{integration}.rewards.normalize_episode_rewards",
        "--custom-config-path": str(gsm8k.path / "agentcore.yaml"),
        "--save": "/root/checkpoints/gsm8k-3b-smoke",
        "--save-interval": "20",
        "--load": "/root/checkpoints/gsm8k-3b-smoke",
    }
    for flag, value in expected.items():
        assert f[flag] == value, flag
    assert "--use-wandb" not in f  # no WANDB_API_KEY in this environment
    assert json.loads(f["--train-env-vars"]) == gsm8k.env


def test_attention_backend_follows_the_flavor(tmp_path):
    """cu13 ships no FA2 (sglang's FA4 only): TE must choose its backend; cu129 has FA2."""
    for flavor, backend in (("cu13", "auto"), ("cu129", "flash")):
        recipe, stack = load_recipe(ROOT / "recipes" / "gsm8k.yaml", overrides={"stack": flavor})
        run = build_run_dir(recipe, stack, tmp_path / flavor, "recipes/gsm8k.yaml", environ={})
        assert pairs(run.args)["--attention-backend"] == backend, flavor


def test_every_rendered_flag_is_accepted_by_pinned_slime(gsm8k):
    facts = load_facts("a74ae3a0ad16bd8b769d5386738e8ae3d1269d7e")
    flags = {a for a in gsm8k.args if a.startswith("--")}
    assert flags <= facts.renderable_flags, flags - facts.renderable_flags
    assert not flags & set(facts.removed_flags)


def test_runtime_env_holds_the_cuda13_rules(gsm8k):
    env = json.loads((gsm8k.path / "runtime_env.json").read_text())["env_vars"]
    lib = env["LD_LIBRARY_PATH"].split(":")
    assert lib[0] == "/opt/slimeforge/cudart-decoy"
    assert lib[1] == "/opt/venv/lib/python3.12/site-packages/nvidia/cu13/lib"
    assert "/usr/local/cuda/lib64" in lib
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert env["PYTHONPATH"] == "/root/Megatron-LM"
    assert env["CUDNN_PATH"] == env["CUDNN_HOME"] == "/opt/venv/lib/python3.12/site-packages/nvidia/cudnn"
    assert env["CUDNN_FRONTEND_CUDART_LIB_NAME"] == "libcudart.so.13"


def test_inherited_library_path_is_scrubbed():
    inherited = "/usr/local/cuda-12.9/lib64:/opt/x:/usr/local/cuda/:/usr/local/cuda:/usr/local/cudax"
    recipe, stack = parse_recipe({**SEED, "env": {"LD_LIBRARY_PATH": inherited}}, "t")
    run = build_run_dir(recipe, stack, "/tmp/unused", environ={})
    lib = run.env["LD_LIBRARY_PATH"].split(":")
    assert "/opt/x" in lib and "/usr/local/cudax" in lib
    assert not [e for e in lib if e.startswith("/usr/local/cuda-") or e.rstrip("/") == "/usr/local/cuda"]


def test_agentcore_config_follows_toolkit_020(gsm8k):
    cfg = yaml.safe_load((gsm8k.path / "agentcore.yaml").read_text())
    backend = cfg["rollout_session_backend"]
    assert backend["backend"] == "agentcore_rl_toolkit.rollout_session.agentcore_s3_session.AgentCoreS3Session"
    assert backend["agentcore_runtime_arn"].startswith("arn:aws:bedrock-agentcore:")
    assert backend["rollout_output_s3"] == "s3://slimeforge-rollouts-example/gsm8k-3b-smoke"
    assert backend["experiment_name"] == "gsm8k-3b-smoke"
    assert ((cfg["max_rollout_time"], cfg["tps_limit"], cfg["gateway_port"], cfg["model_id"])
            == (900, 25, 9090, "default"))


def test_plan_records_hashes_of_the_files(gsm8k):
    plan = json.loads((gsm8k.path / "plan.json").read_text())
    assert sorted(os.listdir(gsm8k.path)) == sorted([*RUN_FILES, LOCK_NAME])
    for name, digest in plan["files"].items():
        assert hashlib.sha256((gsm8k.path / name).read_bytes()).hexdigest() == digest
    assert plan["stack"]["id"].startswith("cu13-") and plan["recipe"]["exp_id"] == "gsm8k-3b-smoke"
    assert os.access(gsm8k.path / "launch.sh", os.X_OK)


def test_slime_args_round_trip(gsm8k):
    assert read_args(gsm8k.path / "slime.args") == gsm8k.args


def test_secrets_are_never_written(tmp_path):
    recipe, stack = parse_recipe({**SEED, "wandb_project": "p"}, "t")
    run = build_run_dir(recipe, stack, tmp_path / "r", environ={"WANDB_API_KEY": "sekrit-123", "WANDB_ENTITY": "team"})
    write_run_dir(run)
    assert "--use-wandb" in run.args and run.env["WANDB_ENTITY"] == "team"
    for name in RUN_FILES:
        assert "sekrit-123" not in (run.path / name).read_text()


def test_runner_yaml_round_trip_renders_identically(tmp_path):
    kwargs = {**SEED, "num_gpus": 4, "lr": 2e-6, "extra_flags": ["--kl-loss-coef", "0.01"], "wandb_group": "g"}
    runner = SlimeRunner(**kwargs)
    path = runner.to_yaml(tmp_path / "r.yaml")
    again = SlimeRunner.from_yaml(path)
    a = runner.render(tmp_path / "a")
    b = again.render(tmp_path / "a")  # same out dir: the files must be byte-identical
    for name in ("slime.args", "agentcore.yaml", "runtime_env.json", "launch.sh"):
        assert a.files[name] == b.files[name], name
    plan_a, plan_b = (json.loads(r.files["plan.json"]) for r in (a, b))
    assert plan_a.pop("recipe_path") == "SlimeRunner(...)" and plan_b.pop("recipe_path") == str(path)
    assert plan_a == plan_b
    assert yaml.safe_load(path.read_text()) == {**{k: getattr(runner, k) for k in kwargs}, **again.to_dict()}


def test_runner_train_signature_and_num_rollout(tmp_path):
    run = SlimeRunner(**SEED).render(tmp_path / "x", num_rollout=7)
    assert pairs(run.args)["--num-rollout"] == "7"


# Shell-hostile text in every free-text field: quotes, $(), backticks, spaces, globs. (Control
# characters such as a newline are refused before rendering: tests/unit/hostile.)
HOSTILE = "it's \"q\" $(touch /tmp/pwned) `id` ; rm -rf * \\ $HOME"


@pytest.fixture
def hostile_run(tmp_path):
    slime_dir = tmp_path / f"sl ime{HOSTILE}".replace("/", "_")
    (slime_dir / "scripts" / "models").mkdir(parents=True)
    model_args = 'MODEL_ARGS=(--num-layers 36 --normalization "RMSNorm")\n'
    (slime_dir / "scripts" / "models" / "qwen2.5-3B.sh").write_text(model_args)
    fields = {
        **SEED,
        "slime_dir": str(slime_dir),
        "megatron_dir": "/meg" + HOSTILE,
        "model_dir": "/models" + HOSTILE,
        "data_path": "/data" + HOSTILE,
        "checkpoint_dir": "/ckpt" + HOSTILE,
        "eval_data": {"gsm8k": "/eval" + HOSTILE},
        "env": {"MY_VAR": HOSTILE},
        "extra_flags": ["--kl-loss-coef", HOSTILE],
    }
    recipe, stack = parse_recipe(fields, "hostile.yaml")
    run = build_run_dir(recipe, stack, tmp_path / "run", environ={"WANDB_API_KEY": "k"})
    write_run_dir(run)
    return run, slime_dir


def test_hostile_values_pass_bash_n_and_shellcheck(hostile_run):
    run, _ = hostile_run
    subprocess.run(["bash", "-n", str(run.path / "launch.sh")], check=True)
    if shutil.which("shellcheck") is None:
        absent("shellcheck not installed")
    subprocess.run(["shellcheck", str(run.path / "launch.sh")], check=True)


def test_hostile_values_arrive_byte_for_byte(hostile_run, tmp_path):
    run, slime_dir = hostile_run
    assert read_args(run.path / "slime.args") == run.args
    assert json.loads((run.path / "runtime_env.json").read_text())["env_vars"]["MY_VAR"] == HOSTILE
    # Run launch.sh against a stand-in `ray` that records the job entrypoint it is given.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "entrypoint.txt"
    (bin_dir / "ray").write_text(f"""#!/bin/bash
case "$1 $2" in
  "job submit") shift 2; while [[ $# -gt 0 && "$1" != "--" ]]; do shift; done; shift
                # the entrypoint words, as `ray job submit` gets them
                printf '%s\\0' "$@" > {shlex.quote(str(record))} ;;
  "job status") echo "Job 'x' succeeded" ;;
esac
exit 0
""")
    (bin_dir / "ray").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RAY_ADDRESS": "http://127.0.0.1:1",
           "SLIMEFORGE_PYTHON": sys.executable, "SLIMEFORGE_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.run(["bash", str(run.path / "launch.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    argv = record.read_text().split("\0")[:-1]
    assert argv == [sys.executable, f"{slime_dir}/train.py", "--num-layers", "36", "--normalization", "RMSNorm",
                    *run.args]
    assert HOSTILE in argv and not Path("/tmp/pwned").exists()


def test_launch_sh_makes_the_submission_id_in_the_one_format(gsm8k):
    """<exp_id>-<paths.SUBMISSION_TIME>-<6 hex>: launch.sh, the one launcher, makes it with `date`."""
    from slimeforge import paths

    line = next(x for x in gsm8k.files["launch.sh"].splitlines() if x.startswith("SUBMISSION_ID="))
    fmt = shlex.split(line.split("$(date ", 1)[1].split(")", 1)[0])[0]
    assert fmt == "+" + paths.SUBMISSION_TIME
    printed = subprocess.run(["date", "-u", "-d", "@86399", fmt], capture_output=True, text=True,
                             check=True).stdout.strip()
    assert printed.split("-") == ["19700101", "235959"]


def test_the_head_wait_is_rendered_once(gsm8k):
    """launch.py's host path and launch.sh waited 180 s and 120 s for the Ray head; launch.sh is now
    the only waiter, with rundir.HEAD_TIMEOUT_S rendered as its default (tests/unit/test_launch_unit.py
    runs a silent head against a passed deadline)."""
    from slimeforge.run.rundir import HEAD_TIMEOUT_S

    script = gsm8k.files["launch.sh"]
    assert f'HEAD_TIMEOUT="${{SLIMEFORGE_HEAD_TIMEOUT:-"{HEAD_TIMEOUT_S}"}}"\n' in script
    assert "deadline=$((SECONDS + HEAD_TIMEOUT))" in script and "120 s" not in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
