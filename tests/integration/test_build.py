"""`invoke build` of the small test stack with the real Docker Engine (BuildKit), real PyPI and
real git sources: labels and lock, a no-op second build, a new slime commit rebuilding only the
last layers, a broken patch and a failing smoke check failing the build."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import build_support as bs
import pytest

from slimeforge.errors import ConfigError
from slimeforge.image.builder.build import HASH_LABEL, BuildError, BuildOptions, build, docker_cli
from slimeforge.image.builder.buildreport import BuildReport

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
REPO = f"slimeforge-build-test/sftest-{os.getpid()}"


def built(o: BuildOptions) -> dict:
    """A real build's report as report.json holds it (what these tests read)."""
    report = build(o)
    assert isinstance(report, BuildReport), report
    return report.to_json()


@pytest.fixture(scope="module")
def env(base_image, tmp_path_factory):
    root = tmp_path_factory.mktemp("build")
    repos = bs.make_repos(root / "repos")
    made: list[str] = []
    yield {"root": root, "repos": repos, "made": made}
    # Only this session's tags: an image shared with other tags (same content hash) stays for them.
    bs.remove_tags(f"{REPO}:")


def opts(env, stack=bs.TEST_STACK, **kw) -> BuildOptions:
    r = env["repos"]
    return BuildOptions(stack=str(stack), sources=[f"slime={r['slime']}", f"libdemo={r['libdemo']}"],
                        build_root=env["root"] / "out",
                        repository=REPO, **{"echo": lambda s: None, **kw})


def run_build(env, **kw) -> dict:
    report = built(opts(env, **kw))
    env["made"].append(report["image_id"])
    return report


@pytest.fixture(scope="module")
def first(env):
    # --no-cache: an image of this content may exist from an earlier session (it would be a skip), or
    # BuildKit's cache of its steps (the last one, with the smoke test, would not run).
    said: list[str] = []
    report = run_build(env, no_cache=True, echo=said.append)
    return {**report, "said": said}


def inspect(ref: str) -> dict:
    return json.loads(subprocess.run(["docker", "image", "inspect", ref], capture_output=True, text=True,
                                     check=True).stdout)[0]


def test_build_labels_lock_flags(first, env):
    d = Path(first["dir"])
    assert first["skipped"] is False and first["digest"] is None
    assert first["tag"] == f"{REPO}:{first['build_hash'][:16]}"
    assert first["human_tags"] == [f"{REPO}:0.0.1-sftest"]
    img = inspect(first["tag"])
    assert img["Id"] == first["image_id"] and inspect(first["human_tags"][0])["Id"] == first["image_id"]
    labels = img["Config"]["Labels"]
    assert labels["ai.slimeforge.build-hash"] == first["build_hash"]
    assert labels["ai.slimeforge.pin.source.slime"] == bs.SLIME_S1
    assert labels["ai.slimeforge.pin.pip.six"] == "1.17.0"
    from slimeforge.image.lock.lockfile import read_lock

    assert labels["ai.slimeforge.lock"] == f"sha256:{read_lock(bs.TEST_LOCK).hash}"
    # Each step kept its slice of the lock in the image, by URL and sha256.
    six_slice = subprocess.run(["docker", "run", "--rm", first["tag"], "cat", "/opt/slimeforge/lock/six.txt"],
                               capture_output=True,
                               text=True, check=True).stdout
    assert six_slice.splitlines()[1].startswith("six @ "
                                                "https://files.pythonhosted.org/") and "--hash=sha256:" in six_slice
    assert labels["org.opencontainers.image.revision"] == bs.SLIME_S1
    base_id = inspect("slimeforge-test/base:bookworm")["Id"]
    assert labels["ai.slimeforge.base-digest"] == base_id  # imported base: no RepoDigests, the id is recorded
    patch_sha = {p["file"]: p["sha256"] for p in json.loads((d / "stack.lock.json").read_text())["patches"]}
    assert labels["ai.slimeforge.patch.libdemo.patch"] == f"sha256:{patch_sha['libdemo.patch']}"

    lock = json.loads((d / "stack.lock.json").read_text())
    assert (lock["installed"]["six"] == "1.17.0" and lock["installed"]["idna"] == "3.10"
            and lock["installed"]["uv"] == "0.9.7")
    assert lock["checkouts"] == {"libdemo": bs.LIBDEMO_COMMIT, "slime": bs.SLIME_S1}
    assert {p["file"]: p["status"] for p in lock["patches_applied"]} == {"six.patch": "applied",
                                                                         "libdemo.patch": "applied"}
    assert all(p["sha256"] == patch_sha[p["file"]] for p in lock["patches_applied"])
    assert lock["base"]["image_id"] == base_id

    flags = json.loads((d / "flags.json").read_text())
    assert (flags["slime_commit"] == bs.SLIME_S1 and "--num-rollout" in flags["flags"]
            and flags["flags"] == sorted(flags["flags"]))
    # From slime's parsers, not --help: the SGLang parser's options are there, each with its parser.
    assert flags["version"] == 2 and [p["add_help"] for p in flags["parsers"]] == [False, False, True]
    assert {"--sglang-mem-fraction-static", "--router-policy", "--debug-train-only"} <= set(flags["flags"])
    assert first["flags"] == str(d / "flags.json")

    in_image = subprocess.run(["docker", "run", "--rm", first["tag"], "cat", "/opt/slimeforge/flags.json"],
                              capture_output=True, text=True)
    assert json.loads(in_image.stdout) == flags
    # The user's checkout was only read.
    assert subprocess.run(["git", "-C", str(env["repos"]["slime"]), "status", "--porcelain"], capture_output=True,
                          text=True).stdout == ""
    report = json.loads((d / "report.json").read_text())
    assert {s["name"] for s in report["steps"]} >= {"venv", "build-tools", "six", "libdemo", "idna", "slime",
                                                    "finalize"}


