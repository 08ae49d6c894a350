"""The node agent's `awscheck`: AWS credentials and the run's secrets as the job on this host
sees them (cluster/credentials.py asks it of every host before a run is submitted).

Standard library only, Python >= 3.8: it runs on the hosts, inside the node agent's program
(slimeforge.scripts.program). The probe itself runs in the job's environment, with boto3.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess

try:
    from . import hostrecord  # imported as slimeforge.scripts.awscheck
except ImportError:  # on a host: one program (slimeforge.scripts.program) that registered it first
    hostrecord = importlib.import_module("hostrecord")


# --- AWS credentials as the job on this host sees them (cluster/credentials.py) ---------------
# Run with the job's own python and environment: host mode, the environment of the recorded
# `ray start` (every Ray worker inherits it); container mode, `docker exec` in the recorded
# container. Standard library and boto3 (boto3 missing there is itself the finding).
AWS_PROBE = r"""
import json, os, sys
a = json.loads(sys.argv[1])
hide = [os.environ[n] for n in a.get("secret_env", []) + ["AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"]
        if len(os.environ.get(n, "")) >= 4]
def said(text):
    for v in hide:
        text = text.replace(v, "***")
    return text[:300]
out = {"secret_env_set": [n for n in a.get("secret_env", []) if os.environ.get(n)]}
if not a.get("aws"):
    print(json.dumps(out)); sys.exit(0)
try:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError
except ImportError as exc:
    out["error"] = "boto3 is not installed in the job's environment here (%s)" % exc
    print(json.dumps(out)); sys.exit(0)
out["boto3"] = boto3.__version__
def err(exc):
    if isinstance(exc, ClientError):
        e = exc.response.get("Error", {})
        return said("%s: %s" % (e.get("Code", "?"), e.get("Message", "")))
    return said("%s: %s" % (type(exc).__name__, exc))
cfg = Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 1})
try:
    region = a.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    s = boto3.Session(region_name=region)
    c = s.get_credentials()
except Exception as exc:
    out["credentials"] = {"error": err(exc)}
    c = None
if c is None:
    out.setdefault("credentials", {"error": "no AWS credentials (environment, ~/.aws files, instance role)"})
else:
    out["credentials"] = {"method": c.method}
    try:
        out["identity"] = {"arn": s.client("sts", config=cfg).get_caller_identity()["Arn"]}
    except Exception as exc:
        out["identity"] = {"error": err(exc)}
    if a.get("bucket"):
        try:
            s.client("s3", config=cfg).head_bucket(Bucket=a["bucket"])
            out["s3"] = {"ok": True}
        except Exception as exc:
            out["s3"] = {"error": err(exc)}
    if a.get("runtime_id"):
        try:
            r = s.client("bedrock-agentcore-control", config=cfg).get_agent_runtime(agentRuntimeId=a["runtime_id"])
            out["agentcore"] = {"status": str(r.get("status"))}
        except Exception as exc:
            out["agentcore"] = {"error": err(exc)}
print(json.dumps(out))
"""


def cmd_awscheck(p):
    """p: {"state_dir", "python" (host mode: the environment's), "args": {"bucket", "runtime_id", "region"}}.
    Answers {"secret_env": names delivered at start, "probe": AWS_PROBE's answer} or {"error"}."""
    state_dir = os.path.expanduser(p["state_dir"])
    record, state, why, running = hostrecord.record_state(state_dir)
    if record is None or state == hostrecord.FOREIGN or not running:
        return {"error": f"no Ray of ours runs here ({why}): run `invoke cluster.up` first"}
    names = record.get("secret_env", [])
    payload = json.dumps(dict(p.get("args", {}), secret_env=names))
    if "container" in record:
        argv, env = ["docker", "exec", "-i", "--", record["container"], "python3", "-", payload], None
    else:
        words = hostrecord.proc_words(record["pid"], "environ")
        if words is None:
            return {"secret_env": names, "error": f"cannot read the environment of pid {record['pid']}"}
        env = dict(w.split("=", 1) for w in words if "=" in w)
        argv = [p.get("python") or "python3", "-", payload]
    try:
        r = subprocess.run(argv, input=AWS_PROBE, capture_output=True, text=True, env=env, timeout=p.get("timeout", 90))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"secret_env": names, "error": f"{argv[0]}: {exc}"}
    for line in reversed(r.stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                return {"secret_env": names, "probe": json.loads(line)}
            except ValueError:
                break
    return {"secret_env": names, "error": f"the probe exited {r.returncode}: {r.stderr.strip()[-300:]}"}
