"""Issue 42.4: every problem of a recipe in one round. The schema is checked key by key, the
cross-field rules run on the keys that parsed (a failed key stands in with its default, and what
a rule says from it is dropped: one cause, one problem), and a launch on a cluster adds the
inventory's fit to the same error."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slimeforge.errors import ConfigError
from slimeforge.run.launch import LaunchRequest, resolve
from slimeforge.run.recipe import parse_overrides
from slimeforge.run.recipecheck import RecipeProblems, load_recipe, parse_recipe

GOOD = yaml.safe_load(Path("recipes/gsm8k.yaml").read_text())


def problems(data: dict, overrides: dict | None = None) -> dict[str, str]:
    with pytest.raises(RecipeProblems) as exc:
        parse_recipe(data, "r.yaml", overrides)
    return {p.where: p.message for p in exc.value.problems}


def test_schema_values_and_cross_field_rules_are_reported_together():
    # The recipe: a misspelt key and text for a number, beside a bad ARN, a bad bucket and
    # an engine size that does not divide the GPUs. Before: 2 problems, then 3 more on the next try.
    data = {k: v for k, v in GOOD.items() if k != "num_gpus"}
    data.update(num_gpu=4, lr="fast", agent_runtime_arn="arn:bad", s3_bucket="Bad_Bucket", rollout_gpus_per_engine=3)
    by = problems(data)
    assert set(by) == {"num_gpu", "lr", "agent_runtime_arn", "s3_bucket", "rollout_gpus_per_engine"}
    assert "did you mean 'num_gpus'" in by["num_gpu"] and "not a number" in by["lr"]
    # num_gpus: its default, as the recipe gives none
    assert "must divide the GPU count (8" in by["rollout_gpus_per_engine"]


def test_a_rule_reading_a_failed_key_is_dropped_not_guessed():
    # tp_size failed: the batch and tp rules would run on its default (2) and blame other keys.
    by = problems({**GOOD, "tp_size": "two", "num_nodes": 3, "exp_id": "-bad"})
    assert set(by) == {"tp_size", "exp_id"}, by
    # Without the failure, the same num_nodes gives the batch rule's problem.
    by = problems({**GOOD, "num_nodes": 3})
    assert set(by) == {"rollout_batch_size"} and "12 data-parallel ranks" in by["rollout_batch_size"]


def test_missing_required_keys_and_control_characters_do_not_hide_the_rest():
    data = {k: v for k, v in GOOD.items() if k not in ("agent_runtime_arn", "model_type")}
    data.update(exp_id="x\x1b[31m", s3_bucket="ab", num_gpus=0)
    by = problems(data)
    assert set(by) == {"agent_runtime_arn", "model_type", "exp_id", "s3_bucket", "num_gpus"}, by
    assert by["agent_runtime_arn"] == "is required but missing" and "control character" in by["exp_id"]
    assert "3 to 63" in by["s3_bucket"] and "positive integer" in by["num_gpus"]


def test_a_stack_that_is_not_there_leaves_the_other_rules_running():
    by = problems({**GOOD, "stack": "no-such-stack", "lr": -1})
    assert set(by) == {"stack", "lr"}, by


def test_problems_from_set_name_the_command_line_and_the_file_keeps_its_own():
    data = {**GOOD, "s3_bucket": "UPPER"}
    overrides = parse_overrides(["tp_size=x"])
    by = problems({**data, **overrides}, overrides)
    assert set(by) == {"--set tp_size", "s3_bucket"}


def test_a_good_recipe_still_parses():
    recipe, stack = load_recipe("recipes/gsm8k.yaml")
    assert recipe.exp_id and stack.name


def inventory(tmp_path: Path) -> Path:
    data = {"name": "two", "mode": "container", "image": "reg.example:5000/slimeforge@sha256:" + "a" * 64,
            "container": {"volumes": ["/data:/data", "/models:/models", "/root/checkpoints:/root/checkpoints"]},
            "hosts": [{"name": "a", "address": "10.0.0.1", "role": "head", "gpus": 8}, {"name": "b",
                                                                                        "address": "10.0.0.2",
                                                                                        "gpus": 8}]}
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_cluster_fit_joins_the_recipes_own_problems(tmp_path):
    # The issue's `--set num_nodes=3` on 2 hosts: the batch rule and the too-few-hosts fit, at once.
    from slimeforge.cluster.runcheck import cluster_env

    inv = inventory(tmp_path)
    req = LaunchRequest(recipe="recipes/gsm8k-2node.yaml", cluster=str(inv), overrides=("num_nodes=3", "lr=fast"),
                        out=str(tmp_path / "run"))
    with pytest.raises(ConfigError) as exc:
        resolve(req, dry_run=True, find_cluster=lambda name, dry: cluster_env(name, dry_run=dry))
    by = {p.where: p.message for p in exc.value.problems}
    assert set(by) == {"--set lr", "rollout_batch_size", "--set num_nodes"}, by
    assert "does not fit cluster two" in by["--set num_nodes"] and "2 host(s) have 8 GPU(s)" in by["--set num_nodes"]
    assert exc.value.source == "recipes/gsm8k-2node.yaml"
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_a_failed_key_silences_the_clusters_rule_that_reads_it(tmp_path):
    from slimeforge.cluster.runcheck import cluster_env

    inv = inventory(tmp_path)
    req = LaunchRequest(recipe="recipes/gsm8k-2node.yaml", cluster=str(inv), overrides=("num_nodes=3", "num_gpus=many"))
    with pytest.raises(ConfigError) as exc:
        resolve(req, dry_run=True, find_cluster=lambda name, dry: cluster_env(name, dry_run=dry))
    assert {p.where for p in exc.value.problems} == {"--set num_gpus"}


def test_a_cluster_that_cannot_be_found_is_named_beside_the_recipes_problems(tmp_path):
    from slimeforge.errors import SlimeforgeError

    def not_up(name, dry):
        raise SlimeforgeError(f"cluster {name}: no record of a bring-up from this machine: run `invoke cluster.up "
                              f"{name}` first")

    req = LaunchRequest(recipe="recipes/gsm8k-2node.yaml", cluster="lab.yaml", overrides=("lr=fast",))
    with pytest.raises(ConfigError) as exc:
        resolve(req, dry_run=False, find_cluster=not_up)
    by = {p.where: p.message for p in exc.value.problems}
    assert set(by) == {"--set lr", "cluster"} and "invoke cluster.up lab.yaml" in by["cluster"]


def test_the_launch_options_join_the_recipes_problems(tmp_path):
    # Container mode with no image, beside a bad value: both at once, not one per try.
    req = LaunchRequest(recipe="recipes/gsm8k.yaml", overrides=("lr=fast",), out=str(tmp_path / "run"))
    with pytest.raises(ConfigError) as exc:
        resolve(req, dry_run=False)
    assert {p.where for p in exc.value.problems} == {"--set lr", "image"}
    assert "container mode needs an image" in str(exc.value) and not (tmp_path / "run").exists()
