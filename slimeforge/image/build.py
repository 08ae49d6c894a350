"""`invoke build`: render the Dockerfile of a stack, build it with BuildKit, smoke-test it, report.

    prepare(opts) -> Prepared    load + validate everything, render the build directory (no Docker build)
    build(opts) -> dict          prepare, then skip (image with this content hash exists) or build,
                                 smoke-test, tag, and write report.json / stack.lock.json / flags.json

Build directory (`--out`, default build/<flavor>-<hash12>/):
    Dockerfile, context/ (steps.sh, sf, stack.lock.json as input, patches/, sources/<name>.git),
    build.log, report.json, stack.lock.json (read back from the image), flags.json (ditto).

The content hash covers everything that determines the image: the rendered Dockerfile, every
context file, the input lock (every pin, the base digest or image id, each patch's sha256, the
commit of each local source) and the user's build args. BuildKit runs through the docker CLI
(`DOCKER_BUILDKIT=1 docker build`; the Python SDK has no BuildKit); inspect, tag and run use the SDK.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from io import BytesIO
from pathlib import Path
from typing import Any

from .. import paths, records
from ..atomic import dir_problem, write_dir
from ..errors import ConfigError, OperationFailed, Problem
from ..proc import Runner
from ..schema import ENV_NAME_RE, text_problem, text_problems
from ..templating import render
from .dockerapi import EngineUnavailable, docker_client, resolve_base
from .imageref import TAG_RE, image_ref_problems, repository_problems
from .lockcheck import check_patches
from .lockfacts import lock_for_run, patches_for_run
from .patches import PatchContent
from .sources import GIT, LocalSource, dist_files, parse_sources
from .stack import Stack, load_stack
from .steps import (
    LIBRARY_SCRIPTS,
    LOCK_ALL,
    STEP_RUNNER,
    TARGET_SCRIPTS,
    apex_jobs,
    compile_jobs,
    compiled_key,
    finalize_argv,
    image_layout,
    input_lock,
    lock_file,
    lock_files,
    slime_source,
    smoke_argv,
    step_commands,
)

LABEL_NS = "ai.slimeforge"
REPORT, LOCK, FLAGS, LOG = paths.BUILD_REPORT, paths.STACK_LOCK, paths.FLAGS, "build.log"
HASH_LABEL = f"{LABEL_NS}.build-hash"


class BuildError(OperationFailed):
    """The image build, or its smoke test, failed; the message names the step/patch/check."""


@dataclass
class BuildOptions:
    stack: str = "cu13"  # flavor name or a stack YAML path
    out: Path | None = None
    dry_run: bool = False
    base_image: str | None = None
    sources: list[str] = field(default_factory=list)  # NAME=PATH
    build_args: list[str] = field(default_factory=list)  # KEY=VALUE
    no_cache: bool = False
    force: bool = False
    tags: list[str] = field(default_factory=list)  # extra tags: REF or a bare tag for the repository
    repository: str | None = None  # default slimeforge/<stack name>
    # CA bundle mounted (as a BuildKit secret) into steps that download: needed behind a
    # TLS-intercepting proxy. Default: the host's SSL_CERT_FILE. Not part of the content hash.
    ca_bundle: str | None = None
    build_root: Path = paths.BUILDS
    echo: Callable[[str], None] = print
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
    base: dict[str, Any]
    patches: list[PatchContent]
    dockerfile: str
    lock: dict[str, Any]
    build_args: dict[str, str]
    hash: str
    dir: Path
    repository: str
    argv: list[str]
    env: dict[str, str]
    labels: dict[str, str]
    compiled: dict[str, dict[str, Any]] = field(default_factory=dict)  # step -> key, storable, source (store/compile)
    provisional: bool = False  # a dry run's plan with an outside fact missing (named in its warnings)

    @property
    def tag(self) -> str:
        return f"{self.repository}:{self.hash[:16]}"

    @property
    def human_tags(self) -> list[str]:
        return [f"{self.repository}:{self.stack.version}-{self.stack.name}"]


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
            problems.append(Problem("--build-arg", "must be KEY=VALUE with KEY a variable name and VALUE printable text", text))
        else:
            out[key] = value
    return out, problems


STORE_MOUNT, STORE_OUT = "/tmp/sf-compiled", "/opt/sf-compiled"


def render_dockerfile(stack: Stack, base_from: str | None = None, local_sources: dict | None = None, base_id: str | None = None,
                      store: dict[str, str] | None = None, patch_sha: dict[str, str] | None = None, wheels_only: bool = False) -> str:
    """The Dockerfile of a stack (pure: no Docker, no network). `base_id`: the base as resolved
    (digest or local image id), part of the compiled-wheel keys. Each installing step bind-mounts its
    slice of the lock (context/lock/<step>.txt, see steps.lock_files). `store`: compiled step ->
    "use" (its wheels bind-mounted from context/compiled/<key>, nothing compiles) or "make" (compiled
    into /opt/sf-compiled/<key>). `wheels_only`: the steps up to the last compiled one, then a
    scratch stage holding /opt/sf-compiled, exported with `--output type=local`."""
    layout = image_layout(stack, local_sources)
    keys = {s.name: compiled_key(stack, s.name, base_id, patch_sha) for s in stack.plan if s.compiles}
    modes = {n: (m, f"{STORE_MOUNT if m == 'use' else STORE_OUT}/{keys[n]}") for n, m in (store or {}).items()}
    steps = step_commands(stack, layout, base_id, modes, patch_sha)
    for step in steps:
        step["lock_file"] = lock_file(step["name"]) if step["kind"] in ("pip", "wheel_url", "source") else None
    if wheels_only:
        last = max((i for i, s in enumerate(steps) if s["store"] == "make"), default=-1)
        steps = steps[:last + 1]
    first_compile = next((i for i, s in enumerate(steps) if s["compiles"]), -1)
    return _render_dockerfile({
        "stack_id": stack.id,
        "base_ref": base_from or (f"{stack.base.image}@{stack.base.digest}" if stack.base.digest else stack.base.image),
        "state": layout.state,
        "venv": layout.venv,
        "patches_dir": layout.patches_dir,
        "steps": steps,
        "first_compile": first_compile,
        "local_sources": sorted(n for n, s in (local_sources or {}).items() if getattr(s, "kind", "git") == "git"),
        "wheel_steps": sorted(layout.wheel_dirs),
        "patch_files": [p.file for p in stack.used_patches()],
        "patches_from": stack.pins().get("patches.dir", ""),
        "finalize_argv": finalize_argv(stack, layout, f"{layout.state}/stack.input.json"),
        "target_scripts": sorted(TARGET_SCRIPTS),
        "library_scripts": sorted(LIBRARY_SCRIPTS),
        "lock_dir": layout.lock_dir,
        "lock_all": LOCK_ALL,
        "store_mount": STORE_MOUNT,
        "store_out": STORE_OUT,
        "wheels_only": wheels_only,
    })


def _render_dockerfile(variables: dict[str, Any]) -> str:
    """A Dockerfile is read line by line and shell quoting does not reach past a line: a newline
    in any value would start an instruction of its own. The stack's validation refuses control
    characters already; this is the second line of defence, on exactly what is rendered."""
    problems = text_problems(variables)
    if problems:
        raise ConfigError("Dockerfile", problems)
    return render("Dockerfile.j2", variables)


def _source_date_epoch(stack: Stack, cache: Path, runner: Runner) -> int:
    """The commit time of slime's pinned commit (the newest thing in the image that has a date)."""
    src = slime_source(stack) or (stack.patches.from_source if stack.patches else None)
    if src:
        repo = cache / f"{src}-{stack.sources[src].commit}.git"
        if repo.exists():
            res = runner.run([*GIT, "--git-dir", str(repo), "show", "-s", "--format=%ct", stack.sources[src].commit],
                             step="git show (source date)", check=False)
            if res.ok and res.stdout.strip().isdigit():
                return int(res.stdout.strip())
    return 0


