"""Preflight: every problem that would surface an hour into a launch, found in a second, before
anything starts (`invoke doctor`, and the first thing `invoke run` does).

Each check is a named function registered with `@check` that returns Findings (error / warning /
ok), each error with its fix. All checks run and all findings are reported together; `skip` turns
a check's errors into warnings. One module per concept:

  findings   Finding, Report, Context, the registry (`check`), PreflightError
  host       GPUs, driver, GPU architecture, /dev/shm, limits, ports
  engine     container mode: Docker answers, the NVIDIA Container Toolkit runs a --gpus container
  toolfix    a failing tool's own message, and a fix only from what it says
  model      the model script's flags against config.json
  data       data files, checkpoint directory, runtime env values
  flagcheck  every rendered flag is in the flag catalog
  aws        credentials, S3, AgentCore
  versions   Ray and Python of this client against the cluster's
  kernels    every compiled piece runs right on this host's GPU (only when asked: --kernels)

The modules are imported below in report order: the order of the checks is the order they register.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from ... import paths
from ...errors import ConfigError, Problem
from ...image.stack import Stack, load_stack
from ...proc import Runner
from ..recipe import Recipe

# isort: off
# Importing a module registers its checks: these lines are the report's order.
from . import host, engine, model, data, flagcheck, aws, versions, kernels  # noqa: F401
# isort: on
from .findings import CHECKS, ERROR, OK, WARNING, Context, Finding, PreflightError, Report, Run, error

__all__ = ["CHECKS", "ERROR", "OK", "WARNING", "Finding", "PreflightError", "Report", "Run", "run_checks"]

# --- running them ---------------------------------------------------------------------------------


def run_checks(recipe: Recipe | None = None, stack: Stack | None = None, *, args: Sequence[str] | None = None,
               mode: str | None = None,
               address: str | None = None, catalog: str | None = None, image: str | None = None,
               install_prefix: str | None = None,
               skip: Iterable[str] = (), only: Iterable[str] | None = None, network: bool = True,
               run: Run | None = None, runner: Runner | None = None,
               state_dir: Path | None = None, environ: dict[str, str] | None = None, build_root: Path | None = None,
               gpu_checks: bool = False, python: str | None = None) -> Report:
    """Run every check that applies (without a recipe: the host checks), return all findings.

    `args`: the rendered slime.args (default: rendered from the recipe). `skip`: check names whose
    errors become warnings. `only`: run just these. `network=False` leaves out AWS and the cluster.
    `gpu_checks=True` adds the checks of scope "gpu" (the kernel check: seconds per compiled piece on
    the GPU), which run only when asked (or named in `only`). `python`: host mode's interpreter when
    known (in place: this one); without an install prefix the flag catalog and versions are read with it."""
    from ..flags import env_json, render_flags

    skip, only = set(skip), (set(only) if only is not None else None)
    unknown = sorted((skip | (only or set())) - set(CHECKS))
    if unknown:
        raise ConfigError("doctor", [Problem("--skip-check", "is not a check", name,
                                             ", ".join(CHECKS)) for name in unknown])
    if stack is None:
        stack = load_stack(recipe.stack if recipe else "cu13")
    if recipe is not None and args is None:
        args = render_flags(recipe, stack, config_path="agentcore.yaml", env_json=env_json({}), wandb=False)
    ctx = Context(stack=stack, recipe=recipe, args=list(args or []), mode=mode or (recipe.mode if recipe else "host"),
                  address=address, catalog=catalog, image=image or (recipe.image if recipe else None),
                  install_prefix=install_prefix or (recipe.install_prefix if recipe else None), run=run,
                  runner=runner or Runner(),
                  environ=dict(os.environ if environ is None else environ), state_dir=state_dir,
                  build_root=paths.BUILDS if build_root is None else Path(build_root), python=python)
    start = time.monotonic()
    findings: list[Finding] = []
    for chk in CHECKS.values():
        if only is not None and chk.name not in only:
            continue
        if chk.needs_recipe and recipe is None:
            continue
        if chk.scope == "network" and not network:
            continue
        if chk.scope == "gpu" and not gpu_checks and not (only and chk.name in only):
            continue
        try:
            got = chk.fn(ctx)
        except Exception as exc:  # noqa: BLE001 - a broken check must not hide the others
            got = [error(chk.name, f"the check itself failed: {type(exc).__name__}: {exc}",
                         f"--skip-check {chk.name} to go on, and report this")]
        if chk.name in skip:
            got = [Finding(f.check, WARNING, f"(skipped) {f.message}", f.fix) if f.level == ERROR else f for f in got]
        findings += got
    return Report(findings, time.monotonic() - start)


def list_checks() -> list[str]:
    return [f"  {chk.name:<16} {chk.scope:<8} {chk.doc}" for chk in CHECKS.values()]


def doctor(recipe_path: str | None, overrides: Sequence[str] = (), *, cuda: str | None = None,
           address: str | None = None,
           mode: str | None = None, image: str | None = None, prefix: str | None = None, catalog: str | None = None,
           skip: Iterable[str] = (), network: bool = True, gpu_checks: bool = False) -> Report:
    """`invoke doctor`: a recipe's checks as its launch would run them (its mode, image and prefix
    applied), or without a recipe the host checks against a stack. `gpu_checks`: the kernel check too,
    of the recipe's install or image, or of `prefix` / `image` (an image alone: container mode)."""
    from ..headstate import check_address, state_dir
    from ..modechoice import command_line_problems, resolve_mode
    from ..recipe import parse_overrides
    from ..recipecheck import load_recipe

    if address is not None:
        check_address(address)
    if recipe_path:
        rec, stack = load_recipe(recipe_path, parse_overrides(list(overrides)))
        rec = resolve_mode(rec, mode, prefix, image, require_image=False)
        return run_checks(rec, stack, mode=mode, address=address, catalog=catalog, skip=skip, network=network,
                          state_dir=state_dir(rec.ray_port), gpu_checks=gpu_checks)
    command_line_problems(mode, prefix, image)  # as resolve_mode does with a recipe
    if mode is None and image and not prefix:
        mode = "container"  # `invoke doctor --kernels --image IMAGE`: the image's kernels
    return run_checks(None, load_stack(cuda or "cu13"), mode=mode, address=address, catalog=catalog, skip=skip,
                      network=network,
                      image=image, install_prefix=prefix, gpu_checks=gpu_checks)
