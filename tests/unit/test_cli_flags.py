"""The flags people expect, over every task (docs/cli.md): `-h`/`--help` is help and runs nothing,
the only short flags are the conventional ones, a missing positional argument gets a usage line and
an example (shell completion: tests/integration/heavy/test_cli_completion.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from invoke import Collection, Executor, Program
from invoke.loader import FilesystemLoader

ROOT = Path(__file__).resolve().parents[2]
# Each short flag as docker, kubectl and ray users know it (tasks.SHORT_FLAGS); `-v` is --verbose's.
CONVENTIONAL = {"-t": "--tag", "-f": "--follow", "-v": "--verbose"}


def namespace() -> Collection:
    """tasks.py's namespace, loaded anew: invoke hands each task's help texts to the first parser
    made from it, so each parse gets its own."""
    module, _ = FilesystemLoader(start=str(ROOT)).load("tasks")
    return Collection.from_module(module)


CONTEXTS = {ctx.name: ctx for ctx in namespace().to_contexts()}
POSITIONAL = sorted(name for name, ctx in CONTEXTS.items() if ctx.positional_args)
# Those whose argument must be given (`doctor` without RECIPE checks the host alone).
REQUIRED = sorted(name for name, ctx in CONTEXTS.items() if any(not getattr(a, "may_omit",
                                                                            False) for a in ctx.positional_args))


class RecordingExecutor(Executor):
    """invoke's executor, noting each task it is asked to run: help must run none."""

    ran: list = []

    def execute(self, *tasks):
        RecordingExecutor.ran.extend(tasks)
        return super().execute(*tasks)


def run_program(argv, capsys):
    RecordingExecutor.ran = []
    program = Program(namespace=namespace(), executor_class=RecordingExecutor, binary="invoke")
    with pytest.raises(SystemExit) as exited:
        program.run(["invoke", *argv])
    out = capsys.readouterr()
    return exited.value.code or 0, out.out, out.err


def cli(*args):
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_the_positional_tasks_are_found():
    assert {"run.start", "run.status", "run.logs", "run.stop", "cluster.up", "cluster.status", "cluster.down",
            "doctor"} <= set(POSITIONAL)
    assert set(POSITIONAL) - set(REQUIRED) == {"doctor"}
    assert len(CONTEXTS) >= 19  # every task of tasks.py


@pytest.mark.parametrize("name", sorted(CONTEXTS))
@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_flag_prints_help_and_runs_nothing(name, flag, capsys):
    code, out, err = run_program([name, flag], capsys)
    assert code == 0, err
    assert out.startswith(f"Usage: invoke [--core-opts] {name} "), out
    assert "Options:" in out
    assert RecordingExecutor.ran == []


@pytest.mark.parametrize("name", POSITIONAL)
def test_help_after_the_positional_argument_is_help_too(name, capsys):
    code, out, _ = run_program([name, "somewhere.yaml", "-h"], capsys)
    assert code == 0
    assert out.startswith(f"Usage: invoke [--core-opts] {name} ")
    assert RecordingExecutor.ran == []


def short_flags(ctx) -> dict[str, str]:
    """Each one-letter flag of a task -> its option's long flag (the parser keeps them as aliases,
    which iterating its flags does not show: they are read from each argument's names)."""
    return {f"-{n}": f"--{arg.names[0]}" for arg in ctx.args.values() for n in arg.names if len(n) == 1}


@pytest.mark.parametrize("name", sorted(CONTEXTS))
def test_only_conventional_short_flags(name):
    for flag, long in short_flags(CONTEXTS[name]).items():
        assert flag in CONVENTIONAL, f"{name}: unconventional short flag {flag} ({long})"
        assert long == CONVENTIONAL[flag], f"{name}: {flag} is {long}, not {CONVENTIONAL[flag]}"
        assert flag in CONTEXTS[name].flags  # the parser takes it


