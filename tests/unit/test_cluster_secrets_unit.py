"""Secrets on a cluster (cluster/credentials.py): named in the inventory, read from cluster.up's
environment, carried to each host in a 0600 file the node agent hands to `docker run --env-file`
or reads into `ray start`'s environment and removes; names only in argv lists, the dry run, the
records; a recipe's secret the cluster does not deliver is refused; each host's AWS probe answer
becomes a problem with its fix. The node agent's `start` runs a real (stand-in) `ray start` here."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from launch_support import make_recipe

from slimeforge.cluster import credentials, raycluster
from slimeforge.cluster.agent import PUT_SCRIPT, env_file_text, secret_file
from slimeforge.cluster.bringup import Node, node_problems
from slimeforge.cluster.inventory import load_inventory
from slimeforge.cluster.nodestart import ray_env, start_argv
from slimeforge.errors import ConfigError
from slimeforge.run.recipecheck import parse_recipe
from slimeforge.scripts import awscheck, hostrecord, node_agent

IMAGE = "reg.example:5000/slimeforge@sha256:" + "a" * 64
VALUE = "s3cr3t-VALUE-never-shown-0123456789"
TOKEN = "0123456789abcdef" * 2


def inventory(tmp_path: Path, **over) -> Path:
    data = {"name": "lab", "mode": "container", "image": IMAGE, "secret_env": ["HF_TOKEN", "AWS_SECRET_ACCESS_KEY"],
            "container": {"volumes": ["/data:/data", "/models:/models", "/ckpt:/root/checkpoints"],
                          "env": {"AWS_ENDPOINT_URL": "http://10.213.0.254:5000"}},
            "hosts": [{"name": "a", "address": "10.0.0.1", "role": "head", "gpus": 8}, {"name": "b",
                                                                                        "address": "10.0.0.2",
                                                                                        "gpus": 8}]}
    data.update(over)
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def recipe(tmp_path: Path, **over):
    fields = {"mode": "container", "model_dir": "/models/Qwen2.5-3B-Instruct", "data_path": "/data/train.jsonl",
              "checkpoint_dir": "/root/checkpoints/x", "num_gpus": 8, "num_nodes": 2, **over}
    return parse_recipe(make_recipe(tmp_path, **fields), "test")[0]


# --- the inventory ------------------------------------------------------------------------------


def test_secret_env_and_container_env_are_read(tmp_path):
    inv = load_inventory(inventory(tmp_path))
    assert inv.secret_env == ("HF_TOKEN", "AWS_SECRET_ACCESS_KEY")
    assert all(h.env["AWS_ENDPOINT_URL"] == "http://10.213.0.254:5000" for h in inv.hosts)


@pytest.mark.parametrize("section", ["hosts", "container", "ray"])
def test_a_secret_in_any_env_section_is_refused_without_its_value(tmp_path, section):
    over: dict = {"secret_env": []}
    if section == "hosts":
        over["hosts"] = [{"name": "a", "address": "10.0.0.1", "role": "head", "gpus": 8,
                          "env": {"AWS_SECRET_ACCESS_KEY": VALUE}}]
        where = "hosts.0 (a).env.AWS_SECRET_ACCESS_KEY"
    elif section == "container":
        over["container"] = {"env": {"WANDB_API_KEY": VALUE}}
        where = "container.env.WANDB_API_KEY"
    else:
        over["ray"] = {"env": {"HF_TOKEN": VALUE}}
        where = "ray.env.HF_TOKEN"
    with pytest.raises(ConfigError) as e:
        load_inventory(inventory(tmp_path, **over))
    assert [p.where for p in e.value.problems] == [where]
    assert "looks like a secret" in str(e.value) and "secret_env" in str(e.value) and VALUE not in str(e.value)


def test_a_value_shaped_like_a_credential_is_refused_under_any_name(tmp_path):
    hosts = [{"name": "a", "address": "10.0.0.1", "role": "head", "gpus": 8, "env": {"MY_ID": "AKIAABCDEFGHIJKLMNOP"}}]
    with pytest.raises(ConfigError) as e:
        load_inventory(inventory(tmp_path, hosts=hosts))
    assert "AKIAABCDEFGHIJKLMNOP" not in str(e.value) and "hosts.0 (a).env.MY_ID" in str(e.value)


def test_secret_env_names_by_grammar_once_and_never_with_a_value(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_inventory(inventory(tmp_path, secret_env=["HF_TOKEN", "HF_TOKEN", "PATH", "1X", "DEBUG_MODE"],
                                 ray={"env": {"DEBUG_MODE": "1"}}))
    got = {(p.where, p.message.split(";")[0]) for p in e.value.problems}
    assert got == {("secret_env.1", "is listed twice"), ("secret_env.2",
                                                         "is set by cluster.up itself and may not be replaced"),
                   ("secret_env.3", "is not an environment variable name"), ("secret_env.4", "is also set in ray.env")}


def test_container_env_in_host_mode_is_refused(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_inventory(inventory(tmp_path, mode="host", image=None, prefix="/opt/sf", container={"env": {"A": "1"}}))
    assert [p.where for p in e.value.problems] == ["container.env"]


# --- cluster.up: values from its environment, names everywhere else ------------------------------


def test_values_come_from_the_environment_and_a_missing_one_is_named(tmp_path):
    inv = load_inventory(inventory(tmp_path))
    assert credentials.secret_values(inv, {"HF_TOKEN": VALUE,
                                           "AWS_SECRET_ACCESS_KEY": "x" * 40}) == {"HF_TOKEN": VALUE,
                                                                                   "AWS_SECRET_ACCESS_KEY": "x" * 40}
    with pytest.raises(ConfigError) as e:
        credentials.secret_values(inv, {"HF_TOKEN": VALUE})
    (p,) = e.value.problems
    assert p.where == "secret_env.1" and p.value == "AWS_SECRET_ACCESS_KEY" and ("export "
                                                                                "AWS_SECRET_ACCESS_KEY") in p.accepted
    assert e.value.exit_code == 2


def test_a_value_that_is_not_one_line_is_refused_without_showing_it(tmp_path):
    inv = load_inventory(inventory(tmp_path))
    with pytest.raises(ConfigError) as e:
        credentials.secret_values(inv, {"HF_TOKEN": VALUE + "\nEVIL=1", "AWS_SECRET_ACCESS_KEY": "x" * 40})
    assert "HF_TOKEN" in str(e.value) and "newline" in str(e.value) and VALUE not in str(e.value)


def test_up_stops_before_any_host_when_a_secret_is_not_exported(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", VALUE)

    class NoRunner:
        dry_run = False

        def run(self, *a, **k):
            raise AssertionError("a host was touched")

    with pytest.raises(ConfigError, match="HF_TOKEN"):
        raycluster.up(inventory(tmp_path), runner=NoRunner())  # type: ignore[arg-type]


def test_container_argv_names_the_env_file_and_holds_no_value(tmp_path):
    inv = load_inventory(inventory(tmp_path))
    h = inv.hosts[1]
    path = secret_file("/home/u/.slimeforge/clusters/lab/b", TOKEN)
    argv = start_argv(inv, h, "10.0.0.2", "10.0.0.1", ray_env(h, "eth0", None), TOKEN, path)
    i = argv.index("--env-file")
    assert argv[i + 1] == f"/home/u/.slimeforge/clusters/lab/b/secrets-{TOKEN}.env" and argv.index(IMAGE) > i
    assert not any("HF_TOKEN" in a or "SECRET" in a for a in argv)


def test_the_dry_run_shows_names_only(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", VALUE)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", VALUE)
    text = "\n".join(raycluster.plan(inventory(tmp_path)))
    assert VALUE not in text
    assert "secrets      HF_TOKEN, AWS_SECRET_ACCESS_KEY (names only)" in text and "--env-file" in text


def test_a_running_node_with_other_secret_names_must_be_restarted(tmp_path):
    inv = load_inventory(inventory(tmp_path, mode="host", image=None, prefix="/opt/sf", container={}))
    h = inv.hosts[1]
    facts = {"gpus": {"list": []}, "route": {"dev": "eth0", "src": "10.0.0.2"}, "addresses": {"eth0": "10.0.0.2"},
             "path": "/usr/bin",
             "state_dir": "/home/u/s", "ports_busy": []}
    argv = start_argv(inv, replace(h, gpus=0), "10.0.0.2", "10.0.0.1", ray_env(h, "eth0", "/usr/bin"), TOKEN)
    rec = {"running": True, "token": TOKEN, "argv": argv, "secret_env": ["HF_TOKEN"]}
    node = Node(replace(h, gpus=0), ssh=None, facts={**facts, "record": rec})  # type: ignore[arg-type]
    (problem,) = node_problems(inv, node, "10.0.0.1")
    assert ("with the secrets HF_TOKEN, the inventory names AWS_SECRET_ACCESS_KEY, HF_TOKEN: run cluster.down "
           "first") in problem
    node.facts["record"] = {**rec, "secret_env": ["AWS_SECRET_ACCESS_KEY", "HF_TOKEN"]}
    assert node_problems(inv, node, "10.0.0.1") == []


# --- on the host: the file over stdin, the agent's start -----------------------------------------


def test_the_file_is_written_0600_from_stdin(tmp_path):
    path = str(tmp_path / "state" / f"secrets-{TOKEN}.env")
    old = os.umask(0o022)
    try:
        subprocess.run(["sh", "-c", PUT_SCRIPT, "sh", path], input=env_file_text({"HF_TOKEN": VALUE}), text=True,
                       check=True)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert node_agent.read_env_file(path) == {"HF_TOKEN": VALUE}


FAKE_RAY = """#!{python}
import os, sys, time
with open(os.environ["SF_TEST_OUT"], "w") as f:
    f.write(os.environ.get("HF_TOKEN", "<unset>"))
