"""Errors that carry everything a user needs to fix the input: where, what was seen, what works."""

from __future__ import annotations

from dataclasses import dataclass

SHOWN_CHARS = 120  # a value in a message: enough to recognise it, never a whole file


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """`repr(value)`, cut to `limit` characters (repr escapes newlines and control characters)."""
    if isinstance(value, int) and value.bit_length() > 1000:  # repr of over 4300 digits raises
        return f"(a number of {value.bit_length()} bits)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text)} characters)"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input. `where` is a field path, file, host or step name."""

    where: str
    message: str
    value: object = None
    accepted: str | None = None
    show_value: bool = True

    def __str__(self) -> str:
        text = f"{self.where}: {self.message}"
        if self.show_value:
            text += f" (got {shown(self.value)})"
        if self.accepted:
            text += f"; accepted: {self.accepted}"
        return text


class SlimeforgeError(Exception):
    """Base class: every error slimeforge raises on purpose is one of these. Its class says the
    command line's exit status (`exit_code`; tasks.clean_errors is the one place that maps it):
    2 for bad input or a refused precondition, the default; 1 for what ran and failed
    (`OperationFailed`). docs/exit-codes.md has the table."""

    exit_code = 2

    def headline(self) -> str:
        """What the command line prints: the whole message, unless it was shown already."""
        return str(self)


class OperationFailed(SlimeforgeError):
    """A job, build, install, push or external command ran and failed: exit 1."""

    exit_code = 1


class ConfigError(SlimeforgeError):
    """An input (recipe, stack, inventory, option) was refused; lists every problem found."""

    def __init__(self, source: str, problems: list[Problem]):
        self.source = source
        self.problems = list(problems)
        lines = [f"{source}: {len(self.problems)} problem(s):"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


class CommandError(OperationFailed):
    """An external command failed; names the step so the user knows where to look."""

    def __init__(self, step: str, argv: list[str], returncode: int, output: str = ""):
        self.step, self.argv, self.returncode, self.output = step, argv, returncode, output
        tail = "\n".join(output.strip().splitlines()[-20:])
        msg = f"{step}: command exited with {returncode}: {' '.join(argv)}"
        if tail:
            msg += f"\n--- last lines ---\n{tail}"
        super().__init__(msg)
