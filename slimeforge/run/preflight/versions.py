"""Versions: Ray and Python must match between this client and the cluster it submits to."""

from __future__ import annotations

import json
import sys

from ... import paths
from ..headstate import dashboard_url
from .findings import Context, Finding, check, describe_failure, error, ok, warning
from .toolfix import known_fix


def local_versions() -> tuple[str, str]:
    import importlib.metadata

    return importlib.metadata.version("ray"), ".".join(str(x) for x in sys.version_info[:3])


def version_findings(theirs: tuple[str, str] | Exception, mine: tuple[str, str], where: str) -> list[Finding]:
    if isinstance(theirs, Exception):
        return [error("versions", f"cannot read the Ray and Python versions of {where}: {describe_failure(theirs)}",
                      known_fix(theirs, "install the same image (or install prefix) on every host"))]
    out = []
    if theirs[0] != mine[0]:
        out.append(error("versions", f"Ray {theirs[0]} on {where}, {mine[0]} here",
                         f"use Ray {mine[0]} everywhere (the same image or install on every host)"))
    # Ray pickles functions between processes: the minor version must match, patch may differ.
    if theirs[1].split(".")[:2] != mine[1].split(".")[:2]:
        out.append(error("versions", f"Python {theirs[1]} on {where}, {mine[1]} here",
                         f"use Python {'.'.join(mine[1].split('.')[:2])} everywhere"))
    return out or [ok("versions", f"Ray {theirs[0]}, Python {theirs[1]} on {where} match this client")]


def cluster_versions(address: str) -> tuple[str, str]:
    """(Ray, Python) of the cluster at a dashboard address, through its HTTP API."""
    import urllib.request

    with urllib.request.urlopen(dashboard_url(address).rstrip("/") + "/api/version", timeout=10) as resp:
        ray_v = json.loads(resp.read())["ray_version"]
    py_v = cluster_python(address)
    return ray_v, py_v


def cluster_python(address: str) -> str:
    """The Python version of the cluster's head node, from the dashboard's node list."""
    import urllib.request

    with urllib.request.urlopen(dashboard_url(address).rstrip("/") + "/nodes?view=summary", timeout=10) as resp:
        doc = json.loads(resp.read())
    for node in doc.get("data", {}).get("summary", []):
        ver = node.get("raylet", {}).get("pythonVersion") or node.get("pythonVersion")
        if ver:
            return ver
    return "?"


def environment_versions(ctx: Context) -> list[Finding]:
    """In place: the environment the job runs in (its interpreter, read with env_probe.py) has Ray."""
    python = ctx.python or "python3"
    try:
        out = ctx.runner.run([python, str(paths.SCRIPTS / "env_probe.py")], step="versions (this environment)",
                             timeout=60).stdout
        found = json.loads(out.strip().splitlines()[-1])
    except Exception as exc:  # noqa: BLE001 - reported as the finding
        return [error("versions", f"cannot read the versions of {python}: {describe_failure(exc)}",
                      "run in the environment where slime is installed (slime's container, or the bare-metal "
                      "install's)")]
    if not isinstance(found, dict) or not found.get("ray"):
        return [error("versions", f"Ray is not installed in {python}, which would start the head and run the job",
                      "pip install 'ray[default]' into this environment, as slime's container has it")]
    return [ok("versions",
               f"Ray {found['ray']}, Python {found.get('python')} in this environment ({python}): the head starts "
               "with them")]


def image_versions(ctx: Context) -> list[Finding]:
    """Container mode: the image's python3 (launch.sh's there) and the Ray beside it, from the probe."""
    if blocker := ctx.image_blocker("versions"):
        return [blocker]
    facts = ctx.image_facts()
    if isinstance(facts, Exception):  # the probe ran in the image and failed: the flags check says how
        return [warning("versions", f"the Ray and Python of {ctx.image} cannot be learned: {describe_failure(facts)}",
                        "an image whose python3 is the one that runs slime (launch.sh runs python3 and ray there)")]
    if not facts.ray:
        return [error("versions",
                      f"Ray is not installed beside python3 ({facts.executable}) in {ctx.image}, which would start "
                      "the head and run the job",
                      "an image with Ray (pip install 'ray[default]' into the environment of its python3), as slime's "
                      "image has")]
    return [ok("versions",
               f"Ray {facts.ray}, Python {facts.python} in {ctx.image} (image {facts.short_id}): the head starts with "
               "them")]


@check("versions", "network")
def check_versions(ctx: Context) -> list[Finding]:
    """The Ray and Python versions of this client match the cluster's (with --address)."""
    if not ctx.address:
        if ctx.in_place:
            return environment_versions(ctx)
        if ctx.mode == "container" and ctx.image:
            return image_versions(ctx)
        return [ok("versions", "no --address: the launch starts its own head with this install's Ray")]
    try:
        theirs: tuple[str, str] | Exception = cluster_versions(ctx.address)
    except Exception as exc:  # noqa: BLE001
        return [error("versions", f"cannot reach the Ray dashboard at {ctx.address}: {exc}",
                      "start the cluster (`invoke cluster.up`) or fix --address (the dashboard's http://HOST:PORT)")]
    mine = local_versions()
    where = f"the cluster at {ctx.address}"
    if isinstance(theirs, tuple) and theirs[1] == "?":
        # The dashboard does not report Python; the cluster bootstrap checks it on each host
        # (the environment phase of `invoke cluster.up`).
        if theirs[0] != mine[0]:
            return version_findings((theirs[0], mine[1]), mine, where)
        return [ok("versions",
                   f"Ray {theirs[0]} on {where} matches this client (its Python is not reported by the dashboard)")]
    return version_findings(theirs, mine, where)


