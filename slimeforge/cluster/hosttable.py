"""A per-host progress table: live (rich) on a terminal, one plain line per change otherwise.

The same table, rendered as plain text, goes into the error when a bring-up stops, so a log file
or CI output shows exactly which host failed which step.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from ..errors import SlimeforgeError

if TYPE_CHECKING:
    from rich.live import Live

PENDING, RUNNING, OK, FAILED, SKIPPED = "·", "…", "ok", "FAILED", "-"
STYLES = {PENDING: "dim", RUNNING: "yellow", OK: "green", FAILED: "bold red", SKIPPED: "dim"}


class HostCellProblems(SlimeforgeError):
    """One host's problems as one line, the detail of its row (bringup.parallel shows the first
    line of a failure's message): joined by ' | ', each problem with its fix."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__(" | ".join(problems))


class HostTable:
    def __init__(self, title: str, hosts: Sequence[tuple[str, str]], columns: Sequence[str],
                 stream: TextIO | None = None, live: bool | None = None):
        self.title = title
        self.hosts = [name for name, _ in hosts]
        self.roles = dict(hosts)
        self.columns = list(columns)
        self.cells = {name: dict.fromkeys(self.columns, PENDING) for name in self.hosts}
        self.details = dict.fromkeys(self.hosts, "")
        self.stream = stream or sys.stdout
        self.live_mode = self.stream.isatty() if live is None else live
        self._lock = threading.Lock()
        self._live: Live | None = None

    # --- updates (thread-safe: hosts report from worker threads) --------------------------------

    def set(self, host: str, column: str, status: str, detail: str | None = None) -> None:
        with self._lock:
            self.cells[host][column] = status
            if detail is not None:
                self.details[host] = detail
            if self._live is not None:
                self._live.update(self._rich())
            else:
                extra = f"  {detail}" if detail else ""
                print(f"[{self.title}] {host:<{self._width()}} {column:<11} {status}{extra}", file=self.stream,
                      flush=True)

    def skip_rest(self, after: str) -> None:
        """Mark every pending cell after column `after` as skipped (the bring-up stopped)."""
        later = self.columns[self.columns.index(after) + 1 :]
        with self._lock:
            for name in self.hosts:
                for col in later:
                    if self.cells[name][col] == PENDING:
                        self.cells[name][col] = SKIPPED
                if self.cells[name][after] in (PENDING, RUNNING):
                    self.cells[name][after] = SKIPPED
            if self._live is not None:
                self._live.update(self._rich())

    def failed(self) -> list[str]:
        return [h for h in self.hosts if FAILED in self.cells[h].values()]

    # --- rendering -------------------------------------------------------------------------------

    def _width(self) -> int:
        return max(len(h) for h in self.hosts)

    def text(self) -> str:
        """The table as plain text: for errors, logs and the non-terminal case."""
        head = ["host", "role", *self.columns, "detail"]
        rows = [[h, self.roles[h], *(self.cells[h][c] for c in self.columns), self.details[h]] for h in self.hosts]
        widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head) - 1)]
        lines = []
        for row in [head, *rows]:
            cells = [str(v).ljust(widths[i]) for i, v in enumerate(row[:-1])]
            lines.append("  ".join([*cells, str(row[-1])]).rstrip())
        return "\n".join(lines)

    def _rich(self):
        from rich.table import Table

        table = Table(title=self.title, title_justify="left")
        for col in ["host", "role", *self.columns, "detail"]:
            table.add_column(col, overflow="fold")
        for h in self.hosts:
            cells = ([f"[{STYLES.get(v, '')}]{v}[/]" if v in STYLES else v for v in (self.cells[h][c] for c
                                                                                     in self.columns)])
            table.add_row(h, self.roles[h], *cells, self.details[h])
        return table

    def __enter__(self) -> HostTable:
        if self.live_mode:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self._rich(), console=Console(file=self.stream), refresh_per_second=8)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.update(self._rich())
            self._live.__exit__(*exc)
            self._live = None
