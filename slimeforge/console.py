"""How every task prints: one convention (docs/output.md).

- Results (a table, a plan, JSON) go to stdout; diagnostics (progress, warnings, errors) to stderr,
  so `invoke X --json | jq` and `invoke X > file` hold only the result.
- Colour only on a terminal, and never when NO_COLOR is set to a non-empty value (no-color.org).
- Off a terminal a table keeps its full width: rich would squeeze it to 80 columns ("nod…").
- A long command is printed as copy-pasteable shell, one option per line with ` \\` continuations,
  each word quoted (`shell_lines`); the exact argv stays in the record (plan.json, report.json).
- A JSON answer carries its schema and version (`json_doc`, docs/json.md).
- A closed pipe (`invoke stack.show | head -1`) ends the task quietly with status 141, as a
  process killed by SIGPIPE does (`quiet_on_closed_pipe`, called by tasks.clean_errors).

rich is imported inside the functions: `invoke --list` and dry runs stay fast.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

CLOSED_PIPE_EXIT = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader went away
WIDE = 10_000  # off a terminal: wide enough that rich never folds or cuts a table's cell


def colour_allowed(stream: IO[str]) -> bool:
    """Colour only on a terminal, and not when NO_COLOR holds any non-empty value."""
    return not os.environ.get("NO_COLOR") and is_terminal(stream)


def console(stream: IO[str] | None = None):
    """A rich Console for `stream` (default stdout) by this module's rules: colour only where
    `colour_allowed`, the terminal's width on a terminal, else `WIDE` (no squeezed columns)."""
    from rich.console import Console

    stream = stream or sys.stdout
    colour, on_tty = colour_allowed(stream), is_terminal(stream)
    return Console(file=stream, no_color=not colour, color_system="auto" if colour else None,
                   width=None if on_tty else WIDE, highlight=False)


def is_terminal(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def diag(text: str) -> None:
    """A diagnostic line (progress, a warning, a note): stderr, flushed at once."""
    print(text, file=sys.stderr, flush=True)


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]],
          stream: IO[str] | None = None) -> None:
    """A table (a result: stdout unless told), None cells empty, no cell cut off a terminal. Cells
    hold other tools' text (ssh's errors): each is plain text, never rich markup ("[/]" in a
    message would be read as a tag), with control characters replaced (schema.printable)."""
    from rich.table import Table
    from rich.text import Text

    from .schema import printable  # pydantic comes with it: not at import, `--help` stays fast

    t = Table(title=None if title is None else Text(printable(title)), title_justify="left")
    for col in columns:
        t.add_column(Text(col), overflow="fold")
    for row in rows:
        t.add_row(*(Text("" if v is None else printable(str(v))) for v in row))
    console(stream).print(t)


def json_doc(schema: str, body: Mapping[str, Any]) -> str:
    """One JSON answer: `{"schema": "slimeforge.<name>/<version>", ...body}`, indented, one document."""
    return json.dumps({"schema": schema, **body}, indent=2, default=str)


def shell_lines(argv: Sequence[str], env: Mapping[str, str] | None = None, trailing: int = 0) -> str:
    """`argv` (and env assignments before it) as shell a person can read and paste: the program and
    its leading words on the first line, then one option per line, its value beside it, then the
    `trailing` positional words (docker build's context) on a line each, joined by ` \\`
    continuations. Every word is shell-quoted, so the text runs exactly `argv`."""
    head = [f"{k}={shlex.quote(v)}" for k, v in (env or {}).items()]
    words, tail = (list(argv[:-trailing]), list(argv[-trailing:])) if trailing else (list(argv), [])
    i = 0
    while i < len(words) and not words[i].startswith("-"):
        head.append(shlex.quote(words[i]))
        i += 1
    lines = [" ".join(head)]
    while i < len(words):
        word = words[i]
        # An option and, unless it carries its value (--x=v) or the next word is an option, its value.
        group = [word]
        if word.startswith("-") and "=" not in word and i + 1 < len(words) and not words[i + 1].startswith("-"):
            group.append(words[i + 1])
            i += 1
        i += 1
        lines.append("    " + " ".join(shlex.quote(w) for w in group))
    lines += ["    " + shlex.quote(w) for w in tail]
    return " \\\n".join(lines)


def quiet_on_closed_pipe() -> int:
    """The reader of stdout went away (`| head`): nothing more can be said there. Point stdout at
    /dev/null so the interpreter's last flush cannot raise again (Python's documented recipe, see
    the signal module's "Note on SIGPIPE"), and return the status to exit with."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (captured in tests): nothing to redirect
        pass
    return CLOSED_PIPE_EXIT
