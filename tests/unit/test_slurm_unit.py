"""Slurm without a cluster: the rendered slurm.sbatch (shellcheck, every value arriving byte for
byte), the option grammar, the argv of sbatch/scontrol/scancel through the runner, the parsing
of scontrol/sinfo answers, and the health gate's test. The real cluster: tests/integration/slurm."""

from __future__ import annotations

import getpass
import json
import re
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
from helpers import absent
from launch_support import make_recipe

from slimeforge.errors import ConfigError, SlimeforgeError
from slimeforge.proc import Result, Runner
from slimeforge.run.recipe import parse_recipe
from slimeforge.run.targets import slurm, slurm_checks
from slimeforge.run.targets.base import Command, ResolvedRun
from slimeforge.scripts.node_agent import gate

# No newline or tab: recipes refuse control characters in every value (tests/unit/hostile).
HOSTILE = "it's \"q\" $(touch /tmp/sf-slurm-pwned) `id` ; rm -rf * \\ $HOME"
DIGEST = "reg.example/slimeforge@sha256:" + "0123456789abcdef" * 4


class Canned(Runner):
    """A runner that answers from a table ({argv prefix: stdout}) and records every argv."""

    def __init__(self, answers: dict[tuple[str, ...], str | tuple[int, str]]):
        super().__init__()
        self.answers = answers

    def run(self, argv, **kwargs):
        argv = [str(a) for a in argv]
        self.history.append(argv)
        for prefix, answer in self.answers.items():
            if tuple(argv[: len(prefix)]) == prefix:
                code, out = answer if isinstance(answer, tuple) else (0, answer)
                return Result(argv, code, out, "")
        raise AssertionError(f"unexpected command {argv}")


def recipe(tmp: Path, **over):
    data = make_recipe(tmp, num_gpus=2, **over)
    return parse_recipe(data, "test")


def render(tmp: Path, opts: slurm.Options | None = None, out: Path | None = None, **over):
    rec, stack = recipe(tmp, **over)
    opts = opts or slurm.Options(nodes=2)
    rec = slurm.on_slurm(rec, opts)
    run = ResolvedRun(rec, stack, (out or tmp / "run").resolve(), "(api)", {"SLIMEFORGE_PYTHON": "/opt/venv/bin/python"})
    return rec, slurm.SlurmTarget(opts).plan(run).rundir


def assigned(script: str, names: list[str]) -> list[str]:
    """The values bash gives these variables (arrays expanded) after the file's assignments."""
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("RUN_DIR="))
    end = next(i for i, line in enumerate(lines) if line.startswith("log() {"))
    body = "\n".join(line for line in lines[start:end] if not line.startswith(("export PATH", "mkdir")))
    probe = body + "\nprintf '%s\\0' " + " ".join(f'"${{{n}[@]}}"' for n in names) + "\n"
    res = subprocess.run(["bash", "-c", probe], capture_output=True, env={"SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin"}, check=True)
    return res.stdout.decode().split("\0")[:-1]


@pytest.mark.parametrize("mode", ["host", "container"])
def test_sbatch_is_shellcheck_clean_and_says_what_slurm_needs(tmp_path, mode):
    over = {"mode": mode, "image": DIGEST} if mode == "container" else {}
    _, run = render(tmp_path, slurm.Options(nodes=3, partition="gpu", account="ml-team", time="1-02:00:00"), **over)
    text = run.files["slurm.sbatch"]
    path = tmp_path / "slurm.sbatch"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    if shutil.which("shellcheck") is None:
        absent("shellcheck not installed (apt-get install shellcheck)")
    res = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout
    header = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert header == ["#SBATCH --job-name=sf-sf-launch-test", "#SBATCH --nodes=3", "#SBATCH --ntasks-per-node=1", "#SBATCH --gres=gpu:2",
                      "#SBATCH --exclusive", "#SBATCH --partition=gpu", "#SBATCH --account=ml-team", "#SBATCH --time=1-02:00:00",
                      "#SBATCH --output=slurm-%j.out", "#SBATCH --open-mode=append", "#SBATCH --requeue"]
    assert ("--container-image=" + DIGEST in text) == (mode == "container")
    assert set(run.files) >= {"slime.args", "launch.sh", "slurm.sbatch", "node_agent.py", "plan.json"}
    assert list(run.files)[-1] == "plan.json" and run.plan["slurm"]["nodes"] == 3
    assert "--actor-num-nodes" in run.args and run.args[run.args.index("--actor-num-nodes") + 1] == "3"


