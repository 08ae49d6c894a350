"""The flag catalog: every option slime accepts, from slime's real parsers, and who reads it.

    make_catalog(python, slime, megatron, out) -> Catalog   `invoke flags.catalog` (and the bare-metal
                                                             install and the image's finalize, which run
                                                             the same script in the step library)
    parse_catalog(text, where) -> Catalog                    what `invoke doctor` reads

The work is done by `slimeforge/scripts/flag_catalog.py`, run with the TARGET interpreter (the one
that imports slime; it needs no GPU): it calls slime's own argument entry point and records every
argparse parser that parses (pre-parse, SGLang + router, Megatron + slime at a74ae3a0), each option
with the parser it belongs to. `train.py --help` would show only the last parser: every
`--sglang-*` and `--router-*` option would be missing.

Format (version 2): {"format": "slimeforge.flag-catalog", "version": 2, "slime_commit",
"megatron_commit", "python", "entry", "parsers": [{"built_by", "add_help", "options"}],
"stopped_by", "flags": [every --option]}. Version 1 (no "version": `train.py --help` text) is
still read, and said to be incomplete.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import paths, readback
from ..atomic import output_problem, write_output
from ..errors import CommandError, ConfigError, Problem, SlimeforgeError
from ..image.sources import GIT
from ..proc import Runner

SCRIPT = paths.SCRIPTS / "flag_catalog.py"
FORMAT, VERSION = "slimeforge.flag-catalog", 2
FLAG_RE = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
MAX_BYTES = 8 << 20  # a catalog is tens of kB; anything this large is not one


@dataclass(frozen=True)
class Catalog:
    flags: frozenset[str]
    slime_commit: str
    version: int
    parsers: tuple[dict, ...] = field(default_factory=tuple)


class CatalogError(SlimeforgeError):
    """A catalog could not be made or read; the message says which file or step."""


def parse_catalog(text: str, where: str) -> Catalog:
    """A catalog file's text, checked: its format and version, and every flag's spelling."""
    if len(text) > MAX_BYTES:
        raise CatalogError(f"{where}: {len(text)} bytes is not a flag catalog (at most {MAX_BYTES})")
    try:
        doc = readback.json_loads(text)
    except ValueError as exc:
        raise CatalogError(f"{where}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("flags"), list):
        raise CatalogError(f'{where} is not a flag catalog ({{"format": "{FORMAT}", "version": {VERSION}, "flags": '
                           '[...]})')
    version = doc.get("version", 1)
    if version == 1 and "format" not in doc:
        pass  # the old help-text catalog: flags and slime_commit only
    elif doc.get("format") != FORMAT or not isinstance(version, int) or not 2 <= version <= VERSION:
        raise CatalogError(f"{where}: format {doc.get('format')!r} version {version!r} is not one this slimeforge "
                           "reads "
                           f"({FORMAT} 1 to {VERSION}); make it again with invoke flags.catalog")
    bad = [f for f in doc["flags"] if not isinstance(f, str) or not FLAG_RE.fullmatch(f)]
    if bad:
        raise CatalogError(f"{where}: entries of flags are not --options: {bad[:5]}")
    parsers = doc.get("parsers") or []
    if version >= 2:
        if not isinstance(parsers, list) or not all(isinstance(p, dict) and isinstance(p.get("options"), list)
                                                    and isinstance(p.get("built_by"), str) for p in parsers):
            raise CatalogError(f"{where}: parsers must be a list of {{built_by, add_help, options}}")
        union = {o for p in parsers for o in p["options"] if isinstance(o, str) and o.startswith("--")}
        if union != set(doc["flags"]):
            raise CatalogError(f"{where}: flags is not the union of the parsers' options (edited by hand?)")
    commit = doc.get("slime_commit") or "?"
    return Catalog(frozenset(doc["flags"]), str(commit), int(version), tuple(parsers))


def load_catalog(path: str | Path) -> Catalog:
    # Through the one reader: a FIFO or a device named as the catalog is refused, never read forever.
    # A catalog is often a symlink the user made (e.g. to an image's), so links are followed.
    try:
        data = readback.read_bytes(path, "flag catalog", "a flags.json made by invoke flags.catalog",
                                   max_bytes=MAX_BYTES, follow_symlinks=True)
    except readback.RecordError as exc:
        raise CatalogError(str(exc)) from None
    if data is None:
        raise CatalogError(f"cannot read the flag catalog {path}: No such file or directory")
    return parse_catalog(data.decode("utf-8", errors="replace"), str(path))


def _commit(checkout: Path, runner: Runner) -> str | None:
    res = runner.run([*GIT, "-C", str(checkout), "rev-parse", "HEAD"], check=False)
    return res.stdout.strip() if res.ok and re.fullmatch(r"[0-9a-f]{40}", res.stdout.strip()) else None


def make_catalog(python: str, slime: str | Path, megatron: str | Path | None, out: str | Path,
                 runner: Runner | None = None,
                 timeout: float = 600) -> Catalog:
    """Run the catalog script with `python` on the checkouts and write `out` (whole or not at all).
    Every bad input is reported before anything runs."""
    runner = runner or Runner()
    problems = []
    py = Path(python)
    if not python or not (py.is_file() and os.access(py, os.X_OK)):
        problems.append(Problem("--python", "is not an executable file", python,
                                "the target interpreter, e.g. /opt/venv/bin/python"))
    slime_dir = Path(slime)
    if not (slime_dir / "slime").is_dir():
        problems.append(Problem("--slime", "is not a slime checkout (no slime/ package in it)", str(slime)))
    meg_dir = Path(megatron) if megatron else None
    if meg_dir is not None and not (meg_dir / "megatron").is_dir():
        problems.append(Problem("--megatron", "is not a Megatron-LM checkout (no megatron/ package in it)",
                                str(megatron)))
    out_path = Path(out)
    if not out:
        problems.append(Problem("--out", "must be a file in an existing directory", str(out)))
    elif why := output_problem(out_path):
        problems.append(Problem("--out", why, str(out),
                                "a new file in an existing directory, or a regular file to replace"))
    if problems:
        raise ConfigError("flags.catalog", problems)
    argv = [str(py), str(SCRIPT), "--slime", str(slime_dir.resolve()), "--out"]
    # The script writes a temporary file beside --out; it is read back, checked, then written over --out atomically.
    fd, tmp = tempfile.mkstemp(prefix=f".{out_path.name}.", dir=out_path.parent)
    os.close(fd)
    argv.append(tmp)
    if meg_dir is not None:
        argv += ["--megatron", str(meg_dir.resolve())]
    for name, d in (("slime", slime_dir), ("megatron", meg_dir)):
        commit = _commit(d, runner) if d is not None else None
        if commit:
            argv += [f"--{name}-commit", commit]
    try:
        try:
            # A clean environment for the target: no PYTHONPATH of ours, no GPU asked for.
            res = runner.run(argv, check=False, timeout=timeout, step="flags.catalog",
                             env={"PYTHONPATH": "", "CUDA_VISIBLE_DEVICES": "", "PYTHONDONTWRITEBYTECODE": "1"})
        except CommandError as exc:
            raise CatalogError(str(exc)) from None
        if not res.ok:
            lines = [line.split("slimeforge: ERROR:",
                                1)[1].strip() for line in res.stderr.splitlines() if "slimeforge: ERROR:" in line]
            tail = lines[-1] if lines else "\n".join(res.stderr.strip().splitlines()[-10:])
            raise CatalogError(f"flags.catalog: {python} could not read slime's parsers (exit {res.returncode}): "
                               f"{tail}")
        catalog = load_catalog(tmp)
        write_output(out_path, Path(tmp).read_bytes(), where="--out")
    finally:
        Path(tmp).unlink(missing_ok=True)
    return catalog


def catalog_in_place(python: str, slime: str, megatron: str | None, runner: Runner | None = None) -> Catalog:
    """The catalog of the slime at `slime` as `python` imports it (a run in place: the environment
    where slime is installed), made in a temporary directory that goes away with it; Megatron's
    parsers come from `megatron` when it is a checkout, else from wherever `python` finds them."""
    meg = megatron if megatron and (Path(megatron) / "megatron").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="slimeforge-catalog-") as tmp:
        return make_catalog(python, slime, meg, Path(tmp) / paths.FLAGS, runner)


def summary(catalog: Catalog) -> str:
    rows = [f"{len(catalog.flags)} options of slime {catalog.slime_commit[:12]} (catalog version {catalog.version})"]
    rows += [f"  {len(p['options']):>4}  "
             f"{p['built_by']}{'' if p.get('add_help') else '  (add_help=False)'}" for p in catalog.parsers]
    return "\n".join(rows)
