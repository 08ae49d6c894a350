"""A recipe on a Slurm cluster: Ray started inside an `sbatch` allocation.

    launch(recipe, stack, options, out=...) -> exit code

Order: check the options (grammar) -> render the run directory in memory, plus `slurm.sbatch`
and the node agent -> preflight: the recipe's checks (model, data, flags, AWS) and the cluster's
(`scontrol show partition`, `sinfo`: partition up, nodes and GPUs fit, time limit allowed) ->
write the run directory -> `sbatch --parsable` -> record the job id in <run dir>/slurm_job_id ->
follow the job's output file until the job ends -> its exit code.

Inside the allocation (templates/slurm.sbatch.j2) the node agent checks every node, starts the
Ray head on the first node and a worker on each other (srun --overlap, one task per node), holds
the job behind the health gate of `cluster.up`, then runs launch.sh against that cluster.

We cancel only the job id we recorded (`scancel -- ID`), after proving it is this run's: the
caller's job, named sf-<exp_id>, with the comment slimeforge:<run token> given at submit, the run
directory as working directory and the recorded submit time (run/ownership.py); never by name or user.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from .. import __version__, records
from ..atomic import write_file
from ..errors import CommandError, ConfigError, Problem, SlimeforgeError
from ..image.stack import Stack
from ..proc import Runner
from ..run import ownership
from ..run import preflight as doctor
from ..run.launch import default_run_dir, host_tools, resolve_mode
from ..run.recipe import Recipe
from ..run.rundir import RunDir, build_run_dir, read_plan, write_run_dir
from ..run.runrecord import (
    JOB_ID_RE,
    RunRecord,
    Unreachable,
    fields,
    guard_render,
    job_info,
    new_run_token,
    read_run,
    slurm_check,
    write_run_token,
)
from ..scripts import node_agent
from ..templating import render

# Grammars (re.fullmatch): what Slurm accepts for these names, less anything a shell or an
# #SBATCH line could read as syntax.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
TIME_RE = re.compile(r"(?:(\d{1,3})-)?(\d{1,2}):([0-5]\d):([0-5]\d)")
MAX_NODES = 4096
RAY_AGENT_PORT = 52365  # the dashboard agent's port, fixed (as cluster.up) so the checks can test it
START_TIMEOUT_S = 300
ENDED = ownership.SLURM_ENDED
RUN_FILES = ("slurm.sbatch", "node_agent.py")


@dataclass(frozen=True)
class Options:
    """`invoke run --slurm` options; None means: the cluster's default (partition, account, time)
    or the recipe's `num_nodes`."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None
    nodes: int | None = None
    system_python: str = "python3"  # runs the node agent on each node (standard library only)
    start_timeout: int = START_TIMEOUT_S  # seconds for the head, then for every node, to be ALIVE in Ray


def options(partition: str | None = None, account: str | None = None, time: str | None = None, nodes: int | str | None = None) -> Options:
    """Options from the command line (strings), checked; ConfigError lists every problem."""
    if isinstance(nodes, str):
        nodes = int(nodes) if re.fullmatch(r"[1-9]\d{0,5}", nodes) else nodes  # else reported below
    opts = Options(partition=partition, account=account, time=time, nodes=nodes)  # type: ignore[arg-type]
    problems = check_options(opts)
    if problems:
        raise ConfigError("--slurm options", problems)
    return opts


def check_options(opts: Options) -> list[Problem]:
    problems = []
    for name in ("partition", "account"):
        value = getattr(opts, name)
        if value is not None and not NAME_RE.fullmatch(value):
            problems.append(Problem(f"--{name}", "is not a Slurm name", value, "letters, digits, '_', '.', '-' (up to 64), starting with a letter or digit"))
    if opts.time is not None and not TIME_RE.fullmatch(opts.time):
        problems.append(Problem("--time", "is not a time limit", opts.time, "[D-]HH:MM:SS, e.g. 04:00:00 or 2-00:00:00"))
    if opts.nodes is not None and not (isinstance(opts.nodes, int) and not isinstance(opts.nodes, bool) and 1 <= opts.nodes <= MAX_NODES):
        problems.append(Problem("--nodes", "is not a node count", opts.nodes, f"an integer from 1 to {MAX_NODES}"))
    if not (isinstance(opts.start_timeout, int) and 1 <= opts.start_timeout <= 86400):
        problems.append(Problem("start_timeout", "is not a number of seconds", opts.start_timeout, "an integer from 1 to 86400"))
    if not re.fullmatch(r"[A-Za-z0-9_./+-]{1,4096}", opts.system_python):
        problems.append(Problem("system_python", "is not a program name or path", opts.system_python, "a path without spaces or shell syntax"))
    return problems


