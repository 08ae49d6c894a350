"""A recipe loaded and checked: the schema (recipe.py), its stack, then the cross-field rules,
with extra_flags held against the flags slimeforge renders itself (flags.py).

Here, not in recipe.py, so that the recipe model never calls the flag renderer: flags.py reads
the recipe, and this module reads both (no import circle).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigError, Problem
from ..image.stack import Stack, available_flavors, load_stack, stack_path
from ..schema import validate
from .flags import render_flags
from .recipe import Recipe, blame_overrides, check, load_recipe_data


def parse_recipe(data: dict[str, Any], source: str, overrides: dict[str, Any] | None = None) -> tuple[Recipe, Stack]:
    """Schema validation, then the cross-field rules; raises ConfigError listing every problem."""
    try:
        recipe = validate(Recipe, data, source)
    except ConfigError as exc:
        raise blame_overrides(exc.problems, overrides or {}, source) from None
    if not (stack_path(recipe.stack).exists() or stack_path(recipe.stack).is_symlink()):  # a FIFO or directory: the reader says what it is
        raise blame_overrides([Problem("stack", "names no stack file", recipe.stack, ", ".join(available_flavors()) + " or a path to a stack YAML")],
                     overrides or {}, source)
    stack = load_stack(recipe.stack)
    # The flags the recipe renders itself, to spot repeats in extra_flags.
    own = recipe.model_copy(update={"extra_flags": []})
    rendered = {a for a in render_flags(own, stack, config_path="agentcore.yaml", env_json="{}", wandb=True) if a.startswith("--")}
    problems = check(recipe, stack, rendered)
    if problems:
        raise blame_overrides(problems, overrides or {}, source)
    return recipe, stack


def load_recipe(path: str | Path, overrides: dict[str, Any] | None = None) -> tuple[Recipe, Stack]:
    return parse_recipe(load_recipe_data(path, overrides), str(path), overrides)
