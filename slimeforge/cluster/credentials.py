"""Credentials on a cluster: the secrets an operator names, carried to every host's Ray and
nowhere else, and the AWS credentials each host's job environment really has.

Two ways for a job on the cluster to hold credentials, each proved where the job runs:

- the hosts' own: an instance role (IMDS) or ~/.aws files of the ssh user (mounted into the
  container in container mode). Nothing travels; `check_hosts` proves them on every host.
- named secrets (`secret_env` in the inventory): `cluster.up` reads their values from ITS
  environment (`secret_values`: a missing one stops it before any host is touched), writes them
  over ssh's stdin into `secrets-<token>.env` (mode 0600, umask 077 before it exists) in each
  host's state directory (`put_secret_file`), and the node agent's `start` hands the file to
  `docker run --env-file` (container mode) or reads it into `ray start`'s environment (host
  mode), then removes it whatever happened. Every Ray worker inherits the values. Only the NAMES
  reach a dry run, an argv, a plan, the host record and this machine's cluster record.

Before a job is submitted (`invoke run --cluster`):
  recipe_secret_problems(recipe, inv)   static: every name in the recipe's secret_env is one the
                                        inventory delivers (else refused: the job would run without it)
  check_hosts(recipe, inv, ...)         live, every host in parallel, a table: the secrets its Ray
                                        was started with (host record) and set in the job's
                                        environment; then, in that same environment (the recorded
                                        `ray start`'s, or `docker exec` in the node's container),
                                        boto3's credential chain, sts:GetCallerIdentity, s3 HeadBucket
                                        on the recipe's bucket and AgentCore GetAgentRuntime. The
                                        submitting machine's credentials are never used for this.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError, Problem, SlimeforgeError
from ..proc import Runner
from ..run.recipe import Recipe, bucket_name
from ..schema import text_problem
from .agent import agent
from .bringup import Node, make_nodes, parallel
from .hosttable import SKIPPED, HostCellProblems, HostTable
from .inventory import Inventory

MAX_SECRET = 16384  # an AWS session token is about 1 KB; a whole key file does not belong here


def secret_values(inv: Inventory, environ: Mapping[str, str]) -> dict[str, str]:
    """The values of the inventory's secret_env from `environ`; ConfigError naming every name
    that is missing or cannot be one line of an env file (the value is never shown)."""
    problems: list[Problem] = []
    values: dict[str, str] = {}
    where = f"the environment of `invoke cluster.up {inv.path}`"
    for i, name in enumerate(inv.secret_env):
        value = environ.get(name)
        if not value:
            problems.append(Problem(f"secret_env.{i}",
                                    f"is not set in {where}: cluster.up reads each secret's value there and delivers "
                                    "it to every host",
                                    name,
                                    f"export {name}=... in that shell (or remove {name} from secret_env in "
                                    f"{inv.path})"))
            continue
        why = text_problem(value) if len(value) <= MAX_SECRET else f"is {len(value)} characters long"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            why = "is not valid UTF-8"
        if why:
            problems.append(Problem(f"secret_env.{i}",
                                    f"{name}'s value {why}; an env file holds one line of text per variable", name,
                                    f"a one-line value of at most {MAX_SECRET} characters (base64-encode a multi-line "
                                    "one)"))
            continue
        values[name] = value
    if problems:
        raise ConfigError(str(inv.path), problems)
    return values


# --- before a job is submitted ----------------------------------------------------------------


def fix_delivery(inv: Inventory, name: str) -> str:
    return (f"add {name} to secret_env in {inv.path}, export it, and run `invoke cluster.down {inv.path}` then "
            f"`invoke cluster.up {inv.path}` (the secrets reach Ray when it starts)")


def recipe_secret_problems(recipe: Recipe, inv: Inventory) -> list[Problem]:
    """A secret the recipe names that the cluster does not deliver would silently be missing in
    the job: refused, naming it and the fix."""
    have = ", ".join(inv.secret_env) or "none"
    return [Problem(f"secret_env.{i}",
                    f"is not delivered by cluster {inv.name}: its hosts' Ray gets only the inventory's secret_env "
                    f"({have})",
                    name, fix_delivery(inv, name))
            for i, name in enumerate(recipe.secret_env) if name not in inv.secret_env]


class CredentialsFailed(SlimeforgeError):
    """Some hosts lack a secret or working AWS credentials: refused before submitting (exit 2)."""

    def __init__(self, cluster: str, failures: dict[str, str], table: HostTable):
        self.failures = failures
        super().__init__(f"cluster {cluster}: credentials do not hold on {len(failures)} host(s) "
                         f"({', '.join(failures)}); nothing was submitted:\n\n"
                         + table.text())


def runtime_id(arn: str) -> str:
    return arn.rsplit("/", 1)[-1]


def region_of(arn: str) -> str:
    parts = arn.split(":")
    return parts[3] if len(parts) > 3 else ""


CREDENTIALS_FIX = ("give the host an instance role (IMDS), or ~/.aws/credentials for the ssh user (in container mode, "
                   "mounted "
                   "into the container), or list AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY under the inventory's "
                   "secret_env "
                   "and run cluster.up again")


def aws_problems(probe: dict[str, Any], recipe: Recipe, mode: str) -> tuple[list[str], str]:
    """(problems, detail) of one host's AWS probe answer, each problem with its fix."""
    if probe.get("error"):
        where = "the image (rebuild it with boto3)" if mode == "container" else ("the cluster's environment (`invoke "
                                                                                "install` brings it)")
        return [f"{probe['error']}; fix: install boto3 in {where}"], ""
    creds = probe.get("credentials") or {}
    if "error" in creds:
        return [f"AWS credentials: {creds['error']}; fix: {CREDENTIALS_FIX}"], ""
    identity = probe.get("identity") or {}
    if "error" in identity:
        return [f"AWS credentials from {creds.get('method')} are refused ({identity['error']}); fix: renew them or "
                f"{CREDENTIALS_FIX}"], ""
    problems = []
    bucket = bucket_name(recipe.s3_bucket)
    who = identity.get("arn", "?")
    s3 = probe.get("s3") or {}
    if "error" in s3:
        fix = (f"create it (`aws s3 mb s3://{bucket}`) or fix s3_bucket in the "
               "recipe" if "404" in s3["error"] or "NoSuchBucket" in s3["error"]
               else f"allow s3:ListBucket and s3:PutObject on {bucket} for {who}")
        problems.append(f"s3 bucket {bucket}: {s3['error']}; fix: {fix}")
    ac = probe.get("agentcore") or {}
    rid = runtime_id(recipe.agent_runtime_arn)
    note = ""
    if "error" in ac:
        if "AccessDenied" in ac["error"]:
            note = f", runtime {rid} not described (no bedrock-agentcore:GetAgentRuntime)"
        else:
            fix = ("deploy the agent, or fix agent_runtime_arn (account and region too)" if "NotFound" in ac["error"]
                   else f"allow bedrock-agentcore:GetAgentRuntime and InvokeAgentRuntime on it for {who}")
            problems.append(f"AgentCore runtime {rid}: {ac['error']}; fix: {fix}")
    elif ac.get("status") and ac["status"] != "READY":
        note = f", runtime {rid} is {ac['status']}, not READY"
    return problems, (f"{who} (from {creds.get('method')}): bucket {bucket} "
                     "ok") + ("" if note else f", runtime {rid} {ac.get('status', 'ok')}") + note


