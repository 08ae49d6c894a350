"""What a flavor's lock is resolved from (`inputs(stack)`): every pin of every step, the overrides,
the indexes, the target, the sources and patches. Its hash, recorded in the lock, says whether a
lock is stale; `invoke lock --complete` refuses a lock whose inputs changed."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement

from ...errors import ConfigError, Problem
from ..stack import Stack
from .lockfile import normalize


def req_name(text: str) -> str:
    return normalize(Requirement(text).name)


@dataclass
class Inputs:
    """Everything a resolution of the flavor depends on; its hash says whether a lock is stale."""

    requirements: list[str]  # every pin of every step, sources' declared deps included
    overrides: list[str]
    indexes: list[str]  # extra indexes, searched before the default one
    python: str
    platform: str
    by_step: dict[str, list[str]]  # step -> the names it asks for
    from_source: list[str]  # names built from their sdist
    router: str | None
    sources: dict[str, str]
    base_image: str
    patches: list[str]  # <source>@<commit>:<dir>/<file> of every patch a step applies

    @property
    def hash(self) -> str:
        canon = json.dumps(self.__dict__, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()


def inputs(stack: Stack) -> Inputs:
    reqs: list[str] = []
    by_step: dict[str, list[str]] = {}
    overrides: list[str] = []
    from_source: list[str] = []
    for step in stack.plan:
        if step.kind == "pip":
            names = list(step.requirements or ())
            from_source += [normalize(n) for n in step.no_binary or ()]
            # uv has no "never this dependency": an override with a marker that is never true drops it.
            overrides += [f"{p} ; sys_platform == 'never'" for p in step.exclude or ()]
        elif step.kind == "source":
            assert step.source is not None  # a source step names its source (Stack.plan)
            names = [*(step.requirements or ()), *stack.lock.source_requirements.get(step.source, [])]
        else:
            continue  # apt, and the router wheel (a URL outside any index: its sha256 is recorded apart)
        bad = []
        for r in names:
            try:
                Requirement(r)
            except InvalidRequirement as exc:
                bad.append(Problem(f"steps ({step.name})", f"is not a requirement: {exc}", r,
                                   "name[extras]<specifier>"))
        if bad:
            raise ConfigError(f"stack {stack.name}", bad)
        reqs += [r for r in names if r not in reqs]
        by_step[step.name] = sorted({req_name(r) for r in names})
    # Packages that a source step builds itself (e.g. torch_memory_saver from its pinned commit)
    # must not come from the index too: two copies of one name cannot both be installed.
    overrides += [f"{p} ; sys_platform == 'never'" for p in stack.lock.provided_by_sources]
    overrides += list(stack.lock.overrides)
    indexes = [i for i in [stack.torch_index, *stack.lock.extra_indexes] if i]
    patches = []
    if stack.patches:
        src = stack.patches.from_source
        patches = [f"{src}@{stack.sources[src].commit}:{stack.patches.dir}/{p.file}" for p in stack.used_patches()]
    return Inputs(reqs, overrides, indexes, stack.python, stack.uv_platform, by_step, sorted(set(from_source)),
                  stack.router.wheel if stack.router else None, {n: s.commit for n, s in stack.sources.items()},
                  stack.base.image,
                  patches)
