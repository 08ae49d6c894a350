"""Amazon ECR's control plane: login token, repository settings, what a tag points at.

The ECR API endpoint (boto3's `endpoint_url`, or AWS_ENDPOINT_URL_ECR which boto3 reads itself)
and the registry host that images are pushed to are separate inputs on purpose: against real ECR
the push host is the proxy endpoint that `get_authorization_token` returns, while tests point the
API at moto's server (which hosts no layers) and push to a local registry.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from ...schema import printable
from .registry import MANIFEST_TYPES, Credentials, RegistryAuthError, RegistryError, RegistryFailed, RemoteManifest

_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")

ECR_HOST_RE = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr(?:-fips)?\."
                         r"(?P<region>[a-z]{2}(?:-[a-z]+)+-\d)\.amazonaws\.com(?:\.cn)?$")
_AUTH_CODES = {"AccessDeniedException", "UnrecognizedClientException", "InvalidSignatureException",
               "ExpiredTokenException", "InvalidClientTokenId", "SignatureDoesNotMatch"}


@dataclass(frozen=True)
class EcrRegistry:
    host: str
    account: str
    region: str


@dataclass(frozen=True)
class RepositorySettings:
    """Applied when we create a repository; an existing repository's settings are left as they are."""

    tag_immutability: bool = True
    scan_on_push: bool = True


def parse_ecr_host(host: str) -> EcrRegistry | None:
    """The account and region of an ECR registry host, or None for any other registry."""
    m = ECR_HOST_RE.match(host)
    return EcrRegistry(host, m["account"], m["region"]) if m else None


def client(region: str, endpoint_url: str | None = None):
    """An ECR client; botocore's standard retry mode backs off on throttling and 5xx. Bounded
    waits: connecting 10 s, each read 60 s (every call of the control plane answers small)."""
    import boto3
    from botocore.config import Config

    return boto3.client("ecr", region_name=region, endpoint_url=endpoint_url or None,
                        config=Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=10,
                                      read_timeout=60))


