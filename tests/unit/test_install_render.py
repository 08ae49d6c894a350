"""The install script: rendered from the same steps as the Dockerfile (drift guard), and the CLI's dry run (valid bash,
shellcheck-clean, prerequisites in front: tests/integration/heavy/test_install_render_shellcheck.py)."""

from __future__ import annotations

import base64
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from slimeforge.image.builder.build import render_dockerfile
from slimeforge.image.builder.install import render_install_script
from slimeforge.image.stack import load_stack
from slimeforge.image.steps import host_layout, image_layout, lock_files

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import build_support as bs  # noqa: E402
from build_support import placeholder_patches, render_lock  # noqa: E402
from lock_support import fresh_clone_stack  # noqa: E402


def normalise(argv: list[str], layout) -> list[str]:
    subs = sorted([(layout.venv, "<venv>"), (layout.patches_dir, "<patches>"), (layout.state, "<state>"),
                   (layout.root + "/", "<root>/"),
                   (layout.lock_dir, "<lock>")]
                  + [(u, "<url>") for u in layout.source_urls.values()], key=lambda x: -len(x[0]))
    out = []
    for a in argv:
        for old, new in subs:
            a = a.replace(old, new)
        out.append(a)
    return out


def dockerfile_steps(text: str, layout) -> list[tuple[str, list[list[str]]]]:
    joined = text.replace("\\\n", " ")
    steps = []
    for line in joined.splitlines():
        # The compile stages' RUNs (SF_COMPILED_PHASE=compile) are the same steps compiled side by side.
        if (not line.startswith("RUN ") or "/opt/slimeforge/sf " not in line
                or " finalize finalize_smoked " in line or "SF_COMPILED_PHASE=compile" in line):
            continue
        # The main stage installs a compiled step's wheels from its compile stage (--wheels DIR);
        # the install script's step compiles them itself in its two phases (sf_run_together).
        line = re.sub(r" --wheels /tmp/sf-compiled/\S+", "", line)
        cmds = [shlex.split(part.split("/opt/slimeforge/sf ", 1)[1]) for part in line.split(" && ")]
        steps.append((cmds[0][0], [normalise(c[1:], layout) for c in cmds]))
    return steps


def script_steps(text: str, layout) -> list[tuple[str, list[list[str]]]]:
    bodies = {m.group(1): m.group(2) for m in re.finditer(r"^sf_step_(\w+)\(\) \{\n(.*?)^\}", text, re.S | re.M)}
    order = re.findall(r"^sf_run_step (\S+) \S+ .*-- sf_step_(\w+)$", text, re.M)
    steps = []
    for name, fn in order:
        if name == "finalize":
            continue
        cmds = [shlex.split(line.strip()) for line in bodies[fn].strip().splitlines()]
        steps.append((name, [normalise([c[0].removeprefix("sf_"), *c[1:]], layout) for c in cmds]))
    return steps


@pytest.mark.parametrize("flavor", ["cu13", "cu129", str(bs.TEST_STACK)])
def test_dockerfile_and_install_script_hold_the_same_steps(flavor):
    stack = load_stack(flavor)
    docker = dockerfile_steps(render_dockerfile(stack), image_layout(stack))
    lock = render_lock(stack)
    script_text = render_install_script(stack, "/opt/slime", patches=placeholder_patches(stack), lock=lock)
    script = script_steps(script_text, host_layout(stack, "/opt/slime", None, None))
    assert docker == script
    # + venv, + the patches step (when a patch waits for it), + slime's requirements apart from its checkout
    late = [n for n in ("slime-requirements", "patches") if any(name == n for name, _ in script)]
    assert len(script) == len(stack.plan) + 1 + len(late) and late == ["slime-requirements", "patches"]
    for value in (v for k, v in stack.pins().items() if k.startswith("source.")):
        assert value in script_text
    for name, text in lock_files(stack, lock, host_layout(stack, "/opt/slime", None, None)).items():
        # every slice travels in the script
        assert base64.encodebytes(text.encode()).decode().rstrip("\n") in script_text, name


