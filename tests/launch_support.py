"""Helpers for the launch and doctor tests: a fake nvidia-smi fed with real captures, a recipe
around the stand-in slime_dir, a flag catalog, and a real Ray head on free ports."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from helpers import free_port

from slimeforge.proc import Result, Runner

FIXTURES = Path(__file__).resolve().parent / "fixtures"
VENV_BIN = Path(sys.executable).parent
ARN = "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/gsm8k_agent-a1B2c3D4e5"


def fake_nvidia_smi(bin_dir: Path, capture: str) -> Path:
    """An `nvidia-smi` that prints what the real one printed on `capture` (tests/fixtures/gpu/)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    csv = FIXTURES / "gpu" / capture / "query-gpu.csv"
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        "# Fake nvidia-smi: answers the --query-gpu call with a capture from a real host.\n"
        'case "$*" in\n'
        "  *--query-gpu=index,name,uuid,driver_version,memory.total,compute_cap,pci.bus_id*--format=csv*) exec cat "
        f"'{csv}' ;;\n"
        "esac\n"
        'echo "fake nvidia-smi: unsupported arguments: $*" >&2\nexit 2\n'
    )
    script.chmod(0o755)
    return bin_dir


def write_data(path: Path, rows: int = 3) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for i in range(rows):
            fh.write(json.dumps({"prompt": f"What is {i} + {i}?", "metadata": {"answer": str(2 * i)}}) + "\n")
    return path


def make_recipe(tmp: Path, model: str = "Qwen2.5-3B-Instruct", model_type: str = "qwen2.5-3B", **over) -> dict:
    """Recipe data for the stand-in slime_dir (train.py records argv/env) and a copied config.json."""
    slime = tmp / "slime"
    if not slime.exists():
        shutil.copytree(FIXTURES / "slime", slime)
    model_dir = tmp / "models" / model
    model_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / "models" / model / "config.json", model_dir / "config.json")
    data = write_data(tmp / "data" / "train.jsonl")
    data_dict = {
        "exp_id": "sf-launch-test",
        # A runtime the test's moto server holds, when a fixture made one (else a made-up ARN).
        "agent_runtime_arn": os.environ.get("SF_TEST_RUNTIME_ARN", ARN),
        "s3_bucket": "sf-launch-test-bucket",
        "model_dir": str(model_dir),
        "data_path": str(data),
        "model_type": model_type,
        "num_gpus": 1,
        "tp_size": 1,
        "rollout_gpus_per_engine": 1,
        "slime_dir": str(slime),
        "megatron_dir": str(tmp / "Megatron-LM"),
        "mode": "host",
        "checkpoint_dir": str(tmp / "checkpoints"),
        "ray_port": free_port(),
        "ray_dashboard_port": free_port(),
        "gateway_port": free_port(),
        "env": {"STANDIN_RECORD": str(tmp / "record.json"), "STANDIN_EXIT": "0"},
    }
    data_dict.update(over)
    return data_dict


def write_catalog(path: Path, recipe, stack, drop: tuple[str, ...] = ()) -> Path:
    """A flag catalog holding every flag this recipe renders plus the model script's (minus `drop`):
    what a build writes for the stand-in slime."""
    from slimeforge.proc import Runner
    from slimeforge.run.flags import env_json, render_flags
    from slimeforge.run.modelscript import eval_model_script, model_script
    from slimeforge.run.preflight.flagcheck import flags_in

    own = recipe.model_copy(update={"extra_flags": []})  # a user's extra flags are what is checked
    args = render_flags(own, stack, config_path="x", env_json=env_json({}), wandb=True)
    margs = eval_model_script(model_script(own), own.slime_dir, Runner())
    flags = sorted(set(flags_in([*args, *margs, "--use-wandb", "--wandb-project", "--wandb-group"])) - set(drop))
    path.write_text(json.dumps({"slime_commit": "0" * 40, "flags": flags}))
    return path


