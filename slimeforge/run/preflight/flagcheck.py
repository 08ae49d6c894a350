"""The flags check: every rendered flag (slime.args and MODEL_ARGS) is in the flag catalog of the
image, install or local build that will run it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ... import paths, readback
from ...schema import did_you_mean
from ..flagcatalog import Catalog, catalog_in_place, load_catalog
from ..imageprobe import ProbeError
from .findings import Context, Finding, check, describe_failure, error, ok, warning
from .model import is_flag, model_args
from .toolfix import known_fix


def find_catalog(ctx: Context) -> tuple[Catalog, str] | None:
    """(catalog, where) from --catalog, the image, the install, or build/; None if none."""
    if ctx.catalog:
        return load_catalog(ctx.catalog), ctx.catalog
    if ctx.mode == "container" and ctx.image:
        # Any image: slimeforge's probe runs in it (its own flags.json when slimeforge built it,
        # else slime's parsers read there), once per image ID.
        facts = ctx.image_facts()
        if isinstance(facts, Exception):
            raise facts
        if facts.catalog is None:
            raise ProbeError(str(facts.catalog_problem))
        how = "cached" if facts.cached else "probed now"
        if facts.catalog_source == "parsers":
            return facts.catalog, (f"read from slime's parsers at {facts.slime_dir} in {ctx.image} (image "
                                  f"{facts.short_id}, {how})")
        return facts.catalog, f"{ctx.image}:{facts.catalog_source} (image {facts.short_id}, {how})"
    if ctx.mode == "host" and ctx.install_prefix:
        path = Path(paths.Prefix.at(ctx.install_prefix).flags)
        if path.is_file():
            return load_catalog(path), str(path)
    if ctx.in_place and ctx.recipe is not None and ctx.python:
        # In place: slime's own parsers, read with the interpreter that will run it.
        r = ctx.recipe
        return catalog_in_place(ctx.python, r.slime_dir, r.megatron_dir,
                                ctx.runner), f"slime at {r.slime_dir}, read with {ctx.python}"
    # A local build of this very stack: its report names the stack id (name and stack hash).
    for build in paths.local_builds(ctx.build_root, ctx.stack.name):
        try:  # through the one reader: a FIFO or a huge file named report.json is passed over, never read
            report = readback.read_json(build / paths.BUILD_REPORT, paths.BUILD_REPORT, "a build report")
        except readback.RecordError:
            continue
        path = build / paths.FLAGS
        if isinstance(report, dict) and report.get("stack") == ctx.stack.id and path.is_file():
            return load_catalog(path), str(path)
    return None


def flags_in(argv: Sequence[str]) -> list[str]:
    return [tok.split("=", 1)[0] for tok in argv if is_flag(tok)]


@check("flags", "recipe", needs_recipe=True)
def check_flags(ctx: Context) -> list[Finding]:
    """Every rendered flag (slime.args + MODEL_ARGS) is in the image's flag catalog."""
    r = ctx.recipe
    assert r is not None
    if ctx.mode == "container" and ctx.image and not ctx.catalog and (blocker := ctx.image_blocker("flags")):
        return [blocker]
    try:
        found = find_catalog(ctx)
    except ProbeError as exc:  # the image runs, but what it holds cannot be learned: not a reason to refuse
        return [warning("flags", f"flag catalog unknown, flags not checked: {exc}",
                        f"set slime_dir / megatron_dir to where {ctx.image} holds slime and Megatron-LM (its python3 "
                        "must import "
                        "slime's parsers), or point at a catalog with --catalog PATH (invoke flags.catalog makes one)")]
    except Exception as exc:  # noqa: BLE001
        return [error("flags", f"cannot read the flag catalog: {describe_failure(exc)}",
                      known_fix(exc, "point at a catalog with --catalog PATH, or rebuild the image"))]
    # with --address the image is the cluster's
    if found is None and ctx.mode == "container" and not ctx.image and not ctx.address:
        return [error("flags",
                      "no flag catalog found (no image given to read one in, no --catalog, no local build), so a flag "
                      "slime "
                               "would silently ignore cannot be caught",
                      "give --image IMAGE (its catalog is read there), point at one with --catalog PATH, or "
                      "--skip-check flags")]
    if found is None:
        return [error("flags", "no flag catalog found, so a flag slime would silently ignore cannot be caught",
                      "build or install first (it writes flags.json), point at one with --catalog PATH, or "
                      "--skip-check flags")]
    catalog, where = found
    commit = catalog.slime_commit
    margs = model_args(ctx)
    argv = [*(margs if isinstance(margs, list) else []), *ctx.args]
    unknown = sorted(set(flags_in(argv)) - catalog.flags)
    out = []
    for flag in unknown:
        hint = did_you_mean(flag, sorted(catalog.flags))
        src = "extra_flags" if flag in flags_in(r.extra_flags) else ("the model script" if isinstance(margs,
                                                                                                      list) and flag
                                                                     in flags_in(margs) else "slime.args")
        fix = (f"did you mean {hint}? " if hint else "") + "remove it or correct its spelling"
        if catalog.version < 2:
            # A version 1 catalog is `train.py --help`: only Megatron's parser answers --help.
            fix += ("; this catalog was made from train.py --help, which lists no --sglang-*/--router-* option: "
                    "make one from slime's parsers with invoke flags.catalog (or rebuild the image)")
        out.append(error("flags",
                         f"{flag} (from {src}) is not a flag of slime {commit[:12]} ({where}); slime would silently "
                         "ignore it", fix))
    return out or [ok("flags", f"all {len(set(flags_in(argv)))} flags are in the catalog of slime {commit[:12]} "
                           f"({len(catalog.parsers) or 'help-text'} parser(s); {where})")]

