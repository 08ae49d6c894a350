"""The one Docker Engine client (the Docker SDK) of build, publish and the wheel store, and what
they ask the engine together: the base image as FROM will name it (`resolve_base`)."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError, Problem, SlimeforgeError
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


def resolve_base(stack: Stack, override: str | None, dry_run: bool, locked_digest: str | None = None) -> dict[str, Any]:
    """The base as FROM will name it, with its digest (the stack's, else the lock's, else
    RepoDigests) or, for a locally imported image without one, its image id: either goes into the
    lock, so a changed base changes the hash."""
    image = override or stack.base.image
    if "@sha256:" in image:
        return {"image": image, "from": image, "digest": image.split("@", 1)[1], "image_id": None}
    digest = None if override else (stack.base.digest or locked_digest)
    if digest:
        repo = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
        return {"image": image, "from": f"{repo}@{digest}", "digest": digest, "image_id": None}
    import docker

    try:
        img = docker_client().images.get(image)
    except docker.errors.ImageNotFound:
        if dry_run:
            return {"image": image, "from": image, "digest": None, "image_id": None}
        raise ConfigError("base image", [Problem("--base-image" if override else "base.image", "is not present locally (pull it, "
                                                 "or pin base.digest in the stack)", image)]) from None
    except docker.errors.DockerException as exc:
        raise EngineUnavailable(f"cannot reach the Docker Engine to inspect the base image {image}: {exc}") from None
    repo = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    for rd in img.attrs.get("RepoDigests") or []:
        name, _, digest = rd.partition("@")
        if name == repo or name.endswith("/" + repo):
            return {"image": image, "from": f"{repo}@{digest}", "digest": digest, "image_id": img.id}
    # A locally imported base has no registry digest: FROM keeps the tag, the lock records the id.
    return {"image": image, "from": image, "digest": None, "image_id": img.id}
