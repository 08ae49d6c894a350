"""slime's model script (scripts/models/<model_type>.sh): where it is and its MODEL_ARGS.

The script is real bash (overrides, loops, sourcing), so bash reads it, with one snippet used here,
in the image and in launch.sh.
"""

from __future__ import annotations

from pathlib import Path

from ..proc import Runner
from .recipe import Recipe

# argv after `bash`: source the script ($1) and print MODEL_ARGS NUL-separated.
MODEL_ARGS_BASH = ["-c", 'source "$1" && printf "%s\\0" "${MODEL_ARGS[@]}"', "model-script"]


def model_script(recipe: Recipe) -> Path:
    return Path(recipe.slime_dir) / "scripts" / "models" / f"{recipe.model_type}.sh"


def split_args(out: str) -> list[str]:
    return out.split("\0")[:-1] if out else []


def eval_model_script(script: str | Path, slime_dir: str | Path, runner: Runner) -> list[str]:
    """MODEL_ARGS of a slime model script on this host."""
    argv = ["bash", *MODEL_ARGS_BASH, str(script)]
    return split_args(runner.run(argv, step=f"model script {script}", cwd=str(slime_dir), timeout=30).stdout)


def eval_in_image(docker: str, image: str, script: str | Path, slime_dir: str, runner: Runner) -> list[str]:
    """MODEL_ARGS of the model script inside an image (when it is not on this host)."""
    argv = [docker, "run", "--rm", "--entrypoint", "bash", "-w", slime_dir, image, *MODEL_ARGS_BASH, str(script)]
    return split_args(runner.run(argv, step="model script (in the image)", timeout=120).stdout)