def seconds(limit: str) -> int | None:
    """Slurm's time formats (as sinfo/scontrol print them) in seconds; None for UNLIMITED."""
    if limit in ("UNLIMITED", "INFINITE", "NONE", "n/a"):
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", limit)
    if not m:
        raise SlimeforgeError(f"cannot read Slurm time limit {limit!r}")
    days, a, b, c = (int(x) if x else None for x in m.groups())
    if b is None:  # minutes, or days-hours
        return (days or 0) * 86400 + (a * 3600 if days is not None else a * 60)
    if c is None:  # MM:SS, or days-HH:MM
        return (days or 0) * 86400 + (a * 3600 + b * 60 if days is not None else a * 60 + b)
    return (days or 0) * 86400 + a * 3600 + b * 60 + c


# --- rendering --------------------------------------------------------------------------------


def job_name(recipe: Recipe) -> str:
    return f"sf-{recipe.exp_id}"


def ray_argv(recipe: Recipe, ray: str, *, head: bool) -> list[str]:
    """`ray start --block` for a node of the allocation; the node agent fills in @HEAD_IP@, @NODE_IP@, @NODE@, @JOB@."""
    argv = [ray, "start", "--block"]
    if head:
        # The dashboard (Jobs API) on the cluster network only: it has no authentication.
        argv += ["--head", "--port", str(recipe.ray_port), "--dashboard-host", "@NODE_IP@", "--dashboard-port", str(recipe.ray_dashboard_port)]
    else:
        argv += ["--address", f"@HEAD_IP@:{recipe.ray_port}"]
    return argv + [
        "--node-ip-address", "@NODE_IP@",
        "--num-gpus", str(recipe.num_gpus),
        "--dashboard-agent-listen-port", str(RAY_AGENT_PORT),
        # Short (Ray's socket paths live below it), per job and node: nodes may share /tmp.
        "--temp-dir", "/tmp/sfr-@JOB@-@NODE@",
        "--disable-usage-stats",
    ]


def container_mounts(recipe: Recipe, run_dir: Path) -> dict[str, str]:
    """What the container needs at the same paths as the host (as `invoke run`'s docker run)."""
    return {"run directory": str(run_dir), "checkpoint_dir": recipe.resolved_checkpoint_dir, "model_dir": recipe.model_dir,
            "data_path (its directory)": str(Path(recipe.data_path).parent)}


def sbatch_vars(recipe: Recipe, run_dir: Path, opts: Options, *, python: str, ray: str, env_bin: str | None) -> dict[str, Any]:
    nodes = opts.nodes or recipe.num_nodes
    container = recipe.mode == "container"
    mounts = sorted(set(container_mounts(recipe, run_dir).values()))
    container_args = [f"--container-image={recipe.image}", f"--container-mounts={','.join(f'{m}:{m}' for m in mounts)}",
                      f"--container-workdir={run_dir}"] if container else []
    ray_cmd = "ray" if container else ray
    head_ports = [recipe.ray_port, recipe.ray_dashboard_port]
    return {
        "version": __version__,
        "exp_id": recipe.exp_id,
        "job_name": job_name(recipe),
        "nodes": nodes,
        "gpus": recipe.num_gpus,
        "partition": opts.partition,
        "account": opts.account,
        "time": opts.time,
        "run_dir": str(run_dir),
        "system_python": opts.system_python,
        "checkpoint_dir": recipe.resolved_checkpoint_dir,
        "env_bin": None if container else env_bin,
        "python": "python3" if container else python,
        "dashboard_port": recipe.ray_dashboard_port,
        "container_args": container_args,
        "check_params": json.dumps({"gpus": recipe.num_gpus, "ports": [RAY_AGENT_PORT], "head_ports": head_ports,
                                    "programs": [] if container else [ray]}),
        "head_params": json.dumps({"argv": ray_argv(recipe, ray_cmd, head=True)}),
        "worker_params": json.dumps({"argv": ray_argv(recipe, ray_cmd, head=False)}),
        "gate_head": json.dumps({"gcs_port": recipe.ray_port, "timeout": opts.start_timeout}),
        "gate_all": json.dumps({"gpus": recipe.num_gpus, "dashboard_port": recipe.ray_dashboard_port, "timeout": opts.start_timeout}),
    }


