"""docs/quickstart.md, run: every command on the page that this machine can run (no GPUs, no AWS,
no network), through the real tasks, in a scratch directory where the page's /root/ paths are the
scratch directory's and the recipe is the page's own YAML block. Every command it cannot run is
listed below with the reason; a command on the page that is neither run nor listed fails the test."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "quickstart.md"
FIXTURES = ROOT / "tests" / "fixtures"
PARQUET = "/root/data/gsm8k/main/train-00000-of-00001.parquet"
NETWORK, AWS = "downloads (the network)", "reaches AWS (credentials, ECR, AgentCore)"
NOT_HERE = {
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e .":
        "installs from PyPI (the network); this test runs in that environment",
    "hf download Qwen/Qwen2.5-3B-Instruct --local-dir /root/models/Qwen2.5-3B-Instruct": NETWORK,
    "hf download openai/gsm8k --repo-type dataset --include 'main/*' --local-dir /root/data/gsm8k": NETWORK,
    "pip install pyarrow": NETWORK,
    "aws bedrock-agentcore-control list-agent-runtimes --region us-west-2 --query "
    "'agentRuntimes[].[agentRuntimeName,status,agentRuntimeArn]' --output table": AWS,
    "aws s3 mb s3://my-slime-rollouts --region us-west-2": AWS,
    "invoke build --cuda cu13": "a real build: Docker, the base image and an hour of compiling",
    "docker pull slimerl/slime:latest": NETWORK,
    "invoke doctor my-gsm8k.yaml --image slimerl/slime:latest":
        "needs slime's image (pulled from Docker Hub); an image of that layout built locally is probed in "
        "tests/integration/test_any_image.py",
    "invoke publish --cuda cu13 --registry 123456789012.dkr.ecr.us-west-2.amazonaws.com/slime": AWS,
    "invoke publish --image slimerl/slime:latest --registry 123456789012.dkr.ecr.us-west-2.amazonaws.com/slime "
    "--record slime-image.json": AWS,
    "aws ecr get-login-password --region us-west-2 | docker login --username AWS --password-stdin "
    "123456789012.dkr.ecr.us-west-2.amazonaws.com": AWS,
    "docker pull 123456789012.dkr.ecr.us-west-2.amazonaws.com/slime"
    "@sha256:aa2e2af04886292e6f1388c9f6f92687c26843188754d8a448e195d6d3593c75": AWS,
}


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", PAGE.read_text(), re.S)


def commands() -> list[str]:
    return [line.strip() for block in blocks("bash") for line in block.splitlines() if line.strip()]


def test_every_command_on_the_page_is_run_or_listed_with_its_reason():
    cmds = commands()
    assert set(NOT_HERE) <= set(cmds), sorted(set(NOT_HERE) - set(cmds))  # the list names only what the page shows
    for cmd in cmds:
        assert cmd.startswith("invoke ") or cmd in NOT_HERE, f"{cmd!r}: neither run here nor listed with a reason"


def test_the_page_from_zero_to_a_refused_launch(tmp_path):
    here = tmp_path / "here"  # the directory the reader works in (runs/ and build/ go there)
    here.mkdir()
    root = tmp_path / "root"  # the page's /root/
    (root / "models" / "Qwen2.5-3B-Instruct").mkdir(parents=True)
    shutil.copy(FIXTURES / "models" / "Qwen2.5-3B-Instruct" / "config.json", root / "models" / "Qwen2.5-3B-Instruct")
    parquet = Path(PARQUET.replace("/root/", f"{root}/"))
    parquet.parent.mkdir(parents=True)
    sample = FIXTURES / "gsm8k" / "train-sample.jsonl"
    try:  # the file `hf download` gives, made from the sample rows; without pyarrow the command reads the sample JSONL
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = [__import__("json").loads(line) for line in sample.read_text().splitlines()]
        pq.write_table(pa.table({k: [r[k] for r in rows] for k in ("question", "answer")}), parquet)
    except ImportError:
        parquet = None
    (recipe_yaml,) = blocks("yaml")
    (here / "my-gsm8k.yaml").write_text(recipe_yaml.replace("/root/", f"{root}/"))

    def invoke(cmd: str, *extra: str) -> subprocess.CompletedProcess:
        argv = [a.replace("/root/", f"{root}/") for a in shlex.split(cmd)[1:]]
        if parquet is None:
            argv = [str(sample) if a == str(Path(PARQUET.replace("/root/", f"{root}/"))) else a for a in argv]
        return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *argv, *extra], cwd=here,
                              capture_output=True, text=True, timeout=300)

    ran = []
    for cmd in commands():
        if cmd in NOT_HERE:
            continue
        task = shlex.split(cmd)[1]
        # No AWS here: the checks that reach it are left out (the page's doctor runs them on your host).
        extra = ("--no-network",) if task in ("doctor", "run") and "--dry-run" not in cmd else ()
        r = invoke(cmd, *extra)
        out = r.stdout + r.stderr
        ran.append(task)
        assert "Traceback" not in out, out
        if task == "--list":
            assert r.returncode == 0 and "data.gsm8k" in out and "doctor" in out, out
        elif task == "data.gsm8k":
            assert r.returncode == 0 and re.fullmatch(r"wrote \S+\.jsonl: 3 rows\n", r.stdout), out
        elif task == "run" and "--dry-run" in cmd:
            assert r.returncode == 0 and "recipe my-gsm8k.yaml: valid (gsm8k-3b-smoke" in out, out
            assert (here / "runs" / "gsm8k-3b-smoke" / "slime.args").is_file()
        elif task == "doctor":
            assert r.returncode == 2, out  # no GPU here
            assert re.search(r"data +ok +data_path \S+/data/gsm8k_tiny\.jsonl: first 3 rows have prompt and metadata",
                             out), out
            assert "gpus          ERROR" in out
        elif task == "lock":
            assert r.returncode == 0 and "pylock.cu13.toml: ok (" in out, out
        elif task == "build":
            assert r.returncode == 0 and "would run:\n  DOCKER_BUILDKIT=1 " in out, out
        elif task == "publish":  # nothing was built here: the dry run says so, naming the step to run first
            assert r.returncode == 2 and "run invoke build --cuda cu13 first" in out, out
        elif task == "run":  # refused before anything starts: no image named yet, no GPU
            assert r.returncode == 2 and "container mode needs an image" in out, out
            assert not (here / "runs" / "gsm8k-3b-smoke" / "container.id").exists()
        elif task in ("run.status", "run.logs", "run.stop"):  # the dry run's run directory, never launched
            assert r.returncode in (1, 2) and "never launched" in out, out
        else:
            pytest.fail(f"{cmd}: no expectation for this command")
    assert ran == ["--list", "data.gsm8k", "data.gsm8k", "run", "doctor", "lock", "build", "publish", "run",
                   "run.status", "run.logs", "run.stop"]
    assert len((root / "data" / "gsm8k_tiny.jsonl").read_text().splitlines()) == 3


def test_the_readme_links_the_page():
    assert "](docs/quickstart.md)" in (ROOT / "README.md").read_text()
