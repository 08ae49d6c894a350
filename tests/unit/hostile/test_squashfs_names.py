"""--squashfs-dir: a file is the pinned image for its content, never for its name (issue 40).

Whatever sits at the digest's file name is used only when slimeforge imported it there and recorded
it (size, sha256, stat fingerprint, the image); nothing there means: import it. Anything else (an
empty file, a dangling symlink, a symlink to another squashfs, a directory, a FIFO, a socket, other
content, a recorded file changed since, a record of another image, a record that is not one) is
refused at plan time, exit 2, naming the path: no sbatch, no import over it, nothing of it touched."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from launch_support import Canned, make_recipe

from slimeforge.errors import ConfigError, OperationFailed
from slimeforge.run.recipecheck import parse_recipe
from slimeforge.run.targets import enroot, slurm, slurm_checks
from slimeforge.run.targets.base import ResolvedRun

HEX = "0123456789abcdef" * 4
IMAGE = f"reg.example/team/sf@sha256:{HEX}"
OTHER = f"reg.example/team/sf@sha256:{'f' * 64}"


def squashfs(size: int = 8192, fill: bytes = b"\x01") -> bytes:
    """A squashfs 4 superblock (magic, version 4, bytes_used = size) and a body."""
    head = b"hsqs" + bytes(24) + (4).to_bytes(2, "little") + bytes(10) + size.to_bytes(8, "little")
    return head.ljust(96, b"\0") + fill * (size - 96)


def setup(tmp_path: Path):
    shared = tmp_path / "shared"
    shared.mkdir()
    rec, stack = parse_recipe(make_recipe(tmp_path, num_gpus=2, mode="container", image=IMAGE), "test")
    run = ResolvedRun(rec, stack, (tmp_path / "run").resolve(), "(api)", {})
    target = slurm.SlurmTarget(slurm.Options(nodes=2, squashfs_dir=str(shared)), probe=Canned({("enroot",
                                                                                                "version"): "3.4.1\n"}))
    return shared, run, target, enroot.squashfs_file(str(shared), IMAGE)


def imported(sqsh: Path, image: str = IMAGE, content: bytes | None = None) -> None:
    """What slimeforge's import leaves: the file, linked in from its partial, and the record."""
    partial = sqsh.with_name(f".{sqsh.name}.tok.partial")
    partial.write_bytes(content or squashfs())
    enroot.record_import(partial, sqsh, image)
    assert not partial.exists()


def test_nothing_there_is_imported_and_a_recorded_import_is_reused(tmp_path):
    shared, run, target, sqsh = setup(tmp_path)
    assert [c.step for c in target.plan(run).commands] == ["enroot import", "sbatch"]
    imported(sqsh)
    rec = json.loads(enroot.record_path(sqsh).read_text())
    assert rec["image"] == IMAGE and rec["stat"]["size"] == 8192 and rec["sha256"].startswith("sha256:")
    plan = target.plan(run)
    assert [c.step for c in plan.commands] == ["sbatch"]
    assert slurm_checks.enroot_findings(run.recipe, plan.rundir.plan["slurm"], str(shared))[0].level == "ok"


def test_a_copied_directory_is_hashed_again_and_used(tmp_path):
    """Another inode (a copy, an rsync): the stat fingerprint differs, the sha256 is computed and matches."""
    shared, run, target, sqsh = setup(tmp_path)
    imported(sqsh)
    data = sqsh.read_bytes()
    sqsh.unlink()
    sqsh.write_bytes(data)
    assert enroot.squashfs_ready(sqsh, IMAGE) is True


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _socket(p: Path) -> None:
    # AF_UNIX paths are short (108 bytes): bind from inside the directory, by the file's name alone.
    here = os.getcwd()
    os.chdir(p.parent)
    try:
        s = socket.socket(socket.AF_UNIX)
        s.bind(p.name)
        s.close()
    finally:
        os.chdir(here)


def _other_squashfs(p: Path) -> None:
    other = p.with_name("other.sqsh")
    imported(other, OTHER)
    p.symlink_to(other)


def _rewritten_in_place(p: Path) -> None:
    """Same size, same mtime: only the content (and the kernel's ctime) changed."""
    imported(p)
    st = os.stat(p)
    with open(p, "r+b") as f:
        f.seek(4000)
        f.write(b"\x02" * 10)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))


def _truncated(p: Path) -> None:
    imported(p)
    os.truncate(p, 4096)


def _grown(p: Path) -> None:
    imported(p)
    with open(p, "ab") as f:
        f.write(b"x")


def _record_of_another_image(p: Path) -> None:
    imported(p, OTHER)


def _record_garbage(p: Path) -> None:
    p.write_bytes(squashfs())
    enroot.record_path(p).write_text("{not json")


def _record_a_fifo(p: Path) -> None:
    p.write_bytes(squashfs())
    os.mkfifo(enroot.record_path(p))


def _record_wrong_types(p: Path) -> None:
    imported(p)
    rec = json.loads(enroot.record_path(p).read_text())
    rec["stat"]["size"] = "8192"
    enroot.record_path(p).write_text(json.dumps(rec))