print("Ray runtime started.", flush=True)
time.sleep(60)
"""


@pytest.fixture
def fake_ray(tmp_path):
    ray = tmp_path / "bin" / "ray"
    ray.parent.mkdir()
    ray.write_text(FAKE_RAY.format(python=sys.executable))
    ray.chmod(0o755)
    return ray


def write_secrets(state: Path, values: dict[str, str], mode: int = 0o600) -> str:
    state.mkdir(parents=True, exist_ok=True)
    path = state / f"secrets-{TOKEN}.env"
    path.write_text(env_file_text(values))
    path.chmod(mode)
    return str(path)


def test_host_mode_start_puts_the_secrets_in_rays_environment_and_removes_the_file(tmp_path, fake_ray):
    state = tmp_path / "state"
    env_file = write_secrets(state, {"HF_TOKEN": VALUE})
    out = tmp_path / "seen"
    params = {"state_dir": str(state), "argv": [str(fake_ray), "start", "--block"], "token": TOKEN, "cluster": "lab",
              "env": {"SF_TEST_OUT": str(out)}, "marker": "Ray runtime started.", "timeout": 30, "env_file": env_file}
    result = node_agent.cmd_start(params)
    try:
        assert result["ok"], result
        assert not os.path.exists(env_file)
        for _ in range(100):
            if out.exists() and out.read_text():
                break
            time.sleep(0.05)
        assert out.read_text() == VALUE  # the process Ray's workers inherit from has it
        record_text = (state / hostrecord.RECORD).read_text()
        assert json.loads(record_text)["secret_env"] == ["HF_TOKEN"] and VALUE not in record_text
        assert VALUE not in (state / node_agent.LOG).read_text()
        assert hostrecord.read_record(str(state))["secret_env"] == ["HF_TOKEN"]
    finally:
        assert node_agent.cmd_stop({"state_dir": str(state), "timeout": 10})["ok"]


def test_a_file_others_can_read_starts_nothing_and_is_removed(tmp_path, fake_ray):
    state = tmp_path / "state"
    env_file = write_secrets(state, {"HF_TOKEN": VALUE}, mode=0o644)
    result = node_agent.cmd_start({"state_dir": str(state), "argv": [str(fake_ray), "start", "--block"],
                                   "token": TOKEN, "cluster": "lab",
                                   "env_file": env_file})
    assert not result["ok"] and "mode 0600" in result["error"] and VALUE not in json.dumps(result)
    assert not os.path.exists(env_file) and not (state / hostrecord.RECORD).exists()


def test_container_start_without_env_file_in_argv_is_refused(tmp_path):
    state = tmp_path / "state"
    env_file = write_secrets(state, {"HF_TOKEN": VALUE})
    argv = ["docker", "run", "--label", f"{hostrecord.LABEL_CLUSTER}=lab", "--label",
            f"{hostrecord.LABEL_TOKEN}={TOKEN}", IMAGE]
    result = node_agent.cmd_start({"state_dir": str(state), "argv": argv, "token": TOKEN, "cluster": "lab",
                                   "container": True, "env_file": env_file})
    assert not result["ok"] and "--env-file" in result["error"] and not os.path.exists(env_file)


# --- invoke run --cluster: a recipe's secret the cluster does not deliver -------------------------


def test_a_recipe_secret_the_cluster_does_not_deliver_is_refused(tmp_path):
    inv = load_inventory(inventory(tmp_path, secret_env=["AWS_SECRET_ACCESS_KEY"]))
    (p,) = credentials.recipe_secret_problems(recipe(tmp_path, image=IMAGE, secret_env=["HF_TOKEN"]), inv)
    assert p.where == "secret_env.0" and p.value == "HF_TOKEN" and "is not delivered by cluster lab" in p.message
    assert "add HF_TOKEN to secret_env in" in p.accepted and "cluster.up" in p.accepted
    assert credentials.recipe_secret_problems(recipe(tmp_path, image=IMAGE, secret_env=["AWS_SECRET_ACCESS_KEY"]),
                                              inv) == []


def test_cluster_env_check_refuses_it_with_exit_2(tmp_path):
    from slimeforge.cluster import runcheck
    from slimeforge.run.targets import jobsubmit

    cluster = runcheck.cluster_env(str(inventory(tmp_path, secret_env=[])), dry_run=True)
    with pytest.raises(ConfigError) as e:
        jobsubmit.on_cluster(recipe(tmp_path, secret_env=["HF_TOKEN"]), cluster, mode=None, prefix=None, image=None,
                             dry_run=True, stack=None)
    assert e.value.exit_code == 2 and "HF_TOKEN" in str(e.value) and "is not delivered by cluster lab" in str(e.value)


# --- each host's AWS probe, as problems with their fixes -----------------------------------------


def test_probe_answers_become_problems_with_fixes(tmp_path):
    r = recipe(tmp_path, image=IMAGE)
    ok = {"boto3": "1.35", "credentials": {"method": "iam-role"},
          "identity": {"arn": "arn:aws:sts::123456789012:assumed-role/gpu/i-1"},
          "s3": {"ok": True}, "agentcore": {"status": "READY"}}
    problems, detail = credentials.aws_problems(ok, r, "container")
    assert problems == [] and "from iam-role" in detail
    (p,), _ = credentials.aws_problems({"error": "boto3 is not installed in the job's environment here"}, r,
                                       "container")
    assert "rebuild it with boto3" in p
    (p,), _ = credentials.aws_problems({"credentials": {"error": "no AWS credentials"}}, r, "host")
    assert "instance role" in p and "secret_env" in p
    bad = {**ok, "s3": {"error": "403: Forbidden"},
           "agentcore": {"error": "ResourceNotFoundException: no such runtime"}}
    problems, _ = credentials.aws_problems(bad, r, "host")
    assert len(problems) == 2 and "allow s3:ListBucket" in problems[0] and "deploy the agent" in problems[1]


def test_the_probe_reports_which_named_secrets_are_set_without_aws(tmp_path):
    env = {"PATH": os.environ["PATH"], "HF_TOKEN": VALUE}
    r = subprocess.run([sys.executable, "-", json.dumps({"aws": False, "secret_env": ["HF_TOKEN", "WANDB_API_KEY"]})],
                       input=awscheck.AWS_PROBE,
                       capture_output=True, text=True, env=env, check=True)
    assert json.loads(r.stdout) == {"secret_env_set": ["HF_TOKEN"]}


def test_a_record_with_secret_names_reads_and_one_with_anything_else_is_refused():
    rec = {"container": "c" * 64, "argv": ["docker", "run"], "token": TOKEN, "cluster": "lab", "started_at": 1.0}
    assert hostrecord.record_problem(rec) is None
    assert hostrecord.record_problem({**rec, "secret_env": ["HF_TOKEN"]}) is None
    assert "secret_env" in hostrecord.record_problem({**rec, "secret_env": ["HF_TOKEN=" + VALUE]})


def test_container_awscheck_runs_the_probe_inside_the_nodes_container(monkeypatch):
    cid = "c" * 64
    record = {"container": cid, "argv": ["docker", "run"], "token": TOKEN, "cluster": "lab", "started_at": 1.0,
              "secret_env": ["HF_TOKEN"]}
    monkeypatch.setattr(hostrecord, "record_state", lambda state_dir: (record, hostrecord.OURS, "", True))
    calls = []

    def run(argv, **kw):
        calls.append((argv, kw))
        return subprocess.CompletedProcess(argv, 0, json.dumps({"secret_env_set": ["HF_TOKEN"]}) + "\n", "")

    monkeypatch.setattr(node_agent.subprocess, "run", run)
    answer = node_agent.cmd_awscheck({"state_dir": "/s", "args": {"aws": False}})
    assert answer == {"secret_env": ["HF_TOKEN"], "probe": {"secret_env_set": ["HF_TOKEN"]}}
    ((argv, kw),) = calls
    # In the container, with its environment (docker exec inherits the container's, --env-file's included).
    assert argv == ["docker", "exec", "-i", "--", cid, "python3", "-", json.dumps({"aws": False,
                                                                                   "secret_env": ["HF_TOKEN"]})]
    assert kw["input"] == awscheck.AWS_PROBE and kw["env"] is None


def test_invoke_run_refuses_a_recipe_secret_the_cluster_does_not_deliver(tmp_path):
    """Issue 40.6 through the real command line: exit 2, the secret and the fix named, nothing written."""
    inv = inventory(tmp_path, secret_env=["AWS_SECRET_ACCESS_KEY"])
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(make_recipe(tmp_path, mode="container", model_dir="/models/m",
                                               data_path="/data/train.jsonl",
                                               checkpoint_dir="/root/checkpoints/x", num_gpus=8, num_nodes=2,
                                               secret_env=["HF_TOKEN"])))
    r = subprocess.run([sys.executable, "-m", "invoke", "run", str(path), "--cluster", str(inv), "--out",
                        str(tmp_path / "run"), "--dry-run"],
                       cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "secret_env.0" in r.stderr and "HF_TOKEN" in r.stderr and ("is not delivered by cluster "
                                                                     "lab") in r.stderr and "cluster.up" in r.stderr
    assert not (tmp_path / "run").exists()


def test_the_dry_run_says_which_secret_is_not_exported(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", VALUE)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    text = "\n".join(raycluster.plan(inventory(tmp_path)))
    assert "NOT exported here: AWS_SECRET_ACCESS_KEY (cluster.up refuses until they are)" in text and VALUE not in text


def test_a_local_launch_refuses_a_secret_not_set_here_and_address_refuses_any(tmp_path):
    from slimeforge.run.launch import LaunchRequest, missing_secrets, resolve

    r = recipe(tmp_path, mode="host", secret_env=["HF_TOKEN"])
    (p,) = missing_secrets(r, {})
    assert p.where == "secret_env.0" and p.value == "HF_TOKEN" and "export HF_TOKEN" in p.accepted
    assert missing_secrets(r, {"HF_TOKEN": VALUE}) == []
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(make_recipe(tmp_path, secret_env=["HF_TOKEN"])))
    with pytest.raises(ConfigError, match="secret_env.0.*HF_TOKEN"):
        resolve(LaunchRequest(recipe=str(path)), dry_run=False, environ={})
    with pytest.raises(ConfigError) as e:
        resolve(LaunchRequest(recipe=str(path), address="http://10.0.0.1:8265"), dry_run=True,
                environ={"HF_TOKEN": VALUE})
    assert ("secrets travel only to a cluster cluster.up brought up with "
           "them") in str(e.value) and VALUE not in str(e.value)


def test_check_hosts_names_each_failing_host_with_every_problem(tmp_path, monkeypatch):
    inv = load_inventory(inventory(tmp_path, secret_env=["HF_TOKEN"]))
    ok = {"boto3": "1.35", "credentials": {"method": "iam-role"},
          "identity": {"arn": "arn:aws:sts::123456789012:assumed-role/gpu/i-1"},
          "s3": {"ok": True}, "agentcore": {"status": "READY"}}
    answers = {"a": {"secret_env": ["HF_TOKEN"], "probe": {**ok, "secret_env_set": ["HF_TOKEN"]}},
               # b: Ray started before HF_TOKEN was in secret_env, and no AWS credentials of its own
               "b": {"secret_env": [], "probe": {"secret_env_set": [], "boto3": "1.35",
                                                 "credentials": {"error": "no AWS credentials"}}}}
    seen = []

    def fake_agent(ssh, host, command, params, timeout):
        seen.append((host.name, command, params))
        return answers[host.name]

    monkeypatch.setattr(credentials, "agent", fake_agent)
    table, failures = credentials.check_hosts(recipe(tmp_path, image=IMAGE, secret_env=["HF_TOKEN"]), inv,
                                              stream=io.StringIO(), live_table=False)
    assert list(failures) == ["b"], table.text()
    assert "HF_TOKEN: not in this host's Ray" in failures["b"] and "cluster.down" in failures["b"]
    text = table.text()
    a = next(line for line in text.splitlines() if line.startswith("a "))
    assert "HF_TOKEN in Ray's environment; arn:aws:sts::123456789012:assumed-role/gpu/i-1 (from iam-role)" in a
    b = next(line for line in text.splitlines() if line.startswith("b "))
    assert "FAILED" in b and "no AWS credentials" in b
    assert {c for _, c, _ in seen} == {"awscheck"}
    params = seen[0][2]["args"]
    assert params["bucket"] == "sf-launch-test-bucket" and params["aws"] is True and "region" in params
