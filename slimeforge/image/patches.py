"""Patches from slime's own tree at the pinned commit: extraction, hashing, a build's or install's patch files
(`patches_for_run`), and `patches.check`.

The patch files are never copied into this repository: they are read with `git show
<commit>:<patches.dir>/<file>` from the pinned slime commit (a local checkout given with --source,
or a shallow fetch of slime's git URL).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from ..errors import ConfigError, Problem, SlimeforgeError
from ..proc import Runner
from .sources import GIT, LocalSource, source_repo
from .stack import AptStep, PipStep, PlanStep, Stack


@dataclass(frozen=True)
class PatchContent:
    file: str
    target: str
    method: str
    strip: int
    data: bytes
    # A dry run's stand-in for a patch file that could not be read (its source unreachable): no
    # data, the sha256 the lock records (patches_for_run). A real run never has one.
    locked: str = ""

    @property
    def missing(self) -> bool:
        return bool(self.locked)

    @property
    def sha256(self) -> str:
        return self.locked or hashlib.sha256(self.data).hexdigest()


class PatchError(SlimeforgeError):
    """A patch does not apply; the message names the patch and the files."""


def read_patches(stack: Stack, local: dict[str, LocalSource], cache: Path,
                 runner: Runner | None = None) -> list[PatchContent]:
    """Every patch the steps apply, read from the patch source at its pinned commit."""
    wanted = stack.used_patches()
    if not wanted or stack.patches is None:
        return []
    runner = runner or Runner()
    src = stack.patches.from_source
    commit = stack.sources[src].commit
    repo = source_repo(stack, src, local, cache, runner)
    out, problems = [], []
    for p in wanted:
        path = f"{stack.patches.dir}/{p.file}"
        data = _git_blob(repo, f"{commit}:{path}")
        if data is None:
            problems.append(Problem(f"patches.files ({p.file})", f"is not in {src} at {commit[:12]}", path,
                                    f"a file under {stack.patches.dir}/ of that commit"))
            continue
        out.append(PatchContent(p.file, p.target, p.method, p.strip, data))
    if problems:
        raise ConfigError(f"patches of stack {stack.name}", problems)
    return out


def _git_blob(repo: Path, spec: str) -> bytes | None:
    # Bytes, not text (proc.Runner decodes): the hash must be of the file exactly as slime has it.
    res = subprocess.run([*GIT, "--git-dir", str(repo), "cat-file", "blob", spec], capture_output=True)
    return res.stdout if res.returncode == 0 else None


def patches_for_run(stack: Stack, local: dict[str, LocalSource], cache: Path, recorded: Mapping[str, str],
                    dry_run: bool,
                    echo: Callable[[str], None]) -> list[PatchContent]:
    """The patch files for a build or an install (read_patches); in a dry run where their source
    cannot be fetched, stand-ins with the sha256 the lock records (`recorded`: LockFile.patch_sha256),
    named in a warning (a real run refuses)."""
    try:
        return read_patches(stack, local, cache)
    except SlimeforgeError as exc:
        if not dry_run or stack.patches is None:
            raise
        src = stack.patches.from_source
        echo(f"warning: the patch files cannot be read ({str(exc).splitlines()[0]}): the plan names them with the "
             "sha256 "
             f"the lock records and leaves them out of what it writes; pass --source {src}=PATH (a checkout holding "
             f"{stack.sources[src].commit[:12]}), or run where {stack.sources[src].git} is reachable")
        return [PatchContent(p.file, p.target, p.method, p.strip, b"", str(recorded.get(p.file) or "unknown"))
                for p in stack.used_patches()]


def check_patches(stack: Stack, local: dict[str, LocalSource], cache: Path, echo=print, runner: Runner | None = None,
                  wheel_cache: Path | None = None) -> list[dict]:
    """Apply every patch of the stack to temporary checkouts of the pinned sources (never to the
    user's checkouts), with the same step library the build uses. A site-packages patch is applied
    to the unpacked wheels of the step that installs its target (downloaded from the index).

    Wheels are downloaded for the stack's target (its Python and `Stack.wheel_platform`) into
    `wheel_cache` (default: paths.user_cache()/wheels).

    Returns one row per patch: file, target, sha256, status ("applies", "already applied").
    Raises PatchError naming every patch that does not apply."""
    runner = runner or Runner()
    contents = read_patches(stack, local, cache, runner)
    rows, failures = [], []
    work = Path(tempfile.mkdtemp(prefix="slimeforge-patches-"))
    try:
        for pc in contents:
            row = {"file": pc.file, "target": pc.target, "sha256": pc.sha256}
            if pc.target == "site-packages":
                # Patches of one step apply in order to one tree, as they do in the build.
                step = next(s for s in stack.plan if any(x.file == pc.file for x in s.patches))
                tree = work / f"site-packages-{step.name}"
                if not tree.exists():
                    _unpacked_wheels(stack, step, tree, wheel_cache or paths.user_cache() / "wheels", runner)
            else:
                tree = work / pc.target
            if not tree.exists():
                repo = source_repo(stack, pc.target, local, cache, runner)
                runner.run([*GIT, "clone", "-q", "--no-checkout", str(repo), str(tree)],
                           step=f"patches.check {pc.target}")
                runner.run([*GIT, "-C", str(tree), "checkout", "-q", stack.sources[pc.target].commit],
                           step=f"patches.check {pc.target}")
            pfile = work / "patches" / pc.file
            pfile.parent.mkdir(parents=True, exist_ok=True)
            pfile.write_bytes(pc.data)
            res = runner.run(["bash", "-c", 'source "$1"; shift; sf_apply_patch "$@"', "sf", str(paths.STEP_LIBRARY),
                              pc.file, pc.method, str(pc.strip), str(pfile), str(tree)],
                             check=False, env={"SF_STATE": str(work / "state")})
            if res.ok:
                row["status"] = "already applied" if "already applied" in res.stderr else "applies"
            else:
                row["status"] = "does not apply"
                failures.append(_error_line(res.stdout + res.stderr) or f"patch {pc.file} does not apply to "
                                                                        f"{pc.target}")
            rows.append(row)
            echo(f"  {pc.file:<32} {row['status']}  (sha256 {pc.sha256[:12]})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        raise PatchError("patches.check failed:\n" + "\n".join(f"  - {f}" for f in failures))
    return rows


def _unpacked_wheels(stack: Stack, step: PlanStep, target: Path, cache: Path, runner: Runner) -> None:
    """The wheels a step installs, for the stack's target (its Python, its base's glibc), unpacked
    as they would be in site-packages."""
    reqs = [] if isinstance(step, AptStep) else list(step.requirements)
    cache.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
            stack.python,
            "--implementation", "cp"]
    for plat in target_platforms(stack):
        argv += ["--platform", plat]
    argv += ["--platform", "any", "-d", str(cache), *reqs]
    if isinstance(step, PipStep) and step.index_url:
        argv += ["--extra-index-url", step.index_url]
    runner.run(argv,
               step=f"patches.check: download {' '.join(reqs)} for {stack.wheel_platform}, Python "
                    f"{stack.python}", timeout=1800)
    target.mkdir(parents=True)
    for req in reqs:
        name = re.split(r"[<>=!~\[ @]", req, maxsplit=1)[0].replace("-", "_").lower()
        version = req.split("==", 1)[1] if "==" in req else ""
        found = ([w for w in sorted(cache.glob("*.whl")) if w.name.lower().startswith(f"{name}-{version}".lower())
                  and wheel_fits(w.name, stack)])
        if not found:
            raise PatchError(f"patches.check: no wheel of {req} for Python {stack.python} on {stack.wheel_platform} "
                             f"in {cache}")
        with zipfile.ZipFile(found[-1]) as zf:
            zf.extractall(target)


def target_platforms(stack: Stack) -> list[str]:
    """`Stack.wheel_platform` and every older manylinux tag it accepts, newest first: pip's
    --platform matches tags exactly (manylinux_2_39 alone would refuse sglang's manylinux_2_34 wheels)."""
    newest = int(stack.wheel_platform.split("_")[2])
    return [stack.wheel_platform, *(f"manylinux_2_{n}_x86_64" for n in range(newest - 1, 16, -1))]


def wheel_fits(filename: str, stack: Stack) -> bool:
    """Whether a wheel (by its file name's tags) installs on the stack's target: its CPython (or
    py3 / abi3), and `any` or a manylinux x86_64 tag no newer than the base's glibc. The cache holds
    wheels of every stack; only the target's may be unpacked."""
    parts = filename[:-4].split("-")
    if len(parts) < 5:
        return False
    pys, abis, plats = (set(x.split(".")) for x in parts[-3:])
    cp = "cp" + stack.python.replace(".", "")
    if not (pys & {cp, "py3", "py2.py3"} or ("abi3" in abis and any(p.startswith("cp3") for p in pys))):
        return False
    glibc = tuple(int(x) for x in stack.base.glibc.split("."))
    for plat in plats:
        if plat == "any":
            return True
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", plat)
        if m and (int(m.group(1)), int(m.group(2))) <= glibc:
            return True
        if plat in ("manylinux2014_x86_64", "manylinux1_x86_64", "manylinux2010_x86_64") and glibc >= (2, 17):
            return True
    return False


def _error_line(output: str) -> str | None:
    for line in output.splitlines():
        if "slimeforge: ERROR:" in line:
            return line.split("slimeforge: ERROR:", 1)[1].strip()
    return None

