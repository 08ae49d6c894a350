"""The JSON shapes docs/json.md documents (its ```shape blocks), and a checker that holds a
command's output to one: every documented key present, with the documented type."""

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "json.md"
TYPES = {"str": (str,), "int": (int,), "number": (int, float), "bool": (bool,), "object": (dict,), "list": (list,),
         "null": (type(None),)}


def shapes() -> dict[str, list[tuple[str, str]]]:
    """schema name -> [(key path, type text)], as docs/json.md writes them."""
    out = {}
    for name, body in re.findall(r"```shape (\S+)\n(.*?)```", DOC.read_text(), re.S):
        out[name] = [tuple(part.strip() for part in line.split(":", 1)) for line in body.strip().splitlines()]
    return out


def _values(doc, path: str):
    """Every value at a key path: `a.b`, `a[].b` (each item of list a), `a{}` (each value of object a)."""
    values = [doc]
    for part in re.findall(r"[^.\[\]{}]+(?:\[\]|\{\})?", path):
        name, each = re.fullmatch(r"([^\[\]{}]+)(\[\]|\{\})?", part).groups()
        nxt = []
        for v in values:
            assert isinstance(v, dict) and name in v, f"{path}: {name!r} missing in {str(v)[:200]}"
            item = v[name]
            if each == "[]":
                assert isinstance(item, list), f"{path}: {name} is not a list"
                nxt += item
            elif each == "{}":
                assert isinstance(item, dict), f"{path}: {name} is not an object"
                nxt += list(item.values())
            else:
                nxt.append(item)
        values = nxt
    return values


def check(doc, schema: str) -> None:
    """Raise AssertionError naming the key unless `doc` has `schema`'s documented shape."""
    assert isinstance(doc, dict) and doc.get("schema") == schema, (
        f"schema is {doc.get('schema') if isinstance(doc, dict) else doc!r}, wanted {schema}")
    assert list(doc)[0] == "schema"
    for path, type_text in shapes()[schema]:
        wanted = tuple(t for name in type_text.split("|") for t in TYPES[name])
        for value in _values(doc, path):
            ok = isinstance(value, wanted) and (bool in wanted or not isinstance(value, bool))
            assert ok, f"{schema}: {path} is {type(value).__name__} {str(value)[:80]!r}, documented as {type_text}"
