"""A queue in front of every compiler of the compiled set: at most SLOTS files at once, the costliest waiting first.

Why: side by side, the compiled pieces (apex's 12 extensions, Transformer Engine's torch extension)
each run their own ninja, and a ninja starts its files in build-file order: a pool of job slots serves
whoever asks first, so the longest files (apex's softmax kernels, 73-87 CPU-s) may start last and end
the set alone (docs/build.md, "Where apex's time goes"). Here every ninja runs all its files at once
(a high -j), each compile waits in this queue, and a freed slot goes to the costliest file waiting,
by a table of measured CPU-seconds per object file (benchmarks/compile_model.py --write-costs), else
by kind (an nvcc file before a host compiler's).

    python compile_queue.py serve DIR SLOTS [COSTS.json]
        makes DIR (a new directory, mode 700) with the socket and the two wrappers, prints the
        environment that hands them to torch's extension builder (`CXX=DIR/bin/g++`,
        `PYTORCH_NVCC=DIR/bin/nvcc`, NUL-separated, then "ready"), and serves until SIGTERM or
        SIGINT; each start and end goes to stderr as `t=SECONDS go|end KIND KEY cost=C running=N`.
    python compile_queue.py run SOCKET KIND REAL ARGS...
        what the wrappers run: a compile (`-c` with `-o OBJ`) waits for its turn, then the compiler
        replaces this process and inherits the connection, so the slot is held exactly as long as
        the compiler (and every process it starts) lives. Anything else (`-v`, a link) runs at once.

A wrapper that cannot reach the queue runs its compiler at once, with one line on stderr: a missing
queue costs the order, never a build. A wrapper whose queue ends while it waits (its owner stopped
the compile: install.sh on a failure or Ctrl-C, a benchmark past its limit) exits 75 without
compiling, so no compile outlives the build that asked for it. Standard library only (the venv's
Python runs it, on a host that has nothing else of slimeforge's).
"""

from __future__ import annotations

import heapq
import json
import os
import re
import selectors
import shlex
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

KINDS = ("nvcc", "cxx")
# Unknown files: the median of the measured table's kind (16-core H200 host: apex's and TE's .cu
# objects 25-87 CPU-s, host-compiled .cpp 21-45).
DEFAULT_COST = {"nvcc": 45.0, "cxx": 28.0}
# Files come in bursts (every ninja starts all its files within half a second of its setup's end):
# while a slot is free, an arriving file waits until nothing has arrived for GATHER_S (at most
# GATHER_MAX_S after the first of them), so that the first slots go to the costliest of the burst,
# not to whichever ninja started first (measured on the 16-core host: without it, apex's 87-CPU-s
# file took a slot after 25 cheaper ones and ended its piece; with a 1 s quiet and no bound, the
# pieces' bursts 1.4 s apart kept every slot empty until both had come).
GATHER_S = 0.5
GATHER_MAX_S = 1.0
KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")
LINE_MAX = 256
COSTS_BYTES_MAX = 1 << 20


def load_costs(path: str | None) -> dict[str, float]:
    """The cost table: {"schema": 1, "costs": {OBJECT_NAME: CPU-seconds}}; checked by grammar."""
    if not path:
        return {}
    p = Path(path)
    if p.stat().st_size > COSTS_BYTES_MAX:
        raise SystemExit(f"compile_queue: {path}: over {COSTS_BYTES_MAX} bytes")
    data = json.loads(p.read_text())
    costs = data.get("costs") if isinstance(data, dict) and data.get("schema") == 1 else None
    if not isinstance(costs, dict):
        raise SystemExit(f'compile_queue: {path}: expected {{"schema": 1, "costs": {{OBJECT: SECONDS}}}}')
    out = {}
    for key, value in costs.items():
        if not KEY_RE.fullmatch(key) or isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not 0 <= value < 1e6:
            raise SystemExit(f"compile_queue: {path}: cost {key!r}: {value!r} is not an object file name "
                             "with CPU-seconds from 0 to 1e6")
        out[key] = float(value)
    return out


