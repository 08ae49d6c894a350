"""Render a validated recipe into its run directory: slime.args, agentcore.yaml,
runtime_env.json, launch.sh and plan.json (written last, with the hashes of the others)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from .. import __version__, paths, readback, scripts
from ..atomic import LOCK_NAME, dir_lock, dir_problem, write_dir
from ..errors import ConfigError, Problem
from ..image.stack import Stack
from ..templating import render
from .flags import agentcore_config, agentcore_config_doc, env_json, render_flags, runtime_env_vars
from .layout import SLIMEFORGE, Layout
from .modelscript import MODEL_ARGS_BASH
from .recipe import EXP_ID_RE, Recipe

RUN_FILES = ("slime.args", "agentcore.yaml", "runtime_env.json", "launch.sh", "plan.json")
MAX_PLAN_BYTES = 4 << 20
# How long a launch waits for the Ray head it started to answer, in both launch paths (launch.py
# and the launch.sh rendered here): a loaded host takes 10 to 30 s to bring a head up.
HEAD_TIMEOUT_S = 180
_TEMP_PREFIXES = tuple(f".{name}." for name in RUN_FILES)  # atomic.write_dir's temporary names
_PLAN_ACCEPTED = "the plan.json that `invoke run` writes into a run directory"


@dataclass(frozen=True, repr=False)
class RunDir:
    """A run directory's content, computed: `files` (name -> text), slime's `args`, the job's `env`
    and `plan` (plan.json's keys). Its repr is one line: a notebook shows the path, not 15 KB."""

    path: Path
    args: list[str]
    env: dict[str, str]
    files: dict[str, str]
    plan: dict

    def __repr__(self) -> str:
        names = ", ".join(self.files)
        return f"RunDir('{self.path}', files=[{names}], args={len(self.args)}, env={len(self.env)})"


def wandb_enabled(recipe: Recipe, environ: dict[str, str]) -> bool:
    """As the seed: wandb logs only when the recipe names a project and WANDB_API_KEY is set."""
    return bool(recipe.wandb_project and environ.get("WANDB_API_KEY"))


def wandb_off_warning(recipe: Recipe, environ: dict[str, str]) -> str | None:
    """The one warning when the recipe asks for wandb and this run cannot log to it (once: the
    preflight's `wandb` finding, or a dry run's warning)."""
    if recipe.wandb_project and not environ.get("WANDB_API_KEY"):
        return (f"wandb_project is {recipe.wandb_project!r} but WANDB_API_KEY is not set here: this run logs nothing "
                "to wandb "
                "(export WANDB_API_KEY before the launch to log)")
    return None


def build_run_dir(recipe: Recipe, stack: Stack, out: str | os.PathLike[str], recipe_path: str = "(api)",
                  environ: dict[str, str] | None = None,
                  layout: Layout = SLIMEFORGE) -> RunDir:
    """Compute every file's content (nothing is written here), for slimeforge's layout or the
    image's (run/layout.py; plan.json says which)."""
    environ = dict(os.environ if environ is None else environ)
    out = Path(out).resolve()
    env = runtime_env_vars(recipe, stack, wandb_entity=environ.get("WANDB_ENTITY"), layout=layout)
    wandb = wandb_enabled(recipe, environ)
    args = render_flags(recipe, stack, config_path=str(out / "agentcore.yaml"), env_json=env_json(env), wandb=wandb)

    files: dict[str, str] = {}
    files["slime.args"] = "".join(shlex.quote(a) + "\n" for a in args)
    files["agentcore.yaml"] = agentcore_config_doc() + yaml.safe_dump(agentcore_config(recipe), sort_keys=False)
    files["runtime_env.json"] = json.dumps({"env_vars": env}, indent=2, sort_keys=True) + "\n"
    files["launch.sh"] = render(
        "launch.sh.j2",
        {
            "version": __version__,
            "stack_id": stack.id,
            "exp_id": recipe.exp_id,
            "submission_time": paths.SUBMISSION_TIME,
            "head_timeout": HEAD_TIMEOUT_S,
            "headrecord_program": scripts.headrecord_program(),
            "model_args_bash": MODEL_ARGS_BASH,
            "slime_dir": recipe.slime_dir,
            "model_type": recipe.model_type,
            "num_gpus": recipe.num_gpus,
            "ray_port": recipe.ray_port,
            "dashboard_port": recipe.ray_dashboard_port,
            "args": args,
        },
    )
    plan = {
        "slimeforge_version": __version__,
        "exp_id": recipe.exp_id,
        "recipe_path": recipe_path,
        "recipe": recipe.model_dump(mode="json"),
        "stack": {"id": stack.id, "name": stack.name, "hash": stack.hash,
                  "slime_commit": stack.sources["slime"].commit if "slime" in stack.sources else None},
        "wandb": "enabled" if wandb else ("disabled: WANDB_API_KEY is not "
                                          "set" if recipe.wandb_project else "disabled: no wandb_project"),
        "run_dir": str(out),
        "layout": layout.record(),
        "files": {name: hashlib.sha256(content.encode()).hexdigest() for name, content in files.items()},
        "entrypoint": ["python3", f"{recipe.slime_dir}/train.py",
                       f"<MODEL_ARGS of {recipe.slime_dir}/scripts/models/{recipe.model_type}.sh>", *args],
        "commands": [
            ["bash", str(out / "launch.sh")],
        ],
    }
    files["plan.json"] = json.dumps(plan, indent=2) + "\n"
    return RunDir(out, args, env, files, plan)


def amend_plan(run: RunDir, files: dict[str, str] | None = None, **keys: object) -> RunDir:
    """The same run directory with more files and plan.json keys (a target's commands, its own
    files); plan.json is rendered again, and stays last: it marks the directory complete."""
    plan = {**run.plan, **keys}
    content = {name: text for name, text in run.files.items() if name != "plan.json"}
    content.update(files or {})
    content["plan.json"] = json.dumps(plan, indent=2) + "\n"
    return replace(run, files=content, plan=plan)


def _plan_problem(plan) -> str | None:
    rec = plan.get("recipe") if isinstance(plan, dict) else None
    if not (isinstance(plan, dict) and isinstance(plan.get("slimeforge_version"), str) and isinstance(rec, dict)
            and isinstance(plan.get("exp_id"), str) and EXP_ID_RE.fullmatch(plan["exp_id"])):
        return "is not a slimeforge run plan (slimeforge_version, exp_id and recipe missing or malformed)"
    for key in ("ray_port", "ray_dashboard_port"):
        value = rec.get(key)
        if type(value) is not int or not 1 <= value <= 65535:
            return f"recipe.{key} is not a TCP port ({value!r})"
    return None


def read_plan(run_dir: str | os.PathLike[str]) -> dict | None:
    """A run directory's plan.json, checked to be slimeforge's (through the one reader: a FIFO, a
    device, a symlink or a huge file is refused, never read); None when there is none."""
    return readback.read_json(Path(run_dir) / "plan.json", "plan.json", _PLAN_ACCEPTED, _plan_problem,
                              max_bytes=MAX_PLAN_BYTES)


def out_problems(out: Path, exp_id: str, locked: bool = True) -> list[Problem]:
    """Why `out` may not become (or be re-rendered as) the run directory of `exp_id`.

    Accepted: a path that does not exist yet (under a writable directory), an empty directory, or
    the run directory of the same experiment. Anything else holds someone's files (`--out .`), or
    another experiment's record (its submission id: `run.stop` would stop the wrong job)."""
    where = "--out"
    if why := dir_problem(out):
        return [Problem(where, why, str(out), "a new or empty directory, or this experiment's run directory")]
    if out.is_dir():
        names = os.listdir(out)
        # The lock, and the temporary files of a writer holding it, are ours. Without the lock, a
        # directory another slimeforge writes into is judged later, under the lock, once settled.
        entries = [e for e in names if e != LOCK_NAME and not e.startswith(_TEMP_PREFIXES)]
        if entries and (locked or LOCK_NAME not in names):
            try:
                plan = read_plan(out)
            except ConfigError as exc:
                return [Problem(where, f"holds a plan.json that is not slimeforge's ({exc.problems[0].message})",
                                str(out),
                                "a new or empty directory, or this experiment's run directory")]
            if plan is None:
                return [Problem(where,
                                f"holds files ({len(entries)}) and is not a slimeforge run directory; nothing is "
                                "written into it",
                                str(out), "a new or empty directory, e.g. runs/<exp_id>")]
            if plan["exp_id"] != exp_id:
                return [Problem(where, f"is the run directory of experiment {plan['exp_id']!r}, not {exp_id!r} "
                                "(its job record would be lost)", str(out), f"another --out, e.g. runs/{exp_id}")]
    return []


def write_run_dir(run: RunDir) -> None:
    """Write the run directory all-or-nothing, one writer at a time, never into a foreign one."""
    exp_id = run.plan["exp_id"]
    problems = out_problems(run.path, exp_id, locked=False)
    if problems:
        raise ConfigError(str(run.path), problems)
    created = not run.path.exists()
    try:
        run.path.mkdir(parents=True, exist_ok=True)
        with dir_lock(run.path):
            # Again under the lock: another writer may have rendered here since the check above.
            problems = out_problems(run.path, exp_id)
            if problems:
                raise ConfigError(str(run.path), problems)
            try:
                write_dir(run.path, run.files, modes={"launch.sh": 0o755}, last="plan.json")
            except BaseException:
                if created and not (run.path / "plan.json").exists():
                    shutil.rmtree(run.path, ignore_errors=True)
                raise
    except OSError as exc:
        raise ConfigError(str(run.path), [Problem("--out", f"cannot be written: {exc.strerror}", str(run.path),
                                                  "a directory you may write to")]) from None

