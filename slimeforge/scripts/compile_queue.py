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
    python compile_queue.py listen DIR SLOTS [COSTS.json]
        the same queue without wrappers (DIR/sock; prints "ready"): for compiles in containers that
        reach the socket through BuildKit's forwarding (`docker build --ssh sf-queue=DIR/sock`,
        `RUN --mount=type=ssh,id=sf-queue`) and make their wrappers there. The host needs no compiler.
    python compile_queue.py wrappers DIR SOCKET
        the two wrappers alone, for this machine's compilers, in DIR/bin (DIR new), speaking through
        BuildKit's forwarding (run-forwarded): prints their environment as serve does.

BuildKit forwards an SSH agent, not bytes: the docker client reads each message from the container
as an SSH agent request and passes only what an agent is asked (a list of keys, a signature) to the
socket. So a forwarded wrapper asks its turn as an agent sign request whose data is its request line
(`KIND KEY`), and the queue answers with a sign response when its turn comes. The forwarded
connection is not closed when the container's end closes (measured, Docker 20.10's BuildKit), so
there the wrapper runs the compiler as its child and, when it ends, sends a second request, `done`,
that frees the slot. A refusal (an agent failure) compiles at once.
    python compile_queue.py run SOCKET KIND REAL ARGS...
        what the wrappers run: a compile (`-c` with `-o OBJ`) waits for its turn, then the compiler
        replaces this process and inherits the connection, so the slot is held exactly as long as
        the compiler (and every process it starts) lives. Anything else (`-v`, a link) runs at once.