def _label_key(text: str) -> str:
    return re.sub(r"[^a-z0-9.-]+", "-", text.lower()).strip("-")


def prepare(opts: BuildOptions) -> Prepared:
    """Validate every input, fetch patches, render and write the build directory. No image is built."""
    stack = load_stack(opts.stack)
    problems: list[Problem] = []
    build_args, problems = parse_build_args(opts.build_args)
    local: dict[str, LocalSource] = {}
    try:
        local = parse_sources(stack, opts.sources)
    except ConfigError as exc:
        problems.extend(exc.problems)
    if opts.out is not None and (why := dir_problem(Path(opts.out))):
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
    if problems:
        raise ConfigError("invoke build", problems)
    cache = paths.sources_cache(opts.build_root)
    # A real build fills a missing outside fact itself (and writes it into the lock); a dry run names it.
    pylock = lock_for_run(stack, opts.dry_run, opts.echo)
    try:
        base = resolve_base(stack, opts.base_image, opts.dry_run, pylock.tool.get("base", {}).get("digest") or None)
    except EngineUnavailable as exc:
        if not opts.dry_run:
            raise
        opts.echo(f"warning: the base image is taken by its tag in this plan: {exc}")
        base = {"image": opts.base_image or stack.base.image, "from": opts.base_image or stack.base.image, "digest": None, "image_id": None}
    patches = patches_for_run(stack, local, cache, pylock, opts.dry_run, opts.echo)
    check_patches(pylock, {p.file: p.sha256 for p in patches})
    from_sources = {n: s for n, s in local.items() if s.kind == "git" and stack.builds_from(n)}
    from_sources.update({n: s for n, s in local.items() if s.kind == "wheels"})
    patch_sha = {p.file: p.sha256 for p in patches}
    compiled = _compiled_plan(stack, base, patch_sha, pylock, opts)
    store = {n: c["mode"] for n, c in compiled.items() if c["mode"]}
    dockerfile = render_dockerfile(stack, base["from"], from_sources, base["digest"] or base["image_id"], store, patch_sha, opts.wheels_only)

    pins = stack.pins()
    pins["base.image"] = base["image"]
    pins["base.digest"] = base["digest"] or (f"none (a local image, id {base['image_id']})" if base["image_id"]
                                             else "none (the base image is not present here; resolved at build)")
    lock_text = input_lock(stack, pylock, patches, set(local), pins=pins, base=base, build_args=build_args,
                           wheel_dirs={n: s.commit for n, s in local.items() if s.kind == "wheels"})  # step -> sha256 of its wheels
    lock = json.loads(lock_text)
    context: dict[str, str | bytes] = {
        "steps.sh": paths.STEP_LIBRARY.read_bytes(),
        "sf": STEP_RUNNER.read_bytes(),
        "stack.lock.json": lock_text,
        **{name: path.read_bytes() for name, path in (TARGET_SCRIPTS | LIBRARY_SCRIPTS).items()},
    }
    context.update({f"patches/{p.file}": p.data for p in patches if not p.missing})
    context.update({f"lock/{name}": text for name, text in lock_files(stack, pylock, image_layout(stack, from_sources)).items()})
    # A store hit's wheels go into the context (bind-mounted into their step). Its SHA256SUMS is in
    # the hash, and the wheels were just checked against it: their bytes are in the hash through it.
    hits = {c["key"]: c["entry"] for c in compiled.values() if c["mode"] == "use"}
    context.update({f"compiled/{key}/SHA256SUMS": (entry.dir / "SHA256SUMS").read_bytes() for key, entry in hits.items()})
    digest = hashlib.sha256()
    for name, content in sorted({"Dockerfile": dockerfile, **{f"context/{k}": v for k, v in context.items()}}.items()):
        data = content.encode() if isinstance(content, str) else content
        digest.update(f"{name}\0{len(data)}\0".encode() + data)
    build_hash = digest.hexdigest()

    out = Path(opts.out) if opts.out else paths.build_dir(opts.build_root, stack.name, build_hash)
    # `COPY patches/` takes the whole folder: a reused --out must not carry another stack's patches.
    shutil.rmtree(out / "context" / "patches", ignore_errors=True)
    shutil.rmtree(out / "context" / "lock", ignore_errors=True)
    shutil.rmtree(out / "context" / "compiled", ignore_errors=True)
    _write_tree(out, {"Dockerfile": dockerfile, **{f"context/{k}": v for k, v in context.items()}}, {"context/sf": 0o755})
    for key, entry in hits.items():
        _link_files(entry.dir, list(entry.wheels), out / "context" / "compiled" / key)
    for name, src in from_sources.items():
        if src.kind == "wheels":
            _copy_wheels(src.path, out / "context" / "wheels" / name)
            continue
        target = out / "context" / "sources" / f"{name}.git"
        if not target.exists():
            from .sources import source_repo

            shutil.copytree(source_repo(stack, name, local, cache), target, symlinks=True)

    epoch = _source_date_epoch(stack, cache, opts.runner)
    repository = opts.repository or f"slimeforge/{stack.name}"
    jobs, threads = compile_jobs()
    cli_args = {"MAX_JOBS": str(jobs), "NVCC_THREADS": str(threads), "APEX_PARALLEL_BUILD": str(apex_jobs(jobs)[0]),
                **build_args, "SOURCE_DATE_EPOCH": str(epoch)}
    slime = slime_source(stack)
    labels = {
        "org.opencontainers.image.title": f"slimeforge {stack.name}",
        "org.opencontainers.image.version": stack.version,
        "org.opencontainers.image.created": datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "org.opencontainers.image.revision": stack.sources[slime].commit if slime else "",
        "org.opencontainers.image.source": stack.sources[slime].git if slime else "",
        "org.opencontainers.image.base.name": base["image"],
        "org.opencontainers.image.base.digest": base["digest"] or "",
        f"{LABEL_NS}.stack": stack.id,
        f"{LABEL_NS}.stack-hash": stack.hash,
        HASH_LABEL: build_hash,
        f"{LABEL_NS}.base-digest": base["digest"] or base["image_id"] or "",
        f"{LABEL_NS}.lock": f"sha256:{pylock.hash}",
        **{f"{LABEL_NS}.pin.{_label_key(k)}": str(v) for k, v in pins.items()},
        **{f"{LABEL_NS}.patch.{_label_key(p.file)}": f"sha256:{p.sha256}" for p in patches},
    }
    argv = [docker_cli(), "build", "--progress=plain", "-f", str(out / "Dockerfile")]
    # The wheels-only build exports its last stage (the compiled wheels) to a directory, no image.
    argv += ["--output", f"type=local,dest={out / 'compiled-out'}"] if opts.wheels_only else ["--iidfile", str(out / "image.id")]
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
    return Prepared(stack, local, base, patches, dockerfile, lock, build_args, build_hash, out, repository, argv,
                    {"DOCKER_BUILDKIT": "1"}, labels, {n: {k: v for k, v in c.items() if k != "entry"} for n, c in compiled.items()},
                    provisional=pylock.provisional or any(p.missing for p in patches))


