"""One convention for the command line (issue 42.3, docs/cli.md): what a task acts on is positional
(`doctor [RECIPE]`, `run RECIPE`, `run.status RUN`, ...), its usage and --help lines show it so, an
unknown option exits 2 wherever it stands, and `invoke --list` shows each task's whole sentence."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from invoke import Collection, Executor, Program
from invoke.loader import FilesystemLoader

ROOT = Path(__file__).resolve().parents[2]


def namespace() -> Collection:
    module, _ = FilesystemLoader(start=str(ROOT)).load("tasks")
    return Collection.from_module(module)


CONTEXTS = {ctx.name: ctx for ctx in namespace().to_contexts()}


class Noting(Executor):
    """Runs nothing: the parser's result is what is tested."""

    def execute(self, *tasks):
        return {}


def parse(argv, capsys):
    """(exit code, stderr, {arg: value} of the task the parser made) without running the task."""
    program = Program(namespace=namespace(), executor_class=Noting, binary="invoke")
    code = 0
    try:
        program.run(["invoke", *argv])
    except SystemExit as exc:
        code = exc.code or 0
    parsed = {}
    for ctx in getattr(program, "tasks", None) or []:
        parsed = {arg.attr_name or arg.name: arg.value for arg in ctx.args.values()}
    return code, capsys.readouterr().err, parsed


def cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


# --- doctor [RECIPE] ---------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["doctor", "recipes/gsm8k.yaml", "--no-network"],
                                  ["doctor", "--no-network", "recipes/gsm8k.yaml"],
                                  ["doctor", "--recipe", "recipes/gsm8k.yaml",
                                   "--no-network"]])  # the option form, kept
def test_doctor_takes_its_recipe_positionally_or_as_before(argv, capsys):
    code, err, parsed = parse(argv, capsys)
    assert code == 0, err
    assert parsed["recipe"] == "recipes/gsm8k.yaml" and parsed["no_network"] is True


def test_doctor_without_a_recipe_checks_the_host_alone(capsys):
    code, err, parsed = parse(["doctor", "--no-network"], capsys)
    assert code == 0, err
    assert parsed["recipe"] is None and "needs RECIPE" not in err


def test_doctor_with_a_recipe_as_a_user_runs_it():
    """It was "No idea what 'recipes/gsm8k.yaml' is!" (exit 1): now the recipe's checks run (no GPU,
    no model here: exit 2 with the table, naming the recipe's own checks)."""
    res = cli("doctor", "recipes/gsm8k.yaml", "--no-network", "--mode", "host")
    assert "No idea" not in res.stderr and "Traceback" not in res.stderr
    assert res.returncode == 2 and "model-config" in res.stdout and "data" in res.stdout


# --- usage lines ---------------------------------------------------------------------------------


def positional_names(ctx) -> str:
    return " ".join(f"[{a.name.upper()}]" if getattr(a, "may_omit",
                                                     False) else a.name.upper() for a in ctx.positional_args)


@pytest.mark.parametrize("name", sorted(n for n, ctx in CONTEXTS.items() if ctx.positional_args))
def test_help_shows_the_positional_argument_where_it_is_typed(name, capsys):
    program = Program(namespace=namespace(), binary="invoke")
    with pytest.raises(SystemExit) as exc:
        program.run(["invoke", name, "--help"])
    out = capsys.readouterr().out
    assert (exc.value.code or 0) == 0
    ctx = CONTEXTS[name]
    assert out.splitlines()[0] == (f"Usage: invoke [--core-opts] {name} [--options] {positional_names(ctx)} [other "
                                  "tasks here ...]")
    for arg in ctx.positional_args:
        assert f"--{arg.name.replace('_', '-')}=STRING" not in out  # invoke's listing of it as an option
        assert re.search(rf"^\s+{arg.name.upper()}\s+\S", out, re.M), out


def test_the_usage_lines_of_doctor_and_run():
    assert positional_names(CONTEXTS["doctor"]) == "[RECIPE]" and positional_names(CONTEXTS["run.start"]) == "RECIPE"
    res = cli("doctor", "--nope")
    assert res.returncode == 2
    assert res.stderr.splitlines() == ["error: `invoke doctor` has no option --nope",
                                       "usage: invoke doctor [OPTIONS] [RECIPE]",
                                       "e.g.:  invoke doctor recipes/gsm8k.yaml",
                                       "(`invoke doctor --help` lists its options)"]


# --- unknown options: 2 wherever they stand ------------------------------------------------------


@pytest.mark.parametrize("task", ["run", "doctor"])
@pytest.mark.parametrize("where", ["before", "after"])
def test_an_unknown_option_exits_2_before_and_after_the_recipe(task, where, capsys):
    argv = [task, "--nope", "recipes/gsm8k.yaml"] if where == "before" else [task, "recipes/gsm8k.yaml", "--nope"]
    code, err, _ = parse(argv, capsys)
    assert code == 2, err
    assert err.splitlines()[0] == f"error: `invoke {task}` has no option --nope" and "No idea" not in err


def test_an_unknown_option_as_a_user_runs_it():
    before, after = cli("run", "--nope", "recipes/gsm8k.yaml"), cli("run", "recipes/gsm8k.yaml", "--nope")
    assert before.returncode == after.returncode == 2
    assert before.stderr == after.stderr


# --- invoke --list ---------------------------------------------------------------------------------


def test_every_task_s_line_in_the_list_is_whole():
    """invoke lists a docstring's first line only: each must be a whole sentence (lock's was cut at
    "(--check: verify it;")."""
    cut = []
    tasks = namespace()
    for name in CONTEXTS:
        task = tasks[name]
        first = (task.__doc__ or "").strip().splitlines()[0].strip()
        if not first.endswith((".", ")")) or first.count("(") != first.count(")") or first.count("`") % 2:
            cut.append(f"{name}: {first!r}")
    assert not cut, "\n".join(cut)


def test_the_list_as_a_user_runs_it():
    res = cli("--list")
    assert res.returncode == 0
    text = " ".join(res.stdout.split())
    assert "lock Resolve a flavor into its lock, images/locks/pylock.<flavor>.toml. publish" in text
