"""`invoke install`: the bare-metal install script of a stack, rendered from the same steps as its
Dockerfile (`steps.step_commands`), with the same step library (templates/steps.sh) included.

    render_install_script(stack, prefix, ...) -> str   the script (cluster bootstrap renders it too)
    store_plan(...)                                     each compiled step: from the store, or compiled then stored
    install(opts) -> Path                               validate, plan the store, render to --out, run (not on a
                                                        dry run), then store what it compiled

The script is a deliverable on its own: it carries the patch files (base64, checked by sha256), the
input lock, each step's slice of the flavor's lock and the target scripts, so it can be copied to a
host and run there. Its prerequisites (interpreter, tools, toolkit and headers, driver, disk from
the lock) are all checked before the first download.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict

from ... import paths
from ...atomic import dir_problem, mark_output_dir, output_dir_problem, write_file
from ...errors import CommandError, ConfigError, OperationFailed, Problem, SlimeforgeError
from ...proc import Runner
from ...schema import text_problem, whole_problem
from ...templating import render
from ..lock.lockcheck import check_patch_hashes, checked_lock
from ..lock.lockfacts import lock_for_run
from ..lock.lockfile import LockFile, normalize
from ..patches import PatchContent, patches_for_run, read_patches
from ..sources import LocalSource, checked_options
from ..stack import FINALIZE_STEP, Stack, load_stack
from ..steps import (
    INSTALL_SCRIPTS,
    LIBRARY_SCRIPTS,
    LOCK_ALL,
    PATCHES_STEP,
    SMOKE_IMPORTS_DIR,
    TARGET_SCRIPTS,
    VENV_STEP,
    compiled_run,
    finalize_argv,
    host_layout,
    input_lock,
    lock_files,
    smoke_argv,
    smoke_import_args,
    step_commands,
    together_groups,
)
from .compilejobs import QUEUE_APEX_AT_ONCE, QUEUE_FILES_PER_NINJA

SCRIPT = "install.sh"
MAX_FREE_GIB = 999_999  # install.sh reads SLIMEFORGE_MIN_FREE_GIB as 1 to 6 ASCII digits, base 10


# What an install weighs, from its lock: the lock's files unpack to about this many times their size
# (the real cu13 install, 2026-11-25: the lock's 5.1 GB made a 12 GB venv), plus source checkouts and
# logs, plus the compiled steps' build trees and wheels where the stack compiles.
UNPACKED_PER_DOWNLOADED = 2.5
OVERHEAD_GIB = 1
COMPILE_SCRATCH_GIB = 2


def disk_need(stack: Stack, lock: LockFile) -> tuple[int, int]:
    """(bytes the lock downloads, GiB the install needs free at its prefix)."""
    download = sum(p.size or 0 for p in lock.packages.values())
    scratch = COMPILE_SCRATCH_GIB if any(s.compiles for s in stack.steps) else 0
    return download, int(-(-download * UNPACKED_PER_DOWNLOADED // (1 << 30))) + OVERHEAD_GIB + scratch


PYTHON_NAME_RE = re.compile(r"python3(?:\.[0-9]{1,2})?")
# An absolute path of plain names: dot-directories (~/.pyenv, ~/.local) yes, '.' and '..' no.
PYTHON_PATH_RE = re.compile(r"(?:/(?!\.\.?(?:/|$))[A-Za-z0-9._+-]{1,255}){1,64}")


def python_problem(value: str) -> str | None:
    """`--python`: an absolute path, or an interpreter's name on PATH (python3.12)."""
    if PYTHON_NAME_RE.fullmatch(value) or PYTHON_PATH_RE.fullmatch(value):
        return None
    return "is neither an absolute path nor an interpreter name such as python3.12"


def toolkit_headers(stack: Stack, lock: LockFile) -> list[str]:
    """Headers the compiled steps include that no locked distribution ships: the toolkit must have them."""
    return sorted(h for h, pkg in stack.compile_headers.items() if normalize(pkg) not in lock.packages)


