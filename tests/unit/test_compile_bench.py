"""benchmarks/compile_bench.py reads where a compile's time went: each ninja's .ninja_log placed on the
build's clock, nvcc's --time CSV summed per file and phase, the set grammar, the piece's last chain.
The inputs are the formats the real tools wrote on the GPU build host (ninja 1.13, nvcc 13.0)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from compile_bench import SET_RE, last_chain, ninja_logs, nvcc_times  # noqa: E402

# Rows of a real nvcc 13.0 --time CSV (apex's welford.cu; the second cicc row added, to be summed)
# and nvcc's own driver row, which names no source.
NVCC_CSV = "\n".join([
    "source file name , phase name , phase input files , phase output file , arch , tool, metric , unit",
    "/tmp/cb/src/a/apex/csrc/welford.cu , gcc (preprocessing 1) , /tmp/cb/src/a/apex/csrc/welford.cu  , "
    "/tmp/x.cpp1.ii , compute_90 , nvcc , 3085.0020 , ms",
    "/tmp/cb/src/a/apex/csrc/welford.cu , cicc ,  /tmp/x.cpp1.ii  , /tmp/x.ptx , compute_90 , nvcc , 10386.1602 , ms",
    "/tmp/cb/src/a/apex/csrc/welford.cu , cicc ,  /tmp/y.cpp1.ii  , /tmp/y.ptx , compute_90 , nvcc , 1000.0 , ms",
    " , nvcc (driver) ,  , /tmp/cb/src/a/apex/build/temp/syncbn/csrc/welford.o ,  , nvcc , 128.5898 , ms",
]) + "\n"


def test_nvcc_times_sums_each_file_phase_and_skips_the_driver_row(tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text(NVCC_CSV)
    assert nvcc_times(csv) == [{"file": "welford.cu", "gcc (preprocessing 1)": 3085, "cicc": 11386}]
    assert nvcc_times(tmp_path / "absent.csv") == []


def test_ninja_logs_places_each_file_on_the_build_clock(tmp_path: Path) -> None:
    # One extension's build dir as torch writes it: build.ninja just before ninja starts, then
    # ninja's log (v7: start ms, end ms, mtime, output, hash) relative to that start.
    ext = tmp_path / "build" / "temp.linux-x86_64-cpython-312" / "mlp_cuda"
    ext.mkdir(parents=True)
    (ext / "build.ninja").write_text("ninja_required_version = 1.3\n")
    (ext / ".ninja_log").write_text("# ninja log v7\n0\t56700\t0\t/x/csrc/mlp.o\tdeadbeef\n"
                                    "56700\t130000\t0\t/x/csrc/mlp_cuda.o\tfeedface\nnot a line\n")
    lib = tmp_path / "build" / "lib.linux-x86_64-cpython-312"
    lib.mkdir(parents=True)
    (lib / "mlp_cuda.so").write_bytes(b"")
    t0 = 1_000_000.0
    os.utime(ext / "build.ninja", (t0 + 10, t0 + 10))
    os.utime(lib / "mlp_cuda.so", (t0 + 140.5, t0 + 140.5))
    builds = ninja_logs(tmp_path, t0)
    assert builds[0] == {"dir": "build/temp.linux-x86_64-cpython-312/mlp_cuda", "ninja_start_s": 10.0,
                         "ninja_end_s": 140.0, "files": [(10.0, 66.7, "mlp.o"), (66.7, 140.0, "mlp_cuda.o")]}
    assert builds[-1] == {"dir": "linked", "files": [(140.5, "mlp_cuda.so")]}
    chain = last_chain({"ninja": builds})
    assert "mlp_cuda (ninja 10.0-140.0 s, 2 files, longest mlp_cuda.o 66.7-140.0 s)" in chain
    assert chain.endswith("last link at 140.5 s")


def test_set_grammar() -> None:
    assert SET_RE.fullmatch("first:300:10")
    assert SET_RE.fullmatch("jobserver:200:16:32:10")
    assert SET_RE.fullmatch("series:900")
    for bad in ("first:300:10:24:5:1", "jobserver:200:16:32:100", "pool:900", "series:-1", "series:900\n"):
        assert not SET_RE.fullmatch(bad), bad


def test_queue_set_grammar() -> None:
    assert SET_RE.fullmatch("queue:300:22") and SET_RE.fullmatch("queue:300")
    assert not SET_RE.fullmatch("queue:300:2222") and not SET_RE.fullmatch("queue:")
