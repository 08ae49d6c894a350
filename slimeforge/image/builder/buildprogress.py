"""What a person watching `invoke build` sees while BuildKit runs (docs/build.md#progress).

BuildKit's plain progress is read line by line (buildkit.stream_build): every line goes to the
step's log file; the screen gets, per Dockerfile instruction, "step N/M name" when it starts to
run, its time when it ends (or "cached"), and, for a step still running, a heartbeat at least once
a minute with its elapsed time and the log's path. Each step's estimate is its time in the last
build that ran it (step-times.json in that build's directory, this module's one record), or none
at all, never a guess. `--verbose` also shows every raw line.

A step that compiles with ninja (torch's extension builder) says "[N/M] command" as each edge
finishes (the step library runs build_wheel.py and copies those lines, cut short, to the step's
output): the heartbeat of such a step shows the compile's progress, "compiling N/M (P %)", with an
estimate (ninja_progress; the install's heartbeat reads its log the same way,
templates/install.sh.j2 _sf_ninja_progress).
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import readback
from ...atomic import write_file
from ...schema import printable

TIMES = "step-times.json"  # in a build directory: each step that ran (not cached) and its seconds
TIMES_SCHEMA = "slimeforge.step-times/1"
HEARTBEAT_S = 60.0  # a running step says so at least this often
MAX_STEP_NAME = 160  # BuildKit's instruction text is cut to this (buildkit.parse_progress does too)
MAX_TIMES_FILES = 64  # the newest this many earlier builds are read for estimates
TAIL_BYTES = 65536  # the compiler's progress is read from this much of a step's latest output
NINJA_RE = re.compile(r"[ \t]*\[([0-9]{1,7})/([0-9]{1,7})\] ")  # ninja's status; pip -v indents it


def took(seconds: float) -> str:
    """A duration as a person reads it: <1s, 42s, 7m 05s, 1h 02m."""
    s = max(0, math.floor(seconds))
    if s < 1:
        return "<1s"
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def _times_problem(doc: Any) -> str | None:
    if not isinstance(doc, dict) or doc.get("schema") != TIMES_SCHEMA:
        return f"is not {{schema: {TIMES_SCHEMA}, steps: {{name: seconds}}}}"
    steps = doc.get("steps")
    if not isinstance(steps, dict):
        return "`steps` is not an object"
    for name, seconds in steps.items():
        if len(name) > MAX_STEP_NAME or printable(name) != name:
            return (f"step name {name[:40]!r} is not text without control characters, of at most {MAX_STEP_NAME} "
                   "characters")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds < 1e7:
            return f"step {name!r}: seconds {seconds!r} is not a number from 0 to 1e7"
    return None


def read_times(path: Path) -> dict[str, float]:
    """One build's step times (a record read back: validated; a damaged one raises RecordError)."""
    doc = readback.read_json(path, TIMES, f"{{schema: {TIMES_SCHEMA}, steps: {{name: seconds}}}}", _times_problem)
    return {} if doc is None else {k: float(v) for k, v in doc["steps"].items()}


def past_times(build_root: Path, flavor: str, *also: Path) -> dict[str, float]:
    """Each step's time in the newest earlier build (of this flavor under `build_root`, or one of
    the directories in `also`) that ran it. A damaged record gives no estimate, not a wrong one."""
    found = [p for p in [*build_root.glob(f"{flavor}-*/{TIMES}"), *(d / TIMES for d in also)] if p.is_file()]
    newest = sorted(set(found), key=lambda p: p.stat().st_mtime, reverse=True)[:MAX_TIMES_FILES]
    out: dict[str, float] = {}
    for path in newest:
        try:
            for name, seconds in read_times(path).items():
                out.setdefault(name, seconds)
        except readback.RecordError:
            continue
    return out


def write_times(build_dir: Path, measured: dict[str, float], earlier: dict[str, float]) -> None:
    """This build's step times, with the earlier ones of steps it took from cache (so the next
    build still has an estimate for them): written whole or not at all."""
    import json

    steps = {**{k: v for k, v in earlier.items() if k not in measured}, **measured}
    write_file(build_dir / TIMES, json.dumps({"schema": TIMES_SCHEMA, "steps": steps}, indent=1, sort_keys=True) + "\n")


def ninja_progress(lines: Iterable[str]) -> tuple[int, int] | None:
    """(done, total) of the ninja builds in `lines` (a log's tail), or None where there are none.

    ninja says "[N/M] ..." as each of its M edges finishes. Several builds (one per extension; apex
    runs APEX_PARALLEL_BUILD of them at once, their lines interleaved) are told apart by their totals
    and by N going up: a line continues the latest build of its total whose N is below its own, else
    it starts one. The builds still running are summed; when none is, the last one as it ended."""
    builds: list[list[int]] = []  # [done, total]
    last: list[int] | None = None
    for line in lines:
        m = NINJA_RE.match(line)
        if not m:
            continue
        n, total = int(m.group(1)), int(m.group(2))
        if total < 1 or n > total:
            continue
        for b in reversed(builds):
            if b[1] == total and b[0] < n:
                b[0] = n
                break
        else:
            b = [n, total]
            builds.append(b)
        last = b
    running = [b for b in builds if b[0] < b[1]]
    if running:
        return sum(b[0] for b in running), sum(b[1] for b in running)
    return (last[0], last[1]) if last else None


