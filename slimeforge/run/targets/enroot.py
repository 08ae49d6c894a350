"""The image reference pyxis hands to enroot, in the form the cluster's enroot reads, and the
one-pull alternative: the image imported once to a squashfs file on a shared path.

pyxis (`srun --container-image=VALUE`) takes VALUE as a squashfs file when it starts with '/' or
'.', and otherwise runs `enroot import docker://VALUE` on each node. What enroot reads there
depends on its major version (facts from enroot's `docker::_parse_uri`, src/docker.sh):

    enroot 3.1 - 3.x   docker://[USER@][REGISTRY#]IMAGE[:TAG]; TAG may hold ':' (3.0: it may not),
                       and is asked for as /v2/IMAGE/manifests/TAG, so a digest goes in as the tag:
                       REGISTRY#repo:sha256:<hex>. Without '#', the first component is not a
                       registry: REG/repo is looked up on Docker Hub.
    enroot 4.x         also Docker's own form, REGISTRY/IMAGE[:TAG][@sha256:<hex>] (a registry is
                       a first component with a '.' or a ':'), and REGISTRY#IMAGE@sha256:<hex>.

So the login node's `enroot version` decides the form (preflight reads it). `--squashfs-dir DIR`
imports the image once, on the login node, to DIR/<repo>+sha256-<hex>.sqsh (named by its digest,
and recorded beside it: a later run reuses the file only while it is the one slimeforge imported,
see `squashfs_ready`) and points pyxis at the file: one pull for every node and every run, instead
of one per node.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any, TypedDict

from ... import __version__, readback
from ...atomic import dir_lock, write_file
from ...errors import CommandError, ConfigError, OperationFailed, Problem
from ...image.imageref import DOCKER_HUB, ImageRef, parse_image_ref
from ...proc import Runner
from ...schema import printable

VERSION_RE = re.compile(r"([0-9]{1,3})\.([0-9]{1,3})(?:\.([0-9]{1,3}))?(?:[-+~][0-9A-Za-z.+~-]{1,64})?")
Version = tuple[int, int, int]
DOCKER_FORM = (4, 0, 0)  # from here on enroot reads REGISTRY/IMAGE@DIGEST
DIGEST_AS_TAG = (3, 1, 0)  # from here on a tag may hold ':' (so a digest fits in its place)
OLDEST = (3, 0, 0)
# A squashfs directory pyxis and enroot take as they are: absolute, no ',' or ':' (pyxis splits
# --container-mounts there), nothing a shell or Slurm reads as syntax.
SQUASHFS_DIR_RE = re.compile(r"/[A-Za-z0-9_./+-]{0,4000}")


def parse_version(text: str) -> Version | None:
    """`enroot version`'s answer ("3.4.1\\n") as (3, 4, 1); None when it is not a version."""
    if not isinstance(text, str) or len(text) > 80:
        return None
    m = VERSION_RE.fullmatch(text.strip())
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def read_version(runner: Runner) -> tuple[Version | None, str]:
    """`enroot version` on this node: (version, what it said); None when there is no enroot or no version."""
    try:
        r = runner.run(["enroot", "version"], step="enroot version", check=False, timeout=30)
    except CommandError as exc:
        return None, str(exc.output).strip()[-200:] or "enroot not found"
    said = printable((r.stdout.strip() or r.stderr.strip())[:200])
    return (parse_version(r.stdout) if r.returncode == 0 else None), said or f"exit {r.returncode}"


def show(version: Version) -> str:
    return ".".join(map(str, version))


def reference(image: str, version: Version) -> str:
    """The --container-image value for `image` (a Docker reference) that this enroot reads as the
    same image; ConfigError when this enroot cannot name it (3.0 and a digest; older than 3.0)."""
    ref = parse_image_ref(image, "image")
    if version < OLDEST:
        raise ConfigError("image", [Problem("enroot", "is too old for pyxis image references", show(version),
                                            "enroot 3.0 or newer, or --mode host")])
    if version >= DOCKER_FORM and (ref.digest is None or ref.digest.startswith("sha256:")):
        return str(ImageRef(ref.registry, ref.repository, None if ref.digest else ref.tag,
                            ref.digest))  # enroot 4 reads only sha256 here
    if ref.digest is not None and version < DIGEST_AS_TAG:
        raise ConfigError("image", [Problem("image",
                                            f"is pinned by digest, which enroot {show(version)} cannot pull (3.0 "
                                            "takes no ':' in a tag)", image,
                                            "enroot 3.1 or newer on the cluster, or --squashfs-dir DIR (imported "
                                            "where a newer enroot runs)")])
    # enroot 3 asks the registry named before '#' as it is (4 maps docker.io to registry-1.docker.io):
    # Docker Hub is its default when none is named.
    where = "" if ref.registry == DOCKER_HUB else f"{ref.registry}#"
    return f"{where}{ref.repository}" + (f":{ref.digest}" if ref.digest else f":{ref.tag}" if ref.tag else "")


