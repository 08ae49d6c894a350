"""The preflight of an image slimeforge did not build (slime's official layout: slime at
/root/slime, Megatron-LM at /root/Megatron-LM, no /opt/slimeforge).

The image is built here FROM the test base: a stand-in slime (a git checkout, its parsers built
from exactly the flags this recipe renders, less one) and a stand-in Megatron-LM whose parser holds
the rest, plus Ray's package metadata (the version is all the probe reads). slimeforge's probe runs
inside it with its python3 and reads the flag catalog from those parsers; the answer is cached by
the image's ID; an image without slime gets a named warning while the other checks still run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from launch_support import FIXTURES, make_recipe, write_catalog

from slimeforge.run import preflight
from slimeforge.run.imageprobe import cache_dir, image_facts
from slimeforge.run.recipecheck import parse_recipe

pytestmark = [pytest.mark.docker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
TAG = "slimeforge-test/foreign-slime:probe"
DROPPED = "--rollout-batch-size"  # rendered by every recipe; missing from the image's slime
RAY = "2.49.1"
IMAGE_SITE, IMAGE_LIB = "/opt/image-site", "/opt/image-lib"

MEGATRON = '''import argparse

FLAGS = {flags!r}


def parse_args(extra_args_provider=None, ignore_unknown_args=False):
    parser = argparse.ArgumentParser(description="Megatron-LM Arguments (stand-in)", allow_abbrev=False)
    for flag in FLAGS:
        parser.add_argument(flag, nargs="*")
    if extra_args_provider is not None:
        parser = extra_args_provider(parser)
    args, _ = parser.parse_known_args()
    return args
'''

SLIME = '''import argparse

from megatron.training.arguments import parse_args as megatron_parse_args

SGLANG = {flags!r}


def parse_args():
    sglang = argparse.ArgumentParser(add_help=False)
    for flag in SGLANG:
        sglang.add_argument(flag, nargs="*")
    sglang.parse_known_args()
    return megatron_parse_args(extra_args_provider=None, ignore_unknown_args=True)
'''


def recipe_data(tmp: Path, image: str) -> dict:
    return make_recipe(tmp, mode="container", image=image, slime_dir="/root/slime", megatron_dir="/root/Megatron-LM")


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


@pytest.fixture(scope="module")
def foreign_image(base_image, tmp_path_factory):
    ctx = tmp_path_factory.mktemp("foreign-image")
    # The flags a recipe renders (and its model script's), as a build's catalog would hold them.
    host = tmp_path_factory.mktemp("host-recipe")
    recipe, stack = parse_recipe(make_recipe(host), "test")
    flags = json.loads(write_catalog(host / "flags.json", recipe, stack, drop=(DROPPED,)).read_text())["flags"]
    sglang = [f for f in flags if f.startswith(("--sglang", "--router"))]
    slime, megatron = ctx / "slime", ctx / "Megatron-LM"
    (slime / "slime" / "utils").mkdir(parents=True)
    for d in ("slime", "slime/utils"):
        (slime / d / "__init__.py").write_text("")
    (slime / "slime" / "utils" / "arguments.py").write_text(SLIME.format(flags=sglang))
    (slime / "scripts").mkdir()
    subprocess.run(["cp", "-r", str(FIXTURES / "slime" / "scripts" / "models"), str(slime / "scripts")], check=True)
    (slime / "train.py").write_text("from slime.utils.arguments import parse_args\nparse_args()\n")
    git(slime, "init", "-q")
    git(slime, "add", "-A")
    git(slime, "commit", "-qm", "stand-in slime")
    (megatron / "megatron" / "training").mkdir(parents=True)
    for d in ("megatron", "megatron/training"):
        (megatron / d / "__init__.py").write_text("")
    (megatron / "megatron" / "training" / "arguments.py").write_text(MEGATRON.format(flags=[f for f in flags
        if f not in sglang and f != "--help"]))
    meta = ctx / f"ray-{RAY}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: ray\nVersion: {RAY}\n")
    # The image's own search paths: a run in it keeps them (after Megatron, after its own libraries).
    (ctx / "image-site").mkdir()
    (ctx / "image-site" / "imagemod.py").write_text("WHERE = 'the image'\n")
    (ctx / "Dockerfile").write_text(
        f"FROM {base_image}\n"
        "COPY slime /root/slime\nCOPY Megatron-LM /root/Megatron-LM\n"
        f"COPY image-site {IMAGE_SITE}\n"
        f"ENV PYTHONPATH={IMAGE_SITE} LD_LIBRARY_PATH={IMAGE_LIB}\n"
        f"COPY ray-{RAY}.dist-info /usr/lib/python3/dist-packages/ray-{RAY}.dist-info\n")
    # Debian's docker client runs BuildKit without buildx (DESIGN.md), as test_run_in_image does.
    subprocess.run(["/usr/bin/docker", "build", "-q", "-t", TAG, str(ctx)], check=True, capture_output=True,
                   env={**os.environ, "DOCKER_BUILDKIT": "1"})
    yield {"tag": TAG, "slime_commit": git(slime, "rev-parse", "HEAD"), "flags": flags}
    subprocess.run(["docker", "image", "rm", TAG, TAG + "-again"], capture_output=True)


def image_id(ref: str) -> str:
    return subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_flags_and_versions_come_from_the_image_by_the_probe_and_are_cached_by_its_id(foreign_image, tmp_path):
    tag = foreign_image["tag"]
    assert subprocess.run(["docker", "run", "--rm", "--entrypoint", "test", tag, "-e",
                           "/opt/slimeforge"]).returncode == 1
    recipe, stack = parse_recipe(recipe_data(tmp_path, tag), "test")
    for entry in cache_dir().glob(f"{image_id(tag)[7:]}-*.json"):
        entry.unlink()  # the module's image is new, but its ID may be one an earlier session cached

    report = preflight.run_checks(recipe, stack, only=["flags", "versions"])
    (flags,) = [f for f in report.findings if f.check == "flags"]
    # Exactly the flag the image's slime lacks: every other rendered flag was in its parsers.
    assert flags.level == preflight.ERROR and flags.message.startswith(f"{DROPPED} (from slime.args) is not a flag of "
                                                                       f"slime {foreign_image['slime_commit'][:12]}")
    assert (f"read from slime's parsers at /root/slime in {tag} (image {image_id(tag)[7:19]}, probed "
           "now)") in flags.message
    (versions,) = [f for f in report.findings if f.check == "versions"]
    assert versions.level == preflight.OK and f"Ray {RAY}, Python 3.11" in versions.message, report.table()
    assert len(report.errors) == 1, report.table()

    # The answer is cached by the image's ID: another name for the same image is answered from it.
    (entry,) = cache_dir().glob(f"{image_id(tag)[7:]}-*.json")
    subprocess.run(["docker", "tag", tag, tag + "-again"], check=True)
    facts = image_facts(tag + "-again", "/root/slime", "/root/Megatron-LM")
    assert facts.cached and facts.catalog_source == "parsers" and facts.slime_commit == foreign_image["slime_commit"]
    assert facts.catalog is not None and facts.catalog.flags == set(foreign_image["flags"]) | {"--help"}
    again = preflight.run_checks(recipe, stack, only=["flags"])
    assert "(image " in again.errors[0].message and ", cached)" in again.errors[0].message

    # A cache entry is input: one that does not hold up is not believed, and is made again.
    entry.write_text(json.dumps({**json.loads(entry.read_text()), "slime_commit": "not a commit"}))
    remade = image_facts(tag, "/root/slime", "/root/Megatron-LM")
    assert not remade.cached and json.loads(entry.read_text())["slime_commit"] == foreign_image["slime_commit"]


def test_an_image_without_slime_is_a_named_warning_and_the_rest_of_the_preflight_runs(base_image, tmp_path):
    recipe, stack = parse_recipe(recipe_data(tmp_path, base_image), "test")
    report = preflight.run_checks(recipe, stack, only=["flags", "data", "versions"])
    by_check = {f.check: f for f in report.findings}
    assert by_check["flags"].level == preflight.WARNING, report.table()
    assert by_check["flags"].message.startswith("flag catalog unknown, flags not checked: no slime found: /root/slime "
                                                "holds no slime/ package")
    assert "slime_dir" in by_check["flags"].fix and "--catalog" in by_check["flags"].fix
    assert by_check["data"].level == preflight.OK
    # What is learned is still said: this image has no Ray, which launch.sh needs there.
    assert by_check["versions"].level == preflight.ERROR and ("Ray is not installed beside python3 "
                                                             "(/usr/bin/python3)") in by_check["versions"].message


def test_invoke_doctor_and_run_take_a_foreign_image(foreign_image, tmp_path):
    data = recipe_data(tmp_path, "unused:tag")
    del data["image"]
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(data))
    tag = foreign_image["tag"]
    for argv in (["doctor", "--recipe", str(tmp_path / "r.yaml"), "--image", tag, "--no-network"],
                 # Not a dry run (which renders without the preflight): the preflight refuses before anything starts.
                 ["run", str(tmp_path / "r.yaml"), "--image", tag, "--no-network", "--out", str(tmp_path / "run")]):
        r = subprocess.run([sys.executable, "-m", "invoke", *argv], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
        out = r.stdout + r.stderr
        assert r.returncode == 2, out  # the dropped flag, found in the image's own parsers
        assert f"{DROPPED} (from slime.args) is not a flag of slime {foreign_image['slime_commit'][:12]}" in out
        assert f"read from slime's parsers at /root/slime in {tag}" in out
        if argv[0] == "run":  # the launch says which layout it rendered, before the preflight's table
            layout = f"layout: the image's own layout: image {image_id(tag)[7:19]} has no /opt/slimeforge"
            assert layout in r.stdout, out
    assert not (tmp_path / "run" / "container.id").exists()
    # Without a recipe: the host checks, and what the image holds to run slime with.
    r = subprocess.run([sys.executable, "-m", "invoke", "doctor", "--image", tag], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert (f"Ray {RAY}, Python 3.11" in r.stdout
            and f"in {tag} (image {image_id(tag)[7:19]})" in r.stdout), r.stdout + r.stderr


# launch.sh's environment part, run in the image as Ray runs the job there: the variables launch.sh
# sets (SLIME_DIR, MODEL_SCRIPT, PYTHON, ARGS) and its MODEL_ARGS line, read from the rendered file;
# then train.py with runtime_env.json's env_vars over the image's own environment.
IN_IMAGE = r"""set -euo pipefail
cd "$1"
eval "$(sed -n -e '/^SLIME_DIR=/p' -e '/^MODEL_SCRIPT=/p' -e '/^PYTHON=/p' launch.sh)"
eval "$(sed -n '/^ARGS=($/,/^)$/p' launch.sh)"
eval "$(grep "^mapfile -d '' MODEL_ARGS" launch.sh)"
with_job_env() {
  "$PYTHON" -c 'import json, os, sys
env = json.load(open("runtime_env.json"))["env_vars"]
os.execvpe(sys.argv[1], sys.argv[1:], {**os.environ, **env})' "$@"
}
with_job_env "$PYTHON" -c 'import os, sys, imagemod, megatron.training.arguments as m
print("python", sys.executable); print("megatron", m.__file__)
print("imagemod", imagemod.WHERE); print("ld", os.environ["LD_LIBRARY_PATH"])'
# train.py imports slime beside it, and slime imports Megatron's parser.
with_job_env "$PYTHON" "$SLIME_DIR/train.py" "${MODEL_ARGS[@]}" "${ARGS[@]}"
echo "train.py exited 0 with ${#MODEL_ARGS[@]} model arguments and ${#ARGS[@]} more"
# Without the job's environment Megatron is not found: the rendered PYTHONPATH is what resolves it.
if "$PYTHON" "$SLIME_DIR/train.py" 2>/dev/null; then echo "train.py ran without the job's environment"; exit 1; fi
"""


def test_a_run_in_a_foreign_image_is_rendered_for_its_layout_and_its_paths_resolve_there(foreign_image, tmp_path):
    """`invoke run --dry-run --image` of an image without /opt/slimeforge: the plan says it used the
    image's layout, nothing of slimeforge's layout is in the run directory, and launch.sh's
    environment part, run in the image, finds slime, Megatron and the image's own module."""
    tag = foreign_image["tag"]
    data = recipe_data(tmp_path, "unused:tag")
    del data["image"]
    data["env"] = {"LD_LIBRARY_PATH": "/opt/recipe-lib"}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(data))
    run_dir = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "invoke", "run", str(tmp_path / "r.yaml"), "--image", tag, "--dry-run",
                        "--out", str(run_dir)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    layout = (f"layout: the image's own layout: image {image_id(tag)[7:19]} has no /opt/slimeforge; slime at "
             "/root/slime, Megatron-LM at /root/Megatron-LM, its python3")
    assert layout in r.stdout.splitlines(), r.stdout
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["layout"]["name"] == "image" and plan["layout"]["pythonpath"] == IMAGE_SITE
    env = json.loads((run_dir / "runtime_env.json").read_text())["env_vars"]
    assert env == {"PYTHONPATH": f"/root/Megatron-LM:{IMAGE_SITE}", "LD_LIBRARY_PATH": f"{IMAGE_LIB}:/opt/recipe-lib",
                   "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    for name in ("launch.sh", "slime.args", "runtime_env.json"):
        assert "/opt/slimeforge" not in (run_dir / name).read_text(), name

    ran = subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", f"{run_dir}:{run_dir}:ro",
                          "--entrypoint", "bash", tag,
                          "-c", IN_IMAGE, "in-image", str(run_dir)], capture_output=True, text=True, timeout=300)
    out = ran.stdout + ran.stderr
    assert ran.returncode == 0, out
    lines = ran.stdout.splitlines()
    assert lines[:4] == ["python /usr/bin/python3", "megatron /root/Megatron-LM/megatron/training/arguments.py",
                         "imagemod the image", f"ld {IMAGE_LIB}:/opt/recipe-lib"], out
    assert len(lines) == 5 and lines[4].startswith("train.py exited 0 with ") and " with 0 model" not in lines[4], out

    # Slurm's container mode renders the same run directory for the same image.
    slurm_dir = tmp_path / "slurm-run"
    r = subprocess.run([sys.executable, "-m", "invoke", "run", str(tmp_path / "r.yaml"), "--image", tag, "--slurm",
                        "--dry-run", "--out", str(slurm_dir)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and layout in r.stdout.splitlines(), r.stdout + r.stderr
    assert json.loads((slurm_dir / "runtime_env.json").read_text())["env_vars"] == env
    assert json.loads((slurm_dir / "plan.json").read_text())["layout"]["name"] == "image"


def test_a_dry_run_pulls_nothing_and_says_the_layout_is_not_known(tmp_path):
    data = recipe_data(tmp_path, "unused:tag")
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(data))
    absent = "slimeforge-test/not-here:none"
    r = subprocess.run([sys.executable, "-m", "invoke", "run", str(tmp_path / "r.yaml"), "--image", absent,
                        "--dry-run", "--out", str(tmp_path / "run")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (f"layout: the image's layout is not known ({absent} is not on this host (a dry run pulls nothing)): "
            "rendered for slimeforge's layout") in r.stdout.splitlines()
    assert json.loads((tmp_path / "run" / "plan.json").read_text())["layout"]["name"] == "slimeforge"
    assert subprocess.run(["docker", "image", "inspect", absent], capture_output=True).returncode != 0