def test_cli_dry_run_renders_and_prints_the_path(tmp_path):
    repos = bs.make_repos(tmp_path / "repos")
    res = subprocess.run([sys.executable, "-m", "invoke", "install", "--stack", str(bs.TEST_STACK), "--prefix",
                          str(tmp_path / "p"), "--dry-run", "--source", f"slime={repos['slime']}",
                          "--source", f"libdemo={repos['libdemo']}"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "the install needs about" in res.stdout  # the disk need, from the lock
    script = Path(res.stdout.strip().splitlines()[-1])  # after the warnings (the test base has no registry digest)
    assert script == tmp_path / "p" / ".slimeforge" / "install" / "install.sh" and script.is_file()
    assert not (tmp_path / "p" / "venv").exists()


def test_prerequisite_failure_lists_every_problem_before_step_one(tmp_path):
    stack = load_stack("cu13")
    path = tmp_path / "install.sh"
    path.write_text(render_install_script(stack, str(tmp_path / "p"), patches=placeholder_patches(stack),
                                          lock=render_lock(stack)))
    res = subprocess.run(["bash", str(path)], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "CUDA_HOME": str(tmp_path / "nocuda")})
    assert res.returncode == 2
    assert "prerequisite: CUDA: no nvcc at" in res.stderr and "nvidia-smi not found" in res.stderr
    assert "step " not in res.stderr.replace("the system step installs it", "")


@pytest.mark.parametrize("flavor", ["cu13", "cu129"])
def test_install_script_carries_interpreter_arch_variables_and_compiled_keys(flavor):
    from slimeforge.image.steps import compiled_key

    stack = load_stack(flavor)
    text = render_install_script(stack, "/opt/slime", patches=placeholder_patches(stack), lock=render_lock(stack))
    assert ("  sf_system --python python3.12 --python-package python3.12 --python-package python3.12-venv "
            "--python-package python3.12-dev --need git:git::git ") in text
    assert "  sf_venv /opt/slime/venv 0.9.7 python3.12 /opt/slime/.slimeforge/lock-in/venv.txt\n" in text
    assert "want_python=3.12" in text and "PYTHON=python3.12\n" in text and '"$PYTHON" -c' in text
    for name in ("flash-attn", "transformer-engine", "apex", "torch-memory-saver"):
        line = next(x for x in text.splitlines() if x.startswith(f"sf_run_step {name} "))
        for var in ("TORCH_CUDA_ARCH_LIST=9.0", "FLASH_ATTN_CUDA_ARCHS=90", "NVTE_CUDA_ARCHS=90"):
            assert f"--env {var} " in line, (name, var)
        key = compiled_key(stack, name)
        assert key.startswith(f"{flavor}-{name}-") and f"  sf_compiled --key {key} --venv /opt/slime/venv -- " in text
    flash = next(x for x in text.splitlines() if x.startswith("sf_run_step flash-attn "))
    assert "--env FLASH_ATTENTION_FORCE_BUILD=TRUE " in flash
    # The scripts the venv's Python runs are written next to the records, as in every image.
    # And the compile queue with its cost table (the install serves the queue: sf_queue_open), and the
    # compiled steps' front end (build_wheel.py).
    for i, name in enumerate(("build_wheel.py", "compile_costs.json", "compile_queue.py", "flag_catalog.py",
                              "kernel_check.py", "smoke_imports.py", "venvlock.py", "venvprune.py"), 1):
        assert f"base64 -d >\"$SF_STATE/\"{name} <<'SF_SCRIPT_{i}'" in text
    # finalize makes the flag catalog in the smoke test's import pass, which the smoke test reports.
    fin = next(x for x in text.splitlines() if x.startswith("  sf_finalize "))
    assert " --imports-to /opt/slime/.slimeforge/smoke-imports --import torch " in fin and " --preload torch" in fin
    assert "flags_now+=(--imports-from /opt/slime/.slimeforge/smoke-imports)" in text


# --- the hosts people have: their interpreter, their toolkit, the disk the lock needs ----------------


@pytest.mark.parametrize("value, ok", [
    ("/root/.pyenv/versions/3.12.1/bin/python3.12", True), ("/opt/conda/envs/x/bin/python", True), ("python3.12", True),
    ("python3", True), ("--version", False), ("python3.12 -c x", False), ("/opt/../bin/python", False),
    ("./python", False), ("python", False), ("/opt/py\nthon", False), ("relative/python3.12", False),
])
def test_the_python_option_is_a_path_or_an_interpreter_name(value, ok):
    from slimeforge.image.builder.install import python_problem

    assert (python_problem(value) is None) is ok


def test_the_disk_need_comes_from_the_lock_and_reaches_the_script():
    from slimeforge.image.builder.install import disk_need
    from slimeforge.image.lock.lockcheck import checked_lock

    stack = load_stack("cu13")
    download, need = disk_need(stack, checked_lock(stack))
    assert 4e9 < download < 7e9  # the cu13 lock's files: 5.1 GB
    assert need == int(-(-download * 2.5 // (1 << 30))) + 3  # unpacked, sources and logs, compile scratch
    text = render_install_script(stack, "/opt/slime", patches=placeholder_patches(stack), lock=render_lock(stack))
    assert f"disk_gib={need}" in text and "80" not in re.findall(r"disk_gib=(\d+)", text)


def fake_toolkit(tmp_path: Path, headers: list[str]) -> Path:
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "include").mkdir()
    for h in headers:
        (cuda / "include" / h).write_text("")
    nvcc = cuda / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(0o755)
    return cuda


def test_prerequisites_name_headers_neither_the_toolkit_nor_the_lock_provides(tmp_path):
    stack = load_stack("cu13")
    lock = render_lock(stack)
    # Headers whose wheels the lock does not hold (as if a flavor dropped them): the toolkit must have them.
    stack.compile_headers.update({"cusparse.h": "nvidia-not-locked", "nccl.h": "nvidia-not-locked-either"})
    text = render_install_script(stack, str(tmp_path / "p"), patches=placeholder_patches(stack), lock=lock,
                                 python=sys.executable if sys.version_info[:2] == (3, 12) else None)
    path = tmp_path / "install.sh"
    path.write_text(text)
    cuda = fake_toolkit(tmp_path, ["nccl.h"])
    res = subprocess.run(["bash", str(path)], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "CUDA_HOME": str(cuda), "SLIMEFORGE_MIN_FREE_GIB": "0"})
    assert res.returncode == 2
    assert "prerequisite: CUDA: cusparse.h is not in the toolkit" in res.stderr
    assert "nccl.h" not in res.stderr  # the toolkit has it
    assert "step " not in res.stderr.replace("the system step installs it", "")


def test_an_interpreter_given_by_path_that_is_not_there_is_a_prerequisite_failure(tmp_path):
    stack = load_stack("cu13")
    path = tmp_path / "install.sh"
    path.write_text(render_install_script(stack, str(tmp_path / "p"), patches=placeholder_patches(stack),
                                          lock=render_lock(stack), python="/nowhere/bin/python3.12"))
    res = subprocess.run(["bash", str(path)], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "CUDA_HOME": str(fake_toolkit(tmp_path, []))})
    assert res.returncode == 2
    assert "prerequisite: python: /nowhere/bin/python3.12 not found" in res.stderr and "--python" in res.stderr
    assert "sf_venv" not in res.stderr


