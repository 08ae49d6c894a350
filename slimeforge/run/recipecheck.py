"""A recipe loaded and checked: the schema (recipe.py), its stack, then the cross-field rules,
with extra_flags held against the flags slimeforge renders itself (flags.py).

Every problem in one round: the schema is checked field by field (as cluster/inventory.py runs
its rules on the raw mapping beside pydantic's errors), so a key that fails does not hide the
rules of the keys that parsed. The rules then run on a stand-in recipe, where each failed key
keeps its default (a required one, a placeholder), and what they say about a failed key, or
from one (recipe.RELATED), is dropped: one cause, one problem. The stand-in travels with the
error (RecipeProblems), so a launch on a cluster adds the inventory's fit to the same list.

Here, not in recipe.py, so that the recipe model never calls the flag renderer: flags.py reads
the recipe, and this module reads both (no import circle).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError, Problem
from ..image.stack import Stack, available_flavors, load_stack, stack_path
from ..schema import model_problems, text_problems
from .flags import render_flags
from .recipe import RELATED, Recipe, blame_overrides, check, load_recipe_data

# What a required key that failed stands in as while the other rules run (never reported: its
# own problems are dropped, and so are the rules that read it).
STAND_IN: dict[str, str] = {"exp_id": "stand-in",
                            "agent_runtime_arn": ("arn:aws:bedrock-agentcore:us-east-1:000000000000:"
                                                  "runtime/stand_in-0000000000"),
                            "s3_bucket": "stand-in", "model_dir": "/stand-in/model",
                            "data_path": "/stand-in/data.jsonl", "model_type": "stand-in"}


class RecipeProblems(ConfigError):
    """Every problem of a recipe, with what the other checks need to add theirs to the same list:
    the stand-in recipe (None where the recipe is not a mapping), its stack (None where the stack
    is the problem), the keys that failed, and the --set overrides (problems of theirs name them)."""

    def __init__(self, source: str, problems: list[Problem], *, recipe: Recipe | None = None,
                 stack: Stack | None = None,
                 failed: frozenset[str] = frozenset(), overrides: dict[str, object] | None = None):
        blamed = blame_overrides(problems, overrides or {}, source)
        super().__init__(blamed.source, blamed.problems)
        self.recipe, self.stack, self.failed, self.overrides = recipe, stack, failed, overrides or {}
        self.file, self.raw = source, list(problems)  # as found: joined() names the overrides once

    def joined(self, more: list[Problem]) -> RecipeProblems:
        """This error with `more` (the cluster's fit of the stand-in) added, less what they say about a failed key."""
        return RecipeProblems(self.file, self.raw + trusted(more, self.failed), recipe=self.recipe, stack=self.stack,
                              failed=self.failed, overrides=self.overrides)


def top(where: str) -> str:
    """The recipe key a problem's field path starts with (`env.FOO` -> env, `extra_flags[2]` -> extra_flags)."""
    return where.split(".", 1)[0].split("[", 1)[0]


def trusted(problems: list[Problem], failed: frozenset[str]) -> list[Problem]:
    """The problems that neither name a failed key nor come from a rule reading one (RELATED)."""
    return [p for p in problems if top(p.where) not in failed and not failed.intersection(RELATED.get(top(p.where),
                                                                                                      ()))]


def schema_problems(data: dict[str, object]) -> tuple[Recipe | None, list[Problem], frozenset[str]]:
    """The schema key by key: (the recipe, or the stand-in the rules run on; every problem; the
    keys that failed). The stand-in: the keys that passed, defaults for the rest, placeholders for
    the required keys that failed (None if the keys that passed one by one fail together)."""
    problems = text_problems(data)
    bad_text = {top(p.where) for p in problems}
    rest = {k: v for k, v in data.items() if k not in bad_text} if problems else data
    model, more = model_problems(Recipe, rest)
    if model is not None and not problems:
        return model, [], frozenset()
    problems += [p for p in more if top(p.where) not in bad_text]  # a key taken out for its text is not also "missing"
    failed = frozenset(bad_text | {top(p.where) for p in more})
    good = {k: v for k, v in rest.items() if k not in failed and k in Recipe.model_fields}
    fill = {k: v for k, v in STAND_IN.items() if k not in good}
    stand_in, left = model_problems(Recipe, {**fill, **good})
    return (stand_in if not left else None), problems, failed


def default_stack() -> Stack | None:
    try:
        return load_stack(str(Recipe.model_fields["stack"].default))
    except ConfigError:
        return None


def parse_recipe(data: dict[str, object], source: str, overrides: dict[str, object] | None = None) -> tuple[Recipe,
                                                                                                            Stack]:
    """Schema validation, the stack and the cross-field rules, in one round; raises RecipeProblems
    (a ConfigError) listing every problem."""
    if not isinstance(data, dict):
        _, problems = model_problems(Recipe, data)
        raise RecipeProblems(source, problems, overrides=overrides)
    recipe, problems, failed = schema_problems(data)
    if recipe is None:
        raise RecipeProblems(source, problems, failed=failed, overrides=overrides)
    stack: Stack | None = None
    if "stack" not in failed:
        # a FIFO or directory: the reader says what it is
        if not (stack_path(recipe.stack).exists() or stack_path(recipe.stack).is_symlink()):
            problems.append(Problem("stack", "names no stack file", recipe.stack,
                                    ", ".join(available_flavors()) + " or a path to a stack YAML"))
        else:
            try:
                stack = load_stack(recipe.stack)
            except ConfigError as exc:
                problems += [Problem(f"stack ({exc.source})", p.message, p.value, p.accepted,
                                     p.show_value) for p in exc.problems]
    # The rules need a stack (slime's facts, the flags rendered): where the recipe's is the
    # problem, the default one stands in, and what reads the stack's facts is dropped (RELATED).
    rules_stack = stack or default_stack()
    if stack is None:
        failed |= {"stack"}
    if rules_stack is not None:
        # The flags the recipe renders itself, to spot repeats in extra_flags.
        own = recipe.model_copy(update={"extra_flags": []})
        rendered = {a for a in render_flags(own, rules_stack, config_path="agentcore.yaml", env_json="{}",
                                            wandb=True) if a.startswith("--")}
        problems += trusted(check(recipe, rules_stack, rendered), failed)
    if problems:
        raise RecipeProblems(source, problems, recipe=recipe, stack=stack, failed=failed, overrides=overrides)
    return recipe, stack  # type: ignore[return-value]  # no problem: the stack loaded


def load_recipe(path: str | Path, overrides: dict[str, object] | None = None) -> tuple[Recipe, Stack]:
    return parse_recipe(load_recipe_data(path, overrides), str(path), overrides)