def _compiled_plan(stack: Stack, base: dict[str, Any], patch_sha: dict[str, str], lock, opts: BuildOptions) -> dict[str, dict[str, Any]]:
    """Each compiled step: key, and how the build gets it: "use" (a verified store entry), "make"
    (wheels-only build of a miss), None (compiled in place: store off, or an editable checkout).
    A store entry that differs from its record raises here, before anything is built."""
    from . import wheelstore

    out: dict[str, dict[str, Any]] = {}
    for name, info in wheelstore.stack_keys(stack, base["digest"] or base["image_id"], patch_sha, lock).items():
        entry = wheelstore.lookup(info["key"], opts.store_root) if opts.use_store and info["storable"] else None
        mode = "use" if entry else ("make" if opts.wheels_only and info["storable"] else None)
        out[name] = {**info, "mode": mode, "entry": entry, "source": "store" if entry else "compiled"}
    return out


def _link_files(src: Path, names: list[str], target: Path) -> None:
    """Hard links where possible (wheels can be gigabytes), else copies."""
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        (target / name).unlink(missing_ok=True)
        try:
            os.link(src / name, target / name)
        except OSError:
            shutil.copy2(src / name, target / name)


def _copy_wheels(src: Path, target: Path) -> None:
    """The wheels of a --source wheel directory into the context (hard links where possible: wheels
    can be gigabytes). Their content is in the hash through the lock's wheel_dirs digest."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for whl in dist_files(src):
        try:
            os.link(whl, target / whl.name)
        except OSError:
            shutil.copy2(whl, target / whl.name)


def _write_tree(root: Path, files: dict[str, str | bytes], modes: dict[str, int]) -> None:
    """Write nested files, each replaced atomically (write_dir works one directory at a time)."""
    by_dir: dict[str, dict[str, str | bytes]] = {}
    for name, content in files.items():
        parent, _, base = name.rpartition("/")
        by_dir.setdefault(parent, {})[base] = content
    for parent, group in sorted(by_dir.items()):
        prefix = f"{parent}/" if parent else ""
        write_dir(root / parent if parent else root, group, modes={b: modes[prefix + b] for b in group if prefix + b in modes})


# --- building ---------------------------------------------------------------------------------

VERTEX_RE = re.compile(r"^#(\d+) \[(?:[^\]]*? )?(\d+)/(\d+)\] (.+)$")
STATUS_RE = re.compile(r"^#(\d+) (CACHED|DONE (\d+(?:\.\d+)?)s|ERROR\b.*)$")
STEP_RE = re.compile(re.escape(paths.IMAGE_STATE) + r"/sf (\S+)")
IMAGE_ID_RE = re.compile(r"sha256:[0-9a-f]{64}")  # what docker build --iidfile writes


def parse_progress(lines: list[str]) -> list[dict[str, Any]]:
    """Per Dockerfile instruction: its stack step, whether BuildKit took it from cache, its time."""
    steps: dict[str, dict[str, Any]] = {}
    for line in lines:
        m = VERTEX_RE.match(line)
        if m:
            vid, idx, total, text = m.groups()
            step = STEP_RE.search(text)
            steps.setdefault(vid, {"index": int(idx), "of": int(total), "name": step.group(1).strip("'") if step else text.split(" ", 1)[0].lower(),
                                   "instruction": text[:160], "cached": False, "duration_s": None})
            continue
        m = STATUS_RE.match(line)
        if m and m.group(1) in steps:
            item = steps[m.group(1)]
            if m.group(2) == "CACHED":
                item["cached"] = True
            elif m.group(3):
                item["duration_s"] = float(m.group(3))
            else:
                item["error"] = True
    return sorted(steps.values(), key=lambda s: s["index"])


def _stream(runner: Runner, argv: list[str], env: dict[str, str], log: Path, echo: Callable[[str], None]) -> tuple[int, list[str]]:
    """Run the build, keep every line in build.log, and show progress: one line per instruction."""
    lines: list[str] = []
    seen: dict[str, str] = {}
    with log.open("w") as fh:

        def on_line(line: str) -> None:
            fh.write(line + "\n")
            lines.append(line)
            m = VERTEX_RE.match(line)
            if m and m.group(1) not in seen:
                step = STEP_RE.search(m.group(4))
                seen[m.group(1)] = f"[{m.group(2)}/{m.group(3)}] {step.group(1) if step else m.group(4)[:60]}"
                return
            m = STATUS_RE.match(line)
            if m and m.group(1) in seen:
                echo(f"  {seen[m.group(1)]:<48} {m.group(2)}")
            elif "slimeforge: ERROR:" in line:
                echo("  " + line)
        rc = runner.stream(argv, on_line, step="docker build", env=env)
    return rc, lines


def _failure(lines: list[str]) -> str:
    errors = [line.split("slimeforge: ERROR:", 1)[1].strip() for line in lines if "slimeforge: ERROR:" in line]
    if errors:
        return "\n".join(dict.fromkeys(errors))
    return "\n".join(lines[-15:])


def _read_from_image(client, image_id: str, paths: list[str]) -> dict[str, bytes]:
    """Files copied out of an image without starting it (a created, never-run container)."""
    out = {}
    container = client.containers.create(image_id, command=["true"])
    try:
        for p in paths:
            chunks, _ = container.get_archive(p)
            with tarfile.open(fileobj=BytesIO(b"".join(chunks))) as tar:
                member = tar.next()
                assert member is not None
                fh = tar.extractfile(member)
                assert fh is not None
                out[p] = fh.read()
    finally:
        container.remove(force=True)
    return out


def smoke_test(client, image_id: str, stack: Stack) -> str:
    """Run the stack's smoke checks inside the image; raise BuildError listing the failures."""
    import docker

    layout = image_layout(stack)
    try:
        out = client.containers.run(image_id, [f"{layout.state}/sf", "smoke", *smoke_argv(stack, layout)], remove=True,
                                    stdout=True, stderr=True, network_disabled=True)
    except docker.errors.ContainerError as exc:
        text = (exc.stderr or b"").decode(errors="replace")
        raise BuildError(f"smoke test of image {image_id[:19]} failed (image left untagged):\n{_failure(text.splitlines())}") from None
    return out.decode(errors="replace")


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


