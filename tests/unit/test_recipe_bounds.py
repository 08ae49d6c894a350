"""Issue 41.2: a recipe's numeric bounds are pydantic constraints on the model (Field(ge=..., le=...)),
and a value out of them still reads as before: the field, the value, what is accepted; every one
in the same round, and no rule that reads a refused value (GPU and batch arithmetic) speaks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slimeforge.run.recipe import MAX_COUNT, Recipe
from slimeforge.run.recipecheck import RecipeProblems, parse_recipe

GOOD = yaml.safe_load(Path("recipes/gsm8k.yaml").read_text())

OUT_OF_BOUNDS = {
    "num_gpus": (0, "must be a positive integer", "1..64"),
    "tp_size": (65, "must be a positive integer", "1..64"),
    "num_nodes": (4097, "must be a positive integer", "1..4096"),
    "rollout_gpus_per_engine": (64 * 4096 + 1, "must be a positive integer", "1..262144"),
    "save_interval": (0, "must be a positive integer", f"1..{MAX_COUNT}"),
    "max_tokens_per_gpu": (MAX_COUNT + 1, "must be a positive integer", f"1..{MAX_COUNT}"),
    "eval_interval": (-5, "must be a positive number of rollouts", f"1..{MAX_COUNT}, or leave it out"),
    "gateway_port": (65536, "is not a TCP port", "0..65535 (0 lets the toolkit choose)"),
    "ray_port": (0, "is not a TCP port", "1..65535"),
    "lr": (0, "must be greater than 0", "> 0"),
    "weight_decay": (-0.1, "must not be negative", ">= 0"),
    "adam_beta2": (1.0, "must be between 0 and 1", "0 < adam_beta2 < 1"),
    "sglang_mem_fraction_static": (0, "is a fraction of GPU memory", "0 < sglang_mem_fraction_static < 1"),
    "max_restarts": (101, "is not a number of restarts", "0..100"),  # as --max-restarts says it
}


def test_every_bound_is_a_constraint_of_the_model_not_a_rule():
    for name in OUT_OF_BOUNDS:
        constraints = Recipe.model_fields[name].metadata
        assert any(getattr(m, a, None) is not None for m in constraints for a in ("ge", "gt", "le", "lt")), name


def test_values_out_of_bounds_name_the_field_show_the_value_say_the_range_all_in_one_round():
    with pytest.raises(RecipeProblems) as exc:
        parse_recipe({**GOOD, **{k: v for k, (v, _, _) in OUT_OF_BOUNDS.items()}}, "r.yaml")
    found = {p.where: p for p in exc.value.problems}
    # tp_size 65 against num_gpus 0: no divisibility rule on either (one cause, one problem).
    assert set(found) == set(OUT_OF_BOUNDS), sorted(found)
    for name, (value, message, accepted) in OUT_OF_BOUNDS.items():
        p = found[name]
        assert (p.message, p.value, p.accepted, p.show_value) == (message, value, accepted, True), name
        assert str(p).startswith(f"{name}: {message} (got {value!r}); accepted: {accepted}")


def test_the_bounds_themselves_are_accepted():
    edges = {"num_gpus": 64, "tp_size": 64, "rollout_gpus_per_engine": 64, "num_nodes": 1, "gateway_port": 0,
             "ray_port": 65535, "weight_decay": 0, "eval_interval": MAX_COUNT}
    recipe, _ = parse_recipe({**GOOD, **edges}, "r.yaml")
    assert recipe.gateway_port == 0 and recipe.eval_interval == MAX_COUNT
