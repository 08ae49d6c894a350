"""Publishing: push a built image to a registry or Amazon ECR, verify it by digest, record it.

Users run one image on many hosts and pin it by digest, so a publish is only recorded once the
registry itself reports, for every tag, a manifest whose config is the image that was built
(the config digest is the local image ID). The same check before pushing makes re-publishing an
unchanged image a no-op, and lets ECR refuse to move an immutable tag before anything is sent.

    plan(PublishOptions(...))  validates every option and reads the build report; no side effects
    describe(plan)             the dry run's lines
    publish(plan, credentials) tags, pushes, verifies and records; returns the record

A gzip push goes through the Docker Engine (push.py), a zstd one through the registry API
(layerpush.py); the stored `docker login` is remote/credentials.py's.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from ... import paths, readback
from ...atomic import output_problem, write_dir, write_output
from ...errors import ConfigError, Problem, SlimeforgeError
from ...schema import printable
from .. import dockerapi
from ..imageref import DOCKER_HUB, DOMAIN_RE, TAG_RE, ImageRef, image_ref_problems, parse_image_ref, split_registry
from ..remote import ecr as ecr_api
from ..remote.credentials import docker_config_credentials
from ..remote.hosts import DOCKER_CERTS_DIR, daemon_insecure_registries
from ..remote.registry import (
    Credentials,
    RegistryAPI,
    RemoteManifest,
    Retry,
)
from .layerpush import COMPRESSION_RE, COMPRESSIONS
from .push import PublishError, PushFailed, push_tag

REPORT, LOCK, RECORD = paths.BUILD_REPORT, paths.STACK_LOCK, "publish.json"
REPORT_KEYS = {"tag": str, "human_tags": list, "image_id": str}
_FLAVOR_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_IMAGE_ID_RE = re.compile(r"sha256:[0-9a-f]{64}|[0-9a-f]{12,64}")
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


# --- what to publish, and where ---------------------------------------------------------------


@dataclass
class PublishOptions:
    """The command line's options, as given (validated by `plan`)."""

    cuda: str | None = None
    image: str | None = None
    registry: str | None = None
    build_dir: str | None = None
    tags: list[str] = field(default_factory=list)
    record: str | None = None
    username: str | None = None
    password_stdin: bool = False
    password_env: str | None = None
    ecr_endpoint: str | None = None
    ecr_push_host: str | None = None
    tag_immutability: bool = True
    scan_on_push: bool = True
    compression: str = "gzip"  # of the layers: gzip (the Docker Engine's push) or zstd (layerpush.py)


@dataclass(frozen=True)
class LocalImage:
    """The local image: `image` is the reference pushed from; `image_id` what the build recorded."""

    image: str
    repository: str
    tags: list[str]
    image_id: str | None = None
    build_dir: Path | None = None
    flavor: str | None = None


@dataclass(frozen=True)
class EcrTarget:
    registry: ecr_api.EcrRegistry
    endpoint: str | None  # None: boto3's default, or AWS_ENDPOINT_URL_ECR, which boto3 reads itself
    push_host: str | None  # None: the proxy endpoint ECR's login token names
    settings: ecr_api.RepositorySettings


@dataclass(frozen=True)
class Plan:
    source: LocalImage
    registry: str
    repository: str
    record: Path | None = None  # for --image; a build's record goes into its directory
    ecr: EcrTarget | None = None
    password_from: str | None = None  # "stdin" or "env:NAME"; the password itself is read later
    username: str | None = None
    compression: str = "gzip"