def pull_base(client, base: dict[str, Any], echo: Callable[[str], None]) -> None:
    """Pull the base by its digest when it is not here yet, with a line per layer as it completes
    (BuildKit would pull it too, but silently in build.log and only after the context is sent)."""
    import docker

    if not base.get("digest") or base["from"] == base["image"]:
        return
    try:
        client.images.get(base["from"])
        return
    except docker.errors.ImageNotFound:
        pass
    from .imageref import parse_image_ref
    from .publish import docker_config_credentials

    repo, _, digest = base["from"].partition("@")
    creds = docker_config_credentials(parse_image_ref(repo, "base.image").registry)
    echo(f"pulling base {base['from']} ...")
    try:
        for event in client.api.pull(repo, tag=digest, stream=True, decode=True,
                                     auth_config=creds.auth_config(parse_image_ref(repo).registry) if creds else None):
            if "error" in event:
                raise BuildError(f"pulling base {base['from']} failed: {event['error']}")
            status = event.get("status", "")
            if status in ("Pull complete", "Already exists") or status.startswith(("Digest:", "Status:")):
                echo(f"  {event.get('id', '')} {status}".rstrip())
    except docker.errors.APIError as exc:
        raise BuildError(f"pulling base {base['from']} failed: {exc.explanation or exc}") from None