def render_run_dir(recipe: Recipe, stack: Stack, out: str | os.PathLike, opts: Options, recipe_path: str = "(api)",
                   environ: dict[str, str] | None = None) -> RunDir:
    """The run directory of `invoke run`, plus slurm.sbatch and the node agent (nothing written)."""
    problems = check_options(opts)
    if recipe.mode == "container":
        # pyxis reads --container-mounts as SRC:DST[,SRC:DST...]: no way to escape these two.
        for what, path in container_mounts(recipe, Path(out).resolve()).items():
            if "," in path or ":" in path:
                problems.append(Problem(what, "cannot be mounted with pyxis (--container-mounts splits at ',' and ':')", path, "a path without ',' and ':'"))
    if problems:
        raise ConfigError("--slurm options", problems)
    environ = dict(os.environ if environ is None else environ)
    run = build_run_dir(recipe, stack, out, recipe_path, environ)
    py, ray = host_tools(recipe)
    python = environ.get("SLIMEFORGE_PYTHON") or py
    env_bin = str(Path(ray).parent) if os.sep in ray else None
    files = dict(run.files)
    files["slurm.sbatch"] = render("slurm.sbatch.j2", sbatch_vars(recipe, run.path, opts, python=python, ray=ray, env_bin=env_bin))
    files["node_agent.py"] = node_agent_source()
    plan = dict(run.plan)
    plan["slurm"] = {"partition": opts.partition, "account": opts.account, "time": opts.time, "nodes": opts.nodes or recipe.num_nodes}
    plan["commands"] = [sbatch_argv(run.path)]
    files.pop("plan.json")
    files["plan.json"] = json.dumps(plan, indent=2) + "\n"  # last: it marks the directory complete
    return replace(run, files=files, plan=plan)


def node_agent_source() -> str:
    return Path(node_agent.__file__).read_text()


def sbatch_argv(run_dir: Path, run_token: str | None = None) -> list[str]:
    # --chdir: the job runs in the run directory, where #SBATCH --output puts slurm-<jobid>.out.
    # --comment: the run token, which run.stop compares before it cancels (a reused job id lacks it).
    comment = [f"--comment={ownership.SLURM_COMMENT_PREFIX}{run_token}"] if run_token else []
    return ["sbatch", "--parsable", f"--chdir={run_dir}", *comment, "--", str(run_dir / "slurm.sbatch")]


# --- preflight: the cluster -------------------------------------------------------------------


def gres_gpus(gres: str) -> int:
    """GPUs in a node's GRES string (sinfo %G): gpu:8, gpu:h100:8, gpu:8(S:0-1), ..."""
    total = 0
    for part in re.split(r",(?![^(]*\))", gres):
        m = re.fullmatch(r"gpu(?::[^:(]+)?:(\d+)(?:\(.*\))?", part.strip())
        if m:
            total += int(m.group(1))
    return total


