"""Credentials on a real cluster (host mode, the sshd lab): a secret exported where cluster.up runs
reaches a Ray task on every node and nothing else; each host's AWS credentials are proved in the
job's own environment there, against moto's server on the lab's gateway (what the hosts reach).

- cluster.up with `secret_env: [HF_TOKEN]`: the value goes over ssh's stdin into a 0600 file that
  the node agent reads into `ray start`'s environment and removes. A job pinned to each node sees
  it; no process's argv, no file under the state directories or Ray's temp dirs, no record, the
  dry run, the bring-up's table and the job's log never hold it.
- container mode, on this machine's Docker Engine with the node agent run here as on a host: the
  file goes to `docker run --env-file` and is removed; the container has the value, its argv does
  not; the AWS probe runs inside the container (`docker exec`), where boto3 is missing: a finding.
- h1 has AWS credentials of its own (a config file named by AWS_CONFIG_FILE in its env); h2 has
  none. This process exports moto's credentials, which must NOT count for the hosts: the check
  passes h1 (S3 bucket and AgentCore runtime reached) and names h2 with the fix.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import time
from pathlib import Path

import pytest
import yaml
from cluster_helpers import environment_python, inventory_data, write_inventory
from helpers import free_port
from launch_support import make_recipe, write_catalog
from netlab import NetLab, can_create_namespaces

from slimeforge.cluster import credentials
from slimeforge.cluster import raycluster as cluster
from slimeforge.run.recipe import ARN_RE
from slimeforge.run.recipecheck import parse_recipe

ROOT = Path(__file__).resolve().parents[3]
REGION = "us-west-2"
ARN_EXAMPLE = "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/gsm8k_agent-a1B2c3D4e5"
BUCKET = "sf-secrets-test"
VALUE = "hf_" + hashlib.sha256(str(time.time()).encode()).hexdigest()[:30]  # never seen outside the job

# Runs as the job's entrypoint: one task pinned to each ALIVE node reports a hash of what it sees.
JOB = """
import hashlib, json, os, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init()
@ray.remote(num_cpus=0)
def seen():
    token = os.environ.get("HF_TOKEN", "")
    return ray.get_runtime_context().get_node_id(), hashlib.sha256(token.encode()).hexdigest()
nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
pinned = [seen.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote() for n in nodes]
print("SEEN " + json.dumps(ray.get(pinned)))
"""


@pytest.fixture(scope="module")
def lab():
    why = can_create_namespaces()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to create network namespaces with sshd: {why}")
        pytest.skip(f"cannot create network namespaces with sshd here: {why}")
    lab = NetLab(2).start()
    try:
        yield lab
    finally:
        lab.stop()


@pytest.fixture(scope="module")
def moto(lab):
    """moto's server on the lab's gateway (the hosts reach it there), with the bucket and a runtime."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address=lab.gateway, port=port, verbose=False)
    server.start()
    url = f"http://{lab.gateway}:{port}"
    keys = {"region_name": REGION, "endpoint_url": url, "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing"}
    boto3.client("s3", **keys).create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    client = boto3.client("bedrock-agentcore-control", **keys)
    for _ in range(40):  # moto's ids are random hex; AWS's start with a letter
        rid = client.create_agent_runtime(
            agentRuntimeName="sf_secrets_agent", roleArn="arn:aws:iam::123456789012:role/sf",
            agentRuntimeArtifact={"containerConfiguration": {
                "containerUri": "123456789012.dkr.ecr.us-west-2.amazonaws.com/agent:1"}},
            networkConfiguration={"networkMode": "PUBLIC"})["agentRuntimeId"]
        arn = f"arn:aws:bedrock-agentcore:{REGION}:123456789012:runtime/{rid}"
        if ARN_RE.fullmatch(arn):
            break
    try:
        yield {"url": url, "arn": arn}
    finally:
        server.stop()