def build_wheels(opts: BuildOptions) -> dict[str, dict[str, Any]]:
    """Fill the compiled-wheel store for a stack (`invoke wheels.build`, and `invoke build` first):
    each compiled step whose key is not stored is pulled from `opts.wheel_registry` when it has it,
    else compiled by one BuildKit build of the steps up to it (MAX_JOBS from this host's memory, as
    the image build), its wheels exported and stored. Returns step -> key, source (store, registry,
    compiled), log."""
    from dataclasses import replace

    from . import wheelstore

    wopts = replace(opts, wheels_only=True, use_store=True, force=False)
    p = prepare(wopts)
    pulled = set()
    if opts.wheel_registry:
        for name, c in p.compiled.items():
            if c["mode"] == "make" and wheelstore.pull(c["key"], opts.wheel_registry, opts.wheel_credentials, opts.store_root, opts.echo):
                opts.echo(f"compiled step {name}: {c['key']} pulled from {opts.wheel_registry}")
                pulled.add(name)
        if pulled:
            p = prepare(wopts)
    make = {n: c for n, c in p.compiled.items() if c["mode"] == "make"}
    result = {n: {"key": c["key"], "source": "registry" if n in pulled else c["source"]} for n, c in p.compiled.items()}
    if not make:
        return result
    if opts.dry_run:
        for n in make:
            result[n]["source"] = "would compile"
        return result
    opts.echo(f"compiling {', '.join(make)} for the store ({p.dir})")
    export = p.dir / "compiled-out"
    shutil.rmtree(export, ignore_errors=True)
    rc, lines = _stream(opts.runner, p.argv, p.env, p.dir / "wheels.log", opts.echo)
    if rc != 0:
        raise BuildError(f"compiling the wheels of {p.stack.id} failed (log: {p.dir / 'wheels.log'}):\n{_failure(lines)}")
    for name, c in make.items():
        wheelstore.put(c["key"], export / c["key"], {"flavor": p.stack.name, "step": name, "stack": p.stack.id,
                                                    "base": p.base["digest"] or p.base["image_id"]}, opts.store_root)
        result[name].update(source="compiled", log=str(p.dir / "wheels.log"))
        opts.echo(f"compiled step {name}: {c['key']} compiled and stored")
    shutil.rmtree(export, ignore_errors=True)
    return result