def squashfs_problems(directory: object) -> list[Problem]:
    if (not isinstance(directory, str) or not SQUASHFS_DIR_RE.fullmatch(directory)
            or "/../" in directory + "/" or "//" in directory):
        return [Problem("--squashfs-dir", "is not an absolute directory pyxis can read", directory,
                        "an absolute path on a filesystem every node mounts, of letters, digits and _ . / + - (no "
                        "',', ':', '..' or spaces)")]
    return []


def squashfs_file(directory: str, image: str) -> Path:
    """Where the image's squashfs lives in `directory`: named by its digest (so a file that is
    there is this image). The image must be pinned: a tag would name whatever it points at today."""
    ref = parse_image_ref(image, "image", require_digest=True)
    assert ref.digest is not None
    algo, _, hexdigest = ref.digest.partition(":")
    return Path(directory) / f"{ref.repository.replace('/', '+')}+{algo}-{hexdigest}.sqsh"


def import_argv(image_ref: str, output: Path) -> list[str]:
    """`enroot import` of the reference (already in this enroot's form) to `output` (which must not exist)."""
    return ["enroot", "import", "--output", str(output), "--", f"docker://{image_ref}"]


def partial(sqsh: Path, token: str) -> Path:
    """Where `enroot import` writes before the file is complete: beside it, named by this launch."""
    return sqsh.with_name(f".{sqsh.name}.{token}.partial")


# --- the squashfs file: used for its content, never for its name -----------------------------------
# A file at the digest's name is the pinned image only when slimeforge imported it there and
# recorded it beside it (<file>.slimeforge.json: the image, size, sha256 and the file's stat
# fingerprint, written atomically once the import is in place). Anything else at that name (an empty
# file, a symlink, a directory, a FIFO, another image, a file changed since) is refused, naming it:
# pyxis would hand it to every node as this image. Hashing costs (sha256 ran at 775 MiB/s here:
# about 26 s for a 20 GB image, plus reading it from the shared filesystem), so the sha256 is
# computed again only when the stat fingerprint (size, mtime_ns, ctime_ns, inode, device) differs
# from the record's; ctime cannot be set back by a user, so a rewrite in place always changes it.
# The superblock is read every time: the magic 'hsqs', version 4, and bytes_used within the file.
SQUASHFS_MAGIC = b"hsqs"
SUPERBLOCK_BYTES = 96
RECORD_SUFFIX = ".slimeforge.json"
RECORD_MAX_BYTES = 4096
HASH_CHUNK = 4 << 20
_SHA256_RE = re.compile(r"sha256:[0-9a-f]{64}")
_STAT_KEYS = ("size", "mtime_ns", "ctime_ns", "ino", "dev")


def record_path(sqsh: Path) -> Path:
    return sqsh.with_name(sqsh.name + RECORD_SUFFIX)


def fingerprint(st: os.stat_result) -> dict[str, int]:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino,
            "dev": st.st_dev}


def _refused(sqsh: Path, why: str, fix: str | None = None) -> ConfigError:
    return ConfigError("--squashfs-dir", [Problem(str(sqsh), why, None, fix or (
        f"remove it (and {record_path(sqsh).name} beside it, if any): the next launch imports the image there again"),
                                                  show_value=False)])


def superblock_problem(fd: int, size: int) -> str | None:
    """Why the open file `fd` (of `size` bytes) is not a whole squashfs 4 image, or None."""
    head = os.pread(fd, SUPERBLOCK_BYTES, 0)
    if len(head) < SUPERBLOCK_BYTES:
        return f"is {size} bytes: too short for a squashfs"
    if head[:4] != SQUASHFS_MAGIC:
        return f"is not a squashfs (it starts with {head[:4]!r}, not {SQUASHFS_MAGIC!r})"
    major = int.from_bytes(head[28:30], "little")
    used = int.from_bytes(head[40:48], "little")
    if major != 4:
        return f"is a squashfs of version {major}, not 4 (what enroot writes)"
    if used > size:
        return f"is cut short: its superblock says {used} bytes, the file has {size}"
    return None


def file_sha256(fd: int) -> str:
    h = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, HASH_CHUNK, offset):
        h.update(chunk)
        offset += len(chunk)
    return "sha256:" + h.hexdigest()


