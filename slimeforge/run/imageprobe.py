"""What a container image holds, for the preflight of any image, slimeforge's or not: its Python
and Ray, where slime and Megatron-LM are (and their commits), and slime's flag catalog.

    image_facts(image, slime_dir, megatron_dir) -> ImageFacts

slimeforge's probe (scripts/image_probe.py, standard library only, with flag_catalog.py and
env_probe.py beside it) runs inside the image with the image's own `python3`, the one launch.sh
runs there:

    docker run --rm --network none --entrypoint python3 -v <slimeforge/scripts>:/slimeforge-probe:ro
        -e PYTHONDONTWRITEBYTECODE=1 -e CUDA_VISIBLE_DEVICES= sha256:<image id>
        /slimeforge-probe/image_probe.py --slime <slime_dir> --megatron <megatron_dir>

An image slimeforge built answers with its own /opt/slimeforge/flags.json; any other (slime's
official image: /root/slime, /root/Megatron-LM) with a catalog made there from slime's real parsers.
The answer is cached by the image's ID (content-addressed: the same ID is the same image) with the
paths asked and the probe's own sha256, under the user cache (image-probes/), written whole or not
at all, and validated field by field when read back, as the probe's fresh answer is.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import paths, readback
from ..atomic import write_file
from ..errors import CommandError, SlimeforgeError
from ..proc import Runner
from ..schema import text_problem
from .flagcatalog import Catalog, CatalogError, parse_catalog

FORMAT, VERSION = "slimeforge.image-probe", 1
MOUNT = "/slimeforge-probe"  # where the probe's scripts are mounted in the image (read-only)
PROBE_SCRIPTS = ("image_probe.py", "flag_catalog.py", "env_probe.py")
IMAGE_CATALOG = f"{paths.IMAGE_STATE}/{paths.FLAGS}"
IMAGE_ID_RE = re.compile(r"sha256:[0-9a-f]{64}")
VERSION_RE = re.compile(r"[0-9]+(\.[0-9A-Za-z+_-]+){0,5}")
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
MAX_BYTES = 12 << 20  # the catalog (tens of kB; at most 8 MiB) and a few short fields
MAX_PROBLEM = 2000
MAX_SEARCH_PATH = 16384  # an image's PYTHONPATH or LD_LIBRARY_PATH
PROBE_TIMEOUT_S = 600  # importing slime's parsers imports torch: seconds, a minute on a cold disk
SOURCES = (IMAGE_CATALOG, "parsers")


class ProbeError(SlimeforgeError):
    """The probe could not run in the image, or its answer is not one (the message says which)."""


@dataclass(frozen=True)
class ImageFacts:
    image_id: str
    python: str
    ray: str | None
    executable: str | None
    slime_dir: str | None
    megatron_dir: str | None
    slime_commit: str | None
    megatron_commit: str | None
    catalog: Catalog | None
    catalog_source: str | None  # IMAGE_CATALOG (slimeforge built it) or "parsers" (made by the probe)
    catalog_problem: str | None  # why there is no catalog
    cached: bool  # read from the cache, not probed now
    # slimeforge built it (/opt/slimeforge is there); else runs in it are rendered for its own
    # layout (run/layout.py), adding to its PYTHONPATH and LD_LIBRARY_PATH (None: unset there).
    slimeforge_image: bool = False
    pythonpath: str | None = None
    ld_library_path: str | None = None

    @property
    def short_id(self) -> str:
        return self.image_id[7:19]


def cache_dir() -> Path:
    return paths.user_cache() / "image-probes"


def probe_digest() -> str:
    """sha256 of the probe's scripts: a new slimeforge probe is not answered from an old one's cache."""
    h = hashlib.sha256()
    for name in PROBE_SCRIPTS:
        h.update(name.encode() + b"\0" + (paths.SCRIPTS / name).read_bytes() + b"\0")
    return h.hexdigest()


def cache_path(image_id: str, slime_dir: str, megatron_dir: str) -> Path:
    key = hashlib.sha256(json.dumps([image_id, slime_dir, megatron_dir, probe_digest()]).encode()).hexdigest()
    return cache_dir() / f"{image_id[7:]}-{key[:16]}.json"


def probe_argv(docker: str, image_id: str, slime_dir: str, megatron_dir: str) -> list[str]:
    # No network (the probe reads files), no GPU asked for, nothing written into the scripts' mount.
    return [docker, "run", "--rm", "--network", "none", "--entrypoint", "python3", "-v", f"{paths.SCRIPTS}:{MOUNT}:ro",
            "-e", "PYTHONDONTWRITEBYTECODE=1", "-e", "CUDA_VISIBLE_DEVICES=", "--", image_id,
            f"{MOUNT}/image_probe.py", "--slime", slime_dir, "--megatron", megatron_dir]


def image_id(image: str, docker: str, runner: Runner, pull: bool = True) -> str:
    """The local ID of `image`, pulled first when it is not here (as `docker run` would); with
    pull=False (a dry run) an image not here is a ProbeError."""
    def inspect() -> Any:
        return runner.run([docker, "image", "inspect", "--format", "{{.Id}}", "--", image],
                          step=f"docker image inspect {image}", check=False, timeout=60)

    res = inspect()
    if not res.ok and not pull:
        raise ProbeError(f"{image} is not on this host (a dry run pulls nothing)")
    if not res.ok:
        runner.run([docker, "pull", "--", image], step=f"docker pull {image}", timeout=3600)
        res = inspect()
    found = res.stdout.strip()
    if not res.ok or not IMAGE_ID_RE.fullmatch(found):
        raise CommandError(f"docker image inspect {image}", res.argv, res.returncode or 1,
                           res.stderr or f"not an image ID: {found[:100]!r}")
    return found


def _optional(doc: dict, key: str, pattern: re.Pattern[str] | None = None, limit: int = 4096) -> str | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value,
                      str) or len(value) > limit or text_problem(value) or (pattern is not None
                                                                            and not pattern.fullmatch(value)):
        raise ValueError(f"{key} is {str(value)[:100]!r}, not what the probe writes")
    return value


def parse_facts(doc: Any, expect_id: str, where: str, cached: bool) -> ImageFacts:
    """The probe's answer (fresh or cached), checked field by field; ValueError says what is wrong."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise ValueError(f"{where} is not an image probe ({{\"format\": \"{FORMAT}\", \"version\": {VERSION}, ...}})")
    if cached and doc.get("image_id") != expect_id:
        raise ValueError(f"{where} is for image {str(doc.get('image_id'))[:80]!r}, not {expect_id}")
    python = _optional(doc, "python", VERSION_RE, 40)
    if python is None:
        raise ValueError(f"{where} names no Python version")
    dirs = {k: _optional(doc, k) for k in ("slime_dir", "megatron_dir", "executable")}
    for key, value in dirs.items():
        if value is not None and not value.startswith("/"):
            raise ValueError(f"{where}: {key} {value[:100]!r} is not an absolute path")
    source = _optional(doc, "catalog_source", limit=100)
    if source is not None and source not in SOURCES:
        raise ValueError(f"{where}: catalog_source {source!r} is not one of {SOURCES}")
    problem = doc.get("catalog_problem")
    if problem is not None and not (isinstance(problem, str) and len(problem) <= 100_000):
        raise ValueError(f"{where}: catalog_problem is not a message")
    slimeforge_image = doc.get("slimeforge_image")
    if not isinstance(slimeforge_image, bool):
        raise ValueError(f"{where}: slimeforge_image is {str(slimeforge_image)[:20]!r}, not true or false")
    search = {k: _optional(doc, k, limit=MAX_SEARCH_PATH) for k in ("pythonpath", "ld_library_path")}
    catalog = None
    if doc.get("catalog") is not None:
        if source is None:
            raise ValueError(f"{where}: a catalog without its catalog_source")
        try:
            catalog = parse_catalog(json.dumps(doc["catalog"]), f"{where} (catalog from {source})")
        except CatalogError as exc:
            raise ValueError(str(exc)) from None
    elif problem is None:
        raise ValueError(f"{where}: neither a catalog nor why there is none")
    return ImageFacts(expect_id, python, _optional(doc, "ray", VERSION_RE, 40), dirs["executable"], dirs["slime_dir"],
                      dirs["megatron_dir"],
                      _optional(doc, "slime_commit", COMMIT_RE), _optional(doc, "megatron_commit", COMMIT_RE), catalog,
                      source,
                      problem[:MAX_PROBLEM] if isinstance(problem, str) else None, cached, slimeforge_image,
                      search["pythonpath"], search["ld_library_path"])