def cluster_findings(recipe: Recipe, opts: Options, runner: Runner) -> list[doctor.Finding]:
    """Partition exists and is up, enough nodes with enough GPUs, the time limit allowed;
    container mode: pyxis is there."""
    F = doctor.Finding
    nodes = opts.nodes or recipe.num_nodes
    try:
        partition = opts.partition or default_partition(runner)
    except CommandError as exc:
        return [F("slurm", doctor.ERROR, f"cannot reach Slurm: {exc.output.strip()[-300:] or exc}", "run on a Slurm login node (sinfo must work; SLURM_CONF if needed)")]
    if partition is None:
        return [F("slurm-partition", doctor.ERROR, "no --partition given and the cluster has no default partition", "--partition NAME (see `sinfo -s`)")]
    r = runner.run(["scontrol", "show", "partition", "-o", "--", partition], step="scontrol show partition", check=False)
    if r.returncode != 0 or not r.stdout.strip():
        known = runner.run(["sinfo", "-h", "-o", "%R"], step="sinfo", check=False).stdout.split()
        return [F("slurm-partition", doctor.ERROR, f"partition {partition!r} does not exist", f"one of: {', '.join(sorted(set(known))) or '(none)'}")]
    part = fields(r.stdout)
    found = [F("slurm-partition", doctor.OK, f"{partition}: State={part.get('State')}, MaxTime={part.get('MaxTime')}, MaxNodes={part.get('MaxNodes')}")]
    if part.get("State") != "UP":
        found[0] = F("slurm-partition", doctor.ERROR, f"partition {partition} is {part.get('State')}", "another partition, or ask the admins")
    max_nodes = part.get("MaxNodes", "UNLIMITED")
    if max_nodes.isdigit() and nodes > int(max_nodes):
        found.append(F("slurm-nodes", doctor.ERROR, f"{nodes} node(s) asked, partition {partition} allows {max_nodes} per job", "--nodes, or another partition"))
    rows = runner.run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%G|%t"], step="sinfo", check=False).stdout.splitlines()
    per_node: dict[str, int] = {}
    usable: dict[str, int] = {}
    for row in rows:
        name, gres, state = (row.split("|") + ["", "", ""])[:3]
        per_node[name] = gres_gpus(gres)
        if not any(bad in state for bad in ("down", "drain", "fail", "inval", "maint")):
            usable[name] = per_node[name]
    fit = [n for n, g in usable.items() if g >= recipe.num_gpus]
    if len(fit) < nodes:
        found.append(F("slurm-nodes", doctor.ERROR,
                       f"{nodes} node(s) with {recipe.num_gpus} GPU(s) each asked; partition {partition} has {len(fit)} such node(s) in service "
                       f"(of {len(per_node)}: " + ", ".join(f"{n} gpu:{g}" for n, g in sorted(per_node.items())) + ")",
                       "--nodes / num_gpus that fit, or another partition"))
    else:
        found.append(F("slurm-nodes", doctor.OK, f"{nodes} node(s) x {recipe.num_gpus} GPU(s): {len(fit)} node(s) of {partition} fit"))
    if recipe.mode == "container":
        # pyxis adds --container-image to srun (a SPANK plugin): without it the steps would fail in the allocation.
        helptext = runner.run(["srun", "--help"], step="srun --help", check=False)
        if "--container-image" in helptext.stdout + helptext.stderr:
            found.append(F("slurm-container", doctor.OK, "srun has pyxis's --container-image"))
        else:
            found.append(F("slurm-container", doctor.ERROR, "container mode needs the pyxis plugin, but `srun --help` has no --container-image",
                           "--mode host with an install prefix on the shared filesystem, or ask the admins for pyxis/enroot"))
    limit = seconds(part.get("MaxTime", "UNLIMITED"))
    if opts.time is not None and limit is not None and seconds(opts.time) > limit:
        found.append(F("slurm-time", doctor.ERROR, f"--time {opts.time} is over partition {partition}'s MaxTime {part['MaxTime']}", f"--time {part['MaxTime']} or less"))
    elif opts.time is not None:
        found.append(F("slurm-time", doctor.OK, f"--time {opts.time} within MaxTime {part.get('MaxTime')}"))
    return found


def default_partition(runner: Runner) -> str | None:
    for name in runner.run(["sinfo", "-h", "-o", "%P"], step="sinfo").stdout.split():
        if name.endswith("*"):
            return name[:-1]
    return None


# --- launch -----------------------------------------------------------------------------------


def resolve(recipe: Recipe, opts: Options, mode: str | None = None, image: str | None = None, install_prefix: str | None = None,
            stack: Stack | None = None) -> Recipe:
    """The recipe as it runs on Slurm: the command line's mode options, and --nodes as num_nodes
    (slime's --actor-num-nodes follows it)."""
    problems = check_options(opts)
    if problems:
        raise ConfigError("--slurm options", problems)
    recipe = resolve_mode(recipe, mode, install_prefix, image, stack=stack)
    return recipe.model_copy(update={"num_nodes": opts.nodes}) if opts.nodes is not None else recipe


