"""Every `invoke ...` hint in the code, templates and docs names a real task and real options of
it, as invoke itself knows them: tasks.py's namespace, loaded the way `invoke` loads it, and each
task's parser context (its flags and --no-... inverses). A renamed task or option fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from invoke import Collection
from invoke.loader import FilesystemLoader

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [*sorted((ROOT / "slimeforge").rglob("*.py")), ROOT / "tasks.py", *sorted((ROOT / "templates").iterdir()),
           *sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", *sorted((ROOT / "recipes").rglob("*.yaml")),
           *sorted((ROOT / "images").glob("*.yaml")), *sorted((ROOT / "benchmarks").glob("*.py")), ROOT / ".ci" / "run"]
# `invoke TASK ...` up to the end of the hint: a closing backtick or quote, a bracket, a comment,
# a pipe, or the end of the line.
HINT_RE = re.compile(r"(?<![\w/.-])invoke\s+([a-z][a-z0-9_-]*(?:\.[a-z][a-z0-9_-]*)?)([^`'\"()#|;\n]*)")
PROSE = {"tasks", "task", "import"}  # "thin invoke tasks over ...", "from invoke import": the program, not a hint


def namespace() -> Collection:
    module, _ = FilesystemLoader(start=str(ROOT)).load("tasks")
    return Collection.from_module(module)


def contexts() -> dict[str, set[str]]:
    """Task name (and alias) -> the flags its parser accepts."""
    known: dict[str, set[str]] = {}
    for ctx in namespace().to_contexts():
        flags = set(ctx.flags) | set(ctx.inverse_flags) | {"--help", "-h"}
        for name in (ctx.name, *ctx.aliases):
            known[name] = flags
    return known


def hints() -> list[tuple[str, str, list[str]]]:
    found = []
    for path in SOURCES:
        if not path.is_file():
            continue
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for m in HINT_RE.finditer(line):
                if m.group(1) in PROSE:
                    continue
                rest = m.group(2)
                # `invoke run.status/run.logs`: each alternative is a task.
                alternatives = re.match(r"((?:/[a-z][a-z0-9_-]*(?:\.[a-z][a-z0-9_-]*)?)*)", rest).group(1)
                tokens = [t.strip("[]\\.,:") for t in rest[len(alternatives):].split()]
                options = [t.split("=", 1)[0] for t in tokens if t.startswith("--") and t != "--"]
                # `run.status/logs/stop`: a bare alternative is a sibling in the first one's collection.
                prefix = m.group(1).rpartition(".")[0]
                siblings = [a if "." in a or not prefix else f"{prefix}.{a}" for a in alternatives.split("/")[1:]]
                for task in (m.group(1), *siblings):
                    found.append((f"{path.relative_to(ROOT)}:{lineno}", task, options))
    return found


def test_the_hints_are_found():
    found = hints()
    assert len(found) > 100  # the scan reads what it should (code, templates, docs)
    assert any(task == "run.stop" for _, task, _ in found) and any("--dry-run" in opts for _, _, opts in found)


def test_every_hint_names_a_real_task_and_real_options():
    known = contexts()
    wrong = []
    for where, task, options in hints():
        if task not in known:
            wrong.append(f"{where}: `invoke {task}`: no such task")
            continue
        wrong += [f"{where}: `invoke {task} {opt}`: no such option" for opt in options if opt not in known[task]]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("hint", ["invoke render", "invoke run.stop --run-dir X", "invoke doctor --list"])
def test_a_wrong_hint_is_caught(hint):
    known = contexts()
    (m,) = HINT_RE.finditer(hint)
    task, options = m.group(1), [t for t in m.group(2).split() if t.startswith("--")]
    assert task not in known or any(o not in known[task] for o in options)
