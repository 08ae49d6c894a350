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
imports the image once, on the login node, to DIR/<repo>+sha256-<hex>.sqsh (named by its digest:
a file that is there is the pinned image, so a later run pulls nothing) and points pyxis at the
file: one pull for every node and every run, instead of one per node.
"""

from __future__ import annotations

import re
from pathlib import Path

from ...errors import CommandError, ConfigError, Problem
from ...image.imageref import DOCKER_HUB, ImageRef, parse_image_ref
from ...proc import Runner

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
    said = re.sub(r"[\x00-\x1f\x7f]", "?", (r.stdout.strip() or r.stderr.strip())[:200])
    return (parse_version(r.stdout) if r.returncode == 0 else None), said or f"exit {r.returncode}"


def show(version: Version) -> str:
    return ".".join(map(str, version))


def reference(image: str, version: Version) -> str:
    """The --container-image value for `image` (a Docker reference) that this enroot reads as the
    same image; ConfigError when this enroot cannot name it (3.0 and a digest; older than 3.0)."""
    ref = parse_image_ref(image, "image")
    if version < OLDEST:
        raise ConfigError("image", [Problem("enroot", "is too old for pyxis image references", show(version), "enroot 3.0 or newer, or --mode host")])
    if version >= DOCKER_FORM and (ref.digest is None or ref.digest.startswith("sha256:")):
        return str(ImageRef(ref.registry, ref.repository, None if ref.digest else ref.tag, ref.digest))  # enroot 4 reads only sha256 here
    if ref.digest is not None and version < DIGEST_AS_TAG:
        raise ConfigError("image", [Problem("image", f"is pinned by digest, which enroot {show(version)} cannot pull (3.0 takes no ':' in a tag)", image,
                                            "enroot 3.1 or newer on the cluster, or --squashfs-dir DIR (imported where a newer enroot runs)")])
    # enroot 3 asks the registry named before '#' as it is (4 maps docker.io to registry-1.docker.io):
    # Docker Hub is its default when none is named.
    where = "" if ref.registry == DOCKER_HUB else f"{ref.registry}#"
    return f"{where}{ref.repository}" + (f":{ref.digest}" if ref.digest else f":{ref.tag}" if ref.tag else "")


def squashfs_problems(directory: object) -> list[Problem]:
    if not isinstance(directory, str) or not SQUASHFS_DIR_RE.fullmatch(directory) or "/../" in directory + "/" or "//" in directory:
        return [Problem("--squashfs-dir", "is not an absolute directory pyxis can read", directory,
                        "an absolute path on a filesystem every node mounts, of letters, digits and _ . / + - (no ',', ':', '..' or spaces)")]
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
