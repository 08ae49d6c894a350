"""Fixtures of the launch tests (test_launch.py, test_api.py), one session each: S3 and AgentCore
on moto's server (one backend per process: a second server would see the first one's bucket), and
an H100 host as preflight sees it."""

from __future__ import annotations

import pytest
from launch_support import VENV_BIN, fake_nvidia_smi

REGION = "us-west-2"


@pytest.fixture(scope="session")
def moto_s3():
    import boto3
    from helpers import free_port
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION,
           "AWS_ENDPOINT_URL": url}
    boto3.client("s3", region_name=REGION, endpoint_url=url, aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(
        Bucket="sf-launch-test-bucket", CreateBucketConfiguration={"LocationConstraint": REGION})
    env["SF_TEST_RUNTIME_ARN"] = agentcore_runtime(url)
    yield env
    server.stop()


def agentcore_runtime(url: str) -> str:
    """Deploy an AgentCore runtime in moto; moto's runtime ids are random hex, and real ones are
    <name>-<10 characters> with a letter first, so create until one has that shape."""
    import boto3

    from slimeforge.run.recipe import ARN_RE

    client = boto3.client("bedrock-agentcore-control", region_name=REGION, endpoint_url=url,
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    for _ in range(40):
        rid = client.create_agent_runtime(
            agentRuntimeName="sf_launch_agent", roleArn="arn:aws:iam::123456789012:role/sf-launch",
            agentRuntimeArtifact={"containerConfiguration": {
                "containerUri": "123456789012.dkr.ecr.us-west-2.amazonaws.com/agent:1"}},
            networkConfiguration={"networkMode": "PUBLIC"})["agentRuntimeId"]
        arn = f"arn:aws:bedrock-agentcore:{REGION}:123456789012:runtime/{rid}"
        if ARN_RE.match(arn):
            return arn
    raise RuntimeError("moto never made a runtime id of AWS's shape")


@pytest.fixture
def env(tmp_path, monkeypatch, moto_s3):
    """A GPU host as far as preflight can tell (an H100 capture), AWS through moto."""
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "RAY_ADDRESS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in moto_s3.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path / 'bin', 'h100-x1')}:{VENV_BIN}:/usr/bin:/bin")
    monkeypatch.setenv("SLIMEFORGE_STATE_DIR", str(tmp_path / "state"))
    return tmp_path
