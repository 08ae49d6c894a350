"""`docker save` streams read as input (issue 40): cut short, not a tar, failing midway (the Engine
or the connection to it), a member twice, too many members, an image that is not there, and the
file copies `read_from_image` takes out of an image. Each is a clear error naming the image and the
step, exit 1, never a tarfile/urllib3/requests traceback, and nothing is uploaded (the registry is
never asked: the whole archive is read and checked before the first request)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile

import pytest
import requests
import urllib3
from docker.errors import APIError, NotFound

from slimeforge.errors import OperationFailed
from slimeforge.image import dockerapi
from slimeforge.image.publish import layerpush


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def tar_of(files: list[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def archive(extra: list[tuple[str, bytes]] | None = None, layer_bytes: int = 1) -> tuple[bytes, str]:
    layer = tar_of([("etc/x", os.urandom(layer_bytes))])
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": [sha(layer)]}}).encode()
    image_id = sha(config)
    files = [("l0/layer.tar", layer), (f"{image_id[7:]}.json", config),
             ("manifest.json", json.dumps([{"Config": f"{image_id[7:]}.json", "Layers": ["l0/layer.tar"]}]).encode())]
    return tar_of(files + (extra or [])), image_id


class Engine:
    def __init__(self, chunks=None, error: Exception | None = None):
        self.api = self
        self.chunks, self.error = chunks, error

    def get_image(self, image_id, chunk_size):
        if self.error is not None:
            raise self.error
        return self.chunks()


class Registry:
    """A registry client that must never be asked: the archive is refused before any upload."""

    def __getattr__(self, name):
        raise AssertionError(f"the registry was asked ({name}) before the archive was read whole")


def failing_midway(data: bytes, exc: Exception):
    def gen():
        yield data[: len(data) // 2]
        raise exc
    return gen


GOOD, IMAGE = archive(layer_bytes=300_000)

CASES = {
    "cut short mid-member": (lambda: iter([GOOD[:len(GOOD) // 3]]), None, "not a whole tar archive"),
    "cut short at a header": (lambda: iter([GOOD[:700]]), None, "not a whole tar archive"),
    "not a tar": (lambda: iter([b"<html>502 Bad Gateway</html>" * 40]), None, "not a whole tar archive"),
    "empty stream": (lambda: iter([]), None, "not a whole tar archive"),
    "random bytes": (lambda: iter([os.urandom(10240)]), None, "not a whole tar archive"),
    "connection lost midway (urllib3)": (failing_midway(GOOD, urllib3.exceptions.ProtocolError("Connection broken")),
                                         None, "failed midway"),
    "connection lost midway (requests)": (failing_midway(GOOD, requests.exceptions.ChunkedEncodingError("eof")), None,
                                          "failed midway"),
    "connection reset midway": (failing_midway(GOOD, ConnectionResetError(104, "reset")), None, "failed midway"),
    "the engine refuses": (None, APIError("500 Server Error: Internal Server Error"), "failed midway"),
    "no such image": (None, NotFound("No such image"), "failed midway"),
    "a member twice": (lambda: iter([archive([("manifest.json", b"[]")])[0]]), None, "appears twice"),
    "a member outside the grammar": (lambda: iter([archive([("../../etc/passwd", b"x")])[0]]), None,
                                     "unexpected member"),
    "manifest.json nests deep": (lambda: iter([tar_of([("manifest.json", b"[" * 100000)])]), None, "not JSON"),
    "escape sequences in a member name": (lambda: iter([archive([("\x1b]0;x\x07", b"x")])[0]]), None,
                                          "unexpected member"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_broken_save_stream_is_a_clear_failure_naming_the_image(tmp_path, case):
    chunks, error, words = CASES[case]
    with pytest.raises(layerpush.LayerPushError) as exc:
        layerpush.push(Engine(chunks, error), IMAGE, Registry(), "sf/x", ["t1"], echo=lambda s: None, workdir=tmp_path)  # type: ignore[arg-type]
    text = str(exc.value)
    assert f"docker save of image {IMAGE}" in text and words in text and "nothing was pushed" in text, text
    assert exc.value.exit_code == 1 and "\x1b" not in text and "\x07" not in text
    assert not list(tmp_path.iterdir())  # the compressed layers written so far are gone


def test_too_many_members(tmp_path, monkeypatch):
    monkeypatch.setattr(layerpush, "MAX_MEMBERS", 5)
    data = archive([(f"x{i}", b"") for i in range(10)])[0]
    with pytest.raises(layerpush.LayerPushError, match="more than 5 members"):
        layerpush.push(Engine(lambda: iter([data])), IMAGE, Registry(), "sf/x", ["t1"], echo=lambda s: None,
                       workdir=tmp_path)  # type: ignore[arg-type]


def test_a_full_disk_for_the_compressed_layers_is_said(tmp_path, monkeypatch):
    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(layerpush, "_compress_stream", full)
    monkeypatch.setattr(layerpush, "SMALL_BYTES", 1000)
    with pytest.raises(layerpush.LayerPushError, match="No space left on device"):
        layerpush.push(Engine(lambda: iter([GOOD])), IMAGE, Registry(), "sf/x", ["t1"], echo=lambda s: None,
                       workdir=tmp_path)  # type: ignore[arg-type]


# --- read_from_image: the Engine's get_archive answer ---------------------------------------------


class Container:
    def __init__(self, answer):
        self.answer, self.removed = answer, False

    def get_archive(self, path):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer(), {}

    def remove(self, force):
        self.removed = True


class Client:
    def __init__(self, answer):
        self.container = Container(answer)
        self.containers = self

    def create(self, image_id, command):
        return self.container


def _symlink_tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("stack.lock.json")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/shadow"
        tar.addfile(info)
    return out.getvalue()


READS = {
    "not a tar": lambda: iter([b"garbage" * 200]),
    "empty tar": lambda: iter([tar_of([])]),
    "cut short": lambda: iter([tar_of([("stack.lock.json", b"x" * 5000)])[:2000]]),
    "a symlink": lambda: iter([_symlink_tar()]),
    "failing midway": failing_midway(tar_of([("stack.lock.json", b"x" * 5000)]),
                                     urllib3.exceptions.ProtocolError("broken")),
    "too large": lambda: iter([b"\0" * (2 << 20)] * 40),
}


@pytest.mark.parametrize("case", list(READS))
def test_a_file_read_out_of_an_image_is_checked(case, monkeypatch):
    monkeypatch.setattr(dockerapi, "READ_MAX_BYTES", 1 << 20) if case == "too large" else None
    client = Client(READS[case])
    with pytest.raises(OperationFailed) as exc:
        dockerapi.read_from_image(client, "sha256:" + "c" * 64, ["/x/stack.lock.json"],
                                  max_bytes=dockerapi.READ_MAX_BYTES)
    assert "image sha256:cccccccccccc" in str(exc.value) and exc.value.exit_code == 1
    assert client.container.removed


def test_a_file_that_is_not_in_the_image_stays_not_found():
    client = Client(NotFound("no such file"))
    with pytest.raises(NotFound):
        dockerapi.read_from_image(client, "sha256:" + "c" * 64, ["/x/venv-sizes.json"])
    assert client.container.removed


def test_a_whole_file_is_read():
    client = Client(lambda: iter([tar_of([("stack.lock.json", b'{"a": 1}')])]))
    assert dockerapi.read_from_image(client, "sha256:" + "c" * 64,
                                     ["/x/stack.lock.json"]) == {"/x/stack.lock.json": b'{"a": 1}'}