def render_install_script(stack: Stack, prefix: str, venv: str | None = None,
                          sources: dict[str, LocalSource] | None = None,
                          cache: Path | None = None, patches: list[PatchContent] | None = None,
                          lock: LockFile | None = None, store: dict[str, tuple[str, str]] | None = None,
                          base_id: str | None = None, python: str | None = None) -> str:
    """The install script (text). `sources` maps a source name to a LocalSource (see
    sources.parse_sources); patches are read from the pinned slime commit (local or fetched)
    unless given (`patches.read_patches` output); the lock is the stack's committed one unless given.
    `store`: compiled step -> ("use", DIR) or ("make", DIR) (see store_plan); `base_id`: the base part
    of the compiled keys (install_base: its pinned digest, or None); `python`: the
    interpreter the venv is made with (default: the stack's by its version, on PATH)."""
    if not prefix.startswith("/"):
        raise ConfigError("install", [Problem("--prefix", "must be an absolute path", prefix)])
    if venv is not None and not venv.startswith("/"):
        raise ConfigError("install", [Problem("--venv", "must be an absolute path", venv)])
    if python is not None and (why := python_problem(python)):
        raise ConfigError("install", [Problem("--python", why, python, "e.g. /opt/conda/bin/python3.12 or python3.12")])
    layout = host_layout(stack, prefix, venv, sources, python)
    pylock = lock or checked_lock(stack)
    slices = lock_files(stack, pylock, layout)
    if patches is None:
        patches = read_patches(stack, sources or {}, cache or paths.sources_cache())
    patch_sha = {p.file: p.sha256 for p in patches}
    check_patch_hashes(pylock, patch_sha)
    lock_text = input_lock(stack, pylock, patches, set(sources or {}), install={"prefix": prefix, "venv": layout.venv})
    steps: list[ScriptStep] = []  # as the template reads them, each with its hash in the chain
    # A changed library (steps.sh and its own scripts) re-does every step.
    chain = hashlib.sha256(b"".join(p.read_bytes()
                                    for p in [paths.STEP_LIBRARY, *LIBRARY_SCRIPTS.values()])).hexdigest()
    commands = step_commands(stack, layout, base_id, store, patch_sha)
    for cmd in commands:
        steps.append({"name": cmd.name, "env": cmd.env, "commands": cmd.commands, "slice": cmd.lock_file})
    # finalize makes the flag catalog in the smoke test's import pass, whose results the smoke test
    # right after reports (sf_finalize --imports-to, sf_smoke --imports-from): one set of imports for both.
    imports_dir = f"{layout.state}/{SMOKE_IMPORTS_DIR}"
    steps.append({"name": FINALIZE_STEP, "env": {},
                  "commands": [finalize_argv(stack, layout, f"{layout.state}/stack.input.json",
                                             paths.Prefix.at(prefix).lock, paths.Prefix.at(prefix).flags)
                               + ["--imports-to", imports_dir, *smoke_import_args(stack)]]})
    for step in steps:
        inputs: dict[str, object] = {"step": {**step, "commands": [_without_store_dir(c) for c in step["commands"]]},
                                     "patches": {f: patch_sha[f] for f in sorted(patch_sha)
                                                 if any(f in " ".join(c) for c in step["commands"])}}
        # A changed slice of the lock re-does its step (and, through the chain, every later one).
        own = LOCK_ALL if step["name"] == FINALIZE_STEP else step.get("slice")
        if own in slices:
            inputs["lock"] = hashlib.sha256(slices[own].encode()).hexdigest()
        if step["name"] == FINALIZE_STEP:
            inputs["input"] = hashlib.sha256(lock_text.encode()).hexdigest()
            inputs["scripts"] = {n: hashlib.sha256(p.read_bytes()).hexdigest()
                                 for n, p in sorted(TARGET_SCRIPTS.items())}
        chain = hashlib.sha256((chain + json.dumps(inputs, sort_keys=True)).encode()).hexdigest()
        step["hash"] = chain
        step["fn"] = step["name"].replace("-", "_")
    # How each step runs, set after the hashes (it changes nothing a step installs): what running it
    # does (the summary's outcome), and which compiled steps compile side by side.
    for step in steps:
        step["what"], step["together"], step["together_last"] = "installed", False, False
        step["slice_path"], step["outputs"] = _proof_of(step, layout.lock_dir)
    at_venv = next((i for i, st in enumerate(steps) if st["name"] == VENV_STEP), len(steps))
    for i, step in enumerate(steps):
        step["in_venv"] = i >= at_venv
        step["after_all"] = step["name"] in (PATCHES_STEP, FINALIZE_STEP)
    for step, cmd in zip(steps, commands, strict=False):  # steps has finalize besides
        compiled = compiled_run(cmd)
        step["what"] = ("store hit" if compiled and compiled.store == "use"
                        else "compiled" if compiled and not compiled.nothing else "installed")
    for group in together_groups(commands):
        for i in group:
            steps[i]["together"] = True
        steps[group[-1]]["together_last"] = True
    smoke = smoke_argv(stack, layout, flags=f"{prefix}/flags.json")[1:]
    # What the smoke test's pass is recorded with (sf_smoke_recorded): every step (the chain) and its own arguments.
    smoke_hash = hashlib.sha256((chain + json.dumps({"smoke": smoke})).encode()).hexdigest()
    return render("install.sh.j2", {
        "stack_id": stack.id,
        "state": layout.state,
        "prefix": prefix,
        "venv": layout.venv,
        "library": paths.STEP_LIBRARY.read_text().rstrip("\n"),
        "python": stack.python,
        "python_cmd": layout.python or stack.interpreter,
        "cuda": stack.cuda,
        "cuda_home": stack.cuda_home or "/usr/local/cuda",
        "driver_min": stack.driver_min or 0,
        "min_free_max": MAX_FREE_GIB,
        # A host needs compilers only for what it compiles: not for compiled steps from the store.
        "compiles": any(s.compiles and (store or {}).get(s.name, ("",))[0] != "use" for s in stack.steps),
        "disk_gib": disk_need(stack, pylock)[1],
        "toolkit_headers": toolkit_headers(stack, pylock),
        "patches": [{"file": p.file, "sha256": p.sha256,
                     "b64": base64.encodebytes(p.data).decode().rstrip("\n")} for p in patches],
        "lock_b64": base64.encodebytes(lock_text.encode()).decode().rstrip("\n"),
        "target_scripts": [{"name": n, "b64": base64.encodebytes(p.read_bytes()).decode().rstrip("\n")}
                           for n, p in sorted((TARGET_SCRIPTS | LIBRARY_SCRIPTS | INSTALL_SCRIPTS).items())],
        "queue_files_per_ninja": QUEUE_FILES_PER_NINJA,
        "queue_apex_at_once": QUEUE_APEX_AT_ONCE,
        "lock_dir": layout.lock_dir,
        "slices": [{"file": name, "b64": base64.encodebytes(text.encode()).decode().rstrip("\n")}
                   for name, text in slices.items()],
        "steps": steps,
        "smoke": smoke,
        "smoke_hash": smoke_hash,
        "smoke_flags": "--flags" in smoke,
        "finalize": FINALIZE_STEP,
        "imports_dir": imports_dir,
    })


