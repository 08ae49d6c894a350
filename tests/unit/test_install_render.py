"""The install script: rendered from the same steps as the Dockerfile (drift guard), valid bash,
shellcheck-clean, prerequisites in front, and the CLI's dry run."""

from __future__ import annotations

import base64
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from slimeforge.image.build import render_dockerfile
from slimeforge.image.install import render_install_script
from slimeforge.image.stack import load_stack
from slimeforge.image.steps import host_layout, image_layout, lock_files

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import build_support as bs  # noqa: E402
from build_support import placeholder_patches, render_lock  # noqa: E402


def normalise(argv: list[str], layout) -> list[str]:
    subs = sorted([(layout.venv, "<venv>"), (layout.patches_dir, "<patches>"), (layout.state, "<state>"), (layout.root + "/", "<root>/"),
                   (layout.lock_dir, "<lock>")]
                  + [(u, "<url>") for u in layout.source_urls.values()], key=lambda x: -len(x[0]))
    out = []
    for a in argv:
        for old, new in subs:
            a = a.replace(old, new)
        out.append(a)
    return out


def dockerfile_steps(text: str, layout) -> list[tuple[str, list[list[str]]]]:
    joined = text.replace("\\\n", " ")
    steps = []
    for line in joined.splitlines():
        if not line.startswith("RUN ") or "/opt/slimeforge/sf " not in line or " finalize finalize " in line:
            continue
        cmds = [shlex.split(part.split("/opt/slimeforge/sf ", 1)[1]) for part in line.split(" && ")]
        steps.append((cmds[0][0], [normalise(c[1:], layout) for c in cmds]))
    return steps


def script_steps(text: str, layout) -> list[tuple[str, list[list[str]]]]:
    bodies = {m.group(1): m.group(2) for m in re.finditer(r"^sf_step_(\w+)\(\) \{\n(.*?)^\}", text, re.S | re.M)}
    order = re.findall(r"^sf_run_step (\S+) \S+ .*-- sf_step_(\w+)$", text, re.M)
    steps = []
    for name, fn in order:
        if name == "finalize":
            continue
        cmds = [shlex.split(line.strip()) for line in bodies[fn].strip().splitlines()]
        steps.append((name, [normalise([c[0].removeprefix("sf_"), *c[1:]], layout) for c in cmds]))
    return steps


@pytest.mark.parametrize("flavor", ["cu13", "cu129", str(bs.TEST_STACK)])
def test_dockerfile_and_install_script_hold_the_same_steps(flavor):
    stack = load_stack(flavor)
    docker = dockerfile_steps(render_dockerfile(stack), image_layout(stack))
    lock = render_lock(stack)
    script_text = render_install_script(stack, "/opt/slime", patches=placeholder_patches(stack), lock=lock)
    script = script_steps(script_text, host_layout(stack, "/opt/slime", None, None))
    assert docker == script
    assert len(script) == len(stack.plan) + 1  # + venv
    for value in (v for k, v in stack.pins().items() if k.startswith("source.")):
        assert value in script_text
    for name, text in lock_files(stack, lock, host_layout(stack, "/opt/slime", None, None)).items():
        assert base64.encodebytes(text.encode()).decode().rstrip("\n") in script_text, name  # every slice travels in the script


@pytest.mark.parametrize("flavor", ["cu13", str(bs.TEST_STACK)])
def test_install_script_is_valid_bash_and_checks_prerequisites_first(flavor, tmp_path):
    stack = load_stack(flavor)
    text = render_install_script(stack, "/opt/slime it's", patches=placeholder_patches(stack), lock=render_lock(stack))
    path = tmp_path / "install.sh"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    res = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout
    assert text.index("\nsf_prereqs\n") < text.index("\nsf_run_step ")
    if stack.cuda:
        assert "nvcc" in text and f"-ge {stack.driver_min}" not in text and f"driver_min={stack.driver_min}" in text
        assert "want_cuda=13.0" in text and "release $release, the stack needs $want_cuda" in text


def test_cli_dry_run_renders_and_prints_the_path(tmp_path):
    repos = bs.make_repos(tmp_path / "repos")
    res = subprocess.run([sys.executable, "-m", "invoke", "install", "--stack", str(bs.TEST_STACK), "--prefix", str(tmp_path / "p"),
                          "--dry-run", "--source", f"slime={repos['slime']}", "--source", f"libdemo={repos['libdemo']}"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    script = Path(res.stdout.strip())
    assert script == tmp_path / "p" / ".slimeforge" / "install" / "install.sh" and script.is_file()
    assert not (tmp_path / "p" / "venv").exists()


def test_prerequisite_failure_lists_every_problem_before_step_one(tmp_path):
    stack = load_stack("cu13")
    path = tmp_path / "install.sh"
    path.write_text(render_install_script(stack, str(tmp_path / "p"), patches=placeholder_patches(stack), lock=render_lock(stack)))
    res = subprocess.run(["bash", str(path)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "CUDA_HOME": str(tmp_path / "nocuda")})
    assert res.returncode == 1
    assert "prerequisite: CUDA: no nvcc at" in res.stderr and "nvidia-smi not found" in res.stderr
    assert "step " not in res.stderr


@pytest.mark.parametrize("flavor", ["cu13", "cu129"])
def test_install_script_carries_interpreter_arch_variables_and_compiled_keys(flavor):
    from slimeforge.image.steps import compiled_key

    stack = load_stack(flavor)
    text = render_install_script(stack, "/opt/slime", patches=placeholder_patches(stack), lock=render_lock(stack))
    assert "  sf_apt_install python3.12 python3.12-venv python3.12-dev git " in text
    assert "  sf_venv /opt/slime/venv 0.9.7 python3.12\n" in text
    assert "want_python=3.12" in text and '"python$want_python" -c' in text
    for name in ("flash-attn", "transformer-engine", "apex", "torch-memory-saver"):
        line = next(x for x in text.splitlines() if x.startswith(f"sf_run_step {name} "))
        for var in ("TORCH_CUDA_ARCH_LIST=9.0", "FLASH_ATTN_CUDA_ARCHS=90", "NVTE_CUDA_ARCHS=90"):
            assert f"--env {var} " in line, (name, var)
        key = compiled_key(stack, name)
        assert key.startswith(f"{flavor}-{name}-") and f"  sf_compiled --key {key} -- " in text
    flash = next(x for x in text.splitlines() if x.startswith("sf_run_step flash-attn "))
    assert "--env FLASH_ATTENTION_FORCE_BUILD=TRUE " in flash
    # The scripts the venv's Python runs are written next to the records, as in every image.
    assert "base64 -d >\"$SF_STATE/\"flag_catalog.py <<'SF_SCRIPT_1'" in text
    assert "base64 -d >\"$SF_STATE/\"kernel_check.py <<'SF_SCRIPT_2'" in text
    assert "base64 -d >\"$SF_STATE/\"smoke_versions.py <<'SF_SCRIPT_3'" in text