def wrapper(python: str, script: str, sock: str, kind: str, real: str) -> str:
    return (f"#!/bin/sh\n# slimeforge compile_queue.py: {kind} behind the compiled set's queue\n"
            f"exec {shlex.quote(python)} {shlex.quote(script)} run {shlex.quote(sock)} {kind} "
            f"{shlex.quote(real)} \"$@\"\n")


def real_compilers() -> dict[str, str]:
    """The compilers the wrappers stand for: what torch's extension builder would run without them."""
    cxx = shutil.which(os.environ.get("CXX") or "c++")
    # torch's order: PYTORCH_NVCC, CUDA_HOME (or CUDA_PATH), nvcc on PATH, /usr/local/cuda.
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = os.environ.get("PYTORCH_NVCC") or (str(Path(home) / "bin" / "nvcc") if home else None) or \
        shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    missing = [n for n, p in (("c++ (CXX)", cxx), ("nvcc (PYTORCH_NVCC, CUDA_HOME)", nvcc))
               if not p or not os.access(p, os.X_OK)]
    if missing or cxx is None:
        raise SystemExit(f"compile_queue: no {', '.join(missing)} to stand for")
    return {"cxx": cxx, "nvcc": nvcc}


class Queue:
    """The slots and the waiting files; a connection is one file, its end (EOF) is the file's end."""

    def __init__(self, slots: int, costs: dict[str, float]) -> None:
        self.slots, self.costs = slots, costs
        self.sel = selectors.DefaultSelector()
        self.waiting: list[tuple[float, int, socket.socket, str]] = []
        self.running: dict[socket.socket, str] = {}
        self.pending: dict[socket.socket, bytes] = {}
        self.seq = 0
        self.t0 = time.monotonic()
        self.last_arrival = 0.0
        self.first_arrival: float | None = None  # the first file waiting since the queue last admitted

    def log(self, what: str, label: str) -> None:
        print(f"t={time.monotonic() - self.t0:.1f} {what} {label} running={len(self.running)}",
              file=sys.stderr, flush=True)

    def cost(self, kind: str, key: str) -> float:
        return self.costs.get(key, DEFAULT_COST[kind])

    def admit(self) -> None:
        now = time.monotonic()
        if now - self.last_arrival < GATHER_S and now - (self.first_arrival or now) < GATHER_MAX_S:
            return  # a burst still arriving: serve() calls again once it is quiet
        if len(self.running) < self.slots:
            self.first_arrival = None
        while len(self.running) < self.slots and self.waiting:
            _, _, conn, label = heapq.heappop(self.waiting)
            if conn.fileno() < 0:  # closed while it waited: its wrapper was killed
                continue
            try:
                conn.sendall(b"go\n")
            except OSError:
                self.close(conn)
                continue
            self.running[conn] = label
            self.log("go", label)

    def close(self, conn: socket.socket) -> None:
        self.sel.unregister(conn)
        conn.close()

    def readable(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(LINE_MAX)
        except OSError:
            data = b""
        if conn in self.running:
            if not data:  # the compiler (and whatever it started) ended: its slot is free
                label = self.running.pop(conn)
                self.close(conn)
                self.log("end", label)
                self.admit()
            return
        if conn not in self.pending:  # waiting: only its end can come (the wrapper was killed)
            if not data:
                self.close(conn)  # admit() skips it
            return
        buf = self.pending[conn] + data
        if b"\n" not in buf:
            if not data or len(buf) > LINE_MAX:
                del self.pending[conn]
                self.close(conn)
            else:
                self.pending[conn] = buf
            return
        del self.pending[conn]
        parts = buf.split(b"\n", 1)[0].decode("ascii", "replace").split(" ")
        kind, key = (parts + ["", ""])[:2]
        if kind not in KINDS or len(parts) != 2 or not KEY_RE.fullmatch(key):
            self.close(conn)
            return
        c = self.cost(kind, key)
        self.seq += 1
        heapq.heappush(self.waiting, (-c, self.seq, conn, f"{kind} {key} cost={c:g}"))
        self.last_arrival = time.monotonic()
        self.first_arrival = self.first_arrival or self.last_arrival

    def serve(self, listener: socket.socket) -> None:
        listener.setblocking(False)
        self.sel.register(listener, selectors.EVENT_READ)
        stop = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.append(1))
        while not stop:
            try:
                events = self.sel.select(timeout=0.1 if self.waiting else 1.0)
            except InterruptedError:
                continue
            for ev, _ in events:
                if ev.fileobj is listener:
                    try:
                        conn, _ = listener.accept()
                    except OSError:
                        continue
                    conn.setblocking(False)
                    self.pending[conn] = b""
                    self.sel.register(conn, selectors.EVENT_READ)
                else:
                    self.readable(ev.fileobj)  # type: ignore[arg-type]
            self.admit()
        # Stopped: what already ended is still logged (an end that came before the stop).
        for ev, _ in self.sel.select(timeout=0):
            if ev.fileobj is not listener:
                self.readable(ev.fileobj)  # type: ignore[arg-type]


