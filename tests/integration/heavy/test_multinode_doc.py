"""docs/multinode.md, run: every command on the page that this machine can run (no GPUs, no hosts,
no registry), through the real tasks, with what the page says each one does here."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "multinode.md"
RUN_DIR = "runs/gsm8k-3b-2node"
# These reach the inventory's hosts over ssh, build with Docker or push to a registry: their dry
# runs on the page are what runs here.
NEEDS_HOSTS = {"cluster.status", "cluster.down"}


def commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip().startswith("invoke ")]


def test_every_command_on_the_page_runs_as_far_as_this_machine_allows(tmp_path, monkeypatch):
    monkeypatch.setenv("SLIMEFORGE_STATE_HOME", str(tmp_path / "state"))  # no record of any bring-up here
    cmds = commands()
    tasks = [shlex.split(c)[1] for c in cmds]
    assert tasks == ["build", "build", "publish", "publish", "cluster.up", "cluster.up", "cluster.status", "run", "run",
                     "run.status", "run.logs", "run.stop", "cluster.down"]
    run_dir = tmp_path / "run"
    ran = []
    for cmd in cmds:
        argv = shlex.split(cmd)[1:]
        task = argv[0]
        argv = [str(run_dir) if a == RUN_DIR else a for a in argv]
        if task in NEEDS_HOSTS:
            continue
        if task == "build":
            argv += ["--out", str(tmp_path / "build")] if "--dry-run" in argv else []
            if "--dry-run" not in argv:
                continue  # a real build: Docker, the base image and hours
        if task == "publish" and "--dry-run" not in argv:
            continue
        if task == "cluster.up" and "--dry-run" not in argv:
            continue
        if task == "run":
            argv += ["--out", str(run_dir)]
        r = subprocess.run([sys.executable, "-m", "invoke", *argv], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
        ran.append(task)
        out = r.stdout + r.stderr
        if task == "build":
            assert r.returncode == 0 and "would run:\n  DOCKER_BUILDKIT=1 " in out, out
        elif task == "publish":  # nothing was built here: the dry run says so, naming the step to run first
            assert r.returncode == 2 and "run invoke build --cuda cu13 first" in out, out
        elif task == "cluster.up":
            assert r.returncode == 0 and ("gpu-a (head, 10.0.0.11, 8 "
                                         "GPU(s))") in out and "gpu-b (worker, gpu-b, 8 GPU(s))" in out, out
        elif task == "run" and "--dry-run" in argv:
            assert r.returncode == 0, out
            joined = re.sub(r" \\\n\s+", " ", out)  # the command as the shell reads it: continuations joined
            assert ("target ray-cluster" in out and "bash job.sh" in joined
                    and "container mode, image 123456789012.dkr.ecr" in out), out
            assert ((run_dir / "job.sh").exists()
                    and "--custom-config-path\nagentcore.yaml" in (run_dir / "slime.args").read_text())
        elif task == "run":  # no cluster was brought up from here
            assert r.returncode == 2 and "run `invoke cluster.up recipes/clusters/example.yaml` first" in out, out
        else:  # run.status / run.logs / run.stop of the rendered, never launched run
            assert r.returncode in (1, 2) and "never launched" in out and "Traceback" not in out, out
    assert ran == ["build", "publish", "cluster.up", "run", "run", "run.status", "run.logs", "run.stop"]


def test_the_seed_recipe_is_refused_on_the_example_cluster_as_the_page_says(tmp_path, monkeypatch):
    monkeypatch.setenv("SLIMEFORGE_STATE_HOME", str(tmp_path / "state"))
    r = subprocess.run([sys.executable, "-m", "invoke", "run", "recipes/gsm8k.yaml", "--cluster",
                        "recipes/clusters/example.yaml", "--dry-run",
                        "--out", str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and ("model_dir: lies outside every container "
                                 "volume") in r.stderr and "/root/models/" in r.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was written


def fenced(kind: str) -> list[str]:
    """The `invoke` lines of the page's ``` fences of this kind ("" for a plain fence), comments cut:
    read line by line, as the opening and closing fences pair up (a regex pairs a closing with the next opening)."""
    out: list[str] = []
    lang: str | None = None
    for line in PAGE.read_text().splitlines():
        if line.startswith("```"):
            lang = line[3:].strip() if lang is None else None
        elif lang == kind and line.strip().startswith("invoke "):
            out.append(shlex.join(shlex.split(line, comments=True)))
    return out


# The plain fences' commands that cannot run here, each with why (the Slurm section: a login node).
PLAIN_NOT_HERE = {
    "invoke run recipes/gsm8k.yaml --slurm --nodes 2 --partition gpu --time 04:00:00 --out /shared/runs/gsm8k":
        "submits to Slurm: no sbatch, no partition and no /shared here (its dry run is run)",
    "invoke run recipes/gsm8k.yaml --slurm --nodes 2 --mode container --image REG/repo@sha256:... --squashfs-dir "
    "/shared/images --out /shared/runs/gsm8k":
        "submits to Slurm with a placeholder image (REG/repo@sha256:...) and enroot on a shared /shared/images",
    "invoke run.status /shared/runs/gsm8k": "the run directory of a submitted Slurm job, on the cluster's shared file "
                                            "system",
    "invoke run.logs /shared/runs/gsm8k --follow": "the run directory of a submitted Slurm job, on the cluster's "
                                                   "shared file system",
    "invoke run.stop /shared/runs/gsm8k": "the run directory of a submitted Slurm job, on the cluster's shared file "
                                          "system",
}


def test_every_command_in_a_plain_fence_runs_or_is_named_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("SLIMEFORGE_STATE_HOME", str(tmp_path / "state"))
    cmds = fenced("")
    # the list names only what the page shows
    assert set(PLAIN_NOT_HERE) <= set(cmds), sorted(set(PLAIN_NOT_HERE) - set(cmds))
    ran = []
    for cmd in cmds:
        if cmd in PLAIN_NOT_HERE:
            continue
        argv = shlex.split(cmd)[1:]
        assert argv[0] == "run" and "--slurm" in argv and "--dry-run" in argv, (f"{cmd!r}: neither run here nor named "
                                                                               "with a reason")
        run_dir = tmp_path / f"run{len(ran)}"
        r = subprocess.run([sys.executable, "-m", "invoke", *argv, "--out", str(run_dir)], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
        out = r.stdout + r.stderr
        assert r.returncode == 0 and "no image given: <IMAGE> stands for --image" in out and "Traceback" not in out, out
        assert "--container-image=<IMAGE>" in (run_dir / "slurm.sbatch").read_text()
        ran.append(cmd)
    assert len(ran) == 1
