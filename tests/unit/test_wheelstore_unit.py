"""The compiled-wheel store's local side: entries by key, checked against their record on every
use; what a stack needs; garbage; the remote reference; and the step library's own check."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slimeforge.errors import ConfigError
from slimeforge.image.builder.build import render_dockerfile
from slimeforge.image.stack import load_stack
from slimeforge.image.steps import compiled_key
from slimeforge.image.wheels import wheelstore

ROOT = Path(__file__).resolve().parents[2]
KEY = "cu13-apex-0123456789abcdef"


def made(tmp_path: Path, files: dict[str, bytes]) -> Path:
    """A directory as sf_compiled --wheel-out leaves it: wheels and their SHA256SUMS."""
    d = tmp_path / "out"
    d.mkdir(parents=True)
    for name, data in files.items():
        (d / name).write_bytes(data)
    (d / "SHA256SUMS").write_text("".join(f"{hashlib.sha256(data).hexdigest()}  {name}\n"
                                          for name, data in files.items()))
    return d


def test_put_then_lookup_round_trips_with_a_record(tmp_path):
    src = made(tmp_path, {"apex-0.1-cp312-cp312-linux_x86_64.whl": b"wheel bytes"})
    entry = wheelstore.put(KEY, src, {"flavor": "cu13", "step": "apex"}, tmp_path / "store")
    again = wheelstore.lookup(KEY, tmp_path / "store")
    wheel_sha = hashlib.sha256(b"wheel bytes").hexdigest()
    assert again is not None and again.wheels == entry.wheels == {"apex-0.1-cp312-cp312-linux_x86_64.whl": wheel_sha}
    assert json.loads((tmp_path / "store" / KEY / "record.json").read_text())["step"] == "apex"
    assert wheelstore.lookup("cu13-apex-ffffffffffffffff", tmp_path / "store") is None  # a miss
    assert wheelstore.keys_in(tmp_path / "store") == [KEY]  # nothing half-written left beside it


@pytest.mark.parametrize("damage", ["bytes", "extra", "missing", "record"])
def test_a_damaged_entry_is_refused_never_a_silent_miss(tmp_path, damage):
    src = made(tmp_path, {"apex-0.1-cp312-cp312-linux_x86_64.whl": b"wheel bytes"})
    entry = wheelstore.put(KEY, src, {}, tmp_path / "store")
    wheel = entry.dir / "apex-0.1-cp312-cp312-linux_x86_64.whl"
    if damage == "bytes":
        wheel.write_bytes(b"wheel bytez")
    elif damage == "extra":
        (entry.dir / "evil-1.0-py3-none-any.whl").write_bytes(b"x")
    elif damage == "missing":
        wheel.unlink()
    else:
        (entry.dir / "record.json").write_text(json.dumps({"key": KEY, "wheels": {"other.whl": "0" * 64}}))
    with pytest.raises(wheelstore.WheelStoreError, match="refused"):
        wheelstore.lookup(KEY, tmp_path / "store")


@pytest.mark.parametrize("line", ["deadbeef  a.whl", f"{'0' * 64}  ../a.whl", f"{'0' * 64}  a.tar.gz",
                                  f"{'0' * 64}  a.whl\x1b"])
def test_sha256sums_is_read_by_its_grammar(tmp_path, line):
    (tmp_path / "SHA256SUMS").write_text(line + "\n")
    with pytest.raises(wheelstore.WheelStoreError, match="SHA256SUMS line 1"):
        wheelstore.read_sums(tmp_path / "SHA256SUMS", "here")


@pytest.mark.parametrize("key", ["", "../x", "a b", "-x", "x" * 129, "k\n"])
def test_keys_are_checked(key):
    with pytest.raises(ConfigError, match="key"):
        wheelstore.lookup(key)


@pytest.mark.parametrize("registry", ["myhost/team", "", "127.0.0.1:5000/UPPER", "a b", "reg.example.com\t"])
def test_a_bad_registry_is_refused_before_anything_runs(registry):
    with pytest.raises(ConfigError, match="--registry"):
        wheelstore.remote_ref(registry, KEY)


def test_the_remote_reference_is_one_tag_per_key():
    assert str(wheelstore.remote_ref("127.0.0.1:5000", KEY)) == f"127.0.0.1:5000/slimeforge-compiled:{KEY}"
    assert str(wheelstore.remote_ref("123.dkr.ecr.us-east-1.amazonaws.com/ml", KEY)) == \
        f"123.dkr.ecr.us-east-1.amazonaws.com/ml/slimeforge-compiled:{KEY}"


def test_cu13_keys_and_what_is_stored():
    keys = wheelstore.needed(load_stack("cu13"))
    # cu13 has no FA2: its flash-attn step has nothing to compile, so nothing to store.
    assert not keys["flash-attn"].storable
    assert all(keys[s].storable for s in ("transformer-engine", "apex", "torch-memory-saver"))


def test_unused_lists_only_keys_no_stack_uses(tmp_path):
    stack = load_stack("cu13")
    used = wheelstore.needed(stack)["apex"].key
    for key in (used, "cu13-apex-00000000deadbeef"):
        wheelstore.put(key, made(tmp_path / key, {"apex-0.1-cp312-cp312-linux_x86_64.whl": b"w"}), {},
                       tmp_path / "store")
    assert wheelstore.unused([stack], tmp_path / "store") == ["cu13-apex-00000000deadbeef"]


def test_a_hit_mounts_the_wheels_and_a_miss_compiles_into_the_store_dir():
    stack = load_stack("cu13")
    key = compiled_key(stack, "apex", "sha256:" + "a" * 64)
    hit = render_dockerfile(stack, base_id="sha256:" + "a" * 64, store={"apex": "use"})
    assert f"--mount=type=bind,source=compiled/{key},target=/tmp/sf-compiled/{key}" in hit
    assert f"sf apex compiled --key {key} --venv /opt/venv --wheels /tmp/sf-compiled/{key} -- source_step" in hit
    only = render_dockerfile(stack, base_id="sha256:" + "a" * 64, store={"apex": "make"}, wheels_only=True)
    assert f"compiled --key {key} --venv /opt/venv --wheel-out /opt/sf-compiled/{key} -- source_step" in only
    # Up to the compiled step, then a scratch stage with the wheels: no later step, no finalize.
    assert "sf torch-memory-saver" not in only and "finalize" not in only
    # The wheels come straight from the miss's own compile stage.
    assert only.rstrip().endswith(f"FROM scratch AS sf-compiled\n"
                                  f"COPY --from=sf-compile-apex /opt/sf-compiled/{key} /{key}")
    # Without the store each compiled step compiles in its stage and nothing comes from the context.
    plain = render_dockerfile(stack)
    assert "source=compiled/" not in plain and "FROM scratch" not in plain and "FROM sf-s0 AS sf-compile-apex" in plain


def test_a_patch_change_changes_the_key_only_of_its_step():
    stack = load_stack("cu13")
    # No cu13 compiled step takes a patch: a patch sha256 leaves every compiled key as it was.
    assert compiled_key(stack, "apex", None, {"sglang.patch": "1" * 64}) == compiled_key(stack, "apex")


def test_the_step_library_refuses_a_changed_wheel(tmp_path):
    d = made(tmp_path, {"apex-0.1-cp312-cp312-linux_x86_64.whl": b"wheel bytes"})
    (d / "apex-0.1-cp312-cp312-linux_x86_64.whl").write_bytes(b"other bytes")
    res = subprocess.run(["bash", "-c", f"source {ROOT / 'templates' / 'steps.sh'}; SF_STATE={tmp_path}; "
                                        f"SF_COMPILED_WHEELS={d} _sf_store_install /nonexistent apex 1"],
                         capture_output=True, text=True)
    assert res.returncode == 1 and "apex: a wheel in" in res.stderr and "refused" in res.stderr
    d2 = made(tmp_path / "two", {"a-1-py3-none-any.whl": b"a"})
    res = subprocess.run(["bash", "-c", f"source {ROOT / 'templates' / 'steps.sh'}; SF_STATE={tmp_path}; "
                                        f"SF_COMPILED_WHEELS={d2} _sf_store_install /nonexistent apex 2"],
                         capture_output=True, text=True)
    assert res.returncode == 1 and "holds 1 wheel(s), the step builds 2" in res.stderr


@pytest.mark.parametrize("wheels_only", [False, True])
def test_the_store_dockerfiles_pass_hadolint(tmp_path, wheels_only):
    stack = load_stack("cu13")
    store = {"apex": "make", "transformer-engine": "use", "torch-memory-saver": "make"} if wheels_only else \
        {n: "use" for n in ("apex", "transformer-engine", "torch-memory-saver")}
    path = tmp_path / "Dockerfile"
    path.write_text(render_dockerfile(stack, base_id="sha256:" + "a" * 64, store=store, wheels_only=wheels_only))
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    res = subprocess.run([hadolint, "--config", str(ROOT / ".hadolint.yaml"), str(path)], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_torch_change_misses_and_a_slime_commit_change_hits(tmp_path):
    from test_build_render import derived

    base = "sha256:" + "a" * 64
    stored = wheelstore.stack_keys(load_stack("cu13"), base, {})["apex"].key
    wheelstore.put(stored, made(tmp_path / "w", {"apex-0.1-cp312-cp312-linux_x86_64.whl": b"w"}), {},
                   tmp_path / "store")
    newer_torch = wheelstore.stack_keys(derived(tmp_path, "torch", versions="{torch: '2.11.1'}"), base, {})["apex"].key
    newer_slime = wheelstore.stack_keys(derived(tmp_path, "slime", sources="{slime: {commit: '" + "d" * 40 + "'}}"),
                                        base, {})["apex"].key
    assert wheelstore.lookup(newer_torch, tmp_path / "store") is None
    assert wheelstore.lookup(newer_slime, tmp_path / "store").key == stored


def test_an_ecr_store_logs_in_with_a_token_and_creates_an_immutable_repository(monkeypatch):
    """Against moto's ECR API (the push itself is the registry push tested with a real registry)."""
    import socket

    import boto3
    from moto.server import ThreadedMotoServer

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_ECR", f"http://127.0.0.1:{port}")
        ref = wheelstore.remote_ref("123456789012.dkr.ecr.us-east-1.amazonaws.com/team", KEY)
        creds = wheelstore.ecr_credentials(ref, create=True, echo=lambda s: None)
        assert creds is not None and creds.username == "AWS" and creds.password
        repo = boto3.client("ecr", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{port}").describe_repositories(
            repositoryNames=["team/slimeforge-compiled"])["repositories"][0]
        assert repo["imageTagMutability"] == "IMMUTABLE"
        assert wheelstore.ecr_credentials(wheelstore.remote_ref("127.0.0.1:5000", KEY), create=True) is None
    finally:
        server.stop()


