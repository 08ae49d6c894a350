"""The node agent's `runcheck` command, run as the hosts run it (`python3 - runcheck JSON`, the
agent's source on stdin) against real directories: what it finds, and the one-filesystem marker."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from slimeforge.cluster.agent import agent_source

OLDEST = Path("/root/.pyenv/versions/3.8.18/bin/python")  # the oldest python3 the agent supports


def runcheck(params: dict, python: str = sys.executable) -> dict:
    r = subprocess.run([python, "-", "runcheck", json.dumps(params)], input=agent_source(), capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture
def model(tmp_path: Path) -> Path:
    d = tmp_path / "models" / "m"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100, "architectures": ["X"]}))
    (d / "model-00001.safetensors").write_bytes(b"\0" * 1000)
    (d / "pytorch_model.bin").write_bytes(b"\0" * 24)
    (d / "tokenizer.json").write_text("{}")  # not a weight
    return d


def test_model_data_and_checkpoint_found(tmp_path, model):
    data = tmp_path / "train.jsonl"
    data.write_text("{}\n")
    token = secrets.token_hex(16)
    ck = tmp_path / "ckpt" / "exp"
    out = runcheck({"paths": [{"what": "model_dir", "path": str(model), "kind": "model"},
                              {"what": "data_path", "path": str(data), "kind": "file"}],
                    "checkpoint": {"dir": str(ck), "token": token, "write": True}})
    assert out["problems"] == []
    assert out["weights_bytes"] == 1024  # safetensors + bin, not the tokenizer
    assert out["config"] == {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100}
    assert out["free_bytes"] > 0
    assert (ck / f".slimeforge-fs-{token}").read_text() == token  # the head's marker, for the others to read
    # Another host reads it (same filesystem), then the head removes it.
    assert runcheck({"checkpoint": {"dir": str(ck), "token": token, "read": True}})["problems"] == []
    assert runcheck({"checkpoint": {"dir": str(ck), "token": token, "remove": True}})["problems"] == []
    assert sorted(os.listdir(ck)) == []  # no probe, no marker left behind


def test_each_missing_thing_is_named(tmp_path, model):
    (model / "config.json").unlink()
    token = secrets.token_hex(16)
    out = runcheck({"paths": [{"what": "model_dir", "path": str(model), "kind": "model"},
                              {"what": "model_dir", "path": str(tmp_path / "nowhere"), "kind": "model"},
                              {"what": "data_path", "path": str(tmp_path / "none.jsonl"), "kind": "file"},
                              {"what": "slime_dir", "path": str(tmp_path / "slime"), "kind": "dir"}],
                    "checkpoint": {"dir": str(tmp_path / "ck"), "token": token, "read": True}})
    assert [(p["what"], p["why"]) for p in out["problems"]] == [
        ("model_dir", "has no readable config.json here"),
        ("model_dir", "no such directory here"),
        ("data_path", "no such file here"),
        ("slime_dir", "no such directory here"),
        ("checkpoint_dir", "is not the head's filesystem: the marker the head wrote there is not here"),
    ]


def test_unwritable_checkpoint_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a file where a directory must be: makedirs fails, for root too
    out = runcheck({"checkpoint": {"dir": str(blocker / "ck"), "token": secrets.token_hex(16), "write": True}})
    assert [p["what"] for p in out["problems"]] == ["checkpoint_dir"]
    assert out["problems"][0]["why"].startswith("is not writable here")


def test_bad_token_is_refused_before_anything_is_written(tmp_path):
    out = runcheck({"checkpoint": {"dir": str(tmp_path / "ck"), "token": "../../x", "write": True}})
    assert out["problems"][0]["why"] == "is not an absolute path with a 32-hex-digit token"
    assert not (tmp_path / "ck").exists()


@pytest.mark.skipif(not OLDEST.exists(), reason="python 3.8 is not installed here")
def test_runs_on_python_38(tmp_path, model):
    out = runcheck({"paths": [{"what": "model_dir", "path": str(model), "kind": "model"}]}, python=str(OLDEST))
    assert out["problems"] == [] and out["weights_bytes"] == 1024