def plan(opts: PublishOptions, environ: Mapping[str, str] = os.environ, build_root: Path = paths.BUILDS) -> Plan:
    """Validate every option together, read the build report; raise ConfigError listing all problems."""
    problems: list[Problem] = []
    if bool(opts.cuda) == bool(opts.image):
        problems.append(Problem("--cuda/--image", "give exactly one: --cuda FLAVOR (a build of this checkout) "
                                "or --image REF (any local image)", {"cuda": opts.cuda, "image": opts.image}))
    if opts.image and opts.build_dir:
        problems.append(Problem("--build-dir", "only applies with --cuda", opts.build_dir))
    if opts.cuda and opts.record:
        problems.append(Problem("--record", "only applies with --image; a build's record goes into its build directory "
                                "(publish.json)", opts.record))
    if opts.record and (why := output_problem(opts.record)):
        problems.append(Problem("--record", why, opts.record,
                                "a new file in an existing directory, or a regular file to replace"))
    if opts.cuda and opts.tags:
        problems.append(Problem("--tag", "only applies with --image; a build is pushed with its content-addressed "
                                "and human tags", opts.tags))
    if not (isinstance(opts.compression, str) and COMPRESSION_RE.fullmatch(opts.compression)):
        problems.append(Problem("--compression", "is not a layer compression slimeforge pushes", opts.compression,
                                " or ".join(COMPRESSIONS) + " (gzip: every runtime reads it; zstd: docs/publish.md "
                                                            "says which do)"))
    for tag in opts.tags:
        if not TAG_RE.fullmatch(tag):
            problems.append(Problem("--tag", "is not a valid tag", tag,
                                    "letters, digits, _ . -, at most 128 characters"))

    registry, repository = None, None
    if not opts.registry:
        problems.append(Problem("--registry", "is required", None,
                                "REGISTRY[/REPOSITORY], e.g. registry.example.com:5000/team/slime "
                                "or 123456789012.dkr.ecr.us-east-1.amazonaws.com/slime"))
    else:
        registry, repository = _destination(opts.registry, problems)
    ecr = _ecr_target(opts, registry, problems)

    password_from = None
    if opts.password_stdin and opts.password_env:
        problems.append(Problem("--password-stdin/--password-env", "give one password source, not both", None,
                                show_value=False))
    elif opts.password_stdin:
        password_from = "stdin"
    elif opts.password_env:
        password_from = f"env:{opts.password_env}"
        if not environ.get(opts.password_env):
            problems.append(Problem("--password-env", "names an environment variable that is not set or empty",
                                    opts.password_env))
    if opts.username and not password_from:
        problems.append(Problem("--username", "needs a password: --password-stdin (piped in) or --password-env NAME "
                                "(never on the command line)", opts.username))
    if password_from and not opts.username:
        problems.append(Problem("--username", "is required with --password-stdin/--password-env", None))
    if ecr and opts.username:
        problems.append(Problem("--username", "does not apply to ECR: the login comes from your AWS credentials "
                                "(get_authorization_token)", opts.username))

    source = None
    if opts.cuda:
        source = _build_source(opts.cuda, Path(opts.build_dir) if opts.build_dir else None, build_root, problems)
    elif opts.image:
        source = _image_source(opts.image, opts.tags, problems)
    if source and registry and not (repository or source.repository):
        problems.append(Problem("--registry", "needs a repository when --image is an image ID", opts.registry,
                                "REGISTRY/REPOSITORY"))
    if problems:
        raise ConfigError("invoke publish", problems)
    assert source is not None and registry is not None
    return Plan(source, registry, repository or source.repository, Path(opts.record) if opts.record else None,
                ecr, password_from, opts.username, opts.compression)


def _destination(text: str, problems: list[Problem]) -> tuple[str | None, str | None]:
    """`REGISTRY` or `REGISTRY/REPOSITORY`; a bare registry takes the source's repository name."""
    where, accepted = "--registry", ("REGISTRY[/REPOSITORY] without a tag or digest, e.g. "
                                    "registry.example.com:5000/team/slime")
    if "://" in text:
        problems.append(Problem(where, "give a host, not a URL", text, accepted))
        return None, None
    if "/" not in text:
        if not (("." in text or ":" in text or text == "localhost") and DOMAIN_RE.fullmatch(text)):
            problems.append(Problem(where, "is not a registry host (a host has a dot or a port, or is localhost)",
                                    text, accepted))
            return None, None
        return text, None
    host, _ = split_registry(text)
    name = text if host else f"docker.io/{text}"
    found = image_ref_problems(name, where)
    if found:
        problems.extend(found)
        return None, None
    ref = parse_image_ref(name, where)
    if ref.tag or ref.digest:
        problems.append(Problem(where, "names a tag or digest; tags come from the build (or --tag with --image)", text,
                                accepted))
        return None, None
    return ref.registry, ref.repository


