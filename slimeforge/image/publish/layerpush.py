"""Pushing an image whose layers slimeforge compresses itself (`invoke publish --compression zstd`).

A Docker Engine with the classic image store keeps layers uncompressed and gzips them as it pushes;
nothing asks it for another compression (BuildKit's image exporter can, but only for a build, and
not through this Engine's embedded BuildKit). So for zstd, publish reads the built image out of the
Engine (`docker save`: the config, and each layer as an uncompressed tar), compresses each layer,
uploads each blob the registry lacks, and puts an OCI image manifest under each tag.

The image stays the image that was built: the config is uploaded byte for byte (its digest is the
local image ID, which publish then verifies at the registry), and each layer's uncompressed sha256
is checked against the config's `rootfs.diff_ids` as it is read, before anything is uploaded.

    push(docker, image_id, api, repository, tags) -> PushResult   (tag -> manifest digest, per-layer figures)
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

from ...errors import OperationFailed
from ...schema import printable
from ..remote.registry import RegistryAPI

COMPRESSIONS = ("gzip", "zstd")  # gzip: the Engine's own push (the default); zstd: this module
COMPRESSION_RE = re.compile("|".join(COMPRESSIONS))
# BuildKit's default zstd level, and its compression for the level: 3 costs about what gzip's
# decompression costs to compress, and decompresses several times faster (benchmarks/image_pull_bench.py).
ZSTD_LEVEL = 3
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_TYPES = {"zstd": "application/vnd.oci.image.layer.v1.tar+zstd"}
# `docker save` members kept in memory (the config, manifest.json, small layers); larger ones are
# compressed into a temporary file as they stream by. The config must be among the small ones.
SMALL_BYTES = 4 << 20
MANIFEST_JSON_MAX = 1 << 20
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
_MEMBER_RE = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+){0,2}")  # <id>/layer.tar, blobs/sha256/<hex>, <id>.json
CHUNK = 1 << 20
MAX_MEMBERS = 100_000  # an image of a few hundred layers has a few per layer


class LayerPushError(OperationFailed):
    """The image read out of the Docker Engine is not what its config says (exit 1; the whole archive
    is read and checked before the first upload, so nothing was sent)."""


@dataclass(frozen=True)
class LayerFigures:
    """One layer as pushed: its digests, sizes and the seconds spent compressing and uploading it."""

    diff_id: str
    digest: str
    size: int  # compressed bytes (what a node downloads)
    uncompressed: int
    compress_s: float
    upload_s: float | None  # None: the registry had it already

    def to_json(self) -> dict[str, object]:
        return {"diff_id": self.diff_id, "digest": self.digest, "size": self.size, "uncompressed": self.uncompressed,
                "compress_s": round(self.compress_s, 3),
                "upload_s": None if self.upload_s is None else round(self.upload_s, 3)}


@dataclass
class PushResult:
    manifests: dict[str, str] = field(default_factory=dict)  # tag -> manifest digest
    layers: list[LayerFigures] = field(default_factory=list)


@dataclass
class _Blob:
    """A `docker save` member: its uncompressed sha256 and size, and either its bytes (small) or
    the temporary file holding it compressed."""

    sha256: str
    size: int
    data: bytes | None = None
    compressed: Path | None = None
    compressed_sha256: str = ""
    compressed_size: int = 0
    compress_s: float = 0.0


class _ChunkReader(io.RawIOBase):
    """A file over the Engine's chunked `docker save` stream, for tarfile's streaming mode."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks: Iterator[bytes] = iter(chunks)
        self._rest = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._rest:
            try:
                self._rest = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(buffer), len(self._rest))
        buffer[:n] = self._rest[:n]
        self._rest = self._rest[n:]
        return n


def _compressor(level: int):
    import zstandard

    # threads=-1: one worker per core; zstd's output does not depend on how many there are.
    return zstandard.ZstdCompressor(level=level, threads=-1)


def _compress_stream(read: Callable[[int], bytes], out: IO[bytes], level: int) -> tuple[str, int, str, int]:
    """Compress what `read` yields into `out`: (sha256, size) of the input and of the output."""
    raw, packed = hashlib.sha256(), hashlib.sha256()
    raw_size = packed_size = 0

    class _Counting(io.RawIOBase):
        def writable(self) -> bool:
            return True

        def write(self, b: Any) -> int:
            nonlocal packed_size
            data = bytes(b)
            packed.update(data)
            packed_size += len(data)
            out.write(data)
            return len(data)

    sink = _Counting()
    with _compressor(level).stream_writer(sink, closefd=False) as writer:
        while chunk := read(CHUNK):
            raw.update(chunk)
            raw_size += len(chunk)
            writer.write(chunk)
    return "sha256:" + raw.hexdigest(), raw_size, "sha256:" + packed.hexdigest(), packed_size


