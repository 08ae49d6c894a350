"""Issue 42 item 7: `render()` and `train(dry_run=True)` resolve a SlimeRunner once, as `train()`
does: in place (host mode, this environment's layout) unless it names mode, image or install_prefix."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers import SEED_RECIPE

from slimeforge import SlimeRunner, proc
from slimeforge.errors import ConfigError
from slimeforge.run.targets.base import LaunchPlan

# The guide's example (docs/api.md; the toolkit's seed): slime at its default /root/slime.
GUIDE = dict(SEED_RECIPE)


@pytest.fixture
def no_process(monkeypatch):
    """Every way slimeforge starts a process, recorded and refused: a dry run starts none."""
    started: list[object] = []

    def record_run(self, argv, *a, **k):
        started.append(list(argv))
        raise AssertionError(f"a dry run ran {argv}")

    def record_popen(argv, *a, **k):
        started.append(argv)
        raise AssertionError(f"a dry run started {argv}")

    monkeypatch.setattr(proc.Runner, "run", record_run)
    monkeypatch.setattr(subprocess, "Popen", record_popen)
    return started


def the_same(render_dir, plan: LaunchPlan) -> None:
    a, b = render_dir, plan.rundir
    assert a.env == b.env
    assert "LD_LIBRARY_PATH" not in a.env or "cudart-decoy" not in a.env["LD_LIBRARY_PATH"]
    pa, pb = json.loads(a.files["plan.json"]), json.loads(b.files["plan.json"])
    assert pa["recipe"]["mode"] == pb["recipe"]["mode"] == plan.run.recipe.mode == "host"
    assert pa["layout"] == pb["layout"]
    assert {k: v for k, v in a.files.items() if k != "plan.json"} == {k: v for k,
                                                                      v in b.files.items() if k != "plan.json"}


def test_guide_example_renders_what_train_would_run(tmp_path, no_process):
    runner = SlimeRunner(**GUIDE)
    rendered = runner.render(tmp_path / "run", num_rollout=1)
    written = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()}
    plan = runner.train(num_rollout=1, out=tmp_path / "run", dry_run=True)
    assert isinstance(plan, LaunchPlan) and plan.target == "host"
    the_same(rendered, plan)
    # train(dry_run=True) writes what render() writes, byte for byte, and started nothing.
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()} == written
    assert no_process == []
    # Not slimeforge's image layout, not its cudart decoy: this environment's own.
    assert plan.run.layout.name == "image" and not any("cudart-decoy" in text for text in rendered.files.values())
    assert "slime is not at /root/slime here: a launch refuses it" in (plan.run.layout_note or "")


def test_with_slime_installed_the_plan_is_train_s(tmp_path, no_process):
    slime = tmp_path / "slime"
    (slime / "slime").mkdir(parents=True)
    (slime / "train.py").write_text("")
    runner = SlimeRunner(**{**GUIDE, "slime_dir": str(slime)})
    plan = runner.train(out=tmp_path / "a", dry_run=True)
    the_same(runner.render(tmp_path / "a", num_rollout=1), plan)
    assert plan.run.layout_note is None and no_process == []


def test_a_named_mode_is_kept_by_both(tmp_path, no_process):
    runner = SlimeRunner(**{**GUIDE, "mode": "container"})
    rendered = runner.render(tmp_path / "c", num_rollout=1)
    plan = runner.train(out=tmp_path / "c", dry_run=True)
    assert (plan.run.recipe.mode == "container"
            and json.loads(rendered.files["plan.json"])["recipe"]["mode"] == "container")
    assert rendered.env == plan.rundir.env and no_process == []


def test_train_launch_still_refuses_without_slime(tmp_path, no_process):
    with pytest.raises(ConfigError, match="cannot run in place"):
        SlimeRunner(**GUIDE).train(out=tmp_path / "x")
    assert no_process == [] and not (tmp_path / "x").exists()
