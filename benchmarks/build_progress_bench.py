"""What a person watching `invoke build` sees, and when (the small test stack, real Docker Engine,
BuildKit, PyPI): the command line run as a user runs it, each line of its output (stdout and
stderr together) timestamped.

Figures:
- first_line_s: from the start of `invoke build` to its first line;
- first_step_line_s: to the first line naming a Dockerfile step ("step N/M" or BuildKit's "[N/M]");
- longest_step: the step that ran longest (build.log), when BuildKit started it, and when the
  screen first named it (before progress lines, a step was named only once it had ended);
- lines: how many lines the build printed; total_s; timeline: the first lines, each with its time; last_lines: the end
(the summary table). The build runs twice (--no-cache --force, same build directory): the figures are the second run's,
when the last run's time of each step is known (the estimates appear where the code has them).

Run from the repository root:  python benchmarks/build_progress_bench.py [--checkout DIR]
--checkout: run the tasks.py and slimeforge of another checkout (e.g. `git archive` of an older
commit extracted to DIR) with this venv, to compare before and after on the same machine.
Prints a JSON object. The images it builds are removed at the end (by id).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import build_support as bs  # noqa: E402

REPO = f"slimeforge-progress-bench/sftest-{os.getpid()}"
STEP_LINE = re.compile(r"step \d+/\d+ |\[\d+/\d+\] ")
VERTEX = re.compile(r"^#(\d+) \[(?:[^\]]*? )?(\d+)/(\d+)\] (.+)$")
DONE = re.compile(r"^#(\d+) DONE (\d+(?:\.\d+)?)s$")


def timed_lines(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, list[tuple[float, str]]]:
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    assert proc.stdout is not None
    lines = [(time.monotonic() - t0, line.rstrip("\n")) for line in proc.stdout]
    return proc.wait(), lines


def longest_step(build_log: Path) -> tuple[str, float]:
    """The step that ran longest in BuildKit's log: its name (the sf step or the instruction), seconds."""
    names, best = {}, ("", 0.0)
    for line in build_log.read_text().splitlines():
        if m := VERTEX.match(line):
            step = re.search(r"/sf (\S+)", m.group(4))
            names[m.group(1)] = step.group(1) if step else m.group(4)[:40]
        elif (m := DONE.match(line)) and m.group(1) in names and float(m.group(2)) > best[1]:
            best = (names[m.group(1)], float(m.group(2)))
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkout", type=Path, default=ROOT, help="the checkout whose tasks.py and slimeforge run")
    args = ap.parse_args()
    checkout = args.checkout.resolve()
    root = Path(tempfile.mkdtemp(prefix="slimeforge-progress-bench-"))
    repos = bs.make_repos(root / "repos")
    out = root / "out"
    env = {**os.environ, "PYTHONPATH": str(checkout), "SLIMEFORGE_COMPILED_STORE": str(root / "store")}
    argv = [sys.executable, "-m", "invoke", "build", "--stack", str(bs.TEST_STACK), "--out", str(out), "--repository",
            REPO,
            "--source", f"slime={repos['slime']}", "--source", f"libdemo={repos['libdemo']}", "--no-cache", "--force"]
    made: list[str] = []
    try:
        for _ in range(2):
            rc, lines = timed_lines(argv, checkout, env)
            if (out / "image.id").is_file():
                made.append((out / "image.id").read_text().strip())
            if rc != 0:
                break
        if rc != 0:
            raise SystemExit("invoke build failed:\n" + "\n".join(text for _, text in lines[-30:]))
        name, seconds = longest_step(out / "build.log")
        named = [t for t, text in lines if STEP_LINE.search(text) and re.search(rf"\b{re.escape(name)}\b", text)]
        print(json.dumps({
            "checkout": str(checkout),
            "first_line_s": round(lines[0][0], 2),
            "first_line": lines[0][1][:120],
            "first_step_line_s": round(next(t for t, text in lines if STEP_LINE.search(text)), 2),
            "longest_step": {"name": name, "seconds": seconds, "first_named_at_s": round(named[0],
                                                                                         2) if named else None,
                             "ended_at_s": round(named[-1], 2) if named else None},
            "estimates_shown": sum("(last run " in text for _, text in lines),
            "lines": len(lines),
            "timeline": [f"{t:6.2f} {text[:110]}" for t, text in lines[:14]],
            "last_lines": [text[:140] for _, text in lines[-16:]],
            "total_s": round(lines[-1][0], 2),
        }, indent=2))
    finally:
        for image_id in dict.fromkeys(made):
            subprocess.run(["docker", "image", "rm", "-f", image_id], capture_output=True)


if __name__ == "__main__":
    main()