def test_the_disk_need_can_be_overridden_and_a_bad_override_is_named(tmp_path):
    stack = load_stack("cu13")
    path = tmp_path / "install.sh"
    path.write_text(render_install_script(stack, str(tmp_path / "p"), patches=placeholder_patches(stack),
                                          lock=render_lock(stack)))
    env = {"PATH": "/usr/bin:/bin", "CUDA_HOME": str(fake_toolkit(tmp_path, []))}
    huge = subprocess.run(["bash", str(path)], capture_output=True, text=True,
                          env={**env, "SLIMEFORGE_MIN_FREE_GIB": "100000"})
    assert "the install needs about 100000 GiB" in huge.stderr
    bad = subprocess.run(["bash", str(path)], capture_output=True, text=True,
                         env={**env, "SLIMEFORGE_MIN_FREE_GIB": "1; rm -rf /"})
    assert "SLIMEFORGE_MIN_FREE_GIB: '1; rm -rf /' is not a whole number of GiB" in bad.stderr
    # bash reads 099999 as octal (an arithmetic error that skipped the check): base 10 it is.
    octal = subprocess.run(["bash", str(path)], capture_output=True, text=True,
                           env={**env, "SLIMEFORGE_MIN_FREE_GIB": "099999"})
    assert ("the install needs about 099999 GiB" in octal.stderr
            and "value too great for base" not in octal.stderr), octal.stderr
    for odd in ("\u00b2", "1e3", "-1", "1234567"):
        res = subprocess.run(["bash", str(path)], capture_output=True, text=True,
                             env={**env, "SLIMEFORGE_MIN_FREE_GIB": odd})
        assert f"SLIMEFORGE_MIN_FREE_GIB: '{odd}' is not a whole number of GiB" in res.stderr, res.stderr


