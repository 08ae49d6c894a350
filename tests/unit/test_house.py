"""The house rules of issue 41, held as a ratchet: they stay true once they are true.

No module of slimeforge over 600 lines; no class name defined twice; `dict[str, Any]` kept few (the
seams are typed); no template carrying a program of its own (a heredoc of Python is at most 10
lines: a longer program is a module in slimeforge/scripts, rendered in)."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "slimeforge"
MAX_MODULE_LINES = 600
MAX_ANY_DICTS = {"slimeforge/image": 15, "slimeforge": 40}
MAX_TEMPLATE_PYTHON_LINES = 10


def modules() -> list[Path]:
    # stacks/ and templates/ are links to data (images/, templates/): no Python modules there
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_is_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"split these by concept (at most {MAX_MODULE_LINES} lines each): {long}"


def test_no_class_name_is_defined_twice():
    where: dict[str, list[str]] = defaultdict(list)
    for p in modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(str(p.relative_to(ROOT)))
    twice = {name: files for name, files in where.items() if len(files) > 1}
    assert not twice, f"one name per concept: {twice}"


def test_untyped_dicts_stay_few():
    counts = {}
    for prefix, limit in MAX_ANY_DICTS.items():
        found = sum(p.read_text().count("dict[str, "
                                        "Any]") for p in modules() if str(p.relative_to(ROOT)).startswith(prefix))
        counts[prefix] = found
        assert found <= limit, f"{prefix}: {found} dict[str, Any] (at most {limit}): give the data its shape"
    assert counts["slimeforge/image"] <= counts["slimeforge"]


def python_heredocs(text: str) -> list[tuple[int, int]]:
    """(line, length) of each heredoc fed to a Python interpreter, Jinja lines not counted."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        m = re.search(r"(?:python3?|\$\{?PYTHON\}?\"?)\b[^<]*<<-?'?(\w+)'?", line, re.I)
        if not m:
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == m.group(1)), len(lines))
        body = [x for x in lines[i + 1 : end] if x.strip() and not re.fullmatch(r"\s*\{\{.*\}\}\s*", x)]
        found.append((i + 1, len(body)))
    return found


def test_the_heredoc_finder_counts_program_lines_not_rendered_ones():
    text = ("f() {\n  \"$PYTHON\" - \"$@\" <<'PY'\n{{ program }}\nPY\n}\ng() {\n  python3 - <<'EOF'\nimport "
           "sys\nprint(1)\nEOF\n}\n")
    assert python_heredocs(text) == [(2, 0), (7, 2)]


def test_no_template_carries_a_program():
    heavy = {}
    for p in sorted((ROOT / "templates").iterdir()):
        if p.is_file():
            for line, n in python_heredocs(p.read_text()):
                if n > MAX_TEMPLATE_PYTHON_LINES:
                    heavy[f"{p.name}:{line}"] = n
    assert not heavy, f"programs in templates (move them to slimeforge/scripts and render them in): {heavy}"
