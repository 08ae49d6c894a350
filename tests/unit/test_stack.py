import dataclasses
from pathlib import Path

import pytest

from slimeforge.errors import ConfigError
from slimeforge.image.stack import AptStep, load_stack


@pytest.mark.parametrize("flavor", ["cu13", "cu129"])
def test_stack_loads_and_every_package_is_pinned(flavor):
    stack = load_stack(flavor)
    assert stack.name == flavor
    plan = stack.plan
    assert plan is stack.plan and isinstance(plan, tuple)  # computed once, immutable
    assert [s.name for s in plan][:2] == ["system", "torch"]
    for step in plan:
        for req in () if isinstance(step, AptStep) else step.requirements:
            # every PyPI requirement carries a version or a specifier; wheels are URLs
            assert req.startswith("https://") or any(op in req for op in ("==", "<", ">")), (step.name, req)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan[0].name = "x"
    with pytest.raises(TypeError):
        plan[1].env["X"] = "1"
    assert len(stack.hash) == 64 and stack.id == f"{flavor}-{stack.hash[:12]}"


def test_flavors_differ_only_where_they_should():
    cu13, cu129 = load_stack("cu13"), load_stack("cu129")
    assert cu13.hash != cu129.hash
    assert cu13.sources == cu129.sources  # shared pins live once, in common.yaml
    te13 = cu13.plan_step("transformer-engine")
    te129 = cu129.plan_step("transformer-engine")
    assert te13.requirements == ("transformer_engine[pytorch,core-cu13]==2.11.0",)
    assert te13.exclude == ("transformer-engine-cu12",)
    assert "transformer_engine[pytorch]==2.16.1" in te129.requirements
    tms = cu13.plan_step("torch-memory-saver")
    assert tms.env["TMS_CUDA_MAJOR"] == cu13.cuda_major == "13"
    assert cu13.driver_min == 580 and cu129.driver_min == 575


def test_slime_is_the_last_source_step_before_fast_layers():
    names = [s.name for s in load_stack("cu13").plan]
    assert names.index("megatron") < names.index("slime") < names.index("toolkit") == len(names) - 1
    assert names.index("sglang") < names.index("megatron")


def test_hash_is_stable_and_sensitive(tmp_path):
    import yaml

    a = load_stack("cu13").hash
    assert load_stack("cu13").hash == a
    data = dict(load_stack("cu13").data)
    data["versions"] = {**data["versions"], "sglang": "0.5.15.post2"}
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(data))
    assert load_stack(changed).hash != a


HEADER = """extends: common.yaml
name: bad
cuda: "13.0"
driver_min: 580
base: {image: x}
"""


def _write(tmp_path, body):
    import shutil

    from slimeforge import paths

    shutil.copy(paths.IMAGES / "common.yaml", tmp_path / "common.yaml")
    p = tmp_path / "bad.yaml"
    p.write_text(body)
    return p


def test_stack_errors_name_the_field(tmp_path):
    p = _write(tmp_path, HEADER + """step_overrides:
  no-such-step: {env: {}}
""")
    with pytest.raises(ConfigError) as e:
        load_stack(p)
    assert "step_overrides" in str(e.value) and "no-such-step" in str(e.value)


def test_short_commit_is_refused(tmp_path):
    p = _write(tmp_path, HEADER + """sources:
  slime: {commit: a74ae3a}
""")
    with pytest.raises(ConfigError) as e:
        load_stack(p)
    msg = str(e.value)
    assert "sources.slime.commit" in msg and "40-character" in msg


def test_unpinned_package_is_refused(tmp_path):
    p = _write(tmp_path, HEADER + """step_overrides:
  toolkit: {pip: [requests]}
""")
    with pytest.raises(ConfigError) as e:
        load_stack(p)
    assert "'requests' has no pin in versions" in str(e.value) and "toolkit" in str(e.value)


def test_unknown_flavor_lists_the_available_ones():
    with pytest.raises(ConfigError) as e:
        load_stack("cu11")
    assert "cu13" in str(e.value) and "cu129" in str(e.value)


def test_names_that_reach_templates_unquoted_are_restricted(tmp_path):
    p = _write(tmp_path, HEADER + """step_overrides:
  toolkit: {env: {"BAD-NAME": "1"}}
""")
    with pytest.raises(ConfigError) as e:
        load_stack(p)
    assert "environment variable names expected" in str(e.value) and "BAD-NAME" in str(e.value)


def test_patch_check_downloads_for_the_target_into_the_user_cache(monkeypatch, tmp_path):
    from slimeforge.image.patches import wheel_fits
    from slimeforge.paths import sources_cache, user_cache

    cu13 = load_stack("cu13")
    assert cu13.wheel_platform == "manylinux_2_39_x86_64"
    # sglang 0.5.15.post1 ships manylinux_2_34 wheels: they fit a glibc 2.39 base, not a 2.28 one.
    assert wheel_fits("sglang-0.5.15.post1-cp312-cp312-manylinux_2_34_x86_64.whl", cu13)
    assert not wheel_fits("sglang-0.5.15.post1-cp311-cp311-manylinux_2_34_x86_64.whl", cu13)
    assert not wheel_fits("x-1-cp312-cp312-manylinux_2_40_x86_64.whl", cu13)
    assert wheel_fits("sglang_router-0.3.2-cp38-abi3-manylinux_2_28_x86_64.whl", cu13)
    assert wheel_fits("six-1.17.0-py2.py3-none-any.whl", cu13)
    monkeypatch.setenv("SLIMEFORGE_CACHE_DIR", str(tmp_path / "own"))  # slimeforge's own, before XDG's
    assert user_cache() == tmp_path / "own" and sources_cache() == tmp_path / "own" / "sources"
    monkeypatch.delenv("SLIMEFORGE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert user_cache() == tmp_path / "slimeforge" and sources_cache() == tmp_path / "slimeforge" / "sources"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_cache() == tmp_path / "home" / ".cache" / "slimeforge"


@pytest.mark.parametrize("name", ["venv", "finalize", "patches", "all", "slime-requirements"])
def test_a_step_named_as_slimeforges_own_steps_is_refused(tmp_path, name):
    # venv.txt, finalize's record, the patches layer, the lock's all.txt: a stack step of that name
    # would share them with slimeforge's own step.
    import yaml

    data = yaml.safe_load((Path(__file__).resolve().parents[1] / "stacks" / "test.yaml").read_text())
    data["steps"][1]["name"] = name
    p = tmp_path / "x.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_stack(p)
    msg = str(e.value)
    assert "steps: names a step as slimeforge names its own steps and files" in msg and name in msg