The queue ends on SIGTERM or SIGINT, or when the process that started it ends.
A wrapper that cannot reach the queue runs its compiler at once, with one line on stderr: a missing
queue costs the order, never a build. A wrapper whose queue ends while it waits (its owner stopped
the compile: install.sh on a failure or Ctrl-C, a benchmark past its limit) exits 75 without
compiling, so no compile outlives the build that asked for it. Standard library only (the venv's
Python runs it, on a host that has nothing else of slimeforge's).
"""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import re
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
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
# The SSH agent protocol (draft-miller-ssh-agent) as far as the forwarded wrappers use it: a message is
# uint32 length, then its type and fields; a string is uint32 length, then its bytes.
FRAME_MAX = 1024
AGENT_FAILURE, SIGN_REQUEST, SIGN_RESPONSE = 5, 13, 14


def strings(*fields: bytes) -> bytes:
    """Each field as the agent protocol's string: uint32 length, then its bytes."""
    return b"".join(len(f).to_bytes(4, "big") + f for f in fields)


# A well-formed ed25519 public key that signs nothing: the client parses the key of a sign request.
NO_KEY = strings(b"ssh-ed25519", bytes(32))
DONE = "done"  # a forwarded compile's second request: its compiler ended (the connection outlives it there)
TURN = strings(b"sf-queue", b"go")  # the "signature": your turn
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


def frame(kind: int, *fields: bytes, tail: bytes = b"") -> bytes:
    """An agent message: its type, each field a string, then TAIL as it is (a sign request's flags)."""
    body = bytes([kind]) + strings(*fields) + tail
    return len(body).to_bytes(4, "big") + body


def sign_request_line(body: bytes) -> str | None:
    """The request line inside an agent sign request's body (type, key blob, data, flags), or None."""
    if not body or body[0] != SIGN_REQUEST:
        return None
    fields, at = [], 1
    for _ in range(2):
        if at + 4 > len(body):
            return None
        n = int.from_bytes(body[at:at + 4], "big")
        fields.append(body[at + 4:at + 4 + n])
        at += 4 + n
    if at > len(body):  # a field runs past the message
        return None
    return fields[1].decode("ascii", "replace")


def wrapper(python: str, script: str, sock: str, kind: str, real: str, verb: str = "run") -> str:
    return (f"#!/bin/sh\n# slimeforge compile_queue.py: {kind} behind the compiled set's queue\n"
            f"exec {shlex.quote(python)} {shlex.quote(script)} {verb} {shlex.quote(sock)} {kind} "
            f"{shlex.quote(real)} \"$@\"\n")


def real_compilers(need_nvcc: bool = True) -> dict[str, str]:
    """The compilers the wrappers stand for: what torch's extension builder would run without them.
    need_nvcc=False (an image's compile stage, which may build a piece with no CUDA): nvcc only where
    there is one."""
    cxx = shutil.which(os.environ.get("CXX") or "c++")
    # torch's order: PYTORCH_NVCC, CUDA_HOME (or CUDA_PATH), nvcc on PATH, /usr/local/cuda.
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = os.environ.get("PYTORCH_NVCC") or (str(Path(home) / "bin" / "nvcc") if home else None) or \
        shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    missing = [n for n, p in (("c++ (CXX)", cxx), ("nvcc (PYTORCH_NVCC, CUDA_HOME)", nvcc))
               if not p or not os.access(p, os.X_OK)]
    if cxx is None or (missing and (need_nvcc or missing[0].startswith("c++"))):
        raise SystemExit(f"compile_queue: no {', '.join(missing)} to stand for")
    return {"cxx": cxx, **({} if missing else {"nvcc": nvcc})}


class Queue:
    """The slots and the waiting files; a connection is one file, its end (EOF) is the file's end."""

    def __init__(self, slots: int, costs: dict[str, float]) -> None:
        self.slots, self.costs = slots, costs
        self.sel = selectors.DefaultSelector()
        self.waiting: list[tuple[float, int, socket.socket, str]] = []
        self.running: dict[socket.socket, str] = {}
        self.pending: dict[socket.socket, bytes] = {}
        self.framed: set[socket.socket] = set()  # asked through BuildKit's agent forwarding: answered in kind
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
                conn.sendall(frame(SIGN_RESPONSE, TURN) if conn in self.framed else b"go\n")
            except OSError:
                self.close(conn)
                continue
            self.running[conn] = label
            self.log("go", label)

    def close(self, conn: socket.socket) -> None:
        self.sel.unregister(conn)
        self.framed.discard(conn)
        conn.close()

    def readable(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(FRAME_MAX)
        except OSError:
            data = b""
        if conn in self.running:
            if conn in self.framed and data:  # a forwarded compile says it ended (its "done" request)
                buf = self.pending.get(conn, b"") + data
                size = int.from_bytes(buf[:4], "big") if len(buf) >= 4 else FRAME_MAX + 1
                if len(buf) < 4 + size and size <= FRAME_MAX:
                    self.pending[conn] = buf
                    return
                self.pending.pop(conn, None)
                if sign_request_line(buf[4:4 + size]) == DONE:
                    with contextlib.suppress(OSError):
                        conn.sendall(frame(SIGN_RESPONSE, TURN))
                data = b""
            if not data:  # the compiler (and whatever it started) ended: its slot is free
                label = self.running.pop(conn)
                self.pending.pop(conn, None)
                self.close(conn)
                self.log("end", label)
                self.admit()
            return
        if conn not in self.pending:  # waiting: only its end can come (the wrapper was killed)
            if not data:
                self.close(conn)  # admit() skips it
            return
        buf = self.pending[conn] + data
        if buf[:1] == b"\0":  # an agent message (its length's high byte): a forwarded wrapper's
            size = int.from_bytes(buf[:4], "big") if len(buf) >= 4 else 0
            if len(buf) < 4 + size and data and size <= FRAME_MAX:
                self.pending[conn] = buf
                return
            del self.pending[conn]
            line = sign_request_line(buf[4:4 + size]) if len(buf) >= 4 + size else None
            if line is None:
                self.close(conn)
                return
            self.framed.add(conn)
        elif b"\n" not in buf:
            if not data or len(buf) > LINE_MAX:
                del self.pending[conn]
                self.close(conn)
            else:
                self.pending[conn] = buf
            return
        else:
            del self.pending[conn]
            line = buf.split(b"\n", 1)[0].decode("ascii", "replace")
        parts = line.split(" ")
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
        # Its owner (install.sh, invoke build) stops it by its pid; an owner killed outright cannot,
        # so the queue also ends when its parent does (within a second): it never outlives the build.
        parent = os.getppid()
        while not stop and os.getppid() == parent:
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


def new_directory(directory: str) -> Path:
    top = Path(directory)
    try:
        top.mkdir(mode=0o700)  # a new directory of its own: never over another's
    except OSError as e:
        raise SystemExit(f"compile_queue: {directory}: {e.strerror}; the queue makes a new directory of its "
                         "own") from None
    return top


def make_wrappers(top: Path, sock: str, verb: str = "run") -> list[str]:
    """DIR/bin/g++ and DIR/bin/nvcc for this machine's compilers, and the environment that hands them over."""
    compilers = real_compilers(need_nvcc=verb == "run")
    (top / "bin").mkdir(mode=0o700)
    script = str(Path(__file__).resolve())
    env = []
    # g++, not c++: torch's compiler check accepts a path naming g++ without running it.
    for var, kind, name in (("CXX", "cxx", "g++"), ("PYTORCH_NVCC", "nvcc", "nvcc")):
        if kind not in compilers:
            continue
        path = top / "bin" / name
        path.write_text(wrapper(sys.executable, script, sock, kind, compilers[kind], verb))
        path.chmod(0o700)
        env.append(f"{var}={path}")
    return env


def serve(directory: str, slots_text: str, costs_path: str | None, wrappers: bool = True) -> int:
    if not re.fullmatch(r"[1-9][0-9]{0,3}", slots_text):
        raise SystemExit(f"compile_queue: SLOTS must be a whole number from 1 to 9999, got {slots_text[:40]!r}")
    costs = load_costs(costs_path)
    if wrappers:
        real_compilers()  # refused before anything is made
    top = new_directory(directory)
    sock = str(top / "sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock)
    listener.listen(1024)
    env = make_wrappers(top, sock) if wrappers else []
    sys.stdout.write("".join(f"{e}\0" for e in env) + "ready\n")
    sys.stdout.flush()
    Queue(int(slots_text), costs).serve(listener)
    listener.close()
    Path(sock).unlink(missing_ok=True)
    return 0


def wrappers_only(directory: str, sock: str) -> int:
    real_compilers(need_nvcc=False)
    env = make_wrappers(new_directory(directory), sock, "run-forwarded")
    sys.stdout.write("".join(f"{e}\0" for e in env) + "ready\n")
    return 0


def compiled_object(args: list[str]) -> str | None:
    """The object a compile writes (`-c` ... `-o OBJ`), or None for anything else (a link, -v)."""
    if "-c" not in args:
        return None
    for i, a in enumerate(args[:-1]):
        if a == "-o":
            return args[i + 1]
    return None


def forwarded_turn(conn: socket.socket) -> bool | None:
    """The answer to a sign request through BuildKit's agent forwarding: True on our turn, False when
    the queue is gone, None when the agent refused (no queue to wait in)."""
    head = b""
    while len(head) < 5 and (chunk := conn.recv(5 - len(head))):
        head += chunk
    if len(head) < 5:
        return False
    return {SIGN_RESPONSE: True, AGENT_FAILURE: None}.get(head[4], None)


def run(sock: str, kind: str, real: str, args: list[str], forwarded: bool = False) -> int:
    obj = compiled_object(args)
    if obj is not None and kind in KINDS and not os.environ.get("SF_COMPILE_QUEUE_HELD"):
        key = Path(obj).name
        key = key if KEY_RE.fullmatch(key) else "unnamed"
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(sock)
            line = f"{kind} {key}"
            conn.sendall(frame(SIGN_REQUEST, NO_KEY, line.encode(), tail=bytes(4)) if forwarded  # flags 0
                         else f"{line}\n".encode())
        except OSError as e:  # no queue to wait in: compile at once
            conn.close()
            print(f"compile_queue: {sock}: {e.strerror or e}; compiling {key} without the queue", file=sys.stderr)
            os.execv(real, [real, *args])
        turn: bool | None = False
        try:
            if forwarded:
                turn = forwarded_turn(conn)
            else:
                reply = b""
                while len(reply) < 3 and (chunk := conn.recv(3 - len(reply))):
                    reply += chunk
                turn = reply == b"go\n"
        except OSError:
            pass
        if turn is None:  # the forwarding refused the request: no queue to wait in
            conn.close()
            print(f"compile_queue: {sock}: the forwarded queue refused {key}; compiling it without the queue",
                  file=sys.stderr)
            os.execv(real, [real, *args])
        if not turn:
            # The queue ended while this file waited: whoever ran it stopped the compile (or it died).
            print(f"compile_queue: {sock}: the queue ended before {key}'s turn; not compiled", file=sys.stderr)
            return 75
        os.environ["SF_COMPILE_QUEUE_HELD"] = "1"
        if forwarded:
            return run_then_release(conn, real, args)
        os.set_inheritable(conn.fileno(), True)  # held by the compiler until it ends
    os.execv(real, [real, *args])
    return 127  # not reached


def run_then_release(conn: socket.socket, real: str, args: list[str]) -> int:
    """The compiler as a child (a stop signal passed on to it), then `done` on the connection."""
    child = subprocess.Popen([real, *args])
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    rc = child.wait()
    with contextlib.suppress(OSError):
        conn.sendall(frame(SIGN_REQUEST, NO_KEY, DONE.encode(), tail=bytes(4)))
        forwarded_turn(conn)
    conn.close()
    return rc if rc >= 0 else 128 - rc


def main(argv: list[str]) -> int:
    if 3 <= len(argv) <= 4 and argv[0] in ("serve", "listen"):
        return serve(argv[1], argv[2], argv[3] if len(argv) > 3 else None, wrappers=argv[0] == "serve")
    if len(argv) == 3 and argv[0] == "wrappers":
        return wrappers_only(argv[1], argv[2])
    if len(argv) >= 4 and argv[0] in ("run", "run-forwarded"):
        return run(argv[1], argv[2], argv[3], argv[4:], forwarded=argv[0] == "run-forwarded")
    print(__doc__.split("\n\n", 2)[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
