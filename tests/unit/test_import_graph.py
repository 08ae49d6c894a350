"""No import circle inside the package, type-only imports included (issue 31): each module's
imports, read from its source (`if TYPE_CHECKING:` and function-level imports count too), form
a graph without cycles. A name imported from a package counts as its submodule when it is one."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "slimeforge"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in known:
                    out.add(sub)
                elif source in known:
                    out.add(source)
    out.discard(name)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_the_package_has_no_import_circle():
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    # A package's __init__ that re-exports from its own submodules is not a circle the reader has
    # to follow: the edge from a submodule up to its own package is left out.
    graph = {n: {m for m in deps if not (n.startswith(m + ".") and known[m].name == "__init__.py")} for n,
             deps in graph.items()}
    assert cycles(graph) == []


def test_the_check_finds_a_circle():
    """The check itself can fail: a two-module circle is found."""
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]