def _ecr_target(opts: PublishOptions, registry: str | None, problems: list[Problem]) -> EcrTarget | None:
    ecr_registry = ecr_api.parse_ecr_host(registry) if registry else None
    if not ecr_registry:
        for name, value in (("--ecr-endpoint", opts.ecr_endpoint), ("--ecr-push-host", opts.ecr_push_host)):
            if value:
                problems.append(Problem(name,
                                        "only applies to an ECR registry "
                                        "(<account>.dkr.ecr.<region>.amazonaws.com)", value))
        return None
    if opts.ecr_endpoint and not re.fullmatch(r"https?://[A-Za-z0-9.-]+(?::[0-9]{1,5})?/?", opts.ecr_endpoint):
        problems.append(Problem("--ecr-endpoint", "is not an http(s) URL", opts.ecr_endpoint, "e.g. http://127.0.0.1:5000"))
    if opts.ecr_push_host and not DOMAIN_RE.fullmatch(opts.ecr_push_host):
        problems.append(Problem("--ecr-push-host", "is not a registry host[:port]", opts.ecr_push_host))
    return EcrTarget(ecr_registry, opts.ecr_endpoint, opts.ecr_push_host,
                     ecr_api.RepositorySettings(opts.tag_immutability, opts.scan_on_push))


def find_build_dir(flavor: str, build_dir: Path | None = None, build_root: Path = paths.BUILDS) -> Path | None:
    """`build_dir` itself if it holds a report, else the newest `<flavor>-*` build under it (or build/)."""
    if build_dir and (build_dir / REPORT).is_file():
        return build_dir
    builds = paths.local_builds(build_dir or build_root, flavor)
    return builds[0] if builds else None


def _build_source(flavor: str, build_dir: Path | None, build_root: Path, problems: list[Problem]) -> LocalImage | None:
    if not _FLAVOR_RE.fullmatch(flavor):
        problems.append(Problem("--cuda", "is not a stack flavor name", flavor, "cu13, cu129"))
        return None
    found = find_build_dir(flavor, build_dir, build_root)
    if found is None:
        problems.append(Problem("--cuda", f"no build of this flavor under {build_dir or build_root}/: "
                                f"run invoke build --cuda {flavor} first", flavor))
        return None
    report_path = found / REPORT
    try:
        report = readback.read_json(report_path, REPORT, "the build report `invoke build` writes",
                                   lambda doc: None if isinstance(doc, dict) else "is not a JSON object")
    except readback.RecordError as exc:
        problems.extend(exc.problems)
        return None
    if report is None:
        problems.append(Problem(str(report_path), "is missing: a complete build writes it", None, show_value=False))
        return None
    bad = [k for k, kind in REPORT_KEYS.items() if not isinstance(report.get(k), kind)]
    if bad:
        problems.append(Problem(str(report_path),
                                f"lacks {', '.join(bad)} (a build report has tag, human_tags, image_id)",
                                {k: report.get(k) for k in bad}))
        return None
    if not (found / LOCK).is_file():
        problems.append(Problem(str(found / LOCK), f"is missing: a complete build writes it beside {REPORT}", None,
                                show_value=False))
    tags = []
    for key, ref_text in [("tag", report["tag"])] + [("human_tags", h) for h in report["human_tags"]]:
        found_problems = image_ref_problems(ref_text, f"{report_path}: {key}")
        problems.extend(found_problems)
        if not found_problems:
            ref = parse_image_ref(ref_text)
            if not ref.tag:
                problems.append(Problem(f"{report_path}: {key}", "has no tag", ref_text))
            elif ref.tag not in tags:
                tags.append(ref.tag)
    if problems:
        return None
    return LocalImage(report["tag"], _local_repository(parse_image_ref(report["tag"])), tags, report["image_id"],
                      found, flavor)


def _image_source(text: str, extra_tags: list[str], problems: list[Problem]) -> LocalImage | None:
    if _IMAGE_ID_RE.fullmatch(text):  # an image ID names no repository and no tag
        if not extra_tags:
            problems.append(Problem("--tag", "is required when --image is an image ID (give at least one tag to push)",
                                    text))
        return LocalImage(text, "", list(extra_tags))
    found = image_ref_problems(text, "--image")
    if found:
        problems.extend(found)
        return None
    ref = parse_image_ref(text)
    tags = ([ref.tag] if ref.tag else []) + [t for t in extra_tags if t != ref.tag]
    if not tags:
        problems.append(Problem("--tag", "is required when --image has no tag (give at least one tag to push)", text))
        return None
    return LocalImage(text, _local_repository(ref), tags)