def build(opts: BuildOptions) -> dict[str, Any]:
    """Build (or recognise as built) the image of a stack. Returns the report (also report.json)."""
    started = time.monotonic()
    echo = opts.echo
    store_result = build_wheels(opts) if opts.use_store and not opts.wheels_only and not opts.dry_run else {}
    p = prepare(opts)
    echo(f"stack {p.stack.id}: build {p.hash[:12]} in {p.dir}")
    for name, c in p.compiled.items():
        echo(f"  compiled step {name}: " + ("from the store" if c["mode"] == "use" else "compiled for the store first" if
                                            opts.dry_run and c["storable"] and opts.use_store else "compiled in place") + f" ({c['key']})")
    if opts.dry_run:
        import shlex

        echo("would run: " + " ".join(f"{k}={v}" for k, v in p.env.items()) + " " + shlex.join(p.argv))
        if p.provisional:
            echo("the plan is provisional: what the warnings above name is missing, so this build hash and the compiled keys "
                 "are not yet the real build's; a real `invoke build` fills what it can reach first")
        return {"dry_run": True, "provisional": p.provisional, "build_hash": p.hash, "dir": str(p.dir), "tag": p.tag, "human_tags": p.human_tags, "command": p.argv}

    client = docker_client()
    pull_base(client, p.base, echo)
    tags = [p.tag, *p.human_tags, *_extra_tags(p, opts.tags)]
    existing = None if opts.force else _built_image(client, p)
    previous = _read_json(p.dir / REPORT)
    if existing:
        image_id = existing
        echo(f"image {p.tag} ({image_id[:19]}) is up to date: nothing to build (--force rebuilds)")
        steps, duration, skipped = previous.get("steps", []), previous.get("build_duration_s"), True
    else:
        rc, lines = _stream(opts.runner, p.argv, p.env, p.dir / LOG, echo)
        if rc != 0:
            raise BuildError(f"docker build of {p.stack.id} failed (log: {p.dir / LOG}):\n{_failure(lines)}")
        image_id = records.read_text(p.dir / "image.id", "image.id", IMAGE_ID_RE, "sha256:<64 hex digits> (docker build --iidfile)") or ""
        if not image_id:
            raise BuildError(f"docker build of {p.stack.id} wrote no image id ({p.dir / 'image.id'})")
        steps, duration, skipped = parse_progress(lines), round(time.monotonic() - started, 2), False
        echo("smoke test ...")
        for line in smoke_test(client, image_id, p.stack).splitlines():
            echo(f"  {line}")
    in_lock, in_flags = f"{paths.IMAGE_STATE}/{LOCK}", f"{paths.IMAGE_STATE}/{FLAGS}"
    files = _read_from_image(client, image_id, [in_lock, in_flags] if slime_source(p.stack) else [in_lock])
    _apply_tags(client, image_id, tags)
    image = client.images.get(image_id)
    lock = json.loads(files[in_lock])
    lock.update({"build_hash": p.hash, "image_id": image_id, "tag": p.tag, "digest": previous.get("digest"),
                 "published": previous.get("published", [])})
    report = {
        "tag": p.tag,
        "human_tags": p.human_tags + _extra_tags(p, opts.tags),
        "image_id": image_id,
        "digest": previous.get("digest"),
        "published": previous.get("published", []),
        "size": image.attrs.get("Size"),
        "build_hash": p.hash,
        "stack": p.stack.id,
        "flavor": p.stack.name,
        "base": p.base,
        "skipped": skipped,
        "build_duration_s": duration,
        "duration_s": round(time.monotonic() - started, 2),
        "steps": steps,
        "cache": {"hits": sum(1 for s in steps if s.get("cached")), "steps": len(steps)},
        # Per compiled step: its key, and where its wheels came from this time (store, registry,
        # compiled: compiled for the store by this build, then installed from it).
        "compiled": {n: {"key": c["key"], "source": store_result.get(n, {}).get("source", c["source"]),
                         "from_store": c["mode"] == "use", **({"log": store_result[n]["log"]} if "log" in store_result.get(n, {}) else {})}
                     for n, c in p.compiled.items()},
        "patches": {x.file: x.sha256 for x in p.patches},
        "dir": str(p.dir),
        "dockerfile": str(p.dir / "Dockerfile"),
        "lock": str(p.dir / LOCK),
        "flags": str(p.dir / FLAGS) if slime_source(p.stack) else None,
        "log": str(p.dir / LOG),
        "command": p.argv,
    }
    out_files: dict[str, str | bytes] = {LOCK: json.dumps(lock, indent=2, sort_keys=True) + "\n"}
    if slime_source(p.stack):
        out_files[FLAGS] = files[in_flags]
    out_files[REPORT] = json.dumps(report, indent=2) + "\n"
    write_dir(p.dir, out_files, last=REPORT)
    echo(summary_table(report))
    return report


