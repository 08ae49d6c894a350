"""Prebuilt GPU code for archs outside the stack's arch_list, taken out of the venv by the step that
installs it: standard library only, run by path with the TARGET venv's interpreter
($SF_STATE/venvprune.py; slimeforge/scripts/venvprune.py in a checkout).

    python venvprune.py prune STATE STEP SLICE   sf_pip_step, right after the step installs SLICE
    python venvprune.py check STATE              what venvlock.py verify adds: every prune holds

Why it is safe: a cubin is machine code for one GPU architecture (its ELF header says which: sm_90,
sm_100, sm_103...); the driver loads it only on a GPU of that major (sm_100f: 10.x, sm_100a: 10.0),
so on an image built for arch_list ["9.0"] (whose compiled pieces run on Hopper only anyway) a
Blackwell cubin can never be loaded, whoever reads it. flashinfer asks for a cubin by name when it
launches a kernel, and its kernel tables (flashInferMetaInfo.h) keep only the kernels of the GPU's
own SM, so on Hopper it never asks for one (docs/build.md "The image's size").

The rule is data (RULES): which distribution, which of its RECORD paths, how a file's arch is read.
The arch list comes from the step's slice of the lock, a `# prune: keep-arch 9.0` line that
slimeforge writes (steps.lock_files) only into the slice of a step installing a distribution a rule
names, so a change of arch_list re-does that step alone. Each prune is recorded in
STATE/pruned/<distribution>.json (what was removed: count and bytes) and said in the step's log;
`check` reads those records back (validated) and proves against each distribution's RECORD that
the files missing are exactly the rule's, of archs outside the kept ones, and no others.
"""

from __future__ import annotations

import csv
import importlib.metadata as md
import io
import json
import os
import re
import stat
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

# The slice's line: `# prune: keep-arch 9.0 10.0` (the stack's arch_list, its grammar: stack.py).
ARCH = re.compile(r"[1-9][0-9]?\.[0-9]")
KEEP_LINE = re.compile(r"# prune: keep-arch((?: [1-9][0-9]?\.[0-9]){1,16})")
RECORD_DIR = "pruned"
MAX_RECORD_BYTES = 64 << 20  # a distribution's RECORD (flashinfer-cubin's: 2.3 MB)
MAX_STATE_BYTES, MAX_STATE_FILES = 4096, 64
NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")  # a canonical distribution name
VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]{0,63}")
STEP = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SLICE_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:@|==)")


@dataclass(frozen=True)
class Rule:
    name: str  # in the records and the log
    dist: str  # the canonical distribution name whose files it removes
    path: re.Pattern[str]  # fullmatch on a RECORD path: only these files are ever looked at
    arch: str  # how a file's GPU arch is read: "cubin" (its ELF header, checked against its name)


