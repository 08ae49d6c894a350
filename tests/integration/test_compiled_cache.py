"""A compiled wheel never crosses a build-relevant boundary: a real C extension, built from its
sdist with --no-build-isolation in two stacks that differ only in their arch list, is compiled in
each. The sdist comes from a package index (a real HTTP server on the Docker bridge), as flash-attn
comes from PyPI: uv caches the wheel it builds from an index sdist by the sdist's URL and hash, so
with one shared uv cache the second build reuses the first one's wheel as-is (checked: without the
per-key caches this test fails on the arch list the second image reports).

The extension records, at compile time, the TORCH_CUDA_ARCH_LIST its build saw; each image must
report its own stack's. The stacks also install the interpreter by its version (python3.11 on the
Debian base) with its headers, as the CUDA stacks do with python3.12.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from build_support import remove_tags
from cext_support import STACK, serve_index

from slimeforge.image.builder.build import BuildOptions, build
from slimeforge.image.builder.buildreport import BuildReport
from slimeforge.image.lock.uvlock import LockOptions, resolve
from slimeforge.image.steps import compiled_key

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = f"slimeforge-cext-test/sfcext-{os.getpid()}"


def built(o: BuildOptions) -> dict:
    """A real build's report as report.json holds it (what these tests read)."""
    report = build(o)
    assert isinstance(report, BuildReport), report
    return report.to_json()


@pytest.fixture(scope="module")
def index(tmp_path_factory, docker_engine):
    with serve_index(tmp_path_factory.mktemp("index")) as url:
        yield url


@pytest.fixture(scope="module")
def images(base_image, index, tmp_path_factory):
    root = tmp_path_factory.mktemp("cext")
    made = {}
    try:
        for label, archs in (("hopper", '["9.0"]'), ("blackwell", '["9.0", "10.0"]')):
            path = root / f"{label}.yaml"
            path.write_text(STACK.format(archs=archs, index=index))
            if label == "hopper":
                # Both stacks share one lock (locks/pylock.sfcext.toml): arch_list is not an input of
                # the resolution, only of the compiled wheel.
                resolve(LockOptions(stack=str(path), echo=lambda s: None))
            # Compiled in place (--no-store): the per-key uv caches alone keep the builds apart.
            report = built(BuildOptions(stack=str(path), build_root=root / "out", repository=REPO, force=True,
                                        echo=lambda s: None,
                                        use_store=False))
            made[label] = (report, path)
        yield made
    finally:
        remove_tags(f"{REPO}:")


def run_in(tag: str, *argv: str) -> str:
    res = subprocess.run(["docker", "run", "--rm", "--network", "none", tag, *argv], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_each_arch_list_compiles_its_own_wheel(images):
    from slimeforge.image.stack import load_stack

    (hopper, _), (both, _) = images["hopper"], images["blackwell"]
    # The extension in each image was compiled for that image's arch list: not reused across them.
    assert run_in(hopper["tag"], "/opt/venv/bin/python", "-c", "import sfcext; print(sfcext.archs())") == "9.0"
    assert run_in(both["tag"], "/opt/venv/bin/python", "-c", "import sfcext; print(sfcext.archs())") == "9.0 10.0"
    # Under different keys, each build's uv cache holds its own build of the sdist.
    keys = [compiled_key(load_stack(p), "sfcext", r["base"]["image_id"]) for r, p in (images["hopper"],
                                                                                      images["blackwell"])]
    assert keys[0] != keys[1]
    for report, key in zip((hopper, both), keys, strict=True):
        dockerfile = (Path(report["dir"]) / "Dockerfile").read_text()
        assert f"--mount=type=cache,id=sf-uv-{key},target=/root/.cache/uv" in dockerfile
        # Compiled in a stage of its own, then installed in the main stage from that stage's wheels.
        assert (f"sf sfcext compiled --key {key} --venv /opt/venv --wheel-out /opt/sf-compiled/{key} -- "
               "pip_step") in dockerfile
        assert (f"sf sfcext compiled --key {key} --venv /opt/venv --wheels /tmp/sf-compiled/{key} -- "
               "pip_step") in dockerfile
        assert "--step sfcext --lock /tmp/sf-lock/sfcext.txt" in dockerfile
        log = (Path(report["dir"]) / "build.log").read_text()
        assert f"uv cache /root/.cache/uv/compiled/{key}" in log


def test_the_interpreter_is_installed_and_called_by_its_version(images):
    report, _ = images["hopper"]
    dockerfile = (Path(report["dir"]) / "Dockerfile").read_text()
    assert ("sf system system --python python3.11 --python-package python3.11 --python-package python3.11-venv "
            "--python-package python3.11-dev --need gcc::: --need libc6-dev:::") in dockerfile
    assert "sf venv venv /opt/venv 0.9.7 python3.11" in dockerfile
    assert run_in(report["tag"], "/opt/venv/bin/python", "-c", "import sys; print(sys.version_info[:2])") == "(3, 11)"
    # The headers the extension compiled against came with the interpreter's -dev package.
    assert run_in(report["tag"], "dpkg-query", "-W", "-f=${Status}", "python3.11-dev") == "install ok installed"
