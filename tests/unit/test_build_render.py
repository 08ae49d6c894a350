"""The real cu13/cu129 Dockerfiles: render without Docker or network, pass hadolint, carry every pin,
and run the same steps in the same order as the stack's plan."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slimeforge.build import parse_build_args, parse_progress, render_dockerfile
from slimeforge.stack import load_stack
from slimeforge.steps import compile_jobs, image_layout, step_commands

ROOT = Path(__file__).resolve().parents[2]
HADOLINT = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")


@pytest.mark.parametrize("flavor", ["cu13", "cu129"])
def test_real_dockerfile_passes_hadolint(flavor, tmp_path):
    path = tmp_path / "Dockerfile"
    path.write_text(render_dockerfile(load_stack(flavor)))
    res = subprocess.run([HADOLINT, "--config", str(ROOT / ".hadolint.yaml"), str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("flavor", ["cu13", "cu129"])
def test_real_dockerfile_carries_every_pin(flavor):
    stack = load_stack(flavor)
    text = render_dockerfile(stack)
    # Package versions and the router wheel live in the lock (each step bind-mounts its slice);
    # everything else (sources, base, patches) is in the Dockerfile itself.
    in_lock = ("pip.", "slime-req.", "router.")
    missing = {k: v for k, v in stack.pins().items() if k != "base.digest" and not k.startswith(in_lock) and v not in text}
    assert missing == {}
    for step in stack.plan():
        if step["kind"] in ("pip", "source", "wheel_url"):
            assert f"source=lock/{step['name']}.txt,target=/tmp/sf-lock/{step['name']}.txt" in text, step["name"]


@pytest.mark.parametrize("flavor", ["cu13", "cu129"])
def test_steps_in_plan_order_one_run_each(flavor):
    stack = load_stack(flavor)
    text = render_dockerfile(stack)
    names = [s["name"] for s in stack.plan()]
    positions = [text.index(f"/opt/slimeforge/sf {n} ") for n in names]
    assert positions == sorted(positions)
    assert text.count("\nRUN ") == len(names) + 2  # + venv + finalize
    # Compiled steps build against the installed torch, with the arch list of the stack.
    assert f'TORCH_CUDA_ARCH_LIST="{" ".join(stack.arch_list)}"' in text
    flash = next(s for s in step_commands(stack, image_layout(stack)) if s["name"] == "flash-attn")
    assert flash["argv"][-2:] == ["--lock", "/tmp/sf-lock/flash-attn.txt"]


def test_patch_steps_bind_only_their_patch_files():
    text = render_dockerfile(load_stack("cu13"))
    megatron_run = text.split("# --- step ")[[i for i, b in enumerate(text.split("# --- step ")) if ": megatron (" in b][0]]
    assert "source=patches/megatron.patch" in megatron_run
    assert "sglang.patch" not in megatron_run
    assert "--patch megatron.patch:git:1:/tmp/sf-patches/megatron.patch" in megatron_run


def test_compile_jobs_fit_memory_and_cores():
    assert compile_jobs(mem_bytes=24 << 30, cores=2) == (2, 1)
    assert compile_jobs(mem_bytes=64 << 30, cores=128) == (10, 4)
    assert compile_jobs(mem_bytes=2 << 30, cores=16) == (1, 4)


def test_build_args_are_validated_together():
    args, problems = parse_build_args(["MAX_JOBS=4", "bad key=1", "noequals"])
    assert args == {"MAX_JOBS": "4"}
    assert [p.value for p in problems] == ["bad key=1", "noequals"]


def test_progress_parser_reads_cache_hits_and_durations():
    lines = [
        "#5 [stage-0 3/5] RUN --mount=type=cache,target=/root/.cache/uv     /opt/slimeforge/sf venv venv /opt/venv 0.9.7",
        "#5 CACHED",
        "#6 [stage-0 4/5] RUN --mount=type=cache,target=/root/.cache/uv     /opt/slimeforge/sf six pip_step --venv /opt/venv",
        "#6 0.1 slimeforge: step six: pip_step",
        "#6 DONE 1.5s",
        "#7 [stage-0 5/5] COPY stack.lock.json /opt/slimeforge/stack.input.json",
        "#7 DONE 0.0s",
    ]
    steps = parse_progress(lines)
    assert [(s["name"], s["cached"], s["duration_s"]) for s in steps] == [("venv", True, None), ("six", False, 1.5), ("copy", False, 0.0)]


def test_base_given_by_digest_needs_no_docker():
    from slimeforge.build import resolve_base

    ref = "registry.example/cuda@sha256:" + "a" * 64
    base = resolve_base(load_stack("cu13"), ref, dry_run=False)
    assert base == {"image": ref, "from": ref, "digest": "sha256:" + "a" * 64, "image_id": None}
    text = render_dockerfile(load_stack("cu13"), base["from"])
    assert f"FROM {ref}\n" in text
