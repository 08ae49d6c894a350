"""Render a validated recipe into its run directory: slime.args, agentcore.yaml,
runtime_env.json, launch.sh and plan.json (written last, with the hashes of the others)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import __version__
from .atomic import write_dir
from .flags import agentcore_config, agentcore_config_doc, env_json, render_flags, runtime_env_vars
from .recipe import Recipe
from .stack import Stack
from .templating import render

RUN_FILES = ("slime.args", "agentcore.yaml", "runtime_env.json", "launch.sh", "plan.json")


@dataclass(frozen=True)
class RunDir:
    path: Path
    args: list[str]
    env: dict[str, str]
    files: dict[str, str]
    plan: dict


def wandb_enabled(recipe: Recipe, environ: dict[str, str]) -> bool:
    """As the seed: wandb logs only when the recipe names a project and WANDB_API_KEY is set."""
    return bool(recipe.wandb_project and environ.get("WANDB_API_KEY"))


def build_run_dir(recipe: Recipe, stack: Stack, out: str | Path, recipe_path: str = "(api)", environ: dict[str, str] | None = None) -> RunDir:
    """Compute every file's content (nothing is written here)."""
    environ = dict(os.environ if environ is None else environ)
    out = Path(out).resolve()
    env = runtime_env_vars(recipe, stack, wandb_entity=environ.get("WANDB_ENTITY"))
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
        "stack": {"id": stack.id, "name": stack.name, "hash": stack.hash, "slime_commit": stack.sources["slime"].commit if "slime" in stack.sources else None},
        "wandb": "enabled" if wandb else ("disabled: WANDB_API_KEY is not set" if recipe.wandb_project else "disabled: no wandb_project"),
        "run_dir": str(out),
        "files": {name: hashlib.sha256(content.encode()).hexdigest() for name, content in files.items()},
        "entrypoint": ["python3", f"{recipe.slime_dir}/train.py", f"<MODEL_ARGS of {recipe.slime_dir}/scripts/models/{recipe.model_type}.sh>", *args],
        "commands": [
            ["bash", str(out / "launch.sh")],
        ],
    }
    files["plan.json"] = json.dumps(plan, indent=2) + "\n"
    return RunDir(out, args, env, files, plan)


def write_run_dir(run: RunDir) -> None:
    write_dir(run.path, run.files, modes={"launch.sh": 0o755}, last="plan.json")


def read_args(path: str | Path) -> list[str]:
    """slime.args back into an argv list, byte for byte (values with newlines span quoted lines)."""
    return shlex.split(Path(path).read_text())