def launch(recipe: Recipe, stack: Stack, opts: Options, out: str | os.PathLike | None = None, recipe_path: str = "(api)", *,
           mode: str | None = None, image: str | None = None, install_prefix: str | None = None, catalog: str | None = None,
           skip_checks=(), network_checks: bool = True, runner: Runner | None = None, stream: IO[str] | None = None,
           environ: dict[str, str] | None = None, follow_log: bool = True) -> int:
    """Preflight, sbatch, follow; returns the job's exit code (0 when follow_log is False)."""
    stream = stream or sys.stdout
    runner = runner or Runner()
    environ = dict(os.environ if environ is None else environ)

    def say(text: str) -> None:
        stream.write(text + "\n")
        stream.flush()

    recipe = resolve(recipe, opts, mode, image, install_prefix, stack)
    run = render_run_dir(recipe, stack, out or default_run_dir(recipe), opts, recipe_path, environ)
    # This machine is a login node: the host checks (GPUs, ports) run on each node in the allocation.
    only = [name for name, chk in doctor.CHECKS.items() if chk.scope != "host" and name != "versions"]
    report = doctor.run_checks(recipe, stack, args=run.args, catalog=catalog, skip=skip_checks, only=only, network=network_checks, environ=environ)
    report.findings += cluster_findings(recipe, opts, runner)
    say(report.table())
    if report.errors:
        raise doctor.PreflightError(f"preflight of {recipe_path} (Slurm)", report)
    if not runner.dry_run:
        guard_render(run.path, runner)  # a live run's directory is never rewritten; an ended one's record goes to history/<n>/
    write_run_dir(run)
    Path(recipe.resolved_checkpoint_dir).mkdir(parents=True, exist_ok=True)
    job_id = submit(run.path, runner)
    if runner.dry_run:
        return 0
    say(f"[slimeforge] submitted Slurm job {job_id} ({job_name(recipe)}); output {run.path / f'slurm-{job_id}.out'}")
    if not follow_log:
        return 0
    try:
        return follow(run.path, job_id, stream, runner)
    except KeyboardInterrupt:
        say(f"\n[slimeforge] stopped following; job {job_id} keeps running: `invoke run.stop --run-dir {run.path}` cancels it")
        return 130


def submit(run_dir: Path, runner: Runner) -> str:
    """sbatch with a new run token (the job's comment, launch.sh's SLIMEFORGE_RUN_TOKEN, run_token);
    records the job id (and when) in the run directory before returning it."""
    token = new_run_token()
    if not runner.dry_run:
        write_run_token(run_dir, token)
    submitted_at = time.time()
    # sbatch hands its environment to the job (--export=ALL, Slurm's default): launch.sh reads the token there.
    result = runner.run(sbatch_argv(run_dir, token), step="sbatch", env={"SLIMEFORGE_RUN_TOKEN": token})
    if runner.dry_run:
        return "DRYRUN"
    job_id = result.stdout.strip().split(";")[0]  # --parsable: "ID" or "ID;CLUSTER"
    if not JOB_ID_RE.fullmatch(job_id):
        raise SlimeforgeError(f"sbatch: expected a job id, got {result.stdout.strip()!r}")
    write_file(run_dir / "slurm_job_id", job_id + "\n")
    write_file(run_dir / "slurm_submitted_at", f"{submitted_at:.3f}\n")
    return job_id


# --- a recorded Slurm run ---------------------------------------------------------------------


def is_slurm_run(run_dir: str | os.PathLike) -> bool:
    """A run directory whose last render was for Slurm (a later plain `invoke run` rewrites
    plan.json without the "slurm" key) and that was submitted. Its records are judged by the reader
    of whichever kind it is: a bad one is an error there, naming the file."""
    try:
        plan = read_plan(run_dir)
    except ConfigError:
        return False
    return plan is not None and "slurm" in plan and (Path(run_dir) / "slurm_job_id").is_file()


def recorded_job(run_dir: str | os.PathLike) -> str | None:
    return read_run(run_dir).slurm_job_id


def exit_code(info: dict[str, str]) -> int:
    """ExitCode=N:S of the batch script: N, or 128+S when a signal ended it; 1 if unknown."""
    m = re.fullmatch(r"(\d+):(\d+)", info.get("ExitCode", ""))
    if not m:
        return 1
    code, sig = int(m.group(1)), int(m.group(2))
    return code if code or not sig else 128 + sig