def serve(directory: str, slots_text: str, costs_path: str | None) -> int:
    if not re.fullmatch(r"[1-9][0-9]{0,3}", slots_text):
        raise SystemExit(f"compile_queue: SLOTS must be a whole number from 1 to 9999, got {slots_text[:40]!r}")
    costs = load_costs(costs_path)
    compilers = real_compilers()
    top = Path(directory)
    try:
        top.mkdir(mode=0o700)  # a new directory of its own: never over another's
    except OSError as e:
        raise SystemExit(f"compile_queue: {directory}: {e.strerror}; the queue makes a new directory of its "
                         "own") from None
    (top / "bin").mkdir(mode=0o700)
    sock = str(top / "sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock)
    listener.listen(1024)
    script = str(Path(__file__).resolve())
    env = []
    # g++, not c++: torch's compiler check accepts a path naming g++ without running it.
    for var, kind, name in (("CXX", "cxx", "g++"), ("PYTORCH_NVCC", "nvcc", "nvcc")):
        path = top / "bin" / name
        path.write_text(wrapper(sys.executable, script, sock, kind, compilers[kind]))
        path.chmod(0o700)
        env.append(f"{var}={path}")
    sys.stdout.write("\0".join(env) + "\0ready\n")
    sys.stdout.flush()
    Queue(int(slots_text), costs).serve(listener)
    listener.close()
    Path(sock).unlink(missing_ok=True)
    return 0


def compiled_object(args: list[str]) -> str | None:
    """The object a compile writes (`-c` ... `-o OBJ`), or None for anything else (a link, -v)."""
    if "-c" not in args:
        return None
    for i, a in enumerate(args[:-1]):
        if a == "-o":
            return args[i + 1]
    return None


def run(sock: str, kind: str, real: str, args: list[str]) -> int:
    obj = compiled_object(args)
    if obj is not None and kind in KINDS and not os.environ.get("SF_COMPILE_QUEUE_HELD"):
        key = Path(obj).name
        key = key if KEY_RE.fullmatch(key) else "unnamed"
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(sock)
            conn.sendall(f"{kind} {key}\n".encode())
        except OSError as e:  # no queue to wait in: compile at once
            conn.close()
            print(f"compile_queue: {sock}: {e.strerror or e}; compiling {key} without the queue", file=sys.stderr)
            os.execv(real, [real, *args])
        reply = b""
        try:
            while len(reply) < 3 and (chunk := conn.recv(3 - len(reply))):
                reply += chunk
        except OSError:
            pass
        if reply != b"go\n":
            # The queue ended while this file waited: whoever ran it stopped the compile (or it died).
            print(f"compile_queue: {sock}: the queue ended before {key}'s turn; not compiled", file=sys.stderr)
            return 75
        os.set_inheritable(conn.fileno(), True)  # held by the compiler until it ends
        os.environ["SF_COMPILE_QUEUE_HELD"] = "1"
    os.execv(real, [real, *args])
    return 127  # not reached


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "serve":
        return serve(argv[1], argv[2], argv[3] if len(argv) > 3 else None)
    if len(argv) >= 4 and argv[0] == "run":
        return run(argv[1], argv[2], argv[3], argv[4:])
    print(__doc__.split("\n\n", 2)[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
