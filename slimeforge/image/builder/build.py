"""`invoke build`: render the Dockerfile of a stack, build it with BuildKit, smoke-test it, report.

    prepare(opts) -> Prepared    load + validate everything, render the build directory (no Docker build)
    build(opts) -> BuildReport   prepare, then skip (image with this content hash exists) or build,
                                 smoke-test, tag, and write report.json / stack.lock.json / flags.json
                                 (a dry run: BuildDryRun, the command it would run)

Build directory (`--out`, default build/<flavor>-<hash12>/):
    Dockerfile, context/ (steps.sh, sf, stack.lock.json as input, patches/, sources/<name>.git),
    build.log, report.json, stack.lock.json (read back from the image), flags.json (ditto).

The content hash covers everything that determines the image: the rendered Dockerfile, every
context file, the input lock (every pin, the base digest or image id, each patch's sha256, the
commit of each local source) and the user's build args. BuildKit runs through the docker CLI
(`DOCKER_BUILDKIT=1 docker build`; the Python SDK has no BuildKit); inspect, tag and run use the SDK.
The Dockerfile itself is rendered by dockerfile.py; the base pull and the smoke test are engine.py's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import paths, readback
from ...atomic import mark_output_dir, output_dir_problem, write_dir
from ...errors import Problem
from ...proc import Runner
from ...schema import ENV_NAME_RE, WHOLE_RE, printable, text_problem
from ..dockerapi import EngineUnavailable, ResolvedBase, docker_client, read_from_image, resolve_base
from ..imageref import TAG_RE, image_ref_problems, repository_problems
from ..lock.lockcheck import check_patch_hashes
from ..lock.lockfacts import lock_for_run
from ..lock.lockfile import LockFile
from ..patches import PatchContent, patches_for_run
from ..sources import GIT, LocalSource, checked_options
from ..stack import Stack, load_stack
from ..steps import (
    IMAGE_SCRIPTS,
    LIBRARY_SCRIPTS,
    STEP_RUNNER,
    TARGET_SCRIPTS,
    VENV_SIZES_RECORD,
    image_layout,
    input_lock,
    lock_files,
    slime_source,
)
from .buildkit import copy_wheels, failure_text, link_files, parse_progress, stream_build, write_tree
from .buildprogress import past_times
from .buildreport import BuildReport, CompiledWheels, ReportError, StepTiming, VenvSizes
from .compilejobs import apex_shared, compile_share
from .compilequeue import SSH_ID, queue_slots, served, stage_build_args
from .dockerfile import compile_pieces, render_dockerfile
from .engine import BuildError, pull_base, smoke_lines, smoke_test

if TYPE_CHECKING:
    from ..wheels.wheelstore import CompiledPlan, Entry

LABEL_NS = "ai.slimeforge"
REPORT, LOCK, FLAGS, LOG = paths.BUILD_REPORT, paths.STACK_LOCK, paths.FLAGS, "build.log"
HASH_LABEL = f"{LABEL_NS}.build-hash"


@dataclass
class BuildOptions:
    stack: str = "cu13"  # flavor name or a stack YAML path
    out: Path | None = None
    dry_run: bool = False
    base_image: str | None = None
    sources: list[str] = field(default_factory=list)  # NAME=PATH
    build_args: list[str] = field(default_factory=list)  # KEY=VALUE
    no_cache: bool = False  # also builds when an image of this content hash exists
    force: bool = False
    verify: bool = False  # an image of this content hash that exists is smoke-tested again (not rebuilt)
    tags: list[str] = field(default_factory=list)  # extra tags: REF or a bare tag for the repository
    repository: str | None = None  # default slimeforge/<stack name>
    # CA bundle mounted (as a BuildKit secret) into steps that download: needed behind a
    # TLS-intercepting proxy. Default: the host's SSL_CERT_FILE. Not part of the content hash.
    ca_bundle: str | None = None
    build_root: Path = paths.BUILDS
    echo: Callable[[str], None] = print  # progress and warnings (the command line: stderr)
    verbose: bool = False  # also echo BuildKit's every raw line (build.log has them always)
    # The compiled-wheel store (wheelstore.py): a compiled step whose key is stored installs its
    # wheels (nothing compiles); a miss is compiled first (`wheels_only` build) and stored.
    use_store: bool = True
    store_root: Path | None = None  # default wheelstore.store_root()
    wheel_registry: str | None = None  # also pull misses from <registry>/slimeforge-compiled:<key>
    wheel_credentials: Any = None  # registry.Credentials for it (default: the docker config's)
    wheels_only: bool = False  # render/build only up to the compiled steps, compiling misses into the store
    runner: Runner = field(default_factory=Runner)  # every external command (tests read its history)


@dataclass
class Prepared:
    stack: Stack
    local: dict[str, LocalSource]
    base: ResolvedBase
    patches: list[PatchContent]
    dockerfile: str
    lock: dict[str, object]  # stack.input.json as written into the context
    build_args: dict[str, str]
    hash: str
    dir: Path
    repository: str
    argv: list[str]
    env: dict[str, str]
    labels: dict[str, str]
    compiled: dict[str, CompiledPlan] = field(default_factory=dict)
    provisional: bool = False  # a dry run's plan with an outside fact missing (named in its warnings)
    queue_slots: int | None = None  # the wheels-only build's compile stages behind one queue of this many slots

    @property
    def tag(self) -> str:
        return f"{self.repository}:{self.hash[:16]}"

    @property
    def human_tags(self) -> list[str]:
        return [f"{self.repository}:{self.stack.version}-{self.stack.name}"]


@dataclass(frozen=True)
class BuildDryRun:
    """What a dry run of `build` returns: the build it would run (`command` with `env`), in `dir`
    (rendered), under `tag`; `provisional`: an outside fact is missing (its warning named it), so the
    hash is not yet the real build's."""

    provisional: bool
    build_hash: str
    dir: str
    tag: str
    human_tags: list[str]
    command: list[str]
    env: dict[str, str]