def follow(run_dir: Path, job_id: str, stream: IO[str], runner: Runner | None = None, poll: float = 1.0) -> int:
    """Copy the job's output file to `stream` as it grows, until the job has ended; its exit code."""
    out_file = run_dir / f"slurm-{job_id}.out"
    pos = 0
    last_state = ""
    while True:
        info = job_info(job_id, runner)
        state = info.get("JobState", "")
        if state != last_state:
            stream.write(f"[slimeforge] job {job_id}: {state or 'unknown to Slurm'}" + (f" ({info['Reason']})" if info.get("Reason", "None") != "None" else "") + "\n")
            last_state = state
        if stat.S_ISREG(os.lstat(out_file).st_mode) if os.path.lexists(out_file) else False:  # never a FIFO or a link
            with out_file.open(errors="replace") as f:
                f.seek(pos)
                chunk = f.read()
                pos = f.tell()
            if chunk:
                stream.write(chunk)
        stream.flush()
        if not info or state in ENDED:
            return exit_code(info) if info else 1
        time.sleep(poll)


def _proved(run_dir: str | os.PathLike, runner: Runner | None) -> tuple[RunRecord, dict[str, str], ownership.Verdict]:
    rec = read_run(run_dir)
    if rec.slurm_job_id is None:
        raise ConfigError(str(run_dir), [Problem("slurm_job_id", "this run directory was never submitted to Slurm", None,
                                                 "`invoke run RECIPE --slurm` first", show_value=False)])
    try:
        info, verdict = slurm_check(rec, runner)
    except Unreachable as exc:
        raise SlimeforgeError(f"{rec.run_dir}: {exc}") from None
    if verdict.state == ownership.FOREIGN:
        raise SlimeforgeError(f"{rec.run_dir}: refused: {verdict.reason}")
    return rec, info, verdict


def status(run_dir: str | os.PathLike, runner: Runner | None = None) -> dict[str, Any]:
    rec, info, verdict = _proved(run_dir, runner)
    return {"run_dir": str(rec.run_dir), "slurm_job_id": rec.slurm_job_id, "state": info.get("JobState", "unknown to Slurm (ended a while ago?)"),
            "reason": info.get("Reason"), "nodes": info.get("NodeList"), "exit_code": info.get("ExitCode"),
            "restarts": info.get("Restarts"), "submission_id": rec.submission_id, "verdict": verdict.reason,
            "output": str(rec.run_dir / f"slurm-{rec.slurm_job_id}.out")}


def logs(run_dir: str | os.PathLike, follow_logs: bool = False, stream: IO[str] | None = None, runner: Runner | None = None) -> int | None:
    stream = stream or sys.stdout
    rec, _, _ = _proved(run_dir, runner)
    job_id = rec.slurm_job_id
    assert job_id is not None
    if follow_logs:
        return follow(rec.run_dir, job_id, stream, runner)
    out = rec.run_dir / f"slurm-{job_id}.out"
    try:
        data = records.read_bytes(out, out.name, "the job's output file", max_bytes=1 << 30)
    except records.RecordError as exc:
        raise SlimeforgeError(str(exc)) from None
    stream.write(data.decode(errors="replace") if data is not None else f"(no output yet: {out})\n")
    return None


def stop(run_dir: str | os.PathLike, runner: Runner | None = None, say=print) -> int:
    """scancel the recorded job, and only it: its id, after proving it is this run's (user, name,
    comment token, working directory, submit time). Returns the exit code: 0 when it was cancelled
    or had already ended, 1 when it was refused or not recorded."""
    runner = runner or Runner()
    rec = read_run(run_dir)
    job_id = rec.slurm_job_id
    if job_id is None:
        say(f"none: {rec.run_dir}: no Slurm job recorded; nothing to stop")
        return 1
    try:
        _, verdict = slurm_check(rec, runner)
    except Unreachable as exc:
        say(f"failed: {exc}")
        return 1
    if verdict.state == ownership.ENDED:
        say(f"ended: {verdict.reason}")
        return 0
    if verdict.state == ownership.FOREIGN:
        say(f"refused: {verdict.reason}; not cancelled")
        return 1
    r = runner.run(["scancel", "--", job_id], step="scancel", check=False, timeout=60)
    if r.returncode != 0:
        say(f"failed: scancel {job_id} exited with {r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}")
        return 1
    say(f"stopped: Slurm job {job_id}: cancel sent (Ray and the job in the allocation stop with it)")
    return 0