SUMS_LINES = [f"{'ab' * 32}  torch_memory_saver-0.0.9-cp312-cp312-linux_x86_64.whl", f"{'0' * 64}  a.whl",
              f"{'0' * 64} *a.whl", f"{'0' * 64} a.whl", f" {'0' * 64}  a.whl", f"{'0' * 64}  a.whl ",
              f"{'0' * 64}  a b.whl",
              f"{'0' * 64}  {'x' * 200}.whl", f"{'0' * 64}  {'x' * 201}.whl", f"{'A' * 64}  a.whl", "deadbeef  a.whl",
              f"{'0' * 64}  ../a.whl", f"{'0' * 64}  a.tar.gz", f"{'0' * 64}  a.whl\x1b", f"{'0' * 64}  -rf.whl", ""]


def test_sha256sums_has_one_grammar_in_python_and_in_the_step_library():
    """steps.sh reads SHA256SUMS in bash (_sf_sums_line); a pair test holds it to SUMS_LINE_RE."""
    lib = Path(__file__).resolve().parents[2] / "templates" / "steps.sh"
    script = ('source "$1"; shift; for l in "$@"; do '
              'if _sf_sums_line "$l"; then echo "ok $SF_SUM_SHA $SF_SUM_FILE"; else echo no; fi; done')
    res = subprocess.run(["bash", "-c", script, "sf", str(lib), *SUMS_LINES], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    python = [f"ok {m.group(1)} {m.group(2)}" if (m := wheelstore.SUMS_LINE_RE.fullmatch(line)) else "no"
              for line in SUMS_LINES]
    assert res.stdout.splitlines() == python
    # not vacuous: four lines pass (-rf.whl too: it is only ever $dir/-rf.whl)
    assert python.count("no") == len(SUMS_LINES) - 4


def test_without_hashing_the_record_is_still_checked_and_the_bytes_left_to_the_installer(tmp_path):
    """install.sh checks every wheel against SHA256SUMS right before it installs it: the install's
    plan reads the record and the names only (the bytes are not hashed twice), and still refuses a
    record that disagrees or a wheel too many."""
    src = made(tmp_path, {"apex-0.1-cp312-cp312-linux_x86_64.whl": b"wheel bytes"})
    entry = wheelstore.put(KEY, src, {}, tmp_path / "store")
    (entry.dir / "apex-0.1-cp312-cp312-linux_x86_64.whl").write_bytes(b"wheel bytez")
    assert wheelstore.lookup(KEY, tmp_path / "store", hash_wheels=False).wheels == entry.wheels
    with pytest.raises(wheelstore.WheelStoreError, match="refused"):
        wheelstore.lookup(KEY, tmp_path / "store")
    (entry.dir / "evil-1.0-py3-none-any.whl").write_bytes(b"x")
    with pytest.raises(wheelstore.WheelStoreError, match="refused"):
        wheelstore.lookup(KEY, tmp_path / "store", hash_wheels=False)
