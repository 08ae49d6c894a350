"""Where a registry credential may go (docs/publish.md), against real HTTP servers on this host:
a registry stand-in that redirects or names a token service elsewhere, and the token service."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slimeforge.image.remote.hosts import plain_http_allowed, same_site
from slimeforge.image.remote.registry import Credentials, RegistryAPI, RegistryAuthError, Retry

CREDS = Credentials("publisher", "s3cret-password", "test")
BASIC = "Basic " + base64.b64encode(b"publisher:s3cret-password").decode()
MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": {"digest": "sha256:" + "a" * 64}}).encode()


class Server:
    """A real HTTP server on a free port; `handle(handler)` answers, `seen` keeps each request's headers."""

    def __init__(self, handle, bind: str = "127.0.0.1"):
        self.seen: list[dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the stdlib's name
                outer.seen.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
                status, headers, body = handle(self)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer((bind, 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers():
    made: list[Server] = []

    def make(handle, bind="127.0.0.1"):
        made.append(Server(handle, bind))
        return made[-1]

    yield make
    for s in made:
        s.close()


def own_address() -> str:
    """This host's address on its network (not loopback); a test needing one skips without it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("198.51.100.1", 9))  # TEST-NET-2; no packet is sent: this only picks the route's source
        except OSError:
            pytest.skip("no non-loopback address on this host")
        ip = s.getsockname()[0]
    if ip.startswith("127."):
        pytest.skip("no non-loopback address on this host")
    return ip


def manifest_ok(_req):
    return 200, {"Content-Type": "application/vnd.oci.image.manifest.v1+json",
                 "Docker-Content-Digest": "sha256:" + hashlib.sha256(MANIFEST).hexdigest()}, MANIFEST


def test_redirect_to_another_host_drops_the_authorization(servers):
    other = servers(manifest_ok)

    def registry(req):
        if req.headers.get("Authorization") != BASIC:
            return 401, {"WWW-Authenticate": 'Basic realm="test"'}, b""
        return 302, {"Location": f"http://127.0.0.1:{other.port}{req.path}"}, b""

    reg = servers(registry)
    got = RegistryAPI(f"127.0.0.1:{reg.port}", CREDS, retry=Retry(attempts=1)).manifest("sf/x", "t1")
    assert got is not None and got.config_digest == "sha256:" + "a" * 64
    assert reg.seen[-1]["authorization"] == BASIC  # the registry itself got the password (loopback)
    assert [h.get("authorization") for h in other.seen] == [None]  # the other origin never did


def test_bearer_realm_on_another_host_gets_no_password(servers):
    ip = own_address()
    token = servers(lambda req: (401, {}, b'{"errors": "anonymous refused"}'), bind="0.0.0.0")
    reg = servers(lambda req: (401,
                               {"WWW-Authenticate": 'Bearer '
                                                    f'realm="http://{ip}:{token.port}/token",service="reg"'}, b""))
    with pytest.raises(RegistryAuthError, match="did not send it the password"):
        RegistryAPI(f"127.0.0.1:{reg.port}", CREDS, retry=Retry(attempts=1)).manifest("sf/x", "t1")
    assert len(token.seen) == 1 and "authorization" not in token.seen[0]


def test_bearer_realm_on_the_registry_host_gets_the_password(servers):
    def token_service(req):
        if req.headers.get("Authorization") != BASIC:
            return 401, {}, b""
        return 200, {"Content-Type": "application/json"}, b'{"token": "tok-1"}'

    token = servers(token_service)

    def registry(req):
        if req.headers.get("Authorization") == "Bearer tok-1":
            return manifest_ok(req)
        return 401, {"WWW-Authenticate": f'Bearer realm="http://127.0.0.1:{token.port}/token",service="reg"'}, b""

    reg = servers(registry)
    assert RegistryAPI(f"127.0.0.1:{reg.port}", CREDS, retry=Retry(attempts=1)).manifest("sf/x", "t1") is not None
    assert token.seen[0]["authorization"] == BASIC and "scope=repository%3Asf%2Fx%3Apull" in token.seen[0]["path"]


def test_basic_challenge_over_plain_http_off_loopback_gets_no_password(servers):
    ip = own_address()
    reg = servers(lambda req: (401, {"WWW-Authenticate": 'Basic realm="test"'}, b""), bind="0.0.0.0")
    # The daemon's insecure-registries would let it speak plain HTTP there; the password still stays home.
    api = RegistryAPI(f"{ip}:{reg.port}", CREDS, retry=Retry(attempts=1), insecure=[f"{ip}:{reg.port}"])
    with pytest.raises(RegistryAuthError, match="only to a loopback registry"):
        api.manifest("sf/x", "t1")
    assert all("authorization" not in h for h in reg.seen)


def test_plain_http_registry_off_loopback_is_a_final_error_not_retried(servers):
    ip = own_address()
    reg = servers(manifest_ok, bind="0.0.0.0")
    sleeps: list[float] = []
    api = RegistryAPI(f"{ip}:{reg.port}", None, retry=Retry(attempts=4, sleep=sleeps.append))
    with pytest.raises(Exception, match="does not speak TLS") as info:
        api.manifest("sf/x", "t1")
    assert type(info.value).__name__ == "RegistryError" and sleeps == [] and reg.seen == []


@pytest.mark.parametrize(("registry", "insecure", "expected"), [
    ("127.0.0.1:5000", [], True), ("localhost:5000", [], True), ("[::1]:5000", [], True),
    ("10.1.2.3:5000", [], False), ("10.1.2.3:5000", ["10.0.0.0/8"], True), ("reg.example.com:5000",
                                                                            ["reg.example.com:5000"], True),
    ("reg.example.com", ["other.example.com"], False), ("ghcr.io", ["127.0.0.0/8"], False),
])
def test_plain_http_follows_dockers_rule(registry, insecure, expected):
    assert plain_http_allowed(registry, insecure) is expected


@pytest.mark.parametrize(("registry", "realm", "expected"), [
    ("ghcr.io", "ghcr.io", True), ("registry-1.docker.io", "auth.docker.io", True), ("registry.gitlab.com",
                                                                                     "gitlab.com", True),
    ("registry.gitlab.com", "evil.com", False), ("quay.io", "auth.quay.io.evil.com", False), ("example.com",
                                                                                              "auth.com", False),
    ("127.0.0.1:5000", "127.0.0.2", False), ("a.b.co.uk", "b.co.uk", True), ("reg.example.com", "example.com.evil",
                                                                             False),
])
def test_token_service_host_rule(registry, realm, expected):
    assert same_site(registry, realm) is expected