RULES: tuple[Rule, ...] = (
    # flashinfer-cubin 0.6.12: trtllm-gen fmha, gemm, batched gemm and DeepGEMM cubins under
    # cubins/<40-hex artifact commit>/<kernel family>/...; 1.80 of its 1.86 GB are sm100/sm103.
    Rule("cubin-arch", "flashinfer-cubin",
         # (each name begins with no dot: never `..`, never a hidden file)
         re.compile(r"flashinfer_cubin/cubins/[0-9a-f]{40}/(?:[A-Za-z0-9_+-][A-Za-z0-9_.+-]{0,199}/){1,6}"
                    r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]{0,249}\.cubin"), "cubin"),
)


def canonical(name: str) -> str:
    """The PEP 503 name (venvlock.canonical's rule: this file imports nothing of its siblings)."""
    return re.sub(r"[-_.]+", "-", name.split("[", 1)[0]).lower()


def rules_for(names: set[str]) -> list[Rule]:
    return [r for r in RULES if r.dist in names]


def keep_line(arch_list: list[str], names: list[str]) -> str:
    """The line a slice gets (steps.lock_files): empty unless the slice installs a distribution a rule
    names and the stack has an arch list (without one nothing says which archs a run needs)."""
    if not arch_list or not rules_for({canonical(n) for n in names}):
        return ""
    bad = [a for a in arch_list if not ARCH.fullmatch(a)]
    if bad:
        raise ValueError(f"arch_list: {bad} are not compute capabilities such as 9.0")
    return f"# prune: keep-arch {' '.join(arch_list)}\n"


def read_keep(text: str) -> tuple[list[str] | None, list[str], list[str]]:
    """(the kept archs, or None without a keep line; the slice's distribution names; problems)."""
    keep: list[str] | None = None
    names, problems = [], []
    for raw in text.splitlines():
        if raw.startswith("# prune:"):
            m = KEEP_LINE.fullmatch(raw)
            if m is None or keep is not None:
                problems.append(f"not a keep-arch line (or a second one): {raw[:200]!r}")
                continue
            keep = m[1].split()
        elif (m := SLICE_NAME.match(raw)) is not None:
            names.append(canonical(m[1]))
    return keep, names, problems


def majors(keep: list[str]) -> set[int]:
    return {int(a.split(".")[0]) for a in keep}


def cubin_sm(head: bytes) -> int | None:
    """The SM a cubin was compiled for (90, 100, 103...) from its ELF header, or None when it is not a
    CUDA ELF of the one layout read here: ELF64, little-endian, OS ABI 0x41 (CUDA), ABI version 8 (CUDA
    12.8 on), machine 190 (EM_CUDA), the SM in e_flags' second byte (offset 49). Measured, not assumed:
    in flashinfer-cubin 0.6.12 that byte agrees with the file name's sm token on all 15,241 files that
    have one. Any other layout (an older ABI) is None: its file is kept."""
    if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1 or head[7] != 0x41:
        return None
    if int.from_bytes(head[18:20], "little") != 190:
        return None
    if head[8] != 8:
        return None
    sm = head[49]
    return sm if 20 <= sm <= 199 else None


NAME_SM = re.compile(r"(?:^|[a-z_])[Ss]m_?([1-9][0-9]{1,2})[afk]?(?=[A-Z_.]|Kernel)")


def name_sm(basename: str) -> int | None:
    """The SM a file's name says (fmhaSm100fKernel_..., ..._sm103a.cubin), when it says one."""
    found = {int(m) for m in NAME_SM.findall(basename)}
    return found.pop() if len(found) == 1 else None


# Rule.arch -> how that kind of file says its SM.
ARCH_READERS = {"cubin": cubin_sm}


def removable(rule: Rule, rel: str, head: bytes, keep: set[int]) -> tuple[bool, int | None]:
    """(whether the rule removes this file, the SM it read) for a kept-major set `keep`. A file whose
    arch cannot be read, or whose name says another major than its header, is kept."""
    if not rule.path.fullmatch(rel):
        return False, None
    sm = ARCH_READERS[rule.arch](head)
    if sm is None:
        return False, None
    said = name_sm(rel.rsplit("/", 1)[-1])
    if said is not None and said // 10 != sm // 10:
        return False, sm
    return sm // 10 not in keep, sm


@dataclass(frozen=True)
class Row:
    path: str
    size: int | None


def read_record(text: str) -> tuple[list[Row], list[str]]:
    """A distribution's RECORD (`path,sha256=...,size` per row), read as input: each row three
    fields, a printable path of at most 4096 characters, a size of digits or none."""
    rows, problems = [], []
    for number, fields in enumerate(csv.reader(io.StringIO(text)), 1):
        if not fields:
            continue
        if len(fields) != 3 or not fields[0] or len(fields[0]) > 4096 or not fields[0].isprintable():
            problems.append(f"RECORD row {number} is not `path,hash,size`: {str(fields)[:200]}")
        elif fields[2] and not re.fullmatch(r"[0-9]{1,15}", fields[2]):
            problems.append(f"RECORD row {number}: size {fields[2][:40]!r} is not a number of bytes")
        else:
            rows.append(Row(fields[0], int(fields[2]) if fields[2] else None))
    return rows, problems


def _record_of(dist: md.Distribution) -> tuple[list[Row], list[str]]:
    text = dist.read_text("RECORD")
    if text is None:
        return [], [f"{dist.metadata['Name']} has no RECORD (reinstall it)"]
    if len(text) > MAX_RECORD_BYTES:
        return [], [f"the RECORD of {dist.metadata['Name']} is over {MAX_RECORD_BYTES} bytes: not a wheel's record"]
    return read_record(text)


def _head(path: Path | str) -> bytes | None:
    """The first 64 bytes of a regular file (not a link: a link's target is not the wheel's file)."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        with open(path, "rb") as fh:
            return fh.read(64)
    except OSError:
        return None


# Threads that read headers and unlink at once: the prune's time was the disk's, one small read per
# file after another (flashinfer-cubin: 15,558 files, 6.0 s of a store-hit install on 2 cores, 1.4 s
# of it CPU); the reads and unlinks release the GIL, so the disk gets many requests at a time.
IO_THREADS = 16


def _heads(paths: list[str]) -> list[bytes | None]:
    """_head of each path, in order, read side by side."""
    with ThreadPoolExecutor(IO_THREADS) as pool:
        return list(pool.map(_head, paths, chunksize=64))


def _write_json(path: Path, doc: dict[str, object]) -> None:
    """Written whole or not at all: a temporary name, then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _say(text: str) -> None:
    """A line of the step's log; what a venv's metadata says (a version) reaches it without escapes."""
    print(_UNPRINTABLE.sub("?", f"slimeforge: {text}"), file=sys.stderr)


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


# --- commands ----------------------------------------------------------------------------------


def prune(state: Path, step: str, slice_file: Path) -> int:
    try:
        text = slice_file.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        _say(f"ERROR: step {step}: its slice of the lock {slice_file} cannot be read ({exc.__class__.__name__})")
        return 1
    keep, names, problems = read_keep(text)
    for p in problems:
        _say(f"ERROR: step {step}: {slice_file.name}: {p}")
    if problems:
        return 1
    if keep is None:
        return 0
    kept = majors(keep)
    for rule in rules_for(set(names)):
        try:
            dist = md.distribution(rule.dist)
        except md.PackageNotFoundError:
            _say(f"step {step}: prune {rule.name}: {rule.dist} is not installed; nothing to prune")
            continue
        rows, bad = _record_of(dist)
        for p in bad:
            _say(f"ERROR: step {step}: prune {rule.name}: {p}")
        if bad:
            return 1
        count = size = left = 0
        by_sm: dict[int, int] = {}
        base = str(dist.locate_file(""))
        mine = [row for row in rows if rule.path.fullmatch(row.path)]
        files = [os.path.join(base, row.path) for row in mine]
        doomed: list[str] = []
        for row, file, head in zip(mine, files, _heads(files), strict=True):
            gone, sm = removable(rule, row.path, head or b"", kept)
            if not gone or sm is None:
                left += 1
                continue
            # The RECORD's size where it has one: the figure `check` adds up again from the same rows.
            n = row.size if row.size is not None else os.stat(file).st_size
            doomed.append(file)
            count, size = count + 1, size + n
            by_sm[sm] = by_sm.get(sm, 0) + n
        with ThreadPoolExecutor(IO_THREADS) as pool:
            for _ in pool.map(os.unlink, doomed, chunksize=64):
                pass
        _write_json(state / RECORD_DIR / f"{rule.dist}.json", {
            "schema": 1, "dist": rule.dist, "version": dist.version, "step": step, "rule": rule.name,
            "keep": keep, "removed": count, "bytes": size})
        archs = ", ".join(f"sm{sm} {_gb(n)}" for sm, n in sorted(by_sm.items())) or "none"
        _say(f"step {step}: pruned {rule.dist} {dist.version}: {count} file(s), {_gb(size)} of GPU code for "
             f"archs outside arch_list {' '.join(keep)} ({archs}); {left} of its {rule.name} files kept")
    return 0


@dataclass(frozen=True)
class Pruned:
    """A prune record, STATE/pruned/<dist>.json."""

    dist: str
    version: str
    step: str
    rule: Rule
    keep: list[str]
    removed: int
    bytes: int


def read_state(path: Path) -> tuple[Pruned | None, str | None]:
    """A prune record read back: (the record, None) or (None, why it is refused)."""
    try:
        if path.is_symlink() or not path.is_file():
            return None, "not a regular file"
        if path.stat().st_size > MAX_STATE_BYTES:
            return None, f"over {MAX_STATE_BYTES} bytes"
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, f"cannot be read ({exc.__class__.__name__})"
    want = {"schema", "dist", "version", "step", "rule", "keep", "removed", "bytes"}
    if not isinstance(doc, dict) or set(doc) != want:
        return None, f"keys must be exactly {sorted(want)}"
    keep = doc["keep"]
    checks = [
        (type(doc["schema"]) is int and doc["schema"] == 1, "schema must be 1"),
        (isinstance(doc["dist"], str) and bool(NAME.fullmatch(doc["dist"])) and path.name == f"{doc['dist']}.json",
         "dist must be the canonical name the file is named after"),
        (isinstance(doc["version"], str) and bool(VERSION.fullmatch(doc["version"])), "version is not a version"),
        (isinstance(doc["step"], str) and bool(STEP.fullmatch(doc["step"])), "step is not a step name"),
        (isinstance(doc["rule"], str) and any(r.name == doc["rule"] and r.dist == doc["dist"] for r in RULES),
         "rule is not a rule of this distribution"),
        (isinstance(keep, list) and 1 <= len(keep) <= 16
         and all(isinstance(a, str) and ARCH.fullmatch(a) for a in keep),
         "keep must list compute capabilities such as 9.0"),
        (all(type(doc[k]) is int and 0 <= doc[k] < 1 << 50 for k in ("removed", "bytes")),
         "removed and bytes must be whole numbers"),
    ]
    why = next((text for ok, text in checks if not ok), None)
    if why:
        return None, why
    rule = next(r for r in RULES if r.name == doc["rule"])
    return Pruned(doc["dist"], doc["version"], doc["step"], rule, list(keep), doc["removed"], doc["bytes"]), None


def check(state: Path, lock_dir: Path) -> list[str]:
    """Every prune holds: each slice's keep-arch line has its record for each rule's distribution
    installed, and against that distribution's RECORD the files missing are exactly those the rule
    removed (each a path of the rule; as many, as many bytes, as the record says), and none of the
    rule's files left is of an arch outside the kept ones."""
    errors: list[str] = []
    expected: dict[str, list[str]] = {}
    for f in sorted(lock_dir.glob("*.txt")):
        try:
            keep, names, problems = read_keep(f.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            errors.append(f"{f.name}: cannot be read ({exc.__class__.__name__})")
            continue
        errors += [f"{f.name}: {p}" for p in problems]
        if keep is not None:
            expected.update({r.dist: keep for r in rules_for(set(names))})
    records = sorted((state / RECORD_DIR).glob("*.json")) if (state / RECORD_DIR).is_dir() else []
    if len(records) > MAX_STATE_FILES:
        return errors + [f"{state / RECORD_DIR}: over {MAX_STATE_FILES} records: not what slimeforge writes"]
    seen = set()
    for path in records:
        doc, why = read_state(path)
        if doc is None:
            errors.append(f"prune record {path}: {why}: remove it and run the step that installs the distribution "
                          "again")
            continue
        dist_name, keep, rule = doc.dist, doc.keep, doc.rule
        seen.add(dist_name)
        try:
            dist = md.distribution(dist_name)
        except md.PackageNotFoundError:
            errors.append(f"prune record {path.name}: {dist_name} is not installed: remove the record")
            continue
        where = f"{dist_name} {dist.version} (pruned by step {doc.step})"
        if dist.version != doc.version:
            errors.append(f"prune record {path.name} is of {dist_name} {doc.version}, the venv holds {dist.version}: "
                          f"run step {doc.step} again")
            continue
        if dist_name in expected and expected[dist_name] != keep:
            errors.append(f"{where}: pruned for arch_list {' '.join(keep)}, its slice now keeps "
                          f"{' '.join(expected[dist_name])}: run step {doc.step} again")
        rows, bad = _record_of(dist)
        errors += [f"{where}: {p}" for p in bad]
        count = size = 0
        kept = majors(keep)
        base = str(dist.locate_file(""))
        for row in rows:
            file = os.path.join(base, row.path)
            if os.path.lexists(file):
                if rule.path.fullmatch(row.path) and removable(rule, row.path, _head(file) or b"", kept)[0]:
                    errors.append(f"{where}: {row.path} is GPU code for an arch outside {' '.join(keep)}, "
                                  "which the prune removes: run the step again")
            elif not rule.path.fullmatch(row.path):
                errors.append(f"{where}: {row.path} is missing, and no prune rule removes it (reinstall {dist_name})")
            else:
                count, size = count + 1, size + (row.size or 0)
        if (count, size) != (doc.removed, doc.bytes):
            errors.append(f"{where}: {count} of its files ({size} bytes) are missing, its prune record says "
                          f"{doc.removed} ({doc.bytes} bytes): reinstall {dist_name}")
    for dist_name, keep in sorted(expected.items()):
        if dist_name in seen:
            continue
        try:
            md.distribution(dist_name)
        except md.PackageNotFoundError:
            continue
        errors.append(f"{dist_name} is installed by a step whose slice keeps arch {' '.join(keep)}, but has no "
                      f"prune record in {state / RECORD_DIR}: run that step again")
    return errors


USAGE = __doc__.split("\n\n")[1]


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "prune" and STEP.fullmatch(argv[2]):
        return prune(Path(argv[1]), argv[2], Path(argv[3]))
    if len(argv) == 2 and argv[0] == "check":
        errors = check(Path(argv[1]), Path(argv[1]) / "lock")
        for e in errors:
            _say(f"ERROR: {e}")
        return 1 if errors else 0
    print(f"usage:\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
