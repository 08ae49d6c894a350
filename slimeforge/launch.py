"""Launching a run: preflight, Ray head, Jobs API submission, log streaming (see `launch`)."""

from __future__ import annotations

from .errors import SlimeforgeError


def launch(recipe, stack, out=None, recipe_path="(api)", **options) -> int:
    raise SlimeforgeError("the launch itself is not built yet: use --dry-run, then run launch.sh from the run directory")
