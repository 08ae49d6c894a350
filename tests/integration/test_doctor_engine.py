"""doctor's container-mode checks against the real Docker Engine here: that it answers, that the
NVIDIA Container Toolkit starts a `--gpus` container of the image (this machine has no GPU: the
finding must be Docker's own refusal, word for word), and that a `docker run` that fails shows
Docker's message (a registry that does not resolve), not its last line alone. Each expectation is
what Docker itself says when the test runs the same command."""

from __future__ import annotations

import subprocess

import pytest
from launch_support import make_recipe

from slimeforge.image.stack import load_stack
from slimeforge.run import preflight as doctor
from slimeforge.run.recipecheck import parse_recipe

pytestmark = pytest.mark.docker
CU13 = load_stack("cu13")
UNRESOLVABLE = "registry.invalid/slimeforge-test/none:1"


def docker_says(*argv: str) -> tuple[int, list[str]]:
    """What Docker itself answers to this command: its status and its non-empty lines."""
    r = subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=120)
    return r.returncode, [line for line in (r.stdout + r.stderr).splitlines() if line.strip()]


def docker_findings(**kwargs) -> list[doctor.Finding]:
    return doctor.run_checks(None, CU13, mode="container", only=["docker"], **kwargs).findings


def test_docker_answers_and_the_gpu_container_is_reported_in_dockers_words(base_image):
    _, version = docker_says("version", "--format", "{{.Server.Version}}")
    engine, gpu = docker_findings(image=base_image)
    assert (engine.level, engine.message) == (doctor.OK, f"Docker Engine {version[0]} answers")
    code, said = docker_says("run", "--rm", "--pull", "never", "--gpus", "all", "--entrypoint", "nvidia-smi", "--",
                             base_image, "-L")
    if code == 0:  # a GPU host with the toolkit: the GPUs the container sees
        assert gpu.level == doctor.OK and (f"{sum(line.startswith('GPU ') for line in said)} GPU(s) "
                                          "inside") in gpu.message
        return
    assert gpu.level == doctor.ERROR
    shown = gpu.message.splitlines()
    assert shown[0].endswith(f"exited with {code}:")
    assert shown[1:] == said  # Docker's message whole, in its own words
    if any("could not select device driver" in line for line in said):  # no NVIDIA Container Toolkit (this machine)
        assert "install the NVIDIA Container Toolkit" in gpu.fix


def test_an_engine_that_does_not_answer_is_dockers_own_message(tmp_path, monkeypatch):
    socket = tmp_path / "no-engine.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{socket}")
    code, said = docker_says("version", "--format", "{{.Server.Version}}")
    assert code != 0
    (finding,) = docker_findings(image="anything:1")
    assert finding.level == doctor.ERROR and finding.message.startswith("Docker Engine does not answer: ")
    assert [line for line in said if str(socket) in line][0] in finding.message.splitlines()
    assert "start Docker Engine" in finding.fix  # "Cannot connect to the Docker daemon" named the cause


def test_an_image_that_cannot_be_had_is_one_error_and_the_checks_that_need_it_say_so(tmp_path):
    """Issue 42.8: an image not here is pulled once (as the launch's `docker run` would); when that
    fails, the docker check holds the one error, in Docker's words with the fix they name, and the
    other checks that need the image are skipped naming it (they were 3 more reports, 3 fixes)."""
    engine, absent = docker_findings(image=UNRESOLVABLE)
    assert engine.level == doctor.OK
    code, said = docker_says("pull", "--", UNRESOLVABLE)
    assert absent.level == doctor.ERROR and absent.message.startswith(f"image {UNRESOLVABLE} cannot be had here: ")
    assert absent.message.splitlines()[0].endswith(f"exited with {code}:")
    recipe, _ = parse_recipe(make_recipe(tmp_path, mode="container", image=UNRESOLVABLE, slime_dir="/root/slime"),
                             "test")
    report = doctor.run_checks(recipe, only=["docker", "model-config", "flags", "versions"])
    needing = [f for f in report.findings if f.check != "docker" and f.needs]
    assert [f.check for f in report.errors if "cannot be had" in f.message] == ["docker"]
    assert {f.check for f in needing} == {"model-config", "flags", "versions"}
    assert all(f.needs == "docker" and f.level == doctor.WARNING and not f.fix for f in needing)


def test_a_docker_run_that_fails_shows_dockers_message_not_its_last_line(tmp_path):
    """The issue's case: an image whose registry does not resolve. doctor used to say "exited with
    125: Run 'docker run --help' for more information" and guess a fix. The flag catalog is now read
    by the image probe (run/imageprobe.py), which pulls an image that is not here first: Docker's
    own lines of that pull are what doctor shows."""
    recipe, _ = parse_recipe(make_recipe(tmp_path, mode="container", image=UNRESOLVABLE), "test")
    code, said = docker_says("pull", "--", UNRESOLVABLE)
    assert code != 0
    (finding,) = [f for f in doctor.run_checks(recipe, only=["flags"],
                                               network=False).findings if f.level == doctor.ERROR]
    shown = finding.message.splitlines()
    assert shown[0].endswith(f"exited with {code}:")
    assert [line for line in said if UNRESOLVABLE.split("/")[0] in line and "Unable to find" not in line][0] in shown
    if any("no such host" in line for line in said):  # Docker named the cause: the fix follows from it
        assert "does not resolve" in finding.fix
    else:  # Docker said something else (a proxy here): no cause is made up
        assert "does not resolve" not in finding.fix


def test_host_mode_runs_no_docker_check():
    assert doctor.run_checks(None, CU13, mode="host", only=["docker"]).findings == []
