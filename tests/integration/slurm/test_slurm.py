"""`invoke run --slurm` on a real Slurm cluster (slurmctld + 3 slurmd in network namespaces):
Ray inside the allocation on every node, its exit code, a failing node named with nothing left
running, the preflight and the CLI's checks. (run.stop, a requeue and what every node must see:
test_slurm_lifecycle.py, apart so that CI's parallel workers run the two at once.)"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from slurmlab import SlurmLab

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: launch_support, helpers

from launch_support import VENV_BIN, make_recipe, wait_for, write_catalog  # noqa: E402

from slimeforge.run import preflight as doctor
from slimeforge.run.launch import launch  # noqa: E402
from slimeforge.run.recipecheck import parse_recipe  # noqa: E402
from slimeforge.run.targets import slurm  # noqa: E402

INVOKE = [str(VENV_BIN / "invoke"), "--search-root", str(Path(__file__).resolve().parents[3])]


def with_weights(data: dict) -> dict:
    """A small weights file beside config.json: the checkpoint space every node checks follows it
    (without weights, config.json's shape: about 40 GiB for the 3B model)."""
    (Path(data["model_dir"]) / "model.safetensors").write_bytes(b"w" * 4096)
    return data


def recipe_for(tmp: Path, **env):
    data = with_weights(make_recipe(tmp, num_gpus=2, env={"STANDIN_RECORD": str(tmp / "record.json"),
                                                          "STANDIN_EXIT": "0", **env}))
    recipe, stack = parse_recipe(data, "test")
    return recipe, stack, str(write_catalog(tmp / "flags.json", recipe, stack))


def submit(tmp: Path, opts: slurm.Options, follow: bool = True, recipe=None, **env):
    recipe, stack, catalog = recipe or recipe_for(tmp, **env)
    out = io.StringIO()
    code = launch(recipe, stack, slurm_options=opts, out=tmp / "run", catalog=catalog, network_checks=False,
                  stream=out, follow_log=follow)
    return code, out.getvalue(), tmp / "run"


def state(job_id: str) -> str:
    return slurm.job_info(job_id).get("JobState", "")


def no_ray_left(lab: SlurmLab) -> bool:
    return not lab.net.ray_processes()


def test_a_job_runs_on_every_node_of_the_allocation(env, slurm_lab):
    code, out, run = submit(env, slurm.Options(nodes=3, time="00:20:00"), STANDIN_NODES=str(env / "nodes.json"))
    assert code == 0, out
    ips = json.loads((env / "nodes.json").read_text())
    assert ips == sorted(h.ip for h in slurm_lab.net.hosts)  # a Ray task ran on each of the 3 nodes
    job_id = (run / "slurm_job_id").read_text().strip()
    assert f"submitted Slurm job {job_id}" in out and "standin: exiting with 0" in out
    # The phases, in order, on the job's timeline; the same submission as `invoke run`.
    phases = [line.split()[1] for line in (run / f"slurm-{job_id}" / "timeline").read_text().splitlines()]
    assert phases == ["allocated", "checked", "head", "workers", "submit", "end"]
    assert (run / "submission_id").read_text().strip() in (run / "job.log").read_text()
    st = slurm.status(run)
    assert st["state"] == "COMPLETED" and st["exit_code"] == "0:0" and st["slurm_job_id"] == job_id
    # The run.* tasks act on the Slurm job of this run directory.
    recipe_arg = [str(run)]  # the run directory, positionally (a recipe names runs/<exp_id>)
    r = subprocess.run([*INVOKE, "run.status", *recipe_arg], capture_output=True, text=True)
    assert r.returncode == 0 and f"Slurm job {job_id}: COMPLETED, exit code 0:0" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([*INVOKE, "run.logs", *recipe_arg], capture_output=True, text=True)
    assert r.returncode == 0 and "standin: ran a task on 3 node(s)" in r.stdout
    r = subprocess.run([*INVOKE, "run.stop", *recipe_arg], capture_output=True, text=True)
    assert r.returncode == 0 and f"ended: Slurm job {job_id} has ended (COMPLETED)" in r.stdout, r.stdout + r.stderr
    wait_for(lambda: no_ray_left(slurm_lab), 60, "Ray to end with the job")


def test_the_job_exit_code_comes_back(env, slurm_lab):
    code, out, run = submit(env, slurm.Options(nodes=1), STANDIN_EXIT="7")
    assert code == 7, out
    assert slurm.status(run)["exit_code"] == "7:0"


def test_a_failing_node_is_named_and_nothing_starts(env, slurm_lab):
    h2 = slurm_lab.net.hosts[1]
    # Something else holds the Ray agent's port on h2 (only there).
    holder = subprocess.Popen(["ip", "netns", "exec", h2.netns, sys.executable, "-c",
                               f"import socket,time; s=socket.socket(); s.bind(('0.0.0.0', {slurm.RAY_AGENT_PORT})); "
                               "s.listen(); time.sleep(600)"])
    try:
        wait_for(lambda: _listening(h2.netns, slurm.RAY_AGENT_PORT), 30, "the port holder")
        code, out, run = submit(env, slurm.Options(nodes=3))
    finally:
        holder.terminate()
        holder.wait()
    assert code == 3, out
    table = out[out.index("node  checks"):]
    h2_line = next(line for line in table.splitlines() if line.startswith("h2 "))
    assert "FAILED" in h2_line and f"port(s) {slurm.RAY_AGENT_PORT} in use" in h2_line
    assert next(line for line in table.splitlines() if line.startswith("h1 ")).split()[1] == "ok"
    assert "Ray was not started on any node" in out
    assert not (run / "submission_id").exists()
    assert no_ray_left(slurm_lab)


def test_a_node_that_cannot_join_ray_is_named_and_ray_is_stopped(env, slurm_lab):
    recipe, stack, catalog = recipe_for(env)
    h1, h3 = slurm_lab.net.hosts[0], slurm_lab.net.hosts[2]
    # h3 passes the checks but cannot reach the head's GCS port, so its Ray worker never joins.
    rule = ["OUTPUT", "-p", "tcp", "-d", h1.ip, "--dport", str(recipe.ray_port), "-j", "REJECT"]
    subprocess.run(["ip", "netns", "exec", h3.netns, "iptables", "-A", *rule], check=True)
    try:
        code, out, run = submit(env, slurm.Options(nodes=3, start_timeout=30), recipe=(recipe, stack, catalog))
    finally:
        subprocess.run(["ip", "netns", "exec", h3.netns, "iptables", "-D", *rule], check=True)
    assert code == 4, out
    table = out[out.index("not every node joined Ray within 30s"):]
    assert next(line for line in table.splitlines() if line.startswith("h3 ")).split()[1:3] == ["FAILED", "no"]
    assert f"no ALIVE node with IP {h3.ip}" in table
    assert next(line for line in table.splitlines() if line.startswith("h2 ")).split()[1] == "ok"
    assert "stopping Ray (srun steps" in out and not (run / "submission_id").exists()
    wait_for(lambda: no_ray_left(slurm_lab), 60, "every Ray process of the job to end")


def _listening(netns: str, port: int) -> bool:
    r = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c",
                        f"import socket; s=socket.socket(); print(s.connect_ex(('127.0.0.1', {port})))"],
                       capture_output=True, text=True)
    return r.stdout.strip() == "0"