@pytest.mark.parametrize("option, value, says", [
    ("--python", "py thon", "--python: is neither an absolute path nor an interpreter name"),
    ("--python", "bin/python3.12", "--python: is neither an absolute path nor an interpreter name"),
    ("--min-free-gb", "lots", "--min-free-gb: is not a whole number (got 'lots')"),
    # str.isdigit() took it, int() raised
    ("--min-free-gb", "\u00b2", "--min-free-gb: is not a whole number (got '\u00b2')"),
    ("--min-free-gb", "1000000", "--min-free-gb: is out of range (0..999999)"),
])
def test_cli_refuses_a_bad_interpreter_or_disk_option_before_anything(tmp_path, option, value, says):
    res = subprocess.run([sys.executable, "-m", "invoke", "install", "--stack", str(bs.TEST_STACK), "--prefix",
                          str(tmp_path / "p"), "--dry-run", f"{option}={value}"],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2, res.stderr
    assert says in res.stderr
    assert not (tmp_path / "p").exists()


def test_dry_runs_render_on_a_fresh_clone_naming_each_missing_outside_fact(tmp_path):
    from slimeforge.image.builder.build import BuildOptions, prepare
    from slimeforge.image.builder.install import InstallOptions, install

    path = fresh_clone_stack(tmp_path)
    lock_text = (tmp_path / "locks" / "pylock.cu13.toml").read_text()
    lines: list[str] = []
    script = install(InstallOptions(stack=str(path), prefix=str(tmp_path / "p"), dry_run=True, use_store=False,
                                    echo=lines.append))
    warnings = [line for line in lines if line.startswith("warning: ")]
    assert [w.split(" is missing from ")[0] for w in warnings[:2]] == ["warning: the router wheel's sha256",
                                                                       "warning: the base image's digest"]
    assert f"`invoke lock --stack {path} --complete` downloads" in warnings[0]
    assert (warnings[2].startswith("warning: the patch files cannot be read")
            and "pass --source slime=PATH" in warnings[2])
    text = script.read_text()
    slices = {m.group(1): base64.b64decode(m.group(2)).decode()
              for m in re.finditer(r"base64 -d >\S*/(\S+?\.txt)'? <<'SF_SLICE_\d+'\n(.*?)\nSF_SLICE", text, re.S)}
    # uv --require-hashes refuses it if run
    assert slices["router.txt"].startswith("# MISSING: the router wheel's sha256")
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    lines.clear()
    p = prepare(BuildOptions(stack=str(path), dry_run=True, build_root=tmp_path / "b", echo=lines.append))
    assert p.provisional and sum(line.startswith("warning: ") for line in lines) >= 3
    assert (p.dir / "context" / "lock" / "router.txt").read_text().startswith("# MISSING")
    assert not (p.dir / "context" / "patches").exists()  # the stand-ins are named, never written
    assert (tmp_path / "locks" / "pylock.cu13.toml").read_text() == lock_text  # a dry run writes no lock


@pytest.mark.parametrize("driver", ["575.51.03", "579.99", "580.00", "580.95.05", "600.1"])
def test_the_install_scripts_driver_check_and_doctors_agree(tmp_path, driver):
    """The driver minimum is the stack's (driver_min); install.sh must compare in bash (it runs
    before any Python of ours), so this pair test holds its copy of the rule to doctor's."""
    from slimeforge.run.preflight.findings import ERROR
    from slimeforge.run.preflight.host import Gpu, driver_findings

    stack = load_stack("cu13")
    path = tmp_path / "install.sh"
    path.write_text(render_install_script(stack, str(tmp_path / "p"), patches=placeholder_patches(stack),
                                          lock=render_lock(stack)))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f'#!/bin/sh\ncase "$*" in *driver_version*) echo {driver}; exit 0 ;; esac\n'
                                        'exit 9\n')
    (bin_dir / "nvidia-smi").chmod(0o755)
    res = subprocess.run(["bash", str(path)], capture_output=True, text=True,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin", "CUDA_HOME": str(tmp_path / "nocuda")})
    assert res.returncode == 2 and "prerequisite: CUDA: no nvcc" in res.stderr  # the prerequisites ran, and refused
    script_refuses = f"NVIDIA driver {driver} is older than R{stack.driver_min}" in res.stderr
    doctor_refuses = driver_findings([Gpu(0, "H100", "GPU-1", driver, 81559, "9.0")], stack)[0].level == ERROR
    assert script_refuses == doctor_refuses == (int(driver.split(".")[0]) < stack.driver_min)


@pytest.mark.parametrize("value", ["0", "007", "100000", "999999", "1000000", "-1", "12 ", "lots", "\u00b2"])
def test_min_free_gb_has_one_rule_for_the_option_and_the_scripts_variable(tmp_path, value):
    """--min-free-gb (install.py) and SLIMEFORGE_MIN_FREE_GIB (install.sh, which a user may set
    alone) accept the same values: the script renders the option's bound, this pair test holds them."""
    from slimeforge.image.builder.install import MAX_FREE_GIB
    from slimeforge.schema import whole_problem

    stack = load_stack("cu13")
    path = tmp_path / "install.sh"
    path.write_text(render_install_script(stack, str(tmp_path / "p"), patches=placeholder_patches(stack),
                                          lock=render_lock(stack)))
    res = subprocess.run(["bash", str(path)], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "CUDA_HOME": str(tmp_path / "nocuda"),
                              "SLIMEFORGE_MIN_FREE_GIB": value})
    assert res.returncode == 2 and "prerequisite: CUDA: no nvcc" in res.stderr  # the prerequisites ran, and refused
    script_refuses = "SLIMEFORGE_MIN_FREE_GIB: " in res.stderr
    option_refuses = whole_problem(value, "--min-free-gb", 0, MAX_FREE_GIB, "GiB") is not None
    assert script_refuses == option_refuses == (value not in ("0", "007", "100000", "999999")), res.stderr


