"""Smoke check: every pinned distribution is installed at the version the lock says.

Run with the TARGET interpreter (standard library; `packaging` when the venv has it):

    python smoke_versions.py LOCK_JSON

LOCK_JSON is the build's input lock (/opt/slimeforge/stack.input.json): its `pins` hold
`pip.<name>` and `slime-req.<name>` -> version or specifier. `expected_versions()` reads them and
`compare()` is the one comparison (point it at another lock format by changing only the reader).
Prints one line per distribution; exit 1 when any differs or is missing.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import sys

OPERATORS = ("<", ">", "=", "!", "~")


def canonical(name: str) -> str:
    """PEP 503 name, extras dropped: transformer_engine[pytorch] -> transformer-engine."""
    return re.sub(r"[-_.]+", "-", name.split("[", 1)[0]).lower()


def expected_versions(lock: dict) -> dict[str, str]:
    """distribution -> pin (an exact version, or a specifier such as <2) from an input lock."""
    out = {}
    for key, spec in (lock.get("pins") or {}).items():
        kind, _, name = key.partition(".")
        if kind in ("pip", "slime-req") and name:
            out[canonical(name)] = str(spec)
    return out


def installed_versions() -> dict[str, str]:
    return {canonical(d.metadata["Name"]): d.version for d in md.distributions() if d.metadata["Name"]}


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


def compare(expected: dict[str, str], installed: dict[str, str]) -> tuple[list[str], list[str]]:
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


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: smoke_versions.py LOCK_JSON", file=sys.stderr)
        return 2
    with open(argv[0]) as fh:
        expected = expected_versions(json.load(fh))
    problems, notes = compare(expected, installed_versions())
    for line in notes:
        print(f"slimeforge: smoke: version {line}", file=sys.stderr)
    for line in problems:
        print(f"slimeforge: ERROR: smoke: version {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