class ScriptStep(TypedDict):
    """A step as install.sh.j2 reads it: what it runs (name, env, commands: each an argv of the step
    library, its slice of the lock), then its hash in the chain, its shell function's name, and how
    it runs (what, together, in_venv, after_all), what its done record stands for (slice_path, outputs)."""

    name: str
    env: dict[str, str]
    commands: list[list[str]]
    slice: NotRequired[str | None]
    hash: NotRequired[str]
    fn: NotRequired[str]
    what: NotRequired[str]
    together: NotRequired[bool]
    together_last: NotRequired[bool]
    slice_path: NotRequired[str | None]
    outputs: NotRequired[list[str]]
    in_venv: NotRequired[bool]
    after_all: NotRequired[bool]


def _proof_of(step: ScriptStep, lock_dir: str) -> tuple[str | None, list[str]]:
    """What a step's done record stands for, besides the venv (install.sh's sf_run_step): its slice
    of the lock (installed as it says) and its outputs: a source step's checkout, finalize's lock
    and flag catalog. A record whose outputs are gone or changed is not taken as done."""
    outputs: list[str] = []
    for argv in step["commands"]:
        outputs += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--dest"]
    if step["name"] == FINALIZE_STEP:
        outputs += step["commands"][0][3:5]  # sf_finalize VENV LOCK_IN LOCK_OUT FLAGS_OUT: the two it writes
    return (f"{lock_dir}/{step['slice']}" if step.get("slice") else None), outputs


