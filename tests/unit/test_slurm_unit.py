"""Slurm without a cluster: the rendered slurm.sbatch (shellcheck, every value arriving byte for
byte), the option grammar, the argv of sbatch/scontrol/scancel through the runner, the parsing
of scontrol/sinfo answers, and the health gate's test. The real cluster: tests/integration/slurm."""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
from helpers import absent
from launch_support import Canned, make_recipe

from slimeforge.errors import CommandError, ConfigError, SlimeforgeError
from slimeforge.run.recipecheck import parse_recipe
from slimeforge.run.targets import enroot, slurm, slurm_checks
from slimeforge.run.targets.base import Command, ResolvedRun
from slimeforge.scripts.raynodes import gate

# No newline or tab: recipes refuse control characters in every value (tests/unit/hostile).
HOSTILE = "it's \"q\" $(touch /tmp/sf-slurm-pwned) `id` ; rm -rf * \\ $HOME"
DIGEST = "reg.example/slimeforge@sha256:" + "0123456789abcdef" * 4


def recipe(tmp: Path, **over):
    data = make_recipe(tmp, num_gpus=2, **over)
    return parse_recipe(data, "test")


def render(tmp: Path, opts: slurm.Options | None = None, out: Path | None = None, **over):
    rec, stack = recipe(tmp, **over)
    opts = opts or slurm.Options(nodes=2)
    rec = slurm.on_slurm(rec, opts)
    run = ResolvedRun(rec, stack, (out or tmp / "run").resolve(), "(api)",
                      {"SLIMEFORGE_PYTHON": "/opt/venv/bin/python"})
    return rec, slurm.SlurmTarget(opts).plan(run).rundir


def assigned(script: str, names: list[str]) -> list[str]:
    """The values bash gives these variables (arrays expanded) after the file's assignments."""
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("RUN_DIR="))
    end = next(i for i, line in enumerate(lines) if line.startswith("log() {"))
    body = "\n".join(line for line in lines[start:end] if not line.startswith(("export PATH", "mkdir")))
    probe = body + "\nprintf '%s\\0' " + " ".join(f'"${{{n}[@]}}"' for n in names) + "\n"
    res = subprocess.run(["bash", "-c", probe], capture_output=True, env={"SLURM_JOB_ID": "7",
                                                                          "PATH": "/usr/bin:/bin"}, check=True)
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
    assert header == ["#SBATCH --job-name=sf-sf-launch-test", "#SBATCH --nodes=3", "#SBATCH --ntasks-per-node=1",
                      "#SBATCH --gres=gpu:2",
                      "#SBATCH --exclusive", "#SBATCH --partition=gpu", "#SBATCH --account=ml-team",
                      "#SBATCH --time=1-02:00:00",
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
    values = assigned(run.files["slurm.sbatch"], ["RUN_DIR", "CHECKPOINT_DIR", "HEAD_PARAMS", "CHECK_PARAMS",
                                                  "CONTAINER"])
    assert values[0] == str(run.path) and values[1] == ckpt
    assert json.loads(values[2])["argv"][:3] == ["ray", "start", "--block"]
    assert json.loads(values[3])["gpus"] == 2
    assert (values[4] == f"--container-image={DIGEST}" and f"{run.path}:{run.path}" in values[5]
            and values[6] == f"--container-workdir={run.path}")
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
                 "--time: is not a time limit (got '25:00'); accepted: [D-]HH:MM:SS",
                 "--nodes: is not a node count (got '0')"):
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


@pytest.mark.parametrize("gres,gpus", [("gpu:8", 8), ("gpu:h100:4", 4), ("gpu:h100:4(S:0-1)", 4), ("gpu:a:2,gpu:b:2",
                                                                                                   4),
                                       ("(null)", 0), ("nic:1,gpu:2", 2)])
def test_gres_gpu_counts(gres, gpus):
    assert slurm_checks.gres_gpus(gres) == gpus


