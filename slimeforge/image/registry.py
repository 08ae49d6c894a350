"""The registry HTTP API (v2), as much of it as publishing and the wheel store need (the
reference grammar is imageref.py).

`RegistryAPI.manifest` asks a registry what a tag points at; publish
uses it before pushing (is the tag already ours?) and after (does the registry hold what we
pushed?), independently of the Docker daemon that did the push. Only the standard library is used
here, so importing this module stays cheap.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import ipaddress
import json
import re
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any, TypeVar

from ..errors import SlimeforgeError
from .imageref import DOCKER_HUB

# --- credentials and errors ------------------------------------------------------------------


@dataclass(frozen=True)
class Credentials:
    """A username and password held in memory only; `source` says where they came from (for
    messages), the password is never shown."""

    username: str
    password: str = field(repr=False)
    source: str = ""

    def auth_config(self, registry: str) -> dict[str, str]:
        """The form the Docker Engine API takes (X-Registry-Auth), built in memory."""
        return {"username": self.username, "password": self.password, "serveraddress": registry}


class RegistryError(SlimeforgeError):
    """A registry refused or failed a request in a way retrying will not fix."""


class RegistryAuthError(RegistryError):
    """The registry refused our credentials (HTTP 401/403) or none were found."""


class TransientError(Exception):
    """A failure worth retrying (connection reset, timeout, HTTP 5xx/429)."""


T = TypeVar("T")


@dataclass
class Retry:
    """Retries with exponential backoff: 1 s, 2 s, 4 s, ... between `attempts` tries."""

    attempts: int = 4
    first_delay: float = 1.0
    sleep: Callable[[float], None] = time.sleep

    def call(self, what: str, fn: Callable[[], T], echo: Callable[[str], None]) -> T:
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except TransientError as exc:
                if attempt == self.attempts:
                    raise RegistryError(f"{what}: still failing after {self.attempts} attempts: {exc}") from None
                delay = self.first_delay * 2 ** (attempt - 1)
                echo(f"  {what}: {exc}; retrying in {delay:g}s (attempt {attempt + 1} of {self.attempts})")
                self.sleep(delay)
        raise AssertionError("unreachable")


# --- the registry HTTP API -------------------------------------------------------------------

DOCKER_CERTS_DIR = Path("/etc/docker/certs.d")
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)


@dataclass(frozen=True)
class RemoteManifest:
    """What a registry holds for a tag: the manifest's digest and, for an image manifest, the
    digest of its config blob, which is the image ID the Docker Engine shows locally."""

    digest: str
    media_type: str
    config_digest: str | None
    raw: bytes = field(repr=False)

    @classmethod
    def parse(cls, body: bytes, digest: str, where: str, media_type: str = "") -> RemoteManifest:
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise RegistryError(f"{where}: manifest is not JSON ({exc})") from None
        config = doc.get("config") or {}
        return cls(digest, doc.get("mediaType") or media_type, config.get("digest"), body)

    @property
    def layer_compression(self) -> str | None:
        """How its layers are compressed: "gzip" or "zstd" when all of them are (by media type:
        OCI's `...tar+gzip`/`...tar+zstd`, Docker's `...diff.tar.gzip`), else None."""
        try:
            layers = json.loads(self.raw).get("layers") or []
        except (ValueError, AttributeError):
            return None
        kinds = {str(layer.get("mediaType", "")).rsplit("+", 1)[-1].rsplit(".", 1)[-1] for layer in layers if isinstance(layer, dict)}
        return kinds.pop() if len(kinds) == 1 and kinds <= {"gzip", "zstd"} else None


def tls_context(registry: str, certs_dir: Path = DOCKER_CERTS_DIR) -> ssl.SSLContext:
    """The system's CAs plus the registry's own from `<certs_dir>/<host:port>/`, where the Docker
    daemon reads them too, so we trust exactly what the daemon that pushes trusts."""
    ctx = ssl.create_default_context()
    host_dir = certs_dir / registry
    if host_dir.is_dir():
        for ca in sorted(host_dir.glob("*.crt")):
            ctx.load_verify_locations(cafile=str(ca))
        for cert in sorted(host_dir.glob("*.cert")):
            ctx.load_cert_chain(str(cert), str(cert.with_suffix(".key")))
    return ctx


def api_host(registry: str) -> str:
    return "registry-1.docker.io" if registry == DOCKER_HUB else registry


# --- where a credential may go ---------------------------------------------------------------------
# The rules (docs/publish.md):
#  1. Plain HTTP only to a registry the Docker daemon itself would speak plain HTTP to: a loopback
#     one (127.0.0.0/8, ::1, localhost) or one in the daemon's insecure-registries. HTTPS is tried
#     first, as Docker does; the fall-back happens only when the server does not speak TLS at all.
#  2. A password (Basic) goes only to the registry's own host, and over plain HTTP only on loopback.
#  3. A redirect to another host, or from https to http, loses the Authorization header.
#  4. A Bearer token service (the challenge's realm) gets the password only over https (or plain
#     HTTP on loopback, to a loopback registry) and only on the registry's host or a host of the
#     registry's own domain (registry.gitlab.com -> gitlab.com, registry-1.docker.io ->
#     auth.docker.io); anywhere else the token is asked for without it.
#  5. A TLS protocol error (WRONG_VERSION_NUMBER: the server speaks plain HTTP) is never retried.


def host_name(host_port: str) -> str:
    """`host` of `host[:port]` or `[v6]:port`, lowercased, without a trailing dot."""
    if host_port.startswith("["):
        return host_port[1:].split("]", 1)[0].lower()
    name = host_port.rsplit(":", 1)[0] if host_port.count(":") == 1 else host_port
    return name.lower().rstrip(".")


def is_loopback(host_port: str) -> bool:
    name = host_name(host_port)
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def plain_http_allowed(registry: str, insecure: Iterable[str] = ()) -> bool:
    """Docker's rule for a registry it may reach over plain HTTP: loopback, or named in the daemon's
    insecure-registries (as host[:port], or a CIDR holding the registry's IP address)."""
    if is_loopback(registry):
        return True
    name = host_name(registry)
    for entry in insecure:
        if entry.lower().rstrip("/") in (registry.lower(), name):
            return True
        try:
            if ipaddress.ip_address(name) in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            continue
    return False


def daemon_insecure_registries(docker) -> list[str]:
    """The daemon's insecure registries (RegistryConfig of `docker info`); [] when it cannot say."""
    try:
        config = docker.info().get("RegistryConfig") or {}
    except Exception:  # noqa: BLE001 - any failure means: only the built-in loopback rule applies
        return []
    cidrs = [str(c) for c in config.get("InsecureRegistryCIDRs") or []]
    hosts = [str(h) for h, c in (config.get("IndexConfigs") or {}).items() if isinstance(c, dict) and c.get("Secure") is False]
    return cidrs + hosts


def same_site(a: str, b: str) -> bool:
    """Whether host `b` belongs to the registry host `a`: the same host, `a`'s parent domain, or a
    sibling under that parent (only for hosts of three labels or more, so no public suffix counts)."""
    a, b = host_name(a), host_name(b)
    if a == b:
        return True
    for name in (a, b):
        try:
            ipaddress.ip_address(name)
            return False  # an address is only ever itself
        except ValueError:
            pass
    pa, pb = a.split("."), b.split(".")
    if len(pa) < 3:
        return False
    parent = ".".join(pa[1:])
    return b == parent or (len(pb) >= 3 and ".".join(pb[1:]) == parent)


class _KeepAuthOnSameOrigin(urllib.request.HTTPRedirectHandler):
    """urllib forwards every header on a redirect, Authorization included; drop it when the
    redirect leaves the origin (another host or port) or goes from https to http."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            old, nxt = urllib.parse.urlsplit(req.full_url), urllib.parse.urlsplit(new.full_url)
            if (old.scheme, old.netloc.lower()) != (nxt.scheme, nxt.netloc.lower()):
                new.remove_header("Authorization")
                new.unredirected_hdrs.pop("Authorization", None)
        return new


class RegistryAPI:
    """Reads manifests from one registry over HTTPS (or plain HTTP where Docker would, see the
    rules above), answering its auth challenge (Basic, or a Bearer token from its token service)
    with `credentials`."""

    def __init__(
        self,
        registry: str,
        credentials: Credentials | None = None,
        *,
        certs_dir: Path = DOCKER_CERTS_DIR,
        timeout: float = 30.0,
        retry: Retry | None = None,
        echo: Callable[[str], None] = print,
        insecure: Iterable[str] = (),
    ):
        self.registry = registry
        self.credentials = credentials
        self.timeout = timeout
        self.retry = retry or Retry()
        self.echo = echo
        self.plain_http = plain_http_allowed(registry, insecure)
        self._base = f"https://{api_host(registry)}"
        self._ctx = tls_context(registry, certs_dir)
        self._opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=self._ctx), _KeepAuthOnSameOrigin)
        self._authorization: dict[str, str] = {}  # scope -> Authorization header value

    def manifest(self, repository: str, reference: str) -> RemoteManifest | None:
        """The manifest `reference` (a tag or digest) names, or None if the registry has none."""
        what = f"{self.registry}: manifest {repository}:{reference}"
        return self.retry.call(what, lambda: self._manifest_once(repository, reference), self.echo)

    def _manifest_once(self, repository: str, reference: str) -> RemoteManifest | None:
        path = f"/v2/{repository}/manifests/{urllib.parse.quote(reference, safe=':')}"
        status, headers, body = self._request("GET", path, repository, {"Accept": ", ".join(MANIFEST_TYPES)})
        if status == 404:
            return None
        if status != 200:
            raise RegistryError(f"{self.registry}: GET {path} answered HTTP {status}: {_short(body)}")
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        claimed = headers.get("Docker-Content-Digest")
        # A registry that answers with content other than what it names is not to be trusted.
        if claimed and claimed.startswith("sha256:") and claimed != digest:
            raise RegistryError(f"{self.registry}: {repository}:{reference}: Docker-Content-Digest {claimed} "
                                f"does not match the manifest's sha256 {digest}")
        return RemoteManifest.parse(body, digest, f"{self.registry}: {repository}:{reference}",
                                    headers.get("Content-Type", "").split(";")[0])

    # -- pushing (layerpush.py: an image whose layers slimeforge compressed itself) --

    def has_blob(self, repository: str, digest: str) -> bool:
        """Whether the repository holds the blob already (then it is not uploaded again)."""
        def once() -> bool:
            status, _, body = self._request("HEAD", f"/v2/{repository}/blobs/{digest}", repository, {}, actions="pull,push")
            if status not in (200, 404):
                raise RegistryError(f"{self.registry}: HEAD blob {digest} of {repository} answered HTTP {status}: {_short(body)}")
            return status == 200
        return self.retry.call(f"{self.registry}: blob {digest}", once, self.echo)

    def upload_blob(self, repository: str, digest: str, size: int, path: Path) -> None:
        """Upload the file at `path` as the blob `digest` (one monolithic PUT: POST for an upload
        location, then PUT the bytes there with ?digest=); the registry checks the digest itself."""
        def once() -> None:
            status, headers, body = self._request("POST", f"/v2/{repository}/blobs/uploads/", repository,
                                                  {"Content-Length": "0"}, data=b"", actions="pull,push")
            location = headers.get("Location") if status == 202 else None
            if not location:
                raise RegistryError(f"{self.registry}: starting an upload to {repository} answered HTTP {status}: {_short(body)}")
            url = self._same_origin(urllib.parse.urljoin(self._base + "/", location))
            url += ("&" if "?" in url else "?") + urllib.parse.urlencode({"digest": digest})
            with path.open("rb") as fh:
                status, headers, body = self._request("PUT", url, repository, {"Content-Type": "application/octet-stream",
                                                      "Content-Length": str(size)}, data=fh, actions="pull,push")
            if status != 201:
                raise RegistryError(f"{self.registry}: uploading blob {digest} to {repository} answered HTTP {status}: {_short(body)}")
        self.retry.call(f"{self.registry}: upload {digest}", once, self.echo)

    def put_manifest(self, repository: str, tag: str, body: bytes, media_type: str) -> str:
        """Put `body` under `tag`; its digest, which the registry must confirm."""
        digest = "sha256:" + hashlib.sha256(body).hexdigest()

        def once() -> str:
            status, headers, answer = self._request("PUT", f"/v2/{repository}/manifests/{urllib.parse.quote(tag, safe='')}", repository,
                                                    {"Content-Type": media_type, "Content-Length": str(len(body))}, data=body,
                                                    actions="pull,push")
            if status != 201:
                raise RegistryError(f"{self.registry}: PUT manifest {repository}:{tag} answered HTTP {status}: {_short(answer)}")
            claimed = headers.get("Docker-Content-Digest")
            if claimed and claimed != digest:
                raise RegistryError(f"{self.registry}: {repository}:{tag}: the registry says it stored {claimed}, "
                                    f"but the manifest sent is {digest}")
            return digest
        return self.retry.call(f"{self.registry}: manifest {repository}:{tag}", once, self.echo)

    def _same_origin(self, url: str) -> str:
        """An upload location the registry handed out, refused unless it is on the registry's own
        origin (scheme, host and port as reached): our credentials would go with the bytes."""
        parts, base = urllib.parse.urlsplit(url), urllib.parse.urlsplit(self._base)
        if (parts.scheme, parts.netloc.lower()) != (base.scheme, base.netloc.lower()):
            raise RegistryError(f"{self.registry}: the registry sent the upload to {parts.scheme}://{parts.netloc}, which is not "
                                "its own host; slimeforge uploads only to the registry itself")
        return url

    # -- plumbing --

    def _request(self, method: str, path: str, repository: str, headers: dict[str, str], *, data: Any = None,
                 actions: str = "pull") -> tuple[int, Message, bytes]:
        """`path` below the registry's /v2 root, or a whole URL on it (an upload location)."""
        scope = f"repository:{repository}:{actions}"
        status, resp_headers, body = self._send_registry(method, path, {**headers, **self._auth_header(scope)}, data)
        if status == 401 and scope not in self._authorization:
            challenge = resp_headers.get("WWW-Authenticate", "")
            self._authorization[scope] = self._answer(challenge, scope)
            if hasattr(data, "seek"):
                data.seek(0)
            status, resp_headers, body = self._send_registry(method, path, {**headers, **self._auth_header(scope)}, data)
        if status in (401, 403):
            raise self._auth_error(status, repository)
        if status == 429 or status >= 500:
            raise TransientError(f"HTTP {status} from {self.registry}")
        return status, resp_headers, body

    def _send_registry(self, method: str, path: str, headers: dict[str, str], data: Any = None) -> tuple[int, Message, bytes]:
        if path.startswith(("http://", "https://")):
            return self._send(method, path, headers, data)
        try:
            return self._send(method, self._base + path, headers, data)
        except _NotTLS:
            if not (self.plain_http and self._base.startswith("https://")):
                raise RegistryError(f"{self.registry}: the registry does not speak TLS (a plain-HTTP registry?). slimeforge, like "
                                    "Docker, speaks plain HTTP only to a loopback registry or one in the Docker daemon's "
                                    "insecure-registries (/etc/docker/daemon.json)") from None
            self._base = f"http://{api_host(self.registry)}"  # as Docker falls back for an insecure registry
            if hasattr(data, "seek"):
                data.seek(0)
            return self._send(method, self._base + path, headers, data)

    def _auth_header(self, scope: str) -> dict[str, str]:
        value = self._authorization.get(scope)
        return {"Authorization": value} if value else {}

    def _password_may_go_to(self, url: str) -> bool:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme == "https":
            return same_site(api_host(self.registry), parts.netloc)
        return parts.scheme == "http" and is_loopback(parts.netloc) and is_loopback(self.registry)

    def _answer(self, challenge: str, scope: str) -> str:
        scheme, _, params_text = challenge.partition(" ")
        params = dict(re.findall(r'(\w+)="([^"]*)"', params_text))
        if scheme.lower() == "basic":
            if not self.credentials:
                raise self._auth_error(401, scope.split(":")[1])
            if not self._password_may_go_to(self._base):
                raise RegistryAuthError(f"{self.registry}: asks for the password over plain HTTP; slimeforge sends it over plain "
                                        "HTTP only to a loopback registry (serve this one over TLS)")
            return "Basic " + _basic(self.credentials)
        if scheme.lower() == "bearer" and params.get("realm"):
            realm = params["realm"]
            if urllib.parse.urlsplit(realm).scheme not in ("https", "http"):
                raise RegistryError(f"{self.registry}: token service {realm!r} is not an http(s) URL")
            query = {"service": params.get("service", ""), "scope": scope}
            url = realm + ("&" if "?" in realm else "?") + urllib.parse.urlencode({k: v for k, v in query.items() if v})
            trusted = self.credentials is not None and self._password_may_go_to(realm)
            auth = {"Authorization": "Basic " + _basic(self.credentials)} if trusted and self.credentials else {}
            try:
                status, _, body = self._send("GET", url, auth)
            except _NotTLS:
                raise RegistryError(f"{self.registry}: the token service {realm} does not speak TLS") from None
            if status in (401, 403):
                if self.credentials and not trusted:
                    raise RegistryAuthError(f"{self.registry}: its token service {realm} is not on the registry's host (or not "
                                            "https), so slimeforge did not send it the password, and it refused an anonymous "
                                            "token (docs/publish.md: where a credential may go)")
                raise self._auth_error(status, scope.split(":")[1])
            if status == 429 or status >= 500:
                raise TransientError(f"HTTP {status} from the token service {realm}")
            if status != 200:
                raise RegistryError(f"{self.registry}: token service {realm} answered HTTP {status}: {_short(body)}")
            try:
                token = json.loads(body)
            except ValueError:
                raise RegistryError(f"{self.registry}: token service {realm} answered with something other than JSON") from None
            if not isinstance(token, dict):
                raise RegistryError(f"{self.registry}: token service {realm} answered without a token")
            return "Bearer " + str(token.get("token") or token.get("access_token") or "")
        raise RegistryError(f"{self.registry}: unsupported auth challenge {challenge[:200]!r} (Basic and Bearer are supported)")

    def _auth_error(self, status: int, repository: str) -> RegistryAuthError:
        return RegistryAuthError(auth_advice(self.registry, repository, self.credentials, f"HTTP {status}"))

    def _send(self, method: str, url: str, headers: dict[str, str], data: Any = None) -> tuple[int, Message, bytes]:
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with self._opener.open(request, timeout=self.timeout) as resp:
                return resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, exc.read()
        except urllib.error.URLError as exc:
            raise _connection_error(self.registry, exc.reason) from None
        except ssl.SSLError as exc:
            raise _connection_error(self.registry, exc) from None
        except (ConnectionError, TimeoutError, http.client.HTTPException) as exc:
            raise TransientError(f"{type(exc).__name__}: {exc}") from None


class _NotTLS(Exception):
    """The server answered the TLS handshake with something else (it speaks plain HTTP)."""


def auth_advice(registry: str, repository: str, credentials: Credentials | None, seen: str) -> str:
    """The message for a refused login: which registry, which credentials, what to check."""
    if credentials is None:
        who = "no credentials were found for it"
        check = (f"pass --username with --password-stdin or --password-env NAME, or run "
                 f"`docker login {registry}` so the docker config (or its credential helper) has them")
    else:
        who = f"user {credentials.username!r} from {credentials.source or 'the given credentials'}"
        check = ("check the username and password (or token, and that it has not expired), and that this user "
                 f"may push to {repository!r} on {registry}")
    return f"registry {registry} refused access to {repository!r} ({seen}; {who}): {check}"


def _connection_error(registry: str, reason: object) -> Exception:
    if isinstance(reason, ssl.SSLCertVerificationError):
        return RegistryError(
            f"{registry}: TLS certificate not trusted ({reason.verify_message}): put the registry's CA certificate "
            f"at {DOCKER_CERTS_DIR / registry / 'ca.crt'} (the Docker daemon reads it there too)")
    if isinstance(reason, ssl.SSLEOFError | ssl.SSLZeroReturnError | ssl.SSLSyscallError):
        return TransientError(f"TLS connection cut: {reason}")  # a reset mid-handshake: worth another try
    if isinstance(reason, ssl.SSLError) and getattr(reason, "reason", None) in _NOT_TLS_REASONS:
        return _NotTLS(str(reason))
    if isinstance(reason, ssl.SSLError):
        # A protocol failure, not a flaky network: retrying gives the same answer.
        return RegistryError(f"{registry}: TLS failed ({reason}); check that this host:port is the registry and serves TLS")
    if isinstance(reason, socket.gaierror):
        return RegistryError(f"{registry}: host name does not resolve ({reason}); check the registry host")
    # Refused, reset, timed out, TLS handshake cut: the registry may be restarting or a proxy flaky.
    return TransientError(f"{type(reason).__name__}: {reason}")


# OpenSSL's reasons when the peer answered the ClientHello with plain text (an HTTP server).
_NOT_TLS_REASONS = {"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"}


def _basic(credentials: Credentials) -> str:
    return base64.b64encode(f"{credentials.username}:{credentials.password}".encode()).decode()


def _short(body: bytes) -> str:
    return body[:300].decode(errors="replace").strip()
