"""`--json` as a script reads it: one document on stdout and nothing else there, its `schema`
first, and the shape docs/json.md documents (tests/json_shapes.py reads the doc's shape blocks)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import json_shapes
import pytest

ROOT = Path(__file__).resolve().parents[2]


def invoke(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def one_document(res) -> dict:
    """stdout parses as exactly one JSON document (json.loads refuses anything before or after it)."""
    assert "Traceback" not in res.stderr, res.stderr
    return json.loads(res.stdout)


def test_every_documented_schema_has_a_shape_and_a_task():
    doc = json_shapes.DOC.read_text()
    listed = set(re.findall(r"^\| `invoke [^`]+` \| `(slimeforge\.[a-z-]+/\d+)` \|$", doc, re.M))
    assert listed == set(json_shapes.shapes()) and len(listed) == 8
    tasks = "".join(
        (ROOT / "slimeforge" / name).read_text() for name in ("cli.py", "cliviews.py")
    )  # the tasks and what they print
    assert listed == set(
        re.findall(r'json_doc\(\s*"(slimeforge\.[a-z-]+/\d+)"', tasks + (ROOT / "slimeforge/run/launch.py").read_text())
    )


def test_doctor_json_exits_2_on_an_error_and_prints_only_the_document():
    res = invoke("doctor", "--recipe", "recipes/gsm8k.yaml", "--mode", "host", "--no-network", "--json")
    doc = one_document(res)
    json_shapes.check(doc, "slimeforge.doctor/1")
    errors = [f for f in doc["findings"] if f["level"] == "error"]
    assert res.returncode == 2 and doc["errors"] == len(errors) > 0  # no GPU, no model here
    assert {f["check"] for f in errors} >= {"model-config", "data"} and all(f["fix"] for f in errors)


def test_run_dry_run_json_is_the_plan_it_wrote(tmp_path):
    res = invoke("run", "recipes/gsm8k.yaml", "--dry-run", "--json", "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    doc = one_document(res)
    json_shapes.check(doc, "slimeforge.run-plan/1")
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert doc["run_dir"] == str(tmp_path / "run") and doc["commands"][-1]["argv"] == plan["commands"][-1]
    assert doc["train_args"] == len((tmp_path / "run" / "slime.args").read_text().splitlines())  # one argument a line
    # A launch streams the job's logs: --json without --dry-run is refused before anything starts.
    refused = invoke("run", "recipes/gsm8k.yaml", "--json", "--out", str(tmp_path / "never"))
    assert refused.returncode == 2 and "add --dry-run" in refused.stderr and not (tmp_path / "never").exists()


def test_run_dry_run_json_keeps_the_warnings_text_mode_prints(tmp_path):
    """--json dropped them (issue 42.5): the document's `warnings` are the text's `warning:` lines,
    which stay on stderr in both modes."""
    as_json = invoke("run", "recipes/gsm8k.yaml", "--dry-run", "--json", "--out", str(tmp_path / "json"))
    as_text = invoke("run", "recipes/gsm8k.yaml", "--dry-run", "--out", str(tmp_path / "text"))
    assert as_json.returncode == as_text.returncode == 0, as_json.stderr + as_text.stderr
    doc = one_document(as_json)
    printed = [line.removeprefix("warning: ") for line in as_text.stderr.splitlines() if line.startswith("warning: ")]
    assert doc["warnings"] == printed and len(printed) >= 2  # this machine has neither the model nor the data
    assert any(w.startswith("model_dir ") for w in doc["warnings"]) and any(
        w.startswith("data_path ") for w in doc["warnings"]
    )
    assert [f"warning: {w}" for w in doc["warnings"]] == [
        line for line in as_json.stderr.splitlines() if line.startswith("warning: ")
    ]
    assert all(w.isprintable() for w in doc["warnings"])


def test_stack_show_json_keeps_the_lock_problem_text_mode_prints():
    res, text = invoke("stack.show", "--cuda", "cu129", "--json"), invoke("stack.show", "--cuda", "cu129")
    doc = one_document(res)
    json_shapes.check(doc, "slimeforge.stack/1")
    lock_lines = [line for line in text.stdout.splitlines() if line.startswith("lock")]
    if lock_lines[0].startswith(
        "lock: "
    ):  # no committed lock for this flavor: the text says so, and so does the document
        assert doc["warnings"] == lock_lines
    else:
        assert doc["warnings"] == []


def test_stack_show_json():
    res = invoke("stack.show", "--cuda", "cu129", "--json")
    assert res.returncode == 0, res.stderr
    doc = one_document(res)
    json_shapes.check(doc, "slimeforge.stack/1")
    assert (
        doc["pins"]["source.slime"] == "a74ae3a0ad16bd8b769d5386738e8ae3d1269d7e" and doc["cuda"] == doc["pins"]["cuda"]
    )
    assert [s["name"] for s in doc["steps"]][:2] == ["system", "torch"]


@pytest.mark.parametrize("unused", [False, True])
def test_wheels_ls_json(tmp_path, unused):
    res = invoke(
        "wheels.ls",
        "--cuda",
        "cu13",
        "--json",
        *(["--unused"] if unused else []),
        env={"SLIMEFORGE_COMPILED_STORE": str(tmp_path / "store")},
    )
    assert res.returncode == 0, res.stderr
    doc = one_document(res)
    json_shapes.check(doc, "slimeforge.wheels-unused/1" if unused else "slimeforge.wheels/1")
    if unused:
        assert doc["unused"] == []
    else:
        assert {r["step"]: r["status"] for r in doc["keys"]}["apex"] == "miss"


def test_cluster_status_json_names_each_unreachable_host(tmp_path):
    """Hosts where nothing answers ssh (port 1): every host still has its row, with ssh's own error."""
    inventory = tmp_path / "lab.yaml"
    inventory.write_text(
        "name: unreachable\nmode: host\nprefix: /opt/slimeforge\nssh: {user: root, connect_timeout: 2, port: 1}\n"
        "hosts:\n  - {name: a, address: 127.0.0.1, role: head, gpus: 1}\n  - {name: b, address: 127.0.0.2, gpus: 1}\n"
    )
    res = invoke("cluster.status", str(inventory), "--json")
    assert res.returncode == 2, res.stderr  # no host answers: the document, then exit 2 (docs/exit-codes.md)
    assert "2 of 2 host(s) do not answer (a, b)" in res.stderr
    doc = one_document(res)
    json_shapes.check(doc, "slimeforge.cluster-status/1")
    assert [h["host"] for h in doc["hosts"]] == ["a", "b"]
    assert all(
        "port 1" in h["error"] and h["node"] == "not in the cluster" and h["answered"] is False for h in doc["hosts"]
    )
    # The table, piped, keeps its full width: ssh's whole message, no column cut to "…".
    table = invoke("cluster.status", str(inventory))
    assert table.returncode == 2 and "ssh: connect to host 127.0.0.2 port 1: Connection refused" in table.stdout, (
        table.stdout
    )
    assert "…" not in table.stdout and "\x1b[" not in table.stdout
