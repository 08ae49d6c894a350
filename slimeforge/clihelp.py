"""The command line around the tasks (docs/cli.md), as people expect it, for `invoke TASK` in a
checkout and for the installed `slimeforge` command alike:

- CliTask and `task`, the tasks' decorator: only the conventional short flags (SHORT_FLAGS),
  positional arguments a call may leave out (may_omit), help texts kept whole across parsers;
- invoke's parser: `-h` is help wherever it stands, a missing positional argument gets a usage line
  and an example, an unknown option is bad input (UsageError, exit 2) wherever it stands;
- a task's help shows its positional arguments where they are typed;
- the command named as typed (PROGRAM; under `slimeforge`: AsTyped, hint_pattern, name_in_help), and
  the task too (typed_name: `run -h` names `run`, not invoke's `run.start`).

Importing it fixes invoke's parser and Program in place (their state machine cannot be subclassed);
slimeforge/cli.py, the tasks themselves, imports it first.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import sys

import invoke
from invoke import Collection, Exit
from invoke.parser import parser as invoke_parser

# The command a usage line names: `invoke` in a checkout, `slimeforge` once cli.main() runs.
PROGRAM = "invoke"


# --- the command line people expect (docs/cli.md) ---------------------------------------------

# The only short flags, each as docker/kubectl/ray users know it (`-v` for a task's --verbose, where
# one has it); `-h` is invoke's help on every task.
SHORT_FLAGS = {"tag": "t", "follow": "f", "verbose": "v"}


class CliTask(invoke.Task):
    """A task without invoke's generated short flags (a name's first free letter: `lock -h` was
    --check, `run -e` --time, `run -u` --slurm), given only the conventional ones of SHORT_FLAGS."""

    def __init__(self, body, may_omit=(), **kwargs):
        kwargs["auto_shortflags"] = False
        super().__init__(body, **kwargs)
        # Positional arguments a call may leave out (`invoke doctor` checks the host alone; `invoke doctor RECIPE`).
        self.may_omit = tuple(may_omit)

    def get_arguments(self, ignore_unknown_help=None):
        # Invoke pops each help text as it makes the argument: a second parser of the same task (the
        # `slimeforge` Program beside `invoke`, a test's) would get none. Each call keeps them whole.
        texts = dict(self.help)
        try:
            args = super().get_arguments(ignore_unknown_help)
        finally:
            self.help = texts
        for arg in args:
            arg.may_omit = arg.name in self.may_omit  # type: ignore[attr-defined]
        return args

    def arg_opts(self, name, default, taken_names):
        opts = super().arg_opts(name, default, taken_names)
        if name in SHORT_FLAGS:
            opts["names"].append(SHORT_FLAGS[name])
        return opts


task = functools.partial(invoke.task, klass=CliTask)


# invoke's parser, given two answers a user expects: `-h`/`--help` is help also where a task still
# waits for its positional argument (it was taken for that argument: `invoke run -h` looked for a
# recipe named -h), and a missing positional argument gets a usage line and an example (invoke's
# own: "'run.start' did not receive required positional arguments: 'recipe'"). Its state machine
# cannot be subclassed (the states are class-level), so its two methods are wrapped in place.
# (Loading this module again, as the tests do, wraps invoke's own methods again, not these.)
_invoke_handle = getattr(invoke_parser.ParseMachine.handle, "invoke_own", invoke_parser.ParseMachine.handle)
_invoke_complete_context = getattr(invoke_parser.ParseMachine.complete_context, "invoke_own",
                                   invoke_parser.ParseMachine.complete_context)


def _handle(machine, token):
    waiting = machine.context is not machine.initial and machine.context.missing_positional_args
    if waiting and machine.current_state != "unknown" and not machine.waiting_for_flag_value:
        if token in ("-h", "--help"):
            machine.initial.flags["--help"].value = typed_name(machine.context)
            return
        # Any token was taken for the missing argument: an unknown option became a recipe named "--nope".
        known = token.split("=", 1)[0] in machine.context.flags or token in machine.context.inverse_flags
        if token.startswith("-") and not known:
            raise UsageError(f"error: `{PROGRAM} {short_name(machine.context)}` has no option "
                             f"{token}\n{usage(machine.context)}",
                             machine.context)
    before = machine.context
    try:
        _invoke_handle(machine, token)
        if machine.context is not before and machine.context is not machine.initial and token in machine.contexts:
            # `run`, the collection's default, is run.start to invoke: its help names it as typed
            machine.context.typed = token
        elif token in ("-h", "--help") and machine.context is not None and machine.context is not machine.initial:
            machine.initial.flags["--help"].value = typed_name(machine.context)
    except UsageError:
        raise
    except invoke.ParseError as exc:
        # invoke's own refusals ("No idea what '--nope' is!" once a task has its positional argument)
        # exit 1, as a failed job would: bad input exits 2 wherever the option stands (docs/exit-codes.md).
        in_task = machine.context is not None and machine.context is not machine.initial
        if in_task and token.startswith("-"):
            raise UsageError(f"error: `{PROGRAM} {short_name(machine.context)}` has no option "
                             f"{token.split('=', 1)[0]}\n"
                             f"{usage(machine.context)}", machine.context) from None
        where = f"`{PROGRAM} {short_name(machine.context)}`" if in_task else f"`{PROGRAM}`"
        raise UsageError(f"error: {where}: {exc}\n(`{PROGRAM} --list` lists the tasks, `{PROGRAM} TASK --help` their "
                         "options)",
                         machine.context) from None


def _complete_context(machine):
    missing = machine.context.missing_positional_args if machine.context is not None else []
    if missing and all(getattr(a, "may_omit", False) for a in missing):  # `invoke doctor`: RECIPE may be left out
        if machine.context not in machine.result:
            machine.result.append(machine.context)
        return
    missing = [a for a in missing if not getattr(a, "may_omit", False)]
    if missing and machine.initial.flags["--help"].value is None:
        needs = "; ".join(f"{a.name.upper()}, {a.help}" for a in missing)
        raise UsageError(f"error: `{PROGRAM} {short_name(machine.context)}` needs {needs}\n{usage(machine.context)}",
                         machine.context)
    if missing:  # help was asked for: it needs no argument
        if machine.context not in machine.result:
            machine.result.append(machine.context)
        return
    _invoke_complete_context(machine)


class UsageError(invoke.ParseError, Exit):
    """A command line refused with its usage: a ParseError, as invoke's own (so tab completion still
    finds the task being typed), that exits 2 (bad input, docs/exit-codes.md) and prints once."""

    def __init__(self, text, context):
        super().__init__(text, context)  # ParseError's, which hands the text on to Exit's as its message
        Exit.__init__(self, None, 2)  # no Exit message: it is printed once, as the ParseError it is
        self.text = text

    def __str__(self) -> str:
        return self.text


_handle.invoke_own = _invoke_handle  # type: ignore[attr-defined]
_complete_context.invoke_own = _invoke_complete_context  # type: ignore[attr-defined]
invoke_parser.ParseMachine.handle = _handle  # type: ignore[method-assign]
invoke_parser.ParseMachine.complete_context = _complete_context  # type: ignore[method-assign]


def positional_usage(ctx) -> str:
    """RECIPE, or [RECIPE] where it may be left out: how the positional arguments are typed."""
    return " ".join(f"[{a.name.upper()}]" if getattr(a, "may_omit",
                                                     False) else a.name.upper() for a in ctx.positional_args)


def usage(ctx) -> str:
    """How a task is called, and one call to copy (each positional's help says `e.g. X`)."""
    name = short_name(ctx)  # `invoke run` for run.start
    args = positional_usage(ctx)
    examples = " ".join(m.group(1).rstrip(";:,.)") if (m := re.search(r"e\.g\. (\S+)",
                                                                      a.help or "")) else a.name.upper()
                        for a in ctx.positional_args)
    return (f"usage: {PROGRAM} {name} [OPTIONS] {args}\n"
            f"e.g.:  {PROGRAM} {name} {examples}\n"
            f"(`{PROGRAM} {name} --help` lists its options)")


def short_name(ctx) -> str:
    return min((ctx.name, *ctx.aliases), key=len)


def typed_name(ctx) -> str:
    """The task's name as the command line typed it (`run`, or `run.start`); the parser remembers only its own."""
    return getattr(ctx, "typed", ctx.name)


_invoke_print_task_help = getattr(invoke.Program.print_task_help, "invoke_own", invoke.Program.print_task_help)


def _print_task_help(program, name: str) -> None:
    """invoke's task help, with the positional arguments where they are typed: `usage: invoke
    run [--options] RECIPE` (invoke's: `run [--options]`, listing `--recipe=STRING`, a
    form kept for compatibility but never shown)."""
    ctx = program.parser.contexts[name]
    positional = {f"--{a.name.replace('_', '-')}": a.name.upper() for a in ctx.positional_args}
    with contextlib.redirect_stdout(io.StringIO()) as text:
        _invoke_print_task_help(program, name)
    lines = text.getvalue().splitlines()
    if positional and lines and lines[0].startswith("Usage: "):
        lines[0] = lines[0].replace(f" {name} [--options] ", f" {name} [--options] {positional_usage(ctx)} ", 1)
        for i, line in enumerate(lines):
            m = re.match(r"(\s+)(--[\w-]+)=STRING(\s+)", line)
            if m and m.group(2) in positional:
                shown = positional[m.group(2)]
                lines[i] = (m.group(1) + shown + " " * (len(m.group(2)) + len("=STRING") - len(shown)) + m.group(3)
                            + line[m.end():])
    for line in lines:  # a line at a time, as Invoke prints it
        print(line)


_print_task_help.invoke_own = _invoke_print_task_help  # type: ignore[attr-defined]
invoke.Program.print_task_help = _print_task_help  # type: ignore[method-assign,assignment]


def run_program(ns: Collection, program: str, version: str) -> None:
    """The tasks of `ns` as the command `program` (the `slimeforge` command, cli.main): its name in
    the usage lines, in the help texts and in the library's hints, printed as typed."""
    global PROGRAM
    PROGRAM = program
    name_in_help(ns, program)
    hints = hint_pattern(ns)
    sys.stdout, sys.stderr = AsTyped(sys.stdout, hints, program), AsTyped(sys.stderr, hints, program)
    try:
        invoke.Program(namespace=ns, name=program, binary=program, version=version).run()
    except BrokenPipeError:  # `slimeforge --list | head`: invoke's own listing and help, outside clean_errors
        from slimeforge.console import quiet_on_closed_pipe

        sys.exit(quiet_on_closed_pipe())


def hint_pattern(coll: Collection) -> re.Pattern[str]:
    """`invoke` where a message names one of these tasks to run (`run invoke build --cuda cu13
    first`, `error: invoke publish: ...`): the word alone, before a task's name or alias as a word."""
    names = sorted({n for name, aliases in coll.task_names.items() for n in (name, *aliases)} | {"--list", "--help"},
                   key=len, reverse=True)
    return re.compile(r"(?<![\w/.-])invoke(?=[ \t]+(?:" + "|".join(map(re.escape, names)) + r")(?![\w.-]))")


class AsTyped:
    """A text stream whose messages name the command as it was typed: the library's hints say
    `invoke TASK` (a checkout's command); under the `slimeforge` command they say `slimeforge TASK`.
    Everything but write() is the stream's own (fileno, isatty, flush: a closed pipe still shows)."""

    def __init__(self, stream, pattern: re.Pattern[str], program: str):
        self._stream, self._pattern, self._program = stream, pattern, program

    def write(self, text: str) -> int:
        self._stream.write(self._pattern.sub(self._program, text))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def name_in_help(coll: Collection, program: str) -> None:
    """A task's help that names another task (`invoke doctor --list-checks`) names it as typed here."""
    for t in coll.tasks.values():
        t.help = {k: v.replace("`invoke ", f"`{program} ") for k, v in t.help.items()}
    for sub in coll.collections.values():
        name_in_help(sub, program)