def test_the_smoke_test_runs_in_the_last_step_and_the_image_keeps_its_bytecode(first):
    """The smoke test ran beside finalize in the image's last step (its lines printed by the build),
    and the modules the flag catalog and the smoke test imported are in the image as bytecode."""
    said = first["said"]
    at = said.index("smoke test: run in the image's last step, beside finalize:")
    assert ("  smoke: import six "
           "ok") in said[at:] and any(line.startswith("  smoke test passed") for line in said[at:]), said
    pyc = subprocess.run(["docker", "run", "--rm", first["tag"], "sh", "-c",
                          "find /root/slime /opt/venv/lib/python3*/site-packages/__pycache__ -name '*.pyc'"],
                         capture_output=True, text=True).stdout.split()
    assert any(p.startswith("/root/slime/slime/") for p in pyc), pyc  # slime's parsers, imported by the flag catalog
    assert any("/site-packages/__pycache__/six." in p for p in pyc), pyc  # six, imported by the smoke test


def test_report_names_the_largest_directories_of_the_venv(first):
    """The image's last RUN measures the venv; the report holds its 10 largest directories, and
    each is a directory of the image at least that large (du counts its directories too)."""
    sizes = first["venv_sizes"]
    assert (sizes["venv"] == "/opt/venv"
            and sizes == json.loads((Path(first["dir"]) / "report.json").read_text())["venv_sizes"])
    largest = [(r["path"], r["bytes"]) for r in sizes["largest"]]
    assert 3 <= len(largest) <= 10 and [b for _, b in largest] == sorted((b for _, b in largest), reverse=True)
    assert sum(b for _, b in largest) <= sizes["bytes"]
    assert any(p.endswith("site-packages/setuptools") for p, _ in largest)  # the build-tools step's largest
    # Files there twice were looked for (the test stack's venv and base have none of 1 MiB twice).
    assert sizes["duplicates_bytes"] == sum(d["bytes"] * (d["copies"] - 1) for d in sizes["duplicates"])
    script = 'for p; do printf "%s\\n" "$(du -sb "/opt/venv/$p" | cut -f1)"; done'
    out = subprocess.run(["docker", "run", "--rm", first["tag"], "sh", "-c", script, "_", *[p for p, _ in largest]],
                         capture_output=True, text=True, check=True).stdout.split()
    assert len(out) == len(largest) and all(int(du) >= b > 0 for du, (_, b) in zip(out, largest, strict=True))


def test_second_build_is_a_skip(first, env):
    said: list[str] = []
    again = built(opts(env, echo=said.append))
    assert again["skipped"] is True
    assert again["image_id"] == first["image_id"] and again["build_hash"] == first["build_hash"]
    assert not any(line.startswith("smoke test") for line in said)  # passed when it was built: not run again
    # --verify smoke-tests the image that exists again, and builds nothing.
    said.clear()
    verified = built(opts(env, echo=said.append, verify=True))
    assert verified["skipped"] is True and verified["image_id"] == first["image_id"]
    assert "smoke test (--verify) ..." in said and any("smoke test passed" in line for line in said), said
    # --verify makes the flag catalog again and compares; the smoke test right after a build does not (finalize just
    # made it).
    assert any("flag catalog /opt/slimeforge/flags.json matches slime's parsers" in line for line in said), said


def test_new_slime_commit_rebuilds_only_the_last_layers(first, env):
    fresh = env["repos"]["fresh"]
    stack = bs.derived_stack(env["root"] / "fresh.yaml", fresh)
    report = run_build(env, stack=stack)
    assert report["build_hash"] != first["build_hash"]
    cached = {s["name"]: s["cached"] for s in report["steps"] if s["name"] not in ("copy", "from")}
    # slime's checkout is the last step (its requirements, and the patches, stay cached before it).
    assert cached == {"venv": True, "build-tools": True, "six": True, "libdemo": True, "idna": True,
                      "slime-requirements": True,
                      "patches": True, "slime": False, "finalize": False}
    assert [s["name"] for s in report["steps"] if s["name"] not in ("copy", "from")][-3:] == ["patches", "slime",
                                                                                              "finalize"]
    # What a node pulls for it: every layer before slime's is the very same layer (same diff_id).
    before, after = inspect(first["image_id"])["RootFS"]["Layers"], inspect(report["image_id"])["RootFS"]["Layers"]
    assert len(before) == len(after) and before != after
    slime_at = next(i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b)
    # At most the slime RUN, the three COPYs after it and finalize's RUN differ.
    assert before[:slime_at] == after[:slime_at] and slime_at >= len(before) - 5, (slime_at, len(before))
    lock = json.loads((Path(report["dir"]) / "stack.lock.json").read_text())
    assert lock["checkouts"]["slime"] == fresh and lock["checkouts"]["libdemo"] == bs.LIBDEMO_COMMIT


