"""YAML loading with `extends:` and deep merge, shared by stacks, recipes and inventories.

Every file is bounded before anything is built from it: its size, its nesting and the number of
values it expands to (a YAML alias bomb is small on disk and gigabytes once expanded), and the
length of its `extends:` chain. Duplicate keys are refused (YAML's "last one wins" loses a value
silently), and a file that is not UTF-8 is refused naming the byte where it stops being text.
"""

from __future__ import annotations

import copy
import errno
import re
from pathlib import Path
from typing import Any

import yaml

from . import readback
from .errors import ConfigError, Problem, shown

# The largest real file (images/common.yaml) is 5 KiB with about 300 values. PyYAML is pure Python
# here: 64 KiB of the costliest shape (one long flow list) parses in about 1.5 s, 1 MiB in 23 s.
MAX_FILE_BYTES = 64 << 10
MAX_DEPTH = 32  # the deepest real file (a stack) nests 5 levels
MAX_NODES = 20_000  # values after aliases are expanded
MAX_EXTENDS = 16  # files in one extends: chain
_BRACKETS = re.compile(r"[\[\]{}]")
_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,127}")  # one part of a --set key


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (the value that loses would be dropped silently)."""


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(None, None, "a mapping key must be a plain value",
                                                    key_node.start_mark) from None
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {shown(key, 60)} (first on line {first}); a key may appear once",
                                                    key_node.start_mark)
        seen[key] = key_node.start_mark.line + 1
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _check_graph(node: yaml.Node, source: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH, an alias that contains itself, and documents that
    expand to more than MAX_NODES values; all measured on the node graph, before construction."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(n: yaml.Node, depth: int) -> int:
        if depth > MAX_DEPTH:
            raise ConfigError(source, [Problem("file", f"nests deeper than {MAX_DEPTH} levels", show_value=False,
                                               accepted=f"at most {MAX_DEPTH} levels of mappings and lists")])
        if id(n) in sizes:
            return sizes[id(n)]
        if id(n) in active:
            raise ConfigError(source, [Problem(f"line {n.start_mark.line + 1}",
                                               "an alias refers to the value that contains it",
                                               show_value=False, accepted="aliases of finished values only")])
        active.add(id(n))
        total = 1
        if isinstance(n, yaml.SequenceNode):
            total += sum(size(c, depth + 1) for c in n.value)
        elif isinstance(n, yaml.MappingNode):
            total += sum(size(k, depth + 1) + size(v, depth + 1) for k, v in n.value)
        active.discard(id(n))
        if total > MAX_NODES:
            raise ConfigError(source, [Problem("file", f"expands to more than {MAX_NODES} values (aliases included)",
                                               show_value=False,
                                               accepted="a recipe, stack or inventory of ordinary size")])
        sizes[id(n)] = total
        return total

    size(node, 0)


def _flow_too_deep(text: str) -> bool:
    """Whether `[`/`{` nest deeper than MAX_DEPTH, counted on the raw text. PyYAML's parser slows
    down with the square of the flow depth (0.7 s at 1,000 levels, before its recursion fails),
    so this is decided before it runs. Brackets inside quoted strings count too: a real file never
    holds 32 unclosed ones."""
    depth = 0
    for m in _BRACKETS.finditer(text):
        depth += 1 if m.group() in "[{" else -1
        if depth > MAX_DEPTH:
            return True
    return False


def parse_yaml(text: str, source: str) -> Any:
    """One YAML document, bounded (see the module doc); ConfigError naming `source` otherwise."""
    if _flow_too_deep(text):
        raise ConfigError(source, [Problem("file", f"nests deeper than {MAX_DEPTH} levels", show_value=False,
                                           accepted=f"at most {MAX_DEPTH} levels of mappings and lists")])
    loader = None
    try:
        loader = _Loader(text)  # the reader refuses some characters (NUL, ...) here already
        node = loader.get_single_node()
        if node is None:
            return None
        _check_graph(node, source)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "file"
        raise ConfigError(source, [Problem(where, f"is not valid YAML: {getattr(exc, 'problem', None) or exc}",
                                           show_value=False)]) from None
    except RecursionError:
        raise ConfigError(source, [Problem("file", f"nests deeper than {MAX_DEPTH} levels",
                                           show_value=False)]) from None
    except ValueError as exc:
        # PyYAML turns a scalar into an int with int(): over 4300 digits Python refuses.
        what = "a number too long to read (over 4300 digits)" if "digits" in str(exc) else "a value that cannot be read"
        raise ConfigError(source, [Problem("value" if source == "--set" else "file", f"holds {what}", show_value=False,
                                           accepted="whole numbers of at most 19 digits")]) from None
    finally:
        if loader is not None:
            loader.dispose()


def read_yaml(path: Path) -> dict[str, Any]:
    """A recipe, stack or inventory file: read through the one reader (readback.read_bytes: a
    regular file only, never a FIFO that blocks or a device that never ends), bounded, strict UTF-8."""
    source = str(path)
    accepted = "a recipe, stack or inventory of ordinary size"
    raw = readback.read_bytes(path, "file", "a regular YAML file", max_bytes=MAX_FILE_BYTES, follow_symlinks=True)
    if raw is None:
        raise ConfigError(source, [Problem("file", "cannot be read: No such file or directory", show_value=False,
                                           accepted=accepted)])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(source, [Problem(f"line {line}",
                                           f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
                                           show_value=False, accepted="a UTF-8 encoded YAML file")]) from None
    data = parse_yaml(text, source)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(source, [Problem("file", "must hold a YAML mapping", type(data).__name__,
                                           "key: value pairs")])
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
    try:
        path = Path(path).resolve()
    except (RuntimeError, OSError) as exc:  # RuntimeError: Python before 3.13 on a symlink loop
        why = "is a symlink loop" if isinstance(exc, RuntimeError) or getattr(exc, "errno", None) == errno.ELOOP else \
            f"cannot be resolved: {exc.strerror if isinstance(exc, OSError) else exc}"
        raise ConfigError(str(_seen[0] if _seen else path), [Problem("extends" if _seen else "file", why, str(path),
                                                                     "a regular YAML file, or a symlink that ends at "
                                                                     "one")]) from None
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ConfigError(str(_seen[0]), [Problem("extends", f"forms a cycle: {chain}", show_value=False,
                                                  accepted="a chain of files that ends in one without extends:")])
    if len(_seen) >= MAX_EXTENDS:
        raise ConfigError(str(_seen[0]), [Problem("extends", f"chain is longer than {MAX_EXTENDS} files",
                                                  show_value=False,
                                                  accepted=f"at most {MAX_EXTENDS} files in one chain")])
    data = read_yaml(path)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str) or not parent or "\0" in parent:
        raise ConfigError(str(path), [Problem("extends", "must be a file path", parent,
                                              "a path relative to this file")])
    parent_path = path.parent / parent
    # what else is there, the reader judges (a FIFO, a directory)
    if not (parent_path.exists() or parent_path.is_symlink()):
        raise ConfigError(str(path), [Problem("extends", "names no file", parent,
                                              f"an existing file (looked for {parent_path})")])
    return deep_merge(load_with_extends(parent_path, (*_seen, path)), data)


def parse_set(items: list[str] | tuple[str, ...], typed=None) -> dict[str, Any]:
    """`--set a.b=value` overrides. `typed(dotted_key, raw)` turns the text into the value (the
    schema knows the field's type; YAML's guesses turn `save=no` into False); without it the
    value is read as YAML."""
    out: dict[str, Any] = {}
    problems = []
    for item in items:
        key, sep, raw = item.partition("=")
        parts = key.split(".")
        if not sep or not all(_KEY_RE.fullmatch(p) for p in parts):
            problems.append(Problem("--set", "must look like key=value", item,
                                    "key=value or key.sub=value; keys of letters, digits, '_' and '-'"))
            continue
        if typed is not None:
            try:
                value = typed(key, raw)
            except ValueError as exc:
                problems.append(Problem(f"--set {key}", str(exc), raw))
                continue
        else:
            try:
                value = parse_yaml(raw, "--set") if raw != "" else ""
            except ConfigError:
                value = raw
        node = out
        for part in parts[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                problems.append(Problem(f"--set {key}", f"{part} was already set to a plain value", item))
                break
            node = nxt
        else:
            node[parts[-1]] = value
    if problems:
        raise ConfigError("command line", problems)
    return out