@pytest.fixture(scope="module")
def up(lab, moto, tmp_path_factory):
    w = lab.workdir
    h1_config = w / "h1-aws-config"  # h1's own credentials; h2 has none
    h1_config.write_text("[default]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    data = inventory_data(lab, f"{lab.tag}-sec", gpus=2, overrides={"h1": {"env": {"AWS_CONFIG_FILE": str(h1_config)}}})
    data["ray"]["env"] = {"AWS_ENDPOINT_URL": moto["url"], "AWS_DEFAULT_REGION": REGION}
    data["secret_env"] = ["HF_TOKEN"]
    inv = write_inventory(w / "secrets.yaml", data)
    home = tmp_path_factory.mktemp("state-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("SLIMEFORGE_STATE_HOME", str(home))
    mp.setenv("HF_TOKEN", VALUE)
    # This machine's AWS credentials: a host without its own must fail all the same.
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": REGION}.items():
        mp.setenv(k, v)
    table = io.StringIO()
    try:
        plan = "\n".join(cluster.plan(inv))
        address = cluster.up(inv, control_dir=lab.control_dir, stream=table)
        yield {"inventory": inv, "address": address, "plan": plan, "table": table.getvalue(), "home": home,
               "data": data, "arn": moto["arn"]}
    finally:
        try:
            cluster.down(inv, control_dir=lab.control_dir, stream=io.StringIO())
        finally:
            mp.undo()


def recipe(lab: NetLab, arn: str, **over):
    data = make_recipe(lab.workdir / "recipe", exp_id="sf-secrets", agent_runtime_arn=arn, s3_bucket=BUCKET, **over)
    return parse_recipe(data, "test")[0]


def files_holding(root: Path, needle: bytes, cap: int = 8 << 20) -> list[str]:
    hits = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            p = Path(dirpath) / name
            try:
                if p.is_file() and not p.is_symlink() and p.stat().st_size <= cap and needle in p.read_bytes():
                    hits.append(str(p))
            except OSError:
                continue
    return hits


@pytest.mark.ssh
@pytest.mark.slow
def test_the_secret_reaches_every_node_and_nothing_else(lab, up):
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(up["address"].dashboard)
    sid = client.submit_job(entrypoint=shlex.join([environment_python(), "-c", JOB]))
    deadline = time.monotonic() + 240
    while (status := client.get_job_status(sid)) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
        assert time.monotonic() < deadline, client.get_job_logs(sid)
        time.sleep(1)
    logs = client.get_job_logs(sid)
    assert status == JobStatus.SUCCEEDED, logs
    seen = json.loads(next(line for line in logs.splitlines() if line.startswith("SEEN "))[5:])
    want = hashlib.sha256(VALUE.encode()).hexdigest()
    assert len(seen) == 2 and all(h == want for _, h in seen), seen
    assert VALUE not in logs

    secret = VALUE.encode()
    argvs = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
    leaked = []
    for p in argvs:
        try:
            if secret in (p / "cmdline").read_bytes():
                leaked.append(p.name)
        except OSError:
            continue
    assert leaked == [], "the value is in the argv of pid(s) " + ", ".join(leaked)
    state = Path(up["data"]["state_dir"])
    assert not list(state.rglob("secrets-*.env")), "the secrets file was left on a host"
    assert files_holding(state, secret) == []
    assert files_holding(up["home"], secret) == []  # this machine's record of the bring-up
    for h in up["data"]["hosts"]:
        assert files_holding(Path(h["temp_dir"]), secret) == [], f"Ray's temp dir of {h['name']}"
    records = [json.loads(p.read_text()) for p in state.rglob("ray.json")]
    assert len(records) == 2 and all(r["secret_env"] == ["HF_TOKEN"] for r in records)
    assert VALUE not in up["plan"] and "secrets      HF_TOKEN (names only)" in up["plan"]
    assert VALUE not in up["table"]


@pytest.mark.ssh
@pytest.mark.slow
def test_aws_is_proved_on_each_host_with_its_own_credentials(lab, up):
    from slimeforge.cluster.inventory import load_inventory

    inv = load_inventory(up["inventory"])
    table, failures = credentials.check_hosts(recipe(lab, up["arn"], secret_env=["HF_TOKEN"]), inv,
                                              control_dir=lab.control_dir,
                                              stream=io.StringIO(), live_table=False)
    text = table.text()
    assert list(failures) == ["h2"], text
    assert "no AWS credentials" in failures["h2"] and "instance role" in failures["h2"], text
    h1 = next(line for line in text.splitlines() if line.startswith("h1 "))
    assert f"bucket {BUCKET} ok" in h1 and "config-file" in h1, text
    assert "HF_TOKEN in Ray's environment; " in h1 and VALUE not in text

    # Without AWS (--no-network): the secrets alone, proved set in the job's environment on each host.
    table, failures = credentials.check_hosts(recipe(lab, up["arn"], secret_env=["HF_TOKEN"]), inv, network=False,
                                              control_dir=lab.control_dir, stream=io.StringIO(), live_table=False)
    assert failures == {} and table.text().count("HF_TOKEN in Ray's environment") == 2, table.text()

    # A secret the recipe names that this cluster's Ray was not started with: named on every host.
    table, failures = credentials.check_hosts(recipe(lab, up["arn"], secret_env=["WANDB_API_KEY"]), inv, network=False,
                                              control_dir=lab.control_dir, stream=io.StringIO(), live_table=False)
    assert sorted(failures) == ["h1", "h2"]
    assert all("WANDB_API_KEY: not in this host's Ray" in why and "cluster.up" in why for why in failures.values())


@pytest.mark.ssh
@pytest.mark.slow
def test_invoke_run_refuses_a_host_without_credentials_and_submits_nothing(lab, up, tmp_path, monkeypatch):
    """The real command line: the hosts' checks run with each host's own credentials, never this
    machine's (which it has: moto's), and h2, which has none, is named with the fix; exit 2."""
    import subprocess
    import sys

    from ray.job_submission import JobSubmissionClient

    monkeypatch.setenv("SLIMEFORGE_STATE_HOME",
                       str(up["home"]))  # where cluster.up recorded the head (conftest gives each test its own)
    data = make_recipe(lab.workdir / "recipe-run", exp_id="sf-secrets-run", agent_runtime_arn=up["arn"],
                       s3_bucket=BUCKET, num_gpus=2, num_nodes=2,
                       rollout_batch_size=16, checkpoint_dir=str(lab.workdir / "ckpt"), secret_env=["HF_TOKEN"])
    data = {k: v for k, v in data.items() if k not in ("ray_port", "ray_dashboard_port", "gateway_port")}
    # Weights of a few KiB: the checkpoint room asked of the hosts follows them (7 x 4 KiB), not
    # config.json's 3.35B parameters (43.7 GiB, more than a CI machine's /tmp may have free).
    (Path(data["model_dir"]) / "model.safetensors").write_bytes(b"w" * 4096)
    parsed, stack = parse_recipe({**data, "install_prefix": up["data"]["prefix"]}, "test")
    catalog = write_catalog(tmp_path / "flags.json", parsed, stack)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    before = [j.submission_id for j in JobSubmissionClient(up["address"].dashboard).list_jobs()]
    r = subprocess.run([sys.executable, "-m", "invoke", "run", str(path), "--cluster", str(up["inventory"]), "--out",
                        str(tmp_path / "run"),
                        "--catalog", str(catalog)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    text = r.stdout + r.stderr
    assert r.returncode == 2, text
    h2 = next((line for line in text.splitlines() if line.startswith("h2 ") and "FAILED" in line), "")
    assert "no AWS credentials" in h2 and "instance role" in h2, text
    assert "credentials do not hold on 1 host(s) (h2); nothing was submitted" in text and VALUE not in text
    assert [j.submission_id for j in JobSubmissionClient(up["address"].dashboard).list_jobs()] == before


@pytest.mark.docker
def test_container_mode_hands_the_file_to_docker_and_probes_inside_the_container(tmp_path, base_image):
    import secrets as _secrets
    import subprocess

    from slimeforge.cluster.agent import PUT_SCRIPT, env_file_text, secret_file
    from slimeforge.scripts import hostrecord, node_agent

    state = tmp_path / "state"
    state.mkdir()
    token = _secrets.token_hex(16)
    env_file = secret_file(str(state), token)
    subprocess.run(["sh", "-c", PUT_SCRIPT, "sh", env_file], input=env_file_text({"HF_TOKEN": VALUE}), text=True,
                   check=True)
    # cluster.up's `docker run` (nodestart.start_argv) with a stand-in for `ray start` (the test base has no Ray).
    argv = ["docker", "run", "--detach", "--name", f"sf-secrets-{token[:12]}", "--label",
            f"{hostrecord.LABEL_CLUSTER}=lab",
            "--label", f"{hostrecord.LABEL_TOKEN}={token}", "--init", "--env-file", env_file, base_image,
            "sh", "-c", "echo 'Ray runtime started.'; exec sleep 300"]
    result = node_agent.cmd_start({"state_dir": str(state), "argv": argv, "token": token, "cluster": "lab",
                                   "container": True,
                                   "env_file": env_file, "marker": "Ray runtime started.", "timeout": 60})
    try:
        assert result["ok"], result
        assert not os.path.exists(env_file)
        cid = result["record"]["container"]
        seen = subprocess.run(["docker", "exec", cid, "sh", "-c", 'printf %s "$HF_TOKEN"'], capture_output=True,
                              text=True, check=True).stdout
        assert seen == VALUE
        shown = subprocess.run(["docker", "inspect", "--format",
                                "{{json .Path}} {{json .Args}} {{json .Config.Labels}}", cid],
                               capture_output=True, text=True, check=True).stdout
        assert VALUE not in shown
        record = (state / hostrecord.RECORD).read_text()
        assert json.loads(record)["secret_env"] == ["HF_TOKEN"] and VALUE not in record
        answer = node_agent.cmd_awscheck({"state_dir": str(state), "args": {"aws": True, "bucket": BUCKET,
                                                                            "runtime_id": "r"}})
        assert answer["secret_env"] == ["HF_TOKEN"] and answer["probe"]["secret_env_set"] == ["HF_TOKEN"], answer
        assert "boto3 is not installed in the job's environment here" in answer["probe"]["error"]
        r, _ = parse_recipe(make_recipe(tmp_path, agent_runtime_arn=ARN_EXAMPLE, s3_bucket=BUCKET), "test")
        (problem,), _ = credentials.aws_problems(answer["probe"], r, "container")
        assert "fix: install boto3 in the image (rebuild it with boto3)" in problem
    finally:
        assert node_agent.cmd_stop({"state_dir": str(state), "timeout": 10})["ok"]
