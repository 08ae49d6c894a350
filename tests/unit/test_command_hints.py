"""Under the installed `slimeforge` command a message that names a task to run names it as typed
(`run slimeforge build --cuda cu13 first`), and nothing else that says "invoke" changes."""

from __future__ import annotations

import io

import pytest

from slimeforge.cli import ns
from slimeforge.clihelp import AsTyped, hint_pattern


@pytest.mark.parametrize(("text", "expected"), [
    ("run invoke build --cuda cu13 first", "run slimeforge build --cuda cu13 first"),
    ("error: invoke publish: 1 problem(s):", "error: slimeforge publish: 1 problem(s):"),
    ("see `invoke doctor --list-checks`", "see `slimeforge doctor --list-checks`"),
    ("`invoke run.status runs/x` and `invoke run RECIPE`",
     "`slimeforge run.status runs/x` and `slimeforge run RECIPE`"),
    ("`invoke --list` lists them", "`slimeforge --list` lists them"),
    # Not a hint: another word after it, a path, a longer word, a name that is no task.
    ("thin invoke tasks over the package", "thin invoke tasks over the package"),
    ("/usr/bin/invoke build", "/usr/bin/invoke build"),
    ("reinvoke build", "reinvoke build"),
    ("invoke runner", "invoke runner"),
    ("invoke run_x", "invoke run_x"),
    ("invoke wheels", "invoke wheels"),
])
def test_a_hint_names_the_command_as_typed(text, expected):
    assert hint_pattern(ns).sub("slimeforge", text) == expected


def test_the_stream_rewrites_what_is_written_and_is_the_stream_otherwise():
    buf = io.StringIO()
    out = AsTyped(buf, hint_pattern(ns), "slimeforge")
    assert out.write("run invoke lock --check\n") == len("run invoke lock --check\n")
    out.writelines(["invoke install --dry-run\n"])
    assert buf.getvalue() == "run slimeforge lock --check\nslimeforge install --dry-run\n"
    assert out.isatty() is False and out.getvalue() is buf.getvalue()
