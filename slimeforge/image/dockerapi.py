"""The one Docker Engine client (the Docker SDK) of build, publish and the wheel store, and what
they ask the engine together: the base image as FROM will name it (`resolve_base`), files read
out of an image without running it (`read_from_image`)."""

from __future__ import annotations

import tarfile
from dataclasses import dataclass
from io import BytesIO

from ..errors import ConfigError, OperationFailed, Problem, SlimeforgeError
from ..schema import printable
from .lock.lockfile import stack_ref
from .lock.remedies import remedy
from .stack import Stack


class EngineUnavailable(SlimeforgeError):
    """No Docker Engine answers here. A bare-metal install need not have one: it then compiles in
    place instead of using the compiled-wheel store (install.py)."""


def docker_client():
    """A client of the local engine; a clear error (not a traceback) when there is none."""
    import docker  # heavy: imported only when Docker is really used
    from docker.errors import DockerException

    try:
        return docker.from_env(timeout=600)
    except DockerException as exc:
        raise EngineUnavailable(f"docker engine: {exc}; is dockerd running, and DOCKER_HOST right?") from None


@dataclass(frozen=True)
class ResolvedBase:
    """The base image as FROM names it: the stack's (or --base-image's) reference, resolved."""

    image: str  # as the stack or --base-image names it
    from_ref: str  # what FROM names: repository@digest where the digest is known, else the tag
    digest: str | None  # the registry digest
    image_id: str | None  # the engine's id (a locally imported base has no registry digest)

    @property
    def id(self) -> str | None:
        """What identifies its content: the digest, else the local image id (compiled keys, labels)."""
        return self.digest or self.image_id

    def to_json(self) -> dict[str, str | None]:
        """As the input lock and the build report record it."""
        return {"image": self.image, "from": self.from_ref, "digest": self.digest, "image_id": self.image_id}


def resolve_base(stack: Stack, override: str | None, dry_run: bool, locked_digest: str | None = None) -> ResolvedBase:
    """The base as FROM will name it, with its digest (the stack's, else the lock's, else
    RepoDigests) or, for a locally imported image without one, its image id: either goes into the
    lock, so a changed base changes the hash."""
    image = override or stack.base.image
    if "@sha256:" in image:
        return ResolvedBase(image, image, image.split("@", 1)[1], None)
    digest = None if override else (stack.base.digest or locked_digest)
    if digest:
        repo = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
        return ResolvedBase(image, f"{repo}@{digest}", digest, None)
    import docker

    try:
        img = docker_client().images.get(image)
    except docker.errors.ImageNotFound:
        if dry_run:
            return ResolvedBase(image, image, None, None)
        fix = "pull it" if override else f"pull it, or record its digest: {remedy('base_digest', stack_ref(stack))}"
        raise ConfigError("base image", [Problem("--base-image" if override else "base.image",
                                                 f"is not present locally, and no digest of it is known ({fix})",
                                                 image)]) from None
    except docker.errors.DockerException as exc:
        raise EngineUnavailable(f"cannot reach the Docker Engine to inspect the base image {image}: {exc}") from None
    repo = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    for rd in img.attrs.get("RepoDigests") or []:
        name, _, digest = rd.partition("@")
        if name == repo or name.endswith("/" + repo):
            return ResolvedBase(image, f"{repo}@{digest}", digest, img.id)
    # A locally imported base has no registry digest: FROM keeps the tag, the lock records the id.
    return ResolvedBase(image, image, None, img.id)


READ_MAX_BYTES = 64 << 20  # a record read out of an image (the lock, the flag catalog): far below this


def read_from_image(client, image_id: str, paths: list[str], max_bytes: int = READ_MAX_BYTES) -> dict[str, bytes]:
    """Files copied out of an image without starting it (a created, never-run container). What the
    Engine streams back is read as input: at most `max_bytes` per file, a tar whose first member is
    a regular file of that name; anything else (not a tar, cut short, a link, the Engine failing
    midway) is an OperationFailed naming the image and the file, never a traceback. docker's
    NotFound (no such file in the image) passes through: callers read it as "absent"."""
    import docker

    out = {}
    container = client.containers.create(image_id, command=["true"])
    try:
        for p in paths:
            where = f"{p} in image {image_id[:19]}"
            chunks, _ = container.get_archive(p)
            out[p] = _one_file(chunks, where, max_bytes)
    except docker.errors.NotFound:
        raise
    except (docker.errors.DockerException, ConnectionError, OSError) as exc:
        raise OperationFailed(f"reading {paths} out of image {image_id[:19]}: the Docker Engine failed midway "
                              f"({type(exc).__name__}: {printable(str(exc))[:300]})") from None
    finally:
        try:
            container.remove(force=True)
        except docker.errors.DockerException:
            pass  # the engine went away: nothing more we can do about a created container here
    return out


def _one_file(chunks, where: str, max_bytes: int) -> bytes:
    import requests
    import urllib3

    buf, size = [], 0
    try:
        for chunk in chunks:
            size += len(chunk)
            if size > max_bytes + (1 << 20):  # the tar's headers and padding besides the file
                raise OperationFailed(f"{where}: the Engine sent over {max_bytes} bytes for one file")
            buf.append(chunk)
    except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
        raise OperationFailed(f"{where}: the Docker Engine's stream failed midway ({type(exc).__name__})") from None
    try:
        with tarfile.open(fileobj=BytesIO(b"".join(buf)), mode="r:") as tar:
            member = tar.next()
            if member is None or not member.isfile():
                raise OperationFailed(f"{where}: the Engine's archive holds no regular file "
                                      f"({'empty' if member is None else 'a link or directory'})")
            if member.size > max_bytes:
                raise OperationFailed(f"{where}: is {member.size} bytes, over {max_bytes}")
            fh = tar.extractfile(member)
            data = fh.read() if fh is not None else b""
            if len(data) != member.size:
                raise OperationFailed(f"{where}: the Engine's archive is cut short")
            return data
    except (tarfile.TarError, EOFError) as exc:
        raise OperationFailed(f"{where}: the Engine's answer is not a whole tar archive "
                              f"({printable(str(exc))[:200]})") from None
