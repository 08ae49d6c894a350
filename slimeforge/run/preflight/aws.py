"""AWS checks: credentials, the S3 bucket and the AgentCore runtime (boto3; moto's server in tests)."""

from __future__ import annotations

from ..recipe import ARN_RE, Recipe, bucket_name
from .findings import Context, Finding, check, error, ok, skipped, warning


def _boto_config():
    from botocore.config import Config

    return Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 1})


def _session(ctx: Context):
    import boto3

    return ctx.once("session", lambda: boto3.Session())


def _region(recipe: Recipe) -> str | None:
    parts = recipe.agent_runtime_arn.split(":")
    return parts[3] if len(parts) > 3 and parts[3] else None


@check("aws-credentials", "network", needs_recipe=True)
def check_aws_credentials(ctx: Context) -> list[Finding]:
    """AWS credentials are present (boto3's chain: env, profile, instance role)."""
    session = _session(ctx)
    if isinstance(session, Exception):
        return [error("aws-credentials", f"cannot create an AWS session: {session}",
                      "check AWS_PROFILE and ~/.aws/config")]
    creds = session.get_credentials()
    if creds is None:
        return [error("aws-credentials", "no AWS credentials found (the rollouts call AgentCore and write to S3)",
                      "export AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, set AWS_PROFILE, or run on a host with an "
                      "instance role")]
    return [ok("aws-credentials", f"from {creds.method}")]


@check("s3", "network", needs_recipe=True)
def check_s3(ctx: Context) -> list[Finding]:
    """The S3 bucket is reachable (head_bucket)."""
    from botocore.exceptions import BotoCoreError, ClientError

    r = ctx.recipe
    assert r is not None
    bucket = bucket_name(r.s3_bucket)
    session = _session(ctx)
    if isinstance(session, Exception) or session.get_credentials() is None:
        return [skipped("s3", "aws-credentials",
                        f"bucket {bucket} needs AWS credentials (the aws-credentials error above)")]
    try:
        session.client("s3", region_name=_region(r), config=_boto_config()).head_bucket(Bucket=bucket)
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code"))
        if code in ("404", "NoSuchBucket", "NotFound"):
            return [error("s3", f"bucket {bucket} does not exist",
                          f"create it (`aws s3 mb s3://{bucket}`) or fix s3_bucket in the recipe")]
        if code in ("403", "AccessDenied", "Forbidden"):
            return [error("s3", f"access to bucket {bucket} is denied",
                          "grant s3:ListBucket, s3:GetObject and s3:PutObject on it to these credentials")]
        return [error("s3", f"head_bucket {bucket}: {exc}", "check the bucket name, region and permissions")]
    except BotoCoreError as exc:
        return [error("s3", f"cannot reach S3 for bucket {bucket}: {exc}",
                      "check the network, proxy and AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL")]
    return [ok("s3", f"bucket {bucket} reachable")]


@check("agentcore", "network", needs_recipe=True)
def check_agentcore(ctx: Context) -> list[Finding]:
    """The AgentCore runtime ARN is well formed and, when permissions allow, exists."""
    from botocore.exceptions import BotoCoreError, ClientError

    r = ctx.recipe
    assert r is not None
    arn = r.agent_runtime_arn
    if not ARN_RE.match(arn):
        return [error("agentcore", f"{arn!r} is not an AgentCore runtime ARN",
                      "copy the runtime ARN from `aws bedrock-agentcore-control list-agent-runtimes` "
                      "(arn:aws:bedrock-agentcore:<region>:<account>:runtime/<name>-<id>)")]
    runtime_id = arn.split(":runtime/", 1)[1]
    session = _session(ctx)
    if isinstance(session, Exception) or session.get_credentials() is None:
        return [skipped("agentcore", "aws-credentials",
                        f"runtime {runtime_id} is well formed; describing it needs AWS credentials (the "
                        "aws-credentials error above)")]
    try:
        client = session.client("bedrock-agentcore-control", region_name=_region(r), config=_boto_config())
        resp = client.get_agent_runtime(agentRuntimeId=runtime_id)
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code"))
        if code == "ResourceNotFoundException":
            return [error("agentcore", f"runtime {runtime_id} does not exist in {_region(r)}",
                          "deploy the agent, or fix agent_runtime_arn (account and region too)")]
        if code in ("AccessDeniedException", "AccessDenied", "UnauthorizedOperation"):
            return [warning("agentcore",
                            f"runtime {runtime_id}: well formed; not described (no permission for GetAgentRuntime)")]
        return [warning("agentcore", f"runtime {runtime_id}: well formed; could not describe it ({code})")]
    except BotoCoreError as exc:
        return [warning("agentcore", f"runtime {runtime_id}: well formed; could not describe it ({exc})")]
    status = resp.get("status", "?")
    if status not in ("READY", "?"):
        return [warning("agentcore", f"runtime {runtime_id} is {status}, not READY",
                        "wait for the deployment, or redeploy the agent")]
    return [ok("agentcore", f"runtime {runtime_id} is {status}")]

