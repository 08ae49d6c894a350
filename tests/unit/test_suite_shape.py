"""The suite's own shape: what `pytest -q -ra` (the README's every-tier command) needs to collect."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_file_name():
    # pytest's default import mode ("prepend", no __init__.py here) imports a test module by its file
    # name alone: a second tests/**/test_x.py fails the whole collection ("import file mismatch").
    # The tiers, run one directory at a time, never meet; `pytest -q -ra` over tests/ does.
    where: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        where[path.name].append(path.relative_to(TESTS).as_posix())
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}
