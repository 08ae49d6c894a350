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
import json
import re
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any, TypeVar

from ...errors import OperationFailed, SlimeforgeError
from ...schema import printable
from .hosts import (
    DOCKER_CERTS_DIR,
    KeepAuthOnSameOrigin,
    api_host,
    is_loopback,
    plain_http_allowed,
    same_site,
    tls_context,
)

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


class RegistryFailed(RegistryError, OperationFailed):
    """The registry answered, during a push, something that is not what it was sent or asked: no
    complete answer by the request's deadline, a blob it claims but does not hold, a manifest it
    does not give back as pushed (exit 1: the push ran and failed; nothing is recorded)."""


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

MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)


# Every request has three bounds: the connection (the client's `timeout`), each read (the same),
# and the whole answer (`deadline`; an upload's grows with its size at MIN_UPLOAD_RATE), so a
# registry that accepts the connection and then drips a byte every few seconds ends in an error
# naming the request, never a hang. What a registry sends back is bounded in size too.
DEADLINE_S = 120.0
MIN_UPLOAD_RATE = 1 << 20  # bytes/s: an upload slower than this over its whole length is given up
MANIFEST_MAX_BYTES = 4 << 20  # the distribution registry's own limit for a manifest
ANSWER_MAX_BYTES = 1 << 20  # a token, an error page: read up to this much, never more
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
_TOKEN_RE = re.compile(r"[\x21-\x7e]{1,16384}")
_REALM_RE = re.compile(r"https?://[\x21-\x7e]{1,2000}")
_LOCATION_RE = re.compile(r"[\x21-\x7e]{1,4000}")