def _local_repository(ref: ImageRef) -> str:
    """The repository path as the user would write it (no host), the default at the destination."""
    return ref.repository.removeprefix("library/") if ref.registry == DOCKER_HUB else ref.repository


def describe(p: Plan) -> list[str]:
    """What a publish would do, in the order it would do it (the dry run's output)."""
    src = p.source
    origin = f" (build {src.build_dir}, image {src.image_id})" if src.build_dir else ""
    lines = [f"would publish {src.image}{origin}",
             f"  to {p.registry}/{p.repository} as tags: {', '.join(src.tags)}"]
    if p.ecr:
        endpoint = p.ecr.endpoint or os.environ.get("AWS_ENDPOINT_URL_ECR") or "the AWS default"
        mut = "immutable" if p.ecr.settings.tag_immutability else "mutable"
        lines += [f"  ECR account {p.ecr.registry.account}, region {p.ecr.registry.region}, API {endpoint}",
                  f"  create the repository if missing: tags {mut}, scan on push "
                  f"{'on' if p.ecr.settings.scan_on_push else 'off'}",
                  f"  credentials: an ECR authorization token; push to {p.ecr.push_host or 'its proxy endpoint'}"]
    elif p.username:
        lines.append(f"  credentials: user {p.username!r}, password from {p.password_from}")
    else:
        lines.append(f"  credentials: the docker config (and its credential helpers) for {p.registry}")
    lines.append(f"  layers compressed with {p.compression}" + (" by slimeforge (docker save, then an OCI "
                                                                "manifest)" if p.compression != "gzip"
                                                                   else " by the Docker Engine's push"))
    lines.append(f"  skip tags that already point at this image ({p.compression} layers); push the others; "
                 "verify each tag's digest at the registry")
    if src.build_dir:
        lines.append(f"  record: {src.build_dir / RECORD}; digest and published in {REPORT} and {LOCK}")
    else:
        lines.append(f"  record: {p.record or 'printed as JSON'}")
    return lines


def read_credentials(p: Plan, stdin: IO[str], environ: Mapping[str, str] = os.environ) -> Credentials | None:
    """The password from stdin or an environment variable, held in memory only."""
    if not p.username or not p.password_from:
        return None
    if p.password_from == "stdin":
        if stdin.isatty():
            import getpass

            password = getpass.getpass(f"password for {p.username} at {p.registry}: ")
        else:
            password = stdin.read().rstrip("\r\n")
        if not password:
            raise ConfigError("invoke publish", [Problem("--password-stdin", "read an empty password from stdin", None,
                                                         show_value=False)])
        return Credentials(p.username, password, "--password-stdin")
    name = p.password_from.removeprefix("env:")
    return Credentials(p.username, environ[name], f"--password-env {name}")


# --- doing it -----------------------------------------------------------------------------------


def publish(
    p: Plan,
    credentials: Credentials | None = None,
    *,
    docker_client=None,
    echo: Callable[[str], None] = print,
    retry: Retry | None = None,
    certs_dir: Path = DOCKER_CERTS_DIR,
) -> dict:
    """Push `p.source` to every tag of the destination unless the registry already holds it there,
    verify the digest each tag reports, and record the publish. Returns the record. Its phases:
    connect (ECR or any registry), where each tag points now, push, verify, record."""
    retry = retry or Retry()
    docker = docker_client or dockerapi.docker_client()
    image_id = _local_image_id(docker, p.source)
    dest = _connect(p, credentials, docker, echo, retry, certs_dir)
    current = _current_tags(p, dest, image_id, echo)
    to_push = [t for t in p.source.tags if t not in current]
    pushed: dict[str, str] = {}
    if not to_push:
        echo(f"{p.registry}/{p.repository}: tags {', '.join(p.source.tags)} already hold image {image_id}; nothing to "
             "push")
    elif p.compression != "gzip":
        from . import layerpush

        pushed = layerpush.push(docker, image_id, dest.api, p.repository, to_push, compression=p.compression,
                                echo=echo).manifests
    for tag in to_push if p.compression == "gzip" else []:
        target = ImageRef(dest.push_host, p.repository, tag)
        docker.api.tag(image_id, target.name, tag)
        pushed[tag] = push_tag(docker, target, dest.credentials, echo, retry)
    confirmed = {t: m.digest for t, m in current.items()} | _verified(p, dest, pushed, image_id)
    digest = confirmed[p.source.tags[0]]
    if len(set(confirmed.values())) > 1:
        echo(f"note: the tags hold this image under different manifests: {confirmed}; recording {digest}")
    record = {
        "registry": p.registry,
        "repository": p.repository,
        "tags": p.source.tags,
        "digest": digest,
        "reference": str(ImageRef(p.registry, p.repository).with_digest(digest)),
        "image_id": image_id,
        "source": p.source.image,
        "pushed": list(pushed),
        "compression": p.compression,
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "verified": True,
    }
    if dest.push_host != p.registry:
        record["push_host"] = dest.push_host
    _record(p, record, echo)
    echo(f"digest {digest}")
    echo(f"image  {record['reference']}")
    return record


