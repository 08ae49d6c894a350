"""The kernel check (scripts/kernel_check.py) without a GPU: it runs here for real and says every
piece is skipped for want of a GPU; its reports (real ones captured on an H100, one with a piece
that failed) become doctor findings; `invoke doctor --kernels` runs it with the install's Python."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slimeforge.image.stack import load_stack
from slimeforge.run import preflight as doctor
from slimeforge.run.imageprobe import ImageFacts
from slimeforge.run.preflight import kernels
from slimeforge.run.preflight.findings import ERROR, OK, WARNING, Context

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "slimeforge" / "scripts" / "kernel_check.py"
CAPTURES = ROOT / "tests" / "fixtures" / "kernel_check"
PIECES = ["apex", "transformer_engine", "torch_memory_saver", "flash_attn.cute", "flash_attn_2"]
NO_GPU_PATH = "/usr/bin:/bin"  # no nvidia-smi: no GPU, as on this machine
no_gpu_here = pytest.mark.skipif(shutil.which("nvidia-smi") is not None,
                                 reason="this host has nvidia-smi: the no-GPU path is not what runs")


def run_script(*args: str, path: str = NO_GPU_PATH) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": path, "HOME": os.environ.get("HOME", "/tmp")})


def test_without_a_gpu_every_piece_is_skipped_by_name():
    res = run_script("--json")
    assert res.returncode == 0, res.stderr
    doc = kernels.parse_report(res.stdout)
    assert doc["gpu"] is None and doc["ok"] is True
    assert [(p["name"], p["status"], p["detail"]) for p in doc["pieces"]] == [(n, "skipped", "no GPU") for n in PIECES]
    text = run_script()
    assert text.returncode == 0
    assert [f"{n}: skipped: no GPU" for n in PIECES] == text.stdout.splitlines()[:5]
    one = run_script("--json", "--only", "apex")
    assert [p["name"] for p in json.loads(one.stdout)["pieces"]] == ["apex"]
    bad = run_script("--only", "nccl")
    assert bad.returncode == 2 and "invalid choice: 'nccl'" in bad.stderr


def test_real_h100_reports_become_findings():
    doc = kernels.parse_report((CAPTURES / "h100-ok.json").read_text())
    found = kernels.kernel_findings(doc, "the install at /opt/sf", "install again")
    assert [f.level for f in found] == [OK] * 4
    assert found[1].message.startswith("transformer_engine ran right on NVIDIA H100 80GB HBM3 (Linear bf16 forward")
    doc = kernels.parse_report((CAPTURES / "h100-te-extension-missing.json").read_text())
    found = kernels.kernel_findings(doc, "the install at /opt/sf", "install again")
    assert [f.level for f in found] == [OK, ERROR, OK, OK]
    assert found[1].message == ("transformer_engine FAILED on NVIDIA H100 80GB HBM3 in the install at /opt/sf: "
                                "FileNotFoundError: "
                                "Could not find shared object file for Transformer Engine torch lib. (at "
                                "__init__.py:128)")
    assert found[1].fix == "install again"
    # The real cu13 install's wheels on the H100: torch_memory_saver linked without libcuda.
    doc = kernels.parse_report((CAPTURES / "h100-tms-without-libcuda.json").read_text())
    found = kernels.kernel_findings(doc, "the install at /opt/sf", "install again",
                                    load_stack("cu13").smoke.all_imports)
    assert [f.level for f in found] == [OK, OK, ERROR, OK, OK]
    assert "torch_memory_saver FAILED" in found[2].message and "undefined symbol: cuMemCreate" in found[2].message
    assert found[4].message == "flash_attn_2: not part of this stack, not installed"
    skipped = kernels.kernel_findings({"gpu": None, "pieces": [{"name": "apex", "status": "skipped",
                                                                "detail": "no GPU", "seconds": 0}]},
                                      "image x", "f")
    assert [(f.level, f.message) for f in skipped] == [(WARNING,
                                                        "no GPU here: the kernels of image x were not checked (apex)")]
    # Not installed: FA2 on cu13 is as it should be, apex missing from a stack that has it is not.
    absent = {"gpu": "H100", "pieces": [{"name": n, "status": "skipped", "detail": "not installed",
                                         "seconds": 0} for n in ("flash_attn_2", "apex")]}
    found = kernels.kernel_findings(absent, "image x", "f", load_stack("cu13").smoke.all_imports)
    assert [(f.level, f.message) for f in found] == [(OK, "flash_attn_2: not part of this stack, not installed"),
                                                      (WARNING, "apex not checked in image x: not installed")]
    assert kernels.kernel_findings(absent, "image x", "f", load_stack("cu129").smoke.all_imports)[0].level == WARNING


@pytest.mark.parametrize("text,why", [
    ("", "it printed nothing"),
    ("Traceback (most recent call last):\n", "its last line is not JSON"),
    ('{"gpu": null}', "no list of pieces"),
    ('{"gpu": null, "pieces": []}', "no list of pieces"),
    ('{"gpu": null, "pieces": [{"name": "apex", "status": "fine", "detail": "", "seconds": 1}]}',
     "is not {name, status"),
    ('{"gpu": null, "pieces": [{"name": "apex", "status": "ok", "detail": "a\\u001b[2Jb", "seconds": 1}]}',
     "control characters"),
    ('{"gpu": 3, "pieces": [{"name": "apex", "status": "ok", "detail": "", "seconds": 1}]}', "gpu is neither"),
    ("x" * (2 << 20), "over 1048576"),
])
def test_a_report_that_is_not_the_checks_own_is_refused(text, why):
    with pytest.raises(ValueError) as exc:
        kernels.parse_report(text)
    assert why in str(exc.value)


def fake_install(tmp_path: Path, python: str) -> Path:
    """An install prefix whose venv Python is `python` (linked)."""
    prefix = tmp_path / "prefix"
    (prefix / "venv" / "bin").mkdir(parents=True)
    (prefix / "venv" / "bin" / "python").symlink_to(python)
    return prefix


@no_gpu_here
def test_doctor_kernels_runs_the_check_with_the_installs_python(tmp_path):
    # The install's Python is this interpreter: the real script runs, finds no GPU, says so.
    prefix = fake_install(tmp_path, sys.executable)
    report = doctor.run_checks(None, load_stack("cu13"), install_prefix=str(prefix), only=["kernels"])
    assert [(f.level, f.message) for f in report.findings] == [
        (WARNING, f"no GPU here: the kernels of the install at {prefix} were not checked ({', '.join(PIECES)})")]
    # Not asked for: the GPU check does not run with the others.
    assert not [f for f in doctor.run_checks(None, load_stack("cu13"), install_prefix=str(prefix),
                                             network=False).findings
                if f.check == "kernels"]


def test_doctor_kernels_reads_a_failed_report_and_a_broken_python(tmp_path):
    # A GPU host's report with a failed piece (a real capture), printed by a stand-in Python that
    # exits 1 as the script does then.
    stand_in = tmp_path / "gpu-python"
    stand_in.write_text(f"#!/bin/sh\ncat {CAPTURES / 'h100-te-extension-missing.json'}\nexit 1\n")
    stand_in.chmod(0o755)
    report = doctor.run_checks(None, load_stack("cu13"), install_prefix=str(fake_install(tmp_path, str(stand_in))),
                               only=["kernels"], gpu_checks=True)
    assert [f.level for f in report.findings] == [OK, ERROR, OK,
                                                  OK] and "transformer_engine FAILED" in report.errors[0].message
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\necho 'ImportError: libc10.so: cannot open shared object file' >&2\nexit 1\n")
    broken.chmod(0o755)
    (tmp_path / "prefix").rename(tmp_path / "old")
    report = doctor.run_checks(None, load_stack("cu13"), install_prefix=str(fake_install(tmp_path, str(broken))),
                               only=["kernels"])
    assert len(report.errors) == 1 and "could not run with" in report.errors[0].message
    assert "ImportError: libc10.so" in report.errors[0].message
    none = doctor.run_checks(None, load_stack("cu13"), only=["kernels"])
    assert "no install prefix to check the kernels of" in none.errors[0].message


def test_container_mode_runs_the_images_python_on_the_gpus():
    # The probe found /opt/slimeforge in it: the stack's venv (any other image: test_layout.py).
    found = {"image-facts": ImageFacts("sha256:" + "ab" * 32, "3.12.3", None, None, None, None, None, None, None, None,
                                       "-", False, True)}
    ctx = Context(stack=load_stack("cu13"), mode="container", image="slimeforge/cu13:1", cache=found)
    argv = kernels.kernel_check_argv(ctx)
    assert argv[:9] == ["docker", "run", "--rm", "--gpus", "all", "--entrypoint", "/opt/venv/bin/python", "--",
                        "slimeforge/cu13:1"]
    assert argv[9] == "-c" and argv[10] == SCRIPT.read_text() and argv[11:] == ["--json", "--timeout", "120"]
    assert kernels.kernel_check_argv(Context(stack=load_stack("cu13"), mode="container")) is None


# --- "is there a GPU": kernel_check's probe (the image's and the install's) and the node agent's copy ---

SMI_LIST = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1111)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2222)\n"
SMI_QUERY = ("index, name, uuid, driver_version, memory.total [MiB], compute_cap, pci.bus_id\n"
             "0, NVIDIA H100 80GB HBM3, GPU-1111, 580.95.05, 81559 MiB, 9.0, 00000000:18:00.0\n"
             "1, NVIDIA H100 80GB HBM3, GPU-2222, 580.95.05, 81559 MiB, 9.0, 00000000:2A:00.0\n")
NO_DEVICES = "No devices were found\n"


@pytest.mark.parametrize(("name", "smi"), [
    ("no nvidia-smi", None),
    ("two GPUs", 'case "$*" in *query-gpu*) printf %s "$Q" ;; -L) printf %s "$L" ;; esac'),
    ("a driver that lists none", 'printf %s "$N"; exit 6'),
    ("a broken driver", 'echo "Failed to initialize NVML: Driver/library version mismatch"; exit 18'),
])
def test_the_gpu_probe_and_the_node_agents_copy_agree(tmp_path, monkeypatch, name, smi):
    """The node agent keeps its own "is there a GPU" (its one query lists every GPU); it must say
    what kernel_check's probe says (the smoke test's and the kernel check's) on the same driver."""
    from slimeforge.scripts import kernel_check, node_agent

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if smi is not None:
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{smi}\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("Q", SMI_QUERY)
    monkeypatch.setenv("L", SMI_LIST)
    monkeypatch.setenv("N", NO_DEVICES)
    probe = kernel_check.gpu_name() is not None
    agent = bool(node_agent.gpus().get("list"))
    assert probe == agent == (name == "two GPUs")
    script = subprocess.run([sys.executable, str(SCRIPT), "--probe"], capture_output=True, text=True, timeout=60)
    assert (script.returncode == 0) == probe, script.stdout
