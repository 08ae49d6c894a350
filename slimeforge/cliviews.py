"""What the tasks print: a result as its text for people, or as its one JSON document (--json; each
schema in docs/json.md). slimeforge/cli.py wires the options to these; the libraries they read
(image/, run/, cluster/) return data and print nothing of their own on stdout.

Heavy libraries are imported inside the functions, as in cli.py, so that `--help` stays fast.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from slimeforge.console import json_doc


def stack_view(ref: str, as_json: bool) -> str:
    """`stack.show`: a stack's pins, its lock (or why it has none usable) and its ordered steps."""
    from slimeforge.image.lock import lockfile
    from slimeforge.image.stack import AptStep, SourceStep, load_stack
    from slimeforge.schema import printable

    stack = load_stack(ref)
    try:
        pylock, lock_problem = lockfile.load_lock(ref, stack), None
    except lockfile.LockError as exc:  # it names its remedy (image/lock/remedies.py)
        pylock, lock_problem = None, f"lock: {exc}"
    if as_json:  # what the text says about the lock, the document says too (docs/json.md: warnings)
        return json_doc("slimeforge.stack/1", {"id": stack.id, "hash": stack.hash, "version": stack.version,
                                               "cuda": stack.cuda,
                                                "python": stack.python, "driver_min": stack.driver_min,
                                               "pins": stack.pins(),
                                                "steps": [s.to_json() for s in stack.plan],
                                                "warnings": [printable(lock_problem)] if lock_problem else []})
    lines = [f"stack {stack.id}  (version {stack.version}, CUDA {stack.cuda}, Python {stack.python}, driver >= "
             f"R{stack.driver_min})"]
    width = max(len(k) for k in stack.pins())
    lines += [f"  {key:<{width}}  {value}" for key, value in stack.pins().items()]
    if pylock is not None:
        lines.append(f"lock {pylock.path}  (sha256 {pylock.hash[:16]}, {len(pylock.packages)} distributions)")
    else:
        lines.append(str(lock_problem))
    lines.append("steps:")
    for i, step in enumerate(stack.plan, 1):
        what = step.packages if isinstance(step, AptStep) else step.requirements
        extra = f" @ {step.commit[:12]}" if isinstance(step, SourceStep) else ""
        lines.append(f"  {i:2}. {step.name:<20} {step.kind:<9}{extra} {' '.join(what)}")
    return "\n".join(lines)


def wheels_view(cuda: str, stacks: list[str], *, unused: bool, registry: str | None, as_json: bool) -> str:
    """`wheels.ls`: each compiled key of the stacks (hit or miss here, where it is stored, its size),
    or with `unused` the stored keys no stack uses."""
    from slimeforge.image.stack import load_stack
    from slimeforge.image.wheels import wheelstore

    if unused:
        keys = wheelstore.unused(wheelstore.known_stacks(stacks))
        return (json_doc("slimeforge.wheels-unused/1", {"store": str(wheelstore.store_root()),
                                                        "unused": keys}) if as_json
                else "\n".join(f"{wheelstore.store_root() / k}" for k in keys) or "no unused keys")
    creds = None
    if registry:
        from slimeforge.image.remote.credentials import docker_config_credentials

        creds = docker_config_credentials(wheelstore.remote_ref(registry, "k").registry)
    rows = [r for s in (stacks or [cuda]) for r in wheelstore.listing(load_stack(s), registry=registry,
                                                                      credentials=creds)]
    if as_json:
        return json_doc("slimeforge.wheels/1", {"store": str(wheelstore.store_root()), "keys": rows})
    return "\n".join([f"store {wheelstore.store_root()}",
                      *(f"{r['step']:<24} {r['status']:<13} {r['key']:<40} {r['size'] / 1e6:8.1f} MB  "
                        f"{' '.join(r['where'])}" for r in rows)])


def checks_view(as_json: bool) -> str:
    """`doctor --list-checks`: every preflight check, its scope and whether it needs a recipe."""
    from slimeforge.run import preflight

    if as_json:
        checks = [{"name": chk.name, "scope": chk.scope, "needs_recipe": chk.needs_recipe,
                   "doc": chk.doc} for chk in preflight.CHECKS.values()]
        return json_doc("slimeforge.doctor-checks/1", {"checks": checks})
    return "\n".join(preflight.list_checks())


def status_view(target: str, data: Mapping[str, object], lines: Sequence[str], as_json: bool) -> str:
    """`run.status`: a job's status as its document, or its lines; the lines carry Ray's and Slurm's
    text (a job's message, a reason), so no escape sequence reaches the terminal."""
    from slimeforge.schema import printable

    return json_doc("slimeforge.run-status/1", {"target": target,
                                                **data}) if as_json else "\n".join(printable(line) for line in lines)
