"""Hostile input around secrets: names and values of secret_env, the env file the node agent is
told to read (path, kind, mode, content), and records naming secrets. Every refusal names the
field or file and never shows a value; nothing starts on a file that is not ours alone."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from slimeforge.cluster import credentials
from slimeforge.cluster.inventory import load_inventory
from slimeforge.errors import ConfigError
from slimeforge.scripts import hostrecord, node_agent

TOKEN = "f" * 32
VALUE = "hostile-secret-value-0123456789"


def inventory(tmp_path: Path, **over) -> Path:
    data = {"name": "lab", "mode": "host", "prefix": "/opt/sf", "secret_env": ["HF_TOKEN"],
            "hosts": [{"name": "a", "address": "10.0.0.1", "role": "head", "gpus": 0}]}
    data.update(over)
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("name", ["HF_TOKEN\n", "A=B", "--env", "HF TOKEN", "", "x" * 200, "HF_TOKEN;rm"])
def test_a_secret_name_that_is_no_variable_name_is_refused(tmp_path, name):
    with pytest.raises(ConfigError) as e:
        load_inventory(inventory(tmp_path, secret_env=[name]))
    assert any(p.where.startswith("secret_env") for p in e.value.problems), str(e.value)


def test_too_many_secret_names_are_refused_at_once(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_inventory(inventory(tmp_path, secret_env=[f"S{i}" for i in range(65)]))
    assert [p.where for p in e.value.problems] == ["secret_env"]


@pytest.mark.parametrize("value", [VALUE + "\nEVIL=1", VALUE + "\r", VALUE + "\x1b[2J", VALUE + "\u202e", "x" * 20000,
                                   VALUE + "\udcff"])
def test_a_value_that_cannot_be_one_env_file_line_is_refused_unseen(tmp_path, value):
    inv = load_inventory(inventory(tmp_path))
    with pytest.raises(ConfigError) as e:
        credentials.secret_values(inv, {"HF_TOKEN": value})
    assert "secret_env.0" in str(e.value) and VALUE not in str(e.value) and "x" * 100 not in str(e.value)


@pytest.mark.parametrize("key,value", [("GITHUB_PAT", VALUE), ("DB_PASSWD", VALUE), ("OPENAI_API_KEY", VALUE),
                                       ("HARMLESS", "ghp_" + "a" * 36),
                                       ("HARMLESS", "-----BEGIN RSA PRIVATE KEY-----")])
def test_host_env_refuses_secrets_by_name_and_by_shape(tmp_path, key, value):
    hosts = [{"name": "a", "address": "10.0.0.1", "role": "head", "gpus": 0, "env": {key: value}}]
    with pytest.raises(ConfigError) as e:
        load_inventory(inventory(tmp_path, secret_env=[], hosts=hosts))
    assert f"hosts.0 (a).env.{key}" in str(e.value) and value not in str(e.value)


# --- the env file the agent is told to read ------------------------------------------------------


def start(state: Path, env_file: str) -> dict:
    return node_agent.cmd_start({"state_dir": str(state), "argv": ["/nonexistent/ray", "start", "--block"],
                                 "token": TOKEN, "cluster": "lab",
                                 "env_file": env_file})


@pytest.mark.parametrize("where", ["../secrets-{t}.env", "/etc/passwd", "{s}/sub/secrets-{t}.env",
                                   "{s}/secrets-{t}.env.bak", "{s}/ray.json",
                                   "secrets-{t}.env"])
def test_an_env_file_outside_the_state_dir_or_misnamed_is_refused_and_left(tmp_path, where):
    state = tmp_path / "state"
    state.mkdir()
    victim = state / "ray.json"
    victim.write_text("{}")
    path = where.format(t=TOKEN, s=state)
    result = start(state, path)
    assert not result["ok"] and "env_file is not secrets-<token>.env" in result["error"]
    assert victim.exists()  # nothing of anyone else's is removed


def test_a_symlink_a_fifo_and_a_bad_line_start_nothing_and_are_removed(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    path = state / f"secrets-{TOKEN}.env"
    target = tmp_path / "elsewhere"
    target.write_text(f"HF_TOKEN={VALUE}\n")
    target.chmod(0o600)
    for make, why in ((lambda: path.symlink_to(target), "symlink"), (lambda: os.mkfifo(path, 0o600), "FIFO"),
                      (lambda: (path.write_text(f"HF_TOKEN {VALUE}\n"), path.chmod(0o600)),
                       "line 1 is not NAME=value")):
        make()
        result = start(state, str(path))
        assert not result["ok"] and why in result["error"] and VALUE not in json.dumps(result), result
        assert not os.path.lexists(path) and target.exists()
        assert not (state / hostrecord.RECORD).exists()


# --- records naming secrets ----------------------------------------------------------------------


@pytest.mark.parametrize("names", ["HF_TOKEN", [1], ["A=B"], [f"S{i}" for i in range(65)], [VALUE + "\n"], None])
def test_a_record_whose_secret_names_are_not_names_is_refused(names):
    rec = {"container": "c" * 64, "argv": ["docker", "run"], "token": TOKEN, "cluster": "lab", "started_at": 1.0,
           "secret_env": names}
    assert "secret_env" in (hostrecord.record_problem(rec) or "")