@dataclass
class _Destination:
    """Where a publish pushes: the host the daemon pushes to, its credentials and registry client,
    and for ECR its client and the repository's settings."""

    push_host: str
    credentials: Credentials | None
    api: RegistryAPI
    ecr_client: Any = None
    repo_info: Any = None


def _connect(p: Plan, credentials: Credentials | None, docker, echo: Callable[[str], None], retry: Retry,
             certs_dir: Path) -> _Destination:
    ecr_client = repo_info = None
    if p.ecr:
        ecr_client = ecr_api.client(p.ecr.registry.region, p.ecr.endpoint)
        credentials, proxy_host = ecr_api.login(ecr_client, p.ecr.registry)
        push_host = p.ecr.push_host or proxy_host
        repo_info = ecr_api.ensure_repository(ecr_client, p.ecr.registry, p.repository, p.ecr.settings, echo)
    else:
        push_host = p.registry
        credentials = credentials or docker_config_credentials(p.registry)
    # Plain HTTP only where the daemon that pushes would use it (loopback, its insecure-registries).
    api = RegistryAPI(push_host, credentials, certs_dir=certs_dir, retry=retry, echo=echo,
                      insecure=daemon_insecure_registries(docker))
    return _Destination(push_host, credentials, api, ecr_client, repo_info)


def _current_tags(p: Plan, dest: _Destination, image_id: str, echo: Callable[[str], None]) -> dict[str, RemoteManifest]:
    """Before any push: the tags that already hold this image. A tag that moves is said; on an
    immutable ECR repository it is refused."""
    if dest.ecr_client and p.ecr:
        remote = ecr_api.manifests(dest.ecr_client, p.ecr.registry, p.repository, p.source.tags)
    else:
        remote = {t: m for t in p.source.tags if (m := dest.api.manifest(p.repository, t))}
    # A tag holds this image as asked when its config is this image and its layers do not have
    # another known compression (a gzip manifest of the same image is pushed over by a zstd publish, and back).
    current = {t: m for t, m in remote.items() if m.config_digest == image_id and m.layer_compression in (None,
                                                                                                          p.compression)}
    moving = {t: m for t, m in remote.items() if t not in current}
    if dest.repo_info is not None:
        refused = [t for t in moving if ecr_api.tag_is_immutable(dest.repo_info, t)]
        if refused:
            raise PublishError(_immutable_message(p, refused, moving, image_id))
    for tag, m in moving.items():
        how = f" ({m.layer_compression or 'mixed'} layers, now {p.compression})" if m.config_digest == image_id else ""
        echo(f"tag {tag} moves from {m.digest} (image {m.config_digest}) to this image {image_id}{how}")
    return current


def _verified(p: Plan, dest: _Destination, pushed: dict[str, str], image_id: str) -> dict[str, str]:
    """After: the registry itself must report, for every tag pushed, the digest of a manifest of this image."""
    confirmed = {}
    for tag, digest in pushed.items():
        seen = dest.api.manifest(p.repository, tag)
        if seen is None or seen.digest != digest or seen.config_digest != image_id:
            reported = f"{seen.digest} (image {seen.config_digest})" if seen else "no manifest"
            raise PushFailed(f"{dest.push_host}/{p.repository}:{tag}: pushed {digest} (image {image_id}) but the "
                             "registry "
                             f"reports {reported}; nothing was recorded")
        if dest.ecr_client and p.ecr and dest.push_host == p.ecr.registry.host:  # a test's split setup pushes elsewhere
            ecr_api.confirm_digest(dest.ecr_client, p.ecr.registry, p.repository, tag, digest)
        confirmed[tag] = digest
    return confirmed


