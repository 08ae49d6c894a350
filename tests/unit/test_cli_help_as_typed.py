"""A task's help names it as the user typed it (issue 42.3, docs/cli.md): `invoke run -h` says
`run`, as `invoke --help run` does, though invoke knows the collection's default as `run.start`;
`run.start -h` says `run.start`. Every name the user can type, under `invoke` and `slimeforge`."""

from __future__ import annotations

from pathlib import Path

import pytest
from invoke import Collection, Program
from invoke.loader import FilesystemLoader

ROOT = Path(__file__).resolve().parents[2]


def namespace() -> Collection:
    module, _ = FilesystemLoader(start=str(ROOT)).load("tasks")
    return Collection.from_module(module)


# Every name a user can type for a task: its full name and its aliases (a collection's default task
# answers to the collection's name: run.start to `run`).
TYPED = sorted({n for name, aliases in namespace().task_names.items() for n in (name, *aliases)})


def usage_line(binary: str, argv: list[str], capsys) -> str:
    program = Program(namespace=namespace(), binary=binary)
    with pytest.raises(SystemExit) as exc:
        program.run([binary, *argv])
    out = capsys.readouterr().out
    assert (exc.value.code or 0) == 0, out
    return out.splitlines()[0]


def test_the_defaults_are_among_the_names():
    assert {"run", "run.start", "doctor", "cluster.up"} <= set(TYPED)


@pytest.mark.parametrize("binary", ["invoke", "slimeforge"])
@pytest.mark.parametrize("name", TYPED)
def test_help_names_the_task_as_typed(name, binary, capsys):
    for argv in ([name, "-h"], [name, "--help"], ["--help", name]):
        line = usage_line(binary, argv, capsys)
        assert line.startswith(f"Usage: {binary} [--core-opts] {name} [--options] "), (argv, line)


def test_help_after_the_argument_and_options_names_it_as_typed_too(capsys):
    for argv in (["run", "recipes/gsm8k.yaml", "--dry-run", "-h"], ["run", "--dry-run", "--help"], ["run", "-h",
                                                                                                    "--dry-run"]):
        assert usage_line("invoke", argv,
                          capsys).startswith("Usage: invoke [--core-opts] run [--options] RECIPE "), argv
    assert usage_line("invoke", ["run.start", "-h"],
                      capsys).startswith("Usage: invoke [--core-opts] run.start [--options] RECIPE ")
