"""The one way slimeforge runs an external program: an argv list, never an interpolated shell string.

Tests inject a different `Runner` (or read `Runner.history`) to compare exact argv lists.
`CommandRunner` is what `Runner` (here) and `cluster.ssh.SSH` (on a host) have in common: code
that runs a command to its end and reads its Result takes one and runs on either.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .atomic import open_log
from .errors import CommandError


@dataclass
class Result:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class CommandRunner(Protocol):
    """Runs an argv list to its end: `Runner` on this machine, `cluster.ssh.SSH` on a host (there
    `cwd` is a path on that host, hence text). CommandError when it fails and `check` is set."""

    def run(self, argv: Sequence[str], *, step: str = "", check: bool = True, capture: bool = True,
            env: Mapping[str, str] | None = None, cwd: str | None = None, input: str | None = None,
            timeout: float | None = None) -> Result: ...


@dataclass
class Runner:
    """Runs argv lists; `dry_run` records and prints instead of running."""

    dry_run: bool = False
    echo: Callable[[str], None] | None = None
    history: list[list[str]] = field(default_factory=list)

    def run(
        self,
        argv: Sequence[str],
        *,
        step: str = "",
        check: bool = True,
        capture: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
        input: str | None = None,
        timeout: float | None = None,
    ) -> Result:
        argv = [str(a) for a in argv]
        self.history.append(argv)
        if self.echo:
            self.echo(shlex.join(argv))
        if self.dry_run:
            return Result(argv, 0, "", "")
        full_env = None if env is None else {**os.environ, **env}
        try:
            proc = subprocess.run(
                argv,
                env=full_env,
                cwd=cwd,
                input=input,
                text=True,
                capture_output=capture,
                timeout=timeout,
                check=False,
            )
        except FileNotFoundError as exc:
            raise CommandError(step or argv[0], argv, 127, f"{argv[0]}: not found on PATH") from exc
        except subprocess.TimeoutExpired as exc:
            raise CommandError(step or argv[0], argv, 124, f"timed out after {timeout}s") from exc
        result = Result(argv, proc.returncode, proc.stdout or "", proc.stderr or "")
        if check and proc.returncode != 0:
            raise CommandError(step or argv[0], argv, proc.returncode, result.stdout + result.stderr)
        return result


    def stream(self, argv: Sequence[str], on_line: Callable[[str], None], *, step: str = "",
               env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
               forward_signals: bool = False) -> int:
        """Run to the end, handing each line of its output (stdout and stderr together) to
        `on_line` as it comes: progress of a slow command. Returns the exit status.

        forward_signals: the program runs in its own session, so a terminal's Ctrl-C reaches only
        us, and the first SIGINT/SIGTERM we get is passed on to it as SIGTERM (once: its own
        handler, e.g. launch.sh's trap, decides how to stop). Main thread only; elsewhere no handler."""
        argv = [str(a) for a in argv]
        self.history.append(argv)
        if self.echo:
            self.echo(shlex.join(argv))
        if self.dry_run:
            return 0
        full_env = None if env is None else {**os.environ, **env}
        try:
            with subprocess.Popen(argv, env=full_env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, text=True, bufsize=1,
                                  start_new_session=forward_signals) as proc:
                assert proc.stdout is not None
                with _forwarding(proc, forward_signals):
                    for line in proc.stdout:
                        on_line(line.rstrip("\n"))
                    return proc.wait()
        except FileNotFoundError as exc:
            raise CommandError(step or argv[0], argv, 127, f"{argv[0]}: not found on PATH") from exc

    def start(
        self,
        argv: Sequence[str],
        *,
        step: str = "",
        log: str | os.PathLike | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
        new_session: bool = False,
    ) -> subprocess.Popen | None:
        """Start a long-running program in the background (a Ray head, a container) and return it;
        output goes to `log` (else it is inherited). `new_session` keeps a terminal's Ctrl-C away
        from it. A dry run records the argv and returns None."""
        argv = [str(a) for a in argv]
        self.history.append(argv)
        if self.echo:
            self.echo(shlex.join(argv))
        if self.dry_run:
            return None
        full_env = None if env is None else {**os.environ, **env}
        out = open_log(log, "ab") if log is not None else None  # the child owns it from here; a regular file only
        try:
            return subprocess.Popen(argv, env=full_env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT if out else None,
                                    stdin=subprocess.DEVNULL, start_new_session=new_session)
        except FileNotFoundError as exc:
            raise CommandError(step or argv[0], argv, 127, f"{argv[0]}: not found on PATH") from exc
        finally:
            if out is not None:
                out.close()


@contextlib.contextmanager
def _forwarding(proc: subprocess.Popen, enabled: bool):
    """While inside: the first SIGINT/SIGTERM to this process goes to `proc` as SIGTERM."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    sent = threading.Event()

    def forward(_signum, _frame):
        if not sent.is_set() and proc.poll() is None:
            sent.set()
            proc.send_signal(signal.SIGTERM)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie counts as gone): the one test, for code and tests."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