def SBATCH(run_dir: Path, token: str | None = None) -> Command:
    return Command(tuple(slurm.sbatch_argv(run_dir, token)), "sbatch", (("SLIMEFORGE_RUN_TOKEN",
                                                                         token),) if token else ())


def test_submit_argv_and_job_id_record(tmp_path):
    runner = Canned({("sbatch",): "4242;cluster\n"})
    token = "f" * 32
    assert slurm.submit(tmp_path, SBATCH(tmp_path, token), runner, token) == "4242"
    assert (tmp_path / "run_token").read_text() == token + "\n"  # recorded before sbatch ran
    # The run token goes to the job twice: its comment (what run.stop compares) and launch.sh's environment.
    assert runner.history == [["sbatch", "--parsable", f"--chdir={tmp_path}", f"--comment=slimeforge:{token}", "--",
                               str(tmp_path / "slurm.sbatch")]]
    assert (tmp_path / "slurm_job_id").read_text() == "4242\n"
    assert re.fullmatch(r"\d+\.\d{3}\n", (tmp_path / "slurm_submitted_at").read_text())
    with pytest.raises(SlimeforgeError, match="expected a job id"):
        slurm.submit(tmp_path, SBATCH(tmp_path, token), Canned({("sbatch",): "Submitted batch job 1\n"}), token)


def plan(**extra) -> str:
    """The smallest plan.json that render.read_plan accepts as slimeforge's."""
    return json.dumps({"slimeforge_version": "0.1.0", "exp_id": "exp1", "recipe": {"ray_port": 6379,
                                                                                   "ray_dashboard_port": 8265},
                       **extra})


TOKEN = "0123456789abcdef0123456789abcdef"


def stop_dir(tmp: Path, job_id: str = "77") -> Path:
    (tmp / "plan.json").write_text(plan(slurm={}))
    (tmp / "slurm_job_id").write_text(job_id + "\n")
    (tmp / "run_token").write_text(TOKEN + "\n")
    return tmp


def job_fields(run: Path, **over) -> dict[str, str]:
    """In scontrol's order: Comment between WorkDir and StdErr."""
    fields = {"JobId": "77", "JobName": "sf-exp1", "UserId": f"{getpass.getuser()}(0)", "JobState": "RUNNING",
              "Reason": "None",
              "ExitCode": "0:0", "SubmitTime": "2026-11-25T08:00:00", "Command": "(null)",
              "WorkDir": str(run.resolve()),
              "Comment": f"slimeforge:{TOKEN}", "StdErr": f"{run}/slurm-77.out", "StdOut": f"{run}/slurm-77.out"}
    return {k: over.get(k, v) for k, v in fields.items()}


def scontrol(run: Path, **over) -> str:
    """`scontrol show job -o` of the job this run submitted, with fields replaced by `over`."""
    return " ".join(f"{k}={v}" for k, v in job_fields(run, **over).items()) + "\n"


def squeue_json(run: Path, **over) -> str:
    """The same job as Slurm 22.05's `squeue --json` lists it (every job it knows: another one too)."""
    f = job_fields(run, **over)
    code, sig = map(int, f["ExitCode"].split(":"))
    job = {"job_id": int(f["JobId"]), "name": f["JobName"], "user_name": f["UserId"].split("(")[0],
           "job_state": f["JobState"],
           "state_reason": f["Reason"], "exit_code": code << 8 | sig,
           "comment": "" if f["Comment"] == "(null)" else f["Comment"],
           "current_working_directory": f["WorkDir"],
           "submit_time": int(datetime.fromisoformat(f["SubmitTime"]).timestamp()),
           "nodes": "h1", "restart_cnt": 0}
    other = {**job, "job_id": 5, "comment": f"slimeforge:{TOKEN}", "name": "sf-exp1"}
    return json.dumps({"meta": {}, "errors": [], "jobs": [other, job]})


OLD_SQUEUE = (1, "", "squeue: unrecognized option '--json'\n")


