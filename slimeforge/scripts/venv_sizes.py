"""The venv's largest directories, written as a record the image build reads back into its report.

Run by the image's last RUN with the venv's Python (standard library only), after finalize:

    python venv_sizes.py VENV OUT

OUT (JSON): {"schema": 1, "venv": VENV, "bytes": total, "largest": [{"path", "bytes"}, ...]}, the
10 largest of: each directory directly in site-packages (a distribution's package: nvidia, torch,
flashinfer_cubin, ...) and each top-level directory of the venv other than lib (bin, include,
share). Bytes are the regular files' sizes (what a layer's tar holds), a hard-linked file counted
once; symbolic links are not followed. Paths are relative to VENV.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

TOP = 10


def tree_bytes(root: str, seen: set[tuple[int, int]]) -> int:
    """The regular files under `root` (not following links), each inode once."""
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
    return total


def sizes(venv: Path) -> dict:
    seen: set[tuple[int, int]] = set()
    site = sorted(venv.glob("lib/python*/site-packages"))
    candidates = [d for s in site for d in sorted(s.iterdir()) if d.is_dir() and not d.is_symlink()]
    candidates += [d for d in sorted(venv.iterdir()) if d.is_dir() and not d.is_symlink() and d.name not in ("lib", "lib64")]
    measured = [(str(d.relative_to(venv)), tree_bytes(str(d), seen)) for d in candidates]
    total = sum(b for _, b in measured) + tree_bytes(str(venv), seen)  # what is left: files outside the candidates
    largest = sorted(measured, key=lambda item: (-item[1], item[0]))[:TOP]
    return {"schema": 1, "venv": str(venv), "bytes": total, "largest": [{"path": p, "bytes": b} for p, b in largest]}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: venv_sizes.py VENV OUT", file=sys.stderr)
        return 2
    venv, out = Path(argv[0]), Path(argv[1])
    if not venv.is_dir():
        print(f"venv_sizes: {venv} is not a directory", file=sys.stderr)
        return 1
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(sizes(venv), indent=1) + "\n")
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
