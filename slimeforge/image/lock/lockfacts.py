"""Outside facts: what a lock records that no index holds, asked of where it lives.

    base_image_digest(image)   the digest the base image's tag points at, asked of its registry
    url_sha256(url)            the router wheel's sha256: the wheel downloaded once (size-bounded)
    target.uv_wheel(stack)     the pinned uv's wheel for the lock's platform: its URL and sha256, from the index
    patch_hashes(stack, ...)   the sha256 of each patch file, read from the pinned slime commit

A lock made where GitHub or the base image's registry cannot be reached lacks some of them. Each is then a `Missing`
fact (lockcheck.py; its one remedy: remedies.py): a dry run renders the plan anyway and names it (and what fills it);
`invoke lock --complete` fills only those, without resolving again; a real build or install fills them itself where it
can (`lock_for_run`), writes them into the lock file and says so, and refuses only for what it cannot fill.
"""

from __future__ import annotations

import copy
import hashlib
import json
import tomllib
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ... import paths
from ...errors import ConfigError, Problem, SlimeforgeError
from ...schema import WHOLE_RE
from ..stack import Stack, load_stack
from .lockcheck import Missing, check_lock, checked_lock, missing_facts
from .lockfile import (
    DIGEST_RE,
    SHA256_RE,
    LockError,
    LockFile,
    load_lock,
    lock_command,
    lock_ref,
    read_lock,
    write_lock,
)
from .target import uv_wheel

ROUTER_LIMIT = 256 << 20  # the router wheel is tens of MB; anything this large is not it


# Where each fact goes: its table, and the field a single value (given by hand) fills.
WHERE = {"base_digest": ("tool.slimeforge.base", "digest"), "router_sha256": ("tool.slimeforge.router", "sha256"),
         "uv_wheel": ("tool.slimeforge.uv-wheel", "")}


def ask(fact: Missing, stack: Stack, lock: LockFile, echo: Callable[[str], None]) -> dict[str, str] | None:
    """One missing fact asked of where it lives, as the fields it fills; None, with a warning, where it
    cannot be reached."""
    if fact.key == "router_sha256":
        assert stack.router is not None
        echo(f"  downloading the router wheel once to hash it: {stack.router.wheel}")
        sha = url_sha256(stack.router.wheel, echo, ROUTER_LIMIT)
        return {"sha256": sha} if sha else None
    if fact.key == "uv_wheel":
        echo(f"  asking the index for the wheel of uv {stack.versions.get('uv')} ({stack.uv_platform})")
        return uv_wheel(stack, lock.tool.get("exclude-newer") or "", None, echo)
    try:
        digest = base_image_digest(stack.base.image, echo)
    except LockError as exc:  # the registry answers, but has no such tag (a locally imported base)
        echo(f"  {exc}")
        return None
    return {"digest": digest} if digest else None


def with_facts(lock: LockFile, facts: dict[str, dict[str, str]]) -> str:
    """The lock's text with only these facts' fields filled in; every other byte as it was (checked by
    parsing both: nothing but these fields may differ)."""
    text = lock.text
    expected = copy.deepcopy(tomllib.loads(text))
    for key, fields in facts.items():
        table = WHERE[key][0]
        for name, value in fields.items():
            text = _set_field(text, table, name, value, lock.path)
            node = expected
            for part in table.split("."):
                node = node.setdefault(part, {})
            node[name] = value
    if tomllib.loads(text) != expected:
        raise LockError(f"{lock.path}: its [tool.slimeforge] tables are not as `invoke lock` writes them; re-lock "
                        f"(`{lock_command(lock_ref(lock))}`)")
    return text


