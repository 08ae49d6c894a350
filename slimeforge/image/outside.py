"""Outside facts: what a lock records that no index holds, asked of where it lives.

    base_image_digest(image)   the digest the base image's tag points at, asked of its registry
    url_sha256(url)            the router wheel's sha256: the wheel downloaded once (size-bounded)
    patch_hashes(stack, ...)   the sha256 of each patch file, read from the pinned slime commit
"""

from __future__ import annotations

import hashlib
import urllib.request
from collections.abc import Callable
from pathlib import Path

from .. import paths
from ..errors import SlimeforgeError
from .lockfile import LockError
from .stack import Stack


def base_image_digest(image: str, echo: Callable[[str], None]) -> str | None:
    """The digest the base image's tag points at, asked of its registry (any OCI registry, Docker
    Hub included); None, with a warning, where the registry cannot be reached."""
    from .publish import docker_config_credentials
    from .registry import RegistryAPI, Retry, parse_image_ref

    ref = parse_image_ref(image, "base.image")
    if ref.digest:
        return ref.digest
    try:
        # Anonymous where the registry allows it (Docker Hub's public images); `docker login`'s where given.
        credentials = docker_config_credentials(ref.registry)
        api = RegistryAPI(ref.registry, credentials, retry=Retry(attempts=2), echo=echo, timeout=20)
        manifest = api.manifest(ref.repository, ref.tag or "latest")
    except (SlimeforgeError, OSError) as exc:
        echo(f"  base image {image}: its registry cannot be reached ({str(exc).splitlines()[0]}); "
             "the lock records no digest (set one with --base-digest sha256:...)")
        return None
    if manifest is None:
        raise LockError(f"base image {image}: its registry has no such tag")
    echo(f"  base image {image} -> {manifest.digest}")
    return manifest.digest


def patch_hashes(stack: Stack, local: dict, build_root: Path, echo: Callable[[str], None]) -> dict[str, str] | None:
    """sha256 of every patch file a step applies, read from the pinned source (a local checkout
    given with --source, else fetched); None, with a warning, where neither can be read."""
    if not stack.patches:
        return {}
    from .patches import read_patches

    try:
        contents = read_patches(stack, local, paths.sources_cache(build_root))
    except SlimeforgeError as exc:
        echo(f"  patches: cannot read them ({str(exc).splitlines()[0]}); the lock records no patch sha256 "
             f"(pass --source {stack.patches.from_source}=PATH)")
        return None
    return {p.file: p.sha256 for p in contents}


def url_sha256(url: str, echo: Callable[[str], None], limit: int = 512 << 20) -> str | None:
    """sha256 of a file by URL (streamed, bounded); None, with a warning, where it cannot be fetched."""
    digest = hashlib.sha256()
    size = 0
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 - the URL is a pinned https file
            while chunk := resp.read(1 << 20):
                size += len(chunk)
                if size > limit:
                    raise LockError(f"{url}: larger than {limit >> 20} MiB")
                digest.update(chunk)
    except (OSError, ValueError) as exc:
        echo(f"  {url}: cannot be fetched ({exc}); the lock records no sha256 (set one with --router-sha256)")
        return None
    return digest.hexdigest()
