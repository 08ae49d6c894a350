"""Build one wheel from a source tree or an sdist by calling its PEP 517 backend once, in this process.

    python build_wheel.py --wheel-dir DIR [--work DIR] [--config-settings KEY=VALUE]... SOURCE

What `pip wheel --no-build-isolation --no-deps` does for the compiled steps, less one process: pip
first asks the backend for the wheel's metadata in one process, then for the wheel in another, and
each runs the piece's setup.py, which imports torch and probes nvcc (on a 16-core build host 11-13 s
before the first compile starts, against 4.5-6.8 s here). Nothing else differs: the same backend
(the `[build-system]` table of pyproject.toml, setuptools' legacy backend without one), the same
in-place build of a source tree, against the packages already installed (no isolation, no
dependencies installed, nothing fetched). SOURCE is a directory (a checkout) or an sdist
(`*.tar.gz`), unpacked first into a new directory under --work with the data filter: no absolute
path, no `..`, no link out of it. Prints `built: FILE` and exits 0, or names what is wrong and exits 2
(bad input) or 1 (the backend failed; its output is above). Standard library only (Python 3.11+);
runs with the target venv's Python (templates/steps.sh `_sf_store_make`, and
benchmarks/compile_bench.py, which times the same path).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import sys
import tarfile
import tempfile
import traceback
from pathlib import Path

# This script's own directory holds the step library's other scripts: never importable from a setup.py.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

LEGACY_BACKEND = "setuptools.build_meta:__legacy__"  # PEP 517's rule for a tree without [build-system]
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]{0,99}(\.[A-Za-z_][A-Za-z0-9_]{0,99}){0,20}"
BACKEND_RE = re.compile(f"{_DOTTED}(:{_DOTTED})?")
SETTING_RE = re.compile(r"([A-Za-z0-9_.-]{1,100})=([^\x00-\x1f\x7f]{0,1000})")
SDIST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,200}\.tar\.gz")
PYPROJECT_MAX = 1 << 20


class BadInput(Exception):
    pass


def backend_of(tree: Path) -> tuple[str, list[str]]:
    """The build backend and its backend-path entries that the tree's pyproject.toml names."""
    import tomllib

    pyproject = tree / "pyproject.toml"
    if not pyproject.is_file():
        if not (tree / "setup.py").is_file():
            raise BadInput(f"{tree}: neither pyproject.toml nor setup.py: not a Python source tree")
        return LEGACY_BACKEND, []
    if pyproject.stat().st_size > PYPROJECT_MAX:
        raise BadInput(f"{pyproject}: larger than {PYPROJECT_MAX} bytes")
    try:
        table = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("build-system", {})
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise BadInput(f"{pyproject}: not TOML ({e})") from None
    backend = table.get("build-backend", LEGACY_BACKEND) if isinstance(table, dict) else None
    if not isinstance(backend, str) or not BACKEND_RE.fullmatch(backend):
        raise BadInput(f"{pyproject}: [build-system] build-backend {backend!r} is not a module[:object] name")
    paths = table.get("backend-path", [])
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise BadInput(f"{pyproject}: [build-system] backend-path must be a list of strings, got {paths!r}")
    inside = []
    for p in paths:
        resolved = (tree / p).resolve()
        if not resolved.is_relative_to(tree.resolve()):
            raise BadInput(f"{pyproject}: backend-path {p!r} leads out of the source tree")
        inside.append(str(resolved))
    return backend, inside


def unpack_sdist(sdist: Path, work: Path) -> Path:
    """The sdist's one top directory, unpacked into a new directory of its own under WORK."""
    if not SDIST_RE.fullmatch(sdist.name):
        raise BadInput(f"{sdist}: an sdist is NAME.tar.gz (letters, digits, ._+-), got {sdist.name!r}")
    work.mkdir(parents=True, exist_ok=True)
    dest = Path(tempfile.mkdtemp(prefix="sdist-", dir=work))
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            members = tar.getmembers()
            # Checked here, whatever this Python's tarfile offers (its data filter came in 3.11.4 and
            # 3.12): files and directories only, each a relative path that stays inside.
            for m in members:
                parts = Path(m.name).parts
                if not (m.isfile() or m.isdir()) or m.name.startswith("/") or ".." in parts or not parts:
                    raise BadInput(f"{sdist}: member {m.name[:200]!r} is not a file or directory inside the sdist")
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, members, filter="data")
            else:
                tar.extractall(dest, members)
        tops = list(dest.iterdir())
        if len(tops) != 1 or not tops[0].is_dir():
            raise BadInput(f"{sdist}: an sdist holds exactly one top directory, this one "
                           f"{sorted(p.name for p in tops)[:10]}")
    except (tarfile.TarError, OSError, BadInput) as e:
        shutil.rmtree(dest, ignore_errors=True)  # all or nothing: no half-unpacked tree stays
        if isinstance(e, BadInput):
            raise
        raise BadInput(f"{sdist}: not an sdist that unpacks safely ({e})") from None
    return tops[0]


def config_settings(items: list[str]) -> dict[str, str | list[str]] | None:
    """pip's form: KEY=VALUE, a key given twice becomes a list."""
    out: dict[str, str | list[str]] = {}
    for item in items:
        m = SETTING_RE.fullmatch(item)
        if not m:
            raise BadInput(f"--config-settings {item!r}: expected KEY=VALUE (no control characters)")
        key, value = m.groups()
        if key in out:
            prev = out[key]
            out[key] = [*prev, value] if isinstance(prev, list) else [prev, value]
        else:
            out[key] = value
    return out or None


def build(source: Path, wheel_dir: Path, work: Path, settings: dict | None) -> str:
    tree = unpack_sdist(source, work) if source.is_file() else source
    if not tree.is_dir():
        raise BadInput(f"{source}: neither a source directory nor an sdist file")
    backend, backend_path = backend_of(tree)
    wheel_dir.mkdir(parents=True, exist_ok=True)
    # As a PEP 517 front end runs a hook: in the tree, the tree's backend-path first.
    os.chdir(tree)
    sys.path[:0] = backend_path
    module, _, attrs = backend.partition(":")
    hooks = importlib.import_module(module)
    for attr in filter(None, attrs.split(".")):
        hooks = getattr(hooks, attr)
    print(f"build_wheel: {tree} with {backend} (no isolation, against the installed packages)", flush=True)
    name = hooks.build_wheel(str(wheel_dir.resolve()), settings)
    if not isinstance(name, str) or "/" in name or not (wheel_dir / name).is_file():
        raise RuntimeError(f"{backend}.build_wheel returned {name!r}, not a wheel in {wheel_dir}")
    return name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel-dir", type=Path, required=True)
    ap.add_argument("--work", type=Path, help="where an sdist is unpacked (default: beside --wheel-dir)")
    ap.add_argument("--config-settings", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("source", type=Path)
    args = ap.parse_args(argv)
    try:
        settings = config_settings(args.config_settings)
        source = args.source.resolve()
        work = (args.work or args.wheel_dir.parent / f".{args.wheel_dir.name}.src").resolve()
        name = build(source, args.wheel_dir.resolve(), work, settings)
    except BadInput as e:
        print(f"build_wheel: {e}", file=sys.stderr)
        return 2
    except Exception:  # the backend's own failure: its traceback, after its output
        traceback.print_exc()
        print(f"build_wheel: building {args.source} failed (the backend's output is above)", file=sys.stderr)
        return 1
    print(f"built: {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