@pytest.fixture(params=["json", "line"])
def answer(request):
    """Slurm's answer about job 77 in either dialect: squeue --json, or (no --json) scontrol -o."""
    def make(run: Path, **over) -> dict[tuple[str, ...], str | tuple]:
        if request.param == "json":
            return {("squeue",): squeue_json(run, **over)}
        return {("squeue",): OLD_SQUEUE, ("scontrol", "show", "job"): scontrol(run, **over)}
    make.dialect = request.param  # type: ignore[attr-defined]
    return make


def test_stop_cancels_only_the_recorded_job_by_id(tmp_path, answer):
    run = stop_dir(tmp_path)
    runner = Canned({**answer(run), ("scancel",): ""})
    said = []
    assert slurm.stop(run, runner, say=said.append) == 0
    asked = [["squeue", "--json", "--states=all", "--jobs=77"]] + ([["scontrol", "show", "job", "-o", "--",
                                                                     "77"]] if answer.dialect == "line" else [])
    assert runner.history == [*asked, ["scancel", "--", "77"]]
    assert said == ["stopped: Slurm job 77: cancel sent (Ray and the job in the allocation stop with it)"]
    assert slurm.is_slurm_run(run)


@pytest.mark.parametrize("field,value", [("JobName", "other"), ("UserId", "mallory(1001)"), ("Comment", "(null)"),
                                         ("Comment", "slimeforge:" + "f" * 32), ("WorkDir", "/tmp/elsewhere")])
def test_stop_refuses_a_job_id_that_is_someone_elses_now(tmp_path, field, value, answer):
    """A job id Slurm reused: any of user, name, comment token and working directory differs -> refused, never
    cancelled."""
    run = stop_dir(tmp_path)
    runner = Canned(answer(run, **{field: value}))
    said = []
    assert slurm.stop(run, runner, say=said.append) == 1
    assert ["scancel", "--", "77"] not in runner.history
    assert said[0].startswith("refused: Slurm job 77 is not this run's")
    assert (repr(value.split("(1001)")[0]) in said[0]) or (value == "(null)" and "comment None" in said[0])
    with pytest.raises(SlimeforgeError, match="refused"):  # status and logs refuse it too: never shown as ours
        slurm.status(run, runner)


def test_stop_compares_the_recorded_submit_time(tmp_path, answer):
    run = stop_dir(tmp_path)
    (run / "slurm_submitted_at").write_text(f"{datetime(2026, 11, 25, 8, 0, 1).timestamp():.3f}\n")
    ok = Canned({**answer(run), ("scancel",): ""})
    assert slurm.stop(run, ok, say=lambda s: None) == 0
    later = Canned(answer(run, SubmitTime="2026-11-26T09:00:00"))
    said = []
    assert slurm.stop(run, later, say=said.append) == 1 and "submit time" in said[0]


def test_stop_of_an_ended_or_forgotten_job_cancels_nothing_and_exits_0(tmp_path, answer):
    run = stop_dir(tmp_path)
    done = Canned(answer(run, JobState="COMPLETED"))
    assert slurm.stop(run, done, say=lambda s: None) == 0 and all(a[0] != "scancel" for a in done.history)
    gone = Canned({("squeue",): OLD_SQUEUE, ("scontrol", "show", "job"): (1, "",
                                                                          "slurm_load_jobs error: Invalid job id "
                                                                          "specified\n")})
    said = []
    assert slurm.stop(run, gone, say=said.append) == 0 and all(a[0] != "scancel" for a in gone.history)
    assert "unknown to Slurm" in said[0]


