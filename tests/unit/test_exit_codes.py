"""Exit codes by rule (docs/exit-codes.md): an error's class carries its status and tasks.py's
clean_errors is the one mapping: 2 bad input or a refused precondition, 1 what ran and failed."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from invoke import Context, Exit

from slimeforge.errors import CommandError, ConfigError, OperationFailed, Problem, SlimeforgeError
from slimeforge.image.builder.build import BuildError
from slimeforge.image.builder.install import InstallFailed
from slimeforge.image.lock.lockfile import LockError
from slimeforge.image.publish.push import PublishError, PushFailed
from slimeforge.image.remote.registry import RegistryAuthError
from slimeforge.readback import RecordError
from slimeforge.run.targets.jobsapi import NoAnswer  # noqa: F401 - its classes are among those walked

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import tasks  # noqa: E402


@pytest.mark.parametrize(("error", "code"), [
    (ConfigError("recipe", [Problem("lr", "must be a number", "x")]), 2),
    (LockError("no lock for cu129"), 2),
    (RegistryAuthError("registry refused access"), 2),
    (PublishError("no such local image"), 2),
    (RecordError("plan.json", "plan.json", "is not JSON", "a JSON object"), 2),
    (CommandError("install", ["bash", "install.sh"], 3), 1),
    (BuildError("smoke test failed"), 1),
    (InstallFailed("install failed (exit 1)"), 1),
    (PushFailed("push r/x:1: blob upload unknown"), 1),
])
def test_clean_errors_exits_with_the_status_the_class_carries(error, code):
    @tasks.clean_errors
    def task(c):
        raise error

    with pytest.raises(Exit) as exc:
        task(Context())
    assert exc.value.code == code and str(exc.value.message).startswith("error: ")
    assert isinstance(error, OperationFailed) == (code == 1)


def test_every_error_class_has_a_status_of_the_rule():
    seen, todo = set(), [SlimeforgeError]
    while todo:
        cls = todo.pop()
        seen.add(cls)
        todo += cls.__subclasses__()
    assert {cls.exit_code for cls in seen} == {1, 2, 3}
    assert all(cls.exit_code == 1 for cls in seen if issubclass(cls, OperationFailed))
    # 3: the Ray Jobs API did not answer, so the job's state is unknown (neither refused nor failed)
    assert {cls.__name__ for cls in seen if cls.exit_code == 3} == {"NoAnswer", "TooLarge"}


def test_tasks_pick_no_status_of_their_own_beyond_the_rule():
    """A literal exit status in the tasks (slimeforge/cli.py and the cli*.py beside it) is 1 or 2 (a job's own status
    passes through as a name)."""
    for path in sorted((ROOT / "slimeforge").glob("cli*.py")):
        tree = ast.parse(path.read_text())
        literal = [kw.value.value for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id",
                                                                                                       "") == "Exit"
                   for kw in node.keywords if kw.arg == "code" and isinstance(kw.value, ast.Constant)]
        assert set(literal) <= {1, 2}, path.name
        assert literal or path.name != "cli.py"


@pytest.mark.parametrize("argv", [["run", "--nope", "r.yaml"], ["run", "r.yaml", "--nope"], ["doctor", "--nope"],
                                  ["doctor", "r.yaml", "--nope"], ["run.status", "x", "--nope=1"], ["cluster.up",
                                                                                                    "i.yaml", "--nope"],
                                  ["build", "--nope"], ["no-such-task"], ["--no-such-core-option"]])
def test_bad_command_lines_exit_2_wherever_the_token_stands(argv, capsys):
    """A command line the parser refuses is bad input (2), not a failed job (1, invoke's own)."""
    from invoke import Program

    with pytest.raises(SystemExit) as exc:
        Program(namespace=tasks.ns, binary="invoke").run(["invoke", *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert err.startswith("error: `invoke") and "Traceback" not in err