def decode_token(token: str) -> Credentials:
    """`authorizationToken` is base64 of `AWS:<password>`; the pair is a registry login."""
    try:
        username, sep, password = base64.b64decode(token, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise RegistryError(f"ECR authorization token is not base64 of user:password ({exc})") from None
    if not sep or not username or not password:
        raise RegistryError("ECR authorization token does not decode to user:password")
    return Credentials(username, password, "an ECR authorization token (get_authorization_token)")


def login(ecr, registry: EcrRegistry) -> tuple[Credentials, str]:
    """The registry credentials and the host to push to (the token's proxy endpoint)."""
    reply = _call(ecr, "get_authorization_token", registry, registryIds=[registry.account])
    data = reply["authorizationData"][0]
    host = urllib.parse.urlparse(data["proxyEndpoint"]).netloc or data["proxyEndpoint"]
    return decode_token(data["authorizationToken"]), host


def ensure_repository(ecr, registry: EcrRegistry, name: str, settings: RepositorySettings,
                      echo: Callable[[str], None]) -> dict:
    """Describe the repository, creating it with `settings` when it does not exist."""
    from botocore.exceptions import ClientError

    try:
        repo = ecr.describe_repositories(registryId=registry.account, repositoryNames=[name])["repositories"][0]
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "RepositoryNotFoundException":
            raise _translate(exc, "describe_repositories", registry) from None
        repo = _call(ecr, "create_repository", registry, registryId=registry.account, repositoryName=name,
                     imageTagMutability="IMMUTABLE" if settings.tag_immutability else "MUTABLE",
                     imageScanningConfiguration={"scanOnPush": settings.scan_on_push})["repository"]
        echo(f"created ECR repository {name} ({_describe(repo)})")
        return repo
    except Exception as exc:
        raise _translate(exc, "describe_repositories", registry) from None
    echo(f"ECR repository {name} exists ({_describe(repo)})")
    return repo


def tag_is_immutable(repo: dict, tag: str) -> bool:
    mutability = repo.get("imageTagMutability", "MUTABLE")
    excluded = any(fnmatch.fnmatchcase(tag, f["filter"]) for f in repo.get("imageTagMutabilityExclusionFilters") or [])
    if mutability == "IMMUTABLE_WITH_EXCLUSION":
        return not excluded
    if mutability == "MUTABLE_WITH_EXCLUSION":
        return excluded
    return mutability == "IMMUTABLE"


def manifests(ecr, registry: EcrRegistry, name: str, tags: list[str]) -> dict[str, RemoteManifest]:
    """The manifest each of `tags` points at in the repository (tags with none are left out)."""
    reply = _call(ecr, "batch_get_image", registry, registryId=registry.account, repositoryName=name,
                  imageIds=[{"imageTag": t} for t in tags], acceptedMediaTypes=list(MANIFEST_TYPES))
    found: dict[str, RemoteManifest] = {}
    where = f"ECR {registry.host}/{name}: batch_get_image"
    images, failures = reply.get("images", []), reply.get("failures", [])
    if not (isinstance(images, list) and isinstance(failures, list)):
        raise RegistryError(f"{where}: answered without lists of images and failures")
    for image in images:
        # ECR's answer, read as input: each entry one of the tags asked for, once, with a manifest and its digest.
        ident = image.get("imageId") if isinstance(image, dict) else None
        tag = ident.get("imageTag") if isinstance(ident, dict) else None
        digest = ident.get("imageDigest") if isinstance(ident, dict) else None
        body = image.get("imageManifest") if isinstance(image, dict) else None
        kind = image.get("imageManifestMediaType", "") if isinstance(image, dict) else ""
        if (tag not in tags or tag in found or not isinstance(body, str)
                or not (isinstance(digest, str) and _DIGEST_RE.fullmatch(digest))):
            raise RegistryError(f"{where}: answered an entry that is not one of the tags asked for, once, with a "
                                f"manifest and its digest: {printable(repr(image))[:300]}")
        found[tag] = RemoteManifest.parse(body.encode(), digest, f"ECR {name}:{tag}",
                                          kind if isinstance(kind, str) else "")
    for failure in failures:
        code = failure.get("failureCode") if isinstance(failure, dict) else None
        if code not in ("ImageNotFound", "ImageTagDoesNotMatchDigest"):
            reason = failure.get("failureReason") if isinstance(failure, dict) else failure
            raise RegistryError(f"{where}: {printable(str(code))[:100]}: {printable(str(reason))[:300]}")
    return found


def confirm_digest(ecr, registry: EcrRegistry, name: str, tag: str, digest: str) -> None:
    """Raise unless ECR reports `tag` at `digest` (what we pushed is what it holds)."""
    reply = _call(ecr, "describe_images", registry, registryId=registry.account, repositoryName=name,
                  imageIds=[{"imageTag": tag}])
    details = reply.get("imageDetails", [])
    seen = ([d.get("imageDigest") if isinstance(d, dict) else d for d in details] if isinstance(details, list)
            else [details])
    if seen != [digest]:
        raise RegistryFailed(f"ECR {registry.host}/{name}:{tag}: describe_images reports "
                             f"{printable(repr(seen or 'no image'))[:300]}, "
                             f"but {digest} was pushed; nothing was recorded")


def _describe(repo: dict) -> str:
    scan = (repo.get("imageScanningConfiguration") or {}).get("scanOnPush", False)
    return f"tags {repo.get('imageTagMutability', 'MUTABLE').lower()}, scan on push {'on' if scan else 'off'}"


def _call(ecr, action: str, registry: EcrRegistry, **kwargs) -> dict:
    try:
        return getattr(ecr, action)(**kwargs)
    except Exception as exc:
        raise _translate(exc, action, registry) from None


def _translate(exc: Exception, action: str, registry: EcrRegistry) -> Exception:
    """botocore's exceptions, as messages that say which registry and what to check."""
    from botocore.exceptions import ClientError, NoCredentialsError, NoRegionError

    where = f"ECR {registry.host} (account {registry.account}, region {registry.region})"
    if isinstance(exc, NoCredentialsError | NoRegionError):
        return RegistryAuthError(f"{where}: {exc}: set AWS_PROFILE (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), "
                                 "or run `aws sso login`; check with `aws sts get-caller-identity`")
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        if code in _AUTH_CODES:
            return RegistryAuthError(f"{where}: {action} refused ({code}): check that the AWS identity shown by "
                                     f"`aws sts get-caller-identity` may call ecr:{_pascal(action)} on this registry")
        return RegistryError(f"{where}: {action} failed ({printable(str(code))[:100]}): "
                             f"{printable(str(exc.response.get('Error', {}).get('Message', exc)))[:500]}")
    if isinstance(exc, RegistryError):
        return exc
    return RegistryError(f"{where}: {action} failed: {type(exc).__name__}: {printable(str(exc))[:500]}")


def _pascal(action: str) -> str:
    return "".join(part.capitalize() for part in action.split("_"))