def test_stop_when_slurm_does_not_answer_cancels_nothing_and_fails(tmp_path):
    run = stop_dir(tmp_path)
    down = Canned({("squeue",): (1, "", "slurm_load_jobs error: Unable to contact slurm controller\n"),
                   ("scontrol",): (1, "", "slurm_load_jobs error: Unable to contact slurm controller\n")})
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
    found = [(f.check, f.level, f.message) for f in slurm_checks.cluster_findings(rec, slurm.Options(nodes=3,
                                                                                                     time="03:00:00"),
                                                                                  runner)]
    assert found[0][:2] == ("slurm-partition", "ok")
    assert ("slurm-nodes", "error", "3 node(s) asked, partition gpu allows 2 per job") in found
    assert ("slurm-time", "error", "--time 03:00:00 is over partition gpu's MaxTime 02:00:00") in found
    assert ["scontrol", "show", "partition", "-o", "--", "gpu"] in runner.history and ["srun",
                                                                                       "--help"] not in runner.history
    # Drained nodes do not count: 2 nodes fit, 3 asked.
    runner.answers[("scontrol", "show",
                    "partition")] = "PartitionName=gpu State=UP MaxTime=UNLIMITED MaxNodes=UNLIMITED\n"
    msgs = [f.message for f in slurm_checks.cluster_findings(rec, slurm.Options(nodes=3), runner) if f.level == "error"]
    assert msgs == ["3 node(s) with 2 GPU(s) each asked; partition gpu has 2 such node(s) in service (of 3: n1 gpu:2, "
                    "n2 gpu:2, n3 gpu:2)"]


def test_container_mode_asks_srun_for_pyxis(tmp_path):
    rec, _ = recipe(tmp_path, mode="container", image=DIGEST)
    answers = {("sinfo", "-h", "-o", "%P"): "gpu*\n", ("scontrol", "show",
                                                       "partition"): "PartitionName=gpu State=UP MaxTime=UNLIMITED\n",
               ("sinfo", "-h", "-N"): "n1|gpu:2|idle\n"}
    with_pyxis = Canned({**answers, ("srun", "--help"): "      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH\n"})
    assert ("slurm-container", "ok") in [(f.check, f.level) for f in slurm_checks.cluster_findings(rec,
                                                                                                   slurm.Options(),
                                                                                                       with_pyxis)]
    without = Canned({**answers, ("srun", "--help"): "      --container=PATH   OCI bundle\n"})
    assert ("slurm-container", "error") in [(f.check, f.level) for f in slurm_checks.cluster_findings(rec,
                                                                                                      slurm.Options(),
                                                                                                          without)]


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
        "10.0.0.3": (False, "no ALIVE node with IP 10.0.0.3 (Ray lists it DEAD)"),
    }


def test_only_a_submitted_slurm_render_is_a_slurm_run(tmp_path):
    run = stop_dir(tmp_path)
    assert slurm.is_slurm_run(run)
    # A later plain `invoke run` rewrites plan.json without "slurm": run.* act on its Ray job again.
    (run / "plan.json").write_text(plan())
    assert not slurm.is_slurm_run(run)
    assert not slurm.is_slurm_run(tmp_path / "missing")


# --- enroot: the reference form its version reads, and the one-pull squashfs --------------------

HEX = "0123456789abcdef" * 4


@pytest.mark.parametrize("text,version", [("3.4.1\n", (3, 4, 1)), ("4.0.0", (4, 0, 0)), ("3.5", (3, 5, 0)),
                                          ("3.4.1-1ubuntu1", (3, 4, 1)),
                                          ("4.1.2+dev.3\n", (4, 1, 2))])
def test_enroot_version_parsing(text, version):
    assert enroot.parse_version(text) == version


@pytest.mark.parametrize("text", ["", "enroot 3.4.1", "3", "v3.4.1", "3.4.1 4.0.0", "３.4.1", "3.4.1\x1b[0m",
                                  "1234.0.0", "3.4.1" + "x" * 100])
def test_enroot_version_refuses_what_is_not_one(text):
    assert enroot.parse_version(text) is None


