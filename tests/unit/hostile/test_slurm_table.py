"""The allocation's per-node table (slurm_agent slurm-table, issue 40): every node's slurm-check
answer is input. Classes: not JSON, not an object, a row without `node`, a node twice (two lines or
a key twice), a node not in the allocation, a node missing, a field of the wrong type or out of
bounds, two nodes under one IP (the health gate counts by IP), control characters, a file that is
not a regular file or is too large. In every case the gate fails (exit 1, no Ray started: no head IP
written), the table names the node and what it sent, and nothing raises."""

from __future__ import annotations

import json
import os

import pytest

from slimeforge.scripts import slurm_agent

NODES = ["n1", "n2", "n3"]


def ok(node: str, ip: str, **over) -> str:
    return json.dumps({"node": node, "ip": ip, "dev": "eth0", "gpus_seen": 8, "problems": [], **over})


GOOD = [ok("n1", "10.0.0.1"), ok("n2", "10.0.0.2"), ok("n3", "10.0.0.3")]


def table(tmp_path, monkeypatch, lines, gpus=8, nodes=NODES, raw: bytes | None = None):
    monkeypatch.setenv("SF_STEP_DIR", str(tmp_path))
    monkeypatch.setenv("SF_NODES", " ".join(nodes))
    path = tmp_path / "checks.jsonl"
    if raw is not None:
        path.write_bytes(raw)
    elif lines is not None:
        path.write_text("\n".join(lines) + "\n")
    return slurm_agent.cmd_slurm_table({"gpus": gpus})


def test_well_formed_answers_pass(tmp_path, monkeypatch):
    result = table(tmp_path, monkeypatch, GOOD)
    assert result == {"ok": True, "failed": []}
    assert json.loads((tmp_path / "nodes.json").read_text()) == {"n1": "10.0.0.1", "n2": "10.0.0.2", "n3": "10.0.0.3"}
    assert (tmp_path / "head_ip").read_text() == "10.0.0.1\n"


