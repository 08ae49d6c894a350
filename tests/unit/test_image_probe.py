"""slimeforge's image probe (scripts/image_probe.py) run here with this interpreter, as it runs
inside an image with the image's python3, and its answer read back as input (imageprobe.parse_facts).
The probe inside a real image, and its cache by image ID: tests/integration/test_any_image.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import flag_standin as fs
import pytest

from slimeforge import paths
from slimeforge.run import imageprobe

SCRIPT = paths.SCRIPTS / "image_probe.py"
ID = "sha256:" + "ab" * 32


def probe(*args: str) -> dict:
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def git(repo: Path, *args: str) -> str:
    ident = ["-c", "user.name=t", "-c", "user.email=t@t"]
    return subprocess.run(["git", *ident, "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def checkouts(tmp_path):
    slime = fs.write(tmp_path / "slime", fs.slime_files(inline_megatron=False))
    megatron = fs.write(tmp_path / "Megatron-LM", fs.MEGATRON_FILES)
    git(slime, "init", "-q")
    git(slime, "add", "-A")
    git(slime, "commit", "-qm", "stand-in")
    git(slime, "pack-refs", "--all")  # the branch's commit only in packed-refs, as a fresh clone has it
    return slime, megatron


def test_the_probe_reads_slimes_parsers_and_the_commit_from_git_files(checkouts):
    slime, megatron = checkouts
    doc = probe("--slime", str(slime), "--megatron", str(megatron))
    facts = imageprobe.parse_facts(doc, ID, "probe", cached=False)
    assert facts.catalog_source == "parsers" and facts.catalog is not None
    assert facts.catalog.flags == {*fs.PRE, *fs.SGLANG, *fs.MEGATRON, *fs.SLIME}
    assert facts.slime_commit == git(slime, "rev-parse",
                                     "HEAD") and facts.megatron_commit is None  # Megatron is no git checkout here
    assert (facts.slime_dir, facts.megatron_dir, facts.python) == (str(slime), str(megatron), ".".join(map(str,
                                                                                                           sys.version_info[:3])))


def test_the_probe_says_whether_slimeforge_built_the_image_and_reads_its_search_paths(checkouts):
    slime, megatron = checkouts
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    r = subprocess.run([sys.executable, str(SCRIPT), "--slime", str(slime), "--megatron", str(megatron)],
                       capture_output=True, text=True,
                       timeout=120, check=True, env={**env, "PYTHONPATH": "/opt/image-extra:/usr/src"})
    facts = imageprobe.parse_facts(json.loads(r.stdout.strip().splitlines()[-1]), ID, "probe", cached=False)
    assert (facts.pythonpath, facts.ld_library_path) == ("/opt/image-extra:/usr/src", None)
    assert facts.slimeforge_image is os.path.isdir(paths.IMAGE_STATE)  # this machine is no image slimeforge built


def test_what_cannot_be_learned_is_said_not_failed(checkouts, tmp_path):
    slime, _ = checkouts
    none = probe("--slime", str(tmp_path / "nowhere"))
    assert none["catalog"] is None and none["catalog_problem"].startswith(f"no slime found: {tmp_path / 'nowhere'} "
                                                                          "holds no slime/ package")
    no_megatron = probe("--slime", str(slime), "--megatron", str(tmp_path / "nowhere"))
    assert "needs a module this Python lacks: No module named 'megatron'" in no_megatron["catalog_problem"]
    for doc in (none, no_megatron):
        assert imageprobe.parse_facts(doc, ID, "probe", cached=False).catalog is None


def test_an_answer_is_input_every_field_is_checked(checkouts):
    slime, megatron = checkouts
    good = {**probe("--slime", str(slime), "--megatron", str(megatron)), "image_id": ID}
    bad = {
        "another image's answer": {"image_id": "sha256:" + "cd" * 32},
        "a commit that is not one": {"slime_commit": "HEAD; rm -rf /"},
        "a relative path": {"slime_dir": "slime"},
        "a control character": {"slime_dir": "/root/sl\x1bime"},
        "an unknown source": {"catalog_source": "/etc/passwd"},
        "a catalog edited by hand": {"catalog": {**good["catalog"], "flags": [*good["catalog"]["flags"], "--extra"]}},
        "no catalog and no reason": {"catalog": None},
        "another format": {"version": 99},
        "slimeforge_image that is not true or false": {"slimeforge_image": "yes"},
        "a PYTHONPATH with a control character": {"pythonpath": "/opt/x\x1b[2J"},
        "an LD_LIBRARY_PATH that is not text": {"ld_library_path": ["/opt/x"]},
    }
    assert imageprobe.parse_facts(good, ID, "cache", cached=True).cached
    for what, change in bad.items():
        with pytest.raises(ValueError):
            imageprobe.parse_facts({**good, **change}, ID, "cache", cached=True)
            pytest.fail(what)


def test_a_bad_cache_entry_is_not_believed(checkouts, tmp_path):
    path = tmp_path / "entry.json"
    path.write_text("{not json")
    assert imageprobe.read_cached(path, ID) is None
    path.unlink()
    os.mkfifo(path)
    assert imageprobe.read_cached(path, ID) is None  # refused by the one reader, never read forever


def test_the_probe_and_slimeforge_name_the_same_catalog_path():
    text = SCRIPT.read_text()
    assert f'IMAGE_STATE = "{paths.IMAGE_STATE}"' in text and f'IMAGE_CATALOG = IMAGE_STATE + "/{paths.FLAGS}"' in text
