"""The compiled-wheel store end to end, with a real C extension (sfcext) compiled from its sdist:

- cold build: the key misses, the wheels-only build compiles it, the store keeps it, the image's
  compiled step installs it from the store;
- the entry pushed to a loopback registry (TLS + htpasswd), then a fresh store and a build whose
  compiled step cannot come from BuildKit's cache (--no-cache; a changed MAX_JOBS no longer does:
  it reaches the compile stages only): the key is pulled, nothing compiles
  (from the step's log), the compiled file is byte-identical;
- the bare-metal install script in a container installs the same wheel (stored under the install's
  own key: the install's keys never hold a local image's id);
- a tampered wheel is refused, by slimeforge before the build and by the step library itself.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from build_support import remove_tags
from cext_support import STACK, serve_index
from publish_support import LocalRegistry

from slimeforge.image.builder.build import BuildOptions, build, default_ca_bundle
from slimeforge.image.builder.buildreport import BuildReport
from slimeforge.image.builder.install import render_install_script, store_plan
from slimeforge.image.lock.lockcheck import checked_lock
from slimeforge.image.lock.uvlock import LockOptions, resolve
from slimeforge.image.remote.registry import Credentials
from slimeforge.image.stack import load_stack
from slimeforge.image.wheels import wheelstore

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = f"slimeforge-wheelstore-test/sfcext-{os.getpid()}"
USER, PASSWORD = "wheels", "store-pw-" + os.urandom(6).hex()
SO = "import sfcext, hashlib; print(hashlib.sha256(open(sfcext.__file__, 'rb').read()).hexdigest())"


def built(o: BuildOptions) -> dict:
    """A real build's report as report.json holds it (what these tests read)."""
    report = build(o)
    assert isinstance(report, BuildReport), report
    return report.to_json()


@pytest.fixture(scope="module")
def world(base_image, tmp_path_factory):
    root = tmp_path_factory.mktemp("wheelstore")
    reg = LocalRegistry(root / "registry", {USER: PASSWORD}).start()
    try:
        with serve_index(root / "index") as index:
            stack = root / "sfcext.yaml"
            stack.write_text(STACK.format(archs='["9.0"]', index=index))
            resolve(LockOptions(stack=str(stack), echo=lambda s: None))
            yield {"root": root, "stack": stack, "registry": reg.host, "creds": Credentials(USER, PASSWORD, "test")}
    finally:
        reg.stop()
        remove_tags(REPO, f"{reg.host}/")


def opts(world, store: Path, **kw) -> BuildOptions:
    return BuildOptions(stack=str(world["stack"]), build_root=world["root"] / "out", repository=REPO, force=True,
                        store_root=store, **{"echo": lambda s: None, **kw})


def step_log(build_log: str, step: str) -> str:
    """The lines BuildKit printed for one stack step's RUN (its vertex id, then every `#id ` line)."""
    vid = next(m.group(1) for m in re.finditer(r"^#(\d+) \[[^\]]*\] RUN "
                                               r".*?/opt/slimeforge/sf " + re.escape(step) + " ", build_log, re.M))
    return "\n".join(line for line in build_log.splitlines() if line.startswith(f"#{vid} "))


