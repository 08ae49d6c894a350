"""Issue 42 item 6, docs that run as written: every command of docs/*.md and README.md that
tests/doc_commands.py's TABLE runs in the heavy tier (dry runs, checks, the refusals the docs give),
run exactly as the docs write it, each in a fresh directory, with its exit status and what it says.
The help commands run in tests/unit/test_doc_commands.py, which also holds every doc command to the table."""

from __future__ import annotations

import pytest
from doc_commands import TABLE, Run, run_doc_command

HEAVY = [text for text, entry in TABLE.items() if isinstance(entry, Run) and entry.tier == "heavy"]


@pytest.mark.parametrize("text", HEAVY)
def test_a_doc_command_runs_as_written(text, tmp_path):
    entry = TABLE[text]
    assert isinstance(entry, Run)
    res = run_doc_command(text, tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == entry.status, f"{text}: exit {res.returncode}, the docs say {entry.status}\n{out}"
    assert entry.says in out, f"{text}: says no {entry.says!r}\n{out}"
    assert "Traceback" not in out, out
    path, line = entry.writes
    if path:
        assert line in (tmp_path / path).read_text(), f"{text}: {path} lacks {line!r}"
    if entry.status == 2 and not entry.before:  # a refusal starts nothing and writes no run directory
        assert not (tmp_path / "runs").exists(), f"{text}: refused, yet wrote {sorted((tmp_path / 'runs').iterdir())}"
