"""Where the seconds of a store-hit install (or image build) go: each step split into download,
install and verify, from the phase marks the step library writes (`sf_phase`: `slimeforge: phase
STEP PHASE EPOCH`) and uv's own summary lines (`Prepared N packages in T`: fetched, or taken from
uv's cache, and unpacked; `Installed N packages in T`: linked into the venv).

    python benchmarks/store_hit_bench.py split --prefix P [--log FILE]   # an install's step logs (+ its output)
    python benchmarks/store_hit_bench.py split --build-log FILE          # an image build's build.log
    python benchmarks/store_hit_bench.py install --prefix P -- ARGS...   # time `invoke install --prefix P ARGS`, then
      split it

Columns, per step: total (the step's `done in`, whole seconds, where known), download (uv's
Prepared), install (the rest of the install phase: resolve, uninstall, link), verify (the venv
compared with the lock; a store entry's sha256 check), other phases by name (a source's fetch and
patch; finalize's prune, record, flags; the smoke test's imports, versions, patches, flags,
kernels). Times are wall-clock seconds. `install` also samples the host's 1-minute load average every
5 s (start, end, max, mean): what ran beside the install.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MARK = re.compile(r"slimeforge: phase (\S+) (\S+) ([0-9]+\.[0-9]+)\s*$")
UV = re.compile(r"^(Prepared|Installed|Uninstalled) \d+ packages?(?: [a-z ]+?)? in (.+?)\s*$")
# "step N/M NAME" (install.sh), or "step NAME"
DONE = re.compile(r"slimeforge: step (?:[0-9]+/[0-9]+ )?(\S+): done in (\d+)s")
# a RUN's output line in BuildKit's plain progress (#N), or a step log's (#STEP)
BUILDKIT = re.compile(r"^#([A-Za-z0-9._-]+) [0-9.]+ ")


def uv_seconds(text: str) -> float:
    """uv's elapsed time: `93ms`, `20.49s`, `1m 20s`."""
    total = 0.0
    for num, unit in re.findall(r"([0-9.]+)(ms|s|m)\b", text):
        total += float(num) * {"ms": 0.001, "s": 1.0, "m": 60.0}[unit]
    return total


def split_lines(lines: list[str]) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    """Phases per step (seconds), and each step's `done in` (whole seconds)."""
    phases: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    done: dict[str, int] = {}
    open_phase: dict[tuple[str, str], tuple[str, float]] = {}  # (stream, step) -> (phase, since)
    current: dict[str, str] = {}  # stream -> the step its last mark named
    for raw in lines:
        stream, line = "", raw.rstrip("\n")
        if m := BUILDKIT.match(line):
            stream, line = m.group(1), line[m.end():]
        if m := DONE.search(line):
            done[m.group(1)] = int(m.group(2))
        if m := MARK.search(line):
            step, phase, at = m.group(1), m.group(2), float(m.group(3))
            if (prev := open_phase.pop((stream, step), None)) is not None:
                phases[step][prev[0]] += at - prev[1]
            if phase != "end":
                open_phase[(stream, step)] = (phase, at)
            current[stream] = step
        elif m := UV.match(line):
            # A step log is its step's stream (a script without phase marks still splits uv's lines).
            step = current.get(stream) or (stream if stream and not stream.isdigit() else "")
            if step:
                phases[step]["download" if m.group(1) == "Prepared" else "uv-link"] += uv_seconds(m.group(2))
    out: dict[str, dict[str, float]] = {}
    for step, ph in phases.items():
        row = dict(ph)
        # The install phase holds uv's whole run: its Prepared part is the download, the rest is install.
        if "install" in row:
            row["install"] = max(row["install"] - row.get("download", 0.0), 0.0)
            row.pop("uv-link", None)
        elif "uv-link" in row:
            row["install"] = row.pop("uv-link")
        row["verify"] = row.pop("verify", 0.0) + row.pop("store-check", 0.0)
        out[step] = {k: round(v, 2) for k, v in row.items() if v or k in ("download", "install", "verify")}
    return out, done


def install_lines(prefix: Path, log: Path | None) -> list[str]:
    """The step logs (each a stream of its own), then the install's own output (the smoke test)."""
    lines: list[str] = []
    logs = prefix / ".slimeforge" / "logs"
    for f in sorted(logs.glob("*.log")):
        if not f.name.startswith("compile-"):
            lines += [f"#{f.stem} 0.0 "
                      f"{x}" if MARK.search(x) or UV.match(x) else x for x
                      in f.read_text(errors="replace").splitlines()]
    if log is not None:
        lines += log.read_text(errors="replace").splitlines()
    return lines


class LoadSampler:
    """The host's 1-minute load average while a run goes on (every 5 s): what ran beside it."""

    def __init__(self, every: float = 5.0) -> None:
        self.every, self.samples = every, [self.now()]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def now() -> float:
        return float(Path("/proc/loadavg").read_text().split()[0])

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(self.now())

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self.now())

    def summary(self) -> dict[str, float]:
        return {"start": self.samples[0], "end": self.samples[-1], "max": max(self.samples),
                "mean": round(sum(self.samples) / len(self.samples), 2)}


def table(split: dict[str, dict[str, float]], done: dict[str, int]) -> str:
    cols = ["download", "install", "verify"]
    extra = sorted({k for row in split.values() for k in row} - set(cols))
    head = f"{'step':<22}{'total':>7}" + "".join(f"{c:>10}" for c in cols + extra)
    rows = [head]
    for step in [*done, *[s for s in split if s not in done]]:
        row = split.get(step, {})
        rows.append(f"{step:<22}{done.get(step, ''):>7}" + "".join(f"{row.get(c, ''):>10}" for c in cols + extra))
    sums = {c: round(sum(r.get(c, 0.0) for r in split.values()), 1) for c in cols + extra}
    rows.append(f"{'(sum)':<22}{sum(done.values()):>7}" + "".join(f"{sums[c]:>10}" for c in cols + extra))
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["split", "install"])
    ap.add_argument("--prefix", type=Path)
    ap.add_argument("--log", type=Path, help="the install's output (its smoke test's phases are there)")
    ap.add_argument("--build-log", type=Path, help="an image build's build.log")
    ap.add_argument("--json", type=Path, help="also write the split here")
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1:] if "--" in argv else []  # after --: the rest of `invoke install`'s arguments
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    result: dict[str, object] = {}
    if a.mode == "install":
        if a.prefix is None:
            raise SystemExit("--prefix is required")
        log = a.log or Path(f"{a.prefix}.install.log")
        t0 = time.monotonic()
        with log.open("w") as fh, LoadSampler() as load:
            rc = subprocess.run([str(ROOT / ".venv" / "bin" / "invoke"), "install", "--prefix", str(a.prefix), *rest],
                                cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT).returncode
        result.update(rc=rc, seconds=round(time.monotonic() - t0, 1), log=str(log), load=load.summary())
        a.log = log
    if a.build_log is not None:
        lines = a.build_log.read_text(errors="replace").splitlines()
    elif a.prefix is not None:
        lines = install_lines(a.prefix, a.log)
    else:
        raise SystemExit("--prefix or --build-log is required")
    split, done = split_lines(lines)
    result.update(steps=split, done_in=done)
    print(table(split, done))
    if "seconds" in result:
        print(f"install: exit {result['rc']} in {result['seconds']} s (log {result['log']}); 1-minute load average "
              f"beside: {result['load']}")
    if a.json:
        a.json.write_text(json.dumps(result, indent=2) + "\n")
    if result.get("rc", 0):
        sys.exit(1)


if __name__ == "__main__":
    main()
