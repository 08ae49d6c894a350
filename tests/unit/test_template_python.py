"""No program in a template (issue 41): Python that a template runs (a heredoc fed to python, a
`python3 -c '...'` body) is glue of a few lines; a program lives in slimeforge/scripts/, where
ruff, mypy and unit tests see it, and is rendered or copied from there. A heuristic scanner: it
errs towards counting (any heredoc or -c body that a python command reads, or that begins as
Python does)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slimeforge import paths

MAX_LINES = 10  # per template, all of its Python together
# A command that runs Python: python, python3, python3.12, $PYTHON, "${SYSTEM_PYTHON}", $venv/bin/python.
_PYTHON_CMD = re.compile(r"python[0-9.]*\b|\$\{?[A-Za-z_]*PYTHON[A-Za-z_]*\}?", re.IGNORECASE)
_HEREDOC = re.compile(r"(?<!<)<<(-?)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")
_DASH_C = re.compile(r"\s-c\s+(['\"])")
_PY_START = re.compile(r"\s*(import\s|from\s+\S+\s+import\s|print\()")


def python_snippets(text: str) -> list[tuple[int, int]]:
    """(line number, lines of Python) of each snippet of Python in a shell (or Dockerfile) template."""
    lines = text.splitlines()
    found: list[tuple[int, int]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        heredoc = _HEREDOC.search(line)
        if heredoc:
            tabs, delim = heredoc.group(1), heredoc.group(3)
            body: list[str] = []
            j = i + 1
            while j < len(lines) and (lines[j].lstrip("\t") if tabs else lines[j]) != delim:
                body.append(lines[j])
                j += 1
            code = [b for b in body if b.strip()]
            if _PYTHON_CMD.search(line[:heredoc.start()]) or delim.upper().startswith("PY") or (code
                and _PY_START.match(code[0])):
                found.append((i + 1, len(code)))
            i = j + 1
            continue
        dash_c = _DASH_C.search(line)
        if dash_c:
            quote, rest = dash_c.group(1), "\n".join(lines[i:])[dash_c.end():]
            end = rest.find(quote)  # single quotes hold no quote; double-quoted Python here holds none either
            body = rest[: end if end >= 0 else len(rest)].splitlines()
            if _PYTHON_CMD.search(line[:dash_c.start() + 1]) or (body and _PY_START.match(body[0])):
                found.append((i + 1, len([b for b in body if b.strip()])))
            i += max(len(body), 1)
            continue
        i += 1
    return found


TEMPLATES = sorted(p for p in Path(paths.TEMPLATES).iterdir() if p.is_file())


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.name)
def test_no_template_holds_more_than_ten_lines_of_python(template):
    snippets = python_snippets(template.read_text())
    total = sum(n for _, n in snippets)
    assert total <= MAX_LINES, (f"{template.name} holds {total} lines of Python ({snippets}: (line, lines)): "
                                "move the program to slimeforge/scripts/ and render or copy it from there")


def test_the_scanner_counts_heredocs_and_dash_c_bodies_of_python_and_nothing_else():
    program = "\n".join(f"x{n} = {n}" for n in range(12))
    sample = "\n".join([
        'verdict="$("$PYTHON" - "$record" 2>&1 <<\'PY\'', "import json", program, "PY", ')"',  # 13 lines fed to python
        "python3 - <<EOF", "import sys", "print(sys.argv)", "EOF",  # 2 lines
        "\"$1\" -c 'import ensurepip, os, sys", "sys.exit(0)' >/dev/null",  # 2 lines, the interpreter a variable
        "\"$venv/bin/python\" -c 'import torch; print(torch.version.cuda)'",  # 1 line
        "base64 -d >\"$SF_STATE/x\" <<'SF_SCRIPT_1'", "aW1wb3J0IHN5cw==", "SF_SCRIPT_1",  # not Python
        "bash -c 'echo hi; exit 0'",  # not Python
        'read -r a b <<<"$share"',  # a here-string, not a heredoc
        "cat <<-'NOTE'", "\tjust text", "\tNOTE",
    ])
    assert python_snippets(sample) == [(1, 13), (17, 2), (21, 2), (23, 1)]
    assert sum(n for _, n in python_snippets(sample)) > MAX_LINES
