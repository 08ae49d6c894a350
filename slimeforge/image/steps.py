"""The stack's ordered steps as calls of the shared step library (templates/steps.sh).

`step_commands()` turns `Stack.plan` into one argv per step (`sf <step> <function> args...`).
The Dockerfile renders each as a RUN, the bare-metal install script as a resumable step; both get
their commands from here, so the two paths run the same functions with the same pins in the same
order. Only the locations differ (`StepLayout`): where checkouts, the venv and patch files live, and
where each source is fetched from.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from .. import paths
from ..scripts import venvprune
from .lock.lockfile import LockFile, expected_versions, router_requirement, step_requirements, uv_requirement
from .sources import LocalSource
from .stack import (
    PATCHES_STEP,
    REQUIREMENTS_SUFFIX,
    VENV_STEP,
    AptStep,
    PatchFile,
    PipStep,
    Stack,
    WheelUrlStep,
)

STEP_RUNNER = paths.TEMPLATES / "sf"
# Scripts the step library runs with the target's Python (standard library only; kernel_check.py also
# torch, which the venv has); the image gets them in /opt/slimeforge, the install script writes them
# to SF_STATE.
TARGET_SCRIPTS = {name: paths.SCRIPTS / name for name in ("flag_catalog.py", "kernel_check.py", "smoke_imports.py")}
# Run only in images, by the last RUN (after finalize): the venv's largest directories, for the build report.
IMAGE_SCRIPTS = {name: paths.SCRIPTS / name for name in ("venv_sizes.py",)}
VENV_SIZES_RECORD = "venv-sizes.json"
# The step library's own Python (the venv against the lock: every step runs it), copied with the
# library before the first step: a change to it re-does every step, as a change to steps.sh does.
# venvprune.py: a pip step's prune of GPU code for archs outside arch_list, and verify's check of it.
# build_wheel.py: a compiled step's wheel, its backend called once (templates/steps.sh `_sf_store_make`).
# compile_queue.py: the compile queue's wrappers (an image's compile stage makes its own, for the queue
# invoke build serves; install.sh serves the queue itself).
LIBRARY_SCRIPTS = {name: paths.SCRIPTS / name
                   for name in ("venvlock.py", "venvprune.py", "build_wheel.py", "compile_queue.py")}
# The queue's table of measured compile costs: read where the queue is served (install.sh; invoke build
# reads it from the package).
INSTALL_SCRIPTS = {name: paths.SCRIPTS / name for name in ("compile_costs.json",)}

@dataclass
class StepLayout:
    root: str  # checkouts land at <root>/<source dir>
    venv: str
    patches_dir: str  # where the patch files lie when a step runs
    state: str  # SF_STATE: records, each step's slice of the lock, the read-back lock, flags
    source_urls: dict[str, str] = field(default_factory=dict)  # name -> where to fetch it from
    wheel_dirs: dict[str, str] = field(default_factory=dict)  # pip step -> wheel directory (--no-index)
    lock_dir: str = "/tmp/sf-lock"  # where each step's slice of the lock lies when the step runs
    python: str | None = None  # the interpreter the venv is made with (default: the stack's, by its version)

    def source_dir(self, stack: Stack, name: str) -> str:
        return f"{self.root}/{stack.sources[name].dir}"


def image_layout(stack: Stack, local_sources: dict[str, LocalSource] | None = None) -> StepLayout:
    """In images, a local source is bind-mounted from the build context at /tmp/sf-src/<name>.git."""
    local = local_sources or {}
    urls = {n: s.git for n, s in stack.sources.items()}
    urls.update({n: f"/tmp/sf-src/{n}.git" for n, s in local.items() if getattr(s, "kind", "git") == "git"})
    wheels = {n: f"/tmp/sf-wheels/{n}" for n, s in local.items() if getattr(s, "kind", "git") == "wheels"}
    return StepLayout(stack.image_root, stack.venv, "/tmp/sf-patches", paths.IMAGE_STATE, urls, wheels, "/tmp/sf-lock")


def host_layout(stack: Stack, prefix: str, venv: str | None = None, sources: dict[str, LocalSource] | None = None,
                python: str | None = None) -> StepLayout:
    """On a host (paths.Prefix): checkouts under the prefix, records in <prefix>/.slimeforge, local
    sources fetched straight from the given checkouts (only read); `python`: the user's interpreter
    (`invoke install --python`), else the stack's by its version on PATH."""
    local = sources or {}
    p = paths.Prefix.at(prefix)
    urls = {n: s.git for n, s in stack.sources.items()}
    urls.update({n: str(s.path) for n, s in local.items() if s.kind == "git"})
    wheels = {n: str(s.path) for n, s in local.items() if s.kind == "wheels"}
    return StepLayout(p.root, venv or p.venv, f"{p.state}/patches", p.state, urls, wheels, f"{p.state}/lock-in", python)


