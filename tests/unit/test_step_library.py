"""templates/steps.sh with real bash, git and patch: fetch at a commit, patches fail closed,
already-applied trees recognised, the flag catalog format (shellcheck on the library:
tests/integration/heavy/test_step_library_shellcheck.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import build_support as bs  # noqa: E402

LIB = Path(__file__).resolve().parents[2] / "templates" / "steps.sh"


def sf(*args: str, state: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", 'source "$1"; shift; "$@"', "sf", str(LIB), *args], capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", "SF_STATE": str(state), "HOME": str(state)})


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    return bs.make_repos(tmp_path_factory.mktemp("repos"))


@pytest.fixture
def patch_files(repos, tmp_path):
    out = {}
    for commit, tag in ((bs.SLIME_S1, "good"), (bs.SLIME_S3, "broken")):
        data = subprocess.run(["git", "-C", str(repos["slime"]), "show", f"{commit}:docker/patch/test/libdemo.patch"],
                              capture_output=True, check=True).stdout
        (tmp_path / f"{tag}.patch").write_bytes(data)
        out[tag] = tmp_path / f"{tag}.patch"
    return out


def test_fetch_source_pins_commit_and_leaves_origin_alone(repos, tmp_path):
    dest = tmp_path / "co"
    head_before = subprocess.run(["git", "-C", str(repos["slime"]), "rev-parse", "HEAD"], capture_output=True,
                                 text=True).stdout
    res = sf("sf_fetch_source", "slime", str(repos["slime"]), bs.SLIME_S1, str(dest), state=tmp_path)
    assert res.returncode == 0, res.stderr
    assert subprocess.run(["git", "-C", str(dest), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip() == bs.SLIME_S1
    again = sf("sf_fetch_source", "slime", str(repos["slime"]), bs.SLIME_S1, str(dest), state=tmp_path)
    assert "already at" in again.stderr
    assert subprocess.run(["git", "-C", str(repos["slime"]), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout == head_before
    bad = sf("sf_fetch_source", "slime", str(repos["slime"]), "1" * 40, str(tmp_path / "co2"), state=tmp_path)
    assert bad.returncode != 0 and "cannot fetch commit 1111" in bad.stderr


def test_git_patch_applies_then_is_recognised(repos, patch_files, tmp_path):
    dest = tmp_path / "lib"
    assert sf("sf_fetch_source", "libdemo", str(repos["libdemo"]), bs.LIBDEMO_COMMIT, str(dest),
              state=tmp_path).returncode == 0
    first = sf("sf_apply_patch", "libdemo.patch", "git", "1", str(patch_files["good"]), str(dest), state=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "PATCHED = True" in (dest / "libdemo" / "__init__.py").read_text()
    second = sf("sf_apply_patch", "libdemo.patch", "git", "1", str(patch_files["good"]), str(dest), state=tmp_path)
    assert second.returncode == 0 and "already applied" in second.stderr
    assert (dest / "libdemo" / "__init__.py").read_text().count("PATCHED") == 1
    rows = (tmp_path / "patches.applied").read_text().splitlines()
    assert [r.split("\t")[3] for r in rows] == ["applied", "already-applied"]
    present = sf("sf_patches_applied", f"libdemo.patch:git:1:{patch_files['good']}:{dest}", state=tmp_path)
    assert present.returncode == 0 and "patch libdemo.patch present" in present.stderr


def test_broken_patch_fails_naming_patch_and_file(repos, patch_files, tmp_path):
    dest = tmp_path / "lib"
    sf("sf_fetch_source", "libdemo", str(repos["libdemo"]), bs.LIBDEMO_COMMIT, str(dest), state=tmp_path)
    res = sf("sf_apply_patch", "libdemo.patch", "git", "1", str(patch_files["broken"]), str(dest), state=tmp_path)
    assert res.returncode != 0
    assert "ERROR: patch libdemo.patch does not apply" in res.stderr and "libdemo/__init__.py" in res.stderr


def test_a_failing_patch_in_the_middle_stops_the_step(repos, patch_files, tmp_path):
    """The loop over a step's patches fails on the first bad one, not only on the last one's status."""
    res = sf("sf_source_step", "--venv", str(tmp_path / "no-venv"), "--name", "libdemo", "--url", str(repos["libdemo"]),
             "--commit", bs.LIBDEMO_COMMIT, "--dest", str(tmp_path / "lib"),
             "--patch", f"bad.patch:git:1:{patch_files['broken']}", "--patch",
             f"good.patch:git:1:{patch_files['good']}",
             state=tmp_path)
    assert res.returncode != 0 and "patch bad.patch does not apply" in res.stderr
    assert "good.patch" not in res.stderr


def test_patch_method_strip_two_and_recognised(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "six.py").write_text("# Copyright (c) 2010-2024 Benjamin Peterson\n#\n"
                                 "# Permission is hereby granted, free of charge, to any person obtaining a copy\n")
    patch = tmp_path / "six.patch"
    patch.write_text(bs.SIX_PATCH)
    assert sf("sf_apply_patch", "six.patch", "patch", "2", str(patch), str(site), state=tmp_path).returncode == 0
    assert "patched by slimeforge" in (site / "six.py").read_text()
    again = sf("sf_apply_patch", "six.patch", "patch", "2", str(patch), str(site), state=tmp_path)
    assert again.returncode == 0 and "already applied" in again.stderr
    (site / "six.py").write_text("something else entirely\n")
    bad = sf("sf_apply_patch", "six.patch", "patch", "2", str(patch), str(site), state=tmp_path)
    assert bad.returncode != 0 and "six.patch does not apply" in bad.stderr and "six.py" in bad.stderr


def test_flag_catalog_reads_every_parser_of_the_fixture_slime(repos, tmp_path):
    from slimeforge.image.steps import TARGET_SCRIPTS

    dest = tmp_path / "slime"
    sf("sf_fetch_source", "slime", str(repos["slime"]), bs.SLIME_S1, str(dest), state=tmp_path)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    missing = sf("sf_flag_catalog", str(venv), str(dest), "", str(tmp_path / "flags.json"), state=tmp_path)
    assert missing.returncode != 0 and "flag_catalog.py is missing" in missing.stderr
    (tmp_path / "flag_catalog.py").write_bytes(TARGET_SCRIPTS["flag_catalog.py"].read_bytes())
    res = sf("sf_flag_catalog", str(venv), str(dest), "", str(tmp_path / "flags.json"), state=tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "flags.json").read_text())
    assert doc["slime_commit"] == bs.SLIME_S1 and doc["megatron_commit"] is None and doc["version"] == 2
    assert doc["flags"] == sorted(doc["flags"])
    assert [p["add_help"] for p in doc["parsers"]] == [False, False, True]
    assert {"--hf-checkpoint", "--lr", "--num-rollout", "--colocate", "--train-env-vars",
            "--sglang-mem-fraction-static", "--router-policy", "--debug-train-only"} <= set(doc["flags"])


@pytest.mark.parametrize("cores,gib", [(2, 24), (128, 64), (16, 2), (64, 512), (1, 1), (16, 125), (8, 30), (32, 64),
                                       (96, 1024), (3, 7)])
def test_host_compile_jobs_follow_the_image_build_rule(cores, gib, tmp_path):
    # One rule in two places: the image build's (Python, build args) and a host's (bash), for the
    # host's jobs and threads and for apex's split of them.
    from slimeforge.image.builder.compilejobs import apex_jobs, compile_jobs

    res = sf("sf_compile_jobs", str(cores), str(gib * 1024 * 1024), state=tmp_path)
    assert res.returncode == 0, res.stderr
    jobs, threads = compile_jobs(mem_bytes=gib << 30, cores=cores)
    assert tuple(int(x) for x in res.stdout.split()) == (jobs, threads)
    apex = sf("sf_apex_jobs", str(jobs), state=tmp_path)
    assert apex.returncode == 0, apex.stderr
    assert tuple(int(x) for x in apex.stdout.split()) == apex_jobs(jobs)


def test_apex_gets_its_own_split_and_other_pieces_the_hosts_jobs(tmp_path):
    script = ('source "$1"; '
              'sf_show() { printf "%s|" "$MAX_JOBS" "${APEX_PARALLEL_BUILD-unset}" "$NVCC_APPEND_FLAGS"; }; '
              'shift; "$@"')
    base = {"PATH": "/usr/bin:/bin", "SF_STATE": str(tmp_path), "HOME": str(tmp_path),
            "MAX_JOBS": "16", "NVCC_THREADS": "1"}

    def show(**env):
        res = subprocess.run(["bash", "-c", script, "sf", str(LIB), "sf_compiled", "--key", "k", "--", "show"],
                             capture_output=True, text=True, env={**base, **env})
        assert res.returncode == 0, res.stderr
        return res.stdout, res.stderr

    # apex's step (it sets APEX_CUDA_EXT): 8 extensions at once, 4 jobs each (measured fastest on 16 cores).
    out, log = show(APEX_CPP_EXT="1", APEX_CUDA_EXT="1")
    assert out == "4|8|--threads 1|" and "APEX_PARALLEL_BUILD=8" in log
    # A given APEX_PARALLEL_BUILD (--build-arg) is kept; apex's jobs per extension still follow the rule.
    assert show(APEX_CUDA_EXT="1", APEX_PARALLEL_BUILD="3")[0] == "4|3|--threads 1|"
    # Any other compiled piece: the host's jobs, and apex's variable is not set for it.
    assert show(TMS_CUDA_MAJOR="13")[0] == "16|unset|--threads 1|"


def test_kernel_check_without_a_gpu_is_skipped_by_name(tmp_path):
    from slimeforge.image.steps import TARGET_SCRIPTS

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    missing = sf("sf_kernel_check", str(venv), state=tmp_path)
    assert missing.returncode != 0 and "kernel_check.py is missing" in missing.stderr
    (tmp_path / "kernel_check.py").write_bytes(TARGET_SCRIPTS["kernel_check.py"].read_bytes())
    res = sf("sf_kernel_check", str(venv), state=tmp_path)  # PATH without nvidia-smi: no GPU
    assert res.returncode == 0, res.stderr
    for piece in ("apex", "transformer_engine", "torch_memory_saver", "flash_attn.cute", "flash_attn_2"):
        assert f"{piece}: skipped: no GPU\n" in res.stderr
    assert "kernel check: 5 of 5 piece(s) not failed (" in res.stderr and "GPU: none)" in res.stderr


def test_compiled_step_gets_parallelism_and_a_cache_of_its_key(tmp_path):
    # A stand-in step function prints what a compiler would see.
    script = ('source "$1"; sf_show() { printf "%s|" "$MAX_JOBS" "$NVCC_THREADS" "$NVCC_APPEND_FLAGS" '
              '"$NVTE_BUILD_THREADS_PER_JOB" "$UV_CACHE_DIR" "$*"; }; shift; "$@"')
    base = {"PATH": "/usr/bin:/bin", "SF_STATE": str(tmp_path), "HOME": str(tmp_path)}
    res = subprocess.run(["bash", "-c", script, "sf", str(LIB), "sf_compiled", "--key", "cu13-apex-0123", "--",
                          "show", "a b"],
                         capture_output=True, text=True, env={**base, "MAX_JOBS": "3", "NVCC_THREADS": "2"})
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"3|2|--threads 2|2|{tmp_path}/.cache/uv/compiled/cu13-apex-0123|a b|"
    # Without build args (a host): sized to this machine; an image's UV_CACHE_DIR gets the key below it.
    res = subprocess.run(["bash", "-c", script, "sf", str(LIB), "sf_compiled", "--key", "k1", "--", "show"],
                         capture_output=True, text=True, env={**base, "UV_CACHE_DIR": "/root/.cache/uv"})
    jobs, threads, flags, _, cache, _ = res.stdout.split("|")[:6]
    assert int(jobs) >= 1 and flags == f"--threads {threads}" and cache == "/root/.cache/uv/compiled/k1"
    bad = subprocess.run(["bash", "-c", script, "sf", str(LIB), "sf_compiled", "--key", "../x", "--", "show"],
                         capture_output=True, text=True, env=base)
    assert bad.returncode != 0 and "--key must be a compiled-wheel key" in bad.stderr
    # Given numbers by grammar, read base 10: 08 was an arithmetic error (octal), '3+1' was evaluated, '²' is not a
    # digit.
    res = subprocess.run(["bash", "-c", script, "sf", str(LIB), "sf_compiled", "--key", "k", "--", "show"],
                         capture_output=True, text=True, env={**base, "MAX_JOBS": "08", "NVCC_THREADS": "010"})
    assert res.returncode == 0 and res.stdout.startswith("8|10|--threads 10|"), res.stderr
    for name, value in (("MAX_JOBS", "3+1"), ("MAX_JOBS", "0"), ("NVCC_THREADS", "\u00b2"),
                        ("APEX_PARALLEL_BUILD", "x[$(touch p)]")):
        bad = subprocess.run(["bash", "-c", script, "sf", str(LIB), "sf_compiled", "--key", "k", "--", "show"],
                             capture_output=True, text=True,
                             env={**base, "MAX_JOBS": "4", "NVCC_THREADS": "2", name: value}, cwd=tmp_path)
        assert bad.returncode != 0 and f"{name} must be a whole number from 1 to 9999" in bad.stderr, (name, bad.stderr)
        assert not (tmp_path / "p").exists()


def test_smoke_skips_gpu_imports_by_name_and_checks_versions(tmp_path):
    from slimeforge.image.steps import LIBRARY_SCRIPTS, TARGET_SCRIPTS

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (tmp_path / "venvlock.py").write_bytes(LIBRARY_SCRIPTS["venvlock.py"].read_bytes())
    (tmp_path / "kernel_check.py").write_bytes(TARGET_SCRIPTS["kernel_check.py"].read_bytes())  # the GPU probe
    (tmp_path / "smoke_imports.py").write_bytes(TARGET_SCRIPTS["smoke_imports.py"].read_bytes())  # the import pass
    # The version of pip as the stand-in venv's Python sees it.
    pip_version = subprocess.run([str(venv / "bin" / "python"), "-c",
                                  "import importlib.metadata as m; print(m.version('pip'))"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    lock = tmp_path / "lock.json"
    lock.write_text(json.dumps({"pins": {"pip.pip": pip_version, "python": "3", "source.x": "0" * 40}}))
    # No nvidia-smi on PATH here: the GPU import is skipped, and said so by name.
    res = sf("sf_smoke", "--venv", str(venv), "--import", "json", "--import", "no_such_gpu_mod", "--needs-gpu",
             "no_such_gpu_mod", "--versions", str(lock), state=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "SKIPPED import no_such_gpu_mod: it needs a GPU and none is present" in res.stderr
    assert "with 1 GPU import(s) skipped (no GPU here): no_such_gpu_mod" in res.stderr
    assert f"version pip {pip_version} matches {pip_version}" in res.stderr
    # Not marked as needing a GPU: a failure; a pin the venv does not hold: a failure, named.
    lock.write_text(json.dumps({"pins": {"pip.pip": "0.0.1", "slime-req.no-such-dist": "1.0"}}))
    res = sf("sf_smoke", "--venv", str(venv), "--import", "no_such_gpu_mod", "--versions", str(lock), state=tmp_path)
    assert res.returncode != 0
    assert "import no_such_gpu_mod failed" in res.stderr
    assert f"version pip: installed {pip_version}, the lock pins 0.0.1" in res.stderr
    assert "version no-such-dist: not installed (the lock pins 1.0)" in res.stderr


def test_version_comparison_reads_local_labels_extras_and_specifiers():
    from slimeforge.scripts.venvlock import expected_versions
    from slimeforge.scripts.venvlock import pin_problems as compare

    expected = expected_versions({"pins": {"pip.torch": "2.11.0", "pip.transformer_engine[pytorch,core-cu13]": "2.11.0",
                                           "pip.numpy": "<2", "slime-req.ray[default]": "2.60.0", "base.image": "x"}})
    assert expected == {"torch": "2.11.0", "transformer-engine": "2.11.0", "numpy": "<2", "ray": "2.60.0"}
    problems, _ = compare(expected, {"torch": "2.11.0+cu130", "transformer-engine": "2.11.0", "numpy": "1.26.4",
                                     "ray": "2.60.0"})
    assert problems == []
    problems, _ = compare(expected, {"torch": "2.11.1", "transformer-engine": "2.11.0", "numpy": "2.1.0"})
    assert problems == ["numpy: installed 2.1.0, the lock pins <2", "ray: not installed (the lock pins 2.60.0)",
                        "torch: installed 2.11.1, the lock pins 2.11.0"]


H1, H2 = "a" * 64, "b" * 64


def test_the_smoke_record_is_kept_by_rename_and_matches_only_its_hash(tmp_path):
    (tmp_path / "steps").mkdir()
    assert sf("sf_smoke_recorded", H1, state=tmp_path).returncode == 1  # no record: the test runs
    res = sf("sf_smoke_record", H1, state=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "smoke.passed").read_text() == H1 + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["smoke.passed", "steps"]  # no temporary file left
    assert sf("sf_smoke_recorded", H1, state=tmp_path).returncode == 0
    assert sf("sf_smoke_recorded", H2, state=tmp_path).returncode == 1  # another input: runs again
    bad = sf("sf_smoke_record", "x; touch p", state=tmp_path)
    assert (bad.returncode != 0 and "is not a sha256" in bad.stderr
            and (tmp_path / "smoke.passed").read_text() == H1 + "\n")


def test_a_step_that_ran_after_the_record_makes_the_smoke_test_run_again(tmp_path):
    """By the steps' records' content, never by mtime: a record dated in the future hides nothing."""
    import os

    (tmp_path / "steps").mkdir()
    done = tmp_path / "steps" / "torch.done"
    done.write_text("h\nproof " + "1" * 64 + "\nrun " + "2" * 32 + "\n")
    with_steps = 'SF_STEP_NAMES=(torch); "$@"'
    def lib(*args):
        return subprocess.run(["bash", "-c", f'source "$1"; shift; {with_steps}', "sf", str(LIB), *args],
                              capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", "SF_STATE": str(tmp_path), "HOME": str(tmp_path)})
    assert lib("sf_smoke_record", H1).returncode == 0
    assert (tmp_path / "smoke.passed").read_text().splitlines()[1].startswith("step torch ")
    far = 4_000_000_000 * 10**9  # 2096: a copied state directory, a clock set wrong
    os.utime(tmp_path / "smoke.passed", ns=(far, far))
    assert lib("sf_smoke_recorded", H1).returncode == 0
    done.write_text("h\nproof " + "1" * 64 + "\nrun " + "3" * 32 + "\n")  # the step ran again since
    os.utime(done, ns=(10**9, 10**9))
    assert lib("sf_smoke_recorded", H1).returncode == 1
    done.unlink()  # its record is gone: no pass stands for it
    assert lib("sf_smoke_recorded", H1).returncode == 1


@pytest.mark.parametrize("content", [
    H1,  # no newline: not the record the library writes
    H1.upper() + "\n",
    H1 + "\n" + H1 + "\n",
    H1[:-1] + "\0\n",
    "\0" * 64 + "\n",
    H1 + "\n" + "x" * 10**6,
])
def test_a_tampered_smoke_record_is_no_record(tmp_path, content):
    (tmp_path / "steps").mkdir()
    (tmp_path / "smoke.passed").write_bytes(content.encode())
    res = sf("sf_smoke_recorded", H1, state=tmp_path)
    assert res.returncode == 1 and res.stderr == ""


def test_a_smoke_record_that_is_a_link_or_a_directory_is_no_record(tmp_path):
    (tmp_path / "steps").mkdir()
    (tmp_path / "elsewhere").write_text(H1 + "\n")
    (tmp_path / "smoke.passed").symlink_to(tmp_path / "elsewhere")
    assert sf("sf_smoke_recorded", H1, state=tmp_path).returncode == 1
    (tmp_path / "smoke.passed").unlink()
    (tmp_path / "smoke.passed").mkdir()
    assert sf("sf_smoke_recorded", H1, state=tmp_path).returncode == 1


def test_only_wheels_the_venv_already_holds_are_reinstalled(tmp_path):
    """A re-run re-fetches and re-checks what the venv holds (--reinstall-package); a fresh venv's
    wheels come from uv's cache by their sha256 (no --reinstall, which uv takes as --refresh)."""
    site = tmp_path / "venv" / "lib" / "python3.12" / "site-packages"
    for d in ("Six-1.17.0.dist-info", "typing_extensions-4.15.0.dist-info", "zope.interface-7.0.dist-info",
              "idna-3.10.egg-info"):
        (site / d).mkdir(parents=True)
    (tmp_path / "slice.txt").write_text(
        "six @ https://files.example/six-1.17.0-py2.py3-none-any.whl --hash=sha256:" + "0" * 64 + "  # ==1.17.0\n"
        "typing-extensions==4.15.0 --hash=sha256:" + "1" * 64 + "\n"
        "Zope_Interface @ https://files.example/z.whl --hash=sha256:" + "2" * 64 + "\n"
        "idna @ https://files.example/idna.whl --hash=sha256:" + "3" * 64 + "\n"  # an egg-info is not a wheel's record
        "torch @ https://files.example/torch.whl --hash=sha256:" + "4" * 64 + "\n"
        "# --- built from source\n")
    res = sf("_sf_installed_of", str(tmp_path / "venv"), str(tmp_path / "slice.txt"), state=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["six", "typing-extensions", "zope-interface"]
    empty = sf("_sf_installed_of", str(tmp_path / "none"), str(tmp_path / "slice.txt"), state=tmp_path)
    assert empty.returncode == 0 and empty.stdout == ""


def test_a_flag_catalog_made_in_this_run_is_checked_for_presence_only(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    from slimeforge.image.steps import TARGET_SCRIPTS

    for name in ("kernel_check.py", "smoke_imports.py", "flag_catalog.py"):
        (tmp_path / name).write_bytes(TARGET_SCRIPTS[name].read_bytes())
    flags = tmp_path / "flags.json"
    # --slime names no checkout: a catalog made again would fail; with --flags-made-now none is made.
    missing = sf("sf_smoke", "--venv", str(venv), "--flags", str(flags), "--slime", str(tmp_path / "nowhere"),
                 "--flags-made-now", state=tmp_path)
    assert missing.returncode != 0 and f"smoke: flag catalog {flags} is missing" in missing.stderr
    flags.write_text('{"flags": []}\n')
    res = sf("sf_smoke", "--venv", str(venv), "--flags", str(flags), "--slime", str(tmp_path / "nowhere"),
             "--flags-made-now", state=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "made from slime's parsers by finalize in this run: not made again" in res.stderr
    again = sf("sf_smoke", "--venv", str(venv), "--flags", str(flags), "--slime", str(tmp_path / "nowhere"),
               state=tmp_path)
    assert again.returncode != 0 and "flag catalog" in again.stderr  # without it, made again (and here it cannot be)


def test_smoke_imports_run_side_by_side_and_are_reported_in_order(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    from slimeforge.image.steps import TARGET_SCRIPTS

    for name in ("kernel_check.py", "smoke_imports.py"):
        (tmp_path / name).write_bytes(TARGET_SCRIPTS[name].read_bytes())
    mods = ["json", "no_such_mod_a", "csv", "no_such_mod_b", "zlib", "shlex"]
    res = sf("sf_smoke", "--venv", str(venv), *[a for m in mods for a in ("--import", m)], state=tmp_path)
    assert res.returncode != 0 and "smoke test failed" in res.stderr
    said = [line for line in res.stderr.splitlines() if "smoke: import " in line]
    # in the stack's order, whatever finished first
    assert [line.split("import ")[1].split()[0] for line in said] == mods
    assert "smoke: import no_such_mod_a failed:" in said[1] and "No module named 'no_such_mod_a'" in res.stderr
    assert said[0].endswith("import json ok") and said[5].endswith("import shlex ok")
    assert not list(tmp_path.glob("tmp*"))  # the scratch directory is removed


def _finalize_smoked(tmp_path: Path, *args: str, fin_rc: int = 0, smoke_rc: int = 0) -> subprocess.CompletedProcess:
    """sf_finalize_smoked with finalize and the smoke test replaced by functions that say what they were given."""
    script = r'''source "$1"; shift
sf_finalize() {
  printf 'finalize [%s] pyc=[%s] proxy=[%s]\n' "$*" "${PYTHONDONTWRITEBYTECODE-unset}" "${https_proxy-unset}" >&2
  sleep 0.5; : >"$SF_STATE/fin.done"; return "$FIN_RC"; }
sf_smoke() {
  printf 'smoke [%s] pyc=[%s] proxy=[%s %s]\n' "$*" "${PYTHONDONTWRITEBYTECODE-unset}" "$https_proxy" "$HTTP_PROXY" >&2
  if [[ ! -e $SF_STATE/fin.done ]]; then echo "smoke: finalize still running" >&2; fi; return "$SMOKE_RC"; }
sf_finalize_smoked "$@"'''
    return subprocess.run(["bash", "-c", script, "sf", str(LIB), *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "SF_STATE": str(tmp_path), "HOME": str(tmp_path),
                               "PYTHONDONTWRITEBYTECODE": "1",
                               "FIN_RC": str(fin_rc), "SMOKE_RC": str(smoke_rc)})


def test_finalize_then_the_smoke_test_on_its_import_pass_writing_bytecode_with_the_network_closed(tmp_path):
    res = _finalize_smoked(tmp_path, "/opt/venv", "in.json", "--imports-to", "/s/i", "--", "--venv", "/opt/venv",
                           "--import", "six", "--imports-from", "/s/i")
    assert res.returncode == 0, res.stderr
    # Each got its own arguments; both write bytecode (the image's steps do not); the smoke test ran
    # after finalize (it reports finalize's import pass); the HTTP of both goes to a closed port.
    assert "finalize [/opt/venv in.json --imports-to /s/i] pyc=[] proxy=[http://127.0.0.1:9]" in res.stderr
    assert ("smoke [--venv /opt/venv --import six --imports-from /s/i] pyc=[] proxy=[http://127.0.0.1:9 "
            "http://127.0.0.1:9]") in res.stderr
    assert "smoke: finalize still running" not in res.stderr and (tmp_path / "fin.done").exists()
    assert res.stderr.index("finalize [") < res.stderr.index("smoke [")


@pytest.mark.parametrize("fin_rc,smoke_rc,named", [(1, 0, ["finalize failed (exit 1"]),
                                                   (0, 3, ["the smoke test failed (exit 3"]),
                                                   (1, 1, ["finalize failed", "the smoke test failed"])])
def test_finalize_smoked_fails_naming_what_failed_after_running_both(tmp_path, fin_rc, smoke_rc, named):
    res = _finalize_smoked(tmp_path, "/opt/venv", "--", "--venv", "/opt/venv", fin_rc=fin_rc, smoke_rc=smoke_rc)
    assert res.returncode != 0 and all(f"slimeforge: ERROR: {n}" in res.stderr for n in named), res.stderr
    assert (tmp_path / "fin.done").exists()  # finalize ran whole, and the smoke test ran after it, either failing
    assert ("finalize failed" in res.stderr) == bool(fin_rc) and ("smoke test failed" in res.stderr) == bool(smoke_rc)


def test_finalize_smoked_needs_the_smoke_tests_arguments(tmp_path):
    res = _finalize_smoked(tmp_path, "/opt/venv", "in.json")
    assert res.returncode != 0 and "'--' and the smoke test's arguments are required" in res.stderr
    assert not (tmp_path / "fin.done").exists()  # refused before anything ran


def test_smoke_lines_are_read_from_buildkits_progress():
    from slimeforge.image.builder.build import smoke_lines

    lines = ["#29 0.31 slimeforge: phase smoke imports 1795717981.8", "#29 12.34 slimeforge: smoke: import torch ok\n",
             "#29 35.1 slimeforge: smoke test passed, with 7 GPU import(s) skipped",
             "#29 100 slimeforge: smoke: import x ok",
             "#29 1.0 slimeforge: smoked: no", "#30 exporting layers", "#29 2.0 other: smoke: import y ok"]
    assert smoke_lines(lines) == ["smoke: import torch ok", "smoke test passed, with 7 GPU import(s) skipped",
                                  "smoke: import x ok"]


def test_a_patch_removes_the_bytecode_of_the_files_it_changes_and_no_other(tmp_path):
    """install.sh compiles bytecode ahead of the import pass, before the patches step: a .pyc is
    checked against its source's mtime and size alone, so the bytecode of a patched file goes."""
    site = tmp_path / "site"
    (site / "__pycache__").mkdir(parents=True)
    (site / "six.py").write_text("# Copyright (c) 2010-2024 Benjamin Peterson\n#\n"
                                 "# Permission is hereby granted, free of charge, to any person obtaining a copy\n")
    stale = site / "__pycache__" / "six.cpython-312.pyc"
    other = site / "__pycache__" / "sixteen.cpython-312.pyc"
    stale.write_bytes(b"old")
    other.write_bytes(b"kept")
    patch = tmp_path / "six.patch"
    patch.write_text(bs.SIX_PATCH)
    res = sf("sf_apply_patch", "six.patch", "patch", "2", str(patch), str(site), state=tmp_path)
    assert res.returncode == 0, res.stderr
    assert not stale.exists() and other.read_bytes() == b"kept"