def read_cached(path: Path, expect_id: str) -> ImageFacts | None:
    """The cached answer, or None when there is none or it is not a good one (then it is made again
    and replaced: a cache entry is never trusted beyond its checks)."""
    try:
        doc = readback.read_json(path, "an image probe (cache)", "a file slimeforge's image probe wrote",
                                 max_bytes=MAX_BYTES)
        return None if doc is None else parse_facts(doc, expect_id, str(path), cached=True)
    except (readback.RecordError, ValueError):
        return None


def image_facts(image: str, slime_dir: str, megatron_dir: str, *, docker: str = "docker", runner: Runner | None = None,
                pull: bool = True) -> ImageFacts:
    """What `image` holds (see the module doc): from the cache by the image's ID, else probed now
    and cached. Raises CommandError when the image cannot be found or pulled, ProbeError when the
    probe cannot run in it (no python3) or its answer is not one (or, with pull=False, when the
    image is not here)."""
    runner = runner or Runner()
    iid = image_id(image, docker, runner, pull)
    path = cache_path(iid, slime_dir, megatron_dir)
    cached = read_cached(path, iid)
    if cached is not None:
        return cached
    argv = probe_argv(docker, iid, slime_dir, megatron_dir)
    try:
        res = runner.run(argv, step=f"image probe ({image})", timeout=PROBE_TIMEOUT_S)
    except CommandError as exc:
        tail = [line for line in exc.output.strip().splitlines() if line.strip()][-1:] or ["(no output)"]
        why = ("the image has no python3 on its "
              "PATH") if exc.returncode == 127 or "executable file not found" in exc.output else tail[0]
        raise ProbeError(f"slimeforge's probe could not run in {image} (exit {exc.returncode}): {why[:500]}") from None
    lines = [line for line in res.stdout.splitlines() if line.strip()]
    if not lines or len(res.stdout) > MAX_BYTES:
        raise ProbeError(f"slimeforge's probe in {image} printed "
                         f"{'nothing' if not lines else f'{len(res.stdout)} bytes'}, not its answer")
    try:
        doc = readback.json_loads(lines[-1])
        facts = parse_facts(doc, iid, f"the probe's answer from {image}", cached=False)
    except ValueError as exc:
        raise ProbeError(str(exc)) from None
    doc["image_id"] = iid
    write_file(path, json.dumps(doc, sort_keys=True) + "\n")
    return facts
