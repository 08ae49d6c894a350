"""Issue 42 item 6, docs that run as written: every command of docs/*.md and README.md that
tests/doc_commands.py's TABLE runs in the heavy tier (dry runs, checks, --json documents, the refusals
the docs give), run exactly as the docs write it in a fresh directory, with its exit status and what it
says; the commands that act on what one of them rendered (run.status of a dry run's run directory)
run after it, in its directory. The help commands run in tests/unit/test_doc_commands.py, which also
holds every doc command to the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from doc_commands import TABLE, Run, run_doc_command
from json_shapes import check

HEAVY = [text for text, entry in TABLE.items() if isinstance(entry, Run) and entry.tier == "heavy" and not entry.before]


def after(text: str) -> list[str]:
    return [t for t, e in TABLE.items() if isinstance(e, Run) and e.before == text]


def holds(text: str, where: Path) -> None:
    entry = TABLE[text]
    assert isinstance(entry, Run)
    res = run_doc_command(text, where, before=False)
    out = res.stdout + res.stderr
    assert res.returncode == entry.status, f"{text}: exit {res.returncode}, the docs say {entry.status}\n{out}"
    assert entry.says in out, f"{text}: says no {entry.says!r}\n{out}"
    assert "Traceback" not in out, out
    if entry.json:  # one document on stdout and nothing else there (docs/json.md)
        check(json.loads(res.stdout), entry.json)
    path, line = entry.writes
    if path:
        assert line in (where / path).read_text(), f"{text}: {path} lacks {line!r}"
    if entry.status == 2 and not entry.before:  # a refusal starts nothing and writes no run directory
        assert not (where / "runs").exists(), f"{text}: refused, yet wrote {sorted((where / 'runs').iterdir())}"


@pytest.mark.parametrize("text", HEAVY)
def test_a_doc_command_runs_as_written(text, tmp_path):
    holds(text, tmp_path)
    for then in after(text):
        holds(then, tmp_path)


def test_every_heavy_command_is_run():
    dependents = {t for t, e in TABLE.items() if isinstance(e, Run) and e.before}
    assert all(TABLE[t].before in HEAVY for t in dependents)  # type: ignore[union-attr]
