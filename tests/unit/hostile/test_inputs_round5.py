"""Issue 40, the rest: a recipe that is a symlink loop (itself or its extends:), a --set value or an
API value that is not UTF-8, numbers too long to print (Python refuses str() of over 4300 digits)
through the API, a recipe and --set: each a clear ConfigError naming the field, never a traceback;
`doctor --list-checks --json` prints one JSON document of its documented shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import json_shapes
import pytest
from helpers import SEED_RECIPE

from slimeforge.api import SlimeRunner
from slimeforge.errors import ConfigError, SlimeforgeError
from slimeforge.run.recipe import parse_overrides
from slimeforge.run.recipecheck import load_recipe
from slimeforge.schema import printable, text_problem
from slimeforge.yamlio import load_with_extends, parse_yaml

ROOT = Path(__file__).resolve().parents[3]
HUGE = 10**5000


def said(exc: BaseException) -> str:
    text = str(exc)
    assert text_problem(text.replace("\n", " ")) is None or "\\" in text  # printable (repr-escaped values)
    return text


@pytest.mark.parametrize("shape", ["self", "pair", "extends"])
def test_a_recipe_symlink_loop_is_named(tmp_path, shape):
    loop = tmp_path / "loop.yaml"
    if shape == "self":
        loop.symlink_to(loop)
        recipe = loop
    elif shape == "pair":
        (tmp_path / "b.yaml").symlink_to(loop)
        loop.symlink_to(tmp_path / "b.yaml")
        recipe = loop
    else:
        loop.symlink_to(loop)
        recipe = tmp_path / "r.yaml"
        recipe.write_text("extends: loop.yaml\nexp_id: x\n")
    with pytest.raises(SlimeforgeError) as err:
        load_with_extends(recipe)
    assert "symlink loop" in said(err.value) or "Too many levels of symbolic links" in said(err.value)
    with pytest.raises(SlimeforgeError):
        load_recipe(recipe)


@pytest.mark.parametrize("field, value", [
    ("num_gpus", HUGE), ("num_rollout", -HUGE), ("lr", HUGE), ("extra_flags", [HUGE]), ("eval_data",
                                                                                        {HUGE: "/data/x.jsonl"}),
    ("env", {"A": HUGE}), ("num_gpus", 2**64), ("num_nodes", 10**4400),
], ids=["gpus", "negative", "float-field", "in-a-list", "a-key", "env-value", "2**64", "4401-digits"])
def test_a_number_too_long_to_print_through_the_api_is_refused_naming_the_field(field, value):
    with pytest.raises(ConfigError) as err:
        SlimeRunner(**{**SEED_RECIPE, field: value})
    text = said(err.value)
    assert field in text and "bits" in text


@pytest.mark.parametrize("field, value", [("exp_id", "run-\udcff"), ("wandb_project", "\udce9t\udce9"),
                                          ("env", {"A": "b\udcff"}), ("extra_flags", ["--x", "\udcff"]),
                                          ("env", {"\udcff": "x"})])
def test_a_value_that_is_not_utf8_through_the_api_is_refused_naming_the_field(field, value):
    with pytest.raises(ConfigError) as err:
        SlimeRunner(**{**SEED_RECIPE, field: value})
    assert field in said(err.value) and "not UTF-8" in str(err.value)


@pytest.mark.parametrize("item, says", [
    ("exp_id=run-\udcff", "--set exp_id: holds a byte that is not UTF-8"),
    ("env.HOME2=\udcff", "--set env.HOME2: holds a byte that is not UTF-8"),
    ("wandb_project=\udce9", "not UTF-8"),
    ("num_gpus=" + "9" * 5000, "number too long"),
    ("num_gpus=" + "9" * 4000, "bits"),
    ("extra_flags=[" + "9" * 5000 + "]", "number too long"),
    ("\udcff=1", "must look like key=value"),
], ids=["exp_id", "env", "project", "5000-digits", "4000-digits", "in-a-list", "key"])
def test_a_set_value_that_is_not_utf8_or_too_long_is_refused(item, says):
    with pytest.raises(ConfigError) as err:
        load_recipe(ROOT / "recipes" / "gsm8k.yaml", parse_overrides([item]))
    assert says in said(err.value)


def test_a_recipe_file_with_a_number_too_long_to_read_is_refused(tmp_path):
    (tmp_path / "r.yaml").write_text(f"exp_id: x\nnum_gpus: {'9' * 5000}\n")
    with pytest.raises(ConfigError, match="number too long"):
        load_with_extends(tmp_path / "r.yaml")
    with pytest.raises(ConfigError, match="number too long"):
        parse_yaml("[" + "1" * 4400 + "]", "x.yaml")


def test_text_that_is_not_utf8_is_shown_printable():
    assert printable("a\udcffb") == "a?b"
    assert text_problem("a\udcffb") == "holds a byte that is not UTF-8 text (0xff) at position 1"
    printable("a\udcffb").encode("utf-8")  # reaches a UTF-8 terminal


def test_doctor_list_checks_json_is_one_document_of_its_shape():
    res = subprocess.run([sys.executable, "-m", "invoke", "doctor", "--list-checks", "--json"], cwd=ROOT,
                         capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    json_shapes.check(doc, "slimeforge.doctor-checks/1")
    names = [c["name"] for c in doc["checks"]]
    assert len(names) == len(set(names)) > 5 and {c["scope"] for c in doc["checks"]} <= {"host", "recipe", "network",
                                                                                         "gpu"}
    table = subprocess.run([sys.executable, "-m", "invoke", "doctor", "--list-checks"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert all(n in table.stdout for n in names)  # the table lists the same checks
