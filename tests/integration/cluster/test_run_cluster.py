"""`invoke run RECIPE --cluster INVENTORY` end to end, on hosts that share nothing they should not.

The lab's three hosts (network namespaces with sshd) each run in a mount namespace of their own:
a tmpfs per host over <lab>/local (each host's own model copy, the head's data) and over pytest's
temporary directories (the run directory on this machine: no host sees it). <lab>/shared stands
for the filesystem the inventory's hosts share (the stand-in slime tree, the checkpoints).

The job goes through the real task (`python -m invoke run ... --cluster INV`) to the Ray cluster
cluster.up brought up; the stand-in train.py reads every path its flags name on the head and, in a
task pinned to each node, on every node, writes one checkpoint shard per node, and fails naming
anything missing. The refusals (a model missing on one host, a per-host checkpoint dir, a path
outside the container volumes) stop before anything is submitted, naming the host.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_helpers import inventory_data, write_inventory
from launch_support import FIXTURES, write_catalog
from netlab import NetLab, can_create_namespaces

from slimeforge.cluster import raycluster as cluster
from slimeforge.run.recipecheck import parse_recipe

pytestmark = [pytest.mark.ssh, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]
MODEL = "Qwen2.5-3B-Instruct"


@contextlib.contextmanager
def isolated_lab(tmp_path_factory) -> Iterator[NetLab]:
    why = can_create_namespaces()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to create network namespaces with sshd: {why}")
        pytest.skip(f"cannot create network namespaces with sshd here: {why}")
    hidden = str(tmp_path_factory.getbasetemp())  # this machine's run directories: no host sees them
    lab = NetLab(3, private=("{workdir}/local", hidden)).start()
    try:
        yield lab
    finally:
        lab.stop()


def put(lab: NetLab, host, path: Path, text: str) -> None:
    lab.run_in(host, ["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", str(path)], input=text)


def put_model(lab: NetLab, host, model: Path) -> None:
    """The host's own copy of the model: config.json and the weights (the same on every host: the run gate compares
    them)."""
    put(lab, host, model / "config.json", (FIXTURES / "models" / MODEL / "config.json").read_text())
    put(lab, host, model / "model.safetensors", "w" * 4096)


def sees(lab: NetLab, host, path: Path) -> bool:
    return subprocess.run(["nsenter", "--target", str(host.sshd_pid), "--mount", "--", "test", "-e",
                           str(path)]).returncode == 0


@contextlib.contextmanager
def lab_and_cluster(tmp_path_factory) -> Iterator[dict[str, Any]]:
    """The lab's files (per host and shared), a cluster brought up on it, and a recipe for it."""
    with isolated_lab(tmp_path_factory) as lab:
        w = lab.workdir
        local, shared = w / "local", w / "shared"
        shutil.copytree(FIXTURES / "slime", shared / "slime")
        # each host its own copy of the model, at the same path (the weights: what a checkpoint's size follows)
        for h in lab.hosts:
            put_model(lab, h, local / "models" / MODEL)
        head = lab.hosts[0]
        data = local / "data" / "train.jsonl"
        put(lab, head, data, json.dumps({"prompt": "1 + 1?", "metadata": {"answer": "2"}}) + "\n")
        assert not sees(lab, lab.hosts[1], data) and sees(lab, head, data)

        home = tmp_path_factory.mktemp("state-home")
        inv = write_inventory(w / "lab.yaml", inventory_data(lab, f"{lab.tag}-jr", gpus=2))
        tmp = tmp_path_factory.mktemp("recipes")
        recipe = {
            "exp_id": "sf-cluster-run",
            "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/gsm8k_agent-a1B2c3D4e5",
            "s3_bucket": "sf-cluster-test", "model_dir": str(local / "models" / MODEL), "data_path": str(data),
            "model_type": "qwen2.5-3B", "num_gpus": 2, "num_nodes": 3, "tp_size": 1, "rollout_batch_size": 24,
            "rollout_gpus_per_engine": 1,
            "slime_dir": str(shared / "slime"), "megatron_dir": str(shared / "Megatron-LM"), "mode": "host",
            "checkpoint_dir": str(shared / "ckpt" / "sf-cluster-run"), "env": {"STANDIN_CHECK_FLAGS": "1"},
        }
        parsed, stack = parse_recipe({**recipe, "install_prefix": str(w / "prefix")}, "test")
        catalog = write_catalog(tmp / "flags.json", parsed, stack)
        try:
            # cluster.up records the head's address in the state home: the variable is set for the call only
            with pytest.MonkeyPatch.context() as env:
                env.setenv("SLIMEFORGE_STATE_HOME", str(home))
                address = cluster.up(inv, control_dir=lab.control_dir, stream=io.StringIO())
            yield {"home": home, "lab": lab, "inventory": inv, "recipe": recipe, "tmp": tmp, "catalog": catalog,
                   "address": address, "local": local, "shared": shared}
        finally:
            with pytest.MonkeyPatch.context() as env:
                env.setenv("SLIMEFORGE_STATE_HOME", str(home))
                cluster.down(inv, control_dir=lab.control_dir, stream=io.StringIO())


