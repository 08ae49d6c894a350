"""Issue 42.8: each cause reported once, with one fix. An image that cannot be had is one error
(the first check that needs it, in Docker's words, with the fix they name); every later check that
needs it is skipped naming that check. A check that needs an image, where none is given, says so
and points at --image. A missing credential is one error. Docker's text is cut between lines."""

from __future__ import annotations

from pathlib import Path

import yaml

from slimeforge.errors import CommandError
from slimeforge.proc import Result, Runner
from slimeforge.run import preflight as doctor
from slimeforge.run.layout import layout_of_image
from slimeforge.run.recipecheck import parse_recipe
from slimeforge.schema import excerpt

GOOD = yaml.safe_load(Path("recipes/gsm8k.yaml").read_text())
IMAGE = "registry.invalid/team/slime:1"
PULL_SAYS = ('Error response from daemon: Get "https://registry.invalid/v2/": dial tcp: lookup registry.invalid on '
             '10.0.0.53:53: '
             "no such host\n")


class Docker(Runner):
    """Docker as it answers for an image whose registry does not resolve (what `docker` says here,
    word for word, for registry.invalid): the engine answers, the image is not here, its pull fails."""

    def run(self, argv, **kw):  # type: ignore[override]
        argv = [str(a) for a in argv]
        self.history.append(argv)
        if argv[1] == "version":
            return Result(argv, 0, "27.3.1\n", "")
        if argv[1:3] == ["image", "inspect"]:
            return Result(argv, 1, "", f"Error response from daemon: No such image: {IMAGE}\n")
        if argv[1] == "pull":
            raise CommandError(kw.get("step", "docker pull"), argv, 1, PULL_SAYS)
        raise AssertionError(f"nothing else runs once the image cannot be had: {argv}")


def recipe(**over):
    return parse_recipe({**GOOD, "mode": "container", **over}, "r.yaml")[0]


def test_an_image_that_cannot_be_had_is_one_error_with_the_fix_dockers_words_name():
    runner = Docker()
    report = doctor.run_checks(recipe(image=IMAGE), only=["docker", "model-config", "flags", "versions"], runner=runner)
    about = [f for f in report.findings if IMAGE in f.message]
    (err,) = [f for f in about if f.level == doctor.ERROR]
    assert err.check == "docker" and err.message.startswith(f"image {IMAGE} cannot be had here: `docker pull -- "
                                                            f"{IMAGE}` exited with 1:")
    assert PULL_SAYS.strip() in err.message.splitlines()
    assert "registry host does not resolve" in err.fix
    skips = {f.check: f for f in about if f.needs}
    assert set(skips) == {"model-config", "flags", "versions"}
    assert all(f.needs == "docker" and f.level == doctor.WARNING and not f.fix and "the docker error "
                                                                                   "above" in f.message for f
               in skips.values())
    assert sum(argv[1] == "pull" for argv in runner.history) == 1  # pulled once, for every check
    table = report.table()
    assert table.count("fix:") == len([f for f in report.findings if f.fix]) and "skip" in table


def test_without_the_docker_check_the_first_check_needing_the_image_holds_the_error():
    report = doctor.run_checks(recipe(image=IMAGE), only=["flags", "versions"], runner=Docker())
    assert [(f.check, f.level) for f in report.findings] == [("flags", doctor.ERROR), ("versions", doctor.WARNING)]
    assert report.findings[1].needs == "flags"


def test_an_engine_that_does_not_answer_is_the_one_cause():
    class Down(Runner):
        def run(self, argv, **kw):  # type: ignore[override]
            raise CommandError("docker version", [str(a) for a in argv], 1,
                               "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker "
                               "daemon running?\n")

    report = doctor.run_checks(recipe(image=IMAGE), only=["docker", "flags", "versions"], runner=Down())
    assert [f.check for f in report.errors] == ["docker"] and "start Docker Engine" in report.errors[0].fix
    assert [f.needs for f in report.findings if f.check != "docker"] == ["docker", "docker"]


def test_a_check_that_needs_an_image_says_so_and_points_at_image():
    # Before: "cannot read MODEL_ARGS of /root/slime/scripts/models/qwen2.5-3B.sh; fix: check slime_dir and model_type".
    report = doctor.run_checks(recipe(), only=["docker", "model-config", "flags"], runner=Docker(),
                               build_root=Path("/nonexistent"))
    by = {(f.check, bool(f.needs)): f for f in report.findings}
    script = by[("model-config", True)]
    assert script.needs == "--image" and "is read in the image, and no image is given" in script.message
    assert "--image IMAGE" in script.fix and "slime_dir" not in script.fix
    assert by[("docker", True)].needs == "--image" and "--image IMAGE" in by[("docker", True)].fix
    flags = by[("flags", False)]
    assert flags.level == doctor.ERROR and flags.fix.startswith("give --image IMAGE")


def test_host_mode_without_the_script_still_blames_slime_dir(tmp_path):
    r = recipe(mode="host", slime_dir=str(tmp_path / "slime"), install_prefix=None)
    (f,) = [f for f in doctor.run_checks(r, only=["model-config"]).findings if "MODEL_ARGS" in f.message]
    assert f.level == doctor.ERROR and "slime_dir and model_type" in f.fix


def test_one_missing_credential_is_one_error(tmp_path, monkeypatch):
    # Before: aws-credentials, then s3 "bucket not checked: no AWS credentials; fix: see aws-credentials".
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.setenv(name, str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    report = doctor.run_checks(recipe(), only=["aws-credentials", "s3", "agentcore"])
    assert [f.check for f in report.errors] == ["aws-credentials"]
    assert {f.check: f.needs for f in report.findings if f.needs} == {"s3": "aws-credentials",
                                                                      "agentcore": "aws-credentials"}


def test_remote_text_is_cut_between_lines_and_printable():
    said = ("docker pull: command exited with 1: docker pull -- x\n--- last lines ---\nError response from daemon: "
           "\x1b[31mno such host\n")
    cut = excerpt(said, 90)
    assert cut == "docker pull: command exited with 1: docker pull -- x; --- last lines ---; ..."
    assert "\x1b" not in excerpt(said) and "?[31mno such host" in excerpt(said)
    assert excerpt("x" * 500, 40) == "x" * 37 + "..."


def test_the_layout_note_of_an_image_that_cannot_be_had_has_no_cut_line(monkeypatch):
    import slimeforge.run.imageprobe as imageprobe

    long = "Error response from daemon: " + ("Get https://registry.invalid/v2/: lookup registry.invalid: no such "
                                            "host ") * 5

    def fail(image, *a, **kw):
        raise CommandError(f"docker pull {image}", ["docker", "pull", "--", image], 1,
                           "Unable to find image locally\n" + long + "\n")

    monkeypatch.setattr(imageprobe, "image_facts", fail)
    _, _, note = layout_of_image(recipe(image=IMAGE), pull=True)
    assert note == (f"the image's layout is not known (docker pull {IMAGE}: Unable to find image locally; ...): "
                   "rendered for slimeforge's layout")
