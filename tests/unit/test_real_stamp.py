"""The real tier (tests/real) reuses a measured result only for the code as it is now: the stamp
benchmarks/real_stack.py writes beside each phase (git HEAD, a dirty tree, the cu13 stack's hash)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from real_stack import current, stamp  # noqa: E402

from slimeforge.image.stack import load_stack  # noqa: E402


def test_the_stamp_names_this_commit_and_this_stack():
    now = stamp()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert now["head"] == head and now["stack_hash"] == load_stack("cu13").hash and isinstance(now["dirty"], bool)


def test_a_result_is_reused_only_for_this_commit_a_clean_tree_and_this_stack():
    now = {"head": "a" * 40, "dirty": False, "stack_hash": "b" * 64}
    assert current({"rc": 0, "stamp": now}, now)
    assert not current(None, now)
    assert not current({"rc": 0}, now)  # made before results were stamped: run again
    assert not current({"rc": 1, "stamp": now}, now)
    assert not current({"rc": 0, "stamp": {**now, "head": "c" * 40}}, now)
    assert not current({"rc": 0, "stamp": {**now, "stack_hash": "d" * 64}}, now)
    dirty = {**now, "dirty": True}
    assert not current({"rc": 0, "stamp": dirty}, dirty)