def test_preflight_against_the_cluster(env, slurm_lab):
    recipe, stack, catalog = recipe_for(env)
    with pytest.raises(doctor.PreflightError) as exc:
        launch(recipe, stack, slurm_options=slurm.Options(partition="nope"), out=env / "run", catalog=catalog,
               network_checks=False, stream=io.StringIO())
    assert "partition 'nope' does not exist" in str(exc.value) and "gpu" in str(exc.value) and "small" in str(exc.value)
    with pytest.raises(doctor.PreflightError) as exc:
        launch(recipe, stack, slurm_options=slurm.Options(partition="small", nodes=2, time="01:00:00"),
               out=env / "run", catalog=catalog,
                     network_checks=False, stream=io.StringIO())
    text = str(exc.value)
    assert "2 node(s) with 2 GPU(s) each asked; partition small has 1" in text
    assert "--time 01:00:00 is over partition small's MaxTime 00:10:00" in text
    assert not (env / "run").exists()  # nothing written, nothing submitted


def test_container_mode_needs_pyxis(env, slurm_lab):
    """As far as container mode goes here: this Slurm has no pyxis, and the preflight says so
    before anything is submitted (the rendered script is checked in the unit tests)."""
    recipe, stack, catalog = recipe_for(env)
    digest = "reg.example/slimeforge@sha256:" + "0123456789abcdef" * 4
    with pytest.raises(doctor.PreflightError) as exc:
        launch(recipe, stack, slurm_options=slurm.Options(nodes=1), out=env / "run", mode="container", image=digest,
               catalog=catalog,
                     network_checks=False, stream=io.StringIO())
    assert "container mode needs the pyxis plugin, but `srun --help` has no --container-image" in str(exc.value)
    # Nor has this login node enroot: the form of the image reference cannot be chosen, and the fix says how.
    assert "slurm-enroot: cannot read enroot's version on this login node" in str(exc.value)
    assert not (env / "run").exists()


def test_cli_dry_run_and_bad_options(env, slurm_lab):
    import yaml

    data = make_recipe(env)
    path = env / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    inv = INVOKE
    r = subprocess.run([*inv, "run", str(path), "--slurm", "--dry-run", "--nodes", "2", "--out", str(env / "dry")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    one_line = re.sub(r" \\\n +", " ", r.stdout)  # the command is printed as multi-line shell, one option a line
    assert re.search(f"sbatch --parsable --chdir={re.escape(str(env / 'dry'))} --comment=slimeforge:[0-9a-f]{{32}} -- "
                     + re.escape(str(env / "dry" / "slurm.sbatch")), one_line), r.stdout
    assert "#SBATCH --nodes=2" in (env / "dry" / "slurm.sbatch").read_text()
    r = subprocess.run([*inv, "run", str(path), "--slurm", "--time", "90", "--out", str(env / "bad")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--time: is not a time limit (got '90')" in r.stderr and "Traceback" not in r.stderr
    assert not (env / "bad").exists()
    r = subprocess.run([*inv, "run", str(path), "--slurm", "--squashfs-dir", "images,x", "--out", str(env / "bad")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and ("--squashfs-dir: is not an absolute directory pyxis can read (got "
                                 "'images,x')") in r.stderr, r.stderr
    r = subprocess.run([*inv, "run", str(path), "--squashfs-dir", "/shared/images", "--out", str(env / "bad")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--squashfs-dir: goes with --slurm" in r.stderr, r.stderr
    assert not (env / "bad").exists()