def _read_json(path: Path) -> dict[str, Any]:
    """An earlier build's record: a bad one is rebuilt over, so it reads as none."""
    try:
        doc = records.read_json(path, path.name, "a build record")
    except records.RecordError:
        return {}
    return doc if isinstance(doc, dict) else {}


def summary_table(report: dict[str, Any]) -> str:
    compiled = report.get("compiled") or {}
    rows = [f"{'step':<24} {'cached':<7} {'seconds':>8}  compiled wheels"]
    for s in report["steps"]:
        dur = "" if s.get("duration_s") is None else f"{s['duration_s']:.1f}"
        c = compiled.get(s["name"])
        how = {"store": "store hit, nothing compiled", "registry": "pulled into the store, nothing compiled",
               "compiled": "a miss: compiled for the store first"}
        note = "" if not c else (f"{how.get(c['source'], c['source'])} ({c['key']})" if c.get("from_store") else f"compiled in place ({c['key']})")
        rows.append(f"{s['name'][:24]:<24} {'yes' if s.get('cached') else 'no':<7} {dur:>8}  {note}".rstrip())
    size = report["size"] or 0
    rows.append(f"image {report['tag']}  id {report['image_id'][:19]}  size {size / 1e6:.1f} MB  "
                f"cache {report['cache']['hits']}/{report['cache']['steps']}" + ("  (skipped: up to date)" if report["skipped"] else ""))
    rows.append(f"report {report['dir']}/{REPORT}  flags {report['flags']}")
    return "\n".join(rows)