@pytest.mark.parametrize("image,version,want", [
    # enroot 4: Docker's own form; a tag goes when a digest pins the image
    (f"reg.example:5000/team/sf@sha256:{HEX}", (4, 0, 0), f"reg.example:5000/team/sf@sha256:{HEX}"),
    (f"reg.example/sf:v1@sha256:{HEX}", (4, 1, 2), f"reg.example/sf@sha256:{HEX}"),
    ("reg.example/sf:v1", (4, 0, 0), "reg.example/sf:v1"),
    # enroot 3.1+: REGISTRY#IMAGE, the digest in the tag's place (its tag may hold ':')
    (f"reg.example:5000/team/sf@sha256:{HEX}", (3, 4, 1), f"reg.example:5000#team/sf:sha256:{HEX}"),
    (f"123456789012.dkr.ecr.us-east-1.amazonaws.com/sf@sha256:{HEX}", (3, 1, 0),
     f"123456789012.dkr.ecr.us-east-1.amazonaws.com#sf:sha256:{HEX}"),
    ("reg.example/sf:v1", (3, 0, 2), "reg.example#sf:v1"),
    ("localhost:5000/sf:latest", (3, 5, 0), "localhost:5000#sf:latest"),
    # Docker Hub: enroot 3's default registry (it would ask docker.io itself, which serves no registry API)
    (f"nvidia/cuda@sha256:{HEX}", (3, 4, 1), f"nvidia/cuda:sha256:{HEX}"),
    (f"nvidia/cuda@sha256:{HEX}", (4, 0, 0), f"docker.io/nvidia/cuda@sha256:{HEX}"),
    # enroot 4 reads only sha256 in the Docker form: sha512 goes in the tag's place there too
    ("reg.example/sf@sha512:" + "ab" * 64, (4, 0, 0), "reg.example#sf:sha512:" + "ab" * 64),
])
def test_enroot_reference_per_version(image, version, want):
    assert enroot.reference(image, version) == want


# enroot 3.1-3.5's docker:// grammar (src/docker.sh)
ENROOT3 = re.compile(r"(?:[^#]+#)?[a-z0-9/._-]+(?::[A-Za-z0-9._:-]+)?")
ENROOT4_DOCKER = re.compile(r"[^/#]*[.:][^/#]*/[a-z0-9/._-]+(?::[A-Za-z0-9._:-]+)?(?:@sha256:[A-Za-z0-9]+)?")


@pytest.mark.parametrize("image", [f"reg.example:5000/team/sf@sha256:{HEX}", "reg.example/a/b/c:1.0",
                                   f"10.0.0.1:5000/sf:v1@sha256:{HEX}"])
def test_each_form_is_in_its_enroot_grammar_and_names_the_same_image(image):
    three, four = enroot.reference(image, (3, 4, 1)), enroot.reference(image, (4, 0, 0))
    assert ENROOT3.fullmatch(three) and ENROOT4_DOCKER.fullmatch(four) and "#" not in four
    reg, rest = three.split("#")
    assert four.startswith(reg + "/") and rest.split(":")[0] in four
    # enroot 3 reads REG/repo without '#' as a Docker Hub repository: the 3.x form never has that shape
    assert not ENROOT4_DOCKER.fullmatch(three)


def test_enroot_that_cannot_name_the_image_is_refused():
    with pytest.raises(ConfigError, match="enroot 3.0.2 cannot pull"):
        enroot.reference(f"reg.example/sf@sha256:{HEX}", (3, 0, 2))
    with pytest.raises(ConfigError, match="too old"):
        enroot.reference("reg.example/sf:v1", (2, 2, 0))


