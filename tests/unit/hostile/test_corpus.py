"""Issue 12's regression corpus (corpus.py): each bad input is refused naming its field, before
anything is written; each good neighbour renders completely."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from corpus import (
    BASE_INVENTORY,
    DROP,
    INVENTORY_CASES,
    RAW_RECIPE_CASES,
    RECIPE_CASES,
    STACK_CASES,
)
from helpers import SEED_RECIPE

from slimeforge.cluster.inventory import load_inventory
from slimeforge.errors import ConfigError
from slimeforge.image.builder.build import render_dockerfile
from slimeforge.image.stack import load_stack
from slimeforge.run.recipe import parse_overrides
from slimeforge.run.recipecheck import load_recipe
from slimeforge.run.rundir import RUN_FILES, build_run_dir, write_run_dir

ROOT = Path(__file__).resolve().parents[3]
TEST_STACK = ROOT / "tests" / "stacks" / "test.yaml"


def apply(base, changes):
    """`changes` merged onto a copy of `base`: dicts key by key, {index: ...} into lists, DROP deletes."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if value is DROP:
            del out[key]
        elif isinstance(value, dict) and isinstance(out.get(key) if isinstance(out, dict) else out[key], dict | list):
            out[key] = apply(out[key], value) if isinstance(out[key], dict) else _apply_list(out[key], value)
        else:
            out[key] = value
    return out


def _apply_list(items, changes):
    items = list(items)
    for index, value in changes.items():
        items[index] = apply(items[index], value)
    return items


def write_yaml(path: Path, data) -> Path:
    # allow_unicode: the control characters go in as YAML escapes, the rest as text
    path.write_text(yaml.safe_dump(data, allow_unicode=False, sort_keys=False))
    return path


def render_recipe(tmp_path: Path, path: Path, sets: list[str]):
    recipe, stack = load_recipe(path, parse_overrides(sets))
    run = build_run_dir(recipe, stack, tmp_path / "run", str(path), environ={})
    write_run_dir(run)
    return run


def assert_refused(exc: ConfigError, expected: str, tmp_path: Path) -> None:
    text = str(exc)
    assert expected in text, text
    assert "Traceback" not in text and len(max(text.splitlines(), key=len)) < 800, text  # values are shown truncated
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("case", "changes", "expected"), RECIPE_CASES, ids=[c[0] for c in RECIPE_CASES])
def test_recipe_corpus(tmp_path, case, changes, expected):
    changes = dict(changes)
    sets = changes.pop("__set__", [])
    path = write_yaml(tmp_path / "recipe.yaml", apply({**SEED_RECIPE, "stack": "cu13"}, changes))
    if expected is None:
        run = render_recipe(tmp_path, path, sets)
        assert sorted(p.name for p in run.path.iterdir() if not p.name.startswith(".")) == sorted(RUN_FILES)
        assert json.loads((run.path / "plan.json").read_text())["exp_id"] == run.plan["exp_id"]
        return
    with pytest.raises(ConfigError) as info:
        render_recipe(tmp_path, path, sets)
    assert_refused(info.value, expected, tmp_path)
    if sets:
        assert info.value.source == "command line" or "--set" in str(info.value)


@pytest.mark.parametrize(("case", "text", "expected"), RAW_RECIPE_CASES, ids=[c[0] for c in RAW_RECIPE_CASES])
def test_raw_recipe_corpus(tmp_path, case, text, expected):
    path = tmp_path / "recipe.yaml"
    path.write_bytes(text)
    with pytest.raises(ConfigError) as info:
        render_recipe(tmp_path, path, [])
    assert_refused(info.value, expected, tmp_path)


@pytest.mark.parametrize(("case", "changes", "expected"), STACK_CASES, ids=[c[0] for c in STACK_CASES])
def test_stack_corpus(tmp_path, case, changes, expected):
    path = write_yaml(tmp_path / "stack.yaml", apply(yaml.safe_load(TEST_STACK.read_text()), changes))
    if expected is None:
        dockerfile = render_dockerfile(load_stack(path))
        assert dockerfile.startswith("# Rendered by slimeforge")
        return
    with pytest.raises(ConfigError) as info:
        render_dockerfile(load_stack(path))
    assert_refused(info.value, expected, tmp_path)
    if case == "duplicate-step":  # just the name, not the whole stack (once 1,355 characters)
        assert len(str(info.value)) < 300, str(info.value)


@pytest.mark.parametrize(("case", "changes", "expected"), INVENTORY_CASES, ids=[c[0] for c in INVENTORY_CASES])
def test_inventory_corpus(tmp_path, case, changes, expected):
    path = write_yaml(tmp_path / "lab.yaml", apply(BASE_INVENTORY, changes))
    if expected is None:
        inv = load_inventory(path)
        assert [h.name for h in inv.hosts] == ["gpu-a", "gpu-b"]
        return
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert_refused(info.value, expected, tmp_path)


def test_dockerfile_renderer_refuses_a_newline_itself():
    """The second line of defence: a value that got past validation still cannot add a line."""
    stack = load_stack(TEST_STACK)
    with pytest.raises(ConfigError, match="Dockerfile"):
        render_dockerfile(stack, base_from="slimeforge-test/base:bookworm\nFROM attacker/evil")


def test_extends_cycle_shows_its_chain(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: c.yaml\n")
    (tmp_path / "c.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError) as info:
        load_recipe(tmp_path / "a.yaml")
    chain = " -> ".join(str(tmp_path / n) for n in ("a.yaml", "b.yaml", "c.yaml", "a.yaml"))
    assert chain in str(info.value)


def test_deep_extends_chain_is_bounded(tmp_path):
    for i in range(40):
        (tmp_path / f"r{i}.yaml").write_text(f"extends: r{i + 1}.yaml\n" if i < 39 else "exp_id: x\n")
    with pytest.raises(ConfigError, match="chain is longer than"):
        load_recipe(tmp_path / "r0.yaml")


def test_non_utf8_inventory_is_a_clear_error(tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_bytes(b"name: lab\xe9\n")
    with pytest.raises(ConfigError, match=r"line 1: is not UTF-8 text \(byte 0xe9"):
        load_inventory(path)
