"""Container mode end to end on the lab: `invoke cluster.up`, `invoke run --cluster`, `invoke cluster.down`.

Each of the lab's three hosts runs a Docker daemon of its own in its own network and mount
namespaces (netlab.py, `docker=True`), so the `docker run --network host ... ray start` that the
node agent runs over ssh puts Ray on that host's address, and a volume on that host's files. The
image is the test base with Ray at the lock's version and the stand-in slime at /root/slime
(lab_image.py), published to the lab's registry and named by digest in the inventory; every host
pulls it in cluster.up's environment phase.

Nothing of Ray's or slimeforge's is shared between the hosts but what a cluster shares: each host
has its own state dir, Ray temp dir, models and data (a tmpfs per host), no venv or prefix (Ray is
the image's); <lab>/shared stands for the filesystem they share (the checkpoints).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from cluster_helpers import write_inventory
from lab_image import REGISTRY_STORE
from launch_support import FIXTURES, write_catalog
from netlab import NetLab, can_create_namespaces, can_run_docker_lab

from slimeforge.run.recipecheck import parse_recipe

pytestmark = [pytest.mark.ssh, pytest.mark.docker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]
MODEL = "Qwen2.5-3B-Instruct"
FIGURES: dict[str, float] = {}


@pytest.fixture(scope="module")
def clab(tmp_path_factory, request):
    why = can_create_namespaces() or can_run_docker_lab()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must be able to run the container lab: {why}")
        pytest.skip(f"cannot run a Docker daemon per lab host here: {why}")
    image = request.getfixturevalue("ray_image_for_lab")  # after the checks: a machine without the lab builds nothing
    hidden = str(tmp_path_factory.getbasetemp())  # this machine's run directories: no host sees them
    lab = NetLab(3, docker=True, registry_store=REGISTRY_STORE, private=("{workdir}/local", "{workdir}/ray",
                                                                         "{workdir}/state", hidden)).start()
    try:
        yield lab, lab.publish(image)
    finally:
        lab.stop()


def ssh(lab: NetLab, host, command: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-F", str(lab.ssh_config), host.ip, command], capture_output=True, text=True,
                          timeout=timeout)


def put(lab: NetLab, host, path: Path, text: str) -> None:
    lab.run_in(host, ["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", str(path)], input=text)


def sees(lab: NetLab, host, path: Path) -> bool:
    return subprocess.run(["nsenter", "--target", str(host.sshd_pid), "--mount", "--", "test", "-e",
                           str(path)]).returncode == 0


def test_a_container_on_a_lab_host_is_on_that_hosts_network_and_files(clab):
    """The ground the rest stands on: `docker` over ssh is the host's own daemon; `--network host`
    is the host's address; a volume is the host's own file; `--gpus all` is accepted."""
    lab, image = clab
    # The source address toward the gateway: the address of the network namespace the container is in.
    ask = (f"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(('{lab.gateway}', 9)); "
          "print(s.getsockname()[0])")
    mark = lab.workdir / "local" / "whoami"
    for h in lab.hosts:
        put(lab, h, mark, h.name)
    command = (f"docker pull -q {image} >/dev/null && docker run --rm --network host --gpus all -v {mark}:/whoami:ro "
               f"--entrypoint python3 {image} -c \"{ask}; print(open('/whoami').read())\"")
    # The three hosts pull at once, as cluster.up's environment phase does (one after another, the pulls
    # were most of this module's time).
    with ThreadPoolExecutor(len(lab.hosts)) as pool:
        answers = list(pool.map(lambda h: ssh(lab, h, command), lab.hosts))
    for h, r in zip(lab.hosts, answers, strict=True):
        assert r.returncode == 0, (h.name, r.stderr)
        assert r.stdout.split() == [h.ip, h.name]
    for h in lab.hosts:
        root = ssh(lab, h, "docker info --format '{{.DockerRootDir}}'")
        assert root.stdout.strip() == str(lab.workdir / "dr" / h.name)


def _invoke(*args: str, timeout: float = 900, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def up(clab, tmp_path_factory):
    """Per-host models and data, the container inventory, `invoke cluster.up` on it (timed)."""
    lab, image = clab
    w = lab.workdir
    local, shared = w / "local", w / "shared"
    config = (FIXTURES / "models" / MODEL / "config.json").read_text()
    for h in lab.hosts:  # each host its own copy of the model, at the same path
        put(lab, h, local / "models" / MODEL / "config.json", config)
        put(lab, h, local / "models" / MODEL / "model.safetensors", "w" * 4096)
    head = lab.hosts[0]
    put(lab, head, local / "data" / "train.jsonl", json.dumps({"prompt": "1 + 1?", "metadata": {"answer": "2"}}) + "\n")
    (shared / "ckpt").mkdir(parents=True)
    name = f"{lab.tag}-ct"
    hosts = [{"name": h.name, "address": h.ip, "role": "head" if i == 0 else "worker", "gpus": 2,
              "temp_dir": f"{w}/ray/{h.name}"}
             for i, h in enumerate(lab.hosts)]
    data = {
        "name": name, "mode": "container", "image": image,
        "state_dir": str(w / "state"),  # each host's own (a tmpfs per host)
        "system_python": "/usr/bin/python3",  # the hosts' own python runs the node agent; Ray is the image's
        "ssh": {"config": str(lab.ssh_config), "connect_timeout": 5},
        "ray": {"num_cpus": 1, "object_store_memory": 100 * 1024 * 1024, "start_timeout": 300},
        # ulimits []: this machine's Docker may not raise the locked-memory limit (memlock=-1, the
        # default, fails the container's start here: "error setting rlimit type 8").
        "container": {"volumes": [f"{local}/models:/models:ro", f"{local}/data:/data:ro",
                                  f"{shared}/ckpt:/checkpoints"], "shm_size": "1g", "ulimits": []},
        "hosts": hosts,
    }
    home = tmp_path_factory.mktemp("state-home")
    env = {"SLIMEFORGE_STATE_HOME": str(home)}
    tmp = tmp_path_factory.mktemp("recipes")
    inv = write_inventory(tmp / "lab.yaml", data)
    recipe = {
        "exp_id": "sf-container-run",
              "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/gsm8k_agent-a1B2c3D4e5",
        "s3_bucket": "sf-cluster-test", "model_dir": f"/models/{MODEL}", "data_path": "/data/train.jsonl",
        "model_type": "qwen2.5-3B", "num_gpus": 2, "num_nodes": 3, "tp_size": 1, "rollout_batch_size": 24,
              "rollout_gpus_per_engine": 1,
        "mode": "container", "checkpoint_dir": "/checkpoints/sf-container-run", "env": {"STANDIN_CHECK_FLAGS": "1"},
    }
    # The flag catalog a build of the image would hold: the stand-in's model script, read here.
    parsed, stack = parse_recipe({**recipe, "mode": "host", "slime_dir": str(FIXTURES / "slime"),
                                  "install_prefix": str(w / "prefix")}, "test")
    catalog = write_catalog(tmp / "flags.json", parsed, stack)
    started = time.monotonic()
    r = _invoke("cluster.up", str(inv), env=env)
    FIGURES["cluster.up, 3 container hosts (s)"] = round(time.monotonic() - started, 1)
    dashboard = re.search(r"dashboard and Jobs API (http://[0-9.]+:[0-9]+)", r.stdout)
    try:
        assert r.returncode == 0 and dashboard, r.stdout + r.stderr
        yield {"lab": lab, "image": image, "inventory": inv, "recipe": recipe, "tmp": tmp, "catalog": catalog,
               "env": env, "local": local,
               "shared": shared, "dashboard": dashboard.group(1)}
    finally:
        # `invoke cluster.down` removes every host's Ray container (checked here, after the module's tests).
        down = _invoke("cluster.down", str(inv), env=env)
        print("figures:", json.dumps(FIGURES))
        assert down.returncode == 0, down.stdout + down.stderr
        for h in lab.hosts:
            assert [c["Names"] for c in containers(lab, h) if c["Names"].startswith("sf-ray-")] == [], h.name
        assert not lab.ray_processes()


def recipe_file(up, name: str, **over) -> Path:
    path = up["tmp"] / f"{name}.yaml"
    data = {**up["recipe"], **over}
    data["env"] = {**up["recipe"]["env"], **over.get("env", {})}
    path.write_text(yaml.safe_dump(data))
    return path


def run_cmd(up, recipe: Path, out: Path, *more: str) -> list[str]:
    return ["run", str(recipe), "--cluster", str(up["inventory"]), "--out", str(out), "--catalog", str(up["catalog"]),
            "--no-network", *more]


def containers(lab: NetLab, host) -> list[dict]:
    out = lab.docker_cli(host, "ps", "--all", "--format", "{{json .}}").stdout.decode()
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def watch_running(out: Path, dashboard: str, seen: dict[str, float], stop: threading.Event) -> None:
    """Poll the Jobs API (from the moment the run records its submission) for RUNNING."""
    from ray.job_submission import JobSubmissionClient

    client = None
    while not stop.is_set():
        sid = out / "submission_id"
        if sid.exists() and sid.read_text().strip():
            client = client or JobSubmissionClient(dashboard)
            try:
                status = str(client.get_job_status(sid.read_text().strip()))
            except RuntimeError:  # recorded before it is submitted: not there yet
                status = ""
            if status.endswith(("RUNNING", "SUCCEEDED", "FAILED", "STOPPED")):
                seen[status.rsplit(".", 1)[-1]] = time.monotonic()
                return
        time.sleep(0.2)


def test_cluster_up_runs_ray_in_a_container_on_every_host(up):
    lab = up["lab"]
    for h in lab.hosts:
        mine = [c for c in containers(lab, h) if c["Names"].startswith("sf-ray-")]
        assert [c["Names"] for c in mine] == [f"sf-ray-{lab.tag}-ct-{h.name}"] and mine[0]["State"] == "running", mine
        # The node's Ray temp dir is the host's own: its session is there, on no other host.
        assert sees(lab, h, lab.workdir / "ray" / h.name / "session_latest")
    assert not (lab.workdir / "ray" / "h1").exists()  # not on this machine's /tmp either


def test_run_on_the_container_cluster_reads_every_path_through_the_volumes(up):
    lab, out, dashboard = up["lab"], up["tmp"] / "run-ok", up["dashboard"]
    seen: dict[str, float] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch_running, args=(out, dashboard, seen, stop), daemon=True)
    started = time.monotonic()
    watcher.start()
    try:
        r = _invoke(*run_cmd(up, recipe_file(up, "ok"), out), env=up["env"])
    finally:
        stop.set()
        watcher.join(timeout=30)
    text = r.stdout + r.stderr
    assert r.returncode == 0, text
    if "RUNNING" in seen:
        FIGURES["invoke run --cluster to job RUNNING, container mode (s)"] = round(seen["RUNNING"] - started, 1)
    FIGURES["invoke run --cluster to exit, container mode (s)"] = round(time.monotonic() - started, 1)
    assert "standin: 3 node(s) read every path and wrote a shard" in text
    shards = sorted(p.name for p in (up["shared"] / "ckpt" / "sf-container-run").iterdir())
    assert shards == sorted(f"shard-{h.ip}" for h in lab.hosts)
    log = (out / "job.log").read_text()
    assert "standin: exiting with 0" in log
    st = _invoke("run.status", str(out), "--json", env=up["env"])
    assert st.returncode == 0, st.stdout + st.stderr
    assert json.loads(st.stdout)["status"] == "SUCCEEDED"


def test_a_path_outside_every_volume_is_refused_before_anything_is_submitted(up):
    from ray.job_submission import JobSubmissionClient

    lab = up["lab"]
    client = JobSubmissionClient(up["dashboard"])
    before = [j.submission_id for j in client.list_jobs()]
    r = _invoke(*run_cmd(up, recipe_file(up, "outside", data_path="/root/data/train.jsonl"),
                         up["tmp"] / "run-outside"), env=up["env"])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "data_path: lies outside every container volume" in r.stderr, r.stdout + r.stderr
    # A path inside a volume that one host lacks: refused naming that host, as the container sees the path.
    h2 = lab.hosts[1]
    model = up["local"] / "models" / MODEL
    lab.run_in(h2, ["rm", "-rf", "--", str(model)])
    try:
        r = _invoke(*run_cmd(up, recipe_file(up, "nomodel"), up["tmp"] / "run-nomodel"), env=up["env"])
    finally:
        put(lab, h2, model / "config.json", (FIXTURES / "models" / MODEL / "config.json").read_text())
        put(lab, h2, model / "model.safetensors", "w" * 4096)
    text = r.stdout + r.stderr
    assert r.returncode == 2, text
    line = next(x for x in text.splitlines() if x.startswith("h2 "))
    assert f"model_dir /models/{MODEL}: no such directory here" in line and "FAILED" in line
    assert [j.submission_id for j in client.list_jobs()] == before
