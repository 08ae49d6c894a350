"""`invoke lock` with the real uv against a real PEP 503 index on loopback (wheels built by the
test), then installs from the lock with the real step library (templates/steps.sh) into a real
venv: an exact pre-release pinned by a dependency, two CUDA-major variants on two indexes, a yanked
file, a replaced file, a package outside the lock, a pin a later step tries to move."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import absent
from lock_support import Index, push_tiny_image, router_stack, write_stack

from slimeforge import paths
from slimeforge.image.builder.build import BuildOptions, prepare
from slimeforge.image.lock import lockcheck, lockfile, uvlock
from slimeforge.image.lock.remedies import remedy
from slimeforge.image.stack import load_stack
from slimeforge.image.steps import lock_file, lock_files

UV = str(Path(sys.executable).parent / "uv")
DIGEST = "sha256:" + "ab" * 32
# Package indexes served here and uv: no outside service (the registry tests add docker).
pytestmark = pytest.mark.local


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    """The main index (PyPI's role) and a CUDA 12 one (download.pytorch.org/whl/cu129's role)."""
    root = tmp_path_factory.mktemp("index")
    main = Index(root / "main", yanked={"sf_base-1.1-py3-none-any.whl"})
    main.add("sf-base", "1.0")
    main.add("sf-base", "1.1")  # yanked: never chosen for a range
    main.add("sf-base", "1.2")
    main.add("sf-dep", "1.0")
    main.add("sf-dep", "2.0b1")  # pinned exactly by sf-app: this pre-release, and no other, is allowed
    main.add("sf-extra", "2.0")
    main.add("sf-extra", "3.0b1")  # a pre-release nobody pins: must not be chosen
    main.add("sf-kern-cu13", "1.0")
    main.add("sf-kern", "1.0", ["sf-kern-cu13==1.0"])
    main.add("sf-app", "1.0", ["sf-base>=1.0", "sf-dep==2.0b1", "sf-extra", "sf-kern"])
    main.add("sf-rogue", "1.0")
    main.add("uv", "0.9.7")  # the stack's pinned uv: the lock records its wheel (the venv step's slice)
    cu12 = Index(root / "cu12")
    cu12.add("sf-kern-cu12", "1.0")
    cu12.add("sf-kern", "1.0+cu129", ["sf-kern-cu12==1.0"])
    main.start()
    cu12.start()
    yield {"main": main, "cu12": cu12}
    main.stop()
    cu12.stop()


@pytest.fixture(autouse=True)
def uv_cache(tmp_path, monkeypatch):
    # A cache of our own: another test's (or the user's) cached files must not stand in for the index's.
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))


def do_lock(path: Path, index: Index, lines: list[str] | None = None,
            base_digest: str | None = DIGEST) -> lockfile.LockFile:
    uvlock.resolve(uvlock.LockOptions(stack=str(path), index_url=index.url, base_digest=base_digest,
                            echo=(lines.append if lines is not None else lambda _: None)))
    return lockfile.load_lock(str(path))


def steps_sh(state: Path, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"source {paths.STEP_LIBRARY}\n{script}"], capture_output=True, text=True,
                          env={**os.environ, "SF_STATE": str(state)}, timeout=300)


def make_venv(path: Path) -> Path:
    subprocess.run([UV, "venv", "-q", "--python", sys.executable, str(path)], check=True)
    os.symlink(UV, path / "bin" / "uv")  # the step library runs <venv>/bin/uv
    return path


def install_all(stack_path: Path, lock: lockfile.LockFile, work: Path) -> tuple[Path, Path,
                                                                                subprocess.CompletedProcess]:
    """Every step's slice through sf_pip_step, then finalize's comparison with the whole lock."""
    stack = load_stack(str(stack_path))
    venv, state, slices = make_venv(work / "venv"), work / "state", work / "slices"
    slices.mkdir(parents=True)
    from slimeforge.image.steps import StepLayout

    for name, text in lock_files(stack, lock, StepLayout("/r", str(venv), "/p", str(state),
                                                         lock_dir=str(slices))).items():
        (slices / name).write_text(text)
    script = "\n".join(f"sf_pip_step --venv {venv} --step {s} --lock {slices / lock_file(s)}" for s in lock.steps)
    script += (f"\nmkdir -p {state}/lock && cp {slices}/all.txt {state}/lock/_all.txt && sf_lock_verify {venv} "
              "finalize --exact")
    return venv, state, steps_sh(state, script)


def installed(venv: Path) -> dict[str, str]:
    out = subprocess.run([UV, "pip", "list", "--python", str(venv / "bin" / "python"), "--format", "freeze"],
                         capture_output=True,
                         text=True, check=True).stdout
    return dict(line.split("==") for line in out.split())


def test_lock_resolves_for_the_target_with_exactly_the_pinned_prerelease(indexes, tmp_path):
    lines: list[str] = []
    lock = do_lock(write_stack(tmp_path), indexes["main"], lines)
    versions = {n: p.version for n, p in lock.packages.items()}
    assert versions == {"sf-app": "1.0", "sf-base": "1.0", "sf-dep": "2.0b1", "sf-extra": "2.0", "sf-kern": "1.0",
                        "sf-kern-cu13": "1.0"}
    assert lock.tool["prereleases"] == ["sf-dep==2.0b1"]
    assert any("allowing the exact pre-release sf-dep==2.0b1" in line for line in lines)
    assert any(line.startswith("[1/3] resolving") for line in lines)  # progress on screen
    # One file per distribution, by URL and sha256, and every package in exactly one step's slice.
    assert lock.steps == {"base": ["sf-base"], "app": ["sf-app", "sf-dep", "sf-extra", "sf-kern", "sf-kern-cu13"]}
    assert (all(p.url.startswith(indexes["main"].url.removesuffix("/simple")) and len(p.sha256) == 64 for p
                in lock.packages.values()))
    assert lock.tool["base"]["digest"] == DIGEST and lock.tool["platform"] == "x86_64-manylinux_2_36"
    # The venv step's one input, the stack's uv, as the index serves it: by URL and sha256.
    uv_file = indexes["main"].root / "files" / "uv-0.9.7-py3-none-any.whl"
    assert lock.tool["uv-wheel"] == {"url": f"{indexes['main'].url.removesuffix('/simple')}/files/{uv_file.name}",
                                     "sha256": hashlib.sha256(uv_file.read_bytes()).hexdigest()}
    assert lockcheck.check_lock(load_stack(str(tmp_path / "sflock.yaml")), lock) == []
    # The file is a PEP 751 lock uv itself reads; locking again changes nothing (same tag).
    text = lock.path.read_text()
    do_lock(tmp_path / "sflock.yaml", indexes["main"])
    assert lock.path.read_text() == text


def test_yanked_file_is_not_chosen_for_a_range(indexes, tmp_path):
    path = write_stack(tmp_path)
    path.write_text(path.read_text().replace('sf-base: "1.0"', 'sf-base: ">=1.0,<1.2"'))
    lock = do_lock(path, indexes["main"])
    assert lock.packages["sf-base"].version == "1.0"  # 1.1 is yanked


def test_install_from_the_lock_verifies_hashes_and_holds_every_pin(indexes, tmp_path):
    path = write_stack(tmp_path)
    lock = do_lock(path, indexes["main"])
    venv, state, res = install_all(path, lock, tmp_path / "i")
    assert res.returncode == 0, res.stderr
    assert "step finalize: 6 distribution(s) installed, all as locked" in res.stderr
    assert installed(venv) == {"sf-app": "1.0", "sf-base": "1.0", "sf-dep": "2.0b1", "sf-extra": "2.0",
                               "sf-kern": "1.0", "sf-kern-cu13": "1.0"}
    # A later step that moves an earlier step's package (sf-base 1.0 -> 1.2), or brings in a package
    # outside the lock, fails naming the package and the step.
    subprocess.run([UV, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "--index-url",
                    indexes["main"].url,
                    "sf-base==1.2", "sf-rogue==1.0"], check=True)
    res = steps_sh(state, f"sf_lock_verify {venv} app")
    assert res.returncode == 1
    assert "slimeforge: ERROR: step app: sf-base is 1.2, the lock says 1.0" in res.stderr
    assert "slimeforge: ERROR: step app: sf-rogue 1.0 is not in the lock" in res.stderr


def test_a_replaced_file_on_the_index_is_refused_naming_package_and_step(indexes, tmp_path):
    path = write_stack(tmp_path)
    lock = do_lock(path, indexes["main"])
    wheel = indexes["main"].root / "files" / "sf_extra-2.0-py3-none-any.whl"
    good = wheel.read_bytes()
    try:
        indexes["main"].add("sf-extra", "2.0", payload="EVIL = True\n")  # same name and URL, other bytes
        assert wheel.read_bytes() != good
        _, _, res = install_all(path, lock, tmp_path / "i")
    finally:
        wheel.write_bytes(good)
        indexes["main"].write_pages()
    assert res.returncode == 1
    assert "Hash mismatch" in res.stderr
    assert ("slimeforge: ERROR: step app: sf-extra differs from its sha256 in the lock (a changed or corrupted file): "
           "refused") in res.stderr
    assert "step base: 1 distribution(s) installed, all as locked" in res.stderr  # the step before it went through


def test_a_missing_package_fails_finalize(indexes, tmp_path):
    path = write_stack(tmp_path)
    lock = do_lock(path, indexes["main"])
    venv, state, res = install_all(path, lock, tmp_path / "i")
    assert res.returncode == 0, res.stderr
    subprocess.run([UV, "pip", "uninstall", "-q", "--python", str(venv / "bin" / "python"), "sf-extra"], check=True)
    res = steps_sh(state, f"sf_lock_verify {venv} finalize --exact")
    assert res.returncode == 1 and "step finalize: sf-extra 2.0 is in the lock but not installed" in res.stderr


def test_cuda12_flavor_takes_its_kernels_from_its_index_and_mixing_is_detected(indexes, tmp_path):
    # With its CUDA 12 index first (as cu129 has download.pytorch.org/whl/cu129), the kernel and its
    # runtime are the CUDA 12 builds.
    good_path = write_stack(tmp_path / "good", "sfcu12", "12.9", indexes["cu12"].url)
    lock = do_lock(good_path, indexes["main"])
    assert (lock.packages["sf-kern"].version == "1.0+cu129" and "sf-kern-cu12" in lock.packages
            and "sf-kern-cu13" not in lock.packages)
    assert lockcheck.check_lock(load_stack(str(good_path)), lock) == []
    # Without it, the main index's CUDA 13 kernel comes in: `lock --check` names it.
    bad_path = write_stack(tmp_path / "bad", "sfcu12", "12.9")
    bad = do_lock(bad_path, indexes["main"])
    problems = lockcheck.check_lock(load_stack(str(bad_path)), bad)
    assert "CUDA mix: sf-kern-cu13 1.0 is built for CUDA 13, the flavor is CUDA 12.9" in problems


def test_check_names_a_stale_lock_and_an_unsatisfied_pin(indexes, tmp_path):
    path = write_stack(tmp_path)
    lock = do_lock(path, indexes["main"])
    path.write_text(path.read_text().replace('sf-base: "1.0"', 'sf-base: "1.2"'))
    problems = lockcheck.check_lock(load_stack(str(path)), lock)
    assert any(p.startswith("stale: ") and f"invoke lock --stack {path}" in p for p in problems)
    assert "pin sf-base==1.2: the lock holds sf-base 1.0" in problems
    with pytest.raises(lockfile.LockError, match="cannot be installed from"):
        lockcheck.checked_lock(load_stack(str(path)))


def test_build_refuses_a_stack_without_a_lock_with_the_command_that_makes_one(tmp_path):
    path = write_stack(tmp_path, "nolock")
    # The one remedy for a missing lock (image/lock/remedies.py), worded as every command words it.
    with pytest.raises(lockfile.LockError, match=rf"no lock for nolock: {re.escape(remedy('lock', str(path)))}"):
        prepare(BuildOptions(stack=str(path), dry_run=True, build_root=tmp_path / "b", echo=lambda _: None))


def test_check_of_a_missing_lock_says_how_to_make_it():
    res = subprocess.run([sys.executable, "-m", "invoke", "lock", "--check", "--cuda", "cu129"],
                         cwd=Path(__file__).parents[2],
                         capture_output=True, text=True)
    if (Path(__file__).parents[2] / "images" / "locks" / "pylock.cu129.toml").exists():
        pytest.skip("the cu129 lock exists (made where download.pytorch.org is reachable): see "
                    "test_committed_locks_pass_check")
    assert res.returncode == 2
    from slimeforge.image.lock.remedies import remedy

    assert f"no lock for cu129: {remedy('lock', 'cu129')}" in res.stderr and "Traceback" not in res.stderr
    assert "`invoke lock --cuda cu129` makes it" in res.stderr


@pytest.mark.parametrize("flavor", ["cu13", "cu129"])
def test_committed_locks_pass_check(flavor):
    if not (Path(__file__).parents[2] / "images" / "locks" / f"pylock.{flavor}.toml").exists():
        pytest.skip(f"no committed lock for {flavor}: `invoke lock --cuda {flavor}` needs its index "
                    "(download.pytorch.org for cu129)")
    assert_a_whole_stack(lockcheck.check(flavor, echo=lambda _: None))


def assert_a_whole_stack(summary: dict) -> None:
    """A committed lock holds the whole stack (hundreds of distributions), and only the steps that
    compile from source have sdists."""
    assert summary["packages"] > 100, summary["packages"]
    assert set(summary["sdists"]) <= {"flash-attn", "transformer-engine-torch"}, summary["sdists"]


@pytest.mark.parametrize("mutation", [{"packages": 3}, {"sdists": ["flash-attn", "torch"]}])
def test_the_committed_lock_check_fails_on_a_mutated_summary(mutation):
    """The assertion above can fail: a 3-package lock, or an sdist outside the compiled steps
    (it once read `A and B or C`, which passed for both)."""
    assert_a_whole_stack({"packages": 283, "sdists": ["flash-attn"]})
    with pytest.raises(AssertionError):
        assert_a_whole_stack({"packages": 283, "sdists": ["flash-attn"], **mutation})


@pytest.mark.docker
def test_lock_asks_the_base_image_registry_for_its_digest(indexes, tmp_path, monkeypatch):
    """The base tag's digest comes from its registry (here the local distribution registry with TLS
    and htpasswd that the publish tests use; the login from the docker config, as `docker login` writes it)."""
    import base64
    import json
    import shutil

    from publish_support import REGISTRY_BIN, LocalRegistry

    if not shutil.which(REGISTRY_BIN) and not Path(REGISTRY_BIN).exists():
        absent(f"{REGISTRY_BIN} is not installed (apt-get install docker-registry)")
    reg = LocalRegistry(tmp_path / "registry", {"puller": "pull-pass-1"}).start()
    try:
        digest = push_tiny_image(reg, "sf/base", "v1", "puller", "pull-pass-1")
        config = tmp_path / "docker-config"
        config.mkdir()
        auth = base64.b64encode(b"puller:pull-pass-1").decode()
        (config / "config.json").write_text(json.dumps({"auths": {reg.host: {"auth": auth}}}))
        monkeypatch.setenv("DOCKER_CONFIG", str(config))
        path = write_stack(tmp_path / "s", base=f"{reg.host}/sf/base:v1")
        lines: list[str] = []
        lock = do_lock(path, indexes["main"], lines, base_digest=None)
        assert lock.tool["base"] == {"image": f"{reg.host}/sf/base:v1", "digest": digest}
        assert f"  base image {reg.host}/sf/base:v1 -> {digest}" in lines
        # The build takes FROM by that digest (and pulls it by digest when absent).
        p = prepare(BuildOptions(stack=str(path), dry_run=True, build_root=tmp_path / "b", echo=lambda _: None))
        assert p.base.from_ref == f"{reg.host}/sf/base@{digest}"
        assert p.dockerfile.count(f"FROM {reg.host}/sf/base@{digest}") == 1
        assert p.labels["ai.slimeforge.lock"] == f"sha256:{lock.hash}"
        # Absent here, the base is pulled by that digest (with a line per layer), not refused.
        import docker

        from slimeforge.image.builder.build import pull_base

        client = docker.from_env()
        seen: list[str] = []
        try:
            pull_base(client, p.base, seen.append)
            assert seen[0] == (f"pulling base {reg.host}/sf/base@{digest} "
                              "...") and any("Pull complete" in line for line in seen)
            assert client.images.get(p.base.from_ref).attrs["RepoDigests"] == [f"{reg.host}/sf/base@{digest}"]
            seen.clear()
            pull_base(client, p.base, seen.append)  # present now: nothing to do
            assert seen == []
        finally:
            client.images.remove(p.base.from_ref, force=True)
        # --base-digest by hand wins over the registry.
        do_lock(path, indexes["main"], base_digest=DIGEST)
        assert lockfile.load_lock(str(path)).tool["base"]["digest"] == DIGEST
    finally:
        reg.stop()


def test_same_lock_same_tag_and_a_changed_lock_changes_it(indexes, tmp_path):
    path = write_stack(tmp_path)
    lock = do_lock(path, indexes["main"])

    def prepared():
        return prepare(BuildOptions(stack=str(path), dry_run=True, build_root=tmp_path / "b", echo=lambda _: None))

    first, again = prepared(), prepared()
    assert first.hash == again.hash and first.labels["ai.slimeforge.lock"] == f"sha256:{lock.hash}"
    assert first.base.from_ref == f"slimeforge-test/base@{DIGEST}"  # FROM by the lock's digest
    slice_text = (first.dir / "context" / "lock" / "app.txt").read_text()
    assert (f"sf-dep @ {indexes['main'].url.removesuffix('/simple')}/files/sf_dep-2.0b1-py3-none-any.whl "
           "--hash=sha256:") in slice_text
    do_lock(path, indexes["main"], base_digest="sha256:" + "cd" * 32)  # another base: another lock
    changed = prepared()
    assert changed.hash != first.hash and changed.labels["ai.slimeforge.lock"] != first.labels["ai.slimeforge.lock"]


def test_a_step_builds_its_sdists_after_its_wheels_without_isolation(indexes, tmp_path):
    """sf-built exists only as an sdist whose build backend imports sf-helper, a wheel of the same
    step: the slice installs the wheels first, then builds the sdist against them."""
    main = indexes["main"]
    main.add("sf-helper", "1.0")
    main.add_sdist("sf-built", "1.0", needs="sf_helper")
    path = write_stack(tmp_path)
    path.write_text(path.read_text().replace('  sf-app: "1.0"\n',
                                             '  sf-app: "1.0"\n  sf-built: "1.0"\n  sf-helper: "1.0"\n')
                    .replace("    pip: [sf-app]\n",
                             "    pip: [sf-app]\n  - name: built\n    pip: [sf-built, sf-helper]\n"))
    lock = do_lock(path, main)
    assert lock.packages["sf-built"].kind == "sdist" and lock.steps["built"] == ["sf-built", "sf-helper"]
    text = lockfile.step_requirements(lock, "built")
    assert text.index("sf-helper @") < text.index(lockfile.SDIST_MARK) < text.index("sf-built @")
    venv, state, res = install_all(path, lock, tmp_path / "i")
    assert res.returncode == 0, res.stderr
    assert installed(venv)["sf-built"] == "1.0" and ("step built: 8 distribution(s) installed, all as "
                                                    "locked") in res.stderr
    # Alone (no wheel of its step before it), the same sdist does not build: the order is what works.
    alone = make_venv(tmp_path / "alone")
    sdist_only = tmp_path / "sdist-only.txt"
    sdist_only.write_text(text.split(lockfile.SDIST_MARK, 1)[1])
    # Its own uv cache: the first install's cache holds the wheel uv built of this sdist (a fresh venv
    # takes cached wheels by their sha256), and the point here is a build.
    res = steps_sh(tmp_path / "state2",
                   f"UV_CACHE_DIR={tmp_path / 'uv-cache-alone'} sf_lock_install {alone} built {sdist_only}")
    assert res.returncode == 1 and "No module named 'sf_helper'" in res.stderr


def test_relocking_unchanged_inputs_reuses_the_cutoff_and_gives_the_same_bytes(tmp_path):
    """The loopback index gains a newer release of a package no pin names (sf-extra, a dependency
    of sf-app): re-locking the unchanged stack keeps the lock byte for byte; --upgrade, or a
    changed pin, moves the cutoff and takes it."""
    from datetime import datetime

    index = Index(tmp_path / "index")
    for name in ("sf-base", "sf-dep", "sf-kern-cu13"):
        index.add(name, "1.0")
    index.add("sf-extra", "2.0")
    index.add("sf-kern", "1.0", ["sf-kern-cu13==1.0"])
    index.add("sf-app", "1.0", ["sf-base>=1.0", "sf-dep", "sf-extra", "sf-kern"])
    index.start()
    try:
        path = write_stack(tmp_path / "s")

        def relock(when: str, upgrade: bool = False) -> tuple[str, list[str]]:
            lines: list[str] = []
            uvlock.resolve(uvlock.LockOptions(stack=str(path), index_url=index.url, base_digest=DIGEST, upgrade=upgrade,
                                                now=lambda: datetime.fromisoformat(when), echo=lines.append))
            return lockfile.load_lock(str(path)).path.read_text(), lines

        first, lines = relock("2026-06-01T12:00:00+00:00")
        assert 'exclude-newer = "2026-06-01T12:00:00Z"' in first and ("  cutoff 2026-06-01T12:00:00Z: now (no previous "
                                                                     "lock)") in lines
        index.add("sf-extra", "2.1", uploaded="2026-07-01T00:00:00Z")  # after the cutoff: a later day's index
        again, lines = relock("2026-08-01T00:00:00+00:00")
        assert again == first  # the same bytes, so the same image tag
        assert "  cutoff 2026-06-01T12:00:00Z: the previous lock's (inputs unchanged; --upgrade moves it)" in lines
        upgraded, lines = relock("2026-08-01T00:00:00+00:00", upgrade=True)
        lock = lockfile.load_lock(str(path))
        assert lock.packages["sf-extra"].version == "2.1" and lock.tool["exclude-newer"] == "2026-08-01T00:00:00Z"
        assert "  cutoff 2026-08-01T00:00:00Z: now (--upgrade)" in lines
        # Back to the first lock, then a changed pin: its inputs changed, so the cutoff moves too.
        lockfile.write_lock(lock.path, first)
        path.write_text(path.read_text().replace('sf-app: "1.0"', 'sf-app: ">=1.0"'))
        _, lines = relock("2026-09-01T00:00:00+00:00")
        assert lockfile.load_lock(str(path)).packages["sf-extra"].version == "2.1"
        assert ("  cutoff 2026-09-01T00:00:00Z: now (the stack's inputs changed since the lock with cutoff "
               "2026-06-01T12:00:00Z)") in lines
    finally:
        index.stop()


def test_an_index_without_upload_times_locks_without_a_cutoff_and_says_so(tmp_path):
    index = Index(tmp_path / "index", upload_times=False)
    for name in ("sf-base", "sf-dep", "sf-extra", "sf-kern-cu13"):
        index.add(name, "1.0" if name != "sf-extra" else "2.0")
    index.add("sf-kern", "1.0", ["sf-kern-cu13==1.0"])
    index.add("sf-app", "1.0", ["sf-base>=1.0", "sf-dep", "sf-extra", "sf-kern"])
    index.start()
    try:
        lines: list[str] = []
        lock = do_lock(write_stack(tmp_path / "s"), index, lines)
    finally:
        index.stop()
    assert lock.tool["exclude-newer"] == "" and lock.packages["sf-extra"].version == "2.0"
    assert any(line.startswith("  warning: an index gives no upload times, so no cutoff can apply") for line in lines)
    assert any("is missing an upload date" in line for line in lines)


@pytest.mark.docker
def test_complete_fills_only_the_missing_outside_facts_and_build_does_it_by_itself(indexes, tmp_path, monkeypatch):
    """A lock made where neither the base image's registry nor the router wheel's host answered:
    the dry runs render with both marked; `lock --complete` (loopback TLS registry, loopback wheel
    URL) fills exactly those two fields, byte for byte otherwise; a real build does the same itself."""
    import base64
    import json
    import shutil

    from lock_support import make_wheel
    from publish_support import REGISTRY_BIN, LocalRegistry

    from slimeforge.image.lock import lockfacts

    if not shutil.which(REGISTRY_BIN) and not Path(REGISTRY_BIN).exists():
        absent(f"{REGISTRY_BIN} is not installed (apt-get install docker-registry)")
    main = indexes["main"]
    reg = LocalRegistry(tmp_path / "registry", {"puller": "pull-pass-1"})  # not started yet: unreachable
    config = tmp_path / "docker-config"
    config.mkdir()
    auth = base64.b64encode(b"puller:pull-pass-1").decode()
    (config / "config.json").write_text(json.dumps({"auths": {reg.host: {"auth": auth}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    # not there yet: unreachable
    router_url = f"{main.url.removesuffix('/simple')}/router/sf_router-0.3.2-py3-none-any.whl"
    path = router_stack(tmp_path / "s", f"{reg.host}/sf/base:v1", router_url)
    lines: list[str] = []
    lock = do_lock(path, main, lines, base_digest=None)
    assert lock.tool["base"]["digest"] == "" and lock.tool["router"] == {"url": router_url}
    made = lock.path.read_text()

    # The dry runs render everything, each missing fact named with what fills it; the lock is untouched.
    seen: list[str] = []
    p = prepare(BuildOptions(stack=str(path), dry_run=True, build_root=tmp_path / "b", echo=seen.append))
    assert p.provisional
    assert any(s.startswith("warning: the router wheel's sha256 is missing "
                            "from") and f"`invoke lock --stack {path} --complete`" in s
               for s in seen)
    assert any(s.startswith("warning: the base image's digest is missing from") for s in seen)
    router_slice = (p.dir / "context" / "lock" / "router.txt").read_text()
    assert router_slice.startswith("# MISSING: the router wheel's "
                                   "sha256") and f"sf-router @ {router_url}\n" in router_slice
    assert "--hash" not in router_slice  # uv --require-hashes refuses it: run as is, the step fails, naming it
    assert lock.path.read_text() == made

    wheel = make_wheel(main.root / "router", "sf-router", "0.3.2")
    reg.start()
    try:
        digest = push_tiny_image(reg, "sf/base", "v1", "puller", "pull-pass-1")
        # A changed input is refused, naming the difference: --complete resolves nothing.
        path.write_text(path.read_text().replace('sf-base: "1.0"', 'sf-base: "1.2"'))
        with pytest.raises(lockfile.LockError,
                           match=r"cannot be completed(.|\n)*pin sf-base==1\.2: the lock holds sf-base 1\.0"):
            lockfacts.complete(str(path), echo=lambda _: None)
        path.write_text(path.read_text().replace('sf-base: "1.2"', 'sf-base: "1.0"'))

        out: list[str] = []
        result = lockfacts.complete(str(path), echo=out.append)
        sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
        assert result["filled"] == ["base_digest", "router_sha256"]
        after = lock.path.read_text()
        assert after == made.replace('"digest" = ""', f'"digest" = "{digest}"').replace(
            f'"url" = "{router_url}"', f'"url" = "{router_url}"\n"sha256" = "{sha}"')
        assert f"{lock.path}: the router wheel's sha256 filled in: {sha}" in out and any("commit it" in s for s in out)
        # What --complete wrote is what a re-lock would have written: the same bytes.
        do_lock(path, main, base_digest=None)
        assert lock.path.read_text() == after
        out.clear()
        assert lockfacts.complete(str(path),
                                  echo=out.append)["filled"] == [] and out == [f"{lock.path}: complete (nothing "
                                                                               "missing)"]
        with pytest.raises(lockfile.LockError, match="changes nothing recorded"):
            lockfacts.complete(str(path), echo=lambda _: None, router_sha256="0" * 64)

        # A real build (prepare: everything before `docker build`) fills them by itself and says so.
        lockfile.write_lock(lock.path, made)
        seen.clear()
        p = prepare(BuildOptions(stack=str(path), build_root=tmp_path / "b", echo=seen.append))
        assert lock.path.read_text() == after and not p.provisional
        assert f"{lock.path}: the base image's digest filled in: {digest}" in seen
        assert (p.dir / "context" / "lock" / "router.txt").read_text().endswith(f"sf-router @ {router_url} "
                                                                                f"--hash=sha256:{sha}\n")
        assert p.base.from_ref == f"{reg.host}/sf/base@{digest}"
    finally:
        reg.stop()
    # Where it cannot fill what it needs (the router host gone), a real build refuses, naming it.
    lockfile.write_lock(lock.path, made)
    wheel.unlink()
    with pytest.raises(lockfile.LockError, match="cannot build or install without the router wheel's sha256"):
        prepare(BuildOptions(stack=str(path), build_root=tmp_path / "b", echo=lambda _: None))
    assert lock.path.read_text() == made