def test_the_short_flags_are_found_where_they_are():
    assert short_flags(CONTEXTS["build"]) == {"-t": "--tag", "-v": "--verbose"}
    assert short_flags(CONTEXTS["wheels.build"]) == {"-v": "--verbose"}
    assert short_flags(CONTEXTS["publish"]) == {"-t": "--tag"}
    assert short_flags(CONTEXTS["run.logs"]) == {"-f": "--follow"}
    assert {flag for ctx in CONTEXTS.values() for flag in short_flags(ctx)} <= set(CONVENTIONAL)


def test_the_short_flags_that_surprised_are_gone():
    run_flags = short_flags(CONTEXTS["run.start"])
    assert not {"-e", "-u", "-l"} & set(run_flags)
    assert "-h" not in short_flags(CONTEXTS["lock"])
    assert CONTEXTS["build"].flags["-t"].name == "tag" and CONTEXTS["run.logs"].flags["-f"].name == "follow"


@pytest.mark.parametrize("name", REQUIRED)
def test_a_missing_positional_argument_gets_usage_and_an_example(name, capsys):
    code, out, err = run_program([name], capsys)
    assert code == 2
    assert RecordingExecutor.ran == []
    ctx = CONTEXTS[name]
    shown = min((name, *ctx.aliases), key=len)
    arg = ctx.positional_args[0].name.upper()
    lines = err.splitlines()
    assert lines[0].startswith(f"error: `invoke {shown}` needs {arg}, ")
    assert lines[1] == f"usage: invoke {shown} [OPTIONS] {arg}"
    example = lines[2].removeprefix(f"e.g.:  invoke {shown} ")
    assert example != lines[2] and example != arg and "/" in example  # a real path, taken from the argument's help
    assert "did not receive required positional arguments" not in err


def test_invoke_run_without_a_recipe_as_a_user_runs_it():
    out = cli("run")
    assert out.returncode == 2
    assert out.stderr.splitlines()[:3] == ["error: `invoke run` needs RECIPE, recipe YAML, e.g. recipes/gsm8k.yaml",
                                           "usage: invoke run [OPTIONS] RECIPE", "e.g.:  invoke run recipes/gsm8k.yaml"]
    assert (ROOT / "recipes" / "gsm8k.yaml").is_file()  # the example is one to copy


@pytest.mark.parametrize("argv", [["lock", "-h"], ["run", "-h"], ["run.status", "--help"]])
def test_help_as_a_user_runs_it(argv):
    out = cli(*argv)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Usage: inv[oke] [--core-opts] ")
    assert "ok (" not in out.stdout  # `lock -h` was --check: it checked the lock


@pytest.mark.parametrize("name", POSITIONAL)
def test_an_unknown_option_is_not_taken_for_the_argument(name, capsys):
    """invoke took any token for a missing positional: `invoke run --nope` looked for a recipe named --nope."""
    code, _, err = run_program([name, "--nope"], capsys)
    assert code == 2
    assert RecordingExecutor.ran == []
    lines = err.splitlines()
    shown = min((name, *CONTEXTS[name].aliases), key=len)
    assert lines[0] == f"error: `invoke {shown}` has no option --nope"
    assert lines[1].startswith(f"usage: invoke {shown} [OPTIONS] ")


@pytest.mark.parametrize("name", POSITIONAL)
def test_an_unknown_option_after_the_argument_exits_2_too(name, capsys):
    """invoke's own answer after the argument was "No idea what '--nope' is!", exit 1."""
    code, _, err = run_program([name, "somewhere.yaml", "--nope=1"], capsys)
    assert code == 2 and RecordingExecutor.ran == []
    shown = min((name, *CONTEXTS[name].aliases), key=len)
    assert err.splitlines()[:2] == [f"error: `invoke {shown}` has no option --nope", err.splitlines()[1]]
    assert err.splitlines()[1].startswith(f"usage: invoke {shown} [OPTIONS] ") and "No idea" not in err


def test_options_before_the_argument_still_work(tmp_path):
    out = cli("run", "--dry-run", "--out", str(tmp_path / "run"), "--set", "num_rollout=3", "recipes/gsm8k.yaml")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "run" / "plan.json").is_file()
