"""The compile queue of an image's wheels-only build: one queue for the compile stages that BuildKit
runs side by side, each stage a container of its own.

`invoke build` serves slimeforge/scripts/compile_queue.py (`listen`: the queue alone, no compiler
needed on this host) in the build directory and hands its socket to the build with
`docker build --ssh sf-queue=SOCKET`; each compile stage mounts it (`RUN --mount=type=ssh,id=sf-queue`,
templates/Dockerfile.j2) and makes its own wrappers for its container's compilers (templates/steps.sh
`_sf_queue_wrappers`). BuildKit forwards an SSH agent, so those wrappers ask their turn as agent sign
requests and free their slot with a second one when their compiler ends (compile_queue.py's docstring
says why). The rule is the install's (install.sh `sf_run_together`):
the queue where this host has 16 or more compile jobs and at least two pieces compile, never with
flash-attn in the set (its nvcc jobs need 6 GiB, a slot counts 3); SF_COMPILE_POOL=queue asks for it,
0 refuses it (1, the install's pool, is not offered here: the image compiles by shares then).
A build given MAX_JOBS, NVCC_THREADS or APEX_PARALLEL_BUILD is sized by hand and gets no queue.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from ... import paths
from ...errors import ConfigError, OperationFailed, Problem
from ...proc import Runner
from .compilejobs import QUEUE_APEX_AT_ONCE, QUEUE_FILES_PER_NINJA, compile_jobs, host_memory, queue_plan

QUEUE_SCRIPT = paths.SCRIPTS / "compile_queue.py"
COSTS = paths.SCRIPTS / "compile_costs.json"
SSH_ID = "sf-queue"
STAGE_SOCKET = "/run/sf-queue.sock"  # where a compile stage finds it (SF_COMPILE_QUEUE_SOCK)
SIZED_BY_HAND = ("MAX_JOBS", "NVCC_THREADS", "APEX_PARALLEL_BUILD")
READY_S = 30.0


def queue_slots(pieces: list[str], build_args: Mapping[str, str], env: Mapping[str, str] | None = None,
                mem_bytes: int | None = None, cores: int | None = None) -> int | None:
    """The queue's slots when these compiled pieces (step names) compile behind one queue, else None."""
    env = os.environ if env is None else env
    mode = env.get("SF_COMPILE_POOL", "")
    if mode not in ("", "queue", "0", "1"):
        raise ConfigError("SF_COMPILE_POOL", [Problem("SF_COMPILE_POOL", "is not a compile scheme", mode[:40],
                                                      "queue (one queue in front of every compiler), 0 or 1 "
                                                      "(the shares, in an image); unset: the queue on hosts of 16 "
                                                      "or more compile jobs")])
    if mode in ("0", "1") or not pieces or "flash-attn" in pieces or any(k in build_args for k in SIZED_BY_HAND):
        return None
    host_jobs, _ = compile_jobs(host_memory() if mem_bytes is None else mem_bytes, cores)
    if mode == "queue" or (host_jobs >= 16 and len(pieces) > 1):
        return queue_plan(mem_bytes, cores)[0]
    return None


def stage_build_args() -> dict[str, str]:
    """What each compile stage gets behind the queue: every ninja starts all its files (the queue bounds
    them), apex all its extensions at once, one nvcc thread a file (queue_plan's)."""
    return {"MAX_JOBS": str(QUEUE_FILES_PER_NINJA), "NVCC_THREADS": str(queue_plan()[1]),
            "APEX_PARALLEL_BUILD": str(QUEUE_APEX_AT_ONCE)}


@contextlib.contextmanager
def served(runner: Runner, top: Path, slots: int, echo: Callable[[str], None]) -> Iterator[Path]:
    """The queue served from TOP (a directory of the build directory: its own, made anew) while inside;
    yields its socket. Its log is TOP's sibling queue.log. Stopped by its pid on the way out."""
    shutil.rmtree(top, ignore_errors=True)
    log = top.with_name("queue.log")
    log.unlink(missing_ok=True)
    proc = runner.start([sys.executable, str(QUEUE_SCRIPT), "listen", str(top), str(slots), str(COSTS)],
                        step="compile queue", log=log)
    if proc is None:  # a dry run
        yield top / "sock"
        return
    try:
        deadline = time.monotonic() + READY_S
        while not _ready(log):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise OperationFailed(f"compile queue: did not start within {READY_S:g} s (its log: {log})")
            time.sleep(0.05)
        echo(f"compiling behind one queue of {slots} slots, the costliest file first (log {log})")
        yield top / "sock"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # it did not stop: it is ours, by its pid
            proc.kill()
            proc.wait()
        shutil.rmtree(top, ignore_errors=True)


def _ready(log: Path) -> bool:
    try:
        return any(line == "ready" for line in log.read_text(errors="replace").splitlines())
    except FileNotFoundError:
        return False
