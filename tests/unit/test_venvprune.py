"""venvprune.py: GPU code for archs outside the stack's arch_list out of the venv, by a rule that is
data (distribution, path grammar, arch from the cubin's own ELF header, checked against its name),
recorded, and proved afterwards against the distribution's RECORD (what venvlock.py verify runs)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from slimeforge.image.lock.lockfile import read_lock
from slimeforge.image.stack import load_stack
from slimeforge.image.steps import host_layout, lock_files
from slimeforge.scripts import venvprune as vp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import prune_support as ps  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RULE = vp.RULES[0]


def test_the_sm_is_read_from_the_cubin_header_of_the_one_layout_known_and_nothing_else():
    assert vp.cubin_sm(ps.cubin(100)[:64]) == 100
    assert vp.cubin_sm(ps.cubin(103)[:64]) == 103
    assert vp.cubin_sm(ps.cubin(90)[:64]) == 90
    assert vp.cubin_sm(ps.cubin(100, abi=7)[:64]) is None  # an older ABI: not guessed
    not_cuda = bytearray(ps.cubin(100)[:64])
    not_cuda[7] = 0  # OS ABI: System V, a host ELF
    assert vp.cubin_sm(bytes(not_cuda)) is None
    assert vp.cubin_sm(b"\x7fELF") is None
    assert vp.cubin_sm(b"") is None


@pytest.mark.parametrize("name, sm", [
    ("fmhaSm100fKernel_QkvE4m3OBfloat16HQk576HV512HVPerCta256PagedKvDenseP64.cubin", 100),
    ("fmhaSm103aKernel_QkvBfloat16OBfloat16H64PackedQkvDenseVarSeqQ128Kv128PersistentContext.cubin", 103),
    ("Bmm_Bfloat16_Bfloat16Bfloat16_Fp32_t128x128x64_s5_et128x128_m256x128x16_c2x1x1_rM_BN_dynB_sm100f.cubin", 100),
    ("kernel.fp8_m_grouped_gemm.007404769193.cubin", None),
    ("flashInferMetaInfo.h", None),
])
def test_the_name_token_is_the_one_flashinfer_names_its_cubins_with(name, sm):
    assert vp.name_sm(name) == sm


def test_only_the_rules_paths_of_an_arch_outside_the_kept_majors_are_removable():
    fmha = f"flashinfer_cubin/cubins/{ps.COMMIT}/fmha/trtllm-gen/fmhaSm100fKernel_X.cubin"
    assert vp.removable(RULE, fmha, ps.cubin(100)[:64], {9}) == (True, 100)
    assert vp.removable(RULE, fmha, ps.cubin(100)[:64], {9, 10}) == (False, 100)  # arch_list ["9.0", "10.0"]
    assert vp.removable(RULE, fmha.replace("Sm100f", "Sm90a"), ps.cubin(100)[:64], {9})[0] is False  # name disagrees
    for path in (f"flashinfer_cubin/cubins/{ps.COMMIT}/../../torch/lib/x.cubin",  # outside the grammar
                 f"flashinfer_cubin/cubins/{ps.COMMIT}/fmha/x.so", "sgl_kernel/sm100/common_ops.abi3.so",
                 f"flashinfer_cubin/cubins/{ps.COMMIT[:-1]}/fmha/x.cubin"):
        assert vp.removable(RULE, path, ps.cubin(100)[:64], {9})[0] is False, path


def test_the_keep_line_goes_only_into_a_slice_installing_a_rules_distribution():
    assert vp.keep_line(["9.0"], ["sglang", "flashinfer_cubin"]) == "# prune: keep-arch 9.0\n"
    assert vp.keep_line(["9.0", "10.0"], ["flashinfer-cubin"]) == "# prune: keep-arch 9.0 10.0\n"
    assert vp.keep_line(["9.0"], ["torch"]) == ""
    assert vp.keep_line([], ["flashinfer-cubin"]) == ""  # no arch list: nothing says what a run needs
    with pytest.raises(ValueError, match="compute capabilities"):
        vp.keep_line(["9.0\n# prune: keep-arch 1.0"], ["flashinfer-cubin"])


def test_the_cu13_slices_only_sglangs_gets_the_keep_line_from_arch_list():
    stack = load_stack("cu13")
    # As a dry run reads it: the committed lock lacks the router wheel's sha256 (an outside fact).
    lock = replace(read_lock(ROOT / "images" / "locks" / "pylock.cu13.toml"), provisional=True)
    slices = lock_files(stack, lock, host_layout(stack, "/opt/slime"))
    marked = {name for name, text in slices.items() if "# prune:" in text}
    assert marked == {"sglang.txt"}
    assert slices["sglang.txt"].endswith("# prune: keep-arch 9.0\n")
    keep, names, problems = vp.read_keep(slices["sglang.txt"])
    assert keep == ["9.0"] and "flashinfer-cubin" in names and problems == []


@pytest.mark.parametrize("text", [
    "# prune: keep-arch\n",
    "# prune: keep-arch 9\n",
    "# prune: keep-arch 9.0;rm -rf /\n",
    "# prune: keep-arch 9.0\n# prune: keep-arch 10.0\n",
    "# prune: keep 9.0\n",
])
def test_a_keep_line_is_read_by_its_grammar_or_refused(text):
    assert vp.read_keep(text)[2], text


def test_a_record_row_is_three_fields_a_printable_path_and_a_size():
    rows, problems = vp.read_record("a/b.py,sha256=x,12\nx.dist-info/RECORD,,\n")
    assert [(r.path, r.size) for r in rows] == [("a/b.py", 12), ("x.dist-info/RECORD", None)] and problems == []
    for bad in ("a/b.py,sha256=x\n", "a/b\x1b[31m.py,sha256=x,1\n", "a/b.py,sha256=x,-1\n", "a/b.py,s,1e9\n",
                "a/\u202eb.py,s,1\n", f"{'a' * 5000},s,1\n"):
        assert vp.read_record(bad)[1], bad


@pytest.fixture
def site(tmp_path, monkeypatch):
    """flashinfer-cubin installed in a directory of sys.path (importlib.metadata finds it there)."""
    site = tmp_path / "site"
    ps.install_tree(site)
    monkeypatch.syspath_prepend(str(site))
    state = tmp_path / "state"
    (state / "lock").mkdir(parents=True)
    (state / "lock" / "sglang.txt").write_text(f"# step sglang\n{ps.DIST}==0.6.12 --hash=sha256:{'0' * 64}  "
                                               "# ==0.6.12\n# prune: keep-arch 9.0\n")
    return site, state


def test_prune_removes_exactly_the_blackwell_cubins_records_them_and_the_check_holds(site, capsys):
    site, state = site
    assert vp.prune(state, "sglang", state / "lock" / "sglang.txt") == 0
    gone = sorted(p for p in ps.FILES if not (site / p).exists())
    assert gone == sorted(ps.PRUNED)
    record = json.loads((state / "pruned" / "flashinfer-cubin.json").read_text())
    assert record == {"schema": 1, "dist": "flashinfer-cubin", "version": "0.6.12", "step": "sglang",
                      "rule": "cubin-arch", "keep": ["9.0"], "removed": 3, "bytes": 4096 + 8192 + 4096}
    log = capsys.readouterr().err
    assert "pruned flashinfer-cubin 0.6.12: 3 file(s)" in log and "sm100 0.00 GB, sm103 0.00 GB" in log
    assert "3 of its cubin-arch files kept" in log
    assert vp.check(state, state / "lock") == []


def test_a_slice_without_the_keep_line_prunes_nothing(site):
    site, state = site
    (state / "lock" / "plain.txt").write_text(f"{ps.DIST}==0.6.12  # ==0.6.12\n")
    assert vp.prune(state, "plain", state / "lock" / "plain.txt") == 0
    assert all((site / p).exists() for p in ps.FILES) and not (state / "pruned").exists()


def test_the_check_names_what_the_rule_does_not_account_for(site):
    site, state = site
    vp.prune(state, "sglang", state / "lock" / "sglang.txt")
    (site / "flashinfer_cubin/__init__.py").unlink()  # not the rule's: a missing file, not a prune
    errors = vp.check(state, state / "lock")
    assert len(errors) == 1 and "flashinfer_cubin/__init__.py is missing, and no prune rule removes it" in errors[0]


def test_the_check_names_a_blackwell_cubin_back_in_place(site):
    site, state = site
    vp.prune(state, "sglang", state / "lock" / "sglang.txt")
    back = ps.PRUNED[0]
    (site / back).write_bytes(ps.FILES[back])  # a reinstall without the prune
    errors = vp.check(state, state / "lock")
    assert any(f"{back} is GPU code for an arch outside 9.0" in e for e in errors), errors
    assert any("2 of its files (12288 bytes) are missing, its prune record says 3 (16384 bytes)" in e for e in errors)


def test_the_check_wants_a_record_where_a_slice_keeps_archs_and_the_same_arch_list(site):
    site, state = site
    errors = vp.check(state, state / "lock")  # installed, never pruned
    assert errors == [f"flashinfer-cubin is installed by a step whose slice keeps arch 9.0, but has no prune record in "
                      f"{state / 'pruned'}: run that step again"]
    vp.prune(state, "sglang", state / "lock" / "sglang.txt")
    text = (state / "lock" / "sglang.txt").read_text().replace("keep-arch 9.0", "keep-arch 9.0 10.0")
    (state / "lock" / "sglang.txt").write_text(text)
    assert any("pruned for arch_list 9.0, its slice now keeps 9.0 10.0: run step sglang again" in e
               for e in vp.check(state, state / "lock"))


@pytest.mark.parametrize("change, why", [
    ({"schema": True}, "schema must be 1"),
    ({"dist": "torch"}, "dist must be the canonical name"),
    ({"version": "1\n2"}, "version is not a version"),
    ({"step": "-rf"}, "step is not a step name"),
    ({"rule": "all"}, "rule is not a rule of this distribution"),
    ({"keep": ["9.0; x"]}, "keep must list compute capabilities"),
    ({"keep": []}, "keep must list compute capabilities"),
    ({"removed": -1}, "whole numbers"),
    ({"bytes": 1.5}, "whole numbers"),
    ({"extra": 1}, "keys must be exactly"),
])
def test_a_prune_record_read_back_is_validated(site, change, why):
    site, state = site
    vp.prune(state, "sglang", state / "lock" / "sglang.txt")
    path = state / "pruned" / "flashinfer-cubin.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    errors = vp.check(state, state / "lock")
    assert any(why in e and "remove it and run the step" in e for e in errors), errors


def test_a_prune_record_that_is_not_a_small_regular_file_is_refused(site):
    site, state = site
    vp.prune(state, "sglang", state / "lock" / "sglang.txt")
    path = state / "pruned" / "flashinfer-cubin.json"
    path.write_text(path.read_text() + " " * 5000)
    assert "over 4096 bytes" in vp.check(state, state / "lock")[0]
    path.unlink()
    path.symlink_to(state / "lock" / "sglang.txt")
    assert "not a regular file" in vp.check(state, state / "lock")[0]


def test_the_command_line(site, capsys):
    site, state = site
    assert vp.main(["prune", str(state), "sglang", str(state / "lock" / "sglang.txt")]) == 0
    assert vp.main(["check", str(state)]) == 0
    assert vp.main(["prune", str(state), "--all", str(state / "lock" / "sglang.txt")]) == 2
    assert vp.main(["check"]) == 2


def test_every_rule_is_whole_data_a_reader_knows():
    for rule in vp.RULES:
        assert rule.arch in vp.ARCH_READERS and vp.NAME.fullmatch(rule.dist), rule
        assert rule.path.pattern.startswith(rule.dist.replace("-", "_") + "/"), rule  # its own package's files only