HOSTILE = {
    "not JSON": (["{node: n3"], ["n3"]),
    "truncated JSON": ([ok("n3", "10.0.0.3")[:-5]], ["n3"]),
    "not an object": (['["n3", "10.0.0.3"]'], ["n3"]),
    "row without node": ([json.dumps({"ip": "10.0.0.3", "dev": "eth0", "gpus_seen": 8, "problems": []})], ["n3"]),
    "node of the wrong type": ([ok(["n3"], "10.0.0.3")], ["n3"]),  # type: ignore[arg-type]
    "node not in the allocation": ([ok("n9", "10.0.0.3")], ["n3"]),
    "node name with a newline": ([ok("n3\nn4", "10.0.0.3")], ["n3"]),
    "same node twice": ([ok("n3", "10.0.0.3"), ok("n3", "10.0.0.4")], ["n3"]),
    "same node twice, second failing": ([ok("n3", "10.0.0.3"), ok("n3", "10.0.0.3", problems=["no GPU"])], ["n3"]),
    "a key twice": (['{"node": "n3", "node": "n2", "ip": "10.0.0.3", "dev": "eth0", "gpus_seen": 8, "problems": []}'],
                    ["n3"]),
    "problems not a list": ([ok("n3", "10.0.0.3", problems="none")], ["n3"]),
    "problems of numbers": ([ok("n3", "10.0.0.3", problems=[1])], ["n3"]),
    "no ip": ([ok("n3", None)], ["n3"]),  # type: ignore[arg-type]
    "ip not an address": ([ok("n3", "10.0.0.3; rm -rf /")], ["n3"]),
    "dev with shell syntax": ([ok("n3", "10.0.0.3", dev="$(reboot)")], ["n3"]),
    "gpus_seen a string": ([ok("n3", "10.0.0.3", gpus_seen="8")], ["n3"]),
    "gpus_seen a bool": ([ok("n3", "10.0.0.3", gpus_seen=True)], ["n3"]),
    "gpus_seen negative": ([ok("n3", "10.0.0.3", gpus_seen=-1)], ["n3"]),
    "gpus_seen too few": ([ok("n3", "10.0.0.3", gpus_seen=2)], ["n3"]),
    "gpus_seen NaN": (['{"node": "n3", "ip": "10.0.0.3", "dev": "eth0", "gpus_seen": NaN, "problems": []}'], ["n3"]),
    "gpus_seen huge": (['{"node": "n3", "ip": "10.0.0.3", "dev": "eth0", "gpus_seen": '
                        '1' + "0" * 5000 + ', "problems": []}'], ["n3"]),
    "same IP as another node": ([ok("n3", "10.0.0.2")], ["n2", "n3"]),
    "deep JSON": (["[" * 100000 + "]" * 100000], ["n3"]),
    "missing": ([], ["n3"]),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_answer_fails_the_table(tmp_path, monkeypatch, capsys, case):
    extra, failed = HOSTILE[case]
    result = table(tmp_path, monkeypatch, GOOD[:2] + extra)
    assert result["ok"] is False
    assert set(result["failed"]) | {"n3"} >= set(failed) and (result["failed"] or "no "
                                                                                  "node's" in capsys.readouterr().err)
    assert json.loads((tmp_path / "nodes.json").read_text()) == {} and (tmp_path / "head_ip").read_text() == "\n"


def test_every_failure_names_the_node_and_what_it_sent(tmp_path, monkeypatch, capsys):
    table(tmp_path, monkeypatch, GOOD[:2] + [ok("n3", "10.0.0.3", gpus_seen="8")])
    err = capsys.readouterr().err
    row = next(r for r in err.splitlines() if r.startswith("n3"))
    assert "FAILED" in row and "gpus_seen: '8'" in row


def test_control_characters_in_a_node_s_problem_never_reach_the_output(tmp_path, monkeypatch, capsys):
    table(tmp_path, monkeypatch, GOOD[:2] + [ok("n3", "10.0.0.3", problems=["\x1b]0;owned\x07 fake\r\nn3  ok"])])
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "\r" not in err
    assert sum(1 for r in err.splitlines() if r.startswith("n3")) == 1


def test_a_node_s_own_problem_fails_it(tmp_path, monkeypatch, capsys):
    result = table(tmp_path, monkeypatch, GOOD[:2] + [json.dumps({"node": "n3", "problems": ["port 6379 in use"]})])
    assert result == {"ok": False, "failed": ["n3"]} and "port 6379 in use" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["missing", "directory", "fifo", "symlink", "too large", "not utf-8"])
def test_the_answers_file_itself(tmp_path, monkeypatch, kind):
    path = tmp_path / "checks.jsonl"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        (tmp_path / "real").write_text("\n".join(GOOD) + "\n")
        path.symlink_to(tmp_path / "real")
    raw = None
    if kind == "too large":
        raw = ("\n".join(GOOD) + "\n" + " " * (slurm_agent.CHECKS_MAX_BYTES + 1)).encode()
    elif kind == "not utf-8":
        raw = b"\xff\xfe" + "\n".join(GOOD[:2]).encode()
    result = table(tmp_path, monkeypatch, None, raw=raw)
    assert result["ok"] is False
    if kind != "not utf-8":  # an answers file that is not text names no node: the whole table fails
        assert "n3" in result["failed"]


@pytest.mark.parametrize("nodes", ["", "n1 n1", "n1 -rf", "n1 a\x1bb"])
def test_the_allocation_s_node_list(tmp_path, monkeypatch, nodes):
    (tmp_path / "checks.jsonl").write_text("\n".join(GOOD) + "\n")
    monkeypatch.setenv("SF_STEP_DIR", str(tmp_path))
    monkeypatch.setenv("SF_NODES", nodes)
    assert slurm_agent.cmd_slurm_table({})["ok"] is False


def test_the_program_answers_one_json_line_and_no_traceback(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SF_STEP_DIR", str(tmp_path / "absent"))
    monkeypatch.setenv("SF_NODES", "n1")
    assert slurm_agent.main(["slurm_agent.py", "slurm-table", "{}"]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["ok"] is False and "Traceback" not in err and "slurm_agent slurm-table" in err
