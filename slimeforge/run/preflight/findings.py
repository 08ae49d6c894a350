"""The preflight's framework: findings (error / warning / ok, each error with its fix), the report,
the context every check reads, and the registry of checks (`@check`), in report order.

Host checks read the host through a command runner `run(argv) -> stdout` (the context's `run`),
so tests feed them captured outputs, and cluster.up runs the same checks over ssh.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from ... import paths
from ...errors import ConfigError, Problem
from ...image.stack import Stack
from ...proc import CommandRunner, Runner
from ...schema import printable
from ..recipe import Recipe
from .toolfix import known_fix, tool_message

ERROR, WARNING, OK = "error", "warning", "ok"

Run = Callable[[list[str]], str]


@dataclass(frozen=True)
class Finding:
    check: str
    level: str  # ERROR, WARNING or OK
    message: str
    fix: str = ""
    # Not checked because what it needs failed in another check (a warning naming it): the cause is
    # that check's one error, with its one fix, never a second error here.
    needs: str = ""

    def __str__(self) -> str:
        text = f"[{self.check}] {self.message}"
        return text + (f"\n    fix: {self.fix}" if self.fix else "")


def error(check: str, message: str, fix: str) -> Finding:
    return Finding(check, ERROR, message, fix)


def warning(check: str, message: str, fix: str = "") -> Finding:
    return Finding(check, WARNING, message, fix)


def ok(check: str, message: str) -> Finding:
    return Finding(check, OK, message)


def skipped(check: str, needs: str, message: str, fix: str = "") -> Finding:
    """`check` did not run: it needs `needs` (what another check found missing, or an option not given)."""
    return Finding(check, WARNING, f"not checked: {message}", fix, needs=needs)


class PreflightError(ConfigError):
    """Preflight found errors; carries the whole report (every problem, each with its fix)."""

    def __init__(self, source: str, report: Report):
        self.report = report
        super().__init__(source, [Problem(f.check, f"{f.message}; fix: {f.fix}",
                                          show_value=False) for f in report.errors])

    def headline(self) -> str:
        # Every launch prints the report's table (each error with its fix) before raising this:
        # the command line says so once rather than listing the same errors again.
        checks = ", ".join(dict.fromkeys(f.check for f in self.report.errors))
        return (f"{self.source}: {len(self.report.errors)} error(s) ({checks}), each with its fix in the table above; "
                "--skip-check CHECK turns one into a warning")


class FindingDoc(TypedDict):
    check: str
    level: str
    message: str
    fix: str


class ReportDoc(TypedDict):
    """`invoke doctor --json`'s body (slimeforge.doctor/1, docs/json.md)."""

    errors: int
    warnings: int
    seconds: float
    findings: list[FindingDoc]


@dataclass(repr=False)
class Report:
    """Every finding of a preflight (`findings`; `table()` prints them); its repr counts them."""

    findings: list[Finding]
    seconds: float = 0.0

    def __repr__(self) -> str:
        ok_count = len(self.findings) - len(self.errors) - len(self.warnings)
        return (f"Report(errors={len(self.errors)}, warnings={len(self.warnings)}, ok={ok_count}, "
               f"seconds={self.seconds:.2f})")

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == WARNING]

    def to_json(self) -> ReportDoc:
        """The report as `invoke doctor --json` prints it (slimeforge.doctor/1, docs/json.md)."""
        return {"errors": len(self.errors), "warnings": len(self.warnings), "seconds": round(self.seconds, 3),
                "findings": [{"check": f.check, "level": f.level, "message": f.message,
                              "fix": f.fix} for f in self.findings]}

    def table(self) -> str:
        width = max([len(f.check) for f in self.findings] + [5])
        lines = [f"{'check':<{width}}  {'status':<7}  detail"]
        for f in self.findings:
            status = "skip" if f.needs else {ERROR: "ERROR", WARNING: "warn", OK: "ok"}[f.level]
            # Messages carry text from tools and reports: each line reaches the terminal without control characters.
            first, *rest = [printable(line) for line in f.message.splitlines()] or [""]
            lines.append(f"{f.check:<{width}}  {status:<7}  {first}")
            lines += [f"{'':<{width}}  {'':<7}  {line}" for line in rest]
            if f.fix:
                lines.append(f"{'':<{width}}  {'':<7}  fix: {printable(f.fix)}")
        held = sum(1 for f in self.findings if f.needs)
        lines.append(f"{len(self.errors)} error(s), {len(self.warnings)} "
                     "warning(s)" + (f" ({held} not checked: each names what it needs)" if held else "")
                     + f" in {self.seconds:.2f} s")
        return "\n".join(lines)


