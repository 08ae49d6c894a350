"""How many compile jobs the compiled steps get: the per-piece rule, and its share when pieces compile at once.

A runtime setting only (it does not change what is built), so it is never in a step's env (that env
is part of compiled_key). Measured cold on a 16-core, 125 GiB H100 host (benchmarks/compile_bench.py,
docs/build.md "Compile parallelism"): an nvcc job of Transformer Engine peaks at 2.4 GiB, of apex at
2.7 GiB, flash-attn's kernels at about 6 GiB. templates/steps.sh (`sf_compile_jobs`, `sf_apex_jobs`,
`sf_compile_share`) is the same rule for hosts; tests hold the two to each other. Standard library only:
benchmarks/compile_bench.py imports it on a GPU host that has nothing else of slimeforge's.
"""

from __future__ import annotations

import os
import re

NVCC_JOB_BYTES = 6 << 30
NVCC_THREADS_MAX = 4
APEX_JOBS_PER_EXTENSION = 4


def host_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


def compile_jobs(mem_bytes: int | None = None, cores: int | None = None) -> tuple[int, int]:
    """MAX_JOBS and NVCC threads that fit the build host: about 6 GiB per nvcc job (flash-attn's
    kernels peak there), never more jobs than cores; the spare cores go to NVCC threads (at most 4;
    nvcc's --threads only runs its per-architecture passes side by side, so with one arch it adds
    nothing and costs nothing). templates/steps.sh `sf_compile_jobs` is the same rule."""
    cores = cores or os.cpu_count() or 1
    if mem_bytes is None:
        mem_bytes = host_memory()
    jobs = max(1, min(cores, mem_bytes // NVCC_JOB_BYTES))
    threads = max(1, min(NVCC_THREADS_MAX, cores // jobs))
    return int(jobs), int(threads)


def apex_jobs(jobs: int) -> tuple[int, int]:
    """(APEX_PARALLEL_BUILD, MAX_JOBS for apex) from the host's MAX_JOBS. apex builds its ~15
    extensions one after another unless APEX_PARALLEL_BUILD is set, and each extension's ninja runs
    at most MAX_JOBS of its own files: with MAX_JOBS=16 alone it took over 480 s on the H100 host.
    The fastest split measured there was 8 extensions at once with 4 jobs each (158 s; 4x4: 271 s,
    16x2: over 260 s, 8x8: 189 s): at most 4 jobs per extension, and twice the host's jobs in all,
    since an apex job peaks at 2.7 GiB, so two fit the 6 GiB that MAX_JOBS budgets per job.
    templates/steps.sh `sf_apex_jobs` is the same rule."""
    per_extension = max(1, min(APEX_JOBS_PER_EXTENSION, jobs))
    return max(1, 2 * jobs // per_extension), per_extension


def compile_share(pieces: int, mem_bytes: int | None = None, cores: int | None = None) -> tuple[int, int, int]:
    """(AT_ONCE, MAX_JOBS, NVCC_THREADS) for `pieces` compiled steps that may compile side by side: at most as many at
    once as the host has jobs (compile_jobs), and each of those running gets the per-piece rule applied to its share of
    the memory and the cores. On a 2-core host two pieces run at once with one job each, which keeps both cores busy as
    one piece with two jobs did; on 16 cores and 125 GiB three pieces get 6 jobs each (apex: 3 extensions x 4).
    templates/steps.sh `sf_compile_share` is the same rule."""
    cores = cores or os.cpu_count() or 1
    if mem_bytes is None:
        mem_bytes = host_memory()
    host_jobs, _ = compile_jobs(mem_bytes, cores)
    at_once = max(1, min(pieces, host_jobs))
    # Cores rounded up: a piece's jobs are not all busy all the time (its setup, its link, the one
    # long file at the end), so a share a little over the cores keeps them busy; memory rounded down.
    jobs, threads = compile_jobs(mem_bytes // at_once, -(-cores // at_once))
    return at_once, jobs, threads


def apex_shared(share_jobs: int, mem_bytes: int | None = None, cores: int | None = None) -> tuple[int, int]:
    """(APEX_PARALLEL_BUILD, MAX_JOBS for apex) when apex compiles beside other pieces with a share
    of `share_jobs`: its extensions at once as on the whole host (apex_jobs of compile_jobs), each with
    the jobs of its share. apex's wall time is set by how many of its ~15 small extensions build at
    once, not by its total jobs, and it is the set's longest piece: measured on the 16-core, 125 GiB
    H100 host, the whole cold set (apex, TE, torch_memory_saver) took 324 s with apex cut to its share
    (3 extensions x 4 jobs), 228 s with 8 x 4 beside TE's 6 jobs (1.23 x the cores' limit; in series
    282 s, 1.61 x). Memory still fits: 32 apex jobs at 2.7 GiB, 6 TE jobs at 2.4 GiB and
    torch_memory_saver's one small file peak at about 101 GiB of 125. templates/steps.sh
    (sf_run_together, sf_compiled) is the same rule."""
    host_jobs, _ = compile_jobs(mem_bytes, cores)
    return apex_jobs(host_jobs)[0], apex_jobs(share_jobs)[1]


NINJA_JOBSERVER = (1, 13)  # the first ninja that takes its job slots from a GNU make jobserver


def ninja_takes_jobserver(version: str) -> bool:
    """Whether a `ninja --version` answer is 1.13 or later. templates/steps.sh `_sf_ninja_ok` is the
    same rule."""
    m = re.match(r"([0-9]{1,4})\.([0-9]{1,4})", version.strip())
    return m is not None and (int(m.group(1)), int(m.group(2))) >= NINJA_JOBSERVER


POOL_JOB_BYTES = 3 << 30  # an apex or Transformer Engine nvcc job peaks at 2.7 GiB (flash-attn's at 6: not for a pool)


def jobserver_plan(mem_bytes: int | None = None, cores: int | None = None) -> tuple[int, int, int]:
    """(SLOTS, APEX_PARALLEL_BUILD, NVCC_THREADS) for the compiled pieces side by side under one pool of
    job slots (a GNU make jobserver, templates/steps.sh `sf_jobserver_open`): every piece starts at
    once, each ninja job of any piece holds a slot and gives it back when it ends (ninja's own first
    job too: the shim holds one for it). Measured cold on the 16-core H200 host (docs/build.md
    "Compile parallelism"): a pool of the host's jobs (16) left cores idle (245 s; an nvcc job keeps
    less than one core busy); 32 slots 208.6 s with apex 16 extensions at once (228.1 s with 8); 40
    slots and 16 extensions 196.0 s, against 198.1 s for the fixed shares (compile_share) on the same
    machine: a tie, so the pool is not the default. ninja takes a slot only when it is about to start a
    job, so a ninja that finds the pool empty runs one job at a time: with TE at nice 10 in a pool of 32,
    apex's ninjas held every slot and TE finished 1 file of 28 in 200 s (docs/build.md, "Where apex's
    time goes"). SLOTS: two and a half jobs per host job, at most
    one per 3 GiB (apex and TE jobs; flash-attn's 6 GiB jobs would not fit); apex: as many
    extensions at once as the host has jobs. Outside the pool stay a piece built without ninja
    (torch_memory_saver: one g++ at a time) and the links setuptools runs after each ninja.
    templates/steps.sh `sf_jobserver_plan` is the same rule."""
    if mem_bytes is None:
        mem_bytes = host_memory()
    jobs, threads = compile_jobs(mem_bytes, cores)
    slots = max(1, min(5 * jobs // 2, mem_bytes // POOL_JOB_BYTES))
    return int(slots), jobs, threads


QUEUE_FILES_PER_NINJA = 64  # MAX_JOBS in a queue: every ninja starts all its files, the queue bounds them
QUEUE_APEX_AT_ONCE = 16  # apex's 12 extensions (at its pinned commit, with the stack's flags) all at once


def queue_plan(mem_bytes: int | None = None, cores: int | None = None) -> tuple[int, int]:
    """(SLOTS, NVCC_THREADS) for the compiled pieces side by side behind one queue in front of every
    compiler (slimeforge/scripts/compile_queue.py; templates/steps.sh `sf_queue_open`): every piece at
    once, each ninja with all its files at once, at most SLOTS compiling, the costliest waiting file
    first. Measured cold on 16-core H200 hosts (docs/build.md "A queue in front of every compiler"):
    22 slots 169.5-180.3 s (1.11-1.14 x the cores' limit), 28 slots 167.4 s (1.15), against 185.2 s
    for the fixed shares and 191.3 s for apex in a pool of its own on the same machines; with one
    backend call per piece (build_wheel.py) 1.09-1.13 at 18 or 22 slots, against 1.55 one piece after
    another on the same warm machine. SLOTS: the
    host's jobs and three eighths more (an nvcc job keeps less than one core busy), at most one per
    3 GiB (apex and TE jobs peak at 2.7 GiB). templates/steps.sh `sf_queue_plan` is the same rule."""
    if mem_bytes is None:
        mem_bytes = host_memory()
    jobs, threads = compile_jobs(mem_bytes, cores)
    slots = max(1, min(jobs + 3 * jobs // 8, mem_bytes // POOL_JOB_BYTES))
    return int(slots), int(threads)