def _plan_keys(stack, lock, store: Path) -> dict[str, str]:
    from slimeforge.image.builder.install import store_plan

    return store_plan(stack, "/opt/slime/.slimeforge", placeholder_patches(stack), lock, store, echo=lambda s: None)[1]


def test_the_install_keys_never_depend_on_a_local_docker_image(tmp_path, monkeypatch):
    """The bare-metal install uses no image: its compiled keys hold the base by its pinned digest, or
    by the stack's name for it, never a local image's id (with one present, TE and apex got other
    keys and compiled again). No Docker Engine is asked: an unreachable one changes nothing."""
    from slimeforge.image.steps import compiled_key

    stack = load_stack("cu13")
    lock = render_lock(stack)
    lock.tool["base"] = {"image": stack.base.image, "digest": ""}
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    unpinned = _plan_keys(stack, lock, tmp_path / "store")
    patch_sums = {p.file: p.sha256 for p in placeholder_patches(stack)}
    assert unpinned == {n: compiled_key(stack, n, None, patch_sums) for n in unpinned}
    assert set(unpinned) == {"transformer-engine", "apex", "torch-memory-saver"}
    # A digest pinned in the lock: the keys are an image build's on that base (resolve_base takes the digest).
    from slimeforge.image.dockerapi import resolve_base

    digest = "sha256:" + "ab" * 32
    lock.tool["base"]["digest"] = digest
    pinned = _plan_keys(stack, lock, tmp_path / "store")
    base = resolve_base(stack, None, True, digest)
    assert pinned == {n: compiled_key(stack, n, base.id, patch_sums) for n in pinned}
    assert pinned != unpinned


def _cu13_script(tmp_path: Path, prefix: str = "/opt/slime", lock=None) -> tuple[str, str]:
    stack = load_stack("cu13")
    text = render_install_script(stack, prefix, patches=placeholder_patches(stack), lock=lock or render_lock(stack))
    found = re.search(r"sf_smoke_record ([0-9a-f]{64})\n", text)
    assert found
    return text, found.group(1)


