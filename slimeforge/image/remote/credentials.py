"""The login `docker login` stored for a registry: what publish, the wheel store, the lock's base
digest and a build's base pull use when no credentials are given.

In: a registry host. Out: its Credentials from the docker config file or credential helper, or None.
"""

from __future__ import annotations

from .registry import Credentials, RegistryAuthError


def docker_config_credentials(registry: str) -> Credentials | None:
    """The login `docker login` stored for `registry` (config file or credential helper), if any."""
    from docker import auth
    from docker.errors import DockerException

    try:
        found = auth.load_config().resolve_authconfig(registry)
    except DockerException as exc:
        raise RegistryAuthError(f"registry {registry}: the docker credential helper failed: {exc}") from None
    if not found:
        return None
    username = found.get("username") or found.get("Username")
    password = found.get("password") or found.get("Password")
    return Credentials(username, password, "the docker config") if username and password else None
