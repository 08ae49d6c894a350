"""The layout a run is rendered for (run/layout.py): slimeforge's own for an image it built, the
image's own for any other (what the probe found there); the run directory of each, and the kernel
check's interpreter. The probe inside a real image: tests/integration/test_any_image.py."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from helpers import SEED_RECIPE

from slimeforge import paths
from slimeforge.errors import ConfigError
from slimeforge.image.stack import load_stack
from slimeforge.run.imageprobe import ImageFacts
from slimeforge.run.layout import IMAGE_NAME, SLIMEFORGE, SLIMEFORGE_NAME, layout_from_facts, layout_here, search_path
from slimeforge.run.preflight import kernels
from slimeforge.run.preflight.findings import Context
from slimeforge.run.recipecheck import parse_recipe
from slimeforge.run.rundir import build_run_dir

ID = "sha256:" + "ab" * 32


def facts(*, slimeforge_image: bool, slime: str | None = "/root/slime", megatron: str | None = "/root/Megatron-LM",
          pythonpath: str | None = None, ld: str | None = None) -> ImageFacts:
    return ImageFacts(ID, "3.12.3", "2.49.1", "/usr/bin/python3", slime, megatron, None, None, None, None,
                      "no catalog here", False,
                      slimeforge_image, pythonpath, ld)


def container_recipe(**over):
    return parse_recipe({**SEED_RECIPE, "mode": "container", "image": "slimerl/slime:latest", **over}, "test")


def test_an_image_slimeforge_built_keeps_slimeforges_layout_exactly():
    recipe, stack = container_recipe()
    layout, same = layout_from_facts(facts(slimeforge_image=True, slime="/elsewhere/slime"), recipe)
    assert layout.name == SLIMEFORGE_NAME and same is recipe  # the recipe's paths stand
    ours = build_run_dir(recipe, stack, "/tmp/sf-layout-run", environ={}, layout=layout)
    before = build_run_dir(recipe, stack, "/tmp/sf-layout-run", environ={})  # no layout asked: slimeforge's, as before
    assert ours.env == before.env and ours.args == before.args and ours.files["launch.sh"] == before.files["launch.sh"]
    assert ours.env["LD_LIBRARY_PATH"].split(":")[0] == "/opt/slimeforge/cudart-decoy"
    assert before.plan["layout"] == SLIMEFORGE.record() and ours.plan["layout"]["name"] == SLIMEFORGE_NAME


def test_a_foreign_image_is_rendered_for_its_own_layout():
    recipe, stack = container_recipe(slime_dir="/root/slime", megatron_dir="/opt/missing-megatron")
    # The image's slime at the recipe's slime_dir; its Megatron found by `import megatron` (an editable install's
    # checkout).
    layout, moved = layout_from_facts(facts(slimeforge_image=False, megatron="/usr/src/Megatron-LM",
                                            pythonpath="/opt/extra::/opt/more:/opt/extra",
                                            ld="/usr/local/nvidia/lib64:/opt/img/lib"), recipe)
    assert layout.name == IMAGE_NAME and "has no /opt/slimeforge" in layout.why
    assert "Megatron-LM at /usr/src/Megatron-LM (by `import megatron`)" in layout.why and layout.megatron_imported
    assert (moved.slime_dir, moved.megatron_dir) == ("/root/slime",
                                                     "/usr/src/Megatron-LM")  # where the probe found them
    run = build_run_dir(moved, stack, "/tmp/sf-layout-run", environ={}, layout=layout)
    # Megatron imports already: nothing ahead of the image's own entries, each once, no empty one (it would put the cwd
    # on sys.path).
    assert run.env == {"PYTHONPATH": "/opt/extra:/opt/more", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    for name, text in run.files.items():
        if name != "plan.json":  # the plan records the stack the recipe names
            assert "/opt/slimeforge" not in text and stack.venv not in text, name
    launch = run.files["launch.sh"]
    # the image's python3
    assert "SLIME_DIR=/root/slime\n" in launch and 'PYTHON="${SLIMEFORGE_PYTHON:-python3}"' in launch
    assert json.loads(run.files["runtime_env.json"]) == {"env_vars": run.env}
    args = run.args
    assert json.loads(args[args.index("--train-env-vars") + 1]) == run.env  # slime's train actors get the same
    plan = json.loads(run.files["plan.json"])
    assert plan["layout"] == layout.record() and plan["layout"]["name"] == IMAGE_NAME
    assert plan["recipe"]["megatron_dir"] == "/usr/src/Megatron-LM"
    # Neither Megatron's directory nor the image's PYTHONPATH to add: the variable is left as the image has it.
    installed, moved = layout_from_facts(facts(slimeforge_image=False, megatron="/usr/lib/python3/dist-packages"),
                                         recipe)
    assert build_run_dir(moved, stack, "/tmp/sf-layout-run", environ={},
                         layout=installed).env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def test_what_the_recipe_adds_to_the_library_path_goes_after_the_images_own():
    recipe, stack = container_recipe(env={"LD_LIBRARY_PATH": "/opt/x/lib", "CUDA_HOME": "/usr/local/cuda-13.0",
                                          "NCCL_DEBUG": "INFO"})
    layout, recipe = layout_from_facts(facts(slimeforge_image=False, ld="/usr/local/nvidia/lib64"), recipe)
    env = build_run_dir(recipe, stack, "/tmp/sf-layout-run", environ={"WANDB_ENTITY": "team"}, layout=layout).env
    assert env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64:/opt/x/lib"
    assert (env["CUDA_HOME"] == "/usr/local/cuda-13.0" and env["NCCL_DEBUG"] == "INFO"
            and env["PYTHONPATH"] == "/root/Megatron-LM")
    assert not {"CUDNN_HOME", "CUDNN_PATH", "CUDNN_FRONTEND_CUDART_LIB_NAME"} & set(env)
    # An image without LD_LIBRARY_PATH and a recipe that adds nothing: the variable is not set at all.
    layout, recipe = layout_from_facts(facts(slimeforge_image=False), container_recipe()[0])
    assert "LD_LIBRARY_PATH" not in build_run_dir(recipe, stack, "/tmp/sf-layout-run", environ={}, layout=layout).env


def test_search_path_keeps_order_drops_empty_and_repeated_entries():
    assert search_path("/a", None, "/b::/a:", "", "/c") == "/a:/b:/c"
    assert search_path(None) == ""


def test_the_kernel_check_runs_the_images_python3_when_slimeforge_did_not_build_it():
    stack = load_stack("cu13")
    for built, python in ((True, f"{stack.venv}/bin/python"), (False, "python3")):
        ctx = Context(stack=stack, mode="container", image="slimerl/slime:latest",
                      cache={"image-facts": facts(slimeforge_image=built)})
        argv = kernels.kernel_check_argv(ctx)
        assert argv is not None and argv[:9] == ["docker", "run", "--rm", "--gpus", "all", "--entrypoint", python,
                                                 "--", "slimerl/slime:latest"]
    # A probe that failed: the image is taken for slimeforge's, as before the probe existed.
    ctx = Context(stack=stack, mode="container", image="slimerl/slime:latest",
                  cache={"image-facts": RuntimeError("no docker")})
    assert kernels.kernel_check_argv(ctx)[6] == f"{stack.venv}/bin/python"


def test_the_kernel_checks_fix_names_the_interpreter_it_ran(tmp_path):
    # A stand-in `docker` that prints nothing and fails: the check's error carries the fix for this image.
    docker = tmp_path / "docker"
    docker.write_text(f"#!{sys.executable}\nimport sys\nsys.exit(3)\n")
    docker.chmod(0o755)
    stack = load_stack("cu13")
    for built in (True, False):
        ctx = Context(stack=stack, mode="container", image="slimerl/slime:latest", docker=str(docker),
                      cache={"image-facts": facts(slimeforge_image=built)})
        (finding,) = kernels.check_kernels(ctx)
        if built:
            assert shlex.join(["--entrypoint", f"{stack.venv}/bin/python"]) in finding.fix
        else:
            assert "slimerl/slime:latest's own (its python3 ran slimeforge's kernel check" in finding.fix


def test_in_place_without_opt_slimeforge_keeps_this_environments_own_layout():
    if Path(paths.IMAGE_STATE).is_dir():
        pytest.skip(f"this machine has {paths.IMAGE_STATE}: slimeforge's own layout here")
    recipe, stack = parse_recipe({**SEED_RECIPE, "install_prefix": None}, "test")
    layout = layout_here(recipe, {"PYTHONPATH": "/opt/site", "LD_LIBRARY_PATH": "/usr/lib/x"}, "/usr/bin/python3")
    assert layout.name == IMAGE_NAME and layout.why.endswith("Megatron-LM at /root/Megatron-LM, /usr/bin/python3")
    assert build_run_dir(recipe, stack, "/tmp/sf-layout-run", environ={},
                         layout=layout).env["PYTHONPATH"] == "/root/Megatron-LM:/opt/site"
    with pytest.raises(ConfigError, match="LD_LIBRARY_PATH") as bad:
        layout_here(recipe, {"LD_LIBRARY_PATH": "/usr/lib\x1b[2J"}, "/usr/bin/python3")
    assert "control character" in str(bad.value)
