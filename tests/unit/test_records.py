"""The one reader for records and the one writer for output paths."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest

from slimeforge import atomic, readback
from slimeforge.errors import ConfigError

PATTERN = re.compile(r"[0-9]{1,5}")


def read(path: Path, **kw) -> str | None:
    return readback.read_text(path, "a_record", PATTERN, "digits", **kw)


def test_a_good_record_and_a_missing_one(tmp_path):
    (tmp_path / "r").write_text("42\n")
    assert read(tmp_path / "r") == "42"
    assert read(tmp_path / "none") is None


@pytest.mark.parametrize("content,message", [(b"42; rm -rf /\n", "is not a record slimeforge writes"), (b"\xff\xfe42",
                                                                                                        "is not UTF-8"),
                                              (b"4" * 5000, "larger than a file of this kind holds"), (b"42\n\n",
                                                                                                       "is not a "
                                                                                                       "record"),
                                              (b"--help", "is not a record")])
def test_bad_contents_name_the_file(tmp_path, content, message):
    (tmp_path / "r").write_bytes(content)
    with pytest.raises(readback.RecordError) as err:
        read(tmp_path / "r")
    assert str(err.value).startswith(f"{tmp_path / 'r'}: 1 problem(s):") and message in str(err.value)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "r")
    result = []
    t = threading.Thread(target=lambda: result.append(pytest.raises(readback.RecordError, read, tmp_path / "r")),
                         daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive() and "FIFO" in str(result[0].value)


@pytest.mark.parametrize("make,kind", [(lambda p: p.mkdir(), "a directory"), (lambda p: p.symlink_to("/dev/zero"),
                                                                              "a symlink"),
                                       (lambda p: p.symlink_to(p.parent / "real"), "a symlink")])
def test_directories_and_symlinks_are_refused(tmp_path, make, kind):
    (tmp_path / "real").write_text("7\n")
    make(tmp_path / "r")
    with pytest.raises(readback.RecordError, match=kind):
        read(tmp_path / "r")


def test_symlinks_are_followed_only_when_asked_and_never_to_a_device(tmp_path):
    (tmp_path / "real").write_text("7\n")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert read(tmp_path / "link", follow_symlinks=True) == "7"
    (tmp_path / "zero").symlink_to("/dev/zero")
    with pytest.raises(readback.RecordError, match="character device"):
        read(tmp_path / "zero", follow_symlinks=True)


def test_json_records_are_held_to_their_check(tmp_path):
    (tmp_path / "j").write_text('{"a": 1}')
    assert readback.read_json(tmp_path / "j", "j", "an object with a") == {"a": 1}
    with pytest.raises(readback.RecordError, match="lacks b"):
        readback.read_json(tmp_path / "j", "j", "an object with b", lambda d: None if "b" in d else "lacks b")
    (tmp_path / "j").write_text("[" * 100000)
    with pytest.raises(readback.RecordError, match="nests deeper than 32 levels"):
        readback.read_json(tmp_path / "j", "j", "json")
    (tmp_path / "j").write_text('{"a": "[[[[' + "[" * 100 + '"}')  # brackets inside a string do not nest
    assert readback.read_json(tmp_path / "j", "j", "json") == {"a": "[" * 104}
    (tmp_path / "j").write_text("{not json")
    with pytest.raises(readback.RecordError, match="is not JSON"):
        readback.read_json(tmp_path / "j", "j", "json")


# --- the writer -------------------------------------------------------------------------------------


def test_write_output_replaces_a_regular_file_atomically_and_keeps_its_mode(tmp_path):
    out = tmp_path / "o.json"
    out.write_text("old")
    out.chmod(0o640)
    atomic.write_output(out, "new")
    assert out.read_text() == "new" and (out.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.json"]  # no temporary left behind


@pytest.mark.parametrize("make,message", [
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: p.symlink_to("/dev/null"), "is a symlink"),
    (lambda p: p.symlink_to(p.parent / "target"), "is a symlink"),
])
def test_write_output_refuses_what_is_not_a_regular_file(tmp_path, make, message):
    (tmp_path / "target").write_text("keep")
    make(tmp_path / "o")
    before = os.lstat(tmp_path / "o")
    with pytest.raises(ConfigError, match=message):
        atomic.write_output(tmp_path / "o", "new", where="--out")
    after = os.lstat(tmp_path / "o")
    assert (before.st_ino, before.st_mode) == (after.st_ino,
                                               after.st_mode) and (tmp_path / "target").read_text() == "keep"


def test_write_output_follows_a_symlink_to_a_file_when_asked(tmp_path):
    (tmp_path / "target").write_text("old")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    atomic.write_output(tmp_path / "link", "new", follow_symlinks=True)
    assert (tmp_path / "link").is_symlink() and (tmp_path / "target").read_text() == "new"
    (tmp_path / "dev").symlink_to("/dev/null")
    with pytest.raises(ConfigError, match="only a regular file is replaced"):
        atomic.write_output(tmp_path / "dev", "x", follow_symlinks=True)


def test_dev_null_is_never_replaced():
    """As root, `flags.catalog --out /dev/null` used to replace /dev/null with a regular file."""
    before = os.stat("/dev/null")
    with pytest.raises(ConfigError, match="not a regular file"):
        atomic.write_output("/dev/null", "x")
    assert os.stat("/dev/null").st_ino == before.st_ino


def test_flags_catalog_out_dev_null_is_refused_before_anything_runs(tmp_path):
    import sys

    from slimeforge.proc import Runner
    from slimeforge.run.flagcatalog import make_catalog

    (tmp_path / "slime" / "slime").mkdir(parents=True)
    runner = Runner(dry_run=True)
    with pytest.raises(ConfigError) as err:
        make_catalog(sys.executable, tmp_path / "slime", None, "/dev/null", runner=runner)
    assert any(p.where == "--out" and "not a regular file" in p.message for p in err.value.problems)
    assert runner.history == []  # refused before the script ran
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="is a symlink"):
        make_catalog(sys.executable, tmp_path / "slime", None, tmp_path / "link", runner=runner)


def test_publish_record_that_is_a_symlink_or_device_is_refused_in_the_plan(tmp_path):
    from slimeforge.image.publish import publish as pub

    (tmp_path / "link").symlink_to(tmp_path / "target")
    for record in ("/dev/null", str(tmp_path / "link"), str(tmp_path)):
        opts = pub.PublishOptions(image="sf-test:1", registry="localhost:5000/sf", record=record)
        with pytest.raises(ConfigError) as err:
            pub.plan(opts)
        assert any(p.where == "--record" for p in err.value.problems), str(err.value)


def test_json_from_outside_a_file_is_bounded_in_depth_too():
    """A Jobs API answer or a tool's output (readback.json_loads): deep nesting is a ValueError, as
    bad JSON is, never a RecursionError that the callers' `except ValueError` would let through."""
    assert readback.json_loads(b'{"a": [1, {"b": "[[[["}]}') == {"a": [1, {"b": "[[[["}]}
    for text in ("[" * 100_000, "[" * 900 + "]" * 900, b"\xff"):
        with pytest.raises(ValueError):
            readback.json_loads(text)
