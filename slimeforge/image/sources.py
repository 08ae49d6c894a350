"""`--source NAME=PATH`: a local checkout used instead of a stack source's git URL, or a wheel
directory used instead of the index for a pip step (air-gapped builds).

NAME is a source of the stack (PATH a git checkout holding the pinned commit) or the name of a pip step (PATH a
directory of wheels: that step installs from it with --no-index). The checkout is only read: the pinned commit is
fetched from it (shallow) into a cache of bare repositories, from which the build context and temporary worktrees are
made. The user's branch, index and working tree are never touched. """

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import CommandError, ConfigError, Problem, SlimeforgeError
from ..proc import Runner
from .stack import Stack

GIT = ["git", "-c", "safe.directory=*", "-c", "advice.detachedHead=false"]


@dataclass(frozen=True)
class LocalSource:
    name: str
    path: Path
    commit: str  # for a wheel directory: sha256 over its wheels' names and contents
    kind: str = "git"  # "git" (a source checkout) or "wheels" (a pip step's wheel directory)


# What a wheel directory may hold: wheels, and sdists for a step that builds from source
# (`from_source`, e.g. flash-attn compiled for the stack's arch list with no network).
DIST_GLOBS = ("*.whl", "*.tar.gz")


def dist_files(path: Path) -> list[Path]:
    return sorted({f for pattern in DIST_GLOBS for f in path.glob(pattern) if f.is_file()})


def wheels_digest(path: Path) -> str:
    digest = hashlib.sha256()
    for whl in dist_files(path):
        digest.update(whl.name.encode() + b"\0")
        with whl.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def parse_sources(stack: Stack, values: list[str] | None, runner: Runner | None = None) -> dict[str, LocalSource]:
    """Validate every `NAME=PATH` together; raise ConfigError listing all problems."""
    runner = runner or Runner()
    problems: list[Problem] = []
    out: dict[str, LocalSource] = {}
    for text in values or []:
        name, sep, raw = text.partition("=")
        if not sep or not name or not raw:
            problems.append(Problem("--source", "must be NAME=PATH", text, "e.g. slime=/src/slime"))
            continue
        pip_steps = [st.name for st in stack.plan if st.kind in ("pip", "wheel_url")]
        if name in out:
            problems.append(Problem(f"--source {name}", "is given twice", text))
            continue
        path = Path(raw).expanduser().resolve()
        if name not in stack.sources and name in pip_steps:
            if not path.is_dir() or not dist_files(path):
                problems.append(Problem(f"--source {name}",
                                        "is not a directory of wheels (*.whl) or sdists (*.tar.gz)", raw,
                                        f"wheels or sdists for step {name}"))
                continue
            out[name] = LocalSource(name, path, wheels_digest(path), "wheels")
            continue
        if name not in stack.sources:
            problems.append(Problem(f"--source {name}", "is neither a source nor a pip step of this stack", name,
                                    f"sources: {', '.join(sorted(stack.sources))}; pip steps (wheel directories): "
                                    f"{', '.join(pip_steps)}"))
            continue
        commit = stack.sources[name].commit
        if not path.is_dir():
            problems.append(Problem(f"--source {name}", "is not a directory", raw))
            continue
        if not runner.run([*GIT, "-C", str(path), "rev-parse", "--git-dir"], check=False).ok:
            problems.append(Problem(f"--source {name}", "is not a git checkout", raw,
                                    "a clone of " + stack.sources[name].git))
            continue
        if not runner.run([*GIT, "-C", str(path), "cat-file", "-e", f"{commit}^{{commit}}"], check=False).ok:
            problems.append(Problem(f"--source {name}", f"has no commit {commit} (the stack's pin)", raw,
                                    f"a checkout that contains {commit}: git -C {raw} fetch origin {commit}"))
            continue
        out[name] = LocalSource(name, path, commit)
    if problems:
        raise ConfigError("--source", problems)
    return out


def checked_options(task: str, stack: Stack, problems: list[Problem], sources: list[str] | None,
                    runner: Runner | None = None) -> dict[str, LocalSource]:
    """The opening of build, install and lock: the problems their own options already have, with
    those of --source (parsed here), refused together as one ConfigError naming the task; else the
    local sources. Nothing has been touched yet when this raises."""
    local: dict[str, LocalSource] = {}
    try:
        local = parse_sources(stack, sources, runner)
    except ConfigError as exc:
        problems = [*problems, *exc.problems]
    if problems:
        raise ConfigError(task, problems)
    return local


def bare_copy(url_or_path: str, commit: str, cache: Path, name: str, runner: Runner | None = None) -> Path:
    """A bare repository holding exactly `commit` (shallow), cached by (name, commit).

    The same commit always yields the same files, so a build context that carries it hashes the
    same in BuildKit's cache across builds. The cache is the user's (shared by every checkout and
    run): each fetch goes into its own temporary directory, renamed into place whole; when another
    got there first, its copy (the same commit) is taken and this one dropped."""
    runner = runner or Runner()
    target = cache / f"{name}-{commit}.git"
    if (target / "shallow").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-{commit}.", suffix=".tmp", dir=cache))
    try:
        runner.run([*GIT, "init", "-q", "--bare", str(tmp)], step=f"source {name}")
        runner.run([*GIT, "-C", str(tmp), "fetch", "-q", "--depth", "1", str(url_or_path), commit],
                   step=f"source {name}: fetch {commit}")
        runner.run([*GIT, "-C", str(tmp), "update-ref", "refs/heads/pinned", commit], step=f"source {name}")
        # Drop what differs between two fetches of the same commit (fetch bookkeeping).
        for leftover in ("FETCH_HEAD", "logs", "hooks", "description", "info"):
            p = tmp / leftover
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        if target.exists() and not (target / "shallow").is_file():
            shutil.rmtree(target, ignore_errors=True)  # a copy left half-made by an older slimeforge
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "shallow").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process made the same copy first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def source_repo(stack: Stack, name: str, local: dict[str, LocalSource], cache: Path,
                runner: Runner | None = None) -> Path:
    """A bare repository with the pinned commit of `name`: from the local checkout when given, else
    fetched from the stack's git URL (network)."""
    commit = stack.sources[name].commit
    origin = str(local[name].path) if name in local else stack.sources[name].git
    try:
        return bare_copy(origin, commit, cache, name, runner)
    except CommandError as exc:
        last = (exc.output.strip().splitlines() or [""])[-1]
        raise SlimeforgeError(f"source {name}: cannot fetch commit {commit} from {origin}: {last}\n"
                              f"  offline? pass --source {name}=PATH (a checkout that contains the commit)") from None