# test_run_cluster, test_run_gate and test_run_restart share one lab and one cluster: the first of them
# to run makes it, the last one's teardown stops it (the lab and cluster.up took 15-26 s of each
# module's setup, cluster.down and the lab's stop 5-9 s of its teardown). tests/conftest.py's
# WORKER_GROUPS sends the three to one worker, one after the other. Each test leaves the cluster as it
# found it: a test that stops a node brings it back with cluster.up's repair, as a user would.
SHARED_BY = frozenset({"test_run_cluster.py", "test_run_gate.py", "test_run_restart.py"})


class SharedCluster:
    def __init__(self) -> None:
        self.value: dict[str, Any] | None = None
        self.users: set[str] = set()  # the modules still to run that use it
        self._open: contextlib.ExitStack | None = None

    def get(self, request: pytest.FixtureRequest) -> dict[str, Any]:
        if self.value is None:
            self.users = {Path(str(item.fspath)).name for item in request.session.items} & SHARED_BY
            self._open = contextlib.ExitStack()
            self.value = self._open.enter_context(lab_and_cluster(request.getfixturevalue("tmp_path_factory")))
        return self.value

    def release(self, module: str) -> None:
        self.users.discard(module)
        if not self.users:
            self.close()

    def close(self) -> None:
        if self._open is not None:
            opened, self._open, self.value = self._open, None, None
            opened.close()


SHARED = SharedCluster()


@pytest.fixture(scope="session")
def _shared_cluster_closer():
    yield
    SHARED.close()  # when the modules using it did not all run here (a -k, or xdist without WORKER_GROUPS)


@pytest.fixture(scope="module")
def up(request, _shared_cluster_closer):
    try:
        yield SHARED.get(request)
    finally:
        SHARED.release(request.path.name)


@pytest.fixture(autouse=True)
def _cluster_state_home(request, monkeypatch):
    # cluster.up recorded the head's address in the module's state home (conftest gives each test its own).
    if "up" in request.fixturenames:
        monkeypatch.setenv("SLIMEFORGE_STATE_HOME", str(request.getfixturevalue("up")["home"]))


def recipe_file(up, name: str, **over) -> Path:
    path = up["tmp"] / f"{name}.yaml"
    data = {**up["recipe"], **over}
    data["env"] = {**up["recipe"]["env"], **over.get("env", {})}
    path.write_text(yaml.safe_dump(data))
    return path