def _read_save(chunks: Iterable[bytes], workdir: Path, level: int) -> tuple[dict[str, _Blob], dict[str, str]]:
    """Every regular member of a `docker save` stream, by name; symlinks as name -> target name."""
    blobs: dict[str, _Blob] = {}
    links: dict[str, str] = {}
    count = 0
    with tarfile.open(fileobj=io.BufferedReader(_ChunkReader(chunks), CHUNK), mode="r|") as tar:
        for member in tar:
            name = member.name.removeprefix("./")
            if member.isdir():
                continue
            if not _MEMBER_RE.fullmatch(name) or ".." in name.split("/"):
                raise LayerPushError(f"docker save: unexpected member {printable(member.name)[:200]!r}")
            if name in blobs or name in links:
                raise LayerPushError(f"docker save: member {name!r} appears twice (which one is the image's?)")
            count += 1
            if count > MAX_MEMBERS:
                raise LayerPushError(f"docker save: more than {MAX_MEMBERS} members: not an image archive")
            if member.issym():
                links[name] = str(PurePosixPath(name).parent / member.linkname)
                continue
            if not member.isfile():
                continue
            fh = tar.extractfile(member)
            if fh is None:
                raise LayerPushError(f"docker save: member {name!r} cannot be read")
            if member.size <= SMALL_BYTES:
                data = fh.read()
                blobs[name] = _Blob("sha256:" + hashlib.sha256(data).hexdigest(), len(data), data=data)
                continue
            started = time.monotonic()
            target = workdir / f"{len(blobs)}.zst"
            with target.open("wb") as out:
                sha, size, csha, csize = _compress_stream(fh.read, out, level)
            blobs[name] = _Blob(sha, size, compressed=target, compressed_sha256=csha, compressed_size=csize,
                                compress_s=time.monotonic() - started)
    return blobs, links


def read_image(docker, image_id: str, workdir: Path, level: int) -> tuple[bytes, list[_Blob]]:
    """`docker save` of `image_id`: its config and its layers, each checked against the config and compressed
    (`_read_save`, `_image_parts`). A stream that is not a tar, is cut short, or fails midway (the Engine, the
    connection to it, the disk the compressed layers go to) is a LayerPushError naming the image and the step, before
    anything is uploaded: the whole archive is read and checked first."""
    import requests
    import urllib3
    import zstandard
    from docker.errors import DockerException

    step = f"docker save of image {image_id}"
    try:
        blobs, links = _read_save(docker.api.get_image(image_id, chunk_size=CHUNK), workdir, level)
        config, layers = _image_parts(blobs, links, image_id)
        for blob in layers:
            _finish_small(blob, workdir, level)
        return config, layers
    except LayerPushError as exc:
        raise LayerPushError(f"{step}: {str(exc).removeprefix('docker save: ')}; nothing was pushed") from None
    except (tarfile.TarError, EOFError) as exc:
        raise LayerPushError(f"{step}: the Docker Engine's stream is not a whole tar archive "
                             f"({printable(str(exc))[:200]}); "
                             "nothing was pushed: check `docker save` of it works here, then publish again") from None
    except (DockerException, requests.RequestException, urllib3.exceptions.HTTPError, ConnectionError) as exc:
        raise LayerPushError(f"{step}: the Docker Engine failed midway ({type(exc).__name__}: "
                             f"{printable(str(exc))[:300]}); "
                             "nothing was pushed: publish again once `docker info` answers") from None
    except zstandard.ZstdError as exc:
        raise LayerPushError(f"{step}: compressing a layer failed ({printable(str(exc))[:200]}); nothing was "
                             "pushed") from None
    except OSError as exc:
        raise LayerPushError(f"{step}: cannot write the compressed layers to {workdir} ({exc.strerror or exc}); "
                             "nothing was pushed: "
                             "free space there (or set TMPDIR), then publish again") from None


def _resolve(name: str, blobs: dict[str, _Blob], links: dict[str, str]) -> _Blob:
    seen = set()
    while name in links and name not in seen:
        seen.add(name)
        name = str(PurePosixPath(links[name]))
        parts: list[str] = []
        for part in name.split("/"):
            if part == "..":
                if parts:
                    parts.pop()
            elif part not in ("", "."):
                parts.append(part)
        name = "/".join(parts)
    if name not in blobs:
        raise LayerPushError(f"docker save: {name!r} is named by manifest.json but is not in the archive")
    return blobs[name]


