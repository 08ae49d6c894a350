"""Container mode through the Jobs API: the job runs in the cluster's image, nothing runs here.

An image with Ray is built in the test (the test base image plus Ray at the lock's version, from
PyPI); a Ray head runs in it (`docker run ... ray start --head --block`, host network, free ports)
with only the shared paths mounted: the stand-in slime tree, the model, the data and the
checkpoints, never the run directory. `invoke run RECIPE --address URL --mode container` then
submits from this machine: no `docker run` here, the run directory's job files travel as the
working_dir, and the stand-in train.py (run by the image's python, in the unpacked working_dir)
reads every path its flags name and writes its checkpoint shard.

(The lab's hosts share one Docker engine, whose containers cannot join a lab host's network and
mount namespaces, so cluster.up's container mode runs in the inventory tests as plans and here as
one head; see docs/multinode.md.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import free_port
from launch_support import FIXTURES, write_catalog, write_data

from slimeforge.run.recipecheck import parse_recipe

pytestmark = [pytest.mark.docker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
MODEL = "Qwen2.5-3B-Instruct"


def lock_version(name: str) -> str:
    text = (ROOT / "images" / "locks" / "pylock.cu13.toml").read_text()
    return re.search(rf'^name = "{name}"\nversion = "([^"]+)"', text, re.M).group(1)


@pytest.fixture(scope="module")
def ray_image(base_image, tmp_path_factory):
    ctx = tmp_path_factory.mktemp("ray-image")
    (ctx / "Dockerfile").write_text(
        f"FROM {base_image}\n"
        "# Ray at the lock's version, in a venv first on PATH: the image's python3 is the job's. The CA\n"
        "# bundle of this machine (a TLS proxy may sit between it and PyPI) is a build secret, not a layer.\n"
        "RUN --mount=type=secret,id=ca-bundle,target=/run/secrets/ca-bundle python3 -m venv /opt/ray && \\\n"
        "    PIP_CERT=/run/secrets/ca-bundle /opt/ray/bin/pip install --no-cache-dir "
        f"'ray[default]=={lock_version('ray')}'\n"
        "ENV PATH=/opt/ray/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n")
    tag = "slimeforge-test/ray:" + lock_version("ray")
    # Debian's docker client runs BuildKit without buildx (DESIGN.md); no `# syntax=` line: nothing is pulled.
    r = subprocess.run(["/usr/bin/docker", "build", "-q", "--secret",
                        "id=ca-bundle,src=/etc/ssl/certs/ca-certificates.crt", "-t", tag, str(ctx)],
                       capture_output=True, text=True, env={**os.environ, "DOCKER_BUILDKIT": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    return tag


@pytest.fixture
def head_in_image(ray_image, tmp_path):
    shared = tmp_path / "shared"  # what the cluster's hosts mount; the run directory is not in it
    shutil.copytree(FIXTURES / "slime", shared / "slime")
    (shared / "models" / MODEL).mkdir(parents=True)
    shutil.copy(FIXTURES / "models" / MODEL / "config.json", shared / "models" / MODEL / "config.json")
    write_data(shared / "data" / "train.jsonl")
    (shared / "ckpt").mkdir()
    dashboard = free_port()
    temp = f"/tmp/sfr-{os.urandom(3).hex()}"
    argv = ["docker", "run", "-d", "--rm", "--init", "--network", "host", "--label", "slimeforge.test=run-in-image",
            "-v", f"{shared}:{shared}",
            "--entrypoint", "ray", ray_image, "start", "--head", "--block", "--port", str(free_port()),
            "--dashboard-host", "127.0.0.1",
            "--dashboard-port", str(dashboard), "--ray-client-server-port", str(free_port()),
            "--dashboard-agent-listen-port", str(free_port()),
            "--num-cpus", "2", "--num-gpus", "1", "--object-store-memory", str(100 * 2**20), "--temp-dir", temp,
            "--disable-usage-stats"]
    cid = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    address = f"http://127.0.0.1:{dashboard}"
    try:
        from ray.job_submission import JobSubmissionClient

        deadline = time.monotonic() + 240
        while True:
            try:
                JobSubmissionClient(address).list_jobs()
                break
            except Exception:  # noqa: BLE001 - not up yet
                assert time.monotonic() < deadline, subprocess.run(["docker", "logs", cid], capture_output=True,
                                                                   text=True).stdout[-3000:]
                time.sleep(1)
        yield {"address": address, "shared": shared, "temp": temp, "cid": cid}
    finally:
        subprocess.run(["docker", "stop", "--time", "30", "--", cid],
                       capture_output=True)  # ours, by the id docker gave us


def test_container_mode_job_runs_in_the_image_and_reads_only_what_travels(head_in_image, tmp_path):
    shared = head_in_image["shared"]
    recipe = {
        "exp_id": "sf-in-image",
              "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/gsm8k_agent-a1B2c3D4e5",
        "s3_bucket": "sf-in-image", "model_dir": str(shared / "models" / MODEL),
              "data_path": str(shared / "data" / "train.jsonl"),
        "model_type": "qwen2.5-3B", "num_gpus": 1, "tp_size": 1, "rollout_gpus_per_engine": 1,
              "slime_dir": str(shared / "slime"),
        "megatron_dir": str(shared / "Megatron-LM"), "mode": "container", "checkpoint_dir": str(shared / "ckpt"),
        "env": {"STANDIN_CHECK_FLAGS": "1", "STANDIN_RECORD": str(shared / "record.json")},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    parsed, stack = parse_recipe({**recipe, "mode": "host", "install_prefix": "/opt/sf"}, "test")
    catalog = write_catalog(tmp_path / "flags.json", parsed, stack)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "invoke", "run", str(path), "--address", head_in_image["address"],
                        "--image",
                        "127.0.0.1:5000/slimeforge/ray@sha256:" + "e" * 64, "--out", str(out), "--catalog",
                        str(catalog), "--no-network"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    text = r.stdout + r.stderr
    assert r.returncode == 0, text
    assert "standin: 1 node(s) read every path and wrote a shard" in text and "docker run" not in text
    seen = json.loads((shared / "record.json").read_text())
    # The image's python ran it, in the working_dir Ray unpacked inside the container.
    assert seen["env"]["PATH"].startswith("/opt/ray/bin:") and seen["cwd"].startswith(head_in_image["temp"] + "/")
    argv = seen["argv"]
    assert argv[argv.index("--custom-config-path") + 1] == "agentcore.yaml"
    assert seen["files"] == ["agentcore.yaml",
                             "job.sh"]  # what travelled: the job's files, nothing else of the run directory
    (shard,) = (shared / "ckpt").iterdir()
    assert shard.name.startswith("shard-")
    st = subprocess.run([sys.executable, "-m", "invoke", "run.status", str(out), "--json"], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
    assert st.returncode == 0 and json.loads(st.stdout)["status"] == "SUCCEEDED", st.stdout + st.stderr
