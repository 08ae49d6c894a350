"""The Dockerfile of a stack, rendered (pure: no Docker, no network).

    render_dockerfile(stack, ...) -> str   the steps of `Stack.plan` as RUNs of the step library, the
                                           compiled steps' stages, the store's mounts
    compile_pieces(stack, store) -> int    how many compile stages BuildKit runs at once at most

In: a Stack (with the base as resolved, the local sources, the compiled-wheel store's plan, the
patches' sha256). Out: the Dockerfile's text; build.py writes it into the build directory.
"""

from __future__ import annotations

from ...errors import ConfigError
from ...schema import text_problems
from ...templating import render
from ..stack import Stack
from ..steps import (
    IMAGE_SCRIPTS,
    LIBRARY_SCRIPTS,
    LOCK_ALL,
    SMOKE_IMPORTS_DIR,
    TARGET_SCRIPTS,
    compiled_key,
    compiled_run,
    finalize_argv,
    image_layout,
    smoke_argv,
    smoke_import_args,
    step_commands,
    together_groups,
    venv_sizes_argv,
)
from .compilequeue import SSH_ID, STAGE_SOCKET

STORE_MOUNT, STORE_OUT = "/tmp/sf-compiled", "/opt/sf-compiled"


def render_dockerfile(stack: Stack, base_from: str | None = None, local_sources: dict | None = None,
                      base_id: str | None = None, store: dict[str, str] | None = None,
                      patch_sha: dict[str, str] | None = None, wheels_only: bool = False,
                      compile_queue: bool = False) -> str:
    """The Dockerfile of a stack (pure: no Docker, no network). `base_id`: the base as resolved
    (digest or local image id), part of the compiled-wheel keys. Each installing step bind-mounts its
    slice of the lock (context/lock/<step>.txt, see steps.lock_files). `store`: compiled step ->
    "use" (its wheels bind-mounted from context/compiled/<key>, nothing compiles) or "make" (compiled
    into /opt/sf-compiled/<key>). `wheels_only`: the steps up to the last compiled one, then a
    scratch stage holding /opt/sf-compiled, exported with `--output type=local`. `compile_queue`: each
    compile stage mounts the build's compile queue (compilequeue.py) and compiles behind it."""
    layout = image_layout(stack, local_sources)
    keys = {s.name: compiled_key(stack, s.name, base_id, patch_sha) for s in stack.plan if s.compiles}
    modes = {n: (m, f"{STORE_MOUNT if m == 'use' else STORE_OUT}/{keys[n]}") for n, m in (store or {}).items()}
    # The compiled steps that compile here, in runs (steps.together_groups): each compiles in a stage
    # of its own from the stage before its run (BuildKit builds them at once), its wheels in
    # STORE_OUT/<key>; the main stage then installs them in step order, bind-mounted from that
    # stage, as it installs a store hit's.
    plain = step_commands(stack, layout, base_id, modes, patch_sha)
    groups = together_groups(plain)
    grouped = {plain[i].name for g in groups for i in g}
    making = {**modes, **{n: ("make", f"{STORE_OUT}/{keys[n]}") for n in grouped}}
    compile_steps = {s.name: s for s in step_commands(stack, layout, base_id, making, patch_sha)}
    using = {**modes, **{n: ("use", f"{STORE_MOUNT}/{keys[n]}") for n in grouped}}
    steps = step_commands(stack, layout, base_id, using, patch_sha)
    if wheels_only:
        last = max((i for i, s in enumerate(steps) if compiled_run(s) and (store or {}).get(s.name) == "make"),
                   default=-1)
        steps = steps[:last + 1]
    rendered = [{**s.to_json(), "group": None, "compile_stage": None} for s in steps]
    for number, group in enumerate(g for g in groups if g[0] < len(rendered)):
        stage_from, stage_next = f"sf-s{number}", f"sf-s{number + 1}"
        pieces = []
        for i in group:
            if i >= len(rendered):
                break
            name = steps[i].name
            rendered[i]["compile_stage"] = f"sf-compile-{name}"
            pieces.append({**compile_steps[name].to_json(), "compile_stage": f"sf-compile-{name}"})
        rendered[group[0]].update(group=pieces, stage_from=stage_from, stage_next=stage_next)
    # Parallelism for a step that compiles in place (an editable checkout): the ARGs before it.
    first_compile = next((i for i, (s, r) in enumerate(zip(steps, rendered, strict=True))
                          if (c := compiled_run(s)) and not c.nothing and c.store != "use" and not r["compile_stage"]),
                         -1)
    return _render_dockerfile({
        "stack_id": stack.id,
        "base_ref": base_from or (f"{stack.base.image}@{stack.base.digest}" if stack.base.digest else stack.base.image),
        "state": layout.state,
        "venv": layout.venv,
        "patches_dir": layout.patches_dir,
        "steps": rendered,
        "first_compile": first_compile,
        "compiled_out": [{"stage": r["compile_stage"], "key": s.to_json()["compiled_key"]}
                         for s, r in zip(steps, rendered, strict=True)
                         if r["compile_stage"] and (store or {}).get(s.name) == "make"],
        "local_sources": sorted(n for n, s in (local_sources or {}).items() if getattr(s, "kind", "git") == "git"),
        "wheel_steps": sorted(layout.wheel_dirs),
        "patch_files": [p.file for p in stack.used_patches()],
        "patches_from": stack.pins().get("patches.dir", ""),
        # The last step as install.sh runs it: finalize makes the flag catalog in the smoke test's import
        # pass, then the smoke test reports that pass and runs its other checks; one set of imports
        # for both (side by side, each imported slime, SGLang and Megatron: 35-49 s on 2 cores).
        "finalize_argv": finalize_argv(stack, layout, f"{layout.state}/stack.input.json")
        + ["--imports-to", f"{layout.state}/{SMOKE_IMPORTS_DIR}", *smoke_import_args(stack)],
        "final_smoke_argv": smoke_argv(stack, layout, catalog=False)
        + ["--imports-from", f"{layout.state}/{SMOKE_IMPORTS_DIR}"],
        "target_scripts": sorted(TARGET_SCRIPTS | IMAGE_SCRIPTS),
        "venv_sizes_argv": venv_sizes_argv(layout),
        "library_scripts": sorted(LIBRARY_SCRIPTS),
        "lock_dir": layout.lock_dir,
        "lock_all": LOCK_ALL,
        "store_mount": STORE_MOUNT,
        "store_out": STORE_OUT,
        "wheels_only": wheels_only,
        "compile_queue": {"id": SSH_ID, "socket": STAGE_SOCKET} if compile_queue else None,
    })


def compile_pieces(stack: Stack, store: dict[str, str]) -> int:
    """How many compile stages BuildKit runs at once at most (the longest run of compiled steps that
    compile in this build): the build args give each that share of the host."""
    steps = step_commands(stack, image_layout(stack), None, {n: (m, "") for n, m in store.items()})
    return max((len(g) for g in together_groups(steps)), default=1)


def _render_dockerfile(variables: dict[str, object]) -> str:
    """A Dockerfile is read line by line and shell quoting does not reach past a line: a newline
    in any value would start an instruction of its own. The stack's validation refuses control
    characters already; this is the second line of defence, on exactly what is rendered."""
    problems = text_problems(variables)
    if problems:
        raise ConfigError("Dockerfile", problems)
    return render("Dockerfile.j2", variables)
