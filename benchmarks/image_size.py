"""An image's size by directory, by layer and by duplicate: what in it is there twice, or is only
left from building.

    python benchmarks/image_size.py IMAGE [--top N] [--json OUT]

How it measures: the image's files as a container sees them (`docker run --rm --entrypoint find
IMAGE / -xdev -type f ...`: the final file system, each inode once, the sizes a layer's tar holds),
and `docker history` for each layer's bytes. A file deleted by a later layer is not in the file
system but still in its layer: the layers' sum minus the files' sum is that hidden part (a prune in
a later RUN shrinks what a container sees, never the image).

Printed (and written as JSON with --json):
  - layers: each RUN/COPY's bytes, largest first (what a step adds);
  - top directories: the largest at depths 1-4, and each distribution in the venv's site-packages;
  - duplicates: regular files of the same name and size in two or more directories (a CUDA library
    in the base's /usr/local/cuda and again in the venv's nvidia/* wheels, the same .so in two
    wheels), the bytes beyond the first copy as `extra`, split base-vs-venv, venv-vs-venv and
    base-vs-base;
  - left from building: headers (include/ trees, *.h, *.cuh, *.hpp), static libraries (*.a),
    bytecode (__pycache__: read at run time, listed for scale), tests/ and docs (share/doc,
    share/man, docs/) inside the image.
The venv is the image's VIRTUAL_ENV (its config), else the directory that holds pyvenv.cfg.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import PurePosixPath

IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}")  # a reference or an id; never an option
FIND = ["/", "-xdev", "-type", "f", "-printf", r"%s %i %p\0"]
LIBRARY = re.compile(r".*\.so(\.[0-9]+)*$")
HEADER = re.compile(r".*\.(h|hh|hpp|hxx|cuh|inl|inc)$")


@dataclass(frozen=True)
class File:
    path: str
    size: int


def parse_find(raw: bytes) -> list[File]:
    """find's `%s %i %p\\0` records, each inode once (a hard link counted where it is first seen)."""
    out, seen = [], set()
    for rec in raw.split(b"\0"):
        if not rec:
            continue
        size, ino, path = rec.split(b" ", 2)
        if ino in seen:
            continue
        seen.add(ino)
        out.append(File(path.decode("utf-8", "backslashreplace"), int(size)))
    return out


def top_dirs(files: list[File], depth: int, top: int, under: str = "/") -> list[tuple[str, int]]:
    """The `top` largest directories `depth` components below `under`."""
    base = PurePosixPath(under)
    sums: dict[str, int] = defaultdict(int)
    for f in files:
        p = PurePosixPath(f.path)
        try:
            rel = p.relative_to(base)
        except ValueError:
            continue
        if len(rel.parts) > depth:  # a file directly in a shallower directory belongs to none at this depth
            sums[str(base.joinpath(*rel.parts[:depth]))] += f.size
    return sorted(sums.items(), key=lambda kv: (-kv[1], kv[0]))[:top]


def where(path: str, venv: str | None) -> str:
    return "venv" if venv and (path == venv or path.startswith(venv.rstrip("/") + "/")) else "base"


def duplicates(files: list[File], venv: str | None, min_size: int = 64 << 10) -> list[dict]:
    """Files of one name and size in two or more directories, the largest waste first."""
    groups: dict[tuple[str, int], list[str]] = defaultdict(list)
    for f in files:
        if f.size >= min_size:
            groups[(PurePosixPath(f.path).name, f.size)].append(f.path)
    out = []
    for (name, size), paths in groups.items():
        if len(paths) > 1:
            sides = sorted({where(p, venv) for p in paths})
            out.append({"name": name, "size": size, "copies": len(paths), "extra": size * (len(paths) - 1),
                        "between": "-".join(sides) if len(sides) > 1 else f"{sides[0]}-{sides[0]}",
                        "paths": sorted(paths)})
    return sorted(out, key=lambda d: (-d["extra"], d["name"]))


def leftovers(files: list[File]) -> dict[str, dict[str, int]]:
    """Bytes (and files) of what building leaves: headers, static libraries, bytecode, tests, docs."""
    cats: dict[str, dict[str, int]] = {k: {"bytes": 0, "files": 0} for k in ("headers", "static_libraries", "bytecode",
                                                                             "tests", "docs")}
    for f in files:
        parts = PurePosixPath(f.path).parts
        name = parts[-1]
        if name.endswith(".a"):
            cat = "static_libraries"
        elif HEADER.fullmatch(name) or "include" in parts[:-1]:
            cat = "headers"
        elif "__pycache__" in parts or name.endswith(".pyc"):
            cat = "bytecode"
        elif "tests" in parts[:-1] or "test" in parts[:-1]:
            cat = "tests"
        elif ("share" in parts and ("doc" in parts or "man" in parts)) or "docs" in parts[:-1]:
            cat = "docs"
        else:
            continue
        cats[cat]["bytes"] += f.size
        cats[cat]["files"] += 1
    return cats


