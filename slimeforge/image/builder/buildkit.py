"""BuildKit's side of a build: the build directory written (the context, file by file, wheels hard
linked), and the plain progress read back (one line per instruction while it runs; per step,
whether it came from cache and its time; the step library's ERROR lines of a failure)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import NotRequired, TypedDict

from ... import paths
from ...atomic import open_log, write_dir
from ...proc import Runner
from ...schema import printable
from ..sources import dist_files
from .buildprogress import HEARTBEAT_S, Heartbeat, Progress, write_times


def link_files(src: Path, names: list[str], target: Path) -> None:
    """Hard links where possible (wheels can be gigabytes), else copies."""
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        (target / name).unlink(missing_ok=True)
        try:
            os.link(src / name, target / name)
        except OSError:
            shutil.copy2(src / name, target / name)


def copy_wheels(src: Path, target: Path) -> None:
    """The wheels of a --source wheel directory into the context (hard links where possible: wheels
    can be gigabytes). Their content is in the hash through the lock's wheel_dirs digest."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for whl in dist_files(src):
        try:
            os.link(whl, target / whl.name)
        except OSError:
            shutil.copy2(whl, target / whl.name)


def write_tree(root: Path, files: dict[str, str | bytes], modes: dict[str, int]) -> None:
    """Write nested files, each replaced atomically (write_dir works one directory at a time)."""
    by_dir: dict[str, dict[str, str | bytes]] = {}
    for name, content in files.items():
        parent, _, base = name.rpartition("/")
        by_dir.setdefault(parent, {})[base] = content
    for parent, group in sorted(by_dir.items()):
        prefix = f"{parent}/" if parent else ""
        write_dir(root / parent if parent else root, group,
                  modes={b: modes[prefix + b] for b in group if prefix + b in modes})


# --- the progress of a build ------------------------------------------------------------------

VERTEX_RE = re.compile(r"^#(\d+) \[(?:[^\]]*? )?(\d+)/(\d+)\] (.+)$")
STATUS_RE = re.compile(r"^#(\d+) (CACHED|DONE (\d+(?:\.\d+)?)s|ERROR\b.*)$")
OUTPUT_RE = re.compile(r"^#(\d+) \d+(?:\.\d+)? ")  # a vertex's own output: "#12 3.141 text"
STEP_RE = re.compile(re.escape(paths.IMAGE_STATE) + r"/sf (\S+)")


class ProgressStep(TypedDict):
    """One Dockerfile instruction as BuildKit's plain progress told it (buildreport.StepTiming reads it)."""

    index: int
    of: int
    name: str
    instruction: str
    cached: bool
    duration_s: float | None
    error: NotRequired[bool]


def parse_progress(lines: list[str]) -> list[ProgressStep]:
    """Per Dockerfile instruction: its stack step, whether BuildKit took it from cache, its time."""
    steps: dict[str, ProgressStep] = {}
    for line in lines:
        m = VERTEX_RE.match(line)
        if m:
            vid, idx, total, text = m.groups()
            step = STEP_RE.search(text)
            steps.setdefault(vid, {"index": int(idx), "of": int(total),
                                   "name": step.group(1).strip("'") if step else text.split(" ", 1)[0].lower(),
                                   "instruction": text[:160], "cached": False, "duration_s": None})
            continue
        m = STATUS_RE.match(line)
        if m and m.group(1) in steps:
            item = steps[m.group(1)]
            if m.group(2) == "CACHED":
                item["cached"] = True
            elif m.group(3):
                item["duration_s"] = float(m.group(3))
            else:
                item["error"] = True
    return sorted(steps.values(), key=lambda s: s["index"])


def stream_build(runner: Runner, argv: list[str], env: dict[str, str], log: Path, echo: Callable[[str], None], *,
                 estimates: dict[str, float] | None = None, verbose: bool = False,
                 heartbeat_s: float = HEARTBEAT_S) -> tuple[int, list[str]]:
    """Run the build, keep every line in `log`, and show progress (buildprogress.Progress): "step
    N/M name" as each runs, with its last run's time, a heartbeat for a long one, its time or
    "cached" at the end; every raw line too when `verbose`. The steps' times go to step-times.json
    beside the log, for the next build's estimates (also when the build fails: what ran, ran)."""
    lines: list[str] = []
    progress = Progress(echo, log, dict(estimates or {}), verbose, heartbeat_s)
    with open_log(log, "w") as fh:  # a regular file or a new name only (never through a planted link)

        def on_line(line: str) -> None:
            fh.write(line + "\n")
            lines.append(line)
            progress.raw(line)
            if m := VERTEX_RE.match(line):
                step = STEP_RE.search(m.group(4))
                progress.vertex(m.group(1), m.group(2), m.group(3), step.group(1).strip("'") if step else m.group(4))
            elif m := STATUS_RE.match(line):
                progress.ended(m.group(1), m.group(2).split(" ", 1)[0], float(m.group(3)) if m.group(3) else None)
            elif m := OUTPUT_RE.match(line):
                progress.output(m.group(1), line[m.end():])
            if "slimeforge: ERROR:" in line and not verbose:
                echo("  " + printable(line))

        with Heartbeat(progress):
            rc = runner.stream(argv, on_line, step="docker build", env=env)
    if progress.measured:
        write_times(log.parent, progress.measured, estimates or {})
    return rc, lines


def failure_text(lines: list[str]) -> str:
    errors = [line.split("slimeforge: ERROR:", 1)[1].strip() for line in lines if "slimeforge: ERROR:" in line]
    if errors:
        return "\n".join(dict.fromkeys(errors))
    return "\n".join(lines[-15:])
