"""YAML loading with `extends:` and deep merge, shared by stacks, recipes and inventories."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError, Problem


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(str(path), [Problem("file", f"cannot be read: {exc.strerror}", str(path), show_value=False)]) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "file"
        raise ConfigError(str(path), [Problem(where, f"is not valid YAML: {getattr(exc, 'problem', exc)}", show_value=False)]) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(str(path), [Problem("file", "must hold a YAML mapping", type(data).__name__, "key: value pairs")])
    return data


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; every other value (lists included) is replaced."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_with_extends(path: Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Load `path`, resolving `extends:` (a path relative to the file) recursively."""
    path = path.resolve()
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ConfigError(str(path), [Problem("extends", "forms a cycle", chain, show_value=False)])
    data = read_yaml(path)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ConfigError(str(path), [Problem("extends", "must be a file path", parent, "a path relative to this file")])
    parent_path = (path.parent / parent)
    if not parent_path.exists():
        raise ConfigError(str(path), [Problem("extends", "names a file that does not exist", parent, str(parent_path))])
    return deep_merge(load_with_extends(parent_path, (*_seen, path)), data)


def parse_set(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`--set a.b=value` overrides; the value is read as YAML so numbers and lists keep their type."""
    out: dict[str, Any] = {}
    problems = []
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            problems.append(Problem("--set", "must look like key=value", item, "key=value, key.sub=value"))
            continue
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    if problems:
        raise ConfigError("command line", problems)
    return out
