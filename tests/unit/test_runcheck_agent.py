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
from slimeforge.scripts.pathcheck import UNUSABLE_PATH

OLDEST = Path("/root/.pyenv/versions/3.8.18/bin/python")  # the oldest python3 the agent supports


def runcheck(params: dict, python: str = sys.executable) -> dict:
    r = subprocess.run([python, "-", "runcheck", json.dumps(params)], input=agent_source(), capture_output=True,
                       text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture
def model(tmp_path: Path) -> Path:
    d = tmp_path / "models" / "m"
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100,
                                               "architectures": ["X"]}))
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


# --- whatever the host holds, the agent answers JSON (issue 40) -------------------------------


def run_agent(command: str, params: dict) -> dict:
    r = subprocess.run([sys.executable, "-", command, json.dumps(params)], input=agent_source(), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr  # no traceback: one JSON line on stdout
    return json.loads(r.stdout.strip().splitlines()[-1])


def whys(out: dict) -> list[str]:
    return [p["why"] for p in out["problems"]]


def test_the_weight_files_are_listed_by_name_and_size(model):
    out = runcheck({"paths": [{"what": "model_dir", "path": str(model), "kind": "model"}]})
    assert out["weights"] == {"model-00001.safetensors": 1000, "pytorch_model.bin": 24}


@pytest.mark.parametrize("config", [
    "[" * 100_000,  # deeper than the parser's recursion
    '"a string"', "[1, 2]", "null", '{"hidden_size": NaN}', "\xff\xfe", "",
])
def test_a_config_that_is_not_a_json_object_is_a_problem(model, config):
    (model / "config.json").write_bytes(config.encode("latin-1"))
    out = run_agent("runcheck", {"paths": [{"what": "model_dir", "path": str(model), "kind": "model"}]})
    assert len(out["problems"]) == 1 and out["problems"][0]["why"].startswith("config.json is not")
    assert out["config"] is None and out["weights_bytes"] == 1024


def test_config_values_of_the_wrong_type_are_left_out(model):
    (model / "config.json").write_text('{"hidden_size": "64", "num_hidden_layers": 1e400, "vocab_size": [1], '
                                       '"intermediate_size": true, '
                                       '"tie_word_embeddings": 1}')
    out = run_agent("runcheck", {"paths": [{"what": "model_dir", "path": str(model), "kind": "model"}]})
    assert out["problems"] == [] and out["config"] == {}


def test_a_config_fifo_never_blocks(model):
    (model / "config.json").unlink()
    os.mkfifo(model / "config.json")
    out = run_agent("runcheck", {"paths": [{"what": "model_dir", "path": str(model), "kind": "model"}]})
    assert whys(out) == ["has no readable config.json here"]


def test_a_weights_symlink_loop_and_a_dangling_link_are_problems(model):
    (model / "loop.safetensors").symlink_to("loop.safetensors")
    (model / "gone.bin").symlink_to(model / "nowhere")
    (model / "real.pt").symlink_to(model / "pytorch_model.bin")  # a Hugging Face snapshot is symlinks: followed
    out = run_agent("runcheck", {"paths": [{"what": "model_dir", "path": str(model), "kind": "model"}]})
    assert sorted(whys(out)) == ["has a weights file gone.bin that cannot be read: No such file or directory",
                                 "has a weights file loop.safetensors that cannot be read: Too many levels of "
                                 "symbolic links"]
    assert out["weights"] == {"model-00001.safetensors": 1000, "pytorch_model.bin": 24, "real.pt": 24}


def test_a_weights_name_that_is_not_plain_text_is_a_problem(model):
    (model / "a\nb.safetensors").write_bytes(b"x")
    out = run_agent("runcheck", {"paths": [{"what": "model_dir", "path": str(model), "kind": "model"}]})
    assert whys(out) == ["has a weights file whose name is not plain text: 'a\\nb.safetensors'"]


def test_a_nul_in_a_path_is_a_problem(tmp_path):
    out = run_agent("runcheck", {"paths": [{"what": "model_dir", "path": f"{tmp_path}/m\0x", "kind": "model"},
                                           {"what": "data_path", "path": "/d\0", "kind": "file"}],
                                 "checkpoint": {"dir": f"{tmp_path}/c\0k", "token": secrets.token_hex(16),
                                                "write": True}})
    assert [p["what"] for p in out["problems"]] == ["model_dir", "data_path", "checkpoint_dir"]
    assert whys(out)[:2] == [UNUSABLE_PATH] * 2


def test_a_failing_command_still_answers_json(tmp_path):
    out = run_agent("runcheck", {"paths": [{"what": "model_dir"}]})  # no path: the agent's own failure, as JSON
    assert out["ok"] is False and out["error"].startswith("node agent runcheck failed on this host: KeyError")


# --- nodes: the dashboard's node list, whatever it sends ----------------------------------------


@pytest.fixture
def dashboard():
    """A local HTTP server answering /api/v0/nodes with whatever body the test sets."""
    import http.server
    import threading

    state = {"body": b""}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.end_headers()
            self.wfile.write(state["body"])

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}/api/v0/nodes"
    finally:
        server.shutdown()
        server.server_close()


