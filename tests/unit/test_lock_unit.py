"""The lock's pure parts: the target's wheel tags, the file a package installs, uv's annotated
output as a graph, the slices per step, CUDA-major detection, the file's grammar, and the
committed locks against their stacks (offline)."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest

from slimeforge.errors import ConfigError
from slimeforge.image.lock import lockcheck, lockfile, uvlock
from slimeforge.image.stack import load_stack

ROOT = Path(__file__).resolve().parents[2]
SHA = "a" * 64


def wheel(name: str, sha: str = SHA) -> dict:
    return {"url": f"https://files.example/{name}", "size": 10, "hashes": {"sha256": sha}}


def test_target_tags_follow_the_stack_not_this_machine():
    tags = [str(t) for t in uvlock.target_tags(load_stack("cu13"))]
    assert tags[0] == "cp312-cp312-manylinux_2_39_x86_64"
    assert "cp312-abi3-manylinux2014_x86_64" in tags and "py3-none-any" in tags
    assert "cp311-abi3-manylinux_2_28_x86_64" in tags  # abi3 wheels of older CPythons load on 3.12
    assert not any("cp311-cp311" in t or "aarch64" in t or "macosx" in t or "manylinux_2_40" in t for t in tags)


def test_pick_file_takes_the_best_wheel_for_the_target_or_the_sdist():
    tags = uvlock.target_tags(load_stack("cu13"))
    pkg = {"sdist": wheel("x-1.tar.gz", "b" * 64), "wheels": [
        wheel("x-1-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "1" * 64),
        wheel("x-1-cp312-cp312-manylinux_2_28_x86_64.whl", "2" * 64),
        wheel("x-1-cp312-cp312-manylinux_2_40_x86_64.whl", "3" * 64),  # newer glibc than the base: never
        wheel("x-1-cp311-cp311-manylinux_2_28_x86_64.whl", "4" * 64),
        wheel("x-1-cp312-cp312-macosx_11_0_arm64.whl", "5" * 64),
    ]}
    assert uvlock.pick_file(pkg, tags, from_source=False)["sha256"] == "2" * 64
    assert uvlock.pick_file(pkg, tags, from_source=True) == {"kind": "sdist", "name": "x-1.tar.gz", "url": "https://files.example/x-1.tar.gz",
                                                        "size": 10, "sha256": "b" * 64}
    only_foreign = {"sdist": pkg["sdist"], "wheels": pkg["wheels"][2:]}
    assert uvlock.pick_file(only_foreign, tags, from_source=False)["kind"] == "sdist"
    assert uvlock.pick_file({"wheels": pkg["wheels"][2:]}, tags, from_source=False) is None


def test_annotated_output_is_read_as_a_graph():
    text = """