def docker(argv: list[str]) -> bytes:
    r = subprocess.run(["docker", *argv], capture_output=True)
    if r.returncode != 0:
        raise SystemExit(f"docker {argv[0]} failed (exit {r.returncode}): "
                         f"{r.stderr.decode(errors='replace').strip()[-400:]}")
    return r.stdout


def measure(image: str, top: int) -> dict:
    if not IMAGE.fullmatch(image):
        raise SystemExit(f"image {image!r:.80}: expected an image reference or id (letters, digits, ._/:@-; not "
                         "starting with '-')")
    cfg = json.loads(docker(["image", "inspect", "--format", "{{json .}}", image]))
    env = dict(e.split("=", 1) for e in (cfg.get("Config") or {}).get("Env") or [] if "=" in e)
    files = parse_find(docker(["run", "--rm", "--network", "none", "--entrypoint", "find", image, *FIND]))
    venv = (env.get("VIRTUAL_ENV") or next((str(PurePosixPath(f.path).parent) for f in files
                                            if f.path.endswith("/pyvenv.cfg")), None))
    layers = []
    for line in docker(["history", "--no-trunc", "--format", "{{json .}}", image]).decode().splitlines():
        h = json.loads(line)
        layers.append({"bytes": _bytes(h.get("Size", "0")), "created_by": h.get("CreatedBy", "")[:160]})
    site = next((f.path[:f.path.index("/site-packages/") + len("/site-packages")] for f in files
                 if venv and f.path.startswith(venv + "/") and "/site-packages/" in f.path), None)
    dups = duplicates(files, venv)
    by_side: dict[str, int] = defaultdict(int)
    for d in dups:
        by_side[d["between"]] += d["extra"]
    files_bytes = sum(f.size for f in files)
    layers_bytes = sum(x["bytes"] for x in layers)
    return {
        "image": image, "id": cfg.get("Id"), "size": cfg.get("Size"), "venv": venv,
        "files": len(files), "files_bytes": files_bytes, "layers_bytes": layers_bytes,
        "hidden_by_later_layers": max(layers_bytes - files_bytes, 0),
        "layers": sorted(layers, key=lambda x: -x["bytes"])[:top],
        "top_dirs": {f"depth{d}": top_dirs(files, d, top) for d in (1, 2, 3, 4)},
        "site_packages": top_dirs(files, 1, top, site) if site else [],
        "duplicates_extra": dict(sorted(by_side.items())), "duplicates": dups[:top * 2],
        "duplicate_libraries_extra": sum(d["extra"] for d in dups if LIBRARY.fullmatch(d["name"])),
        "leftovers": leftovers(files),
    }


def _bytes(text: str) -> int:
    """docker history's human size (`1.2GB`, `512kB`, `0B`)."""
    m = re.fullmatch(r"([0-9.]+)\s*([kMGT]?B)", text.strip())
    if not m:
        return 0
    return int(float(m.group(1)) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[m.group(2)])


def shown(text: str) -> str:
    """A path as the terminal gets it: a control or other unprintable character as its escape."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def report(r: dict) -> str:
    gb = lambda b: f"{b / 1e9:7.2f} GB"  # noqa: E731
    rows = [f"image {r['image']} ({(r['id'] or '')[:19]}): {gb(r['size'] or 0).strip()} (docker's size); "
            f"files {r['files']} = {gb(r['files_bytes']).strip()}; layers {gb(r['layers_bytes']).strip()}; "
            f"hidden by later layers {gb(r['hidden_by_later_layers']).strip()}; venv {r['venv']}",
            "layers, largest first:"]
    rows += [f"  {gb(x['bytes'])}  {x['created_by'][:110]}" for x in r["layers"]]
    for depth, dirs in r["top_dirs"].items():
        rows.append(f"top directories ({depth}):")
        rows += [f"  {gb(b)}  {p}" for p, b in dirs]
    if r["site_packages"]:
        rows.append("site-packages:")
        rows += [f"  {gb(b)}  {p}" for p, b in r["site_packages"]]
    rows.append("duplicates (same name and size, bytes beyond the first copy): "
                + ", ".join(f"{k} {gb(v).strip()}" for k, v in r["duplicates_extra"].items())
                + f"; of them libraries {gb(r['duplicate_libraries_extra']).strip()}")
    rows += [f"  {gb(d['extra'])}  {d['name']} x{d['copies']} ({d['between']}): "
             f"{' | '.join(d['paths'])[:200]}" for d in r["duplicates"]]
    rows.append("left from building:")
    rows += [f"  {gb(v['bytes'])}  {k} ({v['files']} files)" for k, v in r["leftovers"].items()]
    return "\n".join(shown(row) for row in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("image")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json", help="also write the measurement here")
    a = ap.parse_args()
    r = measure(a.image, max(1, min(a.top, 200)))
    print(report(r))
    if a.json:
        with open(a.json, "w") as fh:
            fh.write(json.dumps(r, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
