"""A zstd publish (the Docker Engine's `docker save`, slimeforge's own pushes) to the real registry
behind a proxy on 127.0.0.1 that misbehaves (issue 40):

- it says it has every blob it lacks (HEAD: 200, no Docker-Content-Digest): slimeforge uploads each
  again, and the registry behind holds the whole image afterwards (checked there, not through the proxy);
- it also swallows the uploads: the publish fails (exit 1, named, no traceback), nothing is
  recorded, and the registry behind has no manifest for the tag (nothing pushed over nothing);
- it drips the answer to a manifest request: the publish ends by the request's deadline, named."""

from __future__ import annotations

import http.client
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from publish_support import LocalRegistry

from slimeforge.image.publish.publish import PublishOptions, plan, publish
from slimeforge.image.remote import registry as registry_mod
from slimeforge.image.remote.registry import RegistryAPI, RegistryFailed, Retry

pytestmark = [pytest.mark.docker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


class Proxy:
    """Forwards every request to the registry at `upstream`, except where `mode` says otherwise:
    "claims blobs" (HEAD of a missing blob: 200 and no digest), "swallows uploads" (that, and a blob
    PUT is answered 201 without reaching the registry), "drips manifests" (a manifest GET's answer
    a byte every 0.2 s, at most 200 bytes)."""

    def __init__(self, upstream: str, mode: str):
        self.mode, self.stop = mode, threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                path = self.path.split("?")[0]
                if outer.mode == "drips manifests" and self.command == "GET" and "/manifests/" in path:
                    self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                    for byte in b"Content-Type: application/json\r\nContent-Length: 2000\r\n\r\n" + b" " * 140:
                        if outer.stop.is_set():
                            break
                        try:
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                        except OSError:
                            break
                        time.sleep(0.2)
                    self.close_connection = True
                    return
                if outer.mode == "swallows uploads" and self.command == "PUT" and "/blobs/uploads/" in path:
                    return self._reply(201, {"Docker-Content-Digest": self.path.split("digest=")[1].replace("%3A",
                                                                                                            ":")}, b"")
                conn = http.client.HTTPConnection(upstream, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body if self.command in ("PUT", "POST", "PATCH") else None,
                             headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                answer = {k: v for k, v in resp.getheaders() if k.lower() not in ("connection", "transfer-encoding",
                                                                                  "content-length")}
                conn.close()
                if "Location" in answer:  # the registry names itself; the client must stay on the proxy
                    answer["Location"] = answer["Location"].replace(upstream, outer.host)
                if outer.mode in ("claims blobs",
                                  "swallows "
                                  "uploads") and self.command == "HEAD" and "/blobs/" in path and resp.status == 404:
                    return self._reply(200, {}, b"")  # "I have it", without saying what
                self._reply(resp.status, answer, data,
                            length=resp.getheader("Content-Length") if self.command == "HEAD" else None)

            def _reply(self, status, headers, data, length=None):
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)) if length is None else length)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = _any  # noqa: N815 - the stdlib's names

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def plain_registry(docker_engine, tmp_path_factory):
    reg = LocalRegistry(tmp_path_factory.mktemp("hostile-registry"), None, tls=False).start()
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def small_image(docker_engine):
    """A one-layer image imported from a tar (no base image needed), unique to this module."""
    import docker

    client = docker.from_env()
    marker = uuid.uuid4().hex
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        data = (marker * 5000).encode()
        info = tarfile.TarInfo("slimeforge-hostile-test")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    ref = f"slimeforge-hostile-test/x:{marker[:12]}"
    client.api.import_image_from_data(layer.getvalue(), repository=ref.split(":")[0], tag=marker[:12])
    image_id = client.api.inspect_image(ref)["Id"]
    yield {"ref": ref, "id": image_id, "tag": marker[:12]}
    client.api.remove_image(image_id, force=True)


@pytest.fixture
def proxy():
    made: list[Proxy] = []

    def make(upstream, mode):
        made.append(Proxy(upstream, mode))
        return made[-1]

    yield make
    for p in made:
        p.close()


def test_blobs_the_registry_only_claims_are_uploaded_again(plain_registry, small_image, proxy, tmp_path):
    p = proxy(plain_registry.host, "claims blobs")
    repo = f"hostile/claims-{uuid.uuid4().hex[:8]}"
    said: list[str] = []
    record = publish(plan(PublishOptions(image=small_image["ref"], registry=f"{p.host}/{repo}", compression="zstd",
                                         record=str(tmp_path / "rec.json"))), echo=said.append, retry=Retry(attempts=1))
    assert any("says it has it, but answered HTTP 200, Docker-Content-Digest (none)" in s for s in said), said
    # The registry behind the proxy holds the whole image: the manifest by its digest, each blob at its size.
    direct = RegistryAPI(plain_registry.host, None, retry=Retry(attempts=1), echo=lambda s: None)
    seen = direct.manifest(repo, record["digest"])
    assert seen is not None and seen.config_digest == small_image["id"]
    for blob in [json.loads(seen.raw)["config"], *json.loads(seen.raw)["layers"]]:
        assert direct.has_blob(repo, blob["digest"], blob["size"]) is True


def test_a_registry_that_never_keeps_what_it_is_sent_fails_the_publish_and_records_nothing(plain_registry, small_image,
                                                                                           proxy, tmp_path):
    p = proxy(plain_registry.host, "swallows uploads")
    repo = f"hostile/swallows-{uuid.uuid4().hex[:8]}"
    out = subprocess.run([sys.executable, "-m", "invoke", "publish", "--image", small_image["ref"], "--registry",
                          f"{p.host}/{repo}",
                          "--compression", "zstd", "--record", str(tmp_path / "rec.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and f"{p.host}: blob sha256:" in out.stderr and ("does not hold what it was "
                                                                                         "sent") in out.stderr
    assert not (tmp_path / "rec.json").exists()
    direct = RegistryAPI(plain_registry.host, None, retry=Retry(attempts=1), echo=lambda s: None)
    assert direct.manifest(repo, small_image["tag"]) is None  # no manifest pushed over nothing


def test_a_registry_that_drips_its_answer_ends_the_publish_by_the_deadline(plain_registry, small_image, proxy,
                                                                           tmp_path, monkeypatch):
    p = proxy(plain_registry.host, "drips manifests")
    monkeypatch.setattr(registry_mod, "DEADLINE_S", 3.0)
    started = time.monotonic()
    with pytest.raises(RegistryFailed) as exc:
        publish(plan(PublishOptions(image=small_image["ref"], registry=f"{p.host}/hostile/drip", compression="zstd",
                                    record=str(tmp_path / "rec.json"))), echo=lambda s: None, retry=Retry(attempts=1))
    assert time.monotonic() - started < 20
    assert "no complete answer within 3 s" in str(exc.value) and "GET /v2/hostile/drip/manifests/" in str(exc.value)
    assert not (tmp_path / "rec.json").exists()