def _image_parts(blobs: dict[str, _Blob], links: dict[str, str], image_id: str) -> tuple[bytes, list[_Blob]]:
    """The config (bytes) and the layers in order, each checked against the config's diff_ids."""
    index = blobs.get("manifest.json")
    if index is None or index.data is None or index.size > MANIFEST_JSON_MAX:
        raise LayerPushError("docker save: no manifest.json (or one over 1 MB) in the archive")
    try:
        entries = json.loads(index.data)
    except (ValueError, RecursionError) as exc:
        raise LayerPushError(f"docker save: manifest.json is not JSON ({exc})") from None
    if not (isinstance(entries, list) and len(entries) == 1 and isinstance(entries[0], dict)):
        raise LayerPushError("docker save: manifest.json does not describe exactly one image")
    entry = entries[0]
    config_name, layer_names = entry.get("Config"), entry.get("Layers")
    if not isinstance(config_name, str) or not isinstance(layer_names, list) or not all(isinstance(n, str) for n
                                                                                        in layer_names):
        raise LayerPushError("docker save: manifest.json lacks Config or Layers")
    config_blob = _resolve(config_name, blobs, links)
    if config_blob.data is None:
        raise LayerPushError(f"docker save: the image config is over {SMALL_BYTES >> 20} MB")
    if config_blob.sha256 != image_id:
        raise LayerPushError(f"docker save: the config's digest {config_blob.sha256} is not the image {image_id}")
    try:
        diff_ids = json.loads(config_blob.data)["rootfs"]["diff_ids"]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise LayerPushError("docker save: the image config has no rootfs.diff_ids "
                             f"({printable(str(exc))[:200]})") from None
    if not isinstance(diff_ids, list) or len(diff_ids) != len(layer_names):
        raise LayerPushError(f"docker save: {len(layer_names)} layers, but the config lists {diff_ids!r:.200}")
    layers = []
    for i, (name, diff_id) in enumerate(zip(layer_names, diff_ids, strict=True)):
        blob = _resolve(name, blobs, links)
        if not (isinstance(diff_id, str) and _DIGEST_RE.fullmatch(diff_id)) or blob.sha256 != diff_id:
            raise LayerPushError(f"docker save: layer {i + 1} ({name}) has sha256 {blob.sha256}, but the config says "
                                 f"{diff_id!r}")
        layers.append(blob)
    return config_blob.data, layers


def _finish_small(blob: _Blob, workdir: Path, level: int) -> None:
    """A layer small enough to have been kept in memory: compress it now."""
    if blob.compressed is not None or blob.data is None:
        return
    started = time.monotonic()
    blob.compressed = workdir / f"small-{blob.sha256[7:23]}.zst"
    with blob.compressed.open("wb") as out:
        _, _, blob.compressed_sha256, blob.compressed_size = _compress_stream(io.BytesIO(blob.data).read, out, level)
    blob.compress_s = time.monotonic() - started


def push(docker, image_id: str, api: RegistryAPI, repository: str, tags: list[str], *, compression: str = "zstd",
         level: int = ZSTD_LEVEL, echo: Callable[[str], None] = print, workdir: Path | None = None) -> PushResult:
    """Push the local image `image_id` to `repository` under each of `tags`, its layers compressed
    with `compression`; every tag gets the same OCI manifest. Temporary files (the compressed layers)
    go to `workdir` (default: the system's temporary directory) and are removed after."""
    if compression not in LAYER_TYPES:
        raise LayerPushError(f"compression {compression!r}: this path compresses only {', '.join(LAYER_TYPES)} "
                             "(gzip is the Docker Engine's own push)")
    result = PushResult()
    with tempfile.TemporaryDirectory(prefix="sf-layerpush-", dir=workdir) as tmp:
        echo(f"reading image {image_id[:19]} from the Docker Engine and compressing its layers ({compression} level "
             f"{level})")
        config, layers = read_image(docker, image_id, Path(tmp), level)
        descriptors = []
        for i, blob in enumerate(layers, 1):
            assert blob.compressed is not None  # read_image compressed every layer
            upload_s = None
            if api.has_blob(repository, blob.compressed_sha256, blob.compressed_size):
                echo(f"  layer {i}/{len(layers)} {blob.compressed_sha256[7:19]}  already in the registry")
            else:
                started = time.monotonic()
                api.upload_blob(repository, blob.compressed_sha256, blob.compressed_size, blob.compressed)
                upload_s = time.monotonic() - started
                echo(f"  layer {i}/{len(layers)} {blob.compressed_sha256[7:19]}  pushed {_mb(blob.compressed_size)} "
                     f"({_mb(blob.size)} uncompressed)")
            result.layers.append(LayerFigures(blob.sha256, blob.compressed_sha256, blob.compressed_size, blob.size,
                                              blob.compress_s, upload_s))
            descriptors.append({"mediaType": LAYER_TYPES[compression], "digest": blob.compressed_sha256,
                                "size": blob.compressed_size})
        if not api.has_blob(repository, image_id, len(config)):
            with tempfile.NamedTemporaryFile(dir=tmp, delete=False) as fh:
                fh.write(config)
            api.upload_blob(repository, image_id, len(config), Path(fh.name))
        manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                               "config": {"mediaType": OCI_CONFIG, "digest": image_id, "size": len(config)},
                               "layers": descriptors}, separators=(",", ":")).encode()
        for tag in tags:
            result.manifests[tag] = api.put_manifest(repository, tag, manifest, OCI_MANIFEST)
    return result


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
