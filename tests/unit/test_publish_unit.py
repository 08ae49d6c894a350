"""Publishing without services: references, option validation, build lookup, dry run, progress."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slimeforge.errors import ConfigError
from slimeforge.image.imageref import ImageRef, image_ref_problems, parse_image_ref
from slimeforge.image.publish.publish import PublishOptions, find_build_dir, plan, read_credentials
from slimeforge.image.publish.push import LayerProgress, push_failure
from slimeforge.image.remote import ecr
from slimeforge.image.remote.registry import RegistryAuthError, TransientError

ROOT = Path(__file__).resolve().parents[2]
D = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("text", "expected"), [
    ("ubuntu", ImageRef("docker.io", "library/ubuntu")),
    ("team/slime:1.0", ImageRef("docker.io", "team/slime", "1.0")),
    ("127.0.0.1:5000/team/slime:2026.11.1-cu13", ImageRef("127.0.0.1:5000", "team/slime", "2026.11.1-cu13")),
    ("localhost/slime@" + D, ImageRef("localhost", "slime", None, D)),
    ("reg.example.com/a/b_c.d:t@" + D, ImageRef("reg.example.com", "a/b_c.d", "t", D)),
])
def test_parse_image_ref(text, expected):
    ref = parse_image_ref(text)
    assert ref == expected
    assert ref.pinned is (expected.digest is not None)
    assert parse_image_ref(str(ref)) == ref  # the canonical form parses back to itself


@pytest.mark.parametrize(("text", "says"), [
    ("team/Slime", "must be lowercase"),
    ("reg.io/slime:bad tag", "tag 'bad tag'"),
    ("reg.io/slime@sha256:1234", "not sha256:<64"),
    ("reg.io/", "no repository"),
    ("", "must be an image reference"),
])
def test_invalid_image_refs_say_why(text, says):
    with pytest.raises(ConfigError) as err:
        parse_image_ref(text, where="recipe.image")
    assert "recipe.image" in str(err.value) and says in str(err.value)


def test_require_digest_names_the_fix():
    [problem] = image_ref_problems("reg.io/team/slime:2026.11.1-cu13", "image", require_digest=True)
    assert "pinned by digest" in problem.message and "reg.io/team/slime@sha256:" in problem.accepted


def write_build(root: Path, name: str, image_id: str = D, **report) -> Path:
    d = root / name
    d.mkdir(parents=True)
    report = {"tag": f"slimeforge/cu13:{name[-12:]}", "human_tags": ["slimeforge/cu13:2026.11.1-cu13"],
              "image_id": image_id, "digest": None, **report}
    (d / "report.json").write_text(json.dumps(report))
    (d / "stack.lock.json").write_text(json.dumps({"stack": "cu13", "digest": None}))
    return d


def test_newest_build_of_the_flavor_is_chosen(tmp_path):
    old = write_build(tmp_path, "cu13-aaaaaaaaaaaa")
    new = write_build(tmp_path, "cu13-bbbbbbbbbbbb")
    write_build(tmp_path, "cu129-cccccccccccc")
    os.utime(old / "report.json", (time.time() - 60, time.time() - 60))
    assert find_build_dir("cu13", tmp_path) == new
    assert find_build_dir("cu13", old) == old  # a build directory itself
    p = plan(PublishOptions(cuda="cu13", build_dir=str(tmp_path), registry="reg.example.com:5000"))
    assert (p.registry, p.repository, p.source.tags) == ("reg.example.com:5000", "slimeforge/cu13", ["bbbbbbbbbbbb",
                                                                                                     "2026.11.1-cu13"])
    assert find_build_dir("cu12", tmp_path) is None


def test_all_option_problems_are_reported_together(tmp_path):
    write_build(tmp_path, "cu13-aaaaaaaaaaaa", human_tags="not-a-list")
    opts = PublishOptions(cuda="cu13", build_dir=str(tmp_path), registry="https://reg.example.com", username="bob",
                          password_env="SF_UNSET_PASSWORD", record="x.json", ecr_endpoint="http://127.0.0.1:1")
    with pytest.raises(ConfigError) as err:
        plan(opts, environ={})
    wheres = [p.where for p in err.value.problems]
    assert wheres[:4] == ["--record", "--registry", "--ecr-endpoint", "--password-env"]
    assert any("report.json" in w for w in wheres) and "human_tags" in str(err.value)


def test_missing_build_says_what_to_run(tmp_path):
    with pytest.raises(ConfigError) as err:
        plan(PublishOptions(cuda="cu13", build_dir=str(tmp_path), registry="reg.example.com/x"))
    assert "run invoke build --cuda cu13 first" in str(err.value)


def test_ecr_options_and_credentials(tmp_path):
    host = "123456789012.dkr.ecr.eu-west-1.amazonaws.com"
    assert ecr.parse_ecr_host(host) == ecr.EcrRegistry(host, "123456789012", "eu-west-1")
    assert ecr.parse_ecr_host("reg.example.com") is None
    with pytest.raises(ConfigError) as err:
        plan(PublishOptions(image="a/b:c", registry=f"{host}/slime", username="bob", password_stdin=True))
    assert "does not apply to ECR" in str(err.value)
    p = plan(PublishOptions(image="a/b:c", registry="reg.example.com/slime", username="bob", password_env="PW"),
             environ={"PW": "s3cret"})
    creds = read_credentials(p, io.StringIO(""), {"PW": "s3cret"})
    assert (creds.username, creds.password) == ("bob", "s3cret") and "s3cret" not in repr(creds)
    p = plan(PublishOptions(image="a/b:c", registry="reg.example.com/slime", username="bob", password_stdin=True))
    assert read_credentials(p, io.StringIO("from-stdin\n")).password == "from-stdin"


def test_immutability_rules():
    assert ecr.tag_is_immutable({"imageTagMutability": "IMMUTABLE"}, "v1")
    assert not ecr.tag_is_immutable({"imageTagMutability": "MUTABLE"}, "v1")
    excl = {"imageTagMutability": "IMMUTABLE_WITH_EXCLUSION",
            "imageTagMutabilityExclusionFilters": [{"filter": "latest*"}]}
    assert ecr.tag_is_immutable(excl, "abc123") and not ecr.tag_is_immutable(excl, "latest-cu13")


def test_engine_push_errors_are_sorted():
    ref = ImageRef("reg.example.com", "team/slime", "t")
    auth = push_failure(ref, "unauthorized: authentication required", None)
    assert isinstance(auth,
                      RegistryAuthError) and "reg.example.com" in str(auth) and ("docker login "
                                                                                "reg.example.com") in str(auth)
    assert isinstance(push_failure(ref, 'Put "https://reg/v2/x/blobs": read: connection reset by peer', None),
                      TransientError)
    assert not isinstance(push_failure(ref, "manifest invalid", None), TransientError | RegistryAuthError)


def test_layer_progress_is_compact():
    lines = []
    progress = LayerProgress(lines.append)
    events = [{"status": "Preparing", "id": "a1"}, {"status": "Layer already exists", "id": "b2"}]
    events += [{"status": "Pushing", "id": "a1", "progressDetail": {"current": c,
                                                                    "total": 4_000_000}} for c in range(0, 4_000_001,
                                                                                                        500_000)]
    events += [{"status": "Pushed", "id": "a1"}, {"status": "t: digest: " + D + " size: 528"}]
    for e in events:
        progress.update(e)
    assert lines == ["  b2  layer already exists", "  a1  pushing  25% of 4.0 MB", "  a1  pushing  50% of 4.0 MB",
                     "  a1  pushing  75% of 4.0 MB", "  a1  pushed"]


def test_dry_run_prints_the_plan_and_pushes_nothing(tmp_path):
    build = write_build(tmp_path, "cu13-aaaaaaaaaaaa")
    argv = [sys.executable, "-m", "invoke", "publish", "--dry-run", "--cuda", "cu13", "--build-dir", str(tmp_path),
            "--registry", "123456789012.dkr.ecr.us-east-1.amazonaws.com/team/slime", "--no-scan-on-push"]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert ("to 123456789012.dkr.ecr.us-east-1.amazonaws.com/team/slime as tags: aaaaaaaaaaaa, "
           "2026.11.1-cu13") in out.stdout
    assert "tags immutable, scan on push off" in out.stdout
    # The build's image is not here: the dry run refuses as the publish would, at once (issue 42.9);
    # without an engine, it says that instead. Either way exit 2 and nothing pushed or recorded.
    assert out.returncode == 2, out.stderr
    assert ("slimeforge/cu13:aaaaaaaaaaaa: no such local image; run invoke build --cuda cu13 first" in out.stderr
            or "docker engine" in out.stderr), out.stderr
    assert "nothing was pushed (dry run)" not in out.stdout and not (build / "publish.json").exists()


@pytest.mark.parametrize(("text", "ok"), [
    ("slimeforge/cu13", True), ("localhost:5000/team/slime", True), ("reg.example.com/a/b-c_d.e", True),
    ("team/Slime", False), ("slimeforge/cu13:1.0", False), (f"slimeforge/cu13@{D}", False), ("-v/:/x", False), ("a//b",
                                                                                                                False),
])
def test_build_repository_is_read_by_the_one_reference_grammar(text, ok):
    """`invoke build --repository` once had a pattern of its own; it is the reference grammar without a tag or
    digest."""
    from slimeforge.image.imageref import repository_problems

    assert (repository_problems(text) == []) == ok
