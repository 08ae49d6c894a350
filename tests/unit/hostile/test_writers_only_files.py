"""Issue 40, writers that replace what is not a file: every writer of a path (SlimeRunner.to_yaml,
write_output for --out/--record, write_file and write_dir for run and build directories) refuses a
target that is not a regular file or a new name (a symlink such as one to /dev/stdout, a device
node, a FIFO, a directory, a link to nothing), naming it, and leaves it as it was."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from helpers import SEED_RECIPE

from slimeforge import atomic
from slimeforge.api import SlimeRunner
from slimeforge.errors import ConfigError


def make_target(tmp_path: Path, kind: str) -> Path:
    """A thing that is not a regular file, at tmp_path/target (a link's target: tmp_path/theirs)."""
    path = tmp_path / "target"
    theirs = tmp_path / "theirs"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        if os.geteuid() != 0:
            pytest.skip("a device node needs root")
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
    elif kind == "link to a file":
        theirs.write_text("theirs\n")
        path.symlink_to(theirs)
    elif kind == "link to /dev/stdout":
        path.symlink_to("/dev/stdout")
    elif kind == "link to nothing":
        path.symlink_to(tmp_path / "nothing")
    elif kind == "directory":
        path.mkdir()
        (path / "keep").write_text("keep\n")
    elif kind == "socket":
        import socket

        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    return path


def snapshot(tmp_path: Path) -> dict[str, tuple[int, str]]:
    out = {}
    for p in sorted(tmp_path.rglob("*")):
        st = os.lstat(p)
        body = p.read_text() if stat.S_ISREG(st.st_mode) else os.readlink(p) if stat.S_ISLNK(st.st_mode) else ""
        out[str(p.relative_to(tmp_path))] = (stat.S_IFMT(st.st_mode), body)
    return out


KINDS = ["fifo", "device", "link to a file", "link to /dev/stdout", "link to nothing", "directory", "socket"]


@pytest.mark.parametrize("kind", KINDS)
def test_to_yaml_refuses_what_is_not_a_file(tmp_path, kind):
    target = make_target(tmp_path, kind)
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError) as err:
        SlimeRunner(**SEED_RECIPE).to_yaml(target)
    assert "SlimeRunner.to_yaml" in str(err.value) and "path:" in str(err.value) and str(target) in str(err.value)
    assert snapshot(tmp_path) == before  # nothing replaced, nothing left behind


@pytest.mark.parametrize("kind", KINDS)
def test_write_file_and_write_dir_refuse_what_is_not_a_file(tmp_path, kind):
    target = make_target(tmp_path, kind)
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match="target"):
        atomic.write_file(target, "x\n")
    with pytest.raises(ConfigError, match="target"):
        atomic.write_dir(tmp_path, {"ok": "fine\n", "target": "x\n"})
    assert snapshot(tmp_path) == before  # all or nothing: `ok` was not written either


@pytest.mark.parametrize("kind", ["fifo", "link to nothing", "link to a file"])
def test_write_dir_refuses_a_directory_that_is_not_one(tmp_path, kind):
    if kind == "link to a file":
        (tmp_path / "theirs").write_text("theirs\n")
    target = make_target(tmp_path, kind)
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match="is not a directory"):
        atomic.write_dir(target, {"plan.json": "{}\n"})
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("kind", KINDS)
def test_write_output_refuses_what_is_not_a_file(tmp_path, kind):
    target = make_target(tmp_path, kind)
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match="--out"):
        atomic.write_output(target, "x\n")
    assert snapshot(tmp_path) == before


def test_a_regular_file_or_a_new_name_is_written(tmp_path):
    runner = SlimeRunner(**SEED_RECIPE)
    new = runner.to_yaml(tmp_path / "new.yaml")
    (tmp_path / "old.yaml").write_text("old\n")
    old = runner.to_yaml(tmp_path / "old.yaml")
    assert new.read_text() == old.read_text() != "old\n"
    atomic.write_dir(tmp_path / "run", {"plan.json": "{}\n"})
    atomic.write_dir(tmp_path / "run", {"plan.json": "{\"a\": 1}\n"})
    assert (tmp_path / "run" / "plan.json").read_text() == "{\"a\": 1}\n"
    # A run directory reached through a link to a directory is written into (the link is kept).
    (tmp_path / "link").symlink_to(tmp_path / "run")
    atomic.write_dir(tmp_path / "link", {"more": "m\n"})
    assert (tmp_path / "link").is_symlink() and (tmp_path / "run" / "more").read_text() == "m\n"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["a", "w", "ab"])
def test_a_log_is_opened_only_as_a_regular_file(tmp_path, kind, mode):
    """build.log, a started process's log: never written through a planted link (its target truncated),
    never a FIFO (a hang without a reader) or a device."""
    target = make_target(tmp_path, kind)
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError, match="target"):
        atomic.open_log(target, mode).close()
    assert snapshot(tmp_path) == before


def test_a_log_that_is_a_regular_file_is_appended_or_replaced(tmp_path):
    log = tmp_path / "build.log"
    with atomic.open_log(log, "w") as fh:
        fh.write("one\n")
    with atomic.open_log(log, "a") as fh:
        fh.write("two\n")
    assert log.read_text() == "one\ntwo\n"
    with atomic.open_log(log, "w") as fh:
        fh.write("three\n")
    assert log.read_text() == "three\n"


def test_a_started_process_never_writes_through_a_planted_link(tmp_path):
    from slimeforge.proc import Runner

    (tmp_path / "theirs").write_text("theirs\n")
    (tmp_path / "job.log").symlink_to(tmp_path / "theirs")
    with pytest.raises(ConfigError, match="symlink"):
        Runner().start(["echo", "hi"], log=tmp_path / "job.log")
    assert (tmp_path / "theirs").read_text() == "theirs\n"