def _set_field(text: str, table: str, name: str, value: str, path: Path) -> str:
    lines = text.split("\n")
    if f"[{table}]" not in lines:
        node: object = tomllib.loads(text)
        for part in table.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:  # there, but not as `invoke lock` writes its header
            raise LockError(f"{path}: has no [{table}] table to complete; re-lock")
        # A table that a lock of an earlier version did not have (uv-wheel): appended after the last
        # one (every table of [tool.slimeforge] comes after the packages).
        while lines and not lines[-1].strip():
            lines.pop()
        return "\n".join([*lines, "", f"[{table}]", f"{json.dumps(name)} = {json.dumps(value)}", ""])
    start = lines.index(f"[{table}]")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines))
    line = f"{json.dumps(name)} = {json.dumps(value)}"
    for i in range(start + 1, end):
        if lines[i].split("=", 1)[0].strip().strip('"') == name:
            lines[i] = line
            return "\n".join(lines)
    last = max((i for i in range(start, end) if lines[i].strip()), default=start)
    lines.insert(last + 1, line)
    return "\n".join(lines)


def fill(stack: Stack, lock: LockFile, echo: Callable[[str], None], given: dict[str, str] | None = None) -> LockFile:
    """Ask for each missing fact (or take it as given), write what was found into the lock file
    (atomically, nothing else changed) and say so. Returns the lock as it now is."""
    found: dict[str, dict[str, str]] = {}
    for fact in missing_facts(stack, lock):
        by_hand = (given or {}).get(fact.key)
        value = {WHERE[fact.key][1]: by_hand} if by_hand else ask(fact, stack, lock, echo)
        if value:
            found[fact.key] = value
    if not found:
        return lock
    try:
        write_lock(lock.path, with_facts(lock, found))
    except OSError as exc:
        raise LockError(f"{lock.path}: cannot be written ({exc.strerror}), so the facts found "
                        f"({', '.join(sorted(found))}) "
                        "cannot be recorded; make it writable, or complete the lock where it is") from None
    names = {"base_digest": "the base image's digest", "router_sha256": "the router wheel's sha256",
             "uv_wheel": "the wheel of the stack's uv"}
    for key, value in found.items():
        echo(f"{lock.path}: {names[key]} filled in: {' '.join(value.values())}")
    echo(f"  the lock file changed: commit it ({lock.path}), so that every build and install takes the same")
    return read_lock(lock.path)


def lock_for_run(stack: Stack, dry_run: bool, echo: Callable[[str], None]) -> LockFile:
    """The stack's checked lock for a build or an install. A dry run names each missing outside
    fact and renders with it marked (`LockFile.provisional`); a real run fills them where it can
    reach them, and refuses only for one it needs and cannot fill."""
    lock = checked_lock(stack)
    missing = missing_facts(stack, lock)
    if not missing:
        return lock
    if dry_run:
        for fact in missing:
            echo(f"warning: {fact.warning(lock.path)}")
        return replace(lock, provisional=True)
    lock = fill(stack, lock, echo)
    left = missing_facts(stack, lock)
    for fact in left:
        if not fact.required:
            echo(f"warning: {fact.warning(lock.path)}")
    needed = [f for f in left if f.required]
    if needed:
        raise LockError(f"{lock.path}: cannot build or install without {', '.join(f.what for f in needed)}, and it "
                        "could not be "
                        "filled from here:\n" + "\n".join(f"  - {f.warning(lock.path)}" for f in needed))
    return lock