def test_broken_patch_fails_the_build_naming_it(first, env):
    stack = bs.derived_stack(env["root"] / "s3.yaml", bs.SLIME_S3)
    with pytest.raises(BuildError) as exc:
        build(opts(env, stack=stack))
    assert "patch libdemo.patch does not apply" in str(exc.value) and "libdemo/__init__.py" in str(exc.value)


def test_failing_smoke_check_fails_the_build(first, env):
    stack = bs.derived_stack(env["root"] / "smoke.yaml", bs.SLIME_S1, smoke="{imports: [six, no_such_module_xyz]}")
    with pytest.raises(BuildError) as exc:
        build(opts(env, stack=stack))
    text = str(exc.value)
    assert ("import no_such_module_xyz "
           "failed") in text and "the smoke test failed" in text and "finalize failed" not in text
    # The smoke test runs in the image's last step: no image of this build exists, and building again fails again.
    build_hash = build(opts(env, stack=stack, dry_run=True)).build_hash
    assert subprocess.run(["docker", "images", "-aq", "--filter", f"label={HASH_LABEL}={build_hash}"],
                          capture_output=True, text=True,
                          check=True).stdout.strip() == ""
    with pytest.raises(BuildError, match="import no_such_module_xyz failed"):
        build(opts(env, stack=stack))


def test_bad_sources_are_refused_before_anything_runs(env, tmp_path):
    o = opts(env, out=tmp_path / "never")
    o.sources = ["nosuch=/tmp", f"slime={tmp_path}", "libdemo"]
    with pytest.raises(ConfigError) as exc:
        build(o)
    text = str(exc.value)
    assert ("--source nosuch: is neither a source nor a pip step of this "
           "stack") in text and "--source slime: is not a git checkout" in text
    assert "must be NAME=PATH" in text
    assert not (tmp_path / "never").exists()
    stack = bs.derived_stack(tmp_path / "other.yaml", "2" * 40)
    o2 = opts(env, stack=stack)
    with pytest.raises(ConfigError, match=r"has no commit 2222222222222222222222222222222222222222"):
        build(o2)


def test_cli_dry_run_prints_the_command(env, tmp_path):
    r = env["repos"]
    res = subprocess.run([sys.executable, "-m", "invoke", "build", "--stack", str(bs.TEST_STACK), "--dry-run", "--out",
                          str(tmp_path / "b"),
                          "--source", f"slime={r['slime']}", "--source", f"libdemo={r['libdemo']}", "--repository",
                          REPO],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    # stdout is the result alone: the command as shell, one option a line, ending with the context; progress went to
    # stderr.
    assert res.stdout.startswith("would run:\n  DOCKER_BUILDKIT=1 ") and "\n      --progress=plain \\\n" in res.stdout
    words = shlex.split(res.stdout.removeprefix("would run:\n").replace("\\\n", ""))
    assert words[:3] == ["DOCKER_BUILDKIT=1", docker_cli(), "build"] and words[-1] == str(tmp_path / "b" / "context")
    assert "build of " in res.stderr and "build of " not in res.stdout
    assert (tmp_path / "b" / "Dockerfile").is_file() and (tmp_path / "b" / "context" / "sources" / "slime.git").is_dir()
    assert not (tmp_path / "b" / "report.json").exists()


def test_wheel_directory_source_installs_without_the_index(first, env, tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "six==1.17.0",
                    "-d", str(wheels)],
                   check=True, capture_output=True)
    o = opts(env)
    o.sources.append(f"six={wheels}")
    report = built(o)
    env["made"].append(report["image_id"])
    dockerfile = (Path(report["dir"]) / "Dockerfile").read_text()
    assert "--find-links /tmp/sf-wheels/six" in dockerfile
    assert (Path(report["dir"]) / "context" / "lock" / "six.txt").read_text().splitlines()[1].startswith("six==1.17.0 "
                                                                                                         "--hash=sha256:")
    lock = json.loads((Path(report["dir"]) / "stack.lock.json").read_text())
    assert set(lock["wheel_dirs"]) == {"six"} and lock["installed"]["six"] == "1.17.0"
    assert report["build_hash"] != first["build_hash"]
    # A directory without wheels is refused up front.
    o2 = opts(env)
    o2.sources.append(f"six={tmp_path}")
    with pytest.raises(ConfigError, match=r"--source six: is not a directory of wheels"):
        build(o2)
