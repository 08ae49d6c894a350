"""A cluster whose Ray is not this machine's: `invoke run --cluster` refuses before it submits.

The lab's host runs Ray 2.58.0 in its container (an image like lab_image.py's with another Ray),
while this machine's Jobs SDK is the lock's Ray: the Jobs API's packages and answers change between
Ray versions, so the run stops with exit 2 naming both versions, and nothing reaches the cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from cluster_helpers import write_inventory
from lab_image import REGISTRY_STORE, lab_ray_image, pinned_ray
from launch_support import FIXTURES, write_catalog
from netlab import NetLab, can_create_namespaces, can_run_docker_lab

from slimeforge.run.recipecheck import parse_recipe

pytestmark = [pytest.mark.ssh, pytest.mark.docker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]
MODEL = "Qwen2.5-3B-Instruct"
OTHER_RAY = "2.58.0"


def _invoke(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env={**os.environ, **env})


def test_a_cluster_of_another_ray_is_refused_before_anything_is_submitted(base_image, tmp_path):
    jobsapi = pytest.importorskip("slimeforge.run.targets.jobsapi")
    if not hasattr(jobsapi, "check_versions"):
        pytest.skip("no Ray version check in the Jobs API client yet")
    why = can_create_namespaces() or can_run_docker_lab()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to run the container lab: {why}")
        pytest.skip(f"cannot run a Docker daemon per lab host here: {why}")
    here = pinned_ray()
    assert here != OTHER_RAY
    image = lab_ray_image(base_image, ray=OTHER_RAY)
    lab = NetLab(1, docker=True, registry_store=REGISTRY_STORE, private=("{workdir}/local", "{workdir}/ray",
                                                                         "{workdir}/state")).start()
    env = {"SLIMEFORGE_STATE_HOME": str(tmp_path / "state-home")}
    inv = None
    try:
        ref = lab.publish(image)
        w, h = lab.workdir, lab.hosts[0]
        lab.run_in(h, ["sh", "-c", 'mkdir -p "$1" && cat > "$1/config.json"', "sh",
                       str(w / "local" / "models" / MODEL)],
                   input=(FIXTURES / "models" / MODEL / "config.json").read_text())
        lab.run_in(h, ["sh", "-c", 'mkdir -p "$(dirname "$1")" && echo "{}" > "$1"', "sh",
                       str(w / "local" / "data" / "train.jsonl")])
        (w / "shared" / "ckpt").mkdir(parents=True)
        inv = write_inventory(tmp_path / "other-ray.yaml", {
            "name": f"{lab.tag}-mm", "mode": "container", "image": ref, "state_dir": str(w / "state"),
                                                            "system_python": "/usr/bin/python3",
            "ssh": {"config": str(lab.ssh_config), "connect_timeout": 5},
            "ray": {"num_cpus": 1, "object_store_memory": 100 * 1024 * 1024, "start_timeout": 300},
            # ulimits []: memlock=-1 fails a container's start here (test_run_cluster_container says why).
            "container": {"volumes": [f"{w}/local/models:/models:ro", f"{w}/local/data:/data:ro",
                                      f"{w}/shared/ckpt:/checkpoints"], "ulimits": []},
            "hosts": [{"name": h.name, "address": h.ip, "role": "head", "gpus": 2, "temp_dir": f"{w}/ray/{h.name}"}],
        })
        r = _invoke("cluster.up", str(inv), env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        dashboard = r.stdout.split("dashboard and Jobs API ", 1)[1].split()[0]
        recipe = {
            "exp_id": "sf-other-ray",
            "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/gsm8k_agent-a1B2c3D4e5",
            "s3_bucket": "sf-cluster-test", "model_dir": f"/models/{MODEL}", "data_path": "/data/train.jsonl",
            "model_type": "qwen2.5-3B",
            "num_gpus": 2, "num_nodes": 1, "tp_size": 1, "rollout_batch_size": 24, "rollout_gpus_per_engine": 1,
            "mode": "container",
            "checkpoint_dir": "/checkpoints/sf-other-ray",
        }
        parsed, stack = parse_recipe({**recipe, "mode": "host", "slime_dir": str(FIXTURES / "slime"),
                                      "install_prefix": str(w / "prefix")}, "test")
        catalog = write_catalog(tmp_path / "flags.json", parsed, stack)
        (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
        r = _invoke("run", str(tmp_path / "recipe.yaml"), "--cluster", str(inv), "--out", str(tmp_path / "run"),
                    "--catalog", str(catalog),
                    "--no-network", env=env)
        text = r.stdout + r.stderr
        assert r.returncode == 2, text
        assert f"this machine has Ray {here}, the cluster at {dashboard} runs Ray {OTHER_RAY}" in text
        assert "Traceback" not in text
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(f"{dashboard}/api/jobs/",
                                                                               timeout=30) as resp:
            assert json.loads(resp.read()) == []  # nothing was submitted
    finally:
        try:
            if inv is not None:
                _invoke("cluster.down", str(inv), env=env)
        finally:
            lab.stop()
