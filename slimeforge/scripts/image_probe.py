"""What a container image holds, read inside it with ITS python (standard library only, no GPU,
no network): the Python and Ray versions, where slime and Megatron-LM are and at which commits,
and slime's flag catalog.

    docker run --rm --network none --entrypoint python3 -v SCRIPTS:/slimeforge-probe:ro IMAGE \\
        /slimeforge-probe/image_probe.py [--slime DIR] [--megatron DIR]

For any image, slimeforge's or another's (slime's official one: slime at /root/slime, Megatron at
/root/Megatron-LM). The catalog is the image's own /opt/slimeforge/flags.json when slimeforge built
it; otherwise it is made here from slime's real parsers (flag_catalog.py, beside this file). slime
is looked for at --slime, then where `import slime` resolves; Megatron at --megatron, then where
`import megatron` resolves. What cannot be learned (no slime, parsers that do not import) is said
in `catalog_problem`, never a failure: the last line of stdout is always one JSON object.
It also says whether slimeforge built the image (/opt/slimeforge is there) and the image's own
PYTHONPATH and LD_LIBRARY_PATH (null when unset): a run in another image is rendered for its
layout, adding to those rather than replacing them (run/layout.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys

import env_probe
import flag_catalog

FORMAT, VERSION = "slimeforge.image-probe", 1
IMAGE_STATE = "/opt/slimeforge"  # paths.IMAGE_STATE: every image `invoke build` made has it
IMAGE_CATALOG = IMAGE_STATE + "/flags.json"  # paths.IMAGE_STATE/paths.FLAGS, where `invoke build` puts it
MAX_CATALOG_BYTES = 8 << 20
SHA_RE = re.compile(r"[0-9a-f]{40}")


def checkout(given: str | None, package: str) -> str | None:
    """The directory holding `package`/ (a checkout): `given` when it holds one, else the parent of
    the package `import package` finds (an editable install's checkout, or site-packages)."""
    if given and os.path.isdir(os.path.join(given, package)):
        return given
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.dirname(os.path.abspath(list(spec.submodule_search_locations)[0]))


def git_commit(directory: str | None) -> str | None:
    """HEAD's commit of the git checkout at `directory`, read from .git's files (no git needed)."""
    if not directory:
        return None
    git = os.path.join(directory, ".git")
    try:
        if os.path.isfile(git):  # a worktree or submodule: "gitdir: PATH"
            with open(git) as fh:
                line = fh.read(4096).strip()
            if not line.startswith("gitdir: "):
                return None
            git = os.path.join(directory, line[len("gitdir: "):])
        with open(os.path.join(git, "HEAD")) as fh:
            head = fh.read(4096).strip()
        if SHA_RE.fullmatch(head):
            return head
        if not head.startswith("ref: refs/"):
            return None
        ref = head[len("ref: "):]
        for base in (git, _common_dir(git)):
            path = os.path.join(base, ref)
            if os.path.isfile(path):
                with open(path) as fh:
                    sha = fh.read(4096).strip()
                return sha if SHA_RE.fullmatch(sha) else None
            packed = os.path.join(base, "packed-refs")
            if os.path.isfile(packed):
                with open(packed) as fh:
                    for row in fh.read(16 << 20).splitlines():
                        sha, _, name = row.partition(" ")
                        if name == ref and SHA_RE.fullmatch(sha):
                            return sha
    except OSError:
        return None
    return None


def _common_dir(git: str) -> str:
    try:
        with open(os.path.join(git, "commondir")) as fh:
            return os.path.join(git, fh.read(4096).strip())
    except OSError:
        return git


def probe(slime: str | None, megatron: str | None) -> dict:
    out: dict = {"format": FORMAT, "version": VERSION, **env_probe.facts(), "catalog": None, "catalog_source": None,
                 "catalog_problem": None}
    slime_dir, megatron_dir = checkout(slime, "slime"), checkout(megatron, "megatron")
    out.update(slime_dir=slime_dir, megatron_dir=megatron_dir, slime_commit=git_commit(slime_dir),
               megatron_commit=git_commit(megatron_dir),
               slimeforge_image=os.path.isdir(IMAGE_STATE), pythonpath=os.environ.get("PYTHONPATH"),
               ld_library_path=os.environ.get("LD_LIBRARY_PATH"))
    if os.path.isfile(IMAGE_CATALOG):  # slimeforge built it: the catalog its build made
        with open(IMAGE_CATALOG, "rb") as fh:
            data = fh.read(MAX_CATALOG_BYTES + 1)
        try:
            out["catalog"], out["catalog_source"] = json.loads(data.decode("utf-8", errors="replace")), IMAGE_CATALOG
        except ValueError as exc:
            out["catalog_problem"] = f"{IMAGE_CATALOG} is not JSON: {exc}"
        return out
    if slime_dir is None:
        out["catalog_problem"] = (f"no slime found: {slime or '(no path given)'} holds no slime/ package and "
                                  f"`import slime` finds none with {sys.executable}")
        return out
    try:
        doc = flag_catalog.catalog_of(slime_dir, megatron_dir)
    except SystemExit as exc:  # the catalog script's one line, e.g. a module this Python lacks
        out["catalog_problem"] = str(exc).replace("slimeforge: ERROR: flag catalog: ", "", 1)
        return out
    doc["slime_commit"], doc["megatron_commit"] = out["slime_commit"], out["megatron_commit"]
    out["catalog"], out["catalog_source"] = doc, "parsers"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slime", default=None,
                    help="where slime's checkout should be (else: where `import slime` resolves)")
    ap.add_argument("--megatron", default=None,
                    help="where Megatron-LM's checkout should be (else: where `import megatron` resolves)")
    opts = ap.parse_args(argv)
    doc = probe(opts.slime, opts.megatron)
    sys.stdout.flush()
    print(json.dumps(doc, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