def test_the_login_nodes_enroot_decides_the_rendered_form(tmp_path):
    over = {"mode": "container", "image": f"reg.example/sf@sha256:{HEX}"}
    for said, want in (("3.4.1\n", f"reg.example#sf:sha256:{HEX}"), ("4.1.2\n", f"reg.example/sf@sha256:{HEX}")):
        rec, stack = recipe(tmp_path, **over)
        run = ResolvedRun(rec, stack, (tmp_path / "run").resolve(), "(api)", {})
        probe = Canned({("enroot", "version"): said})
        rundir = slurm.SlurmTarget(slurm.Options(nodes=2), probe=probe).plan(run).rundir
        assert f"--container-image={want}" in rundir.files["slurm.sbatch"]
        assert rundir.plan["slurm"]["enroot"] == said.strip() and rundir.plan["slurm"]["reference"] == want
    # No enroot here: the plan shows enroot 4's form, and the preflight refuses it with the fix.
    plan = slurm.SlurmTarget(slurm.Options(nodes=2), probe=Canned({("enroot",): (127, "",
                                                                                 "enroot: not found")})).plan(run)
    assert plan.notes == ("enroot's version could not be read here (enroot: not found): the image is named in enroot "
                          "4's form; "
                          "a launch reads it first, and refuses without it",)
    found = slurm_checks.enroot_findings(plan.run.recipe, plan.rundir.plan["slurm"], None)
    assert [f.level for f in found] == ["error"] and ("cannot read enroot's "
                                                     "version") in found[0].message and "enroot version" in found[0].fix


# A squashfs 4 superblock (magic, version 4.0, bytes_used = the file's size) and a body: what the
# import's checks read (enroot.superblock_problem).
FAKE_SQSH = (b"hsqs" + bytes(24) + (4).to_bytes(2, "little") + bytes(10) + (4096).to_bytes(8, "little")).ljust(4096,
                                                                                                               b"\0")


