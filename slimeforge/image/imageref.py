"""OCI image references: the one grammar of an image name, tag and digest (what Docker accepts).

`parse_image_ref` (`.pinned`) and `image_ref_problems` are what a recipe, a stack or a cluster
bootstrap uses to refuse an image that is not valid or not pinned by digest; build, publish and the
wheel store read tags and hosts through `TAG_RE` and `DOMAIN_RE` here. Only `re`: importing this
module stays cheap (a dry run without --image never imports the registry client).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..errors import ConfigError, Problem

# The grammar of github.com/distribution/reference (what Docker accepts), written out.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY_RE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
DOMAIN_RE = re.compile(rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[a-fA-F0-9:]+\])(?::[0-9]{{1,5}})?")
TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# Content addresses we accept for pinning: the OCI image spec's registered algorithms.
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128}")
DOCKER_HUB = "docker.io"
_ACCEPTED = "[registry[:port]/]name[:tag][@sha256:<64 hex>], name in lowercase letters, digits and . _ - /"


@dataclass(frozen=True)
class ImageRef:
    """A parsed image reference; `registry` is always explicit (docker.io when none was given)."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.repository}"

    @property
    def pinned(self) -> bool:
        """True when the reference names content (a digest), not a tag that can move."""
        return self.digest is not None

    def with_digest(self, digest: str) -> ImageRef:
        """The pinned form, `registry/repository@digest`, that a recipe or host should use."""
        return replace(self, tag=None, digest=digest)

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


def image_ref_problems(text: object, where: str = "image", require_digest: bool = False) -> list[Problem]:
    """Everything wrong with `text` as an image reference (empty when it is valid)."""
    if not isinstance(text, str) or not text.strip() or len(text) > 512:
        return [Problem(where, "must be an image reference", text, _ACCEPTED)]
    try:
        ref = _parse(text)
    except ValueError as exc:
        return [Problem(where, str(exc), text, _ACCEPTED)]
    if require_digest and not ref.pinned:
        return [Problem(where, "must be pinned by digest (a tag can be moved to other content)", text,
                        f"{ref.name}@sha256:<64 hex>, e.g. the `digest` that `invoke publish` printed")]
    return []


def repository_problems(text: object, where: str = "--repository") -> list[Problem]:
    """Everything wrong with `text` as a repository to tag into, `[registry[:port]/]name`: the
    reference grammar, without a tag or digest."""
    problems = image_ref_problems(text, where)
    if not problems and (_parse(str(text)).tag or _parse(str(text)).digest):
        problems = [Problem(where, "names a tag or digest; a repository has neither", text,
                            "[registry[:port]/]name, e.g. slimeforge/cu13")]
    return problems


def parse_image_ref(text: str, where: str = "image", require_digest: bool = False) -> ImageRef:
    """Parse and validate an image reference, or raise ConfigError naming `where`."""
    problems = image_ref_problems(text, where, require_digest)
    if problems:
        raise ConfigError(where, problems)
    return _parse(text)


def split_registry(text: str) -> tuple[str | None, str]:
    """Split `host[:port]/path` into host and path the way Docker does: the first of several
    components is a registry host only if it has a dot or a port, or is localhost."""
    first, sep, rest = text.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        return first, rest
    return None, text


def _parse(text: str) -> ImageRef:
    rest, digest = text, None
    if "@" in rest:
        rest, digest = rest.rsplit("@", 1)
        if not _DIGEST_RE.fullmatch(digest):
            raise ValueError(f"digest {digest!r} is not sha256:<64 lowercase hex> (or sha512:<128>)")
    name, tag = rest, None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = rest.rsplit(":", 1)
        if not TAG_RE.fullmatch(tag):
            raise ValueError(f"tag {tag!r} is not valid (letters, digits, _ . -, at most 128, not starting with . or "
                             "-)")
    registry, repository = split_registry(name)
    if registry is None:
        registry = DOCKER_HUB
        if "/" not in repository:
            repository = f"library/{repository}"
    elif not DOMAIN_RE.fullmatch(registry):
        raise ValueError(f"registry host {registry!r} is not a valid host[:port]")
    if not repository:
        raise ValueError("names a registry but no repository")
    if not _REPOSITORY_RE.fullmatch(repository):
        hint = " (repository names must be lowercase)" if repository != repository.lower() else ""
        raise ValueError(f"repository {repository!r} is not valid{hint}")
    if len(f"{registry}/{repository}") > 255:
        raise ValueError("name is longer than 255 characters")
    return ImageRef(registry, repository, tag, digest)
