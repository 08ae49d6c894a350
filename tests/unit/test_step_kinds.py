"""The plan's steps and the step commands as tagged unions: a field exists only on the kind that has
it, and what the templates and the step hashes read (to_json) keeps one shape per kind."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slimeforge.image.builder.build import BuildDryRun, BuildOptions, build
from slimeforge.image.stack import AptStep, PipStep, SourceStep, WheelUrlStep, load_stack
from slimeforge.image.steps import (
    PatchesCommand,
    PipCommand,
    SourceCommand,
    SystemCommand,
    VenvCommand,
    compiled_run,
    host_layout,
    image_layout,
    step_commands,
)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import build_support as bs  # noqa: E402

HEAD = ["name", "kind", "env", "compiles", "no_deps", "constrain_later", "patches"]
PLAN_KEYS = {
    AptStep: [*HEAD, "packages", "probes"],
    PipStep: [*HEAD, "requirements", "no_binary", "exclude", "index_url"],
    WheelUrlStep: [*HEAD, "requirements"],
    SourceStep: [*HEAD, "requirements", "source", "git", "commit", "dir", "editable"],
}
COMMAND_KEYS = ["name", "kind", "argv", "env", "compiles", "patch_files", "post", "source", "compiled_key", "store",
                "editable", "lock_file"]


@pytest.mark.parametrize("flavor", ["cu13", "cu129", str(bs.TEST_STACK)])
def test_each_plan_step_holds_the_fields_of_its_kind_only(flavor):
    stack = load_stack(flavor)
    if flavor in ("cu13", "cu129"):
        assert {type(s) for s in stack.plan} == set(PLAN_KEYS)
    for step, spec in zip(stack.plan, stack.steps, strict=True):
        assert step.kind == spec.kind and list(step.to_json()) == PLAN_KEYS[type(step)], step.name
        # What another kind has is no attribute at all (mypy refuses it too), not a None to forget.
        assert not hasattr(step, "requirements") if isinstance(step, AptStep) else not hasattr(step, "packages")
        assert isinstance(step, SourceStep) or not hasattr(step, "commit")
    assert stack.builds_from("slime") and not stack.builds_from("no-such-source")


@pytest.mark.parametrize("flavor", ["cu13", str(bs.TEST_STACK)])
def test_every_step_command_renders_one_shape_and_a_compiled_one_its_run(flavor):
    stack = load_stack(flavor)
    for layout in (image_layout(stack), host_layout(stack, "/opt/slime")):
        commands = step_commands(stack, layout, store={n.name: ("use", "/w") for n in stack.plan if n.compiles})
        assert all(list(c.to_json()) == COMMAND_KEYS for c in commands)
        kinds = {type(c) for c in commands}
        assert kinds == {VenvCommand, PipCommand, SourceCommand,
                         PatchesCommand} | ({SystemCommand} if flavor == "cu13" else set())
        for c in commands:
            run, doc = compiled_run(c), c.to_json()
            assert doc["compiles"] == (run is not None) and doc["compiled_key"] == (run.key if run else None)
            assert doc["store"] == (run.store if run else None)
            if isinstance(c, PatchesCommand):
                assert run is None and doc["lock_file"] is None
            if isinstance(c, VenvCommand):  # its slice: the pinned uv's wheel by sha256
                assert run is None and doc["lock_file"] == "venv.txt" and c.argv[-1].endswith("/venv.txt")
            if run is not None:
                assert run.store == "use" and c.argv[:3] == ["compiled", "--key", run.key]
        patches = next(c for c in commands if isinstance(c, PatchesCommand))
        assert patches.commands == [patches.argv, *patches.post] and patches.to_json()["post"] == patches.post
        # slime's requirements keep its slice; its checkout, moved last, installs none.
        slime = [c for c in commands if c.name in ("slime", "slime-requirements")]
        assert [(type(c), c.lock_file) for c in slime] == [(PipCommand, "slime.txt"), (SourceCommand, None)]
        assert commands[-1] is slime[-1]


def test_a_dry_run_build_returns_the_command_it_would_run(tmp_path):
    repos = bs.make_repos(tmp_path / "repos")
    result = build(BuildOptions(stack=str(bs.TEST_STACK), sources=[f"slime={repos['slime']}",
                                                                   f"libdemo={repos['libdemo']}"],
                                dry_run=True, build_root=tmp_path / "b", echo=lambda _: None))
    assert isinstance(result, BuildDryRun)
    assert (result.command[-1] == f"{result.dir}/context" and "-f" in result.command
            and result.env == {"DOCKER_BUILDKIT": "1"})
    assert Path(result.dir, "Dockerfile").is_file() and result.tag.endswith(f":{result.build_hash[:16]}")
    assert not Path(result.dir, "report.json").exists()  # nothing built, nothing reported