def test_hostile_paths_arrive_byte_for_byte(tmp_path):
    base = tmp_path / "x"
    base.mkdir()
    ckpt = str(base / f"ckpt {HOSTILE}")
    rec, run = render(tmp_path, out=base / f"run {HOSTILE}", checkpoint_dir=ckpt, mode="container", image=DIGEST)
    values = assigned(run.files["slurm.sbatch"], ["RUN_DIR", "CHECKPOINT_DIR", "HEAD_PARAMS", "CHECK_PARAMS", "CONTAINER"])
    assert values[0] == str(run.path) and values[1] == ckpt
    assert json.loads(values[2])["argv"][:3] == ["ray", "start", "--block"]
    assert json.loads(values[3])["gpus"] == 2
    assert values[4] == f"--container-image={DIGEST}" and f"{run.path}:{run.path}" in values[5] and values[6] == f"--container-workdir={run.path}"
    assert not Path("/tmp/sf-slurm-pwned").exists()


def test_container_paths_pyxis_cannot_mount_are_refused(tmp_path):
    # The recipe's paths by their field (issue 33: every container target mounts them), before any target plans.
    with pytest.raises(ConfigError) as exc:
        render(tmp_path, mode="container", image=DIGEST, checkpoint_dir=str(tmp_path / "a,b"), out=tmp_path / "r:1")
    assert "checkpoint_dir: holds ','" in str(exc.value)
    # The run directory (--out) where the mounts are made.
    with pytest.raises(ConfigError) as exc:
        render(tmp_path, mode="container", image=DIGEST, out=tmp_path / "r:1")
    assert "run directory: holds ':', which splits a container mount" in str(exc.value)


def test_option_grammar_every_problem_at_once():
    with pytest.raises(ConfigError) as exc:
        slurm.options(partition="gpu;rm", account="-x", time="25:00", nodes="0")
    text = str(exc.value)
    assert "4 problem(s)" in text
    for part in ("--partition: is not a Slurm name (got 'gpu;rm')", "--account: is not a Slurm name (got '-x')",
                 "--time: is not a time limit (got '25:00'); accepted: [D-]HH:MM:SS", "--nodes: is not a node count (got '0')"):
        assert part in text
    for bad_time in ("1:00:00\n", "00:60:00", "x-01:00:00", ""):
        with pytest.raises(ConfigError):
            slurm.options(time=bad_time)
    opts = slurm.options(partition="gpu.a100_x", account="proj-1", time="2-04:00:00", nodes="16")
    assert opts.nodes == 16 and opts.time == "2-04:00:00"


@pytest.mark.parametrize("text,secs", [("UNLIMITED", None), ("30", 1800), ("10:00", 600), ("02:00:00", 7200),
                                       ("1-00:00:00", 86400), ("2-12", 216000), ("1-01:30", 91800)])
def test_slurm_time_formats(text, secs):
    assert slurm_checks.seconds(text) == secs


@pytest.mark.parametrize("gres,gpus", [("gpu:8", 8), ("gpu:h100:4", 4), ("gpu:h100:4(S:0-1)", 4), ("gpu:a:2,gpu:b:2", 4),
                                       ("(null)", 0), ("nic:1,gpu:2", 2)])
def test_gres_gpu_counts(gres, gpus):
    assert slurm_checks.gres_gpus(gres) == gpus


def SBATCH(run_dir: Path, token: str | None = None) -> Command:
    return Command(tuple(slurm.sbatch_argv(run_dir, token)), "sbatch", (("SLIMEFORGE_RUN_TOKEN", token),) if token else ())


def test_submit_argv_and_job_id_record(tmp_path):
    runner = Canned({("sbatch",): "4242;cluster\n"})
    token = "f" * 32
    assert slurm.submit(tmp_path, SBATCH(tmp_path, token), runner, token) == "4242"
    assert (tmp_path / "run_token").read_text() == token + "\n"  # recorded before sbatch ran
    # The run token goes to the job twice: its comment (what run.stop compares) and launch.sh's environment.
    assert runner.history == [["sbatch", "--parsable", f"--chdir={tmp_path}", f"--comment=slimeforge:{token}", "--", str(tmp_path / "slurm.sbatch")]]
    assert (tmp_path / "slurm_job_id").read_text() == "4242\n"
    assert re.fullmatch(r"\d+\.\d{3}\n", (tmp_path / "slurm_submitted_at").read_text())
    with pytest.raises(SlimeforgeError, match="expected a job id"):
        slurm.submit(tmp_path, SBATCH(tmp_path, token), Canned({("sbatch",): "Submitted batch job 1\n"}), token)