def _open_regular(sqsh: Path) -> tuple[int, os.stat_result] | None:
    """The file at `sqsh` opened without following a link and without blocking on a FIFO: (fd,
    its stat); None when nothing is there; ConfigError naming what is there when it is no regular file."""
    try:
        st = os.lstat(sqsh)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _refused(sqsh, f"cannot be examined: {exc.strerror}", "a directory this user can read") from None
    if not stat.S_ISREG(st.st_mode):
        raise _refused(sqsh, f"is {_kind(st.st_mode)}, not the squashfs file slimeforge imported there")
    try:
        fd = os.open(sqsh, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _refused(sqsh, f"cannot be opened: {exc.strerror}") from None
    fst = os.fstat(fd)
    if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(fst.st_mode):
        os.close(fd)
        raise _refused(sqsh, "was replaced while it was being examined", "run again")
    return fd, fst


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO,
                                                                                    "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK,
                                                                                           "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _record_problem(doc: Any) -> str | None:
    if not isinstance(doc, dict):
        return "is not a JSON object"
    if not isinstance(doc.get("image"), str) or not (isinstance(doc.get("sha256"),
                                                                str) and _SHA256_RE.fullmatch(doc["sha256"])):
        return "lacks the image or its sha256"
    st = doc.get("stat")
    if not (isinstance(st, dict) and all(isinstance(st.get(k), int) and not isinstance(st.get(k),
                                                                                       bool) and st[k] >= 0 for k
                                         in _STAT_KEYS)):
        return f"lacks the file's stat fingerprint ({', '.join(_STAT_KEYS)})"
    return None


class ImportRecord(TypedDict):
    """What slimeforge records beside a squashfs it imported (_record_problem checks these keys)."""

    image: str
    sha256: str
    stat: dict[str, int]


def read_record(sqsh: Path) -> ImportRecord | None:
    """The import record beside `sqsh` (None when there is none); ConfigError when it is not one."""
    try:
        return readback.read_json(record_path(sqsh), record_path(sqsh).name,
                                  "the record slimeforge writes when it imports a squashfs",
                                 _record_problem, max_bytes=RECORD_MAX_BYTES)
    except readback.RecordError as exc:
        raise _refused(sqsh,
                       "has a record beside it that is not slimeforge's: "
                       f"{'; '.join(p.message for p in exc.problems)}") from None


def squashfs_ready(sqsh: Path, image: str, *, rehash: bool = False) -> bool:
    """Whether `sqsh` holds the pinned `image` as slimeforge imported it (True), or nothing is there
    (False: import it). Anything else at that name raises ConfigError (exit 2) naming it and what is there."""
    opened = _open_regular(sqsh)
    if opened is None:
        return False
    fd, st = opened
    try:
        rec = read_record(sqsh)
        if rec is None:
            raise _refused(sqsh, f"is a file slimeforge did not import (no record {record_path(sqsh).name} beside it): "
                                 "it cannot tell it is this image")
        if rec["image"] != image:
            raise _refused(sqsh, f"was recorded as the import of {printable(rec['image'])[:300]!r}, not {image}")
        if why := superblock_problem(fd, st.st_size):
            raise _refused(sqsh, why)
        if st.st_size != rec["stat"]["size"]:
            raise _refused(sqsh,
                           f"is {st.st_size} bytes, but slimeforge imported {rec['stat']['size']} bytes there: it "
                           "changed since")
        if rehash or fingerprint(st) != rec["stat"]:
            seen = file_sha256(fd)
            if seen != rec["sha256"]:
                raise _refused(sqsh,
                               f"has sha256 {seen}, not the {rec['sha256']} slimeforge imported: it changed since")
    finally:
        os.close(fd)
    return True


def record_import(partial: Path, sqsh: Path, image: str) -> None:
    """Put a complete import in place: `partial` (enroot's output) checked to be a whole squashfs,
    hashed, linked to `sqsh` (never over a file) and recorded. A file another launch put there
    meanwhile is used only when it passes `squashfs_ready`. The caller removes `partial` if it is left."""
    opened = _open_regular(partial)
    if opened is None:
        raise OperationFailed(f"enroot import wrote no file at {partial}")
    fd, st = opened
    try:
        if why := superblock_problem(fd, st.st_size):
            raise OperationFailed(f"enroot import of {image}: its output {partial} {why}")
        sha = file_sha256(fd)
    finally:
        os.close(fd)
    with dir_lock(sqsh.parent):  # one launch at a time links and records: no record describes another's file
        try:
            os.link(partial, sqsh)
        except FileExistsError:
            if squashfs_ready(sqsh, image, rehash=True):
                return
            raise _refused(sqsh, "appeared while importing and vanished again") from None
        partial.unlink()  # before the fingerprint: each link count change moves the inode's ctime
        placed = os.lstat(sqsh)
        if placed.st_ino != st.st_ino:
            raise _refused(sqsh, "is not the file just imported (replaced while being linked)", "run again")
        record = {"image": image, "sha256": sha, "stat": fingerprint(placed),
                  "imported_by": f"slimeforge {__version__}"}
        write_file(record_path(sqsh), json.dumps(record, indent=2) + "\n")
