"""The venv sizes record's duplicates (issue 43.4): files of one name and size in two places of the
venv and the base's CUDA toolkit, measured in the image by scripts/venv_sizes.py, read back
validated by buildreport.VenvSizes and shown in the build report."""

from __future__ import annotations

import json

import pytest

from slimeforge.image.builder.buildreport import BuildReport, ReportError, VenvSizes
from slimeforge.scripts import venv_sizes

MIB = 1 << 20


def test_a_library_in_the_toolkit_and_in_a_wheel_is_found_twice_and_the_waste_summed(tmp_path):
    venv, cuda = tmp_path / "venv", tmp_path / "cuda-13.0"
    site = venv / "lib/python3.12/site-packages"
    for d in (site / "nvidia/cu13/lib", site / "other/lib", cuda / "lib64", site / "torch/lib"):
        d.mkdir(parents=True)
    (cuda / "lib64/libcublas.so.13").write_bytes(b"c" * (3 * MIB))
    (site / "nvidia/cu13/lib/libcublas.so.13").write_bytes(b"w" * (3 * MIB))  # same name and size: a copy
    (site / "torch/lib/libc10.so").write_bytes(b"t" * (2 * MIB))
    (site / "other/lib/libc10.so").write_bytes(b"o" * (2 * MIB))
    (site / "torch/lib/small.so").write_bytes(b"s" * 100)
    (site / "other/lib/small.so").write_bytes(b"s" * 100)  # below 1 MiB: not looked at
    doc = venv_sizes.sizes(venv, str(cuda))
    assert doc["duplicates_bytes"] == 5 * MIB
    assert [(d["name"], d["copies"]) for d in doc["duplicates"]] == [("libcublas.so.13", 2), ("libc10.so", 2)]
    assert doc["duplicates"][0]["paths"] == sorted([str(cuda / "lib64/libcublas.so.13"),
                                                    str(site / "nvidia/cu13/lib/libcublas.so.13")])
    assert doc["bytes"] == 7 * MIB + 200  # the toolkit is not the venv's size
    sizes = VenvSizes.parse(json.dumps(doc).encode(), "venv-sizes.json")
    assert sizes.duplicates_bytes == 5 * MIB and sizes.duplicates[0][:3] == ("libcublas.so.13", 3 * MIB, 2)
    report = BuildReport(tag="r:t", human_tags=[], image_id="sha256:" + "1" * 64, build_hash="h", stack="s",
                         flavor="cu13", base={},
                         skipped=False, steps=[], dir="/b", dockerfile="", lock="", log="", command=[],
                         venv_sizes=sizes)
    again = BuildReport.from_dict(json.loads(json.dumps(report.to_json())))
    assert again.venv_sizes == sizes
    assert ("0.01 GB beyond the first "
           "copies") in report.summary_table() and "libcublas.so.13 x2" in report.summary_table()


def test_a_record_without_duplicates_reads_as_before():
    doc = {"schema": 1, "venv": "/opt/venv", "bytes": 10, "largest": [{"path": "bin", "bytes": 10}]}
    sizes = VenvSizes.from_dict(doc)
    assert sizes.duplicates_bytes is None and "duplicates" not in sizes.to_json()
    assert "twice" not in "\n".join(sizes.lines())


def dup_doc(**over) -> dict:
    d = {"name": "libx.so", "bytes": MIB, "copies": 2, "paths": ["/a/libx.so", "/b/libx.so"], **over}
    return {"schema": 1, "venv": "/opt/venv", "bytes": 10, "largest": [], "duplicates_bytes": MIB, "duplicates": [d]}


@pytest.mark.parametrize(("doc", "says"), [
    (dup_doc(name="a/b"), "a file name"),
    (dup_doc(name="x\x1b[2J"), "a file name"),
    (dup_doc(name=".."), "a file name"),
    (dup_doc(copies=1), "from 2"),
    (dup_doc(copies=True), "from 2"),
    (dup_doc(paths=["rel/libx.so"]), "absolute paths"),
    (dup_doc(paths=["/a/../etc/x"]), "absolute paths"),
    (dup_doc(paths=[f"/p{i}" for i in range(5)]), "absolute paths"),
    (dup_doc(paths="/a"), "absolute paths"),
    (dup_doc(bytes=-1), "duplicates[0].bytes"),
    ({**dup_doc(), "duplicates": [{}] * 11}, "at most 10"),
    ({**dup_doc(), "duplicates_bytes": "1"}, "duplicates_bytes"),
])
def test_a_bad_duplicates_record_is_refused_naming_the_key(doc, says):
    with pytest.raises(ReportError) as err:
        VenvSizes.parse(json.dumps(doc).encode(), "venv-sizes.json in image x")
    assert "venv-sizes.json in image x" in str(err.value) and says in str(err.value)
