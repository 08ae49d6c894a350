"""The flag catalog from slime's real parsers (`invoke flags.catalog`), on a stand-in slime whose
three parsers have slime's structure, so a catalog made from `train.py --help` fails here; doctor
reading it; and the real slime a74ae3a0 + Megatron 1dcf0daf when their checkouts are given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import flag_standin as fs
import pytest
from launch_support import make_recipe, write_catalog

from slimeforge.errors import ConfigError
from slimeforge.run import preflight as doctor
from slimeforge.run.flagcatalog import CatalogError, load_catalog, make_catalog, parse_catalog
from slimeforge.run.recipecheck import parse_recipe

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def standin(tmp_path):
    slime = fs.write(tmp_path / "slime", fs.slime_files(inline_megatron=False))
    megatron = fs.write(tmp_path / "Megatron-LM", fs.MEGATRON_FILES)
    return slime, megatron


def parser_of(cat, flag: str) -> list[str]:
    """The parsers (module.function that built each) that take `flag`."""
    return [p["built_by"] for p in cat.parsers if flag in p["options"]]


def test_catalog_has_every_parser_and_each_option_with_its_parser(standin, tmp_path):
    slime, megatron = standin
    out = tmp_path / "flags.json"
    cat = make_catalog(sys.executable, slime, megatron, out)
    assert cat.version == 2 and cat.flags == frozenset(fs.PRE + fs.SGLANG + fs.MEGATRON + fs.SLIME)
    doc = json.loads(out.read_text())
    assert [(p["built_by"], p["add_help"]) for p in doc["parsers"]] == [
        ("slime.utils.arguments._pre_parse_mode", False),
        ("slime.backends.sglang_utils.arguments.sglang_parse_args", False),
        ("megatron.training.arguments.parse_args", True),
    ]
    assert parser_of(cat, "--sglang-mem-fraction-static") == ["slime.backends.sglang_utils.arguments.sglang_parse_args"]
    assert parser_of(cat, "--router-policy") == ["slime.backends.sglang_utils.arguments.sglang_parse_args"]
    assert parser_of(cat, "--hf-checkpoint") == ["megatron.training.arguments.parse_args"]
    # slime's own checks failed on the defaults after the last parser: recorded, not fatal.
    assert doc["stopped_by"] == "AssertionError: --hf-checkpoint is required"
    assert doc["python"] == ".".join(map(str, sys.version_info[:3])) and doc["format"] == "slimeforge.flag-catalog"


def test_help_text_misses_what_the_catalog_has(standin, tmp_path):
    """What the old catalog read: --help answers for Megatron's parser only."""
    slime, megatron = standin
    cat = make_catalog(sys.executable, slime, megatron, tmp_path / "flags.json")
    res = subprocess.run([sys.executable, "train.py", "--help"], cwd=slime, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": f"{slime}:{megatron}"})
    assert res.returncode == 0
    helped = {tok for tok in res.stdout.replace(",", " ").split() if tok.startswith("--")}
    missing = set(cat.flags) - helped
    assert missing == set(fs.PRE + fs.SGLANG)


def test_an_import_error_or_an_early_stop_fails_and_leaves_no_file(standin, tmp_path):
    slime, megatron = standin
    out = tmp_path / "flags.json"
    # Without Megatron on the path slime's bridge cannot import megatron.training.
    with pytest.raises(CatalogError, match="needs a module this Python lacks: No module named 'megatron'"):
        make_catalog(sys.executable, slime, None, out)
    assert not out.exists() and list(tmp_path.glob(".flags.json.*")) == []
    # An error before the parser that answers --help: the catalog would be partial.
    args = slime / "slime" / "utils" / "arguments.py"
    args.write_text(args.read_text().replace("    sglang_ns = None if",
                                             "    raise RuntimeError('boom')\n    sglang_ns = None if"))
    with pytest.raises(CatalogError, match=r"stopped before its main parser .*_pre_parse_mode.*RuntimeError: boom"):
        make_catalog(sys.executable, slime, megatron, out)
    assert not out.exists()


def test_bad_inputs_are_listed_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError) as exc:
        make_catalog(str(tmp_path / "nopython"), tmp_path, tmp_path / "nomegatron",
                     tmp_path / "no" / "dir" / "flags.json")
    where = [p.where for p in exc.value.problems]
    assert where == ["--python", "--slime", "--megatron", "--out"]


