"""Each validation rule names its field, shows the value and says what is accepted."""

import pytest
import yaml
from helpers import SEED_RECIPE

from slimeforge.errors import ConfigError
from slimeforge.run.recipe import RUNNER_FIELDS
from slimeforge.run.recipecheck import load_recipe, parse_recipe
from slimeforge.yamlio import parse_set

GOOD = SEED_RECIPE


def problems(**changes):
    data = {**GOOD, **changes}
    data = {k: v for k, v in data.items() if v is not ...}
    with pytest.raises(ConfigError) as e:
        parse_recipe(data, "test.yaml")
    return e.value.problems, str(e.value)


def test_good_recipe_passes_with_seed_defaults():
    recipe, stack = parse_recipe(dict(GOOD), "test.yaml")
    for name, default in RUNNER_FIELDS.items():
        if default is not ...:
            assert getattr(recipe, name) == default, name
    assert recipe.global_batch_size == 256 and stack.name == "cu13"


def test_unknown_key_has_did_you_mean():
    ps, msg = problems(rollout_batchsize=16)
    assert ps[0].where == "rollout_batchsize"
    assert "did you mean 'rollout_batch_size'" in msg


def test_wrong_type_names_field_and_value():
    ps, msg = problems(num_gpus="eight")
    assert ps[0].where == "num_gpus" and "'eight'" in msg


def test_missing_required_fields_are_all_listed():
    ps, _ = problems(exp_id=..., model_dir=...)
    assert {p.where for p in ps} == {"exp_id", "model_dir"}


def test_batch_arithmetic():
    ps, msg = problems(rollout_batch_size=3, n_samples_per_prompt=3, num_steps_per_rollout=2)
    assert ps[0].where == "num_steps_per_rollout" and "3 x 3 = 9" in msg


def test_global_batch_must_split_over_data_parallel_ranks():
    ps, msg = problems(rollout_batch_size=1, n_samples_per_prompt=2)  # 2 samples over 4 DP ranks
    assert ps[0].where == "rollout_batch_size" and "4 data-parallel ranks" in msg


def test_gpu_arithmetic():
    ps, msg = problems(tp_size=3, rollout_gpus_per_engine=5)
    where = {p.where for p in ps}
    assert {"tp_size", "rollout_gpus_per_engine"} <= where
    assert "1, 2, 4, 8" in msg  # the divisors of 8 are offered


def test_arn_format():
    ps, msg = problems(agent_runtime_arn="arn:aws:bedrock-agentcore:...")
    assert ps[0].where == "agent_runtime_arn" and "runtime/<name>-<10-character id>" in msg


@pytest.mark.parametrize("bucket,why", [
    ("My_Bucket", "lowercase"),
    ("ab", "3 to 63"),
    ("a..b", "adjacent dots"),
    ("192.168.1.10", "IP address"),
    ("xn--bucket", "xn--"),
    ("bucket-", "begin and end"),
])
def test_s3_bucket_rules(bucket, why):
    ps, msg = problems(s3_bucket=bucket)
    assert ps[0].where == "s3_bucket" and why in msg


def test_s3_uri_with_prefix_is_accepted():
    recipe, _ = parse_recipe({**GOOD, "s3_bucket": "s3://my-rollouts/team-a"}, "t")
    assert recipe.s3_bucket == "s3://my-rollouts/team-a"


def test_unknown_model_type_lists_the_valid_ones():
    ps, msg = problems(model_type="qwen2.5-3b")
    assert ps[0].where == "model_type"
    assert "did you mean 'qwen2.5-3B'" in msg and "qwen3-4B" in msg and "glm4-9B" in msg


def test_local_slime_checkout_wins_for_model_types(tmp_path):
    (tmp_path / "scripts" / "models").mkdir(parents=True)
    (tmp_path / "scripts" / "models" / "my-model.sh").write_text("MODEL_ARGS=()\n")
    recipe, _ = parse_recipe({**GOOD, "model_type": "my-model", "slime_dir": str(tmp_path)}, "t")
    assert recipe.model_type == "my-model"
    ps, msg = problems(slime_dir=str(tmp_path))
    assert "my-model" in msg and str(tmp_path) in msg


def test_extra_flag_repeating_a_recipe_flag():
    ps, msg = problems(extra_flags=["--lr", "1e-5", "--rollout-batch-size=4", "--kl-loss-coef", "0.01"])
    assert [p.where for p in ps] == ["extra_flags[0]", "extra_flags[2]"]
    assert "set the recipe field instead" in msg


def test_extra_flag_that_slime_would_ignore():
    ps, msg = problems(extra_flags=["--use-dynamic-global-batch-size", "--megatron-to-hf-mode", "bridge"])
    assert [p.where for p in ps] == ["extra_flags[0]", "extra_flags[1]"]
    assert "never existed" in msg and "removed from slime" in msg


def test_secrets_are_refused_in_env():
    ps, msg = problems(env={"WANDB_API_KEY": "abc123"})
    assert ps[0].where == "env.WANDB_API_KEY" and "abc123" not in msg


def test_relative_paths_are_refused():
    ps, _ = problems(model_dir="models/q", data_path="data.jsonl")
    assert {p.where for p in ps} == {"model_dir", "data_path"}


def test_several_errors_reported_together():
    ps, msg = problems(tp_size=3, s3_bucket="BAD", agent_runtime_arn="x", lr=-1.0)
    assert {"tp_size", "s3_bucket", "agent_runtime_arn", "lr"} <= {p.where for p in ps}
    assert "problem(s)" in msg


def test_extends_and_set_overrides(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(GOOD))
    child = tmp_path / "child.yaml"
    child.write_text("extends: base.yaml\nexp_id: child-run\nnum_rollout: 5\n")
    recipe, _ = load_recipe(child, parse_set(["num_rollout=7", "env.FOO=bar baz"]))
    assert (recipe.exp_id, recipe.num_rollout, recipe.env) == ("child-run", 7, {"FOO": "bar baz"})


def test_bad_set_syntax():
    with pytest.raises(ConfigError) as e:
        parse_set(["num_rollout"])
    assert "key=value" in str(e.value)


def test_gsm8k_recipe_is_the_seed_example():
    recipe, _ = load_recipe("recipes/gsm8k.yaml")
    assert (recipe.exp_id, recipe.model_type, recipe.num_gpus, recipe.tp_size, recipe.rollout_gpus_per_engine) == (
        "gsm8k-3b-smoke", "qwen2.5-3B", 8, 2, 2)
    assert "Qwen2.5-3B-Instruct" in recipe.model_dir
