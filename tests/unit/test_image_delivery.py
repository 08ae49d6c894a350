"""What a node pulls, without services: the --compression option, a manifest's layer compression,
the `docker save` archive layerpush reads (checked against the config before anything is sent),
and the venv sizes record (scripts/venv_sizes.py writes it in the image, the build reads it back)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
import zstandard

from slimeforge.errors import ConfigError
from slimeforge.image.builder.buildreport import BuildReport, ReportError, VenvSizes
from slimeforge.image.publish import layerpush
from slimeforge.image.publish.publish import PublishOptions, describe, plan
from slimeforge.image.remote.registry import RemoteManifest
from slimeforge.scripts import venv_sizes

D = "sha256:" + "ab" * 32


# --- the option and the manifest --------------------------------------------------------------


@pytest.mark.parametrize("value", ["zstd:chunked", "ZSTD", "gzip ", "--zstd", "", "zstd\n", "xz"])
def test_compression_outside_the_grammar_is_refused_naming_the_option(value):
    with pytest.raises(ConfigError) as err:
        plan(PublishOptions(image="slimeforge/cu13:t", registry="reg.example.com:5000/team/slime", compression=value))
    text = str(err.value)
    assert "--compression" in text and "gzip or zstd" in text


def test_zstd_plan_says_who_compresses():
    p = plan(PublishOptions(image="slimeforge/cu13:t", registry="reg.example.com:5000/team/slime", compression="zstd"))
    assert p.compression == "zstd"
    assert any("compressed with zstd by slimeforge" in line for line in describe(p))
    assert plan(PublishOptions(image="slimeforge/cu13:t", registry="reg.example.com:5000/x")).compression == "gzip"


def manifest(*media_types: str) -> RemoteManifest:
    body = json.dumps({"config": {"digest": D}, "layers": [{"mediaType": m} for m in media_types]}).encode()
    return RemoteManifest.parse(body, D, "test")


@pytest.mark.parametrize(("types", "expected"), [
    (["application/vnd.docker.image.rootfs.diff.tar.gzip"] * 2, "gzip"),
    (["application/vnd.oci.image.layer.v1.tar+gzip"], "gzip"),
    (["application/vnd.oci.image.layer.v1.tar+zstd"] * 3, "zstd"),
    (["application/vnd.oci.image.layer.v1.tar+zstd", "application/vnd.oci.image.layer.v1.tar+gzip"], None),  # mixed
    (["application/vnd.oci.image.layer.v1.tar"], None),  # uncompressed
    ([], None),
])
def test_layer_compression_of_a_manifest(types, expected):
    assert manifest(*types).layer_compression == expected


# --- the docker save archive --------------------------------------------------------------------


def layer_tar(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def save_archive(layers: list[bytes], *, diff_ids: list[str] | None = None, link_second_to_first: bool = False,
                 extra: dict[str, bytes] | None = None) -> tuple[bytes, str]:
    """A `docker save` archive as the Engine 20.10 writes it (<id>/layer.tar, <config>.json, manifest.json)."""
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": diff_ids or [sha(x) for x in layers]}}).encode()
    image_id = sha(config)
    out = io.BytesIO()
    names = []
    with tarfile.open(fileobj=out, mode="w") as tar:
        for i, data in enumerate(layers):
            name = f"{i:064x}/layer.tar"
            names.append(name)
            if link_second_to_first and i == 1:
                info = tarfile.TarInfo(name)
                info.type, info.linkname = tarfile.SYMTYPE, f"../{0:064x}/layer.tar"
                tar.addfile(info)
                continue
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, data in {f"{image_id[7:]}.json": config, "manifest.json": json.dumps(
                [{"Config": f"{image_id[7:]}.json", "RepoTags": None, "Layers": names}]).encode(),
                           **(extra or {})}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue(), image_id


def chunks(data: bytes, size: int = 1000):
    return (data[i:i + size] for i in range(0, len(data), size))


def test_save_archive_gives_the_config_and_each_layer_compressed(tmp_path, monkeypatch):
    monkeypatch.setattr(layerpush, "SMALL_BYTES", 12000)  # the big layer streams into a file, the small stays in memory
    big, small = layer_tar({"opt/venv/big": bytes(range(256)) * 100}), layer_tar({"etc/x": b"x"})
    archive, image_id = save_archive([big, small, small], link_second_to_first=False)
    blobs, links = layerpush._read_save(chunks(archive), tmp_path, 3)
    config, layers = layerpush._image_parts(blobs, links, image_id)
    assert sha(config) == image_id and [b.sha256 for b in layers] == [sha(big), sha(small), sha(small)]
    assert layers[0].compressed is not None and layers[1].data == small
    layerpush._finish_small(layers[1], tmp_path, 3)
    for blob, raw in ((layers[0], big), (layers[1], small)):
        packed = blob.compressed.read_bytes()
        assert (sha(packed), len(packed)) == (blob.compressed_sha256, blob.compressed_size)
        assert zstandard.ZstdDecompressor().stream_reader(io.BytesIO(packed)).read() == raw


def test_a_symlinked_layer_is_the_layer_it_points_at(tmp_path):
    a = layer_tar({"a": b"1"})
    archive, image_id = save_archive([a, a], link_second_to_first=True)
    blobs, links = layerpush._read_save(chunks(archive), tmp_path, 3)
    _, layers = layerpush._image_parts(blobs, links, image_id)
    assert layers[0] is layers[1]


def test_a_layer_that_is_not_what_the_config_says_is_refused_before_any_upload(tmp_path):
    a, b = layer_tar({"a": b"1"}), layer_tar({"b": b"2"})
    archive, image_id = save_archive([a, b], diff_ids=[sha(a), sha(a)])
    blobs, links = layerpush._read_save(chunks(archive), tmp_path, 3)
    with pytest.raises(layerpush.LayerPushError, match=r"layer 2 .* has sha256 .* but the config says"):
        layerpush._image_parts(blobs, links, image_id)


def test_an_archive_of_another_image_is_refused(tmp_path):
    archive, _ = save_archive([layer_tar({"a": b"1"})])
    blobs, links = layerpush._read_save(chunks(archive), tmp_path, 3)
    with pytest.raises(layerpush.LayerPushError, match="is not the image"):
        layerpush._image_parts(blobs, links, D)


@pytest.mark.parametrize("name", ["../escape", "a/b/c/d", "sp ace.json", "\x1b.json"])
def test_unexpected_member_names_are_refused(tmp_path, name):
    archive, _ = save_archive([layer_tar({"a": b"1"})], extra={name: b"{}"})
    with pytest.raises(layerpush.LayerPushError, match="unexpected member"):
        layerpush._read_save(chunks(archive), tmp_path, 3)


def test_push_refuses_a_compression_it_does_not_make():
    with pytest.raises(layerpush.LayerPushError, match="gzip is the Docker Engine's own push"):
        layerpush.push(None, D, None, "r", ["t"], compression="gzip")  # type: ignore[arg-type]


# --- the venv sizes record ----------------------------------------------------------------------


def test_venv_sizes_script_measures_each_directory_once(tmp_path):
    venv = tmp_path / "venv"
    site = venv / "lib/python3.12/site-packages"
    (site / "torch/lib").mkdir(parents=True)
    (site / "torch/lib/libtorch.so").write_bytes(b"t" * 5000)
    (site / "six").mkdir()
    (site / "six/__init__.py").write_bytes(b"s" * 100)
    (site / "six/hardlink.py").hardlink_to(site / "six/__init__.py")  # counted once
    (site / "six/link").symlink_to(site / "torch")  # not followed
    (venv / "bin").mkdir()
    (venv / "bin/python").write_bytes(b"p" * 300)
    (site / "top.pth").write_bytes(b"x" * 7)  # outside every candidate: in the total only
    out = tmp_path / "venv-sizes.json"
    assert venv_sizes.main([str(venv), str(out)]) == 0
    sizes = VenvSizes.parse(out.read_bytes(), str(out))
    assert sizes.largest == [("lib/python3.12/site-packages/torch", 5000), ("bin", 300),
                             ("lib/python3.12/site-packages/six", 100)]
    assert sizes.total == 5407 and sizes.venv == str(venv)


def sizes_doc(**over) -> dict:
    return {"schema": 1, "venv": "/opt/venv", "bytes": 100, "largest": [{"path": "lib/python3.12/site-packages/torch",
                                                                         "bytes": 90},
                                                                         {"path": "bin", "bytes": 5}], **over}


@pytest.mark.parametrize(("doc", "says"), [
    (sizes_doc(schema=2), "schema 1"),
    (sizes_doc(venv="opt/venv"), "absolute path"),
    (sizes_doc(venv="/opt/../etc"), "absolute path"),
    (sizes_doc(bytes=-1), "whole number of bytes"),
    (sizes_doc(bytes=True), "whole number of bytes"),
    (sizes_doc(bytes=1.5), "whole number of bytes"),
    (sizes_doc(largest=[{"path": "../etc", "bytes": 1}]), "a path inside the venv"),
    (sizes_doc(largest=[{"path": "/etc", "bytes": 1}]), "a path inside the venv"),
    (sizes_doc(largest=[{"path": "bin\nx", "bytes": 1}]), "a path inside the venv"),
    (sizes_doc(largest=[{"path": "bin", "bytes": 1}, {"path": "lib", "bytes": 2}]), "largest first"),
    (sizes_doc(largest=[{"path": f"d{i}", "bytes": 1} for i in range(11)]), "at most 10"),
    (sizes_doc(largest="bin"), "at most 10"),
])
def test_a_bad_venv_sizes_record_is_refused_naming_the_key(doc, says):
    with pytest.raises(ReportError) as err:
        VenvSizes.parse(json.dumps(doc).encode(), "venv-sizes.json in image x")
    assert "venv-sizes.json in image x" in str(err.value) and says in str(err.value)


@pytest.mark.parametrize(("data", "says"), [
    (b"[" * 40 + b"]" * 40, "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b" " * (65 << 10), "more than"),
])
def test_a_venv_sizes_record_that_is_no_record_is_refused(data, says):
    with pytest.raises(ReportError, match=says):
        VenvSizes.parse(data, "venv-sizes.json")


def test_the_report_keeps_the_sizes_and_shows_them():
    sizes = VenvSizes.from_dict(sizes_doc())
    report = BuildReport(tag="r:t", human_tags=[], image_id=D, build_hash="h", stack="s", flavor="cu13", base={},
                         skipped=False,
                         steps=[], dir="/b", dockerfile="", lock="", log="", command=[], venv_sizes=sizes)
    doc = json.loads(json.dumps(report.to_json()))
    assert doc["venv_sizes"] == {k: v for k, v in sizes_doc().items() if k != "schema"}
    assert BuildReport.from_dict(doc).venv_sizes == sizes
    table = report.summary_table()
    assert "venv /opt/venv: 0.00 GB; largest directories:" in table and "lib/python3.12/site-packages/torch" in table
    with pytest.raises(ReportError, match="report.json: venv_sizes"):
        BuildReport.from_dict({**doc, "venv_sizes": {**doc["venv_sizes"], "venv": "x"}})


def test_the_dockerfile_measures_the_venv_last(tmp_path):
    from slimeforge.image.builder.build import render_dockerfile
    from slimeforge.image.stack import load_stack

    text = render_dockerfile(load_stack("cu13"))
    last_run = text[text.rindex("\nRUN "):]
    assert "/opt/slimeforge/sf finalize" in last_run
    assert last_run.rstrip().endswith("&& /opt/venv/bin/python -I /opt/slimeforge/venv_sizes.py /opt/venv "
                                      "/opt/slimeforge/venv-sizes.json")
    assert "venv_sizes.py" in text[text.rindex("\nCOPY "):]  # copied with the scripts that run last
    assert Path(venv_sizes.__file__).name == "venv_sizes.py"


@pytest.mark.parametrize("location", ["https://uploads.example.net/v2/r/blobs/uploads/x", "ftp://127.0.0.1:5000/x",
                                      "http://127.0.0.1:5000/v2/r/blobs/uploads/x"])
def test_an_upload_location_off_the_registry_is_refused(location):
    """The bytes (and the Authorization header) go only to the registry itself; plain HTTP only
    where the registry was reached over it."""
    from slimeforge.image.remote.registry import RegistryAPI, RegistryError

    with pytest.raises(RegistryError, match="not its own host"):
        RegistryAPI("127.0.0.1:5000")._same_origin(location)
    assert RegistryAPI("127.0.0.1:5000")._same_origin("https://127.0.0.1:5000/v2/r/blobs/uploads/x?_state=s")


def test_an_upload_location_on_another_port_is_refused():
    from slimeforge.image.remote.registry import RegistryAPI, RegistryError

    with pytest.raises(RegistryError, match="not its own host"):
        RegistryAPI("127.0.0.1:5000")._same_origin("https://127.0.0.1:5001/v2/r/blobs/uploads/x")