def plan(**extra) -> str:
    """The smallest plan.json that render.read_plan accepts as slimeforge's."""
    return json.dumps({"slimeforge_version": "0.1.0", "exp_id": "exp1", "recipe": {"ray_port": 6379, "ray_dashboard_port": 8265}, **extra})


TOKEN = "0123456789abcdef0123456789abcdef"


def stop_dir(tmp: Path, job_id: str = "77") -> Path:
    (tmp / "plan.json").write_text(plan(slurm={}))
    (tmp / "slurm_job_id").write_text(job_id + "\n")
    (tmp / "run_token").write_text(TOKEN + "\n")
    return tmp


def scontrol(run: Path, **over) -> str:
    """`scontrol show job -o` of the job this run submitted, with fields replaced by `over`."""
    job = {"JobId": "77", "JobName": "sf-exp1", "UserId": f"{getpass.getuser()}(0)", "JobState": "RUNNING", "Reason": "None",
           "ExitCode": "0:0", "Comment": f"slimeforge:{TOKEN}", "WorkDir": str(run.resolve()), "SubmitTime": "2026-11-25T08:00:00", **over}
    return " ".join(f"{k}={v}" for k, v in job.items()) + "\n"


def test_stop_cancels_only_the_recorded_job_by_id(tmp_path):
    run = stop_dir(tmp_path)
    runner = Canned({("scontrol", "show", "job"): scontrol(run), ("scancel",): ""})
    said = []
    assert slurm.stop(run, runner, say=said.append) == 0
    assert runner.history == [["scontrol", "show", "job", "-o", "--", "77"], ["scancel", "--", "77"]]
    assert said == ["stopped: Slurm job 77: cancel sent (Ray and the job in the allocation stop with it)"]
    assert slurm.is_slurm_run(run)


@pytest.mark.parametrize("field,value", [("JobName", "other"), ("UserId", "mallory(1001)"), ("Comment", "(null)"),
                                         ("Comment", "slimeforge:" + "f" * 32), ("WorkDir", "/tmp/elsewhere")])
def test_stop_refuses_a_job_id_that_is_someone_elses_now(tmp_path, field, value):
    """A job id Slurm reused: any of user, name, comment token and working directory differs -> refused, never cancelled."""
    run = stop_dir(tmp_path)
    runner = Canned({("scontrol", "show", "job"): scontrol(run, **{field: value})})
    said = []
    assert slurm.stop(run, runner, say=said.append) == 1
    assert ["scancel", "--", "77"] not in runner.history
    assert said[0].startswith("refused: Slurm job 77 is not this run's") and repr(value.split("(1001)")[0]) in said[0]
    with pytest.raises(SlimeforgeError, match="refused"):  # status and logs refuse it too: never shown as ours
        slurm.status(run, runner)


def test_stop_compares_the_recorded_submit_time(tmp_path):
    run = stop_dir(tmp_path)
    (run / "slurm_submitted_at").write_text(f"{datetime(2026, 11, 25, 8, 0, 1).timestamp():.3f}\n")
    ok = Canned({("scontrol", "show", "job"): scontrol(run), ("scancel",): ""})
    assert slurm.stop(run, ok, say=lambda s: None) == 0
    later = Canned({("scontrol", "show", "job"): scontrol(run, SubmitTime="2026-11-26T09:00:00")})
    said = []
    assert slurm.stop(run, later, say=said.append) == 1 and "submit time" in said[0]


def test_stop_of_an_ended_or_forgotten_job_cancels_nothing_and_exits_0(tmp_path):
    run = stop_dir(tmp_path)
    done = Canned({("scontrol", "show", "job"): scontrol(run, JobState="COMPLETED")})
    assert slurm.stop(run, done, say=lambda s: None) == 0 and all(a[0] != "scancel" for a in done.history)
    gone = Canned({("scontrol", "show", "job"): (1, "slurm_load_jobs error: Invalid job id specified\n")})
    said = []
    assert slurm.stop(run, gone, say=said.append) == 0 and all(a[0] != "scancel" for a in gone.history)
    assert "unknown to Slurm" in said[0]


def test_stop_when_slurm_does_not_answer_cancels_nothing_and_fails(tmp_path):
    run = stop_dir(tmp_path)
    down = Canned({("scontrol", "show", "job"): (1, "slurm_load_jobs error: Unable to contact slurm controller\n")})
    said = []
    assert slurm.stop(run, down, say=said.append) == 1 and "does not answer" in said[0]