def check_hosts(recipe: Recipe, inv: Inventory, *, network: bool = True, runner: Runner | None = None,
                control_dir: str | None = None,
                stream=None, live_table: bool | None = None) -> tuple[HostTable, dict[str, str]]:
    """Every host, in the job's own environment there (see the module docstring): the table and
    {host: why} for the hosts that fail. network=False: the secrets alone, no AWS call."""
    nodes = make_nodes(inv, runner, control_dir)
    wanted = list(dict.fromkeys([*inv.secret_env, *recipe.secret_env]))
    table = HostTable(f"credentials of run {recipe.exp_id} on cluster {inv.name}", [(h.name,
                                                                                     h.role) for h in inv.hosts],
                      ["secrets", "aws"],
                      stream=stream, live=live_table)
    args: dict[str, str | bool] = {"aws": network}
    if network:
        args.update(bucket=bucket_name(recipe.s3_bucket), runtime_id=runtime_id(recipe.agent_runtime_arn),
                    region=region_of(recipe.agent_runtime_arn))
    answers: dict[str, dict[str, Any]] = {}
    said: dict[str, str] = {}
    secret_problems: dict[str, list[str]] = {}

    def secrets(node: Node) -> str:
        h = node.host
        answer = answers[node.name] = agent(node.ssh, h, "awscheck", {"state_dir": h.state_dir, "python": h.python,
                                                                      "args": args},
                                            timeout=inv.ssh_options.connect_timeout + 120)
        if answer.get("error") and "secret_env" not in answer:
            raise HostCellProblems([f"{answer['error']}"])
        delivered = answer.get("secret_env") or []
        problems = [f"{n}: not in this host's Ray (started without it); fix: "
                    f"{fix_delivery(inv, n)}" for n in wanted if n not in delivered]
        set_there = (answer.get("probe") or {}).get("secret_env_set")
        if set_there is not None:
            problems += [f"{n}: delivered but empty in the job's environment; fix: export a value and run "
                         "cluster.down, cluster.up again"
                         for n in delivered if n in wanted and n not in set_there]
        if answer.get("error"):
            problems.append(answer["error"])
        if problems:
            secret_problems[node.name] = problems
            raise HostCellProblems(problems)
        said[node.name] = ", ".join(wanted) + " in Ray's environment" if wanted else "no secrets named"
        return said[node.name]

    def aws(node: Node) -> str:
        probe = answers[node.name].get("probe") or {}
        problems, detail = aws_problems(probe, recipe, inv.mode)
        before = secret_problems.get(node.name, [])
        if problems:
            raise HostCellProblems(before + problems)  # one detail per row: the secrets' problems stay in it
        if before:
            return " | ".join(before) + "; AWS: " + detail
        return f"{said[node.name]}; {detail}"

    with table:
        failures = parallel(nodes, secrets, table, "secrets")
        if network:
            # A host's aws failure repeats its secrets problems: one message per host, every problem in it.
            failures.update(parallel([n for n in nodes if n.name in answers and "probe" in answers[n.name]], aws,
                                     table, "aws"))
        for node in nodes:
            if not network or "probe" not in answers.get(node.name, {}):
                if node.name in said:
                    table.set(node.name, "aws", SKIPPED,
                              f"{said[node.name]}; AWS not checked" + (" (--no-network)" if not network else ""))
                else:
                    table.set(node.name, "aws", SKIPPED)
    for node in nodes:
        node.ssh.close()
    return table, failures


def preflight(recipe: Recipe, inv: Inventory, say, *, network: bool = True, runner: Runner | None = None,
              control_dir: str | None = None,
              stream=None) -> None:
    """check_hosts, raising CredentialsFailed with the table when any host fails."""
    table, failures = check_hosts(recipe, inv, network=network, runner=runner, control_dir=control_dir, stream=stream,
                                  live_table=False if stream is not None else None)
    if failures:
        raise CredentialsFailed(inv.name, failures, table)
    say(f"[slimeforge] cluster {inv.name}: credentials hold on every host"
        + (" (AWS from each host's own job environment: S3 and AgentCore "
           "reached)" if network else " (secrets only: --no-network)"))
