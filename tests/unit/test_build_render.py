"""The real cu13/cu129 Dockerfiles: render without Docker or network, pass hadolint, carry every pin,
and run the same steps in the same order as the stack's plan."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from slimeforge.errors import ConfigError
from slimeforge.image.builder.build import parse_build_args, render_dockerfile
from slimeforge.image.builder.buildkit import parse_progress
from slimeforge.image.builder.compilejobs import apex_jobs, compile_jobs, compile_share
from slimeforge.image.builder.install import render_install_script
from slimeforge.image.stack import Stack, load_stack
from slimeforge.image.steps import compiled_key, image_layout, step_commands

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from build_support import render_lock  # noqa: E402

HADOLINT = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")


@pytest.mark.parametrize("flavor", ["cu13", "cu129"])
def test_real_dockerfile_passes_hadolint(flavor, tmp_path):
    path = tmp_path / "Dockerfile"
    path.write_text(render_dockerfile(load_stack(flavor)))
    res = subprocess.run([HADOLINT, "--config", str(ROOT / ".hadolint.yaml"), str(path)], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("flavor", ["cu13", "cu129"])
def test_real_dockerfile_carries_every_pin(flavor):
    stack = load_stack(flavor)
    text = render_dockerfile(stack)
    # Package versions and the router wheel live in the lock (each step bind-mounts its slice);
    # everything else (sources, base, patches) is in the Dockerfile itself.
    in_lock = ("pip.", "slime-req.", "router.")
    missing = {k: v for k,
               v in stack.pins().items() if k != "base.digest" and not k.startswith(in_lock) and v not in text}
    assert missing == {}
    for step in stack.plan:
        if step.kind in ("pip", "source", "wheel_url"):
            assert f"source=lock/{step.name}.txt,target=/tmp/sf-lock/{step.name}.txt" in text, step.name


@pytest.mark.parametrize("flavor", ["cu13", "cu129"])
def test_steps_in_plan_order_one_run_each(flavor):
    stack = load_stack(flavor)
    text = render_dockerfile(stack)
    names = [s.name for s in stack.plan]
    # The plan's order, but for what changes most often, last: slime's requirements stay at slime's
    # place, the patches and slime's checkout come after every other step (steps.PATCHES_STEP).
    order = [f"{n}-requirements" if n == "slime" else n for n in names] + ["patches", "slime"]
    positions = [text.index(f"/opt/slimeforge/sf {n} ") for n in order]
    assert positions == sorted(positions)
    # + venv + finalize, + one stage of its own for each compiled step that compiles here
    staged = [s.name for s in stack.plan if s.compiles and (s.kind, s.requirements) != ("pip",
                                                                                        ())]  # cu13 flash-attn: nothing
    assert text.count("\nRUN ") == len(order) + 2 + len(staged)
    late = text[text.index("/opt/slimeforge/sf patches "):]
    assert "sf slime source_step" in late and "--lock" not in late.split("sf slime source_step")[1].split("\n")[0]
    assert "sf slime-requirements pip_step --venv /opt/venv --step slime --lock /tmp/sf-lock/slime.txt" in text
    assert all(f"sf patches apply_patch {p.file} " in late for p in stack.used_patches())
    # Compiled steps build against the installed torch.
    flash = next(s for s in step_commands(stack, image_layout(stack)) if s.name == "flash-attn")
    assert flash.argv[-2:] == ["--lock", "/tmp/sf-lock/flash-attn.txt"] and flash.lock_file == "flash-attn.txt"


def run_block(text: str, step: str) -> str:
    """The Dockerfile lines of one stack step (its comment header to the next)."""
    return next(b for b in text.split("# --- step ")[1:] if b.split(" (", 1)[0].split(": ", 1)[1] == step)


COMPILED = ["flash-attn", "transformer-engine", "apex", "torch-memory-saver"]


@pytest.mark.parametrize("flavor", ["cu13", "cu129"])
def test_base_gets_the_interpreter_by_version_and_the_venv_uses_it(flavor):
    stack = load_stack(flavor)
    text = render_dockerfile(stack)
    assert stack.python == "3.12"
    assert ("sf system system --python python3.12 --python-package python3.12 --python-package python3.12-venv "
            "--python-package python3.12-dev --need git:git::git ") in run_block(text, "system")
    # The pinned uv comes from the venv step's slice of the lock: its wheel by URL and sha256.
    assert "/opt/slimeforge/sf venv venv /opt/venv 0.9.7 python3.12 /tmp/sf-lock/venv.txt\n" in text
    assert "--mount=type=bind,source=lock/venv.txt,target=/tmp/sf-lock/venv.txt" in run_block(text, "venv")
    # The library calls the interpreter it is given, never a bare python3.
    lib = (ROOT / "templates" / "steps.sh").read_text()
    venv_fn = lib[lib.index("sf_venv() {"):lib.index("\n}\n", lib.index("sf_venv() {"))]
    assert '"$python" -m venv "$venv"' in venv_fn and "python3 -m venv" not in venv_fn


@pytest.mark.parametrize("flavor", ["cu13", "cu129"])
def test_every_compiled_step_gets_every_arch_variable_and_its_own_caches(flavor):
    stack = load_stack(flavor)
    text = render_dockerfile(stack)
    keys = {}
    for name in COMPILED:
        block = run_block(text, name)
        assert "TORCH_CUDA_ARCH_LIST=9.0 FLASH_ATTN_CUDA_ARCHS=90 NVTE_CUDA_ARCHS=90 " in block, name
        key = re.search(rf"sf {name} compiled --key ({re.escape(flavor)}-{name}-[0-9a-f]{{16}}) --venv /opt/venv "
                        r"(--wheels /tmp/sf-compiled/\1 )?-- ",
                        block).group(1)
        assert f"--mount=type=cache,id=sf-uv-{key},target=/root/.cache/uv " in block
        assert f"--mount=type=cache,id=sf-pip-{key},target=/root/.cache/pip " in block
        keys[name] = key
    assert "FLASH_ATTENTION_FORCE_BUILD=TRUE " in run_block(text, "flash-attn")
    # Steps that compile nothing share the one uv cache (their wheels are tagged for what they need).
    assert "--mount=type=cache,target=/root/.cache/uv " in run_block(text, "sglang")
    assert "id=sf-" not in run_block(text, "sglang") and "compiled --key" not in run_block(text, "sglang")
    # Parallelism reaches the compile stages only (one each), not the main stage's later layers.
    # cu13's flash-attn installs nothing: no stage of its own, no share of the budget.
    staged = COMPILED[1:] if flavor == "cu13" else COMPILED
    assert [n for n in COMPILED if f"AS sf-compile-{n}\n" in text] == staged
    assert text.count("ARG MAX_JOBS") == len(staged) and text.rindex("ARG MAX_JOBS") < text.index("# --- step 6: "
                                                                                                  "transformer-engine")


def test_compiled_keys_differ_per_flavor():
    cu13, cu129 = (load_stack(f) for f in ("cu13", "cu129"))
    for name in COMPILED:
        assert compiled_key(cu13, name) != compiled_key(cu129, name)
        assert compiled_key(cu13, name).startswith(f"cu13-{name}-") and compiled_key(cu129,
                                                                                     name).startswith(f"cu129-{name}-")


def derived(tmp_path, name, **fields) -> Stack:
    """cu13 with some fields changed, beside a copy of cu13's lock (valid while the change is not
    an input of the lock, as arch_list is not)."""
    path = tmp_path / f"{name}.yaml"
    (tmp_path / "locks").mkdir(exist_ok=True)
    shutil.copy(ROOT / "images" / "locks" / "pylock.cu13.toml", tmp_path / "locks")
    path.write_text("extends: " + str(ROOT / "images" / "cu13.yaml") + "\n" + "".join(f"{k}: {v}\n" for k,
                                                                                      v in fields.items()))
    return load_stack(path)


@pytest.mark.parametrize("change", [
    {"arch_list": '["9.0", "10.0"]'},
    {"python": '"3.11"'},
    {"cuda": '"13.1"'},
    {"versions": "{torch: '2.11.1'}"},
    {"base": "{image: 'nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04', digest: 'sha256:" + "b" * 64 + "'}"},
])
def test_a_build_relevant_input_changes_every_compiled_key(tmp_path, change):
    hopper = load_stack("cu13")
    other = derived(tmp_path, "other", **change)
    for name in COMPILED:
        assert compiled_key(other, name) != compiled_key(hopper, name), (change, name)
    # The base as resolved at build time (digest or local image id) is an input too.
    assert compiled_key(hopper, "apex", "sha256:" + "c" * 64) != compiled_key(hopper, "apex")


def test_an_unrelated_input_keeps_the_compiled_keys(tmp_path):
    newer_slime = derived(tmp_path, "slime", sources="{slime: {commit: '" + "d" * 40 + "'}}")
    hopper = load_stack("cu13")
    assert [compiled_key(newer_slime, n) for n in COMPILED] == [compiled_key(hopper, n) for n in COMPILED]


def test_blackwell_is_one_arch_list_change_that_reaches_every_compiled_piece(tmp_path):
    hopper = load_stack("cu13")
    both = derived(tmp_path, "blackwell", arch_list='["9.0", "10.0"]')
    before, after = render_dockerfile(hopper), render_dockerfile(both)
    for name in COMPILED:
        block = run_block(after, name)
        assert "TORCH_CUDA_ARCH_LIST='9.0 10.0' FLASH_ATTN_CUDA_ARCHS='90;100' NVTE_CUDA_ARCHS='90;100' " in block, name
        assert f"id=sf-uv-{compiled_key(both, name)}," in block
    # Nothing else moves: the steps before the first compiled one render the same.
    cut = before.index("# --- step 5: flash-attn")
    assert after[after.index("# --- step 1:"):cut] == before[before.index("# --- step 1:"):cut]
    # The install script gets the same variables (its env per step) and keys.
    script = render_install_script(both, "/opt/sf", patches=[], lock=render_lock(both))
    for name in COMPILED:
        line = next(x for x in script.splitlines() if x.startswith(f"sf_run_step {name} "))
        for var in ("'TORCH_CUDA_ARCH_LIST=9.0 10.0'", "'FLASH_ATTN_CUDA_ARCHS=90;100'", "'NVTE_CUDA_ARCHS=90;100'"):
            assert f"--env {var}" in line, (name, var)
        assert f"sf_compiled --key {compiled_key(both, name)} --venv /opt/sf/venv -- " in script


@pytest.mark.parametrize("bad", ['["9"]', '["sm_90"]', '["9.0", "9.0"]', '["9.0;rm"]'])
def test_arch_list_is_validated(tmp_path, bad):
    with pytest.raises(ConfigError) as exc:
        derived(tmp_path, "bad", arch_list=bad)
    assert "arch_list" in str(exc.value)


def test_patches_wait_for_their_own_late_step():
    """A patch (from slime's tree: a slime bump may change it) is bound only into the patches step,
    so its bytes are in no earlier layer's cache key: sglang's and Megatron's layers stay."""
    text = render_dockerfile(load_stack("cu13"))
    for step in ("sglang", "megatron"):
        assert "patches/" not in run_block(text, step) and "--patch " not in run_block(text, step), step
    patches = run_block(text, "patches")
    assert "source=patches/megatron.patch,target=/tmp/sf-patches/megatron.patch" in patches
    assert "sf patches apply_patch megatron.patch git 1 /tmp/sf-patches/megatron.patch /root/Megatron-LM" in patches
    assert ("sf patches apply_patch sglang.patch patch 2 /tmp/sf-patches/sglang.patch "
           "/opt/venv/lib/python3.12/site-packages") in patches


def test_compile_jobs_fit_memory_and_cores():
    assert compile_jobs(mem_bytes=24 << 30, cores=2) == (2, 1)
    assert compile_jobs(mem_bytes=64 << 30, cores=128) == (10, 4)
    assert compile_jobs(mem_bytes=2 << 30, cores=16) == (1, 4)
    # The H100 build host (16 cores, 125 GiB): 16 jobs; apex 8 extensions x 4 jobs (158 s cold,
    # MAX_JOBS=16 alone: over 480 s); a 2-core host: 2 x 2; memory for one job: 2 x 1.
    assert compile_jobs(mem_bytes=125 << 30, cores=16) == (16, 1) and apex_jobs(16) == (8, 4)
    assert apex_jobs(2) == (2, 2) and apex_jobs(1) == (2, 1) and apex_jobs(64) == (32, 4)


def test_build_args_are_validated_together():
    args, problems = parse_build_args(["MAX_JOBS=4", "bad key=1", "noequals"])
    assert args == {"MAX_JOBS": "4"}
    assert [p.value for p in problems] == ["bad key=1", "noequals"]


def test_progress_parser_reads_cache_hits_and_durations():
    lines = [
        "#5 [stage-0 3/5] RUN --mount=type=cache,target=/root/.cache/uv     /opt/slimeforge/sf venv venv /opt/venv "
        "0.9.7",
        "#5 CACHED",
        "#6 [stage-0 4/5] RUN --mount=type=cache,target=/root/.cache/uv     /opt/slimeforge/sf six pip_step --venv "
        "/opt/venv",
        "#6 0.1 slimeforge: step six: pip_step",
        "#6 DONE 1.5s",
        "#7 [stage-0 5/5] COPY stack.lock.json /opt/slimeforge/stack.input.json",
        "#7 DONE 0.0s",
    ]
    steps = parse_progress(lines)
    assert [(s["name"], s["cached"], s["duration_s"]) for s in steps] == [("venv", True, None), ("six", False, 1.5),
                                                                          ("copy", False, 0.0)]


def test_base_given_by_digest_needs_no_docker():
    from slimeforge.image.dockerapi import resolve_base

    ref = "registry.example/cuda@sha256:" + "a" * 64
    base = resolve_base(load_stack("cu13"), ref, dry_run=False)
    assert base.to_json() == {"image": ref, "from": ref, "digest": "sha256:" + "a" * 64,
                              "image_id": None} and base.id == base.digest
    text = render_dockerfile(load_stack("cu13"), base.from_ref)
    assert f"FROM {ref} AS sf-s0\n" in text


def test_a_host_without_a_docker_engine_gets_engine_unavailable(monkeypatch, tmp_path):
    """What a bare-metal install catches to compile in place instead of using the compiled-wheel
    store (install.py): the base's id can only be asked of an engine, and there is none here."""
    from slimeforge.image.dockerapi import EngineUnavailable, docker_client, resolve_base

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(EngineUnavailable, match="docker engine"):
        docker_client()
    with pytest.raises(EngineUnavailable):
        resolve_base(load_stack("tests/stacks/test.yaml"), None, dry_run=True)


@pytest.mark.parametrize("flavor,fa", [("cu13", ["flash_attn.cute"]), ("cu129", ["flash_attn.cute", "flash_attn",
                                                                                 "flash_attn_2_cuda"])])
def test_smoke_imports_every_compiled_piece_and_names_the_gpu_ones(flavor, fa):
    from slimeforge.image.steps import smoke_argv

    stack = load_stack(flavor)
    argv = smoke_argv(stack, image_layout(stack))
    imports = [argv[i + 1] for i, a in enumerate(argv) if a == "--import"]
    gpu = [argv[i + 1] for i, a in enumerate(argv) if a == "--needs-gpu"]
    pieces = [*fa, "transformer_engine.pytorch", "amp_C", "fused_layer_norm_cuda", "torch_memory_saver", "sgl_kernel",
              "flashinfer",
              "megatron.training", "slime.backends.megatron_utils.actor"]
    assert set(pieces) <= set(imports) and set(gpu) <= set(imports)
    assert {"transformer_engine.pytorch", "sgl_kernel", "megatron.training"} <= set(gpu)
    assert argv[argv.index("--versions") + 1] == "/opt/slimeforge/stack.input.json"
    assert (argv[argv.index("--megatron") + 1] == "/root/Megatron-LM" and argv[argv.index("--slime")
                                                                               + 1] == "/root/slime")
    text = render_dockerfile(stack)
    assert "COPY flag_catalog.py kernel_check.py smoke_imports.py venv_sizes.py /opt/slimeforge/" in text
    # the library's, before any step
    assert "COPY steps.sh sf build_wheel.py compile_queue.py venvlock.py venvprune.py /opt/slimeforge/" in text
    # The last step: finalize (its import pass makes the flag catalog and imports the smoke test's
    # modules), then the smoke test on that pass, without --flags (finalize fails when the catalog
    # cannot be made); then the venv's sizes.
    last = text[text.index("ARG SOURCE_DATE_EPOCH"):]
    fin, smoke = last.split("\n    -- ", 1)
    imports = " ".join(a for i in imports for a in ("--import", i))
    assert ("/opt/slimeforge/sf finalize finalize_smoked /opt/venv ") in fin and (
        "--slime /root/slime --megatron /root/Megatron-LM --imports-to /opt/slimeforge/smoke-imports "
        f"{imports} ") in fin
    assert smoke.startswith(f"--venv /opt/venv {imports} ") and "--flags" not in smoke
    assert "--patch megatron.patch:git:1:" in smoke and "--imports-from /opt/slimeforge/smoke-imports \\" in smoke
    assert smoke_argv(stack, image_layout(stack), catalog=False) + ["--imports-from", "/opt/slimeforge/smoke-imports"] \
        == ["smoke", *smoke.split(" \\\n")[0].split(" ")]
    assert text.rstrip().endswith(" \\\n    && /opt/venv/bin/python -I /opt/slimeforge/venv_sizes.py /opt/venv "
                                  "/opt/slimeforge/venv-sizes.json")


def test_base_image_and_tags_are_image_references_before_anything_is_read(tmp_path):
    """--base-image and --tag by the OCI grammar: `-v/:/x` is no image, and never an option."""
    from slimeforge.image.builder.build import BuildOptions, prepare

    opts = BuildOptions(stack="cu13", dry_run=True, base_image="-v/:/x", tags=["-evil", "v1", "reg.example.com/a/b:c"],
                        build_root=tmp_path / "b", echo=lambda _: None)
    with pytest.raises(ConfigError) as err:
        prepare(opts)
    assert [p.where for p in err.value.problems] == ["--base-image", "--tag"] and err.value.problems[1].value == "-evil"
    assert not (tmp_path / "b").exists()


def test_the_build_report_reads_back_what_it_writes_and_names_a_damaged_key():
    from slimeforge.image.builder.buildkit import parse_progress
    from slimeforge.image.builder.buildreport import BuildReport, CompiledWheels, ReportError, StepTiming

    lines = ["#7 [3/9] RUN /opt/slimeforge/sf torch pip_step", "#7 DONE 12.5s",
             "#8 [4/9] RUN /opt/slimeforge/sf apex compiled", "#8 CACHED"]
    report = BuildReport(tag="slimeforge/cu13:0123456789abcdef", human_tags=["slimeforge/cu13:2026.11.1-cu13"],
                         image_id="sha256:" + "1" * 64,
                         build_hash="ab" * 32, stack="cu13-0123", flavor="cu13", base={"image": "b", "from": "b",
                                                                                       "digest": None,
                                                                                       "image_id": None},
                         skipped=False, steps=[StepTiming.from_dict(s) for s in parse_progress(lines)], dir="/b",
                         dockerfile="/b/Dockerfile",
                         lock="/b/stack.lock.json", log="/b/build.log", command=["docker", "build"], size=10**9,
                         build_duration_s=12.5,
                         compiled={"apex": CompiledWheels("cu13-apex-1", "store", True)},
                         published=["r/x@sha256:" + "2" * 64])
    doc = json.loads(json.dumps(report.to_json()))
    assert BuildReport.from_dict(doc) == report
    assert doc["cache"] == {"hits": 1, "steps": 2} and doc["compiled"]["apex"] == {"key": "cu13-apex-1",
                                                                                   "source": "store",
                                                                                   "from_store": True}
    assert "store hit, nothing compiled (cu13-apex-1)" in report.summary_table()
    for key, value, says in [("image_id", None, "`image_id` is missing"), ("human_tags", "x",
                                                                           "`human_tags` has type str, expected list"),
                             ("size", "big", "`size` has type str, expected int"), ("build_duration_s", True,
                                                                                    "`build_duration_s` has type "
                                                                                    "bool")]:
        with pytest.raises(ReportError, match=says):
            BuildReport.from_dict({**doc, key: value})


def test_compile_stages_share_the_host():
    from slimeforge.image.builder.build import compile_pieces

    # The pieces BuildKit compiles at once: cu13's three (its flash-attn installs nothing), cu129's four;
    # store hits compile nothing.
    assert compile_pieces(load_stack("cu13"), {}) == 3 and compile_pieces(load_stack("cu129"), {}) == 4
    assert compile_pieces(load_stack("cu13"), dict.fromkeys(COMPILED, "use")) == 1
    # Their share on the H100 host: 6 jobs each (memory: 125 GiB / 3 over 6 GiB a job), apex 3 x 4;
    # on this 2-core machine two at a time with one job each, so both cores stay busy as in series.
    assert compile_share(3, 125 << 30, 16) == (3, 6, 1) and apex_jobs(6) == (3, 4)
    assert compile_share(3, 24 << 30, 2) == (2, 1, 1) and compile_share(1, 125 << 30, 16) == (1, 16, 1)
    # One piece alone gets the whole host, as before.
    assert compile_share(1, 24 << 30, 2)[1:] == compile_jobs(24 << 30, 2)


@pytest.mark.parametrize("flavor", ["cu13", "cu129"])
def test_compile_stages_depend_on_the_steps_before_them_only(flavor):
    """BuildKit builds stages that do not depend on each other at once: each compile stage starts
    FROM the stage of the steps before the compiled ones and reads no other stage; the main stage
    installs from each in step order."""
    text = render_dockerfile(load_stack(flavor))
    stages = re.findall(r"^FROM (\S+) AS (\S+)$", text, re.M)
    compile_stages = [(parent, name) for parent, name in stages if name.startswith("sf-compile-")]
    assert compile_stages and all(parent == "sf-s0" for parent, _ in compile_stages)
    blocks = text.split("\nFROM ")
    for block in blocks:
        if block.split(" AS ", 1)[-1].startswith("sf-compile-"):
            assert "from=sf-compile-" not in block and "SF_COMPILED_PHASE=compile " in block
    main = blocks[[i for i, b in enumerate(blocks) if b.startswith("sf-s0 AS sf-s1")][0]]
    order = re.findall(r"--mount=type=bind,from=(sf-compile-\S+?),", main)
    assert order == [name for _, name in compile_stages]  # installed in step order


def test_the_image_compiles_behind_one_queue_where_the_install_would():
    from slimeforge.image.builder.compilequeue import queue_slots, stage_build_args

    three = ["transformer-engine", "apex", "torch-memory-saver"]
    host, small = {"mem_bytes": 125 << 30, "cores": 16}, {"mem_bytes": 24 << 30, "cores": 2}
    # The install's rule: 16 or more compile jobs and at least two pieces: the queue's slots (22 there).
    assert queue_slots(three, {}, {}, **host) == 22 and queue_slots(three[:1], {}, {}, **host) is None
    assert queue_slots(three, {}, {}, **small) is None
    # Asked for (any host, one piece too), refused, or not with flash-attn (its jobs need 6 GiB).
    assert queue_slots(three, {}, {"SF_COMPILE_POOL": "queue"}, **small) == 2
    assert queue_slots(three[:1], {}, {"SF_COMPILE_POOL": "queue"}, **small) == 2
    assert queue_slots(three, {}, {"SF_COMPILE_POOL": "0"}, **host) is None
    assert queue_slots([*three, "flash-attn"], {}, {"SF_COMPILE_POOL": "queue"}, **host) is None
    # A build sized by hand (any of the three parallelism build args) gets no queue.
    assert queue_slots(three, {"MAX_JOBS": "8"}, {"SF_COMPILE_POOL": "queue"}, **host) is None
    assert queue_slots([], {}, {"SF_COMPILE_POOL": "queue"}, **host) is None
    with pytest.raises(ConfigError, match=r"SF_COMPILE_POOL: is not a compile scheme \(got 'yes'\)"):
        queue_slots(three, {}, {"SF_COMPILE_POOL": "yes"}, **host)
    assert stage_build_args() == {"MAX_JOBS": "64", "NVCC_THREADS": "1", "APEX_PARALLEL_BUILD": "16"}


def test_compile_stages_mount_the_builds_queue_only_when_it_serves_one():
    stack = load_stack("cu13")
    store = dict.fromkeys(COMPILED, "make")
    plain, queued = (render_dockerfile(stack, store=store, wheels_only=True, compile_queue=q) for q in (False, True))
    assert "type=ssh" not in plain and "SF_COMPILE_QUEUE_SOCK" not in plain
    blocks = [b for b in queued.split("\nFROM ") if b.split(" AS ", 1)[-1].startswith("sf-compile-")]
    assert len(blocks) == 3
    for block in blocks:
        assert "--mount=type=ssh,id=sf-queue,target=/run/sf-queue.sock \\\n" in block
        assert "SF_COMPILED_PHASE=compile SF_COMPILE_QUEUE_SOCK=/run/sf-queue.sock " in block
    # Nothing else differs: the stages before and the export are the same lines.
    unqueued = [ln.replace("SF_COMPILE_QUEUE_SOCK=/run/sf-queue.sock ", "") for ln in queued.splitlines()
                if "type=ssh" not in ln and not ln.startswith("#")]
    assert unqueued == [ln for ln in plain.splitlines() if not ln.startswith("#")]