def install_base(stack: Stack, lock: LockFile) -> str | None:
    """The base part of a bare-metal install's compiled keys: the base's digest where the stack or
    the lock pins one (then the keys are the image build's, and wheels compiled on that base serve
    the host), else None (compiled_key then takes the stack's base by name). Never a local image's
    id: the install does not use any image, so whether one happens to be present here must not
    change its keys (it did, and TE and apex compiled again)."""
    return stack.base.digest or lock.tool.get("base", {}).get("digest") or None


def _without_store_dir(argv: list[str]) -> list[str]:
    """A step's command as its hash sees it: without where its compiled wheels come from (sf_compiled's
    --wheels DIR, a store hit, or --wheel-out DIR, compiled here): the key names the wheels either way.
    A cold install stores its wheels, and the re-run that found them in the store re-did every step
    from the first compiled one (187 s on cu13) though nothing had changed."""
    out: list[str] = []
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
        elif a in ("--wheels", "--wheel-out") and argv[0] == "compiled" and "--" in argv and i < argv.index("--"):
            skip = True
        else:
            out.append(a)
    return out


def store_plan(stack: Stack, state: str, patches: list[PatchContent], lock: LockFile, store_root: Path | None = None,
               echo: Callable[[str], None] = print) -> tuple[dict[str, tuple[str, str]], dict[str, str], str | None]:
    """How each compiled step gets its wheels on this host: a store entry ("use", its directory),
    or compiled into <state>/compiled/<key> ("make") and stored after the install. The keys hold
    the base by its pinned digest only (install_base); no Docker Engine is asked. Returns (store,
    key per step, base). A damaged entry raises; the wheels' own sha256 are checked by install.sh
    right before it installs them (_sf_store_install), not hashed twice."""
    from ..wheels import wheelstore

    base_id = install_base(stack, lock)
    store, keys = {}, {}
    for name, info in wheelstore.stack_keys(stack, base_id, {p.file: p.sha256 for p in patches}, lock).items():
        if not info.storable:
            echo(f"  {name:<24} not stored (an editable checkout, or nothing to compile)")
            continue
        entry = wheelstore.lookup(info.key, store_root, hash_wheels=False)
        store[name] = ("use", str(entry.dir)) if entry else ("make", f"{state}/compiled/{info.key}")
        keys[name] = info.key
        echo(f"  {name:<24} {'from the store' if entry else 'compiled, then stored'}  {info.key}")
    return store, keys, base_id


@dataclass
class InstallOptions:
    stack: str = "cu13"
    prefix: str = ""
    venv: str | None = None
    python: str | None = None  # the interpreter the venv is made with (default: python<ver> on PATH)
    min_free_gb: int | None = None  # the free disk the prerequisites ask for, in GiB (default: from the lock)
    sources: list[str] = field(default_factory=list)
    out: Path | None = None
    dry_run: bool = False
    verify: bool = False  # run the smoke test even where its record says it passed with these inputs
    echo: Callable[[str], None] = print
    use_store: bool = True  # compiled steps from the compiled-wheel store (wheelstore.py)
    store_root: Path | None = None
    runner: Runner = field(default_factory=Runner)  # runs the script (tests read its history)


class InstallFailed(OperationFailed):
    """install.sh ran and a step failed (exit 1); its own output named the step and its log."""


class PrerequisitesRefused(SlimeforgeError):
    """install.sh's prerequisites refused this host (exit 2), before its first step."""


PREREQUISITES_REFUSED = 2  # install.sh.j2's sf_prereqs exits with it