def complete(ref: str, echo: Callable[[str], None] = print, base_digest: str | None = None,
             router_sha256: str | None = None) -> dict[str, Any]:
    """`invoke lock --complete`: fill only the missing outside facts of the committed lock, without
    resolving again; refuse when the stack's inputs changed since it was made (that needs a re-lock)."""
    problems = []
    if base_digest is not None and not DIGEST_RE.fullmatch(base_digest):
        problems.append(Problem("--base-digest", "is not a digest", base_digest, "sha256:<64 lowercase hex>"))
    if router_sha256 is not None and not SHA256_RE.fullmatch(router_sha256):
        problems.append(Problem("--router-sha256", "is not a sha256", router_sha256, "64 lowercase hex digits"))
    if problems:
        raise ConfigError("invoke lock --complete", problems)
    stack = load_stack(ref)
    lock = load_lock(ref, stack)
    changed = check_lock(stack, lock, ref)
    if changed:
        raise LockError(f"{lock.path} cannot be completed: it no longer matches the stack, and --complete resolves "
                        "nothing; "
                        f"re-lock with `{lock_command(ref)}`:\n" + "\n".join(f"  - {p}" for p in changed))
    given = {k: v for k, v in (("base_digest", base_digest), ("router_sha256", router_sha256)) if v}
    recorded = {"base_digest": (lock.tool.get("base") or {}).get("digest"),
                "router_sha256": (lock.tool.get("router") or {}).get("sha256")}
    clash = [f"{k}: the lock records {recorded[k]}, given {v}" for k,
             v in given.items() if recorded[k] and recorded[k] != v]
    if clash:
        raise LockError(f"{lock.path}: --complete fills only what is missing, and changes nothing recorded:\n"
                        + "\n".join(f"  - {c}" for c in clash))
    missing = missing_facts(stack, lock)
    if not missing:
        echo(f"{lock.path}: complete (nothing missing)")
        return {"path": str(lock.path), "filled": [], "missing": []}
    echo(f"{lock.path}: filling {', '.join(f.what for f in missing)} (nothing is resolved again)")
    after = fill(stack, lock, echo, given)
    left = missing_facts(stack, after)
    filled = sorted({f.key for f in missing} - {f.key for f in left})
    if left:
        raise LockError(f"{after.path}: still missing (could not be reached from here):\n"
                        + "\n".join(f"  - {f.warning(after.path)}" for f in left))
    return {"path": str(after.path), "filled": filled, "missing": []}


def base_image_digest(image: str, echo: Callable[[str], None]) -> str | None:
    """The digest the base image's tag points at, asked of its registry (any OCI registry, Docker
    Hub included); None, with a warning, where the registry cannot be reached."""
    from ..imageref import parse_image_ref
    from ..remote.credentials import docker_config_credentials
    from ..remote.registry import RegistryAPI, Retry

    ref = parse_image_ref(image, "base.image")
    if ref.digest:
        return ref.digest
    try:
        # Anonymous where the registry allows it (Docker Hub's public images); `docker login`'s where given.
        credentials = docker_config_credentials(ref.registry)
        api = RegistryAPI(ref.registry, credentials, retry=Retry(attempts=2), echo=echo, timeout=20)
        manifest = api.manifest(ref.repository, ref.tag or "latest")
    except (SlimeforgeError, OSError) as exc:
        echo(f"  base image {image}: its registry cannot be reached ({str(exc).splitlines()[0]}); the lock records no "
             "digest")
        return None
    if manifest is None:
        raise LockError(f"base image {image}: its registry has no such tag")
    echo(f"  base image {image} -> {manifest.digest}")
    return manifest.digest


def patch_hashes(stack: Stack, local: dict, echo: Callable[[str], None]) -> dict[str, str] | None:
    """sha256 of every patch file a step applies, read from the pinned source (a local checkout
    given with --source, else fetched); None, with a warning, where neither can be read."""
    if not stack.patches:
        return {}
    from ..patches import read_patches

    try:
        contents = read_patches(stack, local, paths.sources_cache())
    except SlimeforgeError as exc:
        echo(f"  patches: cannot read them ({str(exc).splitlines()[0]}); the lock records no patch sha256")
        return None
    return {p.file: p.sha256 for p in contents}


def url_sha256(url: str, echo: Callable[[str], None], limit: int = ROUTER_LIMIT) -> str | None:
    """sha256 of a file by URL (streamed, bounded: a declared length over the limit is refused before
    reading); None, with a warning, where it cannot be fetched."""
    digest = hashlib.sha256()
    size = 0
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 - the URL is a pinned https file
            declared = resp.headers.get("Content-Length", "")
            if WHOLE_RE.fullmatch(declared) and int(declared) > limit:
                raise LockError(f"{url}: {int(declared) >> 20} MiB, larger than {limit >> 20} MiB: not a wheel the "
                                "lock takes")
            while chunk := resp.read(1 << 20):
                size += len(chunk)
                if size > limit:
                    raise LockError(f"{url}: larger than {limit >> 20} MiB")
                digest.update(chunk)
    except (OSError, ValueError) as exc:
        echo(f"  {url}: cannot be fetched ({exc}); the lock records no sha256")
        return None
    return digest.hexdigest()