def short_tmp(prefix: str = "sf-") -> Path:
    """Ray's socket paths must stay under ~107 bytes: a short dir under /tmp."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def head_extra_args(temp_dir: Path) -> list[str]:
    """Options that keep a test head off every fixed default port and out of /tmp/ray."""
    return ["--temp-dir", str(temp_dir), "--ray-client-server-port", str(free_port()),
            "--dashboard-agent-listen-port", str(free_port()), "--num-cpus", "2",
            "--object-store-memory", str(200 * 2**20)]


class RayHead:
    """`ray start --head --block` on free ports; stopped by SIGTERM to its own pid."""

    def __init__(self, num_gpus: int = 1):
        self.temp_dir = short_tmp()
        self.port, self.dashboard_port = free_port(), free_port()
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        self.argv = [str(VENV_BIN / "ray"), "start", "--head", "--block", "--port", str(self.port),
                     "--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dashboard_port),
                     "--num-gpus", str(num_gpus), "--disable-usage-stats", *head_extra_args(self.temp_dir)]
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 180) -> RayHead:
        from ray.job_submission import JobSubmissionClient

        self.log = open(self.temp_dir / "head.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray head exited: {(self.temp_dir / 'head.log').read_text()[-3000:]}")
            try:
                JobSubmissionClient(self.address).list_jobs()
                return self
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.5)
        raise RuntimeError("ray head did not come up")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.3):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")




def read_args(path: str | Path) -> list[str]:
    """slime.args back into an argv list, byte for byte (values with newlines span quoted lines)."""
    return shlex.split(Path(path).read_text())


def stop_recorded_head(sdir: Path, say=print, timeout: float = 60) -> int | None:
    """For tests and benchmarks: SIGTERM the head a launch recorded in `sdir` if that very process
    (pid, start time, boot id) still runs, as launch.sh does before starting its own."""
    from slimeforge.proc import pid_alive
    from slimeforge.run.headstate import HEAD_RECORD, recorded_head

    pid = recorded_head(sdir)
    if pid:
        say(f"stopping the Ray head of an earlier launch (pid {pid})")
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.2)
    (sdir / HEAD_RECORD).unlink(missing_ok=True)
    return pid


# --- an environment like slime's container, for a run in place (SlimeRunner without mode/image) ---

IN_PLACE_ARGUMENTS = '''"""Stand-in of slime's argument entry point (slime.utils.arguments:parse_args): one parser
holding the options the real slime has for this recipe; an option it does not know ends the run, as slime's
parser would refuse it."""

import argparse

FLAGS = {flags!r}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="slime (stand-in)", allow_abbrev=False)
    for flag in FLAGS:
        parser.add_argument(flag, nargs="*")
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error("unrecognized arguments: " + " ".join(unknown))
    return args
'''

IN_PLACE_TRAIN = '''"""Stand-in of slime's train.py in place: parses its argv with slime's own parser, checks the
AgentCore config it is handed, records what it saw beside itself (record.json), exits 0."""

import json
import os
import sys
import time

import yaml

from slime.utils.arguments import parse_args

started = time.time()
args = parse_args(sys.argv[1:])
missing = [f for f in ("hf_checkpoint", "prompt_data", "custom_config_path", "num_rollout") if not getattr(args, f)]
if missing:
    sys.exit(f"standin: missing {{missing}}")
with open(args.custom_config_path[0]) as fh:
    config = yaml.safe_load(fh)
backend = config["rollout_session_backend"]
if (not backend["agentcore_runtime_arn"].startswith("arn:aws:bedrock-agentcore:")
        or not backend["rollout_output_s3"].startswith("s3://")):
    sys.exit(f"standin: the AgentCore config names no runtime or bucket: {{backend}}")
record = os.path.join(os.path.dirname(os.path.abspath(__file__)), "record.json")
with open(record + ".tmp", "w") as fh:
    json.dump({{"argv": sys.argv, "started": started, "python": sys.executable, "config": config}}, fh)
os.replace(record + ".tmp", record)
print(f"standin: slime's parser took {{len(sys.argv) - 1}} arguments; "
      f"AgentCore runtime {{backend['agentcore_runtime_arn']}}", flush=True)
'''


def slime_scripts(slime: Path) -> Path:
    """The model scripts of the stand-in slime at `slime` (what the recipe's model_type names)."""
    if not (slime / "scripts").exists():
        shutil.copytree(FIXTURES / "slime" / "scripts", slime / "scripts")
    return slime


def slime_in_place(slime: Path, recipe, stack) -> Path:
    """A slime tree as slime's container has one at /root/slime: train.py, the slime package (its
    argument entry point knows every option this recipe renders and its model script adds) and
    the model scripts. flag_catalog.py reads it as it reads the real one."""
    from slimeforge.proc import Runner
    from slimeforge.run.flags import env_json, render_flags
    from slimeforge.run.modelscript import eval_model_script, model_script
    from slimeforge.run.preflight.flagcheck import flags_in

    slime_scripts(slime)
    own = recipe.model_copy(update={"extra_flags": []})
    args = render_flags(own, stack, config_path="x", env_json=env_json({}), wandb=True)
    margs = eval_model_script(model_script(own), own.slime_dir, Runner())
    flags = sorted(set(flags_in([*args, *margs, "--use-wandb", "--wandb-project", "--wandb-group"])))
    (slime / "slime" / "utils").mkdir(parents=True, exist_ok=True)
    (slime / "slime" / "__init__.py").write_text("")
    (slime / "slime" / "utils" / "__init__.py").write_text("")
    (slime / "slime" / "utils" / "arguments.py").write_text(IN_PLACE_ARGUMENTS.format(flags=flags))
    (slime / "train.py").write_text(IN_PLACE_TRAIN.format())
    return slime


class Canned(Runner):
    """A runner that answers from a table ({argv prefix: stdout, (code, stdout) or (code, stdout, stderr)})
    and records every argv (the Slurm tests' scontrol, squeue, sbatch, ...)."""

    def __init__(self, answers: dict[tuple[str, ...], str | tuple]):
        super().__init__()
        self.answers = answers

    def run(self, argv, **kwargs):
        argv = [str(a) for a in argv]
        self.history.append(argv)
        for prefix, answer in self.answers.items():
            if tuple(argv[: len(prefix)]) == prefix:
                code, out, err = (*answer, "")[:3] if isinstance(answer, tuple) else (0, answer, "")
                return Result(argv, code, out, err)
        raise AssertionError(f"unexpected command {argv}")


class StandInChecks:
    """A cluster's checks (jobsubmit.ClusterChecks) without an inventory: the recipe adopted as it
    is, no static problem, the live steps handed to `preflight` and `heal` when given."""

    def __init__(self, preflight=None, heal=None):
        self.on_preflight, self.on_heal = preflight, heal

    def adopt(self, recipe, mode_given):
        return recipe

    def check(self, recipe):
        return []

    def preflight(self, recipe, say):
        if self.on_preflight is not None:
            self.on_preflight(recipe, say)

    def credentials(self, recipe, say, network):
        pass

    def heal(self, say):
        if self.on_heal is not None:
            self.on_heal(say)
