"""The venv against the lock: the step library's Python, standard library only, run by path with
the TARGET venv's interpreter ($SF_STATE/venvlock.py; slimeforge/scripts/venvlock.py in a checkout).

    python venvlock.py verify LOCK_DIR STEP [--exact]      after each step, and at finalize (--exact);
                                                           with venvprune.py's check (LOCK_DIR/../pruned)
    python venvlock.py fetch STEP FILE DIR [LINK_DIR...]   a compiled step's locked sources, by sha256
    python venvlock.py record LOCK_IN LOCK_OUT APPLIED [NAME=COMMIT...]   finalize's stack.lock.json
    python venvlock.py pins LOCK_JSON                      the smoke test: each pin of the stack installed
    python venvlock.py present SLICE                       a step's done record: its slice is still installed

One of each fact the step library needs from Python: `canonical` (the package-name normaliser),
`parse_slice_line` (the grammar of a step's slice, as lockfile.step_requirements writes it) and
`installed_versions` with the two comparisons that read it (`slice_problems`: exactly what the
slices allow; `pin_problems`: the stack's pins, specifiers too). Messages go to stderr, as
`slimeforge: ...` lines; exit 1 when anything is wrong, 2 for a bad command line.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import types
from dataclasses import dataclass
from pathlib import Path

OPERATORS = ("<", ">", "=", "!", "~")
# A step's slice: `name @ URL --hash=sha256:H  # ==V` or `name==V --hash=sha256:H  # ==V` (by name,
# from a wheel directory); the router's slice has no version comment, a checkout record no hash.
SLICE_LINE = re.compile(r"\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:@\s*(?P<url>\S+)|==(?P<pinned>[^\s#]+))"
                        r"(?:\s+--hash=sha256:(?P<sha256>[0-9a-f]{64}))?(?:\s+#\s*==(?P<version>\S+))?\s*")
DIST_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*\.(?:tar\.gz|zip|whl)")
WHOLE_LOCK = "_all.txt"  # finalize's copy of the whole lock: what must be there (--exact)


def canonical(name: str) -> str:
    """The PEP 503 name, extras dropped: transformer_engine[pytorch] -> transformer-engine."""
    return re.sub(r"[-_.]+", "-", name.split("[", 1)[0]).lower()


@dataclass(frozen=True)
class SliceLine:
    name: str  # canonical
    url: str | None  # None: found by name in a wheel directory
    version: str | None  # None: any version (the router wheel, pinned by its sha256)
    sha256: str | None


def parse_slice_line(line: str) -> SliceLine | None:
    """A requirement line of a slice, or None when it is not one (blank lines and comments are
    the caller's to skip)."""
    m = SLICE_LINE.fullmatch(line)
    if not m:
        return None
    return SliceLine(canonical(m["name"]), m["url"], m["version"] or m["pinned"], m["sha256"])


def read_slice(path: Path) -> tuple[list[SliceLine], list[str]]:
    """The requirement lines of a slice file, and the lines that are neither those nor comments."""
    lines, bad = [], []
    for raw in path.read_text().splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        parsed = parse_slice_line(raw)
        if parsed is None:
            bad.append(raw)
        else:
            lines.append(parsed)
    return lines, bad


def installed_versions() -> dict[str, str]:
    import importlib.metadata as md  # here, not at the top: `present` runs on every step of a re-run, mostly without it

    out = {}
    for d in md.distributions():
        meta = d.metadata  # parsed once: each `d.metadata` and `d.version` parses METADATA again
        if meta["Name"]:
            out[canonical(meta["Name"])] = meta["Version"]
    return out


def _checkouts() -> set[str]:
    """Distributions installed from a local directory (a source step's checkout: file:// and dir_info)."""
    import importlib.metadata as md

    out = set()
    for d in md.distributions():
        direct = d.read_text("direct_url.json")
        if not direct:  # most distributions: their METADATA is not parsed
            continue
        info = json.loads(direct)
        if info.get("url", "").startswith("file://") and "dir_info" in info and (name := d.metadata["Name"]):
            out.add(canonical(name))
    return out


def slice_problems(want: dict[str, str | None], whole: dict[str, str | None], installed: dict[str, str],
                   checkouts: set[str], exact: bool) -> list[str]:
    """What the venv holds against the slices so far: a distribution outside them or at another
    version; with `exact`, also one of the whole lock (or, without it, of the slices) missing.
    pip and uv (the venv's own) and checkouts of pinned sources are the only others allowed."""
    errors = []
    for name, have in sorted(installed.items()):
        if name in want:
            if want[name] is not None and want[name] != have:
                errors.append(f"{name} is {have}, the lock says {want[name]}")
        elif name not in ("pip", "uv") and name not in checkouts:
            errors.append(f"{name} {have} is not in the lock")
    if exact:
        errors += [f"{n} {v} is in the lock but not installed" for n,
                   v in sorted((whole or want).items()) if n not in installed]
    return errors


def _matches(version: str, spec: str) -> bool | None:
    """True/False, or None when a specifier cannot be judged here (no `packaging`)."""
    if not spec.startswith(OPERATORS):
        # An exact pin; a local label (+cu130) is the index's build of that version.
        return version.split("+", 1)[0] == spec.split("+", 1)[0]
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version
    except ImportError:
        return None
    return Version(version) in SpecifierSet(spec, prereleases=True)


def expected_versions(lock: dict) -> dict[str, str]:
    """distribution -> pin (an exact version, or a specifier such as <2) from an input lock's
    `pins` (`pip.<name>` and `slime-req.<name>`)."""
    out = {}
    for key, spec in (lock.get("pins") or {}).items():
        kind, _, name = key.partition(".")
        if kind in ("pip", "slime-req") and name:
            out[canonical(name)] = str(spec)
    return out


def pin_problems(expected: dict[str, str], installed: dict[str, str]) -> tuple[list[str], list[str]]:
    """(problems, notes): a pinned distribution missing or at another version is a problem."""
    problems, notes = [], []
    for name, spec in sorted(expected.items()):
        have = installed.get(name)
        if have is None:
            problems.append(f"{name}: not installed (the lock pins {spec})")
            continue
        ok = _matches(have, spec)
        if ok is None:
            notes.append(f"{name} {have}: specifier {spec} not checked (no packaging module in this venv)")
        elif not ok:
            problems.append(f"{name}: installed {have}, the lock pins {spec}")
        else:
            notes.append(f"{name} {have} matches {spec}")
    return problems, notes


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _printable(text: str) -> str:
    """What a venv's metadata says (a version, a name) reaches the terminal without escape sequences."""
    return _UNPRINTABLE.sub("?", text)


def _error(text: str) -> None:
    print(f"slimeforge: ERROR: {_printable(text)}", file=sys.stderr)


def _sibling(name: str) -> types.ModuleType:
    """A script beside this one, by path: run as `python -I venvlock.py`, its directory is not on sys.path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_sf_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# --- commands ----------------------------------------------------------------------------------


def verify(lock_dir: Path, step: str, exact: bool) -> int:
    want: dict[str, str | None] = {}
    whole: dict[str, str | None] = {}
    bad = []
    for f in sorted(lock_dir.glob("*.txt")):
        lines, unreadable = read_slice(f)
        bad += [f"{f.name}: cannot read lock line: {line[:200]}" for line in unreadable]
        for item in lines:
            want[item.name] = item.version
            if f.name == WHOLE_LOCK:
                whole[item.name] = item.version
    installed = installed_versions()
    errors = bad + slice_problems(want, whole, installed, _checkouts(), exact)
    # What a step pruned (venvprune.py): exactly the files its rule removes are missing, no others.
    if Path(__file__).with_name("venvprune.py").is_file():
        errors += _sibling("venvprune").check(lock_dir.parent, lock_dir)
    else:
        errors.append(f"venvprune.py is missing beside {Path(__file__).name} (the image and install.sh put both in "
                      "the state directory): the pruned files cannot be checked")
    for e in errors:
        _error(f"step {step}: {e}")
    if errors:
        return 1
    print(f"slimeforge: step {step}: {len(installed)} distribution(s) installed, all as locked", file=sys.stderr)
    return 0


def fetch(step: str, file: Path, dest: Path, links: list[str]) -> int:
    """Every line of `file` into `dest`, checked against its sha256, so that the compile after it
    needs no network: by URL, or by name from a wheel directory of `links`."""
    import urllib.request

    bad = 0
    lines, unreadable = read_slice(file)
    for line in unreadable:
        _error(f"step {step}: cannot read lock line: {line[:200]}")
        bad = 1
    for item in lines:
        if item.sha256 is None:
            _error(f"step {step}: {item.name}: its lock line has no sha256")
            bad = 1
            continue
        if item.url is None:  # by name: a wheel directory given for this step holds the file with that sha256
            found = [p for d in links for p in sorted(Path(d).iterdir()) if p.is_file() and _sha256(p) == item.sha256]
            if not found:
                _error(f"step {step}: {item.name}: no file with sha256 {item.sha256} in "
                       f"{' '.join(links) or '(no --find-links)'}")
                bad = 1
                continue
            shutil.copyfile(found[0], dest / found[0].name)
            continue
        base = item.url.rsplit("/", 1)[-1].split("#")[0]
        if not DIST_FILE.fullmatch(base):
            _error(f"step {step}: {item.name}: not a distribution file name: {base!r}")
            bad = 1
            continue
        part = dest / (base + ".part")
        try:
            with urllib.request.urlopen(item.url, timeout=60) as r, open(part, "wb") as out:  # noqa: S310 - the lock's URL
                shutil.copyfileobj(r, out, 1 << 20)
        except OSError as exc:
            _error(f"step {step}: {item.name} cannot be fetched from {item.url}: {exc}")
            bad = 1
            continue
        got = _sha256(part)
        if got != item.sha256:
            part.unlink()
            _error(f"step {step}: {item.name} differs from its sha256 in the lock (got {got}, the lock says "
                   f"{item.sha256}): refused")
            bad = 1
            continue
        os.replace(part, dest / base)
        print(f"slimeforge: step {step}: {base} fetched, sha256 as locked", file=sys.stderr)
    return bad


def record(lock_in: Path, lock_out: Path, applied: Path, commits: list[str]) -> int:
    """finalize: the input lock with what is installed, each checkout's commit and the patches applied."""
    import importlib.metadata as md

    lock = json.loads(lock_in.read_text())
    lock["installed"] = dict(sorted((d.metadata["Name"], d.version) for d in md.distributions() if d.metadata["Name"]))
    lock["checkouts"] = dict(a.split("=", 1) for a in commits)
    rows = [line.split("\t") for line in applied.read_text().splitlines()] if applied.exists() else []
    lock["patches_applied"] = [{"file": r[0], "sha256": r[1], "dir": r[2], "status": r[3]} for r in rows]
    lock_out.write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")
    return 0


def pins(lock_json: Path) -> int:
    problems, notes = pin_problems(expected_versions(json.loads(lock_json.read_text())), installed_versions())
    for line in notes:
        print(f"slimeforge: smoke: version {line}", file=sys.stderr)
    for line in problems:
        _error(f"smoke: version {line}")
    return 1 if problems else 0


def missing_of(lines: list[SliceLine], installed: dict[str, str]) -> list[str]:
    """What of a slice the venv does not hold as the slice says: a distribution missing, or at
    another version (the slice's version, when it names one)."""
    out = []
    for item in lines:
        have = installed.get(item.name)
        if have is None:
            out.append(f"{item.name} is not installed")
        elif item.version is not None and item.version != have:
            out.append(f"{item.name} is {have}, its slice says {item.version}")
    return out


def _dist_info_versions() -> dict[str, str]:
    """name -> version from the names of this interpreter's *.dist-info directories alone
    (`{name}-{version}.dist-info`, as installers write them): no METADATA is read, so the check of
    every step of a re-run costs a directory listing each."""
    import sysconfig

    out: dict[str, str] = {}
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        try:
            entries = os.listdir(site)
        except OSError:
            continue
        for entry in entries:
            name, sep, version = entry.removesuffix(".dist-info").partition("-")
            if entry.endswith(".dist-info") and sep and "-" not in version:
                out[canonical(name)] = version
    return out


def present(slice_file: Path) -> int:
    """install.sh's done record of a step holds only while its slice is installed (sf_done_holds):
    reported as plain lines (not errors: the step runs again). The directory names answer when
    every line is there as the slice says; otherwise the installed metadata decides (a name or a
    version an installer wrote differently in the directory name is not taken for missing)."""
    try:
        lines, unreadable = read_slice(slice_file)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"slimeforge: {slice_file.name}: cannot be read ({exc.__class__.__name__})", file=sys.stderr)
        return 1
    if not unreadable and not missing_of(lines, _dist_info_versions()):
        return 0
    problems = [f"cannot read lock line: {line[:200]!r}" for line in unreadable] + missing_of(lines,
                                                                                              installed_versions())
    for line in problems[:20]:
        print(_printable(f"slimeforge: {slice_file.name}: {line}"), file=sys.stderr)
    return 1 if problems else 0


USAGE = __doc__.split("\n\n")[1]


def main(argv: list[str]) -> int:
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    if command == "verify" and len(args) in (2, 3) and args[2:] in ([], ["--exact"]):
        return verify(Path(args[0]), args[1], args[2:] == ["--exact"])
    if command == "fetch" and len(args) >= 3:
        return fetch(args[0], Path(args[1]), Path(args[2]), args[3:])
    if command == "record" and len(args) >= 3:
        return record(Path(args[0]), Path(args[1]), Path(args[2]), args[3:])
    if command == "present" and len(args) == 1:
        return present(Path(args[0]))
    if command == "pins" and len(args) == 1:
        return pins(Path(args[0]))
    print(f"usage:\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