class _Deadline:
    """One request's total deadline. Past it, every connection the request opened (redirects too)
    is shut down, so a read blocked on a registry that drips bytes returns at once."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.expired = False
        self._conns: list[http.client.HTTPConnection | socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def track(self, conn: http.client.HTTPConnection | socket.socket) -> None:
        """A connection while it connects (its socket during the TLS handshake), then its socket:
        urllib lets go of the connection once the headers are read, the body still comes through the socket."""
        with self._lock:
            self._conns.append(conn)
            if self.expired:
                _shut(conn)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for conn in self._conns:
                _shut(conn)


def _shut(conn: http.client.HTTPConnection | socket.socket) -> None:
    sock = conn.sock if isinstance(conn, http.client.HTTPConnection) else conn
    if sock is not None:
        try:
            socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's: wakes a read blocked under TLS too
        except OSError:
            pass


class _DeadlineHandlers:
    """urllib handlers whose connections register with the request's current deadline."""

    def __init__(self, ctx: ssl.SSLContext):
        self.current: _Deadline | None = None
        outer = self

        def tracked(base: type[http.client.HTTPConnection]) -> type[http.client.HTTPConnection]:
            class Tracked(base):  # type: ignore[valid-type,misc]
                def connect(self) -> None:
                    deadline = outer.current
                    if deadline is not None:
                        deadline.track(self)
                    super().connect()
                    if deadline is not None and self.sock is not None:
                        deadline.track(self.sock)
            return Tracked

        plain, tls = tracked(http.client.HTTPConnection), tracked(http.client.HTTPSConnection)

        class Http(urllib.request.HTTPHandler):
            def http_open(self, req):
                return self.do_open(plain, req)

        class Https(urllib.request.HTTPSHandler):
            def https_open(self, req):
                return self.do_open(tls, req, context=ctx)

        self.handlers = [Http(), Https()]


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
        except (ValueError, RecursionError) as exc:
            raise RegistryError(f"{where}: manifest is not JSON ({printable(str(exc))[:200]})") from None
        if not isinstance(doc, dict):
            raise RegistryError(f"{where}: manifest is not a JSON object")
        config = doc.get("config")
        found = config.get("digest") if isinstance(config, dict) else None
        config_digest = found if isinstance(found, str) and _DIGEST_RE.fullmatch(found) else None
        kind = doc.get("mediaType")
        return cls(digest, printable(kind if isinstance(kind, str) else media_type)[:200], config_digest, body)

    @property
    def layer_compression(self) -> str | None:
        """How its layers are compressed: "gzip" or "zstd" when all of them are (by media type:
        OCI's `...tar+gzip`/`...tar+zstd`, Docker's `...diff.tar.gzip`), else None."""
        try:
            layers = json.loads(self.raw).get("layers") or []
        except (ValueError, AttributeError):
            return None
        kinds = {str(layer.get("mediaType", "")).rsplit("+", 1)[-1].rsplit(".", 1)[-1]
                 for layer in layers if isinstance(layer, dict)}
        return kinds.pop() if len(kinds) == 1 and kinds <= {"gzip", "zstd"} else None


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
        deadline: float | None = None,
        retry: Retry | None = None,
        echo: Callable[[str], None] = print,
        insecure: Iterable[str] = (),
    ):
        self.registry = registry
        self.credentials = credentials
        self.timeout = timeout
        self.deadline = deadline or DEADLINE_S  # read here, not at import: a test (or a caller) may set the module's
        self.retry = retry or Retry()
        self.echo = echo
        self.plain_http = plain_http_allowed(registry, insecure)
        self._base = f"https://{api_host(registry)}"
        self._ctx = tls_context(registry, certs_dir)
        self._handlers = _DeadlineHandlers(self._ctx)
        self._opener = urllib.request.build_opener(*self._handlers.handlers, KeepAuthOnSameOrigin)
        self._authorization: dict[str, str] = {}  # scope -> Authorization header value

    def manifest(self, repository: str, reference: str) -> RemoteManifest | None:
        """The manifest `reference` (a tag or digest) names, or None if the registry has none."""
        what = f"{self.registry}: manifest {repository}:{reference}"
        return self.retry.call(what, lambda: self._manifest_once(repository, reference), self.echo)

    def _manifest_once(self, repository: str, reference: str) -> RemoteManifest | None:
        path = f"/v2/{repository}/manifests/{urllib.parse.quote(reference, safe=':')}"
        status, headers, body = self._request("GET", path, repository, {"Accept": ", ".join(MANIFEST_TYPES)},
                                              max_bytes=MANIFEST_MAX_BYTES)
        if status == 404:
            return None
        if status != 200:
            raise RegistryError(f"{self.registry}: GET {path} answered HTTP {status}: {_short(body)}")
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        claimed = headers.get("Docker-Content-Digest")
        # A registry that answers with content other than what it names is not to be trusted.
        if claimed and claimed.startswith("sha256:") and claimed != digest:
            raise RegistryError(f"{self.registry}: {repository}:{reference}: Docker-Content-Digest "
                                f"{printable(claimed)[:100]!r} does not match the manifest's sha256 {digest}")
        if reference.startswith("sha256:") and reference != digest:
            raise RegistryFailed(f"{self.registry}: {repository}@{reference}: the registry answered with a manifest "
                                 f"whose sha256 is {digest}")
        return RemoteManifest.parse(body, digest, f"{self.registry}: {repository}:{reference}",
                                    headers.get("Content-Type", "").split(";")[0])

    # -- pushing (layerpush.py: an image whose layers slimeforge compressed itself) --

    def blob_answer(self, repository: str, digest: str, size: int | None) -> tuple[bool, str]:
        """(held, what the registry said): held only when HEAD answers 200 naming this digest
        (Docker-Content-Digest) and this size (Content-Length); a 200 that names another, or none,
        is not "has it" (a registry that says it holds a blob it never received)."""
        def once() -> tuple[bool, str]:
            status, headers, body = self._request("HEAD", f"/v2/{repository}/blobs/{digest}", repository, {},
                                                  actions="pull,push")
            if status == 404:
                return False, "HTTP 404"
            if status != 200:
                raise RegistryFailed(f"{self.registry}: HEAD blob {digest} of {repository} answered HTTP {status}: "
                                     f"{_short(body)}")
            claimed, length = headers.get("Docker-Content-Digest"), headers.get("Content-Length")
            said = f"HTTP 200, Docker-Content-Digest {_header(claimed)}, Content-Length {_header(length)}"
            if claimed != digest or size is not None and length != str(size):
                return False, said
            return True, said
        return self.retry.call(f"{self.registry}: blob {digest}", once, self.echo)

    def has_blob(self, repository: str, digest: str, size: int | None = None) -> bool:
        """Whether the repository holds the blob already, by its own word checked against the digest
        and size (then it is not uploaded again)."""
        held, said = self.blob_answer(repository, digest, size)
        if not held and said != "HTTP 404":
            self.echo(f"  {self.registry}: blob {digest[7:19]}: the registry says it has it, but answered {said}; "
                      "uploading it again")
        return held

    def upload_blob(self, repository: str, digest: str, size: int, path: Path) -> None:
        """Upload the file at `path` as the blob `digest` (one monolithic PUT: POST for an upload
        location, then PUT the bytes there with ?digest=); the registry checks the digest itself,
        and afterwards must say it holds this digest at this size."""
        def once() -> None:
            status, headers, body = self._request("POST", f"/v2/{repository}/blobs/uploads/", repository,
                                                  {"Content-Length": "0"}, data=b"", actions="pull,push")
            location = headers.get("Location") if status == 202 else None
            if not location:
                raise RegistryError(f"{self.registry}: starting an upload to {repository} answered HTTP {status}: "
                                    f"{_short(body)}")
            if not _LOCATION_RE.fullmatch(location):
                raise RegistryFailed(f"{self.registry}: starting an upload to {repository} answered with the location "
                                     f"{_header(location)}, which is not a URL path")
            url = self._same_origin(urllib.parse.urljoin(self._base + "/", location))
            url += ("&" if "?" in url else "?") + urllib.parse.urlencode({"digest": digest})
            with path.open("rb") as fh:
                status, headers, body = self._request("PUT", url, repository,
                                                      {"Content-Type": "application/octet-stream",
                                                       "Content-Length": str(size)}, data=fh, actions="pull,push",
                                                      deadline=self.deadline + size / MIN_UPLOAD_RATE)
            if status != 201:
                raise RegistryError(f"{self.registry}: uploading blob {digest} to {repository} answered HTTP "
                                    f"{status}: {_short(body)}")
        self.retry.call(f"{self.registry}: upload {digest}", once, self.echo)
        held, said = self.blob_answer(repository, digest, size)
        if not held:
            raise RegistryFailed(f"{self.registry}: blob {digest} ({size} bytes) of {repository}: uploaded, but the "
                                 f"registry then answered {said}; it does not hold what it was sent, so no manifest "
                                 "is pushed over it")

    def put_manifest(self, repository: str, tag: str, body: bytes, media_type: str) -> str:
        """Put `body` under `tag`; its digest, which the registry must confirm, and then give back
        byte for byte when asked for it by that digest."""
        digest = "sha256:" + hashlib.sha256(body).hexdigest()

        def once() -> str:
            path = f"/v2/{repository}/manifests/{urllib.parse.quote(tag, safe='')}"
            status, headers, answer = self._request("PUT", path, repository,
                                                    {"Content-Type": media_type, "Content-Length": str(len(body))},
                                                    data=body, actions="pull,push")
            if status != 201:
                raise RegistryError(f"{self.registry}: PUT manifest {repository}:{tag} answered HTTP {status}: "
                                    f"{_short(answer)}")
            claimed = headers.get("Docker-Content-Digest")
            if claimed and claimed != digest:
                raise RegistryFailed(f"{self.registry}: {repository}:{tag}: the registry says it stored "
                                     f"{_header(claimed)}, but the manifest sent is {digest}")
            return digest
        self.retry.call(f"{self.registry}: manifest {repository}:{tag}", once, self.echo)
        seen = self.manifest(repository, digest)
        if seen is None or seen.raw != body:
            got = "no manifest (HTTP 404)" if seen is None else f"other bytes (sha256 {seen.digest})"
            raise RegistryFailed(f"{self.registry}: {repository}:{tag}: pushed manifest {digest}, but asked for it by "
                                 f"digest the registry answered {got}; nothing was recorded")
        return digest

    def _same_origin(self, url: str) -> str:
        """An upload location the registry handed out, refused unless it is on the registry's own
        origin (scheme, host and port as reached): our credentials would go with the bytes."""
        parts, base = urllib.parse.urlsplit(url), urllib.parse.urlsplit(self._base)
        if (parts.scheme, parts.netloc.lower()) != (base.scheme, base.netloc.lower()):
            raise RegistryError(f"{self.registry}: the registry sent the upload to {parts.scheme}://{parts.netloc}, "
                                "which is not its own host; slimeforge uploads only to the registry itself")
        return url

    # -- plumbing --

    def _request(self, method: str, path: str, repository: str, headers: dict[str, str], *, data: Any = None,
                 actions: str = "pull", max_bytes: int = ANSWER_MAX_BYTES,
                 deadline: float | None = None) -> tuple[int, Message, bytes]:
        """`path` below the registry's /v2 root, or a whole URL on it (an upload location)."""
        scope = f"repository:{repository}:{actions}"
        bounds = {"max_bytes": max_bytes, "deadline": deadline}
        status, resp_headers, body = self._send_registry(method, path, {**headers, **self._auth_header(scope)}, data,
                                                         **bounds)
        if status == 401 and scope not in self._authorization:
            challenge = resp_headers.get("WWW-Authenticate", "")
            self._authorization[scope] = self._answer(challenge, scope)
            if hasattr(data, "seek"):
                data.seek(0)
            status, resp_headers, body = self._send_registry(method, path, {**headers, **self._auth_header(scope)},
                                                             data, **bounds)
        if status in (401, 403):
            raise self._auth_error(status, repository)
        if status == 429 or status >= 500:
            raise TransientError(f"HTTP {status} from {self.registry}")
        return status, resp_headers, body

    def _send_registry(self, method: str, path: str, headers: dict[str, str], data: Any = None,
                       **bounds: Any) -> tuple[int, Message, bytes]:
        if path.startswith(("http://", "https://")):
            return self._send(method, path, headers, data, **bounds)
        try:
            return self._send(method, self._base + path, headers, data, **bounds)
        except _NotTLS:
            if not (self.plain_http and self._base.startswith("https://")):
                raise RegistryError(f"{self.registry}: the registry does not speak TLS (a plain-HTTP registry?). "
                                    "slimeforge, like Docker, speaks plain HTTP only to a loopback registry or one in "
                                    "the Docker daemon's insecure-registries (/etc/docker/daemon.json)") from None
            self._base = f"http://{api_host(self.registry)}"  # as Docker falls back for an insecure registry
            if hasattr(data, "seek"):
                data.seek(0)
            return self._send(method, self._base + path, headers, data, **bounds)

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
                raise RegistryAuthError(f"{self.registry}: asks for the password over plain HTTP; slimeforge sends it "
                                        "over plain HTTP only to a loopback registry (serve this one over TLS)")
            return "Basic " + _basic(self.credentials)
        if scheme.lower() == "bearer" and params.get("realm"):
            realm = params["realm"]
            shown = repr(printable(realm)[:200])
            if not _REALM_RE.fullmatch(realm):
                raise RegistryError(f"{self.registry}: token service {shown} is not an http(s) URL")
            query = {"service": params.get("service", ""), "scope": scope}
            url = realm + ("&" if "?" in realm else "?") + urllib.parse.urlencode({k: v for k, v in query.items() if v})
            trusted = self.credentials is not None and self._password_may_go_to(realm)
            auth = {"Authorization": "Basic " + _basic(self.credentials)} if trusted and self.credentials else {}
            try:
                status, _, body = self._send("GET", url, auth)
            except _NotTLS:
                raise RegistryError(f"{self.registry}: the token service {shown} does not speak TLS") from None
            if status in (401, 403):
                if self.credentials and not trusted:
                    raise RegistryAuthError(f"{self.registry}: its token service {shown} is not on the registry's "
                                            "host (or not https), so slimeforge did not send it the password, and it "
                                            "refused an anonymous token (docs/publish.md: where a credential may go)")
                raise self._auth_error(status, scope.split(":")[1])
            if status == 429 or status >= 500:
                raise TransientError(f"HTTP {status} from the token service {shown}")
            if status != 200:
                raise RegistryError(f"{self.registry}: token service {shown} answered HTTP {status}: {_short(body)}")
            try:
                token = json.loads(body)
            except (ValueError, RecursionError):
                raise RegistryError(f"{self.registry}: token service {shown} answered with something other than "
                                    "JSON") from None
            value = (token.get("token") or token.get("access_token")) if isinstance(token, dict) else None
            # It goes into a header line: only visible ASCII, bounded (never a CR/LF of the service's choosing).
            if not (isinstance(value, str) and _TOKEN_RE.fullmatch(value)):
                raise RegistryError(f"{self.registry}: token service {shown} answered without a usable token "
                                    "(a JSON object with token or access_token, visible ASCII)")
            return "Bearer " + value
        raise RegistryError(f"{self.registry}: unsupported auth challenge {challenge[:200]!r} (Basic and Bearer are "
                            "supported)")

    def _auth_error(self, status: int, repository: str) -> RegistryAuthError:
        return RegistryAuthError(auth_advice(self.registry, repository, self.credentials, f"HTTP {status}"))

    def _send(self, method: str, url: str, headers: dict[str, str], data: Any = None, *,
              max_bytes: int = ANSWER_MAX_BYTES, deadline: float | None = None) -> tuple[int, Message, bytes]:
        """One request under its three bounds (connect, each read, the whole answer); the answer's
        body read up to `max_bytes` (a longer 2xx body is refused; an error page is cut there)."""
        seconds = deadline or self.deadline
        what = f"{method} {printable(urllib.parse.urlsplit(url).path)[:200]}"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        with _Deadline(seconds) as dl:
            self._handlers.current = dl
            try:
                try:
                    with self._opener.open(request, timeout=self.timeout) as resp:
                        answer = resp.status, resp.headers, self._body(resp, max_bytes, what, strict=True)
                except urllib.error.HTTPError as exc:
                    answer = exc.code, exc.headers, self._body(exc, ANSWER_MAX_BYTES, what, strict=False)
                if dl.expired:  # a body cut by the deadline may read as complete (no Content-Length)
                    raise _Expired()
                return answer
            except _Expired:
                raise self._deadline_error(what, seconds) from None
            except urllib.error.URLError as exc:
                if dl.expired:
                    raise self._deadline_error(what, seconds) from None
                raise _connection_error(self.registry, exc.reason) from None
            except (OSError, http.client.HTTPException, ValueError) as exc:
                # OSError covers ssl.SSLError, ConnectionError and TimeoutError; ValueError: http.client
                # refusing what the server sent (a status line or header it cannot read).
                if dl.expired:
                    raise self._deadline_error(what, seconds) from None
                if isinstance(exc, ssl.SSLError):
                    raise _connection_error(self.registry, exc) from None
                raise TransientError(f"{what}: {type(exc).__name__}: {printable(str(exc))[:300]}") from None
            finally:
                self._handlers.current = None

    def _body(self, resp: Any, max_bytes: int, what: str, *, strict: bool) -> bytes:
        chunks, size = [], 0
        while chunk := resp.read(min(1 << 16, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                if strict:
                    raise RegistryFailed(f"{self.registry}: {what}: the answer is over {max_bytes} bytes; "
                                         "not what a registry sends for this request")
                break
        return b"".join(chunks)[:max_bytes]

    def _deadline_error(self, what: str, seconds: float) -> RegistryFailed:
        return RegistryFailed(f"{self.registry}: {what}: no complete answer within {seconds:g} s (the deadline of one "
                              f"request; connecting and each read: {self.timeout:g} s); the registry accepted the "
                              "connection but answers too slowly or not at all: check it (or a proxy in between), "
                              "then publish again")


class _Expired(Exception):
    """The request's deadline passed (its connection was shut down)."""


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
        return RegistryError(f"{registry}: TLS failed ({reason}); check that this host:port is the registry and "
                             "serves TLS")
    if isinstance(reason, socket.gaierror):
        return RegistryError(f"{registry}: host name does not resolve ({reason}); check the registry host")
    # Refused, reset, timed out, TLS handshake cut: the registry may be restarting or a proxy flaky.
    return TransientError(f"{type(reason).__name__}: {reason}")


# OpenSSL's reasons when the peer answered the ClientHello with plain text (an HTTP server).
_NOT_TLS_REASONS = {"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"}


def _basic(credentials: Credentials) -> str:
    return base64.b64encode(f"{credentials.username}:{credentials.password}".encode()).decode()


def _header(value: str | None) -> str:
    """A header a registry sent, shown as its words: printable, bounded; "(none)" when absent."""
    return "(none)" if value is None else repr(printable(value)[:100])


def _short(body: bytes) -> str:
    """A registry's own words (an error body), shown as theirs: printable, at most 300 characters."""
    return repr(printable(body[:300].decode(errors="replace").strip()))