def listed(*nodes) -> bytes:
    return json.dumps({"data": {"result": {"result": list(nodes)}}}).encode()


GOOD = {"node_id": "ab12", "node_ip": "10.0.0.1", "is_head_node": True, "state": "ALIVE",
        "resources_total": {"GPU": 2.0, "CPU": 8.0}}


def test_nodes_keeps_readable_nodes_and_says_why_others_are_left_out(dashboard):
    state, url = dashboard
    state["body"] = listed(GOOD, {"state": "ALIVE"}, {**GOOD, "node_ip": 7}, {**GOOD, "resources_total": {"GPU": "2"}},
                           {**GOOD, "resources_total": {"GPU": -1}}, {**GOOD, "state": "alive; rm"}, "node", None)
    out = run_agent("nodes", {"url": url})
    assert out["nodes"] == [{"node_id": "ab12", "node_ip": "10.0.0.1", "is_head_node": True, "state": "ALIVE",
                             "resources_total": {"GPU": 2}}]
    assert [o.split(" ", 2)[1] for o in out["odd"]] == ["1", "2", "3", "4", "5", "6", "7"]


@pytest.mark.parametrize("body", [b"<html>502</html>", b"[]", b'{"data": {"result": {"result": {}}}}',
                                  b'{"data": null}',
                                  b"[" * 100_000, b'{"data": NaN}', b"\xff", b""])
def test_a_body_that_is_not_a_node_list_is_an_error(dashboard, body):
    state, url = dashboard
    state["body"] = body
    out = run_agent("nodes", {"url": url})
    assert set(out) == {"error"} and out["error"].startswith(url + ": ")


def test_gate_reads_a_raw_list_with_odd_entries():
    from slimeforge.scripts.raynodes import gate

    nodes = [None, "x", {"node_ip": "10.0.0.2", "state": "DEAD", "resources_total": {"GPU": 2}},
             {**GOOD, "resources_total": {"GPU": 1e400}}, {**GOOD, "node_ip": "10.0.0.3"}]
    assert gate(nodes, {"10.0.0.1": 2, "10.0.0.2": 2, "10.0.0.3": 2}) == {
        "10.0.0.1": (False, "no ALIVE node with IP 10.0.0.1"),
        "10.0.0.2": (False, "no ALIVE node with IP 10.0.0.2 (Ray lists it DEAD)"),
        "10.0.0.3": (True, "10.0.0.3 ALIVE, 2 GPU(s)"),
    }
    assert gate({"not": "a list"}, {"10.0.0.1": 1})["10.0.0.1"][0] is False


def test_a_path_with_a_lone_surrogate_is_a_problem(tmp_path):
    out = run_agent("runcheck", {"paths": [{"what": "model_dir", "path": f"{tmp_path}/m\ud800", "kind": "model"},
                                           {"what": "data_path", "path": f"{tmp_path}/d\ud800", "kind": "file"}]})
    assert whys(out) == [UNUSABLE_PATH] * 2


def test_a_marker_that_is_a_directory_is_left_alone(tmp_path):
    token = secrets.token_hex(16)
    (tmp_path / f".slimeforge-fs-{token}").mkdir()
    out = run_agent("runcheck", {"checkpoint": {"dir": str(tmp_path), "token": token, "remove": True}})
    assert out["problems"] == [] and (tmp_path / f".slimeforge-fs-{token}").is_dir()
