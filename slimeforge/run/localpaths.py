"""What a dry run cannot vouch for: the recipe's paths that do not exist on this machine (and wandb
without its key).

A dry run refuses nothing for them (the run may go to other hosts, where they must exist: the
preflight checks them there), but says so instead of calling the recipe valid in silence. Container
mode mounts model_dir and the data at the same paths, so they are host paths too; slime_dir and
megatron_dir are the image's there.
"""

from __future__ import annotations

from pathlib import Path

from .recipe import Recipe
from .rundir import wandb_off_warning


def dry_run_warnings(recipe: Recipe, environ: dict[str, str]) -> list[str]:
    """What a dry run cannot vouch for, said without refusing: the recipe's paths this machine
    lacks, and wandb asked for without its key (a real launch's preflight says both in its table)."""
    wandb = wandb_off_warning(recipe, environ)
    return paths_missing_here(recipe) + ([wandb] if wandb else [])


def paths_missing_here(recipe: Recipe) -> list[str]:
    """One warning per path of the recipe that this machine does not have, naming the key."""
    wanted: list[tuple[str, str, bool]] = [("model_dir", recipe.model_dir, True), ("data_path", recipe.data_path,
                                                                                   False)]
    wanted += [(f"eval_data.{name}", path, False) for name, path in recipe.eval_data.items()]
    if recipe.mode == "host":
        if recipe.install_prefix:
            wanted.append(("install_prefix", recipe.install_prefix, True))
        else:
            wanted += [("slime_dir", recipe.slime_dir, True), ("megatron_dir", recipe.megatron_dir, True)]
    out = []
    for key, path, is_dir in wanted:
        p = Path(path)
        if not (p.is_dir() if is_dir else p.is_file()):
            what = "directory" if is_dir else "file"
            out.append(f"{key} {path}: no such {what} on this machine; a run here would stop at the preflight "
                       "(fine if the run goes to other hosts: it must exist there)")
    return out
