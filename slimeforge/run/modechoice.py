"""The recipe as the command line changes it: mode, image and install prefix (`invoke run`,
`invoke doctor`, every launch target)."""

from __future__ import annotations

from .. import paths
from ..errors import ConfigError, Problem
from ..image.stack import Stack, load_stack
from ..schema import text_problem
from .recipe import RUNNER_FIELDS, Recipe


def command_line_problems(mode: str | None, install_prefix: str | None, image: str | None) -> None:
    """--mode, --prefix and --image by their grammar (ConfigError naming each), with or without a recipe."""
    problems = []
    if mode is not None and mode not in ("container", "host"):
        problems.append(Problem("--mode", "is not a launch mode", mode, "container or host"))
    if image is not None:
        from ..image.imageref import image_ref_problems  # only then: a dry run without --image stays fast

        problems += image_ref_problems(image, "--image")
    if install_prefix is not None and (not install_prefix.startswith("/") or text_problem(install_prefix)):
        problems.append(Problem("--prefix", "must be an absolute path (the --prefix given to `invoke install`)",
                                install_prefix, "/path/on/the/hosts"))
    if problems:
        raise ConfigError("command line", problems)


def resolve_mode(recipe: Recipe, mode: str | None = None, install_prefix: str | None = None, image: str | None = None,
                 require_image: bool = True, stack: Stack | None = None) -> Recipe:
    """Apply the command line's mode options; host mode with an install prefix takes slime and
    Megatron from the install's checkouts (paths.Prefix: <prefix>/slime, <prefix>/Megatron-LM, by
    the stack's source dirs; default stack: the recipe's) unless the recipe names them."""
    command_line_problems(mode, install_prefix, image)
    problems: list[Problem] = []
    update: dict[str, str] = {}
    if mode:
        update["mode"] = mode
    if install_prefix:
        update["install_prefix"] = install_prefix
    if image:
        update["image"] = image
    r = recipe.model_copy(update=update)
    if r.mode == "host" and r.install_prefix:
        installed = paths.Prefix.at(r.install_prefix)
        sources = (stack or load_stack(r.stack)).sources
        more = {}
        for field, source in (("slime_dir", "slime"), ("megatron_dir", "megatron")):
            if getattr(r, field) == RUNNER_FIELDS[field] and source in sources:
                more[field] = installed.source(sources[source].dir)
        r = r.model_copy(update=more)
    if require_image and r.mode == "container" and not r.image:
        problems.append(Problem("image", "container mode needs an image", None,
                                "image: REG/repo@sha256:... in the recipe, or --image", show_value=False))
    if problems:
        raise ConfigError("launch", problems)
    return r