def install(opts: InstallOptions) -> Path:
    """Render the script to --out (default <prefix>/.slimeforge/install/) and run it (not on a dry run)."""
    stack = load_stack(opts.stack)
    problems = []
    if not opts.prefix:
        problems.append(Problem("--prefix", "is required", opts.prefix, "an absolute directory, e.g. /opt/slime"))
    for option, value in (("--prefix", opts.prefix), ("--venv", opts.venv)):
        if value and (why := text_problem(value)):
            problems.append(Problem(option, why, value, "a directory path"))
    if opts.python is not None and (why := python_problem(opts.python)):
        problems.append(Problem("--python", why, opts.python, "e.g. /opt/conda/bin/python3.12 or python3.12"))
    if (opts.min_free_gb is not None
            and (bad := whole_problem(opts.min_free_gb, "--min-free-gb", 0, MAX_FREE_GIB, "GiB"))):
        problems.append(bad)
    if opts.out is not None and (why := output_dir_problem(Path(opts.out))):
        problems.append(Problem("--out", why, str(opts.out), "a new or empty directory, or one `invoke install` wrote"))
    elif opts.out is None and opts.prefix and (why := dir_problem(Path(opts.prefix))):
        # The script goes under the prefix: a prefix that is a file is --prefix's problem, not --out's.
        problems.append(Problem("--prefix", why, opts.prefix, "an absolute directory, e.g. /opt/slime"))
    local = checked_options("invoke install", stack, problems, opts.sources)
    prefix = str(Path(opts.prefix).absolute())
    min_free = opts.min_free_gb
    cache = paths.sources_cache()
    store: dict[str, tuple[str, str]] = {}
    keys: dict[str, str] = {}
    base_id: str | None = None
    # A real install fills a missing outside fact itself (and writes it into the lock); a dry run names it.
    pylock = lock_for_run(stack, opts.dry_run, opts.echo)
    patches = patches_for_run(stack, local, cache, pylock.patch_sha256, opts.dry_run, opts.echo)
    if opts.use_store and any(s.compiles for s in stack.steps):
        opts.echo("compiled steps:")
        store, keys, base_id = store_plan(stack, f"{prefix}/.slimeforge", patches, pylock, opts.store_root, opts.echo)
    text = render_install_script(stack, prefix, str(Path(opts.venv).absolute()) if opts.venv else None, local, cache,
                                 patches=patches, lock=pylock, store=store, base_id=base_id, python=opts.python)
    download, need = disk_need(stack, pylock)
    opts.echo(f"disk: the lock downloads {download / 1e9:.1f} GB; the install needs about {need} GiB free at {prefix}"
              + (f" (--min-free-gb asks for {min_free})" if min_free is not None else ""))
    out = Path(opts.out) if opts.out else Path(prefix) / ".slimeforge" / "install"
    script = out / SCRIPT
    try:
        if opts.out is not None:
            mark_output_dir(out, "invoke install")
        out.mkdir(parents=True, exist_ok=True)
        write_file(script, text, 0o755)
    except OSError as exc:
        option = "--out" if opts.out is not None else "--prefix"  # the option the user gave
        raise ConfigError("invoke install", [Problem(option, f"cannot be written: {exc.strerror}", str(out),
                                                     "a directory you may write to")]) from None
    if opts.dry_run:
        opts.echo(str(script))
        return script
    opts.echo(f"running {script}")
    # Not captured: the script's progress goes straight to the terminal; the runner raises on failure.
    env = {"SLIMEFORGE_MIN_FREE_GIB": str(min_free)} if min_free is not None else {}
    if opts.verify:
        env["SLIMEFORGE_VERIFY"] = "1"
    try:
        opts.runner.run(["bash", str(script)], step="install", capture=False, env=env or None)
    except CommandError as exc:
        if exc.returncode == PREREQUISITES_REFUSED:
            raise PrerequisitesRefused("install refused: a prerequisite is not met (each is named above); nothing was "
                                       "installed") from None
        raise InstallFailed(f"install failed (exit {exc.returncode}); see the step log named above") from None
    from ..wheels import wheelstore

    for name, (mode, directory) in store.items():
        if mode == "make":
            wheelstore.put(keys[name], Path(directory), {"flavor": stack.name, "step": name, "stack": stack.id,
                                                         "base": base_id, "compiled_on": "install"}, opts.store_root)
            opts.echo(f"compiled step {name}: {keys[name]} stored")
    return script
