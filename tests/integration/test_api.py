"""The setup guide's example, end to end (issue 34): `SlimeRunner(...).train(num_rollout=1)` in an
environment like slime's official container, built in a temp dir: a slime tree at slime_dir whose
train.py parses its flags with slime's own parser and checks the AgentCore config, the model
script the recipe names, this interpreter with Ray (real: the head is started by the run), S3 and
AgentCore on moto's server, and GPUs from a fake nvidia-smi fed with a real capture.

The guide's six keyword arguments are passed as written; the others only move what the container
has at /root (slime_dir, megatron_dir, checkpoint_dir) into the temp dir, shape the run for the
one GPU of the capture (the guide: "tune them for your cluster"), and keep the head off ports
other tests use. No mode, no image, no prefix and no flag catalog are given: it runs in place.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest
import yaml
from helpers import free_port
from launch_support import head_extra_args, short_tmp, slime_in_place, slime_scripts, stop_recorded_head, write_data

from slimeforge import SlimeRunner
from slimeforge.run.headstate import state_dir
from slimeforge.run.targets import jobs

pytestmark = [pytest.mark.ray, pytest.mark.slow]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
log = logging.getLogger(__name__)


def official_container(root: Path) -> dict:
    """What slime's container holds, under `root`: slime and Megatron-LM checkouts, the model, the data."""
    model = root / "models" / "Qwen2.5-3B-Instruct"
    model.mkdir(parents=True)
    (model / "config.json").write_text((FIXTURES / "models" / "Qwen2.5-3B-Instruct" / "config.json").read_text())
    (root / "Megatron-LM").mkdir()
    slime_scripts(root / "slime")
    return {"model_dir": str(model), "data_path": str(write_data(root / "data" / "gsm8k_tiny.jsonl")),
            "slime_dir": str(root / "slime"), "megatron_dir": str(root / "Megatron-LM")}


def guide_kwargs(root: Path, exp_id: str) -> dict:
    where = official_container(root)
    guide = {"exp_id": exp_id, "agent_runtime_arn": os.environ["SF_TEST_RUNTIME_ARN"],
             "s3_bucket": "sf-launch-test-bucket",
             "model_dir": where["model_dir"], "data_path": where["data_path"], "model_type": "qwen2.5-3B"}
    here = {"slime_dir": where["slime_dir"], "megatron_dir": where["megatron_dir"],
            "checkpoint_dir": str(root / "checkpoints"),
            "num_gpus": 1, "tp_size": 1, "rollout_gpus_per_engine": 1,
            "ray_port": free_port(), "ray_dashboard_port": free_port(), "gateway_port": free_port()}
    return {**guide, **here}


def train_in_place(runner: SlimeRunner, root: Path, monkeypatch) -> tuple[int, float, dict, str]:
    """runner.train(num_rollout=1) as the guide calls it; (exit code, seconds from train() to the job
    running (the stand-in's first line), what the stand-in saw, the job's status on the head)."""
    slime = Path(runner.recipe.slime_dir)
    slime_in_place(slime, runner.recipe, runner.stack)
    temp = short_tmp()
    monkeypatch.setenv("SLIMEFORGE_RAY_HEAD_ARGS",
                       " ".join(head_extra_args(temp)))  # the head's own temp dir and free ports
    monkeypatch.chdir(root)  # runs/<exp_id> lands in the temp dir, as in the user's working directory
    try:
        t0 = time.time()
        code = runner.train(num_rollout=1)
        record = json.loads((slime / "record.json").read_text())
        status = jobs.status(root / "runs" / runner.exp_id).data["status"]  # while the head it started is up
        return code, record["started"] - t0, record, status
    finally:
        stop_recorded_head(state_dir(runner.recipe.ray_port), say=lambda _: None)


def check_run(root: Path, exp_id: str, runner: SlimeRunner, record: dict, status: str) -> None:
    import sys

    run_dir = root / "runs" / exp_id
    config = yaml.safe_load((run_dir / "agentcore.yaml").read_text())
    assert (record["config"] == config
            and config["rollout_session_backend"]["agentcore_runtime_arn"] == runner.agent_runtime_arn)
    assert config["rollout_session_backend"]["rollout_output_s3"] == f"s3://sf-launch-test-bucket/{exp_id}"
    assert record["python"] == sys.executable and record["argv"][0] == f"{runner.slime_dir}/train.py"
    argv = record["argv"]
    assert argv[argv.index("--num-rollout") + 1] == "1" and argv[argv.index("--hf-checkpoint") + 1] == runner.model_dir
    assert status == "SUCCEEDED"
    # In place where slimeforge did not build the environment: its own layout (run/layout.py), said in the plan.
    layout = json.loads((run_dir / "plan.json").read_text())["layout"]
    if Path("/opt/slimeforge").is_dir():
        assert layout["name"] == "slimeforge", layout
    else:
        assert layout["name"] == "image" and layout["why"].startswith("this environment's own layout (in place"), layout


def test_the_guides_example_trains_in_place_and_from_yaml(env, monkeypatch, capsys):
    """`env` (conftest.py): an H100 host as preflight sees it, S3 with the bucket and a deployed
    AgentCore runtime on moto's server."""
    root = env / "container"
    kwargs = guide_kwargs(root, "gsm8k-3b-smoke")
    code, to_running, record, status = train_in_place(SlimeRunner(**kwargs), root, monkeypatch)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "0 error(s)" in out and "read with" in out and "standin: slime's parser took" in out
    check_run(root, "gsm8k-3b-smoke", SlimeRunner(**kwargs), record, status)
    log.warning("guide example: train() to the job running: %.1f s", to_running)
    print(f"\nSlimeRunner(...).train(): {to_running:.1f} s to the job running")

    # The config-file workflow: the same keyword arguments dumped to YAML.
    again = {**kwargs, "exp_id": "gsm8k-3b-yaml", "ray_port": free_port(), "ray_dashboard_port": free_port()}
    path = root / "my_run.yaml"
    path.write_text(yaml.safe_dump(again))
    (Path(again["slime_dir"]) / "record.json").unlink()
    code, to_running, record, status = train_in_place(SlimeRunner.from_yaml(path), root, monkeypatch)
    assert code == 0, capsys.readouterr().out
    check_run(root, "gsm8k-3b-yaml", SlimeRunner.from_yaml(path), record, status)
    log.warning("from_yaml: train() to the job running: %.1f s", to_running)
    print(f"SlimeRunner.from_yaml(...).train(): {to_running:.1f} s to the job running")