def test_squashfs_dir_imports_once_and_points_pyxis_at_the_file(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    image = f"reg.example/team/sf@sha256:{HEX}"
    rec, stack = recipe(tmp_path, mode="container", image=image)
    run = ResolvedRun(rec, stack, (tmp_path / "run").resolve(), "(api)", {})
    target = slurm.SlurmTarget(slurm.Options(nodes=2, squashfs_dir=str(shared)), probe=Canned({("enroot",
                                                                                                "version"): "3.4.1\n"}))
    plan = target.plan(run)
    sqsh = shared / f"team+sf+sha256-{HEX}.sqsh"
    assert f"--container-image={sqsh}" in plan.rundir.files["slurm.sbatch"]
    imp, sb = plan.commands
    partial = shared / f".{sqsh.name}.{plan.run_token}.partial"
    assert list(imp.argv) == ["enroot", "import", "--output", str(partial), "--", f"docker://reg.example#team/sf:sha256:{HEX}"]
    assert sb.argv[0] == "sbatch"
    check = json.loads(assigned(plan.rundir.files["slurm.sbatch"], ["CHECK_PARAMS"])[0])
    assert {"what": "squashfs image", "path": str(sqsh),
            "kind": "file"} in check["paths"]  # every node must see the file

    # The import writes a partial file; only a complete one is renamed into place.
    class Importer(Canned):
        def run(self, argv, **kw):
            Path(argv[3]).write_bytes(FAKE_SQSH)
            return super().run(argv, **kw)

    said: list[str] = []
    slurm.import_squashfs(imp, sqsh, Importer({("enroot", "import"): ""}), said.append, image)
    assert sqsh.read_bytes() == FAKE_SQSH and not partial.exists()
    # A file that is there (named by the digest) is reused: nothing to import.
    assert [c.step for c in target.plan(run).commands] == ["sbatch"]
    assert slurm_checks.enroot_findings(rec, target.plan(run).rundir.plan["slurm"], str(shared))[0].level == "ok"

    failed = Canned({("enroot", "import"): (1, "", "[ERROR] 401 Unauthorized")})
    sqsh.unlink()

    class Failing(Canned):
        def run(self, argv, **kw):
            Path(argv[3]).write_bytes(b"half")
            raise CommandError("enroot import", argv, 1, "401 Unauthorized")

    with pytest.raises(CommandError):
        slurm.import_squashfs(imp, sqsh, Failing({}), said.append, image)
    assert not sqsh.exists() and not partial.exists()  # all or nothing
    assert failed.history == []


@pytest.mark.parametrize("bad", ["relative/dir", "/a,b", "/a:b", "/a b", "/a/../etc", "-o", "/a\nb", "//x"])
def test_squashfs_dir_grammar(bad):
    with pytest.raises(ConfigError, match="--squashfs-dir"):
        slurm.options(squashfs_dir=bad)


def test_squashfs_needs_an_image_pinned_by_digest(tmp_path):
    rec, stack = recipe(tmp_path, mode="container", image="reg.example/sf:v1")
    run = ResolvedRun(rec, stack, (tmp_path / "run").resolve(), "(api)", {})
    with pytest.raises(ConfigError, match="pinned by digest"):
        slurm.SlurmTarget(slurm.Options(squashfs_dir=str(tmp_path)), probe=Canned({("enroot",
                                                                                    "version"): "4.0.0\n"})).plan(run)


def test_what_enroot_says_is_read_as_data():
    version, said = enroot.read_version(Canned({("enroot", "version"): "3.4.1\x1b[31m\n"}))
    assert version is None and said == "3.4.1?[31m"
    assert enroot.read_version(Canned({("enroot", "version"): (1, "", "enroot: permission denied")})) == (None,
                                                                                                          "enroot: "
                                                                                                          "permission "
                                                                                                          "denied")


def test_a_nodes_view_of_the_runs_files(tmp_path):
    """slurm-check's file part on one node (node_agent.slurm_paths), against real files: the run
    directory's marker, the model, the data (head only), checkpoint_dir's marker and its free space."""
    from slimeforge.scripts import node_agent, pathcheck

    run, model, ck = tmp_path / "run", tmp_path / "model", tmp_path / "ck"
    run.mkdir()
    model.mkdir()
    (model / "config.json").write_text("{}")
    token = "a" * 32
    p = {"visible": {"path": str(run / "visible.token"), "token": token}, "checkpoint": {"dir": str(ck),
                                                                                         "token": token},
         "paths": [{"what": "model_dir", "path": str(model), "kind": "model"},
                   {"what": "data_path", "path": str(tmp_path / "train.jsonl"), "kind": "file", "head_only": True}]}
    problems = node_agent.slurm_paths(p, is_head=True)
    assert problems[0].startswith(f"cannot see the run directory {run} ")
    assert f"data_path {tmp_path / 'train.jsonl'}: no such file here" in problems
    assert any(x.startswith(f"checkpoint_dir {ck}: is not the head's filesystem") for x in problems)
    assert len(node_agent.slurm_paths(p, is_head=False)) == len(problems) - 1  # the data is the head's alone

    (run / "visible.token").write_text(token + "\n")
    (tmp_path / "train.jsonl").write_text("{}\n")
    assert node_agent.cmd_runcheck({"checkpoint": {"dir": str(ck), "token": token,
                                                   "write": True}})["problems"] == []  # slurm-mark
    assert node_agent.slurm_paths(p, is_head=True) == []
    with open(model / "model.safetensors", "wb") as f:  # sparse: 1 TiB of weights, 7 TiB for a checkpoint
        f.truncate(1 << 40)
    assert node_agent.slurm_paths(p, is_head=True) == [
        f"checkpoint_dir {ck}: "
        f"{node_agent.cmd_runcheck({'checkpoint': {'dir': str(ck), 'token': token}})['free_bytes'] / 2**30:.1f} GiB "
        "free, "
        "a checkpoint needs about 7168.0 GiB (7 x the weights' 1024.00 GiB)"]
    os.mkfifo(tmp_path / "fifo")  # a marker that is a FIFO is read as no marker, never waited on
    assert pathcheck.read_marker(str(tmp_path / "fifo")) == ""


def test_squashfs_dir_goes_with_container_mode(tmp_path):
    rec, stack = recipe(tmp_path)  # host mode
    run = ResolvedRun(rec, stack, (tmp_path / "run").resolve(), "(api)", {})
    with pytest.raises(ConfigError, match="--squashfs-dir: goes with container mode"):
        slurm.SlurmTarget(slurm.Options(squashfs_dir=str(tmp_path))).plan(run)
    assert not (tmp_path / "run").exists()
