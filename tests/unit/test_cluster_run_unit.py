"""`invoke run --cluster` without a cluster: the recipe against the inventory (static), the
cluster's environment adopted or refused, the job's files and flags, the checkpoint's size, and the
entrypoint (job.sh) run as Ray runs it on the head."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from launch_support import make_recipe

from slimeforge.cluster import runcheck
from slimeforge.cluster.inventory import load_inventory
from slimeforge.errors import ConfigError
from slimeforge.run.recipecheck import parse_recipe
from slimeforge.run.targets import jobsubmit
from slimeforge.run.targets.base import ResolvedRun

IMAGE = "reg.example:5000/slimeforge@sha256:" + "a" * 64
OTHER = "reg.example:5000/slimeforge@sha256:" + "b" * 64


def inventory(tmp_path: Path, **over) -> Path:
    data = {"name": "lab", "mode": "container", "image": IMAGE,
            "container": {"volumes": ["/data:/data", "/mnt/models:/models:ro", "/ckpt:/root/checkpoints"]},
            "hosts": [{"name": "a", "address": "10.0.0.1", "role": "head", "gpus": 8}, {"name": "b",
                                                                                        "address": "10.0.0.2",
                                                                                        "gpus": 8},
                      {"name": "c", "address": "10.0.0.3", "gpus": 4}]}
    data.update(over)
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def recipe(tmp_path: Path, **over):
    fields = {"mode": "container", "model_dir": "/models/Qwen2.5-3B-Instruct", "data_path": "/data/train.jsonl",
              "checkpoint_dir": "/root/checkpoints/x", "num_gpus": 8, "num_nodes": 2, **over}
    data = make_recipe(tmp_path, **fields)
    return parse_recipe(data, "test")[0]


def test_paths_nodes_and_gpus_against_the_inventory(tmp_path):
    big = {"rollout_batch_size": 24}  # a global batch of 192: 16 and 24 ranks split it
    inv = load_inventory(inventory(tmp_path))
    assert runcheck.static(recipe(tmp_path, image=IMAGE), inv) == []
    # Three hosts, but only two have 8 GPUs.
    (p,) = runcheck.static(recipe(tmp_path, image=IMAGE, num_nodes=3, **big), inv)
    assert p.where == "num_nodes" and "3 x 8" in p.message and ("2 host(s) have 8 GPU(s) or more (a: 8, b: 8, c: "
                                                               "4)") in p.message
    # Outside every volume, and a checkpoint dir on a read-only volume: each named, with the volumes.
    problems = runcheck.static(recipe(tmp_path, image=IMAGE, model_dir="/root/models/Qwen2.5-3B-Instruct",
                                      checkpoint_dir="/models/ck",
                                      eval_data={"test": "/srv/eval.jsonl"}), inv)
    by = {p.where: p for p in problems}
    assert set(by) == {"model_dir", "eval_data.test", "checkpoint_dir"}
    assert ("lies outside every container volume of cluster "
           "lab") in by["model_dir"].message and "/data, /models, /root/checkpoints" in by["model_dir"].message
    assert by["model_dir"].value == "/root/models/Qwen2.5-3B-Instruct"
    assert "read-only volume /models" in by["checkpoint_dir"].message
    # Another image, another mode.
    by = {p.where: p for p in runcheck.static(recipe(tmp_path, image=OTHER), inv)}
    assert set(by) == {"image"} and IMAGE in by["image"].message and by["image"].value == OTHER
    by = {p.where: p for p in runcheck.static(recipe(tmp_path, image=IMAGE).model_copy(update={"mode": "host"}), inv)}
    assert "mode" in by and "'container'" in by["mode"].message


def test_a_container_path_is_checked_where_its_volume_lives_on_the_host(tmp_path):
    vols = runcheck.volumes(load_inventory(inventory(tmp_path)))
    assert runcheck.host_path("/models/Qwen/config.json", vols)[0] == "/mnt/models/Qwen/config.json"
    assert runcheck.host_path("/root/checkpoints", vols)[0] == "/ckpt"
    assert runcheck.host_path("/modelsX/a", vols) is None  # a prefix of the name is not a parent


def test_the_cluster_environment_is_adopted_or_refused(tmp_path):
    inv = load_inventory(inventory(tmp_path))
    r = runcheck.adopt(recipe(tmp_path), inv, mode_given=False)
    assert r.image == IMAGE and r.mode == "container"
    host_inv = load_inventory(inventory(tmp_path, mode="host", image=None, container={}, prefix="/opt/sf"))
    r = runcheck.adopt(recipe(tmp_path), host_inv, mode_given=False)
    assert r.mode == "host" and r.install_prefix == "/opt/sf"
    (p,) = runcheck.static(recipe(tmp_path, install_prefix="/opt/other").model_copy(update={"mode": "host"}), host_inv)
    assert p.where == "install_prefix" and "/opt/sf" in p.message and p.value == "/opt/other"
    # Through the run layer, as `invoke run --cluster` resolves it: the refusal names both images.
    cluster = runcheck.cluster_env(str(inventory(tmp_path)), dry_run=True)
    with pytest.raises(ConfigError) as err:
        jobsubmit.on_cluster(recipe(tmp_path), cluster, mode=None, prefix=None, image=OTHER, dry_run=True, stack=None)
    assert IMAGE in str(err.value) and OTHER in str(err.value)
    assert jobsubmit.on_cluster(recipe(tmp_path), cluster, mode=None, prefix=None, image=None, dry_run=False,
                                stack=None).image == IMAGE


def test_checkpoint_size_from_weights_or_config():
    assert runcheck.checkpoint_bytes(2 * 2**30, None)[0] == 14 * 2**30
    need, how = runcheck.checkpoint_bytes(0, {"hidden_size": 2048, "num_hidden_layers": 36, "vocab_size": 151936})
    params = 36 * (4 * 2048**2 + 3 * 2048 * 4 * 2048) + 2 * 151936 * 2048
    assert need == 7 * 2 * params and "config.json" in how
    # Qwen2.5-3B's own config.json: 3.35B by this count (3.09B with its grouped KV heads), tied embeddings.
    need, how = runcheck.checkpoint_bytes(0, {"hidden_size": 2048, "num_hidden_layers": 36, "vocab_size": 151936,
                                              "intermediate_size": 11008,
                                              "tie_word_embeddings": True})
    params = 36 * (4 * 2048**2 + 3 * 2048 * 11008) + 151936 * 2048
    assert need == 7 * 2 * params and "config.json" in how
    assert runcheck.checkpoint_bytes(0, {}) == (None, "no weights and no shape in config.json")


def test_the_run_directory_files_travel_and_the_flags_name_them_there(tmp_path):
    run_dir = (tmp_path / "run").resolve()
    args, problems = jobsubmit.ship(["--custom-config-path", f"{run_dir}/agentcore.yaml",
                                     "--x=" + f"{run_dir}/agentcore.yaml", "--lr", "1"], run_dir)
    assert args == ["--custom-config-path", "agentcore.yaml", "--x=agentcore.yaml", "--lr", "1"] and problems == []
    _, problems = jobsubmit.ship(["--my-file", f"{run_dir}/notes.txt"], run_dir)
    assert [p.where for p in problems] == ["extra_flags"] and "does not travel with the job" in problems[0].message


def test_job_sh_runs_train_py_with_the_model_args_and_the_shipped_config(tmp_path):
    """The entrypoint as Ray runs it on the head: `bash job.sh` in the unpacked working_dir."""
    r, stack = parse_recipe(make_recipe(tmp_path, mode="host", install_prefix="/opt/sf"), "test")
    run = ResolvedRun(r, stack, (tmp_path / "run").resolve(), "test", {})
    plan = jobsubmit.ClusterTarget(jobsubmit.Cluster("lab", "http://10.0.0.1:8265", mode="host",
                                                     python="python3")).plan(run)
    assert plan.target == "ray-cluster" and plan.mounts == () and plan.run_token
    assert set(plan.rundir.plan["working_dir"]["files"]) == set(jobsubmit.JOB_FILES)
    work = tmp_path / "working_dir"  # what Ray unpacks: the job files, and nothing else of the run directory
    work.mkdir()
    for name in jobsubmit.JOB_FILES:
        (work / name).write_text(plan.rundir.files[name])
    record = tmp_path / "record.json"
    env = {**os.environ, "STANDIN_RECORD": str(record)}
    subprocess.run(["bash", "job.sh"], cwd=work, env=env, check=True, capture_output=True, text=True)
    seen = json.loads(record.read_text())
    argv = seen["argv"]
    assert argv[argv.index("--custom-config-path") + 1] == "agentcore.yaml" and seen["cwd"] == str(work)
    assert "--num-layers" in argv  # the model script's MODEL_ARGS, read on the head
    assert shlex.split(plan.rundir.files["slime.args"]) == argv[argv.index("--hf-checkpoint"):]
    script = work / "job.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    if shutil.which("shellcheck") or os.environ.get("CI"):
        res = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout


def test_the_checks_here_never_run_the_clusters_image(tmp_path):
    """Container mode on a cluster: the flag check reads --catalog, and nothing runs `docker` here."""
    from launch_support import StandInChecks, write_catalog

    from slimeforge.proc import Runner

    r, stack = parse_recipe(make_recipe(tmp_path, mode="container", image=IMAGE, slime_dir="/opt/slime-in-image"),
                            "test")
    catalog = write_catalog(tmp_path / "flags.json", r.model_copy(update={"slime_dir": str(tmp_path / "slime")}), stack)
    run = ResolvedRun(r, stack, (tmp_path / "run").resolve(), "test", {}, str(catalog), (), False)
    checked = []
    cluster = jobsubmit.Cluster("lab", "http://10.0.0.1:8265", mode="container", image=IMAGE,
                                checks=StandInChecks(preflight=lambda rec, say: checked.append(rec.image)))
    target = jobsubmit.ClusterTarget(cluster)
    plan = target.plan(run)
    recording = Runner(dry_run=True)
    said = []
    target.preflight(plan, recording, said.append)
    assert not any(argv[0] == "docker" for argv in recording.history), recording.history
    assert checked == [IMAGE]  # then the cluster's own checks, with the recipe as it runs there
    assert "flags" in said[0]


def test_a_cluster_that_does_not_answer_is_one_clear_error_with_the_records_kept(tmp_path):
    import io

    from helpers import free_port

    from slimeforge.errors import SlimeforgeError
    from slimeforge.run.rundir import write_run_dir

    r, stack = parse_recipe(make_recipe(tmp_path, mode="host", install_prefix="/opt/sf"), "test")
    address = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    plan = jobsubmit.ClusterTarget(jobsubmit.Cluster(address, address)).plan(ResolvedRun(r, stack,
                                                                                         (tmp_path / "run").resolve(),
                                                                                         "test", {}))
    write_run_dir(plan.rundir)
    with pytest.raises(SlimeforgeError,
                       match=r"cannot submit sf-launch-test-\d{8}-\d{6}-[0-9a-f]{6}: the Ray Jobs API at "
                             r"http://127\.0\.0\.1:\d+ .* does not answer") as e:
        jobsubmit.submit(plan, jobsubmit.Cluster(address, address), lambda s: None, io.StringIO())
    assert e.value.exit_code == 3  # whether a job arrived cannot be learned (docs/exit-codes.md)
    assert (plan.rundir.path / "ray_address").read_text() == address + "\n"
    assert (plan.rundir.path / "submission_id").read_text().startswith("sf-launch-test-")


def test_address_without_an_inventory_is_validated_and_says_nothing_is_compared(tmp_path):
    r, stack = parse_recipe(make_recipe(tmp_path, mode="host", install_prefix="/opt/sf"), "test")
    cluster = jobsubmit.find_cluster_of("http://10.0.0.1:8265", None, None, dry_run=True)
    plan = jobsubmit.ClusterTarget(cluster).plan(ResolvedRun(r, stack, (tmp_path / "run").resolve(), "test", {}))
    assert any("names no inventory: the recipe's mode, image, prefix and paths are not "
               "checked" in n for n in plan.notes)
    with pytest.raises(ConfigError, match="--address"):
        jobsubmit.find_cluster_of("http://10.0.0.1:8265 --x", None, None, dry_run=True)
    with pytest.raises(ConfigError, match="both name a cluster"):
        jobsubmit.find_cluster_of("http://10.0.0.1:8265", "inv.yaml", None, dry_run=True)