accelerate==1.15.0        # via -r in.txt
numpy==1.26.4             # via accelerate, scipy, -r in.txt
Scipy==1.13.1             # via -c cons.txt
torch==2.11.0             # via accelerate
"""
    versions, needs = uvlock.parse_annotated(text)
    assert versions == {"accelerate": "1.15.0", "numpy": "1.26.4", "scipy": "1.13.1", "torch": "2.11.0"}
    assert needs == {"accelerate": {"numpy", "torch"}, "scipy": {"numpy"}}


def test_slices_hold_each_package_once_in_the_first_step_that_needs_it():
    graph = {"torch": {"numpy", "filelock"}, "sglang": {"torch", "numpy", "aiohttp"}, "aiohttp": {"yarl"}}
    names = {"torch", "numpy", "filelock", "sglang", "aiohttp", "yarl", "stray"}
    slices = uvlock.step_slices({"torch": ["torch"], "build": ["numpy"], "sglang": ["sglang"], "last": []}, graph,
                                names)
    assert slices == {"torch": ["filelock", "numpy", "torch"], "build": [], "sglang": ["aiohttp", "sglang", "yarl"],
                      "last": ["stray"]}


@pytest.mark.parametrize(("name", "version", "major"), [
    ("nvidia-cudnn-cu12", "9.16.0.29", "12"), ("transformer-engine-cu13", "2.11.0", "13"), ("nvidia-nccl-cu13",
                                                                                            "2.28.9", "13"),
    ("torch", "2.11.0+cu129", "12"), ("torch", "2.11.0+cu130", "13"), ("cuda-python", "12.9.4", "12"),
    ("cuda-bindings", "13.4.4", "13"), ("nvidia-cublas", "13.1.0.3", "13"), ("torch", "2.11.0", None),
    ("nvidia-cufft", "12.0.0.61", None), ("cucumber", "1.0", None), ("sglang-kernel", "0.4.4", None),
])
def test_cuda_major_from_name_local_version_or_runtime_version(name, version, major):
    assert lockcheck.cuda_major_of(name, version) == major


def test_lock_file_grammar_refuses_what_could_break_a_requirements_line(tmp_path):
    path = tmp_path / "pylock.x.toml"
    path.write_text(f'''lock-version = "1.0"
created-by = "slimeforge"

[[packages]]
name = "ok"
version = "1.0"
wheels = [{{ url = "https://f/ok-1.0-py3-none-any.whl", hashes = {{ sha256 = "{SHA}" }} }}]

[[packages]]
name = "evil"
version = "1.0"
wheels = [{{ url = "https://f/e.whl --index-url http://x", hashes = {{ sha256 = "{SHA}" }} }}]

[[packages]]
name = "two"
version = "1.0"
sdist = {{ url = "https://f/two-1.0.tar.gz", hashes = {{ sha256 = "{SHA}" }} }}
wheels = [{{ url = "https://f/two-1.0-py3-none-any.whl", hashes = {{ sha256 = "{SHA}" }} }}]

[[packages]]
name = "short"
version = "not a version"
wheels = []

[tool.slimeforge]
steps = {{ a = ["ok", "ghost"] }}
''')
    with pytest.raises(ConfigError) as err:
        lockfile.read_lock(path)
    text = str(err.value)
    assert "packages[1] (evil).url: is not an http(s)/file URL without spaces or quotes" in text
    assert "packages[2] (two): must hold exactly one file" in text
    assert "packages[3].version: is not a version" in text
    assert "tool.slimeforge.steps.a: names a package the lock does not hold (got 'ghost')" in text


def test_rendered_lock_reads_back():
    stack = load_stack(str(ROOT / "tests" / "stacks" / "test.yaml"))
    lock = lockfile.read_lock(ROOT / "tests" / "stacks" / "locks" / "pylock.sftest.toml", stack)
    data = {"lock-version": "1.0", "created-by": "slimeforge", "requires-python": "==3.11.*",
            "packages": [{"name": p.name, "version": p.version, "wheels": [{"name": p.filename, "url": p.url,
                                                                            "size": p.size,
                                                                           "hashes": {"sha256": p.sha256}}]}
                         for p in lock.packages.values()],
            "tool": {"slimeforge": lock.tool}}
    assert lockfile.render_lock(data) == lock.text  # the committed file is exactly what render_lock writes


def test_step_requirements_by_url_and_hash_with_sdists_last():
    lock = lockfile.LockFile(Path("pylock.t.toml"), {
        "b": lockfile.Locked("b", "1.0", "https://f/b-1.0.tar.gz", "b" * 64, 1, "sdist", "b-1.0.tar.gz"),
        "a": lockfile.Locked("a", "2.0", "https://f/a-2.0-py3-none-any.whl", SHA, 1, "wheel", "a-2.0-py3-none-any.whl"),
    }, {"steps": {"s": ["a", "b"]}, "flavor": "t"}, "")
    assert lockfile.step_requirements(lock, "s").splitlines()[1:] == [
        f"a @ https://f/a-2.0-py3-none-any.whl --hash=sha256:{SHA}  # ==2.0",
        lockfile.SDIST_MARK,
        f"b @ https://f/b-1.0.tar.gz --hash=sha256:{'b' * 64}  # ==1.0",
    ]
    assert lockfile.step_requirements(lock, "s", by_name=True).splitlines()[1] == f"a==2.0 --hash=sha256:{SHA}  # ==2.0"
    with pytest.raises(lockfile.LockError, match="step other has no slice"):
        lockfile.step_requirements(lock, "other")


def test_committed_cu13_lock_satisfies_its_stack_offline():
    stack = load_stack("cu13")
    lock = lockfile.load_lock("cu13", stack)
    assert lockcheck.check_lock(stack, lock) == []
    assert lock.packages["sglang"].version == "0.5.15.post1" and lock.packages["flash-attn-4"].version == "4.0.0b15"
    assert lock.tool["prereleases"] == ["flash-attn-4==4.0.0b15"]
    assert lock.packages["torch"].version == "2.11.0" and lock.packages["nvidia-cudnn-cu13"].version == "9.19.0.56"
    assert "flash-attn" not in lock.packages  # no FA2 on cu13 (sglang brings FA4)
    assert lock.packages["transformer-engine-torch"].kind == "sdist"  # the TE step builds it
    assert "transformer-engine-cu12" not in lock.packages and "torch-memory-saver" not in lock.packages
    # Every build dependency of the compiled steps comes before them.
    order = list(lock.steps)
    for dep in ("psutil", "ninja", "packaging", "pybind11", "setuptools", "wheel"):
        owner = next(s for s, names in lock.steps.items() if dep in names)
        assert order.index(owner) < order.index("flash-attn"), dep


def test_patch_files_must_be_the_locked_ones():
    lock = lockfile.LockFile(Path("pylock.t.toml"), {}, {"patches": {"a.patch": SHA}}, "")
    lockcheck.check_patch_hashes(lock, {"a.patch": SHA,
                                        "b.patch": "b" * 64})  # b.patch: not recorded, nothing to compare
    with pytest.raises(lockfile.LockError, match=f"a.patch: sha256 {'c' * 64}, the lock says {SHA}"):
        lockcheck.check_patch_hashes(lock, {"a.patch": "c" * 64})


def test_committed_cu13_lock_records_commits_and_patches():
    stack = load_stack("cu13")
    tool = lockfile.load_lock("cu13", stack).tool
    assert tool["sources"] == {n: s.commit for n, s in stack.sources.items()}
    assert set(tool["patches"]) == {p.file for p in stack.used_patches()}


def test_bad_options_are_refused_together_before_anything_runs(tmp_path):
    out = tmp_path / "pylock.cu13.toml"
    with pytest.raises(ConfigError) as err:
        uvlock.resolve(uvlock.LockOptions(stack="cu13", base_digest="sha256:xyz", router_sha256="a b",
                                          index_url="ftp://x y",
                                sources=["slime=/nonexistent"], out=out, echo=lambda _: None))
    text = str(err.value)
    for where in ("--base-digest", "--router-sha256", "--index-url", "--source slime"):
        assert f"  - {where}: " in text
    assert not out.exists()


def test_the_cutoff_is_the_previous_locks_only_for_unchanged_inputs_and_no_upgrade():
    from datetime import UTC, datetime

    from slimeforge.image.lock.lockinputs import inputs

    stack = load_stack("cu13")
    lock = lockfile.load_lock("cu13", stack)
    now = datetime(2027, 1, 2, 3, 4, 5, 678, tzinfo=UTC)
    assert lock.tool["exclude-newer"] == "2026-11-23T18:56:27Z"
    assert uvlock.choose_cutoff(lock, inputs(stack), False, now) == ("2026-11-23T18:56:27Z",
                                                                     "the previous lock's (inputs unchanged; "
                                                                      "--upgrade moves it)", True)
    assert uvlock.choose_cutoff(lock, inputs(stack), True, now) == ("2027-01-02T03:04:05Z", "now (--upgrade)", False)
    assert uvlock.choose_cutoff(None, inputs(stack), False, now)[1:] == ("now (no previous lock)", False)
    changed = lockfile.LockFile(lock.path, lock.packages, {**lock.tool, "inputs": "0" * 64}, lock.text)
    assert uvlock.choose_cutoff(changed, inputs(stack), False, now)[1] == \
        "now (the stack's inputs changed since the lock with cutoff 2026-11-23T18:56:27Z)"


@pytest.mark.parametrize("cutoff", ["2026-11-23", "2026-11-23T18:56:27+01:00", "2026-11-23T18:56:27Z\n", "now",
                                    20261123])
def test_a_cutoff_is_an_rfc3339_utc_second(tmp_path, cutoff):
    path = tmp_path / "pylock.cu13.toml"
    text = (ROOT / "images" / "locks" / "pylock.cu13.toml").read_text()
    path.write_text(text.replace('exclude-newer = "2026-11-23T18:56:27Z"', f"exclude-newer = {json.dumps(cutoff)}"))
    with pytest.raises(ConfigError, match="tool.slimeforge.exclude-newer: is not a cutoff"):
        lockfile.read_lock(path)


def test_completing_changes_only_the_filled_fields(tmp_path):
    from dataclasses import replace

    from slimeforge.image.lock import lockfacts

    stack = load_stack("cu13")
    lock = lockfile.load_lock("cu13", stack)
    assert [f.key for f in lockfacts.missing_facts(stack, lock)] == ["router_sha256", "base_digest"]
    lock = replace(lock, path=tmp_path / lock.path.name)
    digest, sha = "sha256:" + "d" * 64, "e" * 64
    text = lockfacts.with_facts(lock, {"base_digest": {"digest": digest}, "router_sha256": {"sha256": sha}})
    before, after = lock.text.splitlines(), text.splitlines()
    changed = [line for line in after if line not in before]
    assert changed == [f'"digest" = "{digest}"', f'"sha256" = "{sha}"'] and len(after) == len(before) + 1
    lockfile.write_lock(lock.path, text)
    done = lockfile.read_lock(lock.path)
    assert lockfacts.missing_facts(stack, done) == [] and done.packages == lock.packages
    # What --complete writes is what `invoke lock` would have rendered with those facts.
    data = tomllib.loads(text)
    assert lockfile.render_lock({**data, "tool": {"slimeforge": data["tool"]["slimeforge"]}}) == text
    # A lock whose tables are not as `invoke lock` writes them is refused, not patched blindly.
    odd = replace(lock, text=lock.text.replace("[tool.slimeforge.router]\n", "[tool.slimeforge.router]  # by hand\n"))
    with pytest.raises(lockfile.LockError, match=r"has no \[tool.slimeforge.router\] table to complete; re-lock"):
        lockfacts.with_facts(odd, {"router_sha256": {"sha256": sha}})


def test_a_dry_runs_router_slice_is_marked_and_fails_if_run():
    from dataclasses import replace

    lock = lockfile.load_lock("cu13")
    url = load_stack("cu13").router.wheel
    with pytest.raises(lockfile.LockError, match="--complete"):
        lockfile.router_requirement(lock, url)
    text = lockfile.router_requirement(replace(lock, provisional=True), url)
    assert text.startswith("# MISSING: the router wheel's "
                           "sha256") and text.endswith(f"sglang-router @ {url}\n") and "--hash" not in text


@pytest.mark.parametrize("by_name", [False, True])
def test_every_slice_line_the_lock_writes_is_read_back_by_the_step_librarys_one_parser(by_name):
    """lockfile writes a step's slice; venvlock.py (the step library's Python: verify, fetch) reads
    it with parse_slice_line: one grammar, held here line by line on the committed cu13 lock."""
    from slimeforge.scripts.venvlock import canonical, parse_slice_line

    lock = lockfile.load_lock("cu13")
    seen = 0
    for step in lock.steps:
        for line in lockfile.step_requirements(lock, step, by_name=by_name).splitlines():
            if line.startswith("#"):
                continue
            parsed = parse_slice_line(line)
            assert parsed is not None, line
            p = lock.packages[parsed.name]
            assert (parsed.version, parsed.sha256, parsed.url) == (p.version, p.sha256,
                                                                   None if by_name else p.url), line
            seen += 1
    assert seen >= len(lock.packages) - 1  # every distribution (the router's is a slice of its own)
    with_router = dataclasses.replace(lock, tool={**lock.tool, "router": {"sha256": "a" * 64}})
    router = lockfile.router_requirement(with_router, "https://example.com/sglang_router-0.3.2-cp38-abi3-any.whl").splitlines()[-1]
    assert (parse_slice_line(router) or pytest.fail(router)).version is None  # pinned by its sha256 alone
    assert parse_slice_line("-e git+https://x") is None and parse_slice_line("sf-base==1.0 --hash=sha256:abc") is None
    assert canonical("Transformer_Engine[pytorch]") == "transformer-engine" == lockfile.normalize("transformer.engine")


UV_URL = "https://files.example/uv-0.9.7-py3-none-manylinux_2_17_x86_64.whl"


@pytest.mark.parametrize(("wheel", "why"), [
    ({"url": UV_URL, "sha256": SHA}, None),
    ({"url": UV_URL.replace("0.9.7", "0.9.8"), "sha256": SHA}, "is not a wheel of uv 0.9.7"),
    ({"url": UV_URL.replace("/uv-", "/ruff-"), "sha256": SHA}, "is not a wheel of uv 0.9.7"),
    ({"url": "https://files.example/uv-0.9.7.tar.gz", "sha256": SHA}, "does not end in a wheel's file name"),
    ({"url": UV_URL + " --index-url x", "sha256": SHA}, "is not an http(s)/file URL"),
    ({"url": UV_URL, "sha256": "A" * 64}, "is not a sha256"),
    ({"url": UV_URL, "sha256": SHA, "size": "1"}, "holds fields `invoke lock` does not write"),
])
def test_the_uv_wheel_is_held_to_its_grammar(wheel, why):
    problems = lockfile.uv_wheel_problems(wheel, "0.9.7")
    assert [why in p.message for p in problems] == ([True] if why else [])


def test_the_venv_steps_slice_is_the_uv_wheel_by_sha256_and_a_lock_without_it_is_completed(tmp_path):
    from dataclasses import replace

    from slimeforge.image.lock import lockfacts
    from slimeforge.image.steps import host_layout, lock_files
    from slimeforge.scripts.venvlock import parse_slice_line

    stack = load_stack("cu13")
    lock = lockfile.load_lock("cu13", stack)
    wheel = lock.tool["uv-wheel"]
    venv_slice = lock_files(stack, replace(lock, tool={**lock.tool, "router": {**lock.tool["router"],
                                                                                "sha256": SHA}}),
                            host_layout(stack, "/opt/s"))["venv.txt"]
    line = next(x for x in venv_slice.splitlines() if not x.startswith("#"))
    parsed = parse_slice_line(line)  # the step library reads it as it reads every slice
    assert parsed is not None and (parsed.name, parsed.version, parsed.url, parsed.sha256) == (
        "uv", "0.9.7", wheel["url"], wheel["sha256"])
    # A lock made before the table existed: a dry run marks the slice (pip refuses its unhashed
    # line), a real run is refused naming the remedy, and --complete appends the table as
    # `invoke lock` renders it.
    text = lock.text.split("\n[tool.slimeforge.uv-wheel]")[0] + "\n"
    lockfile.write_lock(tmp_path / lock.path.name, text)
    old = lockfile.read_lock(tmp_path / lock.path.name)
    assert [f.key for f in lockcheck.missing_facts(stack, old)] == ["router_sha256", "uv_wheel", "base_digest"]
    with pytest.raises(lockfile.LockError, match=r"tool.slimeforge.uv-wheel.*--complete"):
        lockfile.uv_requirement(old)
    marked = lockfile.uv_requirement(replace(old, provisional=True))
    assert marked.startswith("# MISSING: the wheel of uv 0.9.7") and "--hash" not in marked
    filled = lockfacts.with_facts(old, {"uv_wheel": dict(wheel)})
    assert filled == lock.text
    data = tomllib.loads(filled)
    assert lockfile.render_lock({**data, "tool": {"slimeforge": data["tool"]["slimeforge"]}}) == filled