def compiling_text(done: int, total: int, elapsed: float, last: float | None) -> str:
    """ "compiling N/M (P %), T so far, about D left (last run L)": the estimate from the step's last
    run where there is one, else from the rate so far; none before 5 % is done (a first extension's
    few objects say little of the rest)."""
    pct = 100 * done // total
    if done * 20 < total:
        est = "" if last is None else f" (last run {took(last)})"
    elif last is not None and last > elapsed:
        est = f", about {took(last - elapsed)} left (last run {took(last)})"
    elif last is not None:
        est = f", longer than the last run ({took(last)})"
    else:
        est = f", about {took(elapsed * (total - done) / done)} left at this rate" if done else ""
    return f"compiling {done}/{total} ({pct} %), {took(elapsed)} so far{est}"


@dataclass
class _Vertex:
    label: str  # "step 5/20 apex"
    name: str  # the estimate's key: the stack step, or the instruction
    started: float | None = None  # when its first output line came (it runs); None: not yet
    last_said: float = 0.0
    tail: deque[str] = field(default_factory=deque)  # its latest output lines, TAIL_BYTES at most
    tail_bytes: int = 0


@dataclass
class Progress:
    """Turns BuildKit's plain progress into the lines a person reads (`echo`), and measures each step."""

    echo: Callable[[str], None]
    log: Path
    estimates: dict[str, float] = field(default_factory=dict)
    verbose: bool = False
    heartbeat_s: float = HEARTBEAT_S
    clock: Callable[[], float] = time.monotonic
    measured: dict[str, float] = field(default_factory=dict)  # step name -> seconds, steps that ran

    def __post_init__(self) -> None:
        self._t0 = self.clock()
        self._vertices: dict[str, _Vertex] = {}
        self._ended: set[str] = set()  # labels said to have ended: BuildKit shows a FROM twice (resolved, then cached)
        self._lock = threading.Lock()

    def _say(self, text: str) -> None:
        self.echo(f"[{took(self.clock() - self._t0):>7}] {text}")

    def _estimate(self, v: _Vertex) -> str:
        last = self.estimates.get(v.name)
        return "" if last is None else f" (last run {took(last)})"

    def vertex(self, vid: str, index: str, total: str, name: str) -> None:
        """BuildKit named an instruction (#vid [index/total] ...): it starts, or comes from cache."""
        with self._lock:
            # BuildKit's text reaches the terminal and step-times.json: never a control character.
            name = printable(name)[:MAX_STEP_NAME]
            self._vertices.setdefault(vid, _Vertex(f"step {index}/{total} {name[:60]}", name))

    def output(self, vid: str, text: str = "") -> None:
        """A line of a vertex's own output: it is running (said once, with its estimate). The line
        joins the vertex's tail, where the heartbeat looks for the compiler's progress."""
        with self._lock:
            v = self._vertices.get(vid)
            if v is None:
                return
            if text:
                # Bytes as the install's `tail -c` counts them (each line with its newline).
                v.tail.append(text)
                v.tail_bytes += len(text.encode("utf-8", "replace")) + 1
                while v.tail_bytes > TAIL_BYTES and len(v.tail) > 1:
                    v.tail_bytes -= len(v.tail.popleft().encode("utf-8", "replace")) + 1
            if v.started is not None:
                return
            v.started = v.last_said = self.clock()
            self._say(f"{v.label}: running{self._estimate(v)}")

    def ended(self, vid: str, how: str, seconds: float | None) -> None:
        """CACHED, DONE <seconds> or ERROR of a vertex."""
        with self._lock:
            v = self._vertices.pop(vid, None)
            if v is None or (v.label in self._ended and v.started is None):
                return
            self._ended.add(v.label)
            if how == "CACHED":
                self._say(f"{v.label}: cached")
            elif how == "DONE":
                self.measured[v.name] = seconds if seconds is not None else 0.0
                self._say(f"{v.label}: done in {took(self.measured[v.name])}")
            else:
                ran = self.clock() - v.started if v.started is not None else 0.0
                self._say(f"{v.label}: FAILED after {took(ran)} (log: {self.log})")

    def beat(self) -> None:
        """Each step running for a heartbeat or more since it was last mentioned says it still runs."""
        with self._lock:
            now = self.clock()
            for v in self._vertices.values():
                if v.started is not None and now - v.last_said >= self.heartbeat_s:
                    v.last_said = now
                    last = self.estimates.get(v.name)
                    # Only the parsed numbers of the output reach the terminal, never its text.
                    count = ninja_progress(v.tail)
                    if count is not None:
                        self._say(f"{v.label}: {compiling_text(*count, now - v.started, last)} (log: {self.log})")
                        continue
                    of = "" if last is None else f" of ~{took(last)}"
                    self._say(f"{v.label}: still running, {took(now - v.started)}{of} (log: {self.log})")

    def raw(self, line: str) -> None:
        if self.verbose:
            with self._lock:
                self.echo(printable(line))


class Heartbeat:
    """A thread that calls `progress.beat()` while a build runs (a context manager)."""

    def __init__(self, progress: Progress, every_s: float | None = None):
        self.progress, self._stop = progress, threading.Event()
        self.every_s = every_s if every_s is not None else min(5.0, progress.heartbeat_s)
        self._thread = threading.Thread(target=self._run, name="build-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.progress.beat()

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
