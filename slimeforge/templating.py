"""Jinja environment shared by every template: missing variables are errors, and `q` shell-quotes.

Python builds one flat dict of variables; templates only loop and branch. Every value that lands
in a shell script goes through `q` (shlex.quote), so quotes, `$()`, backticks, spaces and newlines
arrive byte for byte.
"""

from __future__ import annotations

import json
import shlex
from functools import lru_cache
from typing import Any

import jinja2

from . import paths


def shell_quote(value: Any) -> str:
    if isinstance(value, bool):
        value = "true" if value else "false"
    return shlex.quote(str(value))


def docker_json(value: Any) -> str:
    """A JSON string, for Dockerfile exec-form arguments and LABEL values."""
    return json.dumps(str(value))


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(paths.TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["q"] = shell_quote
    env.filters["json"] = docker_json
    return env


def render(template: str, variables: dict[str, Any]) -> str:
    return environment().get_template(template).render(**variables)