def test_a_tampered_job_id_record_is_refused(tmp_path):
    run = stop_dir(tmp_path, job_id="77; rm -rf /")
    with pytest.raises(ConfigError, match="slurm_job_id: is not a record slimeforge writes"):
        slurm.stop(run, Canned({}), say=lambda s: None)


def test_cluster_findings_from_scontrol_and_sinfo(tmp_path):
    rec, _ = recipe(tmp_path)
    runner = Canned({
        ("sinfo", "-h", "-o", "%P"): "gpu*\nsmall\n",
        ("scontrol", "show", "partition"): "PartitionName=gpu State=UP MaxTime=02:00:00 MaxNodes=2 TotalNodes=3\n",
        ("sinfo", "-h", "-N"): "n1|gpu:2|idle\nn2|gpu:h100:2(S:0)|mix\nn3|gpu:2|drain\n",
    })
    found = [(f.check, f.level, f.message) for f in slurm_checks.cluster_findings(rec, slurm.Options(nodes=3, time="03:00:00"), runner)]
    assert found[0][:2] == ("slurm-partition", "ok")
    assert ("slurm-nodes", "error", "3 node(s) asked, partition gpu allows 2 per job") in found
    assert ("slurm-time", "error", "--time 03:00:00 is over partition gpu's MaxTime 02:00:00") in found
    assert ["scontrol", "show", "partition", "-o", "--", "gpu"] in runner.history and ["srun", "--help"] not in runner.history
    # Drained nodes do not count: 2 nodes fit, 3 asked.
    runner.answers[("scontrol", "show", "partition")] = "PartitionName=gpu State=UP MaxTime=UNLIMITED MaxNodes=UNLIMITED\n"
    msgs = [f.message for f in slurm_checks.cluster_findings(rec, slurm.Options(nodes=3), runner) if f.level == "error"]
    assert msgs == ["3 node(s) with 2 GPU(s) each asked; partition gpu has 2 such node(s) in service (of 3: n1 gpu:2, n2 gpu:2, n3 gpu:2)"]


def test_container_mode_asks_srun_for_pyxis(tmp_path):
    rec, _ = recipe(tmp_path, mode="container", image=DIGEST)
    answers = {("sinfo", "-h", "-o", "%P"): "gpu*\n", ("scontrol", "show", "partition"): "PartitionName=gpu State=UP MaxTime=UNLIMITED\n",
               ("sinfo", "-h", "-N"): "n1|gpu:2|idle\n"}
    with_pyxis = Canned({**answers, ("srun", "--help"): "      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH\n"})
    assert ("slurm-container", "ok") in [(f.check, f.level) for f in slurm_checks.cluster_findings(rec, slurm.Options(), with_pyxis)]
    without = Canned({**answers, ("srun", "--help"): "      --container=PATH   OCI bundle\n"})
    assert ("slurm-container", "error") in [(f.check, f.level) for f in slurm_checks.cluster_findings(rec, slurm.Options(), without)]


def test_exit_codes_from_scontrol():
    assert slurm.exit_code({"ExitCode": "0:0"}) == 0
    assert slurm.exit_code({"ExitCode": "3:0"}) == 3
    assert slurm.exit_code({"ExitCode": "0:15"}) == 143
    assert slurm.exit_code({}) == 1


def test_the_health_gate_test():
    nodes = [{"node_ip": "10.0.0.1", "state": "ALIVE", "resources_total": {"GPU": 2.0}},
             {"node_ip": "10.0.0.2", "state": "ALIVE", "resources_total": {"GPU": 1.0}},
             {"node_ip": "10.0.0.3", "state": "DEAD", "resources_total": {"GPU": 2.0}}]
    assert gate(nodes, {"10.0.0.1": 2, "10.0.0.2": 2, "10.0.0.3": 2}) == {
        "10.0.0.1": (True, "10.0.0.1 ALIVE, 2 GPU(s)"),
        "10.0.0.2": (False, "registered from 10.0.0.2 with 1 GPU(s), expected 2"),
        "10.0.0.3": (False, "no ALIVE node with IP 10.0.0.3"),
    }


def test_only_a_submitted_slurm_render_is_a_slurm_run(tmp_path):
    run = stop_dir(tmp_path)
    assert slurm.is_slurm_run(run)
    # A later plain `invoke run` rewrites plan.json without "slurm": run.* act on its Ray job again.
    (run / "plan.json").write_text(plan())
    assert not slurm.is_slurm_run(run)
    assert not slurm.is_slurm_run(tmp_path / "missing")