def arch_env(stack: Stack) -> dict[str, str]:
    """The stack's arch_list in the variable and spelling each compiled piece reads, so that one
    arch_list change (add "10.0" for Blackwell) reaches all of them: torch's cpp_extension (apex,
    torch_memory_saver) reads TORCH_CUDA_ARCH_LIST ("9.0 10.0"); flash-attn's setup.py reads
    FLASH_ATTN_CUDA_ARCHS ("90;100", its default 80;90;100;120 otherwise); Transformer Engine's
    build reads NVTE_CUDA_ARCHS ("90;100")."""
    if not stack.arch_list:
        return {}
    sm = ";".join(a.replace(".", "") for a in stack.arch_list)
    return {"TORCH_CUDA_ARCH_LIST": " ".join(stack.arch_list), "FLASH_ATTN_CUDA_ARCHS": sm, "NVTE_CUDA_ARCHS": sm}


def compiled_key(stack: Stack, step: str, base: str | None = None, patch_sha: dict[str, str] | None = None) -> str:
    """The identity of what a compiled step builds: flavor, torch, CUDA, arch list, Python, base
    and the step's own inputs (pins, source commit, env, patch files with their sha256 when given).
    Nothing else: slime's commit is not in it, so a new slime commit reuses the compiled wheels.
    A compiled wheel may be reused only under the same key: uv reuses a wheel built with
    --no-build-isolation in another environment as-is, so a shared cache would hand one
    torch/CUDA/arch's build to another. The image build names its cache mounts with it, the
    install script its uv cache directory, the compiled-wheel store (wheelstore.py) its entries.
    `base` is the base as resolved (digest or local image id); default: the stack's base image and
    pinned digest. `patch_sha`: file -> sha256 of the patch files (patches.read_patches)."""
    item = stack.plan_step(step)
    inputs = {
        "flavor": stack.name,
        "torch": stack.versions.get("torch"),
        "cuda": stack.cuda,
        "arch_list": stack.arch_list,
        "python": stack.python,
        "base": base or f"{stack.base.image}@{stack.base.digest or ''}",
        "step": item.to_json(),
    }
    own = {p.file for p in item.patches}
    if own and patch_sha:
        inputs["patch_sha256"] = {f: patch_sha.get(f) for f in sorted(own)}
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return f"{stack.name}-{step}-{digest[:16]}"


def patch_spec(p: PatchFile, layout: StepLayout) -> str:
    return f"{p.file}:{p.method}:{p.strip}:{layout.patches_dir}/{p.file}"


LOCK_ALL = "all.txt"
# Under the state directory: finalize's import pass (its results), which the smoke test right after
# reports instead of importing everything a second time (install.sh and the image's last step).
SMOKE_IMPORTS_DIR = "smoke-imports"


def lock_file(step: str) -> str:
    return f"{step}.txt"