def invoke(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def run_cmd(up, recipe: Path, out: Path, *more: str) -> list[str]:
    return ["run", str(recipe), "--cluster", str(up["inventory"]), "--out", str(out), "--catalog", str(up["catalog"]),
            "--no-network", *more]


def jobs_on(up) -> list[str]:
    from ray.job_submission import JobSubmissionClient

    return [j.submission_id for j in JobSubmissionClient(up["address"].dashboard).list_jobs()]


def test_run_on_the_cluster_reads_everything_on_the_hosts(up):
    lab, out = up["lab"], up["tmp"] / "run-ok"
    r = invoke(*run_cmd(up, recipe_file(up, "ok"), out))
    text = r.stdout + r.stderr
    assert r.returncode == 0, text
    assert ("every host holds the recipe's paths; checkpoint_dir is one filesystem with room for a checkpoint (0.0 "
           "GiB: 7 x the weights'") in text
    assert "standin: 3 node(s) read every path and wrote a shard" in text
    # The run directory exists only here; the job read its files from the working_dir Ray shipped.
    assert not any(sees(lab, h, out) for h in lab.hosts)
    args = (out / "slime.args").read_text().split("\n")
    assert "agentcore.yaml" in args and str(out / "agentcore.yaml") not in args
    shards = sorted(p.name for p in (up["shared"] / "ckpt" / "sf-cluster-run").iterdir())
    assert shards == sorted(f"shard-{h.ip}" for h in lab.hosts)
    # status and logs read the Jobs API records of this run.
    st = invoke("run.status", str(out), "--json")
    assert st.returncode == 0, st.stdout + st.stderr
    data = json.loads(st.stdout)
    assert data["status"] == "SUCCEEDED" and data["address"] == up["address"].dashboard and data["attached"]
    logs = invoke("run.logs", str(out))
    assert logs.returncode == 0 and "standin: 3 node(s) read every path" in logs.stdout


def test_exit_code_comes_back(up):
    r = invoke(*run_cmd(up, recipe_file(up, "exit", env={"STANDIN_EXIT": "7"}), up["tmp"] / "run-exit"))
    assert r.returncode == 7, r.stdout + r.stderr
    assert "exit code 7" in r.stdout + r.stderr


def test_stop_stops_the_job_on_the_cluster(up):
    out = up["tmp"] / "run-stop"
    proc = subprocess.Popen([sys.executable, "-m", "invoke", *run_cmd(up, recipe_file(up, "stop",
                                                                                      env={"STANDIN_SLEEP": "600"}),
                                                                      out)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while not ((out / "job.log").exists() and "standin: waiting" in (out / "job.log").read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
            time.sleep(1)
        assert json.loads(invoke("run.status", str(out), "--json").stdout)["status"] == "RUNNING"
        stop = invoke("run.stop", str(out), "--head")
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert "stopped: job" in stop.stdout and "no head of ours to stop" in stop.stdout  # the cluster is cluster.up's
        code = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 1
    assert json.loads(invoke("run.status", str(out), "--json").stdout)["status"] == "STOPPED"


def test_refusals_name_the_host_before_anything_is_submitted(up):
    lab, local = up["lab"], up["local"]
    before = jobs_on(up)
    h3 = lab.hosts[2]
    model = local / "models" / MODEL
    lab.run_in(h3, ["rm", "-rf", "--", str(model)])
    try:
        r = invoke(*run_cmd(up, recipe_file(up, "nomodel"), up["tmp"] / "run-nomodel"))
        text = r.stdout + r.stderr
        assert r.returncode == 2, text
        line = next(x for x in text.splitlines() if x.startswith("h3 "))
        assert f"model_dir {model}: no such directory here" in line and "FAILED" in line
        assert all("FAILED" not in x for x in text.splitlines() if x.startswith(("h1 ", "h2 ")))
    finally:
        put_model(lab, h3, model)

    # A checkpoint dir each host has for itself: the head's marker is not on h2 or h3.
    r = invoke(*run_cmd(up, recipe_file(up, "perhost", checkpoint_dir=str(local / "ckpt")), up["tmp"] / "run-perhost"))
    text = r.stdout + r.stderr
    assert r.returncode == 2, text
    for name in ("h2 ", "h3 "):
        line = next(x for x in text.splitlines() if x.startswith(name))
        assert "is not the head's filesystem" in line and "one filesystem that every host mounts" in line
    assert jobs_on(up) == before  # nothing was submitted

    # A model whose checkpoint (7 x its weights: a sparse 1 TiB file) fits nowhere: refused with the size and how it was
    # found.
    big = local / "models" / "big"
    for h in lab.hosts:
        put(lab, h, big / "config.json", (FIXTURES / "models" / MODEL / "config.json").read_text())
        lab.run_in(h, ["truncate", "-s", "1T", str(big / "model.safetensors")])
    r = invoke(*run_cmd(up, recipe_file(up, "big", model_dir=str(big)), up["tmp"] / "run-big"))
    text = r.stdout + r.stderr
    assert r.returncode == 2, text
    for name in ("h1 ", "h2 ", "h3 "):
        line = next(x for x in text.splitlines() if x.startswith(name))
        assert ("a checkpoint needs 7168.0 GiB (7 x the weights' 1024.00 "
               "GiB)") in line and "fix: free space there" in line
    assert jobs_on(up) == before

    # Container mode: a path outside every volume is refused from the inventory alone (a dry run too).
    data = inventory_data(lab, f"{lab.tag}-jc")
    for key in ("prefix", "python"):
        data.pop(key)
    data.update(mode="container", image="127.0.0.1:5000/slimeforge@sha256:" + "ab" * 32,
                container={"volumes": [f"{local}:{local}", f"{up['shared']}:{up['shared']}"]})
    inv = write_inventory(up["tmp"] / "container.yaml", data)
    recipe = recipe_file(up, "outside", mode="container", data_path="/root/data/train.jsonl")
    r = invoke("run", str(recipe), "--cluster", str(inv), "--out", str(up["tmp"] / "run-outside"), "--dry-run")
    assert r.returncode == 2 and "data_path: lies outside every container volume" in r.stderr, r.stdout + r.stderr
    assert jobs_on(up) == before


def test_container_paths_are_checked_where_their_volumes_put_them_on_each_host(up):
    """Container mode: each recipe path is looked for on the hosts at its volume's source."""
    from slimeforge.cluster import runcheck
    from slimeforge.cluster.inventory import load_inventory

    lab, local, shared = up["lab"], up["local"], up["shared"]
    data = inventory_data(lab, f"{lab.tag}-jv")
    for key in ("prefix", "python"):
        data.pop(key)
    image = "127.0.0.1:5000/slimeforge@sha256:" + "ab" * 32
    data.update(mode="container", image=image,
                container={"volumes": [f"{local}/models:/models:ro", f"{local}/data:/data:ro",
                                       f"{shared}/ckpt:/checkpoints"]})
    inv = load_inventory(write_inventory(up["tmp"] / "volumes.yaml", data))
    recipe, _ = parse_recipe({**up["recipe"], "mode": "container", "image": image, "model_dir": f"/models/{MODEL}",
                              "data_path": "/data/train.jsonl",
                              "checkpoint_dir": "/checkpoints/in-image"}, "test")
    assert runcheck.static(recipe, inv) == []
    check = runcheck.live(recipe, inv, stream=io.StringIO(), live_table=False)
    assert check.failures == {}, check.table.text()
    h2 = lab.hosts[1]
    lab.run_in(h2, ["rm", "-rf", "--", str(local / "models" / MODEL)])
    try:
        check = runcheck.live(recipe, inv, stream=io.StringIO(), live_table=False)
    finally:
        put_model(lab, h2, local / "models" / MODEL)
    assert list(check.failures) == ["h2"]
    # the recipe's path, as the container sees it
    assert check.failures["h2"].startswith(f"model_dir /models/{MODEL}: no such directory here")