@dataclass
class WheelsOutcome:
    """What `build_wheels` did for one compiled step: its key; where its wheels come from (store,
    registry, compiled, would compile; or in place where the store cannot hold it); the log of the
    build that compiled them."""

    key: str
    source: str
    log: str | None = None


# --- preparing: everything but the build ------------------------------------------------------


def docker_cli() -> str:
    """A docker client with BuildKit's `RUN --mount`: SLIMEFORGE_DOCKER, else Debian's /usr/bin/docker
    (the newer one first on PATH here lacks buildx), else `docker`."""
    return os.environ.get("SLIMEFORGE_DOCKER") or ("/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker")


def default_ca_bundle() -> str:
    """The host's trust store: $SSL_CERT_FILE, else Debian's bundle (which holds the CAs installed
    under /usr/local/share/ca-certificates, e.g. an egress proxy's)."""
    for candidate in (os.environ.get("SSL_CERT_FILE", ""), "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return candidate
    return ""


def parse_build_args(values: list[str]) -> tuple[dict[str, str], list[Problem]]:
    out, problems = {}, []
    for text in values:
        key, sep, value = text.partition("=")
        if not sep or not ENV_NAME_RE.fullmatch(key) or text_problem(value):
            problems.append(Problem("--build-arg",
                                    "must be KEY=VALUE with KEY a variable name and VALUE printable text", text))
        else:
            out[key] = value
    return out, problems


def _source_date_epoch(stack: Stack, cache: Path, runner: Runner) -> int:
    """The commit time of slime's pinned commit (the newest thing in the image that has a date)."""
    src = slime_source(stack) or (stack.patches.from_source if stack.patches else None)
    if src:
        repo = cache / f"{src}-{stack.sources[src].commit}.git"
        if repo.exists():
            res = runner.run([*GIT, "--git-dir", str(repo), "show", "-s", "--format=%ct", stack.sources[src].commit],
                             step="git show (source date)", check=False)
            if res.ok and WHOLE_RE.fullmatch(res.stdout.strip()):
                return int(res.stdout.strip())
    return 0


def _label_key(text: str) -> str:
    return re.sub(r"[^a-z0-9.-]+", "-", text.lower()).strip("-")


def prepare(opts: BuildOptions) -> Prepared:
    """Validate every input, fetch patches, render and write the build directory. No image is
    built. Its phases, in order: options, lock, base, patches, compiled plan, Dockerfile, context
    and its hash, the build directory, labels, the command."""
    stack = load_stack(opts.stack)
    build_args, local = _checked_options(stack, opts)
    cache = paths.sources_cache()
    # A real build fills a missing outside fact itself (and writes it into the lock); a dry run names it.
    pylock = lock_for_run(stack, opts.dry_run, opts.echo)
    base = _base(stack, opts, pylock)
    patches = patches_for_run(stack, local, cache, pylock.patch_sha256, opts.dry_run, opts.echo)
    patch_sha = {p.file: p.sha256 for p in patches}
    check_patch_hashes(pylock, patch_sha)
    from_sources = {n: s for n, s in local.items() if (s.kind == "git" and stack.builds_from(n)) or s.kind == "wheels"}
    from ..wheels.wheelstore import compiled_plan

    compiled = compiled_plan(stack, base.id, patch_sha, pylock, use_store=opts.use_store, wheels_only=opts.wheels_only,
                             store_root=opts.store_root)
    store = {n: c.mode for n, c in compiled.items() if c.mode}
    # The wheels-only build's compile stages, side by side behind one queue where the rule says so.
    making = [n for n, c in compiled.items() if c.mode == "make"]
    slots = queue_slots(making, build_args) if opts.wheels_only else None
    dockerfile = render_dockerfile(stack, base.from_ref, from_sources, base.id, store, patch_sha, opts.wheels_only,
                                   compile_queue=slots is not None)
    pins = _pins(stack, base)
    lock_text = input_lock(stack, pylock, patches, set(local), pins=pins, base=base.to_json(), build_args=build_args,
                           # step -> sha256 of its wheels
                           wheel_dirs={n: s.commit for n, s in local.items() if s.kind == "wheels"})
    # A store hit's wheels go into the context (bind-mounted into their step). Its SHA256SUMS is in
    # the hash, and the wheels were just checked against it: their bytes are in the hash through it.
    hits = {c.key: c.entry for c in compiled.values() if c.mode == "use" and c.entry is not None}
    context = _context(stack, pylock, patches, lock_text, from_sources, hits)
    build_hash = _content_hash(dockerfile, context)
    out = Path(opts.out) if opts.out else paths.build_dir(opts.build_root, stack.name, build_hash)
    _write_build_dir(out, dockerfile, context, hits, stack, local, from_sources, cache)
    epoch = _source_date_epoch(stack, cache, opts.runner)
    labels = _labels(stack, base, build_hash, pylock.hash, pins, patches, epoch)
    argv = _argv(opts, out, build_args, labels, epoch, compile_pieces(stack, store), slots is not None)
    return Prepared(stack, local, base, patches, dockerfile, json.loads(lock_text), build_args, build_hash, out,
                    opts.repository or f"slimeforge/{stack.name}", argv, {"DOCKER_BUILDKIT": "1"}, labels, compiled,
                    provisional=pylock.provisional or any(p.missing for p in patches), queue_slots=slots)


def _checked_options(stack: Stack, opts: BuildOptions) -> tuple[dict[str, str], dict[str, LocalSource]]:
    """Every option's problem at once (sources.checked_options, as install and lock): the build
    args and the local sources, or one ConfigError naming each problem."""
    build_args, problems = parse_build_args(opts.build_args)
    if opts.out is not None and (why := output_dir_problem(Path(opts.out))):
        problems.append(Problem("--out", why, str(opts.out), "a build directory (new, or one `invoke build` wrote)"))
    if opts.ca_bundle and not Path(opts.ca_bundle).is_file():
        problems.append(Problem("--ca-bundle", "is not a file", opts.ca_bundle, "a PEM file of CA certificates"))
    if opts.base_image is not None:
        problems.extend(image_ref_problems(opts.base_image, "--base-image"))
    for tag in opts.tags:
        if not TAG_RE.fullmatch(tag) and image_ref_problems(tag, "--tag"):
            problems.append(Problem("--tag", "is neither a tag nor an image reference", tag,
                                    f"a tag ({TAG_RE.pattern}) or REGISTRY/REPO:TAG"))
    if opts.repository:
        problems.extend(repository_problems(opts.repository, "--repository"))
    return build_args, checked_options("invoke build", stack, problems, opts.sources, opts.runner)


def _base(stack: Stack, opts: BuildOptions, pylock: LockFile) -> ResolvedBase:
    """The base as FROM names it; a dry run without a Docker Engine takes it by its tag."""
    try:
        return resolve_base(stack, opts.base_image, opts.dry_run, pylock.tool.get("base", {}).get("digest") or None)
    except EngineUnavailable as exc:
        if not opts.dry_run:
            raise
        opts.echo(f"warning: the base image is taken by its tag in this plan: {exc}")
        image = opts.base_image or stack.base.image
        return ResolvedBase(image, image, None, None)


def _pins(stack: Stack, base: ResolvedBase) -> dict[str, str]:
    """The stack's pins with the base as resolved (what the input lock and the labels record)."""
    pins = stack.pins()
    pins["base.image"] = base.image
    pins["base.digest"] = base.digest or (f"none (a local image, id {base.image_id})" if base.image_id
                                          else "none (the base image is not present here; resolved at build)")
    return pins


def _context(stack: Stack, pylock: LockFile, patches: list[PatchContent], lock_text: str,
             from_sources: dict[str, LocalSource], hits: dict[str, Entry]) -> dict[str, str | bytes]:
    """The build context's files by name (sources and wheels are added to the directory after)."""
    context: dict[str, str | bytes] = {
        "steps.sh": paths.STEP_LIBRARY.read_bytes(),
        "sf": STEP_RUNNER.read_bytes(),
        "stack.lock.json": lock_text,
        **{name: path.read_bytes() for name, path in (TARGET_SCRIPTS | LIBRARY_SCRIPTS | IMAGE_SCRIPTS).items()},
    }
    context.update({f"patches/{p.file}": p.data for p in patches if not p.missing})
    context.update({f"lock/{name}": text
                    for name, text in lock_files(stack, pylock, image_layout(stack, from_sources)).items()})
    context.update({f"compiled/{key}/SHA256SUMS": (entry.dir / "SHA256SUMS").read_bytes()
                    for key, entry in hits.items()})
    return context


def _content_hash(dockerfile: str, context: dict[str, str | bytes]) -> str:
    """The build's identity: the Dockerfile and every context file, by name, length and bytes."""
    digest = hashlib.sha256()
    for name, content in sorted({"Dockerfile": dockerfile, **{f"context/{k}": v for k, v in context.items()}}.items()):
        data = content.encode() if isinstance(content, str) else content
        digest.update(f"{name}\0{len(data)}\0".encode() + data)
    return digest.hexdigest()


def _write_build_dir(out: Path, dockerfile: str, context: dict[str, str | bytes], hits: dict[str, Entry], stack: Stack,
                     local: dict[str, LocalSource], from_sources: dict[str, LocalSource], cache: Path) -> None:
    mark_output_dir(out, "invoke build")  # judged by output_dir_problem (options): new, empty, or already ours
    # `COPY patches/` takes the whole folder: a reused --out must not carry another stack's patches.
    for sub in ("patches", "lock", "compiled"):
        shutil.rmtree(out / "context" / sub, ignore_errors=True)
    write_tree(out, {"Dockerfile": dockerfile, **{f"context/{k}": v for k, v in context.items()}},
               {"context/sf": 0o755})
    for key, entry in hits.items():
        link_files(entry.dir, list(entry.wheels), out / "context" / "compiled" / key)
    for name, src in from_sources.items():
        if src.kind == "wheels":
            copy_wheels(src.path, out / "context" / "wheels" / name)
            continue
        target = out / "context" / "sources" / f"{name}.git"
        if not target.exists():
            from ..sources import source_repo

            shutil.copytree(source_repo(stack, name, local, cache), target, symlinks=True)


def _labels(stack: Stack, base: ResolvedBase, build_hash: str, lock_hash: str, pins: dict[str, str],
            patches: list[PatchContent], epoch: int) -> dict[str, str]:
    slime = slime_source(stack)
    return {
        "org.opencontainers.image.title": f"slimeforge {stack.name}",
        "org.opencontainers.image.version": stack.version,
        "org.opencontainers.image.created": datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "org.opencontainers.image.revision": stack.sources[slime].commit if slime else "",
        "org.opencontainers.image.source": stack.sources[slime].git if slime else "",
        "org.opencontainers.image.base.name": base.image,
        "org.opencontainers.image.base.digest": base.digest or "",
        f"{LABEL_NS}.stack": stack.id,
        f"{LABEL_NS}.stack-hash": stack.hash,
        HASH_LABEL: build_hash,
        f"{LABEL_NS}.base-digest": base.id or "",
        f"{LABEL_NS}.lock": f"sha256:{lock_hash}",
        **{f"{LABEL_NS}.pin.{_label_key(k)}": str(v) for k, v in pins.items()},
        **{f"{LABEL_NS}.patch.{_label_key(p.file)}": f"sha256:{p.sha256}" for p in patches},
    }


def _argv(opts: BuildOptions, out: Path, build_args: dict[str, str], labels: dict[str, str], epoch: int,
          pieces: int = 1, queue: bool = False) -> list[str]:
    """The docker build command: parallelism sized to this host (the host's share for each of the
    `pieces` compile stages that BuildKit runs at once; behind the compile queue, every file at once
    and the queue's slots bound them), the user's build args, the labels."""
    _, jobs, threads = compile_share(pieces)
    sized = (stage_build_args() if queue else
             {"MAX_JOBS": str(jobs), "NVCC_THREADS": str(threads), "APEX_PARALLEL_BUILD": str(apex_shared(jobs)[0])})
    cli_args = {**sized, **build_args, "SOURCE_DATE_EPOCH": str(epoch)}
    argv = [docker_cli(), "build", "--progress=plain", "-f", str(out / "Dockerfile")]
    if queue:  # compilequeue.served makes it before the build starts
        argv += ["--ssh", f"{SSH_ID}={out / 'queue' / 'sock'}"]
    # The wheels-only build exports its last stage (the compiled wheels) to a directory, no image.
    argv += (["--output", f"type=local,dest={out / 'compiled-out'}"] if opts.wheels_only
             else ["--iidfile", str(out / "image.id")])
    for k, v in cli_args.items():
        argv += ["--build-arg", f"{k}={v}"]
    for k, v in labels.items():
        argv += ["--label", f"{k}={v}"]
    ca = opts.ca_bundle if opts.ca_bundle is not None else default_ca_bundle()
    if ca and Path(ca).is_file():
        argv += ["--secret", f"id=ca-bundle,src={ca}"]
    if opts.no_cache:
        argv.append("--no-cache")
    argv.append(str(out / "context"))
    return argv


# --- building ---------------------------------------------------------------------------------

IMAGE_ID_RE = re.compile(r"sha256:[0-9a-f]{64}")  # what docker build --iidfile writes


def _built_image(client, p: Prepared) -> str | None:
    """The id of an image of this content hash that passed its smoke test: those, and only those,
    carry a content tag (`<any repository>:<hash16>`); a failed one stays untagged."""
    for img in client.images.list(filters={"label": f"{HASH_LABEL}={p.hash}"}):
        if (img.labels or {}).get(HASH_LABEL) == p.hash and any(t.endswith(":" + p.hash[:16]) for t in img.tags):
            return img.id
    return None


def _apply_tags(client, image_id: str, refs: list[str]) -> None:
    img = client.images.get(image_id)
    for ref in refs:
        repo, _, tag = ref.rpartition(":")
        if "/" in tag or not repo:
            repo, tag = ref, "latest"
        img.tag(repo, tag)


def _extra_tags(p: Prepared, tags: list[str]) -> list[str]:
    return [t if (":" in t.rsplit("/", 1)[-1] or "/" in t) else f"{p.repository}:{t}" for t in tags]


def build_wheels(opts: BuildOptions) -> dict[str, WheelsOutcome]:
    """Fill the compiled-wheel store for a stack (`invoke wheels.build`, and `invoke build` first):
    each compiled step whose key is not stored is pulled from `opts.wheel_registry` when it has it,
    else compiled by one BuildKit build of the steps up to it (MAX_JOBS from this host's memory, as
    the image build), its wheels exported and stored. Returns step -> key, source (store, registry,
    compiled), log (WheelsOutcome)."""
    from dataclasses import replace

    from ..wheels import wheelstore

    wopts = replace(opts, wheels_only=True, use_store=True, force=False)
    p = prepare(wopts)
    pulled = set()
    if opts.wheel_registry:
        for name, c in p.compiled.items():
            if c.mode == "make" and wheelstore.pull(c.key, opts.wheel_registry, opts.wheel_credentials,
                                                    opts.store_root, opts.echo):
                opts.echo(f"compiled step {name}: {c.key} pulled from {opts.wheel_registry}")
                pulled.add(name)
        if pulled:
            p = prepare(wopts)
    make = {n: c for n, c in p.compiled.items() if c.mode == "make"}
    result = {n: WheelsOutcome(c.key, "registry" if n in pulled else c.source) for n, c in p.compiled.items()}
    if not make:
        return result
    if opts.dry_run:
        for n in make:
            result[n].source = "would compile"
        return result
    opts.echo(f"compiling {', '.join(make)} for the store ({p.dir}; log {p.dir / 'wheels.log'})")
    export = p.dir / "compiled-out"
    shutil.rmtree(export, ignore_errors=True)
    queue = (served(opts.runner, p.dir / "queue", p.queue_slots, opts.echo) if p.queue_slots
             else contextlib.nullcontext())
    with queue:
        rc, lines = stream_build(opts.runner, p.argv, p.env, p.dir / "wheels.log", opts.echo, verbose=opts.verbose,
                                 estimates=past_times(opts.build_root, p.stack.name, p.dir))
    if rc != 0:
        raise BuildError(f"compiling the wheels of {p.stack.id} failed (log: "
                         f"{p.dir / 'wheels.log'}):\n{failure_text(lines)}")
    for name, c in make.items():
        wheelstore.put(c.key, export / c.key, {"flavor": p.stack.name, "step": name, "stack": p.stack.id,
                                               "base": p.base.id},
                       opts.store_root)
        result[name].source, result[name].log = "compiled", str(p.dir / "wheels.log")
        opts.echo(f"compiled step {name}: {c.key} compiled and stored")
    shutil.rmtree(export, ignore_errors=True)
    return result


def build(opts: BuildOptions) -> BuildReport | BuildDryRun:
    """Build (or recognise as built) the image of a stack. Returns the report (also report.json);
    a dry run, the build it would run."""
    started = time.monotonic()
    echo = opts.echo
    echo(f"build of {opts.stack}: checking the lock, base image, patches and compiled wheels ...")
    store_result = build_wheels(opts) if opts.use_store and not opts.wheels_only and not opts.dry_run else {}
    p = prepare(opts)
    echo(f"stack {p.stack.id}: build {p.hash[:12]} in {p.dir}")
    for name, c in p.compiled.items():
        echo(f"  compiled step {name}: "
             + ("from the store" if c.mode == "use"
                else "compiled for the store first" if opts.dry_run and c.storable and opts.use_store
                else "compiled in place")
             + f" ({c.key})")
    if opts.dry_run:
        if p.provisional:
            echo("the plan is provisional: what the warnings above name is missing, so this build hash and the "
                 "compiled keys are not yet the real build's; a real `invoke build` fills what it can reach first")
        # The command itself is the dry run's result: the caller prints it (tasks.build: as multi-line shell).
        return BuildDryRun(p.provisional, p.hash, str(p.dir), p.tag, p.human_tags, p.argv, p.env)

    client = docker_client()
    pull_base(client, p.base, echo)
    tags = [p.tag, *p.human_tags, *_extra_tags(p, opts.tags)]
    # The image's content tag is given only after its smoke test passed (_built_image): an image of
    # this hash is taken as it is, with no step and no smoke test run again, unless asked.
    existing = None if opts.force or opts.no_cache else _built_image(client, p)
    previous = _previous_report(p.dir / REPORT)
    if existing:
        image_id = existing
        echo(f"image {p.tag} ({image_id[:19]}) is up to date: nothing to build (--force or --no-cache rebuilds, "
             "--verify smoke-tests it again)")
        steps, duration = (previous.steps, previous.build_duration_s) if previous else ([], None)
        skipped = True
        if opts.verify:
            echo("smoke test (--verify) ...")
            for line in smoke_test(client, image_id, p.stack).splitlines():
                echo(f"  {line}")
    else:
        echo(f"building with BuildKit (every line in {p.dir / LOG}{'' if opts.verbose else '; --verbose shows them'})")
        rc, lines = stream_build(opts.runner, p.argv, p.env, p.dir / LOG, echo, verbose=opts.verbose,
                                 estimates=past_times(opts.build_root, p.stack.name, p.dir))
        if rc != 0:
            raise BuildError(f"docker build of {p.stack.id} failed (log: {p.dir / LOG}):\n{failure_text(lines)}")
        image_id = readback.read_text(p.dir / "image.id", "image.id", IMAGE_ID_RE,
                                      "sha256:<64 hex digits> (docker build --iidfile)") or ""
        if not image_id:
            raise BuildError(f"docker build of {p.stack.id} wrote no image id ({p.dir / 'image.id'})")
        steps = [StepTiming.from_dict(s) for s in parse_progress(lines)]
        duration, skipped = round(time.monotonic() - started, 2), False
        # The last step runs the smoke test and fails when it fails: the build succeeded, so it passed.
        if any(s.name == "finalize" and s.cached for s in steps):
            echo("smoke test: passed in the image's last step when BuildKit built it (that step is cached: the same "
                 "layers; --verify runs it again)")
        else:
            echo("smoke test: run in the image's last step, beside finalize:")
            for line in smoke_lines(lines):
                echo(f"  {line}")
    in_lock, in_flags = f"{paths.IMAGE_STATE}/{LOCK}", f"{paths.IMAGE_STATE}/{FLAGS}"
    files = read_from_image(client, image_id, [in_lock, in_flags] if slime_source(p.stack) else [in_lock])
    venv_sizes = _venv_sizes(client, image_id, echo)
    _apply_tags(client, image_id, tags)
    image = client.images.get(image_id)
    digest, published = (previous.digest, previous.published) if previous else (None, [])
    lock = json.loads(files[in_lock])
    lock.update({"build_hash": p.hash, "image_id": image_id, "tag": p.tag, "digest": digest, "published": published})
    report = BuildReport(
        tag=p.tag, human_tags=p.human_tags + _extra_tags(p, opts.tags), image_id=image_id, digest=digest,
        published=published,
        size=image.attrs.get("Size"), build_hash=p.hash, stack=p.stack.id, flavor=p.stack.name, base=p.base.to_json(),
        skipped=skipped, build_duration_s=duration, duration_s=round(time.monotonic() - started, 2), steps=steps,
        compiled={n: CompiledWheels(c.key, stored.source if (stored := store_result.get(n)) else c.source,
                                    c.mode == "use", stored.log if stored else None) for n, c in p.compiled.items()},
        patches={x.file: x.sha256 for x in p.patches}, dir=str(p.dir), dockerfile=str(p.dir / "Dockerfile"),
        lock=str(p.dir / LOCK),
        flags=str(p.dir / FLAGS) if slime_source(p.stack) else None, log=str(p.dir / LOG), command=p.argv,
        venv_sizes=venv_sizes,
    )
    out_files: dict[str, str | bytes] = {LOCK: json.dumps(lock, indent=2, sort_keys=True) + "\n"}
    if slime_source(p.stack):
        out_files[FLAGS] = files[in_flags]
    out_files[REPORT] = json.dumps(report.to_json(), indent=2) + "\n"
    write_dir(p.dir, out_files, last=REPORT)
    return report  # the result: the caller prints it (cli.build: report.summary_table())


def _venv_sizes(client, image_id: str, echo: Callable[[str], None]) -> VenvSizes | None:
    """The image's venv-sizes.json (its last RUN wrote it), validated; None, said, for an image without one."""
    import docker

    where = f"{paths.IMAGE_STATE}/{VENV_SIZES_RECORD} in image {image_id[:19]}"
    try:
        data = read_from_image(client, image_id, [f"{paths.IMAGE_STATE}/{VENV_SIZES_RECORD}"])
    except docker.errors.NotFound:
        echo(f"note: {where} is missing (an image built before slimeforge measured its venv): no sizes in the report")
        return None
    try:
        return VenvSizes.parse(next(iter(data.values())), where)
    except ReportError as exc:
        # A measurement, not the image: an odd record never fails the build that made the image.
        echo(f"note: {printable(str(exc))} (the image's last RUN writes it with scripts/venv_sizes.py): no sizes in "
             "the report")
        return None


def _previous_report(path: Path) -> BuildReport | None:
    """An earlier build's report (publish's digest and references are kept): a bad one is built over, so it
    reads as none."""
    try:
        doc = readback.read_json(path, path.name, "a build record")
        return BuildReport.from_dict(doc) if isinstance(doc, dict) else None
    except (readback.RecordError, ReportError):
        return None
