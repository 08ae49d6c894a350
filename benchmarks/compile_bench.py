"""Cold compile time of each compiled piece under given parallelism settings (run on a GPU build host).

Each run unpacks its source archive afresh (no build directory, no object left from a former run)
and builds it the way slimeforge's compiled step does (templates/steps.sh `_sf_store_make`):
`python slimeforge/scripts/build_wheel.py` (the backend's build_wheel, once, no isolation) against the
torch already installed; `--front-end pip` as before (pip wheel: setup.py twice, metadata first).
It prints per run: the settings, wall time, CPU time of the whole build (user + system of every process
it waited for) and the peak RSS of its largest process; and how close the build came to the cores'
limit (CPU-seconds / cores = the wall time a perfectly parallel build would take).
A run that passes its limit is stopped and reported as "over LIMIT s".

    python benchmarks/compile_bench.py --sources DIR --work /tmp/cb --out RESULTS.json \
        --run apex-before:apex:480:MAX_JOBS=16,NVCC_APPEND_FLAGS=--threads_1 \
        --run apex-after:apex:600:APEX_PARALLEL_BUILD=4,MAX_JOBS=4,NVCC_APPEND_FLAGS=--threads_1

The whole compiled set (apex, Transformer Engine's torch extension, torch_memory_saver), cold, one
piece after another under the per-piece rule, then side by side under the shared budget that the
install and the image build use (slimeforge/image/builder/compilejobs.py `compile_share`), each set's wall
time against the cores' limit (its CPU-seconds / cores):

    python benchmarks/compile_bench.py --sources DIR --work /tmp/cb --out RESULTS.json \
        --set series:900 --set parallel:900 --set jobserver:900

`jobserver`: every piece at once under one pool of job slots (compilejobs.jobserver_plan; the pool and
the ninja shim are templates/steps.sh's `sf_jobserver_open`, sourced from this checkout), as the
install compiles them with SF_COMPILE_POOL=1; `jobserver:900:8:32` gives apex 8 extensions at once and
the pool 32 slots instead of the rule's, `jobserver:900:16:32:10` also runs the pieces other than apex
at nice 10. `first:900[:NICE[:SLOTS]]`: apex in a pool of its own (SLOTS, default the rule's slots
less the host's jobs), all its extensions at once; the other pieces beside it with the host's jobs
each at nice NICE (default 10). --ninja (default: the ninja on PATH) must be 1.13 or later;
--apex-nvcc adds nvcc flags to apex in the jobserver, first and queue sets (`--apex-nvcc=--split-compile=2`).
`queue:900[:SLOTS]`: every piece at once behind slimeforge/scripts/compile_queue.py (default slots: the
install's rule, compilejobs.queue_plan), every ninja with all its files at once,
the costliest waiting file first by --costs (default slimeforge/scripts/compile_costs.json), as the
install compiles them on a host of 16 or more compile jobs; its JSON keeps the queue's log.

Where the time goes: every build's JSON record has `ninja`, each ninja build under its source tree
(one per apex extension, one for TE's) on the build's clock (s from its start): when that ninja
started and ended, each file's start and end (.ninja_log), and when each .so was linked; the printout
names each piece's last extension and its longest file. CB_NVCC_TIME=1 in the environment adds nvcc's
`--time` CSV (per file and phase: preprocessing, cudafe++, cicc, ptxas) under `nvcc_time`. Each set
also samples the compilers running and the memory in use (MemTotal - MemAvailable). A run stopped at
its limit counts only the CPU of the processes already reaped, so its set gets no ratio.

SOURCES holds apex.tar.gz, tms.tar.gz (git archives with a top directory) and
transformer_engine_torch-*.tar.gz (the sdist). In a setting, "_" stands for a space.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from slimeforge.image.builder.compilejobs import (  # noqa: E402  (standard library only)
    QUEUE_APEX_AT_ONCE,
    QUEUE_FILES_PER_NINJA,
    apex_jobs,
    apex_shared,
    compile_jobs,
    compile_share,
    jobserver_plan,
    ninja_takes_jobserver,
    queue_plan,
)

STEPS_SH = Path(__file__).resolve().parent.parent / "templates" / "steps.sh"
QUEUE_PY = Path(__file__).resolve().parent.parent / "slimeforge" / "scripts" / "compile_queue.py"
COSTS = QUEUE_PY.with_name("compile_costs.json")
BUILD_WHEEL = QUEUE_PY.with_name("build_wheel.py")
FRONT_END = "build_wheel"  # --front-end: how each piece's wheel is asked for

ARCH = "9.0"
# What each piece needs besides parallelism (the stack's step env and arch variables).
PIECES = {
    "apex": ("apex.tar.gz", {"APEX_CPP_EXT": "1", "APEX_CUDA_EXT": "1", "TORCH_CUDA_ARCH_LIST": ARCH}),
    "tms": ("tms.tar.gz", {"TMS_CUDA_MAJOR": "13", "TORCH_CUDA_ARCH_LIST": ARCH}),
    "te": ("transformer_engine_torch-*.tar.gz",
           {"NVTE_PYTORCH_FORCE_BUILD": "TRUE", "NVTE_CUDA_ARCHS": ARCH.replace(".", ""),
            "TORCH_CUDA_ARCH_LIST": ARCH}),
}
SET_RE = re.compile(r"(series|parallel|jobserver|first|queue):([0-9]{1,4})(?::([0-9]{1,3}))?(?::([0-9]{1,3}))?"
                    r"(?::([0-9]{1,2}))?")
RUN_RE = re.compile(r"([a-z0-9][a-z0-9_.-]*):(apex|tms|te):([0-9]{1,4}):"
                    r"((?:[A-Z_][A-Z0-9_]*=[^,]*)(?:,[A-Z_][A-Z0-9_]*=[^,]*)*)?")


def nvidia_include_dirs() -> list[str]:
    """Headers that torch's nvidia wheels bring (cuBLAS, cuSPARSE, cuDNN, NCCL...): TE's extension
    needs them and a minimal toolkit lacks them (stack-facts section 8)."""
    import importlib.util
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec else []
    return sorted(d for r in roots for d in glob.glob(f"{r}/*/include") + glob.glob(f"{r}/cu*/include"))


def unpack(archive: Path, dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(archive) as t:
        t.extractall(dest, filter="data")
    (top,) = list(dest.iterdir())
    return top


def ninja_logs(src: Path, t0: float) -> list[dict]:
    """Every ninja build under SRC (torch's extension builder writes one build.ninja per extension that
    apex builds, one for TE's), placed on the build's clock: build.ninja is written just before its
    ninja starts, and .ninja_log's start/end (ms) count from that start. Each: the extension, when its
    ninja started and ended (s from the build's start), and its files' (start, end, name)."""
    out = []
    for log in sorted(src.rglob(".ninja_log")):
        base = log.parent / "build.ninja"
        began = (base.stat().st_mtime if base.exists() else log.stat().st_mtime) - t0
        files = []
        for line in log.read_text(errors="replace").splitlines():
            parts = line.split("\t")
            if line.startswith("#") or len(parts) < 4 or not parts[0].isdigit() or not parts[1].isdigit():
                continue
            files.append((round(began + int(parts[0]) / 1000, 1), round(began + int(parts[1]) / 1000, 1),
                          Path(parts[3]).name))
        files.sort()
        out.append({"dir": str(log.parent.relative_to(src)), "ninja_start_s": round(began, 1),
                    "ninja_end_s": round(max((f[1] for f in files), default=began), 1), "files": files})
    libs = [(round(so.stat().st_mtime - t0, 1), so.name) for so in src.glob("build/lib*/**/*.so")]
    out.append({"dir": "linked", "files": sorted(libs)})
    return out


def nvcc_times(path: Path) -> list[dict]:
    """nvcc --time's CSV (one row per compilation phase of each file), summed per file and phase (ms)."""
    if not path.exists():
        return []
    per: dict[str, dict[str, float]] = {}
    header: list[str] = []
    for line in path.read_text(errors="replace").splitlines():
        cells = [c.strip() for c in line.split(",")]
        if cells and cells[0].lower().startswith("source"):
            header = [c.lower() for c in cells]
            continue
        if not header or len(cells) < len(header):
            continue
        row = dict(zip(header, cells[:len(header)], strict=True))
        src = Path(row.get("source file name", "")).name
        phase = row.get("phase name", "?")
        if not src:  # nvcc's own (driver) row names no source
            continue
        try:
            ms = float(row.get("metric") or 0)
        except ValueError:
            continue
        per.setdefault(src, {}).setdefault(phase, 0.0)
        per[src][phase] += ms
    return [{"file": f, **{k: round(v) for k, v in ph.items()}} for f, ph in sorted(per.items())]


def build(name: str, piece: str, limit: int, settings: dict[str, str], sources: Path, work: Path,
          extra_env: dict[str, str] | None = None, nice: int = 0, nvcc_extra: str = "") -> dict:
    pattern, env_piece = PIECES[piece]
    (archive,) = sorted(sources.glob(pattern))
    src = unpack(archive, work / "src" / name)
    wheels = work / "wheels" / name
    shutil.rmtree(wheels, ignore_errors=True)
    env = {**os.environ, **env_piece, **settings, **(extra_env or {})}
    timing = work / f"{name}.nvcc-time.csv"
    timing.unlink(missing_ok=True)
    if nvcc_extra:
        env["NVCC_APPEND_FLAGS"] = f"{env.get('NVCC_APPEND_FLAGS', '')} {nvcc_extra}".strip()
    if os.environ.get("CB_NVCC_TIME") == "1":
        env["NVCC_APPEND_FLAGS"] = f"{env.get('NVCC_APPEND_FLAGS', '')} --time {timing}".strip()
    if piece == "te":
        env["CPATH"] = ":".join(nvidia_include_dirs() + [p for p in [os.environ.get("CPATH")] if p])
    log = work / f"{name}.log"
    front = ([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--no-build-isolation", "--no-deps",
              "--no-index", "--wheel-dir", str(wheels), str(src)] if FRONT_END == "pip" else
             [sys.executable, str(BUILD_WHEEL), "--wheel-dir", str(wheels), "--", str(src)])
    cmd = (["nice", "-n", str(nice)] if nice else []) + front
    start, t0 = time.monotonic(), time.time()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        status, usage, timed_out = None, None, False
        while status is None:
            pid, st, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                status, usage = st, ru
                break
            if time.monotonic() - start > limit:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                _, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.2)
    wall = time.monotonic() - start
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code
    built = sorted(p.name for p in wheels.glob("*.whl")) if wheels.exists() else []
    return {"name": name, "piece": piece, "settings": settings, "limit_s": limit, "timed_out": timed_out,
            "ok": code == 0 and not timed_out and bool(built), "exit": code, "wall_s": round(wall, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1), "peak_rss_mib": round(usage.ru_maxrss / 1024),
            "wheels": built, "log_tail": log.read_text(errors="replace")[-1500:] if code else "",
            "nice": nice, "nvcc_extra": nvcc_extra, "ninja": ninja_logs(src, t0),
            "nvcc_time": nvcc_times(timing),
            "nvcc_time_raw": timing.read_text(errors="replace")[:400_000] if timing.exists() else ""}


def parse_run(text: str) -> tuple[str, str, int, dict[str, str]]:
    m = RUN_RE.fullmatch(text)
    if not m:
        raise SystemExit(f"--run {text!r}: expected NAME:apex|tms|te:LIMIT_S:KEY=VAL,... ('_' for a space)")
    settings = dict(kv.split("=", 1) for kv in m.group(4).split(",")) if m.group(4) else {}
    return m.group(1), m.group(2), int(m.group(3)), {k: v.replace("_", " ") for k, v in settings.items()}


def piece_settings(piece: str, jobs: int, threads: int, shared: bool = False) -> dict[str, str]:
    """What templates/steps.sh `sf_compiled` exports for a piece given MAX_JOBS and NVCC_THREADS
    (`shared`: its share beside other pieces, where apex keeps the host's extension count: apex_shared)."""
    out = {"MAX_JOBS": str(jobs), "NVCC_THREADS": str(threads), "NVTE_BUILD_THREADS_PER_JOB": str(threads),
           "NVCC_APPEND_FLAGS": f"--threads {threads}"}
    if piece == "apex":
        parallel, per = apex_shared(jobs) if shared else apex_jobs(jobs)
        out.update(APEX_PARALLEL_BUILD=str(parallel), MAX_JOBS=str(per))
    return out


class JobSampler(threading.Thread):
    """Counts the compilers running (cicc, cc1plus: one per nvcc or g++ job at any moment) every half
    second while a set compiles: its peak shows the bound a pool or a share kept, its mean how busy."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.samples: list[int] = []
        self.used: list[int] = []

    def run(self) -> None:
        while not self.stop.wait(0.5):
            try:
                info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
                self.used.append(int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0]))
            except (OSError, KeyError, ValueError):
                pass
            n = 0
            for comm in glob.glob("/proc/[0-9]*/comm"):
                try:
                    n += Path(comm).read_text().strip() in ("cicc", "cc1plus")
                except OSError:
                    pass
            self.samples.append(n)

    def summary(self) -> dict:
        self.stop.set()
        self.join()
        s = self.samples or [0]
        return {"peak_jobs": max(s), "mean_jobs": round(sum(s) / len(s), 1),
                "peak_used_gib": round(max(self.used or [0]) / (1 << 20), 1)}


def open_pool(work: Path, slots: int, ninja: str) -> tuple[int, dict[str, str]]:
    """The pool of `slots` job slots and the ninja shim, by steps.sh's own sf_jobserver_open (run in
    bash, which prints the environment it hands each piece); this process then holds the FIFO open
    for as long as the set compiles (a FIFO drops its bytes once nobody has it open)."""
    version = subprocess.run([ninja, "--version"], capture_output=True, text=True, check=True).stdout
    if not ninja_takes_jobserver(version):
        raise SystemExit(f"--set jobserver: {ninja} is ninja {version.strip()}; a jobserver client needs 1.13 or "
                         "later (--ninja)")
    script = ('source "$1"; sf_jobserver_open "$2" "$3" "$4" || exit 3; '
              'printf "%s\\0" "${SF_JOBSERVER_ENV[@]}"; sleep 30')
    proc = subprocess.Popen(["bash", "-c", script, "bash", str(STEPS_SH), str(work / "pool"), str(slots), ninja],
                            stdout=subprocess.PIPE)
    out = b""
    assert proc.stdout is not None
    while b"PATH=" not in out or not out.endswith(b"\0"):
        chunk = proc.stdout.read1(65536)
        if not chunk:
            raise SystemExit(f"--set jobserver: sf_jobserver_open failed (exit {proc.wait()})")
        out += chunk
    # Hold the FIFO (bash's holder ends with its sleep): opened read-write, so it never blocks.
    fd = os.open(work / "pool" / "slots", os.O_RDWR)
    proc.kill()
    proc.wait()
    env = dict(kv.split("=", 1) for kv in out.decode().split("\0") if kv)
    return fd, env


def open_queue(work: Path, slots: int, costs: Path) -> tuple[subprocess.Popen, dict[str, str], Path]:
    """slimeforge/scripts/compile_queue.py serving SLOTS slots in front of every compiler, by the cost
    table; its start and end of each file go to work/queue.log."""
    top = work / "queue"
    work.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(top, ignore_errors=True)
    log = work / "queue.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, str(QUEUE_PY), "serve", str(top), str(slots), str(costs)],
                                stdout=subprocess.PIPE, stderr=err)
    assert proc.stdout is not None
    out = proc.stdout.readline()
    if not out.endswith(b"\0ready\n"):
        raise SystemExit(f"--set queue: compile_queue.py serve failed (exit {proc.wait()}; {log})")
    env = dict(kv.split("=", 1) for kv in out.decode().split("\0")[:-1])
    return proc, env, log


def build_set(mode: str, limit: int, sources: Path, work: Path, ninja: str = "ninja", apex_parallel: int | None = None,
              slots_given: int | None = None, apex_nvcc: str = "", others_nice: int | None = None,
              costs: Path = COSTS) -> dict:
    """The whole set cold: `series` each piece alone with the host's whole budget (compile_jobs), one
    after another; `parallel` every piece at once, each with its share (compile_share); `jobserver`
    every piece at once under one pool of the host's jobs (jobserver_plan). The cores' limit is the
    set's CPU-seconds / cores."""
    pieces = list(PIECES)
    cores = os.cpu_count() or 1
    queue_text = ""
    sampler = JobSampler()
    sampler.start()
    start = time.monotonic()
    if mode == "jobserver":
        slots, apex_par, threads = jobserver_plan()
        apex_par, slots = apex_parallel or apex_par, slots_given or slots
        nice = others_nice or 0
        fd, pool_env = open_pool(work, slots, shutil.which(ninja) or ninja)
        start = time.monotonic()
        runs = [{} for _ in pieces]

        def pooled(i: int, p: str) -> None:
            settings = piece_settings(p, slots, threads)
            if p == "apex":
                settings["APEX_PARALLEL_BUILD"] = str(apex_par)
            runs[i] = build(f"{mode}-{p}", p, limit, settings, sources, work, pool_env,
                            nvcc_extra=apex_nvcc if p == "apex" else "", nice=0 if p == "apex" else nice)

        workers = [threading.Thread(target=pooled, args=(i, p)) for i, p in enumerate(pieces)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        os.close(fd)
        at_once, jobs = len(pieces), slots
        threads_note = f"pool of {slots} slots, apex {apex_par} extensions at once, the others nice {nice}"
    elif mode == "first":
        # apex (the long pole) first: its own pool of job slots, all its extensions at once; the
        # other pieces beside it with the host's jobs each at a lower CPU priority (nice), so they
        # take the cores apex leaves idle and slow it little.
        host_jobs, threads = compile_jobs()
        slots_all, apex_par, _ = jobserver_plan()
        slots = slots_given or max(1, slots_all - host_jobs)
        nice = apex_parallel if apex_parallel is not None else 10
        fd, pool_env = open_pool(work, slots, shutil.which(ninja) or ninja)
        start = time.monotonic()
        runs = [{} for _ in pieces]

        def firsts(i: int, p: str) -> None:
            if p == "apex":
                settings = piece_settings(p, slots, threads)
                settings["APEX_PARALLEL_BUILD"] = str(apex_par)
                runs[i] = build(f"{mode}-{p}", p, limit, settings, sources, work, pool_env, nvcc_extra=apex_nvcc)
            else:
                runs[i] = build(f"{mode}-{p}", p, limit, piece_settings(p, host_jobs, threads), sources, work,
                                nice=nice)

        workers = [threading.Thread(target=firsts, args=(i, p)) for i, p in enumerate(pieces)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        os.close(fd)
        at_once, jobs = len(pieces), host_jobs
        threads_note = f"apex: pool of {slots} slots, {apex_par} extensions at once; the others nice {nice}"
    elif mode == "queue":
        # Every piece at once, every ninja with all its files at once (-j 64, apex's extensions all at
        # once), each compile behind compile_queue.py: at most SLOTS at a time, the costliest first.
        jobs, threads = compile_jobs()
        slots = slots_given or queue_plan()[0]
        proc, queue_env, queue_log = open_queue(work, slots, costs)
        start = time.monotonic()
        runs = [{} for _ in pieces]

        def queued(i: int, p: str) -> None:
            settings = piece_settings(p, jobs, threads)
            if p != "tms":  # tms builds without ninja (setuptools, one g++ at a time)
                settings["MAX_JOBS"] = str(QUEUE_FILES_PER_NINJA)
            if p == "apex":
                settings["APEX_PARALLEL_BUILD"] = str(QUEUE_APEX_AT_ONCE)
            runs[i] = build(f"{mode}-{p}", p, limit, settings, sources, work, queue_env,
                            nvcc_extra=apex_nvcc if p == "apex" else "")

        workers = [threading.Thread(target=queued, args=(i, p)) for i, p in enumerate(pieces)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        proc.terminate()
        proc.wait()
        at_once = len(pieces)
        queue_text = queue_log.read_text(errors="replace")
        order = [line.split()[3] for line in queue_text.splitlines() if len(line.split()) > 3 and " go " in line]
        threads_note = (f"queue of {slots} slots by {costs.name}; "
                        f"first started: {', '.join(order[:6])}")
    elif mode == "series":
        jobs, threads = compile_jobs()
        runs = [build(f"{mode}-{p}", p, limit, piece_settings(p, jobs, threads), sources, work) for p in pieces]
        at_once = 1
    else:
        at_once, jobs, threads = compile_share(len(pieces))
        runs = [{} for _ in pieces]
        # At most AT_ONCE pieces at a time, as the install's scheduler (sf_run_group) runs them.
        slots = threading.Semaphore(at_once)

        def one(i: int, p: str) -> None:
            with slots:
                runs[i] = build(f"{mode}-{p}", p, limit, piece_settings(p, jobs, threads, shared=True), sources, work)

        threads_ = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(pieces)]
        for t in threads_:
            t.start()
        for t in threads_:
            t.join()
    if mode not in ("jobserver", "first", "queue"):
        threads_note = ""
    wall = time.monotonic() - start
    cpu = sum(r["cpu_s"] for r in runs)
    whole = not any(r["timed_out"] for r in runs)
    threads_note += (" compilers at once: peak {peak_jobs}, mean {mean_jobs}; memory in use at most {peak_used_gib} GiB"
                     .format(**sampler.summary()))
    return {"set": mode, "note": threads_note, "queue_log": queue_text[:100_000],
            "at_once": at_once, "jobs": jobs, "threads": threads,
            "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1), "cores": cores, "cores_limit_s": round(cpu / cores, 1),
            "ratio": round(wall / (cpu / cores), 2) if cpu and whole else None, "ok": all(r["ok"] for r in runs),
            "pieces": runs}


def last_chain(run: dict) -> str:
    """The extension that ended the piece (its .so linked last), with its longest file: the piece's
    critical path as the ninja logs show it."""
    builds = [n for n in run.get("ninja", []) if n["dir"] != "linked"]
    linked = next((n["files"] for n in run.get("ninja", []) if n["dir"] == "linked"), [])
    if not builds:
        return ""
    last = max(builds, key=lambda n: n["ninja_end_s"])
    start, end, name = max(last["files"], key=lambda f: f[1] - f[0]) if last["files"] else (0, 0, "-")
    return (f"last: {Path(last['dir']).name} (ninja {last['ninja_start_s']}-{last['ninja_end_s']} s, "
            f"{len(last['files'])} files, longest {name} {start}-{end} s); last link at "
            f"{max((f[0] for f in linked), default=0)} s")


def warm_files(sources: Path) -> dict:
    """Read what every build reads (torch, the nvidia wheels, setuptools, the CUDA toolkit, the sources)
    once, so that the sets after it start on a warm page cache: on a fresh machine the first set would
    otherwise pay the disk reads that every later set skips."""
    import setuptools
    import torch
    from torch.utils.cpp_extension import CUDA_HOME

    roots = [Path(torch.__file__).parent, Path(setuptools.__file__).parent, sources]
    roots += [Path(d) for d in glob.glob(str(Path(torch.__file__).parent.parent / "nvidia"))]
    if CUDA_HOME:
        roots.append(Path(CUDA_HOME).resolve())
    start, files, size = time.monotonic(), 0, 0
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for name in names:
                path = os.path.join(dirpath, name)
                if not os.path.isfile(path) or os.path.islink(path):
                    continue
                with open(path, "rb") as f:
                    while chunk := f.read(1 << 20):
                        size += len(chunk)
                files += 1
    return {"roots": [str(r) for r in roots], "files": files, "bytes": size,
            "seconds": round(time.monotonic() - start, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sources", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--run", action="append", default=[], help="NAME:PIECE:LIMIT_S:KEY=VAL,...")
    ap.add_argument("--set", action="append", default=[],
                    help="series|parallel:LIMIT_S, jobserver:LIMIT_S[:APEX_PARALLEL[:SLOTS[:NICE]]], "
                         "first:LIMIT_S[:NICE[:SLOTS]] or queue:LIMIT_S[:SLOTS] (limit per piece): the whole "
                         "compiled set")
    ap.add_argument("--apex-nvcc", default="",
                    help="more nvcc flags for apex in the jobserver, first and queue sets (e.g. --split-compile=2)")
    ap.add_argument("--ninja", default="ninja", help="the ninja (1.13 or later) the jobserver set's shim runs")
    ap.add_argument("--front-end", choices=("build_wheel", "pip"), default="build_wheel",
                    help="build_wheel: slimeforge/scripts/build_wheel.py, as the compiled step runs it (the "
                         "backend once); pip: pip wheel, as it ran until the fifteenth landing (metadata first)")
    ap.add_argument("--warm", action="store_true",
                    help="read torch, the nvidia wheels, setuptools, the CUDA toolkit and the sources once first "
                         "(a warm page cache for every set, the first one too)")
    ap.add_argument("--costs", type=Path, default=COSTS,
                    help="the queue set's cost table (compile_model.py --write-costs)")
    args = ap.parse_args()
    global FRONT_END
    FRONT_END = args.front_end
    runs = [parse_run(r) for r in args.run]
    sets = []
    for text in args.set:
        m = SET_RE.fullmatch(text)
        if not m:
            raise SystemExit(f"--set {text!r}: expected series:LIMIT_S, parallel:LIMIT_S, "
                             "jobserver:LIMIT_S[:APEX_PARALLEL[:SLOTS[:NICE]]], first:LIMIT_S[:NICE[:SLOTS]] or "
                             "queue:LIMIT_S[:SLOTS]")
        sets.append((m.group(1), int(m.group(2)), int(m.group(3)) if m.group(3) else None,
                     int(m.group(4)) if m.group(4) else None, int(m.group(5)) if m.group(5) else None))
    if not runs and not sets:
        raise SystemExit("nothing to do: give --run or --set")
    cores = os.cpu_count() or 1
    results: list[dict] = []
    warm = warm_files(args.sources) if args.warm else None
    if warm:
        print(f"warm: read {warm['files']} files, {warm['bytes'] / 1e9:.2f} GB in {warm['seconds']} s", flush=True)
    for mode, limit, apex_parallel, slots, nice in sets:
        if mode == "queue":  # queue:LIMIT_S[:SLOTS]
            apex_parallel, slots = None, apex_parallel
        r = build_set(mode, limit, args.sources, args.work, args.ninja, apex_parallel, slots, args.apex_nvcc, nice,
                      args.costs)
        results.append(r)
        args.out.write_text(json.dumps({"cores": cores, "warm": warm, "results": results}, indent=2) + "\n")
        print(f"set {mode:9} {'ok' if r['ok'] else 'FAILED':6} wall {r['wall_s']:>7} s  cpu {r['cpu_s']:>7} s  "
              f"cores' limit {r['cores_limit_s']:6.1f} s  ratio {r['ratio']}  at once {r['at_once']}, "
              f"MAX_JOBS={r['jobs']} NVCC_THREADS={r['threads']} {r['note']}", flush=True)
        for p in r["pieces"]:
            print(f"    {p['piece']:5} {'ok' if p['ok'] else 'FAILED':6} wall {p['wall_s']:>7} s  cpu {p['cpu_s']:>7} "
                  "s  "
                  f"peak RSS {p['peak_rss_mib']} MiB  {' '.join(f'{k}={v}' for k, v in p['settings'].items())}",
                  flush=True)
            if last_chain(p):
                print(f"          {last_chain(p)}", flush=True)
            if p["log_tail"]:
                print(p["log_tail"], flush=True)
    for name, piece, limit, settings in runs:
        r = build(name, piece, limit, settings, args.sources, args.work)
        results.append(r)
        args.out.write_text(json.dumps({"cores": cores, "warm": warm, "results": results}, indent=2) + "\n")
        wall = f"over {limit} s" if r["timed_out"] else f"{r['wall_s']} s"
        print(f"{name:14} {'ok' if r['ok'] else 'FAILED':6} wall {wall:>10}  cpu {r['cpu_s']:>7} s  "
              f"cores' limit {r['cpu_s'] / cores:6.1f} s  peak RSS {r['peak_rss_mib']} MiB  "
              f"{' '.join(f'{k}={v}' for k, v in settings.items())}", flush=True)
        if last_chain(r):
            print(f"               {last_chain(r)}", flush=True)
        if r["log_tail"]:
            print(r["log_tail"], flush=True)
    return 0 if all(r["ok"] or r.get("timed_out") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