# --- the context the checks read ------------------------------------------------------------------


def reader(runner: CommandRunner) -> Run:
    """A host reader over `runner` (this machine's, or an ssh one's): returns stdout, raises CommandError on failure."""
    return lambda argv: runner.run(argv, step=argv[0], timeout=30).stdout


@dataclass
class Context:
    stack: Stack
    recipe: Recipe | None = None
    args: list[str] = field(default_factory=list)  # slime.args as rendered
    mode: str = "host"
    address: str | None = None
    catalog: str | None = None
    image: str | None = None
    install_prefix: str | None = None
    runner: Runner = field(default_factory=Runner)  # every command a check runs itself
    run: Run | None = None  # how host checks read the host; default: reader(runner)
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    docker: str = "docker"
    state_dir: Path | None = None  # where the launcher records the Ray head it started
    build_root: Path = paths.BUILDS  # where `invoke build` writes its build directories
    # Host mode's interpreter when known (in place: this one): without an install prefix, the flag
    # catalog is read from slime_dir with it, and the Ray of its environment is checked.
    python: str | None = None
    cache: dict[str, object] = field(default_factory=dict)  # once()'s results (or their exception) by key

    @property
    def in_place(self) -> bool:
        """Host mode in an environment given by its interpreter, not by an install prefix."""
        return self.mode == "host" and bool(self.python) and not self.install_prefix

    @property
    def read(self) -> Run:
        """How the host checks read the host: `run`, else through the runner."""
        return self.run or reader(self.runner)

    def image_facts(self) -> Any:
        """What the image holds (its Python, Ray, slime and flag catalog: run/imageprobe.py), learned
        once per preflight and cached by the image's ID across them; an Exception when it cannot be."""
        from ..imageprobe import image_facts
        from ..recipe import RUNNER_FIELDS

        r = self.recipe
        slime, megatron = (r.slime_dir, r.megatron_dir) if r else (str(RUNNER_FIELDS["slime_dir"]),
                                                                   str(RUNNER_FIELDS["megatron_dir"]))
        return self.once("image-facts", lambda: image_facts(str(self.image), slime, megatron, docker=self.docker,
                                                            runner=self.runner))

    def image_blocker(self, check: str) -> Finding | None:
        """None when the image can be had here (pulled if need be; a probe that ran in it and failed is
        each check's own finding). Else the one error of the first check that needs the image, with
        the fix Docker's words name, and for every later check a skip naming that one."""
        from ..imageprobe import ProbeError

        facts = self.image_facts()
        if not isinstance(facts, Exception) or isinstance(facts, ProbeError):
            return None
        first = str(self.cache.setdefault("image-blocked-by",
                                          check))  # the name of the first check that needed the image
        if first != check:
            return skipped(check, first,
                           f"needs image {self.image}, which cannot be had here (the {first} error above says why)")
        return error(check, f"image {self.image} cannot be had here: {tool_message(facts)}",
                     known_fix(facts,
                               f"check the image's name (`docker pull {self.image}` must work on this host), or give "
                               "another with --image"))

    def once(self, key: str, fn: Callable[[], Any]) -> Any:
        if key not in self.cache:
            try:
                self.cache[key] = fn()
            except Exception as exc:  # noqa: BLE001 - remembered and reported by each check that needs it
                self.cache[key] = exc
        return self.cache[key]


@dataclass(frozen=True)
class Check:
    name: str
    scope: str  # "host" (this machine), "recipe" (files), "network" (AWS, the cluster)
    needs_recipe: bool
    fn: Callable[[Context], list[Finding]]
    doc: str


CHECKS: dict[str, Check] = {}


def check(name: str, scope: str, needs_recipe: bool = False):
    def register(fn: Callable[[Context], list[Finding]]):
        CHECKS[name] = Check(name, scope, needs_recipe, fn, (fn.__doc__ or "").strip().splitlines()[0])
        return fn

    return register



def describe_failure(exc: Exception) -> str:
    """A failed read: the command and the tool's own message, verbatim (toolfix.py), or the exception."""
    return tool_message(exc)

