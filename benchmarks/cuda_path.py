"""The path of `invoke build --cuda FLAVOR` to its rendered Dockerfile (issue 41 item 8), measured by running it.

    python benchmarks/cuda_path.py [--cuda cu13] [--list]

Runs the build task's dry run (slimeforge/cli.py build, as `invoke build --cuda FLAVOR --dry-run` does: it writes
the build directory under build/, builds nothing) under a profiler, from the task until the Dockerfile
is rendered (templating.render of Dockerfile.j2 returns), and counts, over the project's files
(slimeforge/ and tasks/; code run while a module is imported left out):

    files        every file a function of which runs on the way
    value files  the files whose functions are called with the value itself: the flavor string, or what
                 carries it (BuildOptions, Stack, Prepared, PlanStep)
    back up      steps of the value's path (its files in first-call order) into a higher layer than
                 the step before; and caller -> callee edges into a higher layer (callbacks)

Layers are the import-linter contracts of pyproject.toml: the package's (api -> ... -> core) and, inside
a container (image/, image/lock/, ...), its own; the task namespace (tasks/) is above them all.
"""

from __future__ import annotations

import argparse
import os
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
VALUE_TYPES = {"BuildOptions", "Stack", "Prepared", "AptStep", "PipStep", "WheelUrlStep",
               "SourceStep"}  # PlanStep: one of the last four


def layer_ranks() -> list[tuple[str, list[list[str]]]]:
    """(container, layers) of every layers contract: each layer a list of sibling module names."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    out = []
    for contract in config["contracts"]:
        if contract.get("type") != "layers":
            continue
        for container in contract.get("containers", [""]):
            layers = ([[(f"{container}.{m.strip()}" if container else m.strip()) for m in row.split(":")] for row
                       in contract["layers"]])
            out.append((container, layers))
    return out


def rank(module: str, contracts: list[tuple[str, list[list[str]]]]) -> tuple[int, ...]:
    """The module's position at each depth of containment: smaller is higher; tasks/ is (-1,)."""
    if module == "tasks":
        return (-1,)
    found = []
    for container, layers in sorted(contracts, key=lambda c: len(c[0])):
        if container and not module.startswith(container + "."):
            continue
        for i, row in enumerate(layers):
            if any(module == m or module.startswith(m + ".") for m in row):
                found.append(i)
                break
    return tuple(found)


def project(filename: str) -> str | None:
    """A file of slimeforge's own (relative to the checkout), or None."""
    try:
        rel = Path(filename).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None
    return rel if rel.startswith(("slimeforge/", "tasks/")) else None


def call_tracer(carries, calls: list[tuple[str, str | None, bool]], done: list[bool]):
    """A sys.setprofile function recording each call into a project file: (file, calling project file,
    whether an argument carries the value), until done[0]; calls made while a project module is
    imported are not the path."""

    def profile(frame, event, arg):
        if (done[0] or event != "call" or (rel := project(frame.f_code.co_filename)) is None
                or frame.f_code.co_name == "<module>"):
            return
        up, caller = frame.f_back, None
        while up is not None:
            if up.f_code.co_name == "<module>" and project(up.f_code.co_filename):
                return
            caller = caller or (project(up.f_code.co_filename) if up.f_code.co_name != "<module>" else None)
            up = up.f_back
        code = frame.f_code
        values = [frame.f_locals.get(n) for n in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]]
        calls.append((rel, caller, any(carries(v) for v in values)))

    return profile


def higher(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether b is in a higher layer than a (compared down to the depth both have)."""
    n = min(len(a), len(b))
    return b[:n] < a[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cuda", default="cu13")
    ap.add_argument("--list", action="store_true", help="list the files")
    args = ap.parse_args()
    os.chdir(ROOT)
    from slimeforge import cli, templating

    contracts = layer_ranks()
    calls: list[tuple[str, str | None, bool]] = []  # file, caller file, called with the value
    done = [False]

    def carries(v: object) -> bool:
        return v == args.cuda if isinstance(v, str) else type(v).__name__ in VALUE_TYPES

    profile = call_tracer(carries, calls, done)

    render = templating.render

    def watched(name, *a, **k):
        out = render(name, *a, **k)
        done[0] = done[0] or name == "Dockerfile.j2"
        return out

    templating.render = watched
    sys.setprofile(profile)
    try:
        cli.build.body(None, cuda=args.cuda, dry_run=True)
    finally:
        sys.setprofile(None)
    if not done[0]:
        raise SystemExit("the Dockerfile was not rendered: is templating.render still how it is rendered?")

    def module(rel: str) -> str:
        return rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")

    files = list(dict.fromkeys(rel for rel, _, _ in calls))
    value_files = list(dict.fromkeys(rel for rel, _, carries in calls if carries))
    ranks = {f: rank(module(f), contracts) for f in files}
    value_ups = [(a, b) for a, b in zip(value_files, value_files[1:], strict=False) if higher(ranks[a], ranks[b])]
    edges = {(c, r) for r, c, _ in calls if c and c != r}
    edge_ups = sorted((c, r) for c, r in edges if higher(ranks[c], ranks[r]))
    print(f"invoke build --cuda {args.cuda} --dry-run, up to the rendered Dockerfile:")
    print(f"  files:        {len(files)}")
    print(f"  value files:  {len(value_files)}")
    print(f"  back up:      {len(value_ups)} steps of the value's path, {len(edge_ups)} caller -> callee edges")
    if args.list:
        print("value files, in first-call order:\n" + "\n".join(f"  {f}" for f in value_files))
        print("steps back up:\n" + "\n".join(f"  {a} -> {b}" for a, b in value_ups))
        print("edges back up:\n" + "\n".join(f"  {a} -> {b}" for a, b in edge_ups))
        print("other files:\n" + "\n".join(f"  {f}" for f in files if f not in value_files))


if __name__ == "__main__":
    main()