def input_lock(stack: Stack, pylock: LockFile, patches: list[Any], local: set[str], pins: dict[str, str] | None = None,
               **more: Any) -> str:
    """stack.input.json: what an image build and an install script record of their inputs (stack,
    pins, sources, patches with their sha256, the pylock), the one document of both; finalize reads
    it back as stack.lock.json. `more`: what only one of them has (the build's base and build args,
    the install's prefix and venv)."""
    doc = {
        "schema": 1,
        "stack": {"name": stack.name, "version": stack.version, "id": stack.id, "hash": stack.hash, "cuda": stack.cuda,
                  "python": stack.python},
        "pins": pins if pins is not None else stack.pins(),
        "sources": {n: {"git": s.git, "commit": s.commit, "local": n in local} for n, s in stack.sources.items()},
        "patches": [{"file": p.file, "target": p.target, "method": p.method, "strip": p.strip,
                     "sha256": p.sha256} for p in patches],
        "pylock": {"file": pylock.path.name, "sha256": pylock.hash, "packages": len(pylock.packages)},
        **more,
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def lock_files(stack: Stack, lock: LockFile, layout: StepLayout) -> dict[str, str]:
    """The lock as the steps read it: one requirements file per installing step (its slice, by URL
    and sha256; by name for a step given a wheel directory) and all.txt, every locked version, that
    finalize compares the installed set with."""
    # The venv step's slice: the pinned uv's wheel (pip installs it --require-hashes).
    out = {lock_file(VENV_STEP): uv_requirement(lock)}
    for step in stack.plan:
        name = step.name
        if step.kind == "wheel_url":
            assert step.requirements  # a wheel_url step has its one requirement (Stack.plan)
            out[lock_file(name)] = router_requirement(lock, step.requirements[0])
        elif step.kind in ("pip", "source"):
            out[lock_file(name)] = step_requirements(lock, name, by_name=name in layout.wheel_dirs)
            if step.kind == "pip":
                # Only the slice of a step installing what a prune rule names: an arch_list change
                # re-does that step alone (its slice changes), and the step prunes in its own layer.
                out[lock_file(name)] += venvprune.keep_line(stack.arch_list, lock.steps.get(name, []))
    out[LOCK_ALL] = "".join(f"{n}=={v}\n" for n, v in sorted(expected_versions(lock).items()))
    return out


def step_commands(stack: Stack, layout: StepLayout, base: str | None = None, store: dict[str, tuple[str,
                                                                                                    str]] | None = None,
                  patch_sha: dict[str, str] | None = None) -> list[StepCommand]:
    """Each step as both renderers run it (StepCommand: one type per kind, a compiled one with its CompiledRun): name,
    env, the patch files it needs, the sf argv. The first non-apt step is preceded by the venv step. A compiled step
    runs through `sf_compiled` (parallelism and its own uv cache), with the arch variables in its env. Every pip, wheel
    and source step installs its slice of the lock, `<layout.lock_dir>/<step>.txt` (see lock_files). The plan's order,
    but for what a slime bump changes (see PATCHES_STEP): slime's requirements stay at its place as
    `slime-requirements`, then come the patches step and slime's checkout, last. `store`: compiled step -> ("use", DIR)
    to install the store's wheels from DIR (a hit: nothing compiles), or ("make", DIR) to compile its wheels into DIR
    for the store (wheelstore.py)."""
    store = store or {}
    out: list[StepCommand] = []
    late_patches: list[list[str]] = []  # apply_patch argv of every patch that waits for the patches step
    late_files: list[str] = []
    late_source: SourceCommand | None = None
    latest = latest_source(stack)
    venv_done = False
    versions = stack.versions
    with_python = {s.name for s in stack.steps if s.python}
    python = layout.python or stack.interpreter
    for step in stack.plan:
        if not isinstance(step, AptStep) and not venv_done:
            out.append(VenvCommand(name=VENV_STEP, argv=["venv", layout.venv, versions["uv"], python,
                                                         f"{layout.lock_dir}/{lock_file(VENV_STEP)}"]))
            venv_done = True
        name = step.name
        patch_files = [p.file for p in step.patches]
        if isinstance(step, AptStep):
            argv = ["system"]
            if name in with_python:
                argv += ["--python", python, *[a for pkg in stack.interpreter_packages() for a in ("--python-package",
                                                                                                   pkg)]]
            argv += [a for spec in step.probes for a in ("--need", spec)]
        elif isinstance(step, PipStep | WheelUrlStep):
            argv = ["pip_step", "--venv", layout.venv, "--step", name, "--lock", f"{layout.lock_dir}/{lock_file(name)}"]
            if name in layout.wheel_dirs:
                argv += ["--find-links", layout.wheel_dirs[name]]
        else:
            src = step.source
            argv = ["source_step", "--venv", layout.venv, "--step", name, "--name", src, "--url",
                    layout.source_urls.get(src, step.git),
                    "--commit", step.commit, "--dest", layout.source_dir(stack, src), "--lock",
                    f"{layout.lock_dir}/{lock_file(name)}"]
            for p in step.patches:
                # An editable checkout is read where it lies, so its patch can wait for the patches
                # step; any other is copied by its install, so its patch goes first.
                if p.target == src and not step.editable:
                    argv += ["--patch", patch_spec(p, layout)]
                elif p.target == src:
                    late_patches.append(["apply_patch", p.file, p.method, str(p.strip),
                                         f"{layout.patches_dir}/{p.file}",
                                         layout.source_dir(stack, src)])
                    late_files.append(p.file)
            if step.editable:
                argv.append("--editable")
                # Megatron's editable install must be a plain path entry (`megatron.training` is
                # not found through setuptools' import hooks otherwise); harmless for the others.
                argv += ["--config-setting", "editable_mode=compat"]
        env = dict(step.env)
        compiled = None
        if step.compiles:
            env = {**arch_env(stack), **env}
            key = compiled_key(stack, name, base, patch_sha)
            mode = store.get(name)
            argv = ["compiled", "--key", key, "--venv", layout.venv,
                    *([f"--{'wheels' if mode[0] == 'use' else 'wheel-out'}", mode[1]] if mode else []), "--", *argv]
            compiled = CompiledRun(key, mode[0] if mode else None, isinstance(step, PipStep) and not step.requirements)
        # Patches of installed packages wait for the patches step (see PATCHES_STEP).
        late = [p for p in step.patches if p.target == "site-packages"]
        late_patches += [["apply_patch", p.file, p.method, str(p.strip), f"{layout.patches_dir}/{p.file}",
                          stack.site_packages.replace(stack.venv, layout.venv, 1)] for p in late]
        late_files += [p.file for p in late]
        own_files = [f for f in patch_files if f not in late_files]
        cmd: StepCommand
        if isinstance(step, AptStep):
            cmd = SystemCommand(name=name, argv=argv, env=env, patch_files=own_files, compiled=compiled)
        elif isinstance(step, PipStep | WheelUrlStep):
            cmd = PipCommand(name=name, kind=step.kind, argv=argv, env=env, patch_files=own_files, compiled=compiled,
                             slice_of=name)
        elif step.source == latest and step.editable and not step.compiles:
            # Its requirements stay here; the checkout itself goes last (see PATCHES_STEP).
            at = argv.index("--lock")
            out.append(PipCommand(name=f"{name}{REQUIREMENTS_SUFFIX}", argv=["pip_step", "--venv", layout.venv,
                                                                             "--step", name,
                                                                          "--lock", argv[at + 1]], slice_of=name))
            late_source = SourceCommand(name=name, argv=argv[:at] + argv[at + 2:], env=env, patch_files=own_files,
                                        source=step.source,
                                        editable=step.editable, slice_of=None)
            continue
        else:
            cmd = SourceCommand(name=name, argv=argv, env=env, patch_files=own_files, compiled=compiled,
                                source=step.source,
                                editable=step.editable, slice_of=name)
        out.append(cmd)
    if late_patches:
        out.append(PatchesCommand(name=PATCHES_STEP, argv=late_patches[0], post=late_patches[1:],
                                  patch_files=late_files))
    if late_source is not None:
        out.append(late_source)
    return out


# What changes most often goes last, so that it moves few bytes: a new slime commit (and the patches,
# which come from slime's tree) re-does only these layers, and every earlier layer stays the same
# layer on every node. In order: the patches of installed packages and of editable checkouts (one
# small layer of the files they change), then the checkout of the most often bumped source (slime),
# whose requirements stay at its place in the stack's list, as `<step>-requirements` (the names:
# stack.PATCHES_STEP, stack.REQUIREMENTS_SUFFIX).
def latest_source(stack: Stack) -> str | None:
    """The source bumped most often: slime (the patches come from its tree too)."""
    return slime_source(stack)


@dataclass(frozen=True)
class CompiledRun:
    """How a compiled step runs: under its `key` (compiled_key); `store`: "use" a store entry's wheels,
    "make" compile into one, None compile in place; `nothing`: its flavor gives it nothing to install
    (cu13's flash-attn: an empty slice)."""

    key: str
    store: str | None
    nothing: bool


@dataclass(frozen=True, kw_only=True)
class _Command:
    """What every step has as both renderers run it: `sf <name> <argv...>`, with `env`, needing the
    patch files `patch_files` (their names) where it runs."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    patch_files: list[str] = field(default_factory=list)

    @property
    def commands(self) -> list[list[str]]:
        """Every call of the step library the step makes, in order."""
        return [self.argv]

    @property
    def lock_file(self) -> str | None:
        """Its slice of the lock, for a step that installs one."""
        return None

    def _json(self, kind: str, *, compiled: CompiledRun | None = None, post: list[list[str]] | None = None,
              source: str | None = None,
              editable: bool = False) -> dict[str, object]:
        """As the Dockerfile template reads it (and its values are checked for control characters):
        every key for every kind, so that the template and the step hashes read one shape."""
        return {"name": self.name, "kind": kind, "argv": self.argv, "env": self.env, "compiles": compiled is not None,
                "patch_files": self.patch_files, "post": post or [], "source": source,
                "compiled_key": compiled.key if compiled else None, "store": compiled.store if compiled else None,
                "editable": editable, "lock_file": self.lock_file}


@dataclass(frozen=True, kw_only=True)
class VenvCommand(_Command):
    """The venv with the pinned uv, right before the first step that is not apt."""

    kind: Literal["venv"] = field(default="venv", init=False)

    @property
    def lock_file(self) -> str | None:
        return lock_file(VENV_STEP)

    def to_json(self) -> dict[str, object]:
        return self._json(self.kind)


@dataclass(frozen=True, kw_only=True)
class SystemCommand(_Command):
    """An apt step: the system packages (and the stack's interpreter, where the step says so)."""

    compiled: CompiledRun | None = None
    kind: Literal["apt"] = field(default="apt", init=False)

    def to_json(self) -> dict[str, object]:
        return self._json(self.kind, compiled=self.compiled)


@dataclass(frozen=True, kw_only=True)
class PipCommand(_Command):
    """A pip or wheel_url step, or a source's requirements apart from its checkout: installs the slice
    of the lock of the stack step `slice_of`."""

    slice_of: str
    compiled: CompiledRun | None = None
    kind: Literal["pip", "wheel_url"] = "pip"

    @property
    def lock_file(self) -> str | None:
        return lock_file(self.slice_of)

    def to_json(self) -> dict[str, object]:
        return self._json(self.kind, compiled=self.compiled)


@dataclass(frozen=True, kw_only=True)
class SourceCommand(_Command):
    """A checkout of `source`, installed with its slice of the lock (`slice_of`, None where its
    requirements went to a step of their own, see PATCHES_STEP)."""

    source: str
    editable: bool
    slice_of: str | None
    compiled: CompiledRun | None = None
    kind: Literal["source"] = field(default="source", init=False)

    @property
    def lock_file(self) -> str | None:
        return lock_file(self.slice_of) if self.slice_of else None

    def to_json(self) -> dict[str, object]:
        return self._json(self.kind, compiled=self.compiled, source=self.source, editable=self.editable)


@dataclass(frozen=True, kw_only=True)
class PatchesCommand(_Command):
    """The patches step: `sf patches <argv...>`, then each of `post` (its further patches)."""

    post: list[list[str]] = field(default_factory=list)
    kind: Literal["patches"] = field(default="patches", init=False)

    @property
    def commands(self) -> list[list[str]]:
        return [self.argv, *self.post]

    def to_json(self) -> dict[str, object]:
        return self._json(self.kind, post=self.post)


# One step as both renderers run it (to_json: as the Dockerfile template reads it).
StepCommand = VenvCommand | SystemCommand | PipCommand | SourceCommand | PatchesCommand


def compiled_run(cmd: StepCommand) -> CompiledRun | None:
    """How the step compiles, for a compiled step; None for any other."""
    return cmd.compiled if isinstance(cmd, SystemCommand | PipCommand | SourceCommand) else None


def together_groups(commands: list[StepCommand]) -> list[list[int]]:
    """Indices of the runs of compiled steps next to each other that compile here (not from the
    store, not an editable checkout, which cannot be installed from a wheel): each needs only the
    steps before its run (torch and the build tools), never another of the run, so they compile side
    by side (install.sh.j2 `sf_run_together`; one BuildKit stage each in the Dockerfile) and install
    their wheels in step order. A step between them that is not compiled ends the run: what comes
    after it may need it. A compiled step with nothing to install (cu13's flash-attn) is no piece:
    it runs in place, and takes no share of the budget."""
    groups: list[list[int]] = []
    run: list[int] = []
    for i, cmd in enumerate([*commands, None]):
        compiled = compiled_run(cmd) if cmd is not None else None
        if compiled is not None and compiled.nothing:
            continue  # installs nothing (an empty slice): neither a piece nor an end of the run
        if compiled is not None and compiled.store != "use" and not (isinstance(cmd, SourceCommand) and cmd.editable):
            run.append(i)
            continue
        if run:
            groups.append(run)
        run = []
    return groups


def slime_source(stack: Stack) -> str | None:
    """The source whose train.py defines the flag catalog (the one named slime)."""
    return "slime" if "slime" in stack.sources else None


def megatron_source(stack: Stack) -> str | None:
    """The source whose megatron.training slime's main parser is built from (the one named megatron)."""
    return "megatron" if "megatron" in stack.sources and stack.builds_from("megatron") else None


def catalog_args(stack: Stack, layout: StepLayout) -> list[str]:
    """--slime DIR [--megatron DIR]: the checkouts the flag catalog is read from."""
    slime, megatron = slime_source(stack), megatron_source(stack)
    argv = ["--slime", layout.source_dir(stack, slime)] if slime else []
    return argv + (["--megatron", layout.source_dir(stack, megatron)] if slime and megatron else [])


def finalize_argv(stack: Stack, layout: StepLayout, lock_in: str, lock_out: str | None = None,
                  flags_out: str | None = None) -> list[str]:
    argv = ["finalize", layout.venv, lock_in, lock_out or f"{layout.state}/stack.lock.json",
            flags_out or f"{layout.state}/flags.json",
            "--lock", f"{layout.lock_dir}/{LOCK_ALL}"]
    for name in stack.sources:
        if stack.builds_from(name):
            argv += ["--checkout", f"{name}={layout.source_dir(stack, name)}"]
    return argv + catalog_args(stack, layout)


def smoke_import_args(stack: Stack) -> list[str]:
    """The smoke test's imports as sf_smoke and sf_import_pass (finalize's --imports-to) take them."""
    argv: list[str] = []
    for m in stack.smoke.all_imports:
        argv += ["--import", m]
    for m in stack.smoke.needs_gpu:
        argv += ["--needs-gpu", m]
    for m in stack.smoke.preload:
        argv += ["--preload", m]
    return argv


def smoke_argv(stack: Stack, layout: StepLayout, flags: str | None = None, catalog: bool = True) -> list[str]:
    """The smoke test's arguments. catalog=False: no --flags (the image's last step, where finalize
    before it makes the catalog and fails when it cannot)."""
    argv = ["smoke", "--venv", layout.venv, *smoke_import_args(stack)]
    if any(s.compiles for s in stack.plan):
        argv.append("--kernel-check")  # on a GPU host: one operation of each compiled piece (kernel_check.py)
    # Every pin of the stack at its version (the input lock; the built lock is read back from it).
    argv += ["--versions", f"{layout.state}/stack.input.json"]
    if stack.smoke.router_fork_marker and stack.router:
        argv += ["--router-marker", stack.smoke.router_fork_marker]
    if stack.cuda and "torch" in stack.versions:
        argv += ["--torch-cuda", stack.cuda]
    site = stack.site_packages.replace(stack.venv, layout.venv, 1)
    for p in stack.used_patches():
        target = site if p.target == "site-packages" else layout.source_dir(stack, p.target)
        argv += ["--patch", f"{p.file}:{p.method}:{p.strip}:{layout.state}/patches/{p.file}:{target}"]
    if catalog and slime_source(stack):
        argv += ["--flags", flags or f"{layout.state}/flags.json", *catalog_args(stack, layout)]
    return argv


def venv_sizes_argv(layout: StepLayout) -> list[str]:
    """The image's last command: scripts/venv_sizes.py with the venv's Python, into the state directory."""
    return [f"{layout.venv}/bin/python", "-I", f"{layout.state}/venv_sizes.py", layout.venv,
            f"{layout.state}/{VENV_SIZES_RECORD}"]
