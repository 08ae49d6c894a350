"""The venv's largest directories, written as a record the image build reads back into its report.

Run by the image's last RUN with the venv's Python (standard library only), after finalize:

    python venv_sizes.py VENV OUT

OUT (JSON): {"schema": 1, "venv": VENV, "bytes": total, "largest": [{"path", "bytes"}, ...]}, the
10 largest of: each directory directly in site-packages (a distribution's package: nvidia, torch,
flashinfer_cubin, ...) and each top-level directory of the venv other than lib (bin, include,
share). Bytes are the regular files' sizes (what a layer's tar holds), a hard-linked file counted
once; symbolic links are not followed. Paths are relative to VENV.

A directory may be named anything a file system holds (pip's `~orch` leftovers, spaces, non-ASCII,
bytes that are not UTF-8, `.venv`): every path is written as printable text (`shown`), never
refused, so that an odd name in a venv never fails the build that measured it.

Also "duplicates": files of one name and size (at least 1 MiB) in two or more places of the venv
and the base's CUDA toolkit (CUDA_HOME, else /usr/local/cuda): the 10 that waste most, each with
its size, copies and up to 4 absolute paths, and "duplicates_bytes", the bytes beyond each first
copy over all of them (a CUDA library in the base and again in an nvidia/* wheel, one .so in two wheels).
"""

from __future__ import annotations

import json
import os
import sys
import unicodedata
from pathlib import Path

TOP = 10
DUP_MIN = 1 << 20  # smaller files are many and their copies weigh little
DUP_PATHS = 4
SHOWN_MAX = 512  # characters of a path as the record holds it (buildreport.VenvSizes reads up to this)
_UNPRINTABLE = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")


def shown(text: str) -> str:
    """A path as printable text: a byte that is not UTF-8 (Python's surrogateescape) as \\xNN, a control,
    format (bidirectional), separator or unassigned character as \\uNNNN, a backslash doubled; at
    most SHOWN_MAX characters (a longer one ends in '...')."""
    out = []
    for ch in text:
        o = ord(ch)
        if 0xDC80 <= o <= 0xDCFF:
            out.append(f"\\x{o - 0xDC00:02x}")
        elif ch == "\\":
            out.append("\\\\")
        elif unicodedata.category(ch) in _UNPRINTABLE:
            out.append(f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}")
        else:
            out.append(ch)
    text = "".join(out)
    return text if len(text) <= SHOWN_MAX else text[:SHOWN_MAX - 3] + "..."


def tree_bytes(root: str, seen: set[tuple[int, int]], found: dict[tuple[str, int], list[str]] | None = None) -> int:
    """The regular files under `root` (not following links), each inode once; each file of at
    least DUP_MIN bytes also in `found` by (name, size)."""
    total, todo = 0, [root]
    while todo:
        try:
            entries = os.scandir(todo.pop())
        except OSError:
            continue
        with entries:
            for e in entries:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if e.is_dir(follow_symlinks=False):
                    todo.append(e.path)
                elif e.is_file(follow_symlinks=False) and (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
                    if found is not None and st.st_size >= DUP_MIN:
                        found.setdefault((e.name, st.st_size), []).append(e.path)
    return total


def _dirs(parent: Path) -> list[Path]:
    """The directories directly in `parent` (not links); none where it cannot be listed."""
    try:
        return [d for d in sorted(parent.iterdir()) if d.is_dir() and not d.is_symlink()]
    except OSError:
        return []


def sizes(venv: Path, cuda: str | None = None) -> dict:
    seen: set[tuple[int, int]] = set()
    found: dict[tuple[str, int], list[str]] = {}
    site = sorted(venv.glob("lib/python*/site-packages"))
    candidates = [d for s in site for d in _dirs(s)]
    candidates += [d for d in _dirs(venv) if d.name not in ("lib", "lib64")]
    measured = [(shown(str(d.relative_to(venv))), tree_bytes(str(d), seen, found)) for d in candidates]
    total = sum(b for _, b in measured) + tree_bytes(str(venv), seen,
                                                     found)  # what is left: files outside the candidates
    largest = sorted(measured, key=lambda item: (-item[1], item[0]))[:TOP]
    cuda = os.path.realpath(cuda or os.environ.get("CUDA_HOME") or "/usr/local/cuda")
    if os.path.isdir(cuda) and not os.path.realpath(venv).startswith(cuda + os.sep):
        tree_bytes(cuda, seen, found)  # the base's toolkit: its libraries against the venv's wheels
    dups = sorted(((size * (len(ps) - 1), name, size, sorted(ps)) for (name, size),
                   ps in found.items() if len(ps) > 1), reverse=True)
    return {"schema": 1, "venv": shown(str(venv)), "bytes": total, "largest": [{"path": p, "bytes": b} for p,
                                                                               b in largest],
            "duplicates_bytes": sum(d[0] for d in dups),
            "duplicates": [{"name": shown(name), "bytes": size, "copies": len(ps),
                            "paths": [shown(p) for p in ps[:DUP_PATHS]]}
                           for _, name, size, ps in dups[:TOP]]}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: venv_sizes.py VENV OUT", file=sys.stderr)
        return 2
    venv, out = Path(argv[0]), Path(argv[1])
    if not venv.is_dir():
        print(f"venv_sizes: {shown(str(venv))} is not a directory", file=sys.stderr)
        return 1
    # A measurement: what cannot be measured or written is said, and the image is made all the same
    # (the build then reports no sizes).
    try:
        record = json.dumps(sizes(venv), indent=1) + "\n"
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(record)
        os.replace(tmp, out)
    except (OSError, ValueError) as exc:
        print(f"venv_sizes: not measured ({shown(str(exc))})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
