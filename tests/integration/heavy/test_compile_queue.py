"""slimeforge/scripts/compile_queue.py with real processes: the server on its Unix socket, the wrappers
torch's extension builder would run (CXX, PYTORCH_NVCC), a stand-in compiler that records when it ran,
and the host's real ninja and c++ for a build.ninja written as torch writes one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

QUEUE = Path(__file__).resolve().parents[3] / "slimeforge" / "scripts" / "compile_queue.py"

# A compiler stand-in: logs its start and end with the object's name, sleeps, writes the object.
FAKE_CC = r"""#!/bin/bash
out=""; prev=""
for a in "$@"; do [[ $prev == -o ]] && out=$a; prev=$a; done
name=${out##*/}
echo "start $name $(date +%s.%N)" >>"$FAKE_LOG"
sleep "${FAKE_SLEEP:-0.4}"
[[ -n $out ]] && : >"$out"
echo "end $name $(date +%s.%N)" >>"$FAKE_LOG"
"""


class Served:
    def __init__(self, tmp: Path, slots: int, costs: dict | None = None, real_cxx: str | None = None) -> None:
        self.top = tmp / "q"
        self.log = tmp / "fake.log"
        self.err = tmp / "queue.err"
        cost_path = None
        if costs is not None:
            cost_path = tmp / "costs.json"
            cost_path.write_text(json.dumps({"schema": 1, "costs": costs}))
        fake = tmp / "fakecc"
        fake.write_text(FAKE_CC)
        fake.chmod(0o755)
        nvcc = tmp / "nvcc"
        shutil.copy(fake, nvcc)
        self.env = {"PATH": os.environ["PATH"], "FAKE_LOG": str(self.log), "CXX": real_cxx or str(fake),
                    "PYTORCH_NVCC": str(nvcc)}
        with open(self.err, "w") as err:
            self.proc = subprocess.Popen([sys.executable, str(QUEUE), "serve", str(self.top), str(slots),
                                          *([str(cost_path)] if cost_path else [])],
                                         stdout=subprocess.PIPE, stderr=err, env=self.env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.endswith(b"\0ready\n"), (line, self.err.read_text())
        self.handed = dict(kv.split("=", 1) for kv in line.decode().split("\0")[:-1])

    def compile(self, kind: str, obj: str, **env: str) -> subprocess.Popen:
        tool = self.handed["CXX"] if kind == "cxx" else self.handed["PYTORCH_NVCC"]
        return subprocess.Popen([tool, "-O2", "-c", f"{obj}.src", "-o", str(self.top.parent / obj)],
                                env={**self.env, **env}, stderr=subprocess.PIPE, text=True)

    def hold(self, obj: str, seconds: str) -> subprocess.Popen:
        """A compile that takes the one free slot and keeps it SECONDS: returned once it compiles
        (the queue gathers a burst for up to 1 s first)."""
        proc = self.compile("cxx", obj, FAKE_SLEEP=seconds)
        deadline = time.monotonic() + 10
        while ("start", obj) not in [(w, n) for w, n, _ in self.events()] and time.monotonic() < deadline:
            time.sleep(0.05)
        return proc

    def events(self) -> list[tuple[str, str, float]]:
        rows = [line.split() for line in self.log.read_text().splitlines()] if self.log.exists() else []
        return sorted(((r[0], r[1], float(r[2])) for r in rows), key=lambda r: r[2])

    def queue_log(self, needle: str, count: int) -> str:
        """The queue's log once it holds `count` of `needle`: a compiler's end reaches the queue as its
        connection closes, a moment after the compiler's parent saw it end."""
        deadline = time.monotonic() + 10
        while self.err.read_text().count(needle) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.err.read_text()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture
def served(tmp_path):
    made: list[Served] = []

    def make(*args, **kw) -> Served:
        made.append(Served(tmp_path, *args, **kw))
        return made[-1]

    yield make
    for s in made:
        s.stop()


def most_at_once(events: list[tuple[str, str, float]]) -> int:
    n = peak = 0
    for what, _, _ in events:
        n += 1 if what == "start" else -1
        peak = max(peak, n)
    return peak


def test_a_freed_slot_goes_to_the_costliest_waiting_file(served):
    q = served(1, {"big_cuda.o": 90, "mid.o": 50, "small.o": 10})
    first = q.hold("first.o", "1.5")  # the others queue behind it, in the opposite order
    rest = [q.compile(k, o) for k, o in (("cxx", "small.o"), ("cxx", "mid.o"), ("nvcc", "big_cuda.o"),
                                          ("nvcc", "unknown_cuda.o"), ("cxx", "unknown.o"))]
    for p in [first, *rest]:
        assert p.wait(timeout=30) == 0, p.stderr.read() if p.stderr else ""
    started = [name for what, name, _ in q.events() if what == "start"]
    # Files the table does not name by their kind: an nvcc file 45 CPU-s, a host compiler's 28.
    assert started == ["first.o", "big_cuda.o", "mid.o", "unknown_cuda.o", "unknown.o", "small.o"]
    assert most_at_once(q.events()) == 1
    assert all((q.top.parent / o).exists() for o in started)
    log = q.queue_log(" end ", 6)
    assert "go nvcc big_cuda.o cost=90" in log and log.count(" go ") == 6 and log.count(" end ") == 6


def test_a_burst_is_gathered_before_the_first_slots_go(served):
    # Every ninja starts all its files at once: the first slots go to the costliest of the burst.
    q = served(2, {"c1.o": 1, "c2.o": 2, "c3.o": 3, "c4.o": 4, "c5.o": 5})
    procs = []
    for i in range(1, 6):
        procs.append(q.compile("cxx", f"c{i}.o", FAKE_SLEEP="0.5"))
        time.sleep(0.15)
    assert all(p.wait(timeout=30) == 0 for p in procs)
    assert [n for w, n, _ in q.events() if w == "start"][:2] in (["c5.o", "c4.o"], ["c4.o", "c5.o"])


def test_never_more_compilers_than_slots(served):
    q = served(3)
    procs = [q.compile("nvcc" if i % 2 else "cxx", f"f{i}.o", FAKE_SLEEP="0.3") for i in range(10)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    assert most_at_once(q.events()) == 3
    assert len([e for e in q.events() if e[0] == "end"]) == 10


def test_what_is_not_a_compile_runs_at_once_and_held_compiles_do_not_queue_again(served):
    q = served(1)
    blocker = q.hold("blocker.o", "3")
    t0 = time.monotonic()
    # -v (torch's compiler check), a link (no -c) and nvcc's own host compiles (inside a held slot)
    for args, env in ((["-v"], {}), (["a.o", "-o", str(q.top.parent / "lib.so")], {}),
                      (["-c", "x.cpp", "-o", str(q.top.parent / "inner.o")], {"SF_COMPILE_QUEUE_HELD": "1"})):
        res = subprocess.run([q.handed["CXX"], *args], env={**q.env, **env}, capture_output=True, timeout=10)
        assert res.returncode == 0, res.stderr
    assert time.monotonic() - t0 < 2.5, "a call that is not a queued compile waited for the slot"
    assert blocker.wait(timeout=30) == 0


def test_a_wrapper_killed_while_waiting_leaks_no_slot(served):
    q = served(1)
    blocker = q.hold("blocker.o", "1.5")
    doomed = q.compile("nvcc", "doomed.o")
    time.sleep(0.4)
    doomed.kill()
    doomed.wait()
    after = q.compile("cxx", "after.o")
    assert blocker.wait(timeout=30) == 0 and after.wait(timeout=30) == 0
    assert [n for w, n, _ in q.events() if w == "start"] == ["blocker.o", "after.o"]


def test_a_lost_queue_costs_order_never_the_build(served):
    q = served(1)
    q.stop()
    p = q.compile("cxx", "alone.o")
    assert p.wait(timeout=30) == 0
    assert (q.top.parent / "alone.o").exists()
    assert "without the queue" in (p.stderr.read() if p.stderr else "")


@pytest.mark.skipif(not shutil.which("ninja") or not shutil.which("c++"), reason="needs ninja and c++")
def test_real_ninja_and_cxx_through_the_queue(served, tmp_path):
    q = served(2, real_cxx=shutil.which("c++"))
    build = tmp_path / "build"
    build.mkdir()
    names = [f"unit{i}" for i in range(6)]
    for n in names:
        (build / f"{n}.cpp").write_text(f"int {n}(int x) {{ return x * {len(n)}; }}\n")
    # As torch's _write_ninja_file writes it: `cxx = $CXX`, a compile rule with a depfile, -j above the slots.
    (build / "build.ninja").write_text(
        f"ninja_required_version = 1.3\ncxx = {q.handed['CXX']}\n\nrule compile\n"
        "  command = $cxx -MMD -MF $out.d -O1 -c $in -o $out\n  depfile = $out.d\n  deps = gcc\n\n"
        + "".join(f"build {n}.o: compile {build / n}.cpp\n" for n in names))
    res = subprocess.run(["ninja", "-j", "16"], cwd=build, env=q.env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert all((build / f"{n}.o").stat().st_size > 0 for n in names)
    log = q.queue_log(" end cxx unit", 6)
    assert log.count(" go cxx unit") == 6 and log.count(" end cxx unit") == 6
    assert max(int(line.rsplit("running=", 1)[1]) for line in log.splitlines() if " go " in line) <= 2


@pytest.mark.parametrize("slots,costs,needle", [
    ("0", None, "SLOTS must be a whole number"),
    ("12345", None, "SLOTS must be a whole number"),
    ("-4", None, "SLOTS must be a whole number"),
    ("4", {"schema": 2, "costs": {}}, "expected"),
    ("4", {"schema": 1, "costs": {"../x.o": 3}}, "not an object file name"),
    ("4", {"schema": 1, "costs": {"x.o": True}}, "not an object file name"),
    ("4", {"schema": 1, "costs": {"x.o": -1}}, "not an object file name"),
    ("4", {"schema": 1, "costs": {"x\n.o": 1}}, "not an object file name"),
])
def test_serve_refuses_bad_input_before_making_anything(tmp_path, slots, costs, needle):
    args = [sys.executable, str(QUEUE), "serve", str(tmp_path / "q"), slots]
    if costs is not None:
        (tmp_path / "c.json").write_text(json.dumps(costs))
        args.append(str(tmp_path / "c.json"))
    res = subprocess.run(args, capture_output=True, text=True, timeout=30)
    assert res.returncode != 0 and needle in res.stderr
    assert not (tmp_path / "q").exists()


def test_serve_never_takes_over_a_directory(tmp_path):
    mine = tmp_path / "q"
    mine.mkdir()
    (mine / "keep").write_text("theirs")
    res = subprocess.run([sys.executable, str(QUEUE), "serve", str(mine), "2"], capture_output=True, text=True,
                         timeout=30, env={**os.environ, "CXX": shutil.which("true") or "/bin/true",
                                          "PYTORCH_NVCC": shutil.which("true") or "/bin/true"})
    assert res.returncode != 0 and "File exists" in res.stderr
    assert sorted(p.name for p in mine.iterdir()) == ["keep"]


def test_a_file_waiting_when_the_queue_ends_is_not_compiled(served):
    q = served(1)
    blocker = q.hold("blocker.o", "2")
    waiting = q.compile("nvcc", "waiting.o")
    time.sleep(0.5)
    q.stop()  # its owner stopped the compile
    assert waiting.wait(timeout=30) == 75
    assert "the queue ended before waiting.o's turn; not compiled" in (waiting.stderr.read() if waiting.stderr else "")
    assert blocker.wait(timeout=30) == 0  # what had its turn finishes
    assert [n for w, n, _ in q.events() if w == "start"] == ["blocker.o"]



def test_a_queue_without_wrappers_serves_wrappers_made_elsewhere(tmp_path):
    # An image's compile stages: invoke build serves the queue alone (`listen`: no compiler needed on
    # the build host); each stage makes its own wrappers for its own compilers (`wrappers`).
    fake = tmp_path / "fakecc"
    fake.write_text(FAKE_CC)
    fake.chmod(0o755)
    log, err = tmp_path / "fake.log", tmp_path / "listen.err"
    env = {"PATH": os.environ["PATH"], "FAKE_LOG": str(log), "CXX": str(fake), "PYTORCH_NVCC": str(fake)}
    with open(err, "w") as e:
        proc = subprocess.Popen([sys.executable, str(QUEUE), "listen", str(tmp_path / "q"), "1"],
                                stdout=subprocess.PIPE, stderr=e, env={"PATH": os.environ["PATH"]})
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n", err.read_text()
        assert sorted(p.name for p in (tmp_path / "q").iterdir()) == ["sock"], "listen makes no wrappers"
        made = subprocess.run([sys.executable, str(QUEUE), "wrappers", str(tmp_path / "w"), str(tmp_path / "q/sock")],
                              capture_output=True, env=env, check=True).stdout
        handed = dict(kv.split("=", 1) for kv in made.decode().split("\0")[:-1])
        assert made.endswith(b"\0ready\n") and handed["CXX"] == str(tmp_path / "w/bin/g++")
        procs = [subprocess.Popen([handed["CXX"] if i % 2 else handed["PYTORCH_NVCC"], "-c", f"s{i}.cpp", "-o",
                                   str(tmp_path / f"o{i}.o")], env={**env, "FAKE_SLEEP": "0.3"}) for i in range(4)]
        assert [p.wait(timeout=30) for p in procs] == [0] * 4
        starts_ends = sorted(((r[0], r[1], float(r[2])) for r in map(str.split, log.read_text().splitlines())),
                             key=lambda r: r[2])
        assert most_at_once(starts_ends) == 1
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    queue_log = err.read_text()
    assert queue_log.count(" go ") == 4 and "go nvcc o0.o" in queue_log
    # A forwarded compile runs its compiler as a child and frees its slot with `done`, whatever its end.
    failing = tmp_path / "failcc"
    failing.write_text("#!/bin/sh\nexit 3\n")
    failing.chmod(0o755)
    with open(tmp_path / "listen2.err", "w") as e:
        proc = subprocess.Popen([sys.executable, str(QUEUE), "listen", str(tmp_path / "q2"), "1"],
                                stdout=subprocess.PIPE, stderr=e, env={"PATH": os.environ["PATH"]})
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        runs = [subprocess.run([sys.executable, str(QUEUE), "run-forwarded", str(tmp_path / "q2/sock"), "cxx",
                                str(failing), "-c", "x.cpp", "-o", f"x{i}.o"], timeout=30).returncode for i in range(2)]
        assert runs == [3, 3]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert (tmp_path / "listen2.err").read_text().count(" end cxx x") == 2
    # `wrappers` makes a new directory of its own, never over another's
    again = subprocess.run([sys.executable, str(QUEUE), "wrappers", str(tmp_path / "w"), str(tmp_path / "q/sock")],
                           capture_output=True, text=True, env=env)
    assert again.returncode != 0 and "makes a new directory of its own" in again.stderr


def test_invoke_builds_queue_starts_and_stops_with_its_build(tmp_path):
    from slimeforge.image.builder.compilequeue import served as image_queue
    from slimeforge.proc import Runner, pid_alive

    said: list[str] = []
    runner = Runner()
    with image_queue(runner, tmp_path / "queue", 3, said.append) as sock:
        assert sock.is_socket() and "one queue of 3 slots" in said[0]
        queue_pid = int(subprocess.run(["pgrep", "-f", f"compile_queue.py listen {tmp_path}/queue "],
                                       capture_output=True, text=True).stdout.split()[0])
        assert pid_alive(queue_pid)
        assert runner.history[-1][1:4] == [str(QUEUE), "listen", str(tmp_path / "queue")]
    assert not pid_alive(queue_pid) and not (tmp_path / "queue").exists()
    assert "ready" in (tmp_path / "queue.log").read_text()


def test_the_queue_ends_with_the_process_that_started_it(tmp_path):
    # An owner killed outright (SIGKILL, a CI job's timeout) cannot stop its queue by its pid: the queue
    # notices its parent is gone and ends, its directory's socket with it.
    owner = subprocess.Popen(["bash", "-c", f'"{sys.executable}" "{QUEUE}" listen "{tmp_path}/q" 1 '
                                            f'>"{tmp_path}/out" 2>/dev/null & echo $!; wait'],
                             stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    queue_pid = int(owner.stdout.readline())
    deadline = time.monotonic() + 10
    while not (tmp_path / "q" / "sock").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "q" / "sock").exists()
    owner.kill()
    owner.wait(timeout=10)
    from slimeforge.proc import pid_alive

    deadline = time.monotonic() + 10
    while pid_alive(queue_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(queue_pid) and not (tmp_path / "q" / "sock").exists()