def _forged_record(p: Path) -> None:
    """Someone copies a record beside other content of the same size."""
    imported(p)
    rec = enroot.record_path(p).read_text()
    p.unlink()
    p.write_bytes(squashfs(fill=b"\x07"))
    enroot.record_path(p).write_text(rec)


def _record_a_symlink(p: Path) -> None:
    """A record that names this image, but beside another file, reached through a link."""
    other = p.with_name("other.sqsh")
    imported(other)
    p.write_bytes(squashfs())
    enroot.record_path(p).symlink_to(enroot.record_path(other))


CASES = {
    "empty file": (lambda p: p.write_bytes(b""), "did not import"),
    "other content": (lambda p: p.write_bytes(b"#!/bin/sh\necho hi\n"), "did not import"),
    "a real-looking squashfs with no record": (lambda p: p.write_bytes(squashfs()), "did not import"),
    "dangling symlink": (lambda p: p.symlink_to(p.with_name("gone.sqsh")), "is a symlink"),
    "symlink to another squashfs": (_other_squashfs, "is a symlink"),
    "directory": (lambda p: p.mkdir(), "is a directory"),
    "fifo": (_fifo, "is a FIFO"),
    "socket": (_socket, "is a socket"),
    "rewritten in place": (_rewritten_in_place, "changed since"),
    "truncated": (_truncated, "cut short"),
    "grown": (_grown, "changed since"),
    "record of another image": (_record_of_another_image, "not " + IMAGE),
    "record is not JSON": (_record_garbage, "record beside it that is not slimeforge's"),
    "record is a FIFO": (_record_a_fifo, "record beside it that is not slimeforge's"),
    "record of the wrong types": (_record_wrong_types, "record beside it that is not slimeforge's"),
    "record is a symlink to another's": (_record_a_symlink, "record beside it that is not slimeforge's"),
    "forged record beside other content": (_forged_record, "changed since"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_anything_else_at_the_name_is_refused_naming_it(tmp_path, case):
    shared, run, target, sqsh = setup(tmp_path)
    make, why = CASES[case]
    make(sqsh)
    before = sorted((p.name, os.lstat(p).st_ino) for p in shared.iterdir())
    with pytest.raises(ConfigError) as exc:
        target.plan(run)
    text = str(exc.value)
    assert str(sqsh) in text and why in text and "--squashfs-dir" in text, text
    assert sorted((p.name, os.lstat(p).st_ino) for p in shared.iterdir()) == before  # nothing of it touched


def test_an_import_that_wrote_no_squashfs_is_a_failed_import_and_leaves_nothing(tmp_path):
    shared, run, target, sqsh = setup(tmp_path)
    imp = target.plan(run).commands[0]

    class Importer(Canned):
        def run(self, argv, **kw):
            Path(argv[3]).write_bytes(b"<html>login</html>".ljust(4096))
            return super().run(argv, **kw)

    with pytest.raises(OperationFailed, match="is not a squashfs"):
        slurm.import_squashfs(imp, sqsh, Importer({("enroot", "import"): ""}), lambda s: None, IMAGE)
    assert sorted(p.name for p in shared.iterdir() if p.name != ".slimeforge.lock") == []


def test_an_import_that_lost_the_race_uses_the_other_only_when_it_is_recorded(tmp_path):
    shared, run, target, sqsh = setup(tmp_path)
    imp = target.plan(run).commands[0]

    class Importer(Canned):
        def run(self, argv, **kw):
            Path(argv[3]).write_bytes(squashfs())
            return super().run(argv, **kw)

    sqsh.write_bytes(squashfs())  # appeared meanwhile, unrecorded
    with pytest.raises(ConfigError, match="did not import"):
        slurm.import_squashfs(imp, sqsh, Importer({("enroot", "import"): ""}), lambda s: None, IMAGE)
    assert not any(p.name.endswith(".partial") for p in shared.iterdir())
    sqsh.unlink()
    imported(sqsh)  # another launch's complete, recorded import
    slurm.import_squashfs(imp, sqsh, Importer({("enroot", "import"): ""}), lambda s: None, IMAGE)
    assert enroot.squashfs_ready(sqsh, IMAGE)


def test_a_real_squashfs_is_read_and_a_cut_one_refused(tmp_path):
    """mksquashfs's output (what enroot import runs): its superblock passes; cut short, it is refused."""
    import shutil
    import subprocess

    if not shutil.which("mksquashfs"):
        pytest.skip("mksquashfs (squashfs-tools) is not installed")
    shared, run, target, sqsh = setup(tmp_path)
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "os-release").write_bytes(os.urandom(200_000))
    partial = shared / ".x.partial"
    subprocess.run(["mksquashfs", str(tree), str(partial), "-noappend", "-quiet", "-no-progress"], check=True,
                   capture_output=True)
    enroot.record_import(partial, sqsh, IMAGE)
    assert enroot.squashfs_ready(sqsh, IMAGE, rehash=True)
    data = sqsh.read_bytes()
    sqsh.unlink()
    sqsh.write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match="cut short"):
        enroot.squashfs_ready(sqsh, IMAGE)