def test_the_smoke_record_hash_follows_every_input(tmp_path):
    text, same = _cu13_script(tmp_path)
    assert _cu13_script(tmp_path)[1] == same  # rendered again with nothing changed: the same
    assert f"sf_smoke_recorded {same}; then" in text
    assert _cu13_script(tmp_path, prefix="/opt/other")[1] != same  # the smoke test's own arguments
    lock = render_lock(load_stack("cu13"))
    name = next(n for n in lock.steps["torch"] if lock.packages[n].kind == "wheel")
    # one step's slice of the lock: that step and every later one, the smoke test too
    lock.packages[name].sha256 = "0" * 64
    assert _cu13_script(tmp_path, lock=lock)[1] != same


@pytest.mark.parametrize("args, env, says", [
    (["--verfy"], {}, "install.sh: unknown argument --verfy (accepted: --verify)"),
    (["--"], {}, "install.sh: unknown argument -- (accepted: --verify)"),
    ([], {"SLIMEFORGE_VERIFY": "yes"}, "SLIMEFORGE_VERIFY: yes is not 0 or 1"),
    ([], {"SLIMEFORGE_VERIFY": "1\n"}, "SLIMEFORGE_VERIFY: $'1\\n' is not 0 or 1"),
])
def test_the_script_refuses_an_unknown_argument_before_anything(tmp_path, args, env, says):
    text, _ = _cu13_script(tmp_path, prefix=str(tmp_path / "p"))
    (tmp_path / "install.sh").write_text(text)
    res = subprocess.run(["bash", str(tmp_path / "install.sh"), *args], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", **env})
    assert res.returncode == 2 and says in res.stderr, res.stderr
    assert "prerequisite" not in res.stderr and not (tmp_path / "p").exists()


@pytest.mark.parametrize("verify", [False, True])
def test_install_verify_reaches_the_script_as_its_variable(tmp_path, verify):
    """`invoke install --verify` runs the script with SLIMEFORGE_VERIFY=1 (the script's own
    `--verify`, tested with real bash in tests/integration/test_install.py)."""
    from dataclasses import dataclass, field

    from slimeforge.image.builder.install import InstallOptions, install
    from slimeforge.proc import Result, Runner

    @dataclass
    class Recorder(Runner):  # the runner injection point of slimeforge.proc; records instead of running the script
        envs: list = field(default_factory=list)

        def run(self, argv, **kw):
            self.envs.append(kw.get("env"))
            return Result(list(argv), 0, "", "")

    repos = bs.make_repos(tmp_path / "repos")
    runner = Recorder()
    install(InstallOptions(stack=str(bs.TEST_STACK), prefix=str(tmp_path / "p"), use_store=False, verify=verify,
                           echo=lambda s: None, sources=[f"slime={repos['slime']}", f"libdemo={repos['libdemo']}"],
                           runner=runner))
    assert runner.envs == [{"SLIMEFORGE_VERIFY": "1"} if verify else None]


def test_a_compiled_steps_hash_does_not_depend_on_where_its_wheels_come_from(tmp_path):
    """A cold install compiles (--wheel-out) and stores; its re-run finds the key in the store
    (--wheels): the same wheels by key, so no step may run again (they all did: 187 s on cu13)."""
    stack = load_stack("cu13")
    names = ("transformer-engine", "apex", "torch-memory-saver")

    def hashes(mode: str) -> dict[str, str]:
        store = {n: (mode, f"/{mode}/{n}") for n in names}
        text = render_install_script(stack, "/opt/slime", patches=placeholder_patches(stack), lock=render_lock(stack),
                                     store=store)
        return dict(re.findall(r"^sf_run_step (\S+) ([0-9a-f]{64}) ", text, re.M))

    made, used = hashes("make"), hashes("use")
    plain = render_install_script(stack, "/opt/slime", patches=placeholder_patches(stack), lock=render_lock(stack))
    assert made == used and made == dict(re.findall(r"^sf_run_step (\S+) ([0-9a-f]{64}) ", plain, re.M))
    # the script still says where
    assert "--wheels /use/apex" in render_install_script(stack, "/opt/slime", patches=placeholder_patches(stack),
                                                         lock=render_lock(stack), store={"apex": ("use", "/use/apex")})
