"""Issue 40, false refusals: a venv directory named anything a file system holds among the largest
(pip's `~orch` leftovers, a space, non-ASCII, bytes that are not UTF-8, a dot-directory, a venv
called `.venv`, control and bidirectional characters, the longest name) is measured, recorded as
printable text and read back into the build report: it never fails the build that made the image."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slimeforge.image.builder.buildreport import BuildReport, ReportError, VenvSizes
from slimeforge.schema import text_problem
from slimeforge.scripts import venv_sizes

NAMES: list[bytes] = [
    b"~orch", b"~orch-2.11.0.dist-info", b"a b", "ünïcödé".encode(), "模型".encode(), b"\xff\xfe-latin1-\xe9",
    b".hidden", b"esc\x1b[2Jx", b"new\nline", b"tab\there", "bidi\u202eevil".encode(), b"back\\slash",
    b"\xff" * 255, b"\x7f\x80", b"-rf", b"$(reboot)",
]


def make_venv(root: Path, names: list[bytes]) -> Path:
    venv = root / ".venv"
    site = os.path.join(os.fsencode(venv), b"lib", b"python3.12", b"site-packages")
    os.makedirs(site)
    for i, name in enumerate(names):
        d = os.path.join(site, name)
        os.mkdir(d)
        with open(os.path.join(d, b"f"), "wb") as fh:
            fh.write(b"x" * (1000 + i))
    return venv


@pytest.mark.parametrize("chunk", [NAMES[:8], NAMES[8:]])
def test_any_directory_name_is_measured_and_read_back_printable(tmp_path, chunk):
    venv = make_venv(tmp_path, chunk)
    out = tmp_path / "venv-sizes.json"
    assert venv_sizes.main([str(venv), str(out)]) == 0
    data = out.read_bytes()
    data.decode("ascii")  # the record is plain ASCII JSON
    sizes = VenvSizes.parse(data, str(out))
    assert sizes.venv == str(venv) and len(sizes.largest) == len(chunk)
    for path, _ in sizes.largest:
        assert text_problem(path) is None and len(path) <= 512 and path.startswith("lib/python3.12/site-packages/")
    for line in sizes.lines():
        assert text_problem(line) is None
    # Into the build report and back (report.json is read by publish and later builds).
    report = BuildReport(tag="t", human_tags=[], image_id="sha256:" + "0" * 64, build_hash="h", stack="s", flavor="f",
                         base={},
                         skipped=False, steps=[], dir="/d", dockerfile="", lock="", log="", command=[],
                         venv_sizes=sizes)
    again = BuildReport.from_dict(json.loads(json.dumps(report.to_json())))
    assert again.venv_sizes == sizes
    assert all(text_problem(line) is None for line in again.summary_table().splitlines())


def test_names_are_shown_so_that_people_can_tell_them_apart():
    shown = venv_sizes.shown
    assert shown("~orch") == "~orch" and shown("a b") == "a b" and shown("ünï") == "ünï" and shown(".venv") == ".venv"
    assert shown(os.fsdecode(b"\xff\xfe")) == "\\xff\\xfe"
    assert shown("esc\x1b[2J") == "esc\\u001b[2J" and shown("bidi\u202e") == "bidi\\u202e"
    assert shown("a\\xff") == "a\\\\xff" != shown(os.fsdecode(b"a\xff"))  # a backslash is not mistaken for a byte
    assert len(shown(os.fsdecode(b"\xff" * 255) * 2)) == 512


@pytest.mark.parametrize("path", ["../etc", "/etc", "a/../b", "a//b", "./a", "", "bin\nx", "x" * 513, "\x1b[2J"])
def test_a_record_that_leaves_the_venv_or_is_unprintable_is_still_refused(path):
    doc = {"schema": 1, "venv": "/opt/.venv", "bytes": 10, "largest": [{"path": path, "bytes": 1}]}
    with pytest.raises(ReportError, match="a path inside the venv") as err:
        VenvSizes.parse(json.dumps(doc).encode(), "venv-sizes.json")
    assert text_problem(str(err.value)) is None


@pytest.mark.parametrize("venv", ["/opt/.venv", "/home/me/my venv", "/opt/ünï", "/opt/\\xff"])
def test_any_venv_path_a_host_may_have_is_accepted(venv):
    doc = {"schema": 1, "venv": venv, "bytes": 10, "largest": [{"path": "bin", "bytes": 1}]}
    assert VenvSizes.parse(json.dumps(doc).encode(), "venv-sizes.json").venv == venv


@pytest.mark.parametrize("data", [b"\xff\xfe", b"{}", json.dumps({"schema": 1, "venv": "rel", "bytes": 1,
                                                                  "largest": []}).encode()])
def test_a_record_that_cannot_be_read_is_a_note_never_a_failed_build(monkeypatch, data):
    """The image is built; its venv measurement is a report's line: an odd one is said and left out."""
    from slimeforge.image.builder import build

    monkeypatch.setattr(build, "read_from_image", lambda client, image_id, names: {names[0]: data})
    said: list[str] = []
    assert build._venv_sizes(None, "sha256:" + "1" * 64, said.append) is None
    assert len(said) == 1 and said[0].startswith("note: ") and "no sizes in the report" in said[0]
    assert text_problem(said[0]) is None


def test_a_directory_that_cannot_be_listed_is_left_out_and_the_script_never_fails(tmp_path):
    venv = make_venv(tmp_path, [b"ok", b"locked"])
    locked = next(venv.glob("lib/python*/site-packages")) / "locked"
    (locked / "inner").mkdir()
    locked.chmod(0)
    try:
        out = tmp_path / "venv-sizes.json"
        assert venv_sizes.main([str(venv), str(out)]) == 0
        assert VenvSizes.parse(out.read_bytes(), str(out)).largest[0][0].endswith("/ok") or os.geteuid() == 0
        assert venv_sizes.main([str(venv),
                                str(tmp_path / "no-such-dir" / "out.json")]) == 0  # not written: said, not failed
    finally:
        locked.chmod(0o755)