def local_image(p: Plan, docker_client=None) -> str:
    """The local image ID a publish of `p` would push: its dry run checks it as the publish does
    first (no such local image, or a tag that moved since the build: PublishError, exit 2)."""
    return _local_image_id(docker_client or dockerapi.docker_client(), p.source)


def _local_image_id(docker, source: LocalImage) -> str:
    from docker.errors import DockerException, ImageNotFound
    from requests.exceptions import RequestException

    try:
        image_id = docker.api.inspect_image(source.image).get("Id")
    except ImageNotFound:
        hint = f"run invoke build --cuda {source.flavor} first" if source.flavor else "see `docker images`"
        raise PublishError(f"{source.image}: no such local image; {hint}") from None
    except (DockerException, RequestException) as exc:
        raise dockerapi.EngineUnavailable(f"docker engine: inspecting {source.image} failed: "
                                          f"{printable(str(exc))[:300]}") from None
    if not (isinstance(image_id, str) and _DIGEST_RE.fullmatch(image_id)):
        raise PushFailed(f"{source.image}: the Docker Engine names its image {printable(repr(image_id))[:100]}, not "
                         "sha256:<64 hex>")
    if source.image_id and image_id != source.image_id:
        raise PublishError(f"{source.image} is now image {image_id}, but {source.build_dir}/{REPORT} says "
                           f"{source.image_id}: the tag moved after that build; rebuild (invoke build --cuda "
                           f"{source.flavor}) "
                           "or publish the image you mean with --image")
    return image_id


def _immutable_message(p: Plan, refused: list[str], moving: dict[str, RemoteManifest], image_id: str) -> str:
    where = f"ECR repository {p.ecr.registry.host if p.ecr else p.registry}/{p.repository}"
    lines = [f"{where}: refusing to move immutable tag(s); nothing was pushed:"]
    lines += [f"  - {t} already points at {moving[t].digest} (image {moving[t].config_digest}), not at this image "
              f"{image_id}"
              for t in refused]
    lines.append("  publish under a new tag (a changed build gets a new content-addressed tag; --tag with --image), "
                 "or, if moving it is intended, make the repository's tags mutable: "
                 f"aws ecr put-image-tag-mutability --repository-name {p.repository} --image-tag-mutability MUTABLE")
    return "\n".join(lines)


def _record(p: Plan, record: dict, echo: Callable[[str], None]) -> None:
    """publish.json plus digest/published in the report and lock (each file replaced atomically,
    the report last), or --record PATH, or stdout."""
    src = p.source
    if src.build_dir is None:
        text = json.dumps(record, indent=2) + "\n"
        if p.record:
            write_output(p.record, text, where="--record")
            echo(f"recorded {p.record}")
        else:
            echo(text.rstrip())
        return
    files = {}
    for name in (LOCK, REPORT):
        doc = readback.read_json(src.build_dir / name, name, f"the {name} `invoke build` writes",
                                lambda d: None if isinstance(d, dict) else "is not a JSON object")
        if doc is None:
            raise SlimeforgeError(f"{src.build_dir / name}: missing; the build directory changed while publishing")
        published = doc.get("published") if isinstance(doc.get("published"), list) else []
        if doc.get("digest") != record["digest"] or record["reference"] not in published:
            doc["digest"] = record["digest"]
            doc["published"] = [r for r in published if r != record["reference"]] + [record["reference"]]
            files[name] = json.dumps(doc, indent=2) + "\n"
    old = _read_json(src.build_dir / RECORD)
    same = {k: v for k, v in record.items() if k not in ("time", "pushed")}
    if files or {k: old.get(k) for k in same} != same:
        files = {RECORD: json.dumps(record, indent=2) + "\n", **files}
        write_dir(src.build_dir, files, last=REPORT if REPORT in files else None)
        echo(f"recorded {src.build_dir / RECORD}" + (" (and "
                                                     f"{', '.join(n for n in files if n != RECORD)})"
                                                     if len(files) > 1 else ""))


def _read_json(path: Path) -> dict:
    """An earlier publish record: a bad one is replaced by the new record, so it reads as none."""
    try:
        doc = readback.read_json(path, path.name, "a publish record")
    except readback.RecordError:
        return {}
    return doc if isinstance(doc, dict) else {}