def run_in(tag: str, *argv: str) -> str:
    res = subprocess.run(["docker", "run", "--rm", "--network", "none", tag, *argv], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


@pytest.fixture(scope="module")
def cold(world):
    store = world["root"] / "store-a"
    report = built(opts(world, store))
    return {"report": report, "store": store, "key": report["compiled"]["sfcext"]["key"]}


@pytest.fixture(scope="module")
def fresh(world, cold):
    """Another host: an empty store, the registry holding what the cold build pushed."""
    digest = wheelstore.push(cold["key"], world["registry"], world["creds"], cold["store"], echo=lambda s: None)
    # Pushing a key the registry has is a no-op that answers the same digest.
    said = []
    assert wheelstore.push(cold["key"], world["registry"], world["creds"], cold["store"], echo=said.append) == digest
    assert said == [f"{world['registry']}/slimeforge-compiled:{cold['key']} is already in the registry ({digest}): "
                    "nothing to push"]
    subprocess.run(["docker", "rmi", f"{world['registry']}/slimeforge-compiled:{cold['key']}"], capture_output=True,
                   check=True)
    store = world["root"] / "store-b"
    report = built(opts(world, store, wheel_registry=world["registry"], wheel_credentials=world["creds"],
                        no_cache=True))
    return {"report": report, "store": store}


def test_a_miss_compiles_once_then_stores(world, cold):
    report, key = cold["report"], cold["key"]
    assert {k: report["compiled"]["sfcext"][k] for k in ("key", "source", "from_store")} == {"key": key,
                                                                                             "source": "compiled",
                                                                                                 "from_store": True}
    entry = wheelstore.lookup(key, cold["store"])
    assert entry is not None and [n.startswith("sfcext-0.1.0-cp311-") for n in entry.wheels] == [True]
    assert entry.record["flavor"] == "sfcext" and entry.record["step"] == "sfcext"
    # The compile happened in the wheels-only build (its log shows gcc on sfcext.c) ...
    compile_log = step_log(Path(report["compiled"]["sfcext"]["log"]).read_text(), "sfcext")
    assert "compiling into /opt/sf-compiled/" + key in compile_log and "built: sfcext-0.1.0-cp311-" in compile_log
    # ... and the image's step installed the stored wheel.
    log = step_log((Path(report["dir"]) / "build.log").read_text(), "sfcext")
    assert "from the store (/tmp/sf-compiled/" + key in log and "built: sfcext" not in log


def test_a_fresh_builder_pulls_and_compiles_nothing(world, cold, fresh):
    report = fresh["report"]
    assert report["compiled"]["sfcext"]["source"] == "registry" and report["compiled"]["sfcext"]["from_store"]
    assert wheelstore.lookup(cold["key"],
                             fresh["store"]).record["pulled_from"].endswith(f"slimeforge-compiled:{cold['key']}")
    # wheels.ls: a hit here, and where it is (the local entry, the registry's tag).
    [row] = wheelstore.listing(load_stack(str(world["stack"])), fresh["store"], world["registry"], world["creds"])
    assert row["status"] == "hit" and row["where"] == [str(fresh["store"] / cold["key"]),
                                                       f"{world['registry']}/slimeforge-compiled:{cold['key']}"]
    # The image that carried the wheels is not kept: the store holds them.
    assert subprocess.run(["docker", "image", "inspect", f"{world['registry']}/slimeforge-compiled:{cold['key']}"],
                          capture_output=True).returncode != 0
    assert "log" not in report["compiled"]["sfcext"]  # no wheels-only build ran
    build_log = (Path(report["dir"]) / "build.log").read_text()
    log = step_log(build_log, "sfcext")
    # The compiled step ran (not taken from BuildKit's cache) and installed, with uv's --no-build,
    # the pulled wheel: no compiler ran, no sdist was built.
    assert "CACHED" not in log
    assert "installing 1 compiled wheel(s) from the store" in log and "sha256 verified" in log
    assert "built: sfcext" not in log and "Building" not in log and "Built sfcext" not in log
    # The compiled file is the same bytes in both images.
    assert run_in(report["tag"], "/opt/venv/bin/python", "-c", SO) == run_in(cold["report"]["tag"],
                                                                             "/opt/venv/bin/python", "-c", SO)


def test_the_bare_metal_install_uses_the_same_wheel(world, cold, fresh):
    stack = load_stack(str(world["stack"]))
    lock = checked_lock(stack)
    # The install uses no image: its key holds the base by its pinned digest only, never the local
    # base image's id that the image build's key holds (this base has no digest), so the keys differ.
    _, keys, base_id = store_plan(stack, "/opt/sf/.slimeforge", [], lock, fresh["store"], echo=lambda s: None)
    assert base_id is None and keys["sfcext"] != cold["key"]
    # The same wheel stored under the install's key (as a host whose base is pinned shares one key
    # with its image builds) is what the install takes, sha256-checked, compiling nothing.
    wheelstore.put(keys["sfcext"], cold["store"] / cold["key"], {"flavor": "sfcext", "step": "sfcext"}, fresh["store"])
    store, keys, base_id = store_plan(stack, "/opt/sf/.slimeforge", [], lock, fresh["store"], echo=lambda s: None)
    assert store == {"sfcext": ("use", str(fresh["store"] / keys["sfcext"]))}
    script = world["root"] / "install.sh"
    script.write_text(render_install_script(stack, "/opt/sf", patches=[], lock=lock, store=store, base_id=base_id))
    ca = default_ca_bundle()
    mounts = ["-v", f"{ca}:/etc/slimeforge-ca.crt:ro", "-e", "SF_CA_BUNDLE=/etc/slimeforge-ca.crt"] if ca else []
    res = subprocess.run(["docker", "run", "--rm", "-v", f"{world['root']}:{world['root']}:ro", *mounts,
                          "slimeforge-test/base:bookworm",
                          "bash", "-c",
                          f"bash {script} && cat /opt/sf/.slimeforge/logs/sfcext.log && /opt/sf/venv/bin/python -c "
                          f"\"{SO}\""],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "installing 1 compiled wheel(s) from the store" in res.stdout and "built: sfcext" not in res.stdout
    assert res.stdout.strip().splitlines()[-1] == run_in(cold["report"]["tag"], "/opt/venv/bin/python", "-c", SO)


def test_the_bare_metal_install_compiles_in_its_two_phases(world, cold):
    """Without the store the compiled step runs through sf_run_together: compiled into its wheel
    directory as a background job with its own log, then installed from there (nothing compiles in
    the install phase), with progress lines and the summary."""
    stack = load_stack(str(world["stack"]))
    script = world["root"] / "install-nostore.sh"
    script.write_text(render_install_script(stack, "/opt/sf", patches=[], lock=checked_lock(stack), store={}))
    ca = default_ca_bundle()
    mounts = ["-v", f"{ca}:/etc/slimeforge-ca.crt:ro", "-e", "SF_CA_BUNDLE=/etc/slimeforge-ca.crt"] if ca else []
    # In the cold build's image: a host with gcc (the test base has none) and Python's headers. The
    # prerequisites ask for g++ too (the real pieces are C++); sfcext is C, so gcc stands in for it.
    res = subprocess.run(["docker", "run", "--rm", "-v", f"{world['root']}:{world['root']}:ro", *mounts,
                          cold["report"]["tag"],
                          "bash", "-c",
                          f"ln -s \"$(command -v gcc)\" /usr/local/bin/g++ && bash {script} && cat "
                          f"/opt/sf/.slimeforge/logs/sfcext.log && /opt/sf/venv/bin/python -c \"{SO}\""],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "compiling side by side: sfcext (at most 1 at once" in res.stderr
    assert re.search(r"step [0-9]+/[0-9]+ sfcext: compiled in [0-9]+s", res.stderr)
    assert re.search(r"^slimeforge: sfcext +[0-9]+s  compiled$", res.stderr, re.M)  # the summary's row
    # The compile phase built the wheel; the install phase installed it with --no-build.
    assert "built: sfcext-0.1.0-cp311-" in res.stdout and "installing 1 compiled wheel(s) from the store" in res.stdout
    assert re.fullmatch(r"[0-9a-f]{64}", res.stdout.strip().splitlines()[-1])  # the extension imports


def test_a_tampered_wheel_is_refused(world, cold):
    store = world["root"] / "store-tampered"
    shutil.copytree(cold["store"] / cold["key"], store / cold["key"])
    wheel = next((store / cold["key"]).glob("*.whl"))
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    with pytest.raises(wheelstore.WheelStoreError, match=r"sha256 [0-9a-f]{64}, its record says [0-9a-f]{64}: refused"):
        build(opts(world, store))
    # The step library refuses it too (a host given a damaged directory): sha256sum -c fails.
    lib = Path(__file__).resolve().parents[2] / "templates" / "steps.sh"
    res = subprocess.run(["bash", "-c",
                          f'source {lib}; SF_STATE=$(mktemp -d); SF_COMPILED_WHEELS={store / cold["key"]} '
                                        f'_sf_store_install /nonexistent sfcext 1'], capture_output=True, text=True)
    assert res.returncode != 0 and "differs from its sha256 record: refused" in res.stderr


SOURCE_STACK = """schema: 1
name: sfcsrc
version: "0.0.1"
python: "3.11"
base: {{image: slimeforge-test/base:bookworm, digest: null, glibc: "2.36"}}
image_root: /root
venv: /opt/venv
arch_list: ["9.0"]
sources:
  sfcext: {{git: "https://git.invalid/sfcext.git", commit: "{commit}", dir: sfcext}}
versions: {{uv: "0.9.7", setuptools: "80.9.0", wheel: "0.45.1"}}
steps:
  - name: system
    python: true
    apt: [gcc, libc6-dev]
  - name: build-tools
    pip: [setuptools, wheel]
  - name: sfcext
    source: sfcext
    compiles: true
smoke:
  imports: [sfcext]
"""


def test_a_compiled_source_checkout_is_stored_and_reused(world):
    """apex and torch_memory_saver are checkouts, not sdists: the same store path for a source step."""
    import build_support as bs
    from cext_support import SETUP_PY, SFCEXT_C

    repo = world["root"] / "sfcext-src"
    repo.mkdir()
    bs._git(repo, "init", "-q")
    # A commit of its own each run: BuildKit's cache from an earlier run cannot stand in for the compile.
    commit = bs._commit(repo, {"setup.py": SETUP_PY, "sfcext.c": SFCEXT_C, "RUN_ID": os.urandom(8).hex(),
                               "pyproject.toml": '[build-system]\nrequires = ["setuptools"]\nbuild-backend = '
                                                 '"setuptools.build_meta"\n'},
                        "sfcext", "2025-01-01T00:00:00Z")
    stack = world["root"] / "sfcsrc.yaml"
    stack.write_text(SOURCE_STACK.format(commit=commit))
    sources = [f"sfcext={repo}"]
    resolve(LockOptions(stack=str(stack), sources=sources, echo=lambda s: None))
    store = world["root"] / "store-src"

    def run(**kw):
        return built(BuildOptions(stack=str(stack), sources=sources, build_root=world["root"] / "out", repository=REPO,
                                  force=True,
                                  store_root=store, echo=lambda s: None, **kw))

    cold = run()
    key = cold["compiled"]["sfcext"]["key"]
    assert cold["compiled"]["sfcext"]["source"] == "compiled"
    assert "built: sfcext-0.1.0-cp311-" in step_log(Path(cold["compiled"]["sfcext"]["log"]).read_text(), "sfcext")
    again = run(no_cache=True)
    assert again["compiled"]["sfcext"] == {"key": key, "source": "store", "from_store": True}
    log = step_log((Path(again["dir"]) / "build.log").read_text(), "sfcext")
    assert "CACHED" not in log and ("installing 1 compiled wheel(s) from the "
                                   "store") in log and "built: sfcext" not in log
    # The checkout is still there at its commit (finalize records it); the module is the stored wheel's.
    assert json.loads((Path(again["dir"]) / "stack.lock.json").read_text())["checkouts"]["sfcext"] == commit
    assert run_in(again["tag"], "/opt/venv/bin/python", "-c", SO) == run_in(cold["tag"], "/opt/venv/bin/python", "-c",
                                                                            SO)


def test_the_compile_stage_waits_in_the_build_hosts_queue(world, monkeypatch):
    # SF_COMPILE_POOL=queue: invoke build serves one compile queue on this host and hands it to the
    # wheels-only build (`docker build --ssh sf-queue=...`); the compile stage mounts it, makes its own
    # wrappers and sfcext's compile waits its turn there (--no-cache: the stage compiles every run).
    from dataclasses import replace

    from slimeforge.image.builder.build import build_wheels

    monkeypatch.setenv("SF_COMPILE_POOL", "queue")
    # This test image has gcc alone (no c++): the step names it as its CXX, the compiler the wrappers
    # stand for (and sfcext's setup.py, as torch's extension builder, compiles with $CXX).
    stack = world["root"] / "sfcext-queue.yaml"
    stack.write_text(world["stack"].read_text().replace("    compiles: true\n",
                                                        "    compiles: true\n    env: {CXX: gcc}\n"))
    resolve(LockOptions(stack=str(stack), echo=lambda s: None))
    store = world["root"] / "store-queue"
    said: list[str] = []
    result = build_wheels(replace(opts(world, store, no_cache=True, echo=said.append), stack=str(stack)))
    assert result["sfcext"].source == "compiled" and wheelstore.lookup(result["sfcext"].key, store) is not None
    build_dir = Path(result["sfcext"].log).parent
    queue_log = (build_dir / "queue.log").read_text()
    # One file, by the wrapper of the container's compiler (CXX), at the table's default cost; it ended.
    assert re.search(r"^t=[0-9.]+ go cxx sfcext\.o cost=28 running=1$", queue_log, re.M), queue_log
    assert re.search(r"^t=[0-9.]+ end cxx sfcext\.o cost=28 running=0$", queue_log, re.M), queue_log
    assert any("compiling behind one queue of" in s for s in said)
    stage = step_log(Path(result["sfcext"].log).read_text(), "sfcext")
    assert f"/queue-wrappers/{result['sfcext'].key})" in stage.split("(every compile behind the queue ", 1)[-1]
    assert "MAX_JOBS=64" in stage and "built: sfcext-0.1.0-cp311-" in stage
    # The queue stopped with the build, and its directory (the socket) went with it.
    assert not (build_dir / "queue").exists()
    assert subprocess.run(["pgrep", "-f", f"compile_queue.py listen {build_dir}/queue "],
                          capture_output=True).returncode != 0
