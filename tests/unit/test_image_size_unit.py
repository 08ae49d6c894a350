"""benchmarks/image_size.py: an image's files read from find's NUL-separated records, summed by
directory, and its duplicates and build leftovers found, from a listing (no Docker here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from image_size import File, _bytes, duplicates, leftovers, measure, parse_find, top_dirs  # noqa: E402

VENV = "/opt/slimeforge/venv"
SITE = f"{VENV}/lib/python3.12/site-packages"


def listing() -> list[File]:
    return [
        File("/usr/local/cuda-13.0/lib64/libcublas.so.13.0.0", 500 << 20),
        File(f"{SITE}/nvidia/cu13/lib/libcublas.so.13.0.0", 500 << 20),  # base and venv: the same library
        File(f"{SITE}/nvidia/cu13/lib/libcublas_static.a", 300 << 20),
        File(f"{SITE}/torch/lib/libc10.so", 2 << 20),
        File(f"{SITE}/other/lib/libc10.so", 2 << 20),  # venv and venv
        File(f"{SITE}/torch/include/ATen/core/Tensor.h", 1 << 20),
        File(f"{SITE}/torch/__pycache__/__init__.cpython-312.pyc", 1 << 20),
        File(f"{SITE}/sympy/tests/test_x.py", 1 << 10),
        File("/usr/share/doc/git/changelog.gz", 100),
        File(f"{SITE}/torch/lib/small.so", 10),
        File(f"{SITE}/other/lib/small.so", 10),  # below the duplicate threshold: not listed
    ]


def test_find_records_are_split_on_nul_and_each_inode_counted_once():
    raw = b"10 1 /a/b c\0" + b"20 2 /a/new\nline\0" + b"10 1 /x/hardlink\0" + b"5 3 /bad\xff\0"
    files = parse_find(raw)
    assert [f.path for f in files] == ["/a/b c", "/a/new\nline",
                                       "/bad\\xff"]  # a space, a newline, non-UTF-8 kept whole
    assert sum(f.size for f in files) == 35


def test_top_directories_sum_the_files_below_each_at_a_depth():
    files = listing()
    d1 = dict(top_dirs(files, 1, 10))
    assert d1["/opt"] == sum(f.size for f in files if f.path.startswith("/opt/"))
    pkgs = dict(top_dirs(files, 1, 10, SITE))
    assert pkgs[f"{SITE}/nvidia"] == (500 + 300) << 20
    assert list(pkgs)[0] == f"{SITE}/nvidia"  # largest first
    assert dict(top_dirs(files, 2, 2)) and len(top_dirs(files, 2, 2)) == 2


def test_duplicates_name_the_side_of_each_copy_and_the_bytes_beyond_the_first():
    dups = duplicates(listing(), VENV)
    first = dups[0]
    assert first["name"] == "libcublas.so.13.0.0" and first["between"] == "base-venv" and first["extra"] == 500 << 20
    assert {d["name"]: d["between"] for d in dups} == {"libcublas.so.13.0.0": "base-venv", "libc10.so": "venv-venv"}


def test_build_leftovers_are_classed_headers_static_libraries_bytecode_tests_docs():
    cats = leftovers(listing())
    assert cats["static_libraries"] == {"bytes": 300 << 20, "files": 1}
    assert cats["headers"] == {"bytes": 1 << 20, "files": 1}
    assert cats["bytecode"]["files"] == 1 and cats["tests"]["files"] == 1 and cats["docs"]["files"] == 1


def test_docker_history_sizes_are_read():
    assert _bytes("1.2GB") == 1_200_000_000 and _bytes("512kB") == 512_000 and _bytes("0B") == 0 and _bytes("?") == 0


@pytest.mark.parametrize("image", ["--privileged", "-v/:/host", "", "a b", "x" * 300])
def test_an_image_that_could_be_read_as_an_option_never_reaches_docker(image):
    with pytest.raises(SystemExit, match="expected an image reference"):
        measure(image, 5)


def test_the_report_shows_a_path_with_a_control_character_escaped():
    from image_size import shown
    assert shown("/a/new\nline\x1b[2J") == "/a/new\\nline\\x1b[2J"