def test_task_writes_the_catalog_and_exits_2_on_bad_input(standin, tmp_path):
    slime, megatron = standin
    out = tmp_path / "flags.json"

    def invoke(*args):
        return subprocess.run([sys.executable, "-m", "invoke", "flags.catalog", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)

    res = invoke("--python", sys.executable, "--slime", str(slime), "--megatron", str(megatron), "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert "17 options" in res.stdout and "(add_help=False)" in res.stdout and f"wrote {out}" in res.stdout
    assert load_catalog(out).flags >= {"--sglang-mem-fraction-static", "--lr"}
    bad = invoke("--python", sys.executable, "--slime", str(tmp_path / "none"), "--out", str(out))
    assert bad.returncode == 2 and "--slime: is not a slime checkout" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("text,msg", [
    ("[]", "is not a flag catalog"),
    ('{"format": "slimeforge.flag-catalog", "version": 9, "flags": []}', "version 9 is not one this slimeforge reads"),
    ('{"flags": ["--ok", "rm -rf"]}', "entries of flags are not --options"),
    ('{"format": "slimeforge.flag-catalog", "version": 2, "flags": ["--a", "--b"], '
     '"parsers": [{"built_by": "x", "add_help": true, "options": ["--a"]}]}', "not the union"),
])
def test_catalog_files_are_checked(text, msg):
    with pytest.raises(CatalogError, match=msg):
        parse_catalog(text, "flags.json")


def test_doctor_accepts_sglang_and_router_options_of_a_parser_catalog(tmp_path):
    recipe, stack = parse_recipe(make_recipe(tmp_path, extra_flags=["--router-policy", "random"]), "test")
    # Every flag the recipe renders, as parsers: the --sglang-* ones in the separate parser.
    v1 = json.loads(write_catalog(tmp_path / "v1.json", recipe, stack).read_text())
    sglang = [f for f in v1["flags"] if f.startswith(("--sglang-", "--router-"))] + ["--router-policy"]
    assert "--sglang-mem-fraction-static" in sglang
    main = [f for f in v1["flags"] if f not in sglang]
    v2 = {"format": "slimeforge.flag-catalog", "version": 2, "slime_commit": "a" * 40,
          "flags": sorted(set(main + sglang)),
          "parsers": [{"built_by": "sglang_parse_args", "add_help": False, "options": sorted(set(sglang))},
                      {"built_by": "parse_args", "add_help": True, "options": main}]}
    (tmp_path / "v2.json").write_text(json.dumps(v2))
    report = doctor.run_checks(recipe, stack, only=["flags"], catalog=str(tmp_path / "v2.json"))
    assert report.errors == [] and "2 parser(s)" in report.findings[0].message
    # The same flags from a help-text (version 1) catalog: the sglang ones are missing, and the fix says why.
    (tmp_path / "help.json").write_text(json.dumps({"slime_commit": "a" * 40, "flags": main}))
    errors = doctor.run_checks(recipe, stack, only=["flags"], catalog=str(tmp_path / "help.json")).errors
    assert sorted(e.message.split(" ")[0] for e in errors) == sorted(set(sglang))
    assert all("invoke flags.catalog" in e.fix for e in errors)


# --- the real slime and Megatron (checkouts and a Python that imports slime's argument code) ------

REAL = {k: os.environ.get(k) for k in ("SLIMEFORGE_SLIME_SRC", "SLIMEFORGE_MEGATRON_SRC", "SLIMEFORGE_SLIME_PYTHON")}


@pytest.mark.skipif(not all(REAL.values()),
                    reason="needs SLIMEFORGE_SLIME_SRC (slime a74ae3a0), SLIMEFORGE_MEGATRON_SRC "
                    "(Megatron-LM 1dcf0daf) and SLIMEFORGE_SLIME_PYTHON (a Python that imports slime's argument code)")
def test_real_slime_catalog(tmp_path):
    started = time.monotonic()
    cat = make_catalog(REAL["SLIMEFORGE_SLIME_PYTHON"], REAL["SLIMEFORGE_SLIME_SRC"], REAL["SLIMEFORGE_MEGATRON_SRC"],
                       tmp_path / "flags.json")
    print(f"catalog: {len(cat.flags)} options in {time.monotonic() - started:.1f}s")
    by = {p["built_by"]: p for p in cat.parsers}
    assert len(by["slime.utils.arguments._pre_parse_mode"]["options"]) == 4
    assert (len(by["megatron.training.arguments.parse_args"]["options"]) == 890
            and by["megatron.training.arguments.parse_args"]["add_help"])
    sglang = [p for p in cat.parsers if p["built_by"].endswith("sglang_parse_args") and not p["add_help"]]
    assert max(len(p["options"]) for p in sglang) == 535
    assert {"--sglang-mem-fraction-static", "--router-policy", "--debug-train-only", "--hf-checkpoint",
            "--tensor-model-parallel-size"} <= cat.flags
    if cat.slime_commit != "?":
        assert cat.slime_commit == "a74ae3a0ad16bd8b769d5386738e8ae3d1269d7e"
