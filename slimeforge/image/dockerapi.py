"""The one Docker Engine client (the Docker SDK) of build, publish and the wheel store."""

from __future__ import annotations

from ..errors import SlimeforgeError


def docker_client():
    """A client of the local engine; a clear error (not a traceback) when there is none."""
    import docker  # heavy: imported only when Docker is really used
    from docker.errors import DockerException

    try:
        return docker.from_env(timeout=600)
    except DockerException as exc:
        raise SlimeforgeError(f"docker engine: {exc}; is dockerd running, and DOCKER_HOST right?") from None
