"""The compiled-wheel store: each compiled step's wheels, kept by `steps.compiled_key`, so that a
key is compiled once and then installed anywhere (image builds, bare-metal installs, other hosts).

Local store: $XDG_CACHE_HOME/slimeforge/compiled/<key>/ (default ~/.cache/...; not
.../slimeforge/wheels, which `invoke patches.check` uses for its downloads), one directory per key:

    <key>/*.whl        the step's wheels
    <key>/SHA256SUMS   their sha256 (`sha256sum` format): what the step library checks before it
                       installs them (sf_compiled --wheels), and what this module checks on every use
    <key>/record.json  key, flavor, step, the wheels with their sha256, where the entry came from

The compiled wheels' sha256 cannot be in the lock (they do not exist when it is made): the record
is their lock. A file that differs from its record is refused, never installed.

Remote store: any OCI registry (ECR included), one `FROM scratch` image per key,
<registry>/slimeforge-compiled:<key>, holding /wheels/<key>/ (the same three kinds of file); pushed
and pulled through the Docker Engine with the publish machinery's credentials and retries.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any, TypedDict

from ... import paths, readback
from ...errors import ConfigError, Problem, SlimeforgeError
from ..imageref import DOMAIN_RE, ImageRef, parse_image_ref
from ..remote.registry import Credentials, Retry
from ..stack import AptStep, SourceStep

SUMS, RECORD = "SHA256SUMS", "record.json"
# A line of SHA256SUMS as `sha256sum` writes it (text mode): the one grammar; steps.sh's
# _sf_sums_line reads the same (bash, before any Python runs there), and a pair test holds the two.
SUMS_LINE_RE = re.compile(r"([0-9a-f]{64})  ([A-Za-z0-9_.+-]{1,200}\.whl)")
REMOTE_REPOSITORY = "slimeforge-compiled"
# A key as steps.compiled_key makes it (<flavor>-<step>-<16 hex>); also a valid OCI tag.
KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
WHEEL_RE = re.compile(r"[A-Za-z0-9_.+-]{1,200}\.whl")
MAX_WHEELS = 64  # per key: a step builds a handful; anything more is not an entry of ours


class WheelStoreError(SlimeforgeError):
    """A store entry is missing, damaged or differs from its record; the message names key and file."""


def store_root() -> Path:
    """$SLIMEFORGE_COMPILED_STORE, else paths.user_cache()/compiled (~/.cache/slimeforge/compiled by default)."""
    if os.environ.get("SLIMEFORGE_COMPILED_STORE"):
        return Path(os.environ["SLIMEFORGE_COMPILED_STORE"])
    return paths.user_cache() / "compiled"


def check_key(key: str) -> str:
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        raise ConfigError("compiled-wheel store", [Problem("key", "is not a compiled-wheel key", key,
                                                           "<flavor>-<step>-<16 hex> as `invoke wheels.ls` lists "
                                                           "them")])
    return key


class StoreRow(TypedDict):
    """One compiled step of a stack in the store (`invoke wheels.ls`, its --json keys)."""

    step: str
    key: str
    status: str  # hit, miss, not stored
    where: list[str]  # the local entry, the remote reference
    size: int


@dataclass
class Entry:
    key: str
    dir: Path
    wheels: dict[str, str]  # file name -> sha256
    record: dict[str, object] = field(default_factory=dict)  # record.json as read (checked: key, wheels)

    @property
    def size(self) -> int:
        return sum((self.dir / w).stat().st_size for w in self.wheels)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_sums(path: Path, where: str) -> dict[str, str]:
    """SHA256SUMS by its grammar: `<64 hex>  <wheel file name>` lines, nothing else."""
    out: dict[str, str] = {}
    try:  # the one reader: a regular file, bounded (a line per wheel), strict UTF-8
        raw = readback.read_bytes(path, path.name, "`<sha256>  <file>.whl` lines", max_bytes=MAX_WHEELS * 300)
        text = readback.decode(path, path.name, "`<sha256>  <file>.whl` lines", raw) if raw is not None else None
    except readback.RecordError as exc:
        raise WheelStoreError(f"{where}: {path.name} {exc.problems[0].message}") from None
    if text is None:
        raise WheelStoreError(f"{where}: cannot read {path.name}: no such file")
    for n, line in enumerate(text.splitlines(), 1):
        m = SUMS_LINE_RE.fullmatch(line)
        if not m:
            raise WheelStoreError(f"{where}: {path.name} line {n} is not `<sha256>  <file>.whl`: {line[:120]!r}")
        out[m.group(2)] = m.group(1)
    if not out or len(out) > MAX_WHEELS:
        raise WheelStoreError(f"{where}: {path.name} lists {len(out)} wheel(s); an entry holds 1 to {MAX_WHEELS}")
    return out


def verify(directory: Path, key: str, hash_wheels: bool = True) -> Entry:
    """The entry in `directory`, every wheel checked against SHA256SUMS (and record.json, where
    present): a missing, extra or changed wheel raises WheelStoreError; nothing is installed from it.
    hash_wheels=False leaves the wheels' bytes to the installer's own check (see lookup)."""
    where = f"compiled-wheel store entry {key} ({directory})"
    sums = read_sums(directory / SUMS, where)
    present = sorted(p.name for p in directory.glob("*.whl"))
    if present != sorted(sums):
        raise WheelStoreError(f"{where}: its wheels {present} are not the ones its {SUMS} lists {sorted(sums)}; "
                              "refused")
    record: dict[str, object] = {}
    if (directory / RECORD).exists():
        try:
            record = readback.read_json(directory / RECORD, RECORD, "the record of a store entry",
                                       lambda d: None if isinstance(d, dict) else "is not a JSON object",
                                        max_bytes=1 << 20) or {}
        except readback.RecordError as exc:
            raise WheelStoreError(f"{where}: {RECORD} {exc.problems[0].message}") from None
        if record.get("key") != key or record.get("wheels") != sums:
            raise WheelStoreError(f"{where}: {RECORD} does not match the entry (its key or wheels differ from "
                                  f"{SUMS}); refused")
    for name, want in sums.items() if hash_wheels else ():
        have = sha256_file(directory / name)
        if have != want:
            raise WheelStoreError(f"{where}: {name} has sha256 {have}, its record says {want}: refused "
                                  f"(remove {directory} and compile again, or pull it again)")
    return Entry(key, directory, sums, record)


def lookup(key: str, root: Path | None = None, hash_wheels: bool = True) -> Entry | None:
    """The verified entry of `key`, or None (a miss). A damaged entry raises: it is never a silent miss.
    hash_wheels=False: the record and the wheels' names only, for a caller whose installer checks
    every wheel against SHA256SUMS itself right before installing it (install.sh)."""
    directory = (root or store_root()) / check_key(key)
    return verify(directory, key, hash_wheels) if directory.is_dir() else None


def put(key: str, source: Path, meta: Mapping[str, object], root: Path | None = None) -> Entry:
    """Store the wheels of `source` (a directory with SHA256SUMS, as the step library writes it) as
    `key`, all or nothing: assembled beside the store, checked, renamed into place."""
    root = root or store_root()
    check_key(key)
    where = f"compiled wheels of {key} ({source})"
    sums = read_sums(source / SUMS, where)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    try:
        for name in sums:
            try:
                os.link(source / name, tmp / name)
            except OSError:
                shutil.copy2(source / name, tmp / name)
        shutil.copy2(source / SUMS, tmp / SUMS)
        record = {"key": key, "wheels": sums, **meta}
        (tmp / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        entry = verify(tmp, key)
        target = root / key
        if target.exists():  # replaced: the old one moves aside first, so the key is never half there
            old = Path(tempfile.mkdtemp(prefix=f".{key}.old.", dir=root))
            os.rename(target, old / key)
            shutil.rmtree(old, ignore_errors=True)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    entry.dir = root / key
    return entry


def keys_in(root: Path | None = None) -> list[str]:
    root = root or store_root()
    return sorted(p.name for p in root.iterdir() if p.is_dir() and KEY_RE.fullmatch(p.name)
                  and not p.name.startswith(".")) \
        if root.is_dir() else []


# --- what a stack needs ----------------------------------------------------------------------


@dataclass(frozen=True)
class CompiledStep:
    """A compiled step as the store knows it: its key, and whether the store can hold its wheels."""

    key: str
    storable: bool


def stack_keys(stack, base_id: str | None, patch_sha: dict[str, str] | None, lock=None) -> dict[str, CompiledStep]:
    """Each compiled step of `stack`: its key and whether it can come from the store: a checkout
    installed as a path (editable) cannot, nor a pip step with no sdist in its slice of `lock`
    (nothing compiles: cu13's flash-attn step is empty)."""
    from ..steps import compiled_key

    out = {}
    for step in stack.plan:
        if not step.compiles:
            continue
        if isinstance(step, SourceStep):
            storable = not step.editable
        else:
            own = () if isinstance(step, AptStep) else step.requirements
            names = lock.steps.get(step.name, []) if lock is not None else list(own)
            storable = any(lock.packages[n].kind == "sdist" for n in names) if lock is not None else bool(names)
        out[step.name] = CompiledStep(compiled_key(stack, step.name, base_id, patch_sha), storable)
    return out


@dataclass(frozen=True)
class CompiledPlan:
    """How this build gets a compiled step's wheels: `mode` "use" (a verified store entry), "make"
    (a wheels-only build compiles the miss for the store) or None (compiled in place: store off, or
    an editable checkout); `source` says where they came from (store, compiled)."""

    key: str
    storable: bool
    mode: str | None
    source: str
    entry: Entry | None = None

    def to_json(self) -> dict[str, object]:
        return {"key": self.key, "storable": self.storable, "mode": self.mode, "source": self.source}


def compiled_plan(stack, base_id: str | None, patch_sha: dict[str, str], lock, *, use_store: bool, wheels_only: bool,
                  store_root: Path | None) -> dict[str, CompiledPlan]:
    """Each compiled step's plan for an image build (`wheels_only`: the build that compiles misses
    for the store). A store entry that differs from its record raises here, before anything is built."""
    out = {}
    for name, info in stack_keys(stack, base_id, patch_sha, lock).items():
        entry = lookup(info.key, store_root) if use_store and info.storable else None
        mode = "use" if entry else ("make" if wheels_only and info.storable else None)
        out[name] = CompiledPlan(info.key, info.storable, mode, "store" if entry else "compiled", entry)
    return out


# --- remote store: one FROM scratch image per key ----------------------------------------------


def remote_ref(registry: str, key: str) -> ImageRef:
    """<registry>/slimeforge-compiled:<key>, checked by the image-reference grammar of publish."""
    check_key(key)
    host = registry.split("/", 1)[0] if isinstance(registry, str) else ""
    problem = Problem("--registry", "is not a registry host[:port][/path]", registry,
                      "e.g. 127.0.0.1:5000, registry.example.com/team, <account>.dkr.ecr.<region>.amazonaws.com")
    if not host or len(registry) > 200 or any(ord(c) < 33 or ord(c) == 127 for c
                                              in registry) or not DOMAIN_RE.fullmatch(host):
        raise ConfigError("compiled-wheel store", [problem])
    try:
        ref = parse_image_ref(f"{registry.rstrip('/')}/{REMOTE_REPOSITORY}:{key}", "--registry")
    except ConfigError:
        raise ConfigError("compiled-wheel store", [problem]) from None
    if ref.registry != host:  # "myhost/x" without a dot or port would silently mean Docker Hub
        raise ConfigError("compiled-wheel store", [problem])
    return ref


def ecr_credentials(ref: ImageRef, create: bool, echo: Callable[[str], None] = print) -> Credentials | None:
    """For an ECR registry: a login from an ECR authorization token (AWS credentials as boto3 finds
    them; API endpoint $AWS_ENDPOINT_URL_ECR), and for a push the repository created when missing,
    with immutable tags (a key names one content: it must never move). None for other registries."""
    from ..remote import ecr

    registry = ecr.parse_ecr_host(ref.registry)
    if registry is None:
        return None
    client = ecr.client(registry.region, os.environ.get("AWS_ENDPOINT_URL_ECR"))
    credentials, _ = ecr.login(client, registry)
    if create:
        ecr.ensure_repository(client, registry, ref.repository, ecr.RepositorySettings(tag_immutability=True,
                                                                                       scan_on_push=False), echo)
    return credentials


def _docker():
    from ..dockerapi import docker_client

    return docker_client()


def push(key: str, registry: str, credentials: Credentials | None = None, root: Path | None = None,
         echo: Callable[[str], None] = print, retry: Retry | None = None) -> str:
    """Push the (verified) local entry of `key` as <registry>/slimeforge-compiled:<key>; its digest."""
    from ..publish.push import push_tag

    entry = lookup(key, root)
    if entry is None:
        raise WheelStoreError(f"compiled-wheel store: no local entry {key} to push (invoke wheels.build first)")
    from ..remote.credentials import docker_config_credentials
    from ..remote.registry import RegistryAPI

    ref = remote_ref(registry, key)
    credentials = credentials or ecr_credentials(ref, create=True, echo=echo)
    # A key names one content: a registry that has the tag already has these wheels (and an ECR
    # repository's immutable tag could not be pushed again).
    there = RegistryAPI(ref.registry, credentials or docker_config_credentials(ref.registry),
                        echo=echo).manifest(ref.repository, key)
    if there is not None:
        echo(f"{ref} is already in the registry ({there.digest}): nothing to push")
        return there.digest
    client = _docker()
    with tempfile.TemporaryDirectory(prefix="sf-wheels-push-") as tmp:
        ctx = Path(tmp)
        (ctx / key).mkdir()
        for name in [*entry.wheels, SUMS, RECORD]:
            try:
                os.link(entry.dir / name, ctx / key / name)
            except OSError:
                shutil.copy2(entry.dir / name, ctx / key / name)
        (ctx / "Dockerfile").write_text(f"FROM scratch\nCOPY {key}/ /wheels/{key}/\n")
        from docker.errors import BuildError, DockerException

        try:
            client.images.build(path=str(ctx), tag=f"{ref.name}:{key}", rm=True,
                                labels={"ai.slimeforge.compiled-key": key})
        except (BuildError, DockerException) as exc:
            raise WheelStoreError(f"compiled-wheel store: making the image of {key} failed: {exc}") from None
    return push_tag(client, ref, credentials, echo, retry or Retry())


def pull(key: str, registry: str, credentials: Credentials | None = None, root: Path | None = None,
         echo: Callable[[str], None] = print) -> Entry | None:
    """Pull <registry>/slimeforge-compiled:<key> into the local store, verified; None where the
    registry has no such tag (a miss). Any other failure raises."""
    from docker.errors import APIError, NotFound

    from ..publish.push import push_failure

    ref = remote_ref(registry, key)
    credentials = credentials or ecr_credentials(ref, create=False, echo=echo)
    client = _docker()
    auth = credentials.auth_config(ref.registry) if credentials else None
    echo(f"pulling {ref.name}:{key}")
    try:
        for event in client.api.pull(ref.name, tag=key, stream=True, decode=True, auth_config=auth):
            if "error" in event or "errorDetail" in event:
                message = (event.get("errorDetail") or {}).get("message") or event.get("error", "")
                if "not found" in message.lower() or "manifest unknown" in message.lower():
                    return None
                raise push_failure(ref, message, credentials)
    except NotFound:
        return None
    except APIError as exc:
        if "not found" in str(exc.explanation or exc).lower() or ("manifest "
                                                                 "unknown") in str(exc.explanation or exc).lower():
            return None
        raise push_failure(ref, str(exc.explanation or exc), credentials) from None
    container = client.containers.create(f"{ref.name}:{key}", command=["true"])
    try:
        chunks, _ = container.get_archive(f"/wheels/{key}")
        data = b"".join(chunks)
    finally:
        container.remove(force=True)
        # The store holds the files now; the image was only their carrier.
        client.images.remove(f"{ref.name}:{key}", noprune=False)
    root = root or store_root()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{key}.pull.", dir=root) as tmp:
        dest = Path(tmp)
        with tarfile.open(fileobj=BytesIO(data)) as tar:
            for member in tar.getmembers():
                name = member.name.split("/", 1)[1] if "/" in member.name else ""
                if member.isdir() and not name:
                    continue
                if not member.isfile() or not (WHEEL_RE.fullmatch(name) or name in (SUMS, RECORD)):
                    raise WheelStoreError(f"{ref.name}:{key}: unexpected file {member.name!r} in the image; refused")
                fh = tar.extractfile(member)
                assert fh is not None
                (dest / name).write_bytes(fh.read())
        remote = verify(dest, key)  # the record as pushed must match the bytes pulled
        meta = {k: v for k, v in remote.record.items() if k not in ("key", "wheels")}
        return put(key, dest, {**meta, "pulled_from": f"{ref.name}:{key}"}, root)


# --- listing ----------------------------------------------------------------------------------


def known_stacks(extra: list[str] | None = None) -> list[Any]:
    """The flavors in images/ and any stack files given: what `--unused` measures against."""
    from ..stack import load_stack

    names = sorted(p.stem for p in paths.IMAGES.glob("*.yaml") if p.stem != "common")
    return [load_stack(n) for n in [*names, *(extra or [])]]


def needed(stack) -> dict[str, CompiledStep]:
    """The compiled keys a stack's build would use (base as `invoke build` resolves it, patches as
    the lock records them), without side effects."""
    from ..dockerapi import resolve_base
    from ..lock.lockcheck import checked_lock

    pylock = checked_lock(stack)
    base = resolve_base(stack, None, True, pylock.tool.get("base", {}).get("digest") or None)
    patch_sha = dict(pylock.patch_sha256)
    return stack_keys(stack, base.id, patch_sha, pylock)


def listing(stack, root: Path | None = None, registry: str | None = None,
            credentials: Credentials | None = None) -> list[StoreRow]:
    """Per compiled step of `stack`: key, hit or miss here, where (the local entry, and the remote
    tag when `registry` has it), size."""
    from ..remote.registry import RegistryAPI

    api = None
    if registry:
        ref = remote_ref(registry, "k")
        api = RegistryAPI(ref.registry, credentials or ecr_credentials(ref, create=False, echo=lambda s: None),
                          echo=lambda s: None)
    rows: list[StoreRow] = []
    for step, info in needed(stack).items():
        entry = lookup(info.key, root) if info.storable else None
        where = [str(entry.dir)] if entry else []
        if api is not None and registry and info.storable:
            ref = remote_ref(registry, info.key)
            if api.manifest(ref.repository, info.key) is not None:
                where.append(str(ref))
        rows.append({"step": step, "key": info.key,
                     "status": "hit" if entry else ("miss" if info.storable else "not stored"),
                     "where": where, "size": entry.size if entry else 0})
    return rows


def unused(stacks: list[Any], root: Path | None = None) -> list[str]:
    """Keys in the local store that none of `stacks` uses (garbage: safe to delete)."""
    from ..lock.lockfile import LockError

    used: set[str] = set()
    for s in stacks:
        try:
            used |= {info.key for info in needed(s).values()}
        except LockError:
            continue  # a flavor with no lock cannot be built: it uses no key
    return [k for k in keys_in(root) if k not in used]


def push_stack(stack, registry: str, credentials: Credentials | None = None, root: Path | None = None,
               echo: Callable[[str], None] = print) -> dict[str, str]:
    """Push every stored key of `stack` (`invoke wheels.push`); step -> pushed reference or why not."""
    remote_ref(registry, "k")  # the registry is checked before anything is pushed
    out = {}
    for row in listing(stack, root):
        if row["status"] != "hit":
            out[row["step"]] = f"not pushed: {row['status']} here (invoke wheels.build first)"
            continue
        digest = push(row["key"], registry, credentials, root, echo)
        out[row["step"]] = f"{remote_ref(registry, row['key'])}@{digest}"
    return out


def pull_stack(stack, registry: str, credentials: Credentials | None = None, root: Path | None = None,
               echo: Callable[[str], None] = print) -> dict[str, str]:
    """Pull every key of `stack` not stored here (`invoke wheels.pull`); step -> what happened."""
    remote_ref(registry, "k")
    out = {}
    for row in listing(stack, root):
        if row["status"] == "hit":
            out[row["step"]] = f"hit: already stored ({row['key']})"
        elif row["status"] == "miss":
            entry = pull(row["key"], registry, credentials, root, echo)
            out[row["step"]] = f"pulled {row['key']}" if entry else f"miss: {registry} has no {row['key']}"
        else:
            out[row["step"]] = row["status"]
    return out
