"""The test suite's own habits, checked on its source: an assertion that mixes `and` with `or`
without parentheses reads one way and parses another (`A and B or C` is `(A and B) or C`: it once
made a lock check pass for a 3-package lock)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def ambiguous_asserts(source: str) -> list[int]:
    """Lines of `assert` statements where an `and` sits unparenthesized inside an `or`."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assert):
            continue
        for inner in ast.walk(node.test):
            if not (isinstance(inner, ast.BoolOp) and isinstance(inner.op, ast.Or)):
                continue
            for operand in inner.values:
                if isinstance(operand, ast.BoolOp) and isinstance(operand.op, ast.And):
                    start = offsets[operand.lineno - 1] + operand.col_offset
                    if source[:start].rstrip()[-1:] != "(":
                        found.append(node.lineno)
    return found


def test_no_assertion_mixes_and_with_or_unparenthesized():
    bad = ([f"{p.relative_to(TESTS)}:{line}" for p in sorted(TESTS.rglob("*.py")) for line
            in ambiguous_asserts(p.read_text())])
    assert bad == []


@pytest.mark.parametrize(("source", "expected"), [
    ("assert a > 1 and not b or set(b) <= c\n", [1]),  # the defect this guards against
    ("assert (a > 1 and not b) or c\n", []),
    ("assert a > 1 and (not b or c)\n", []),
    ("x = a and b or c\nassert x\n", []),
])
def test_the_guard_sees_the_precedence_trap_and_only_it(source, expected):
    assert ambiguous_asserts(source) == expected


def test_a_module_that_leaves_the_environment_changed_fails(tmp_path):
    """The conftest guard (no test leaks environment variables) run on two modules: one restores
    what it set, one does not; only the second fails, naming the variable."""
    import shutil
    import subprocess
    import sys

    tests = tmp_path / "tests"
    tests.mkdir()
    for name in ("conftest.py", "helpers.py"):
        shutil.copy(TESTS / name, tests / name)
    (tests / "test_clean.py").write_text("def test_restores(monkeypatch):\n    monkeypatch.setenv('SF_SCOPED', '1')\n")
    (tests / "test_leaky.py").write_text("import os\n\n\ndef test_leaks():\n    os.environ['SF_LEAKED'] = '1'\n")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                          str(tests)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert res.returncode == 1, res.stdout[-3000:]
    assert "test_leaky.py left os.environ changed after its tests: SF_LEAKED" in res.stdout
    assert "2 passed, 1 error" in res.stdout and "SF_SCOPED" not in res.stdout, res.stdout[-3000:]
