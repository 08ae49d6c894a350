"""Measure the package layout: lines per module and import circles.

Usage: python benchmarks/layout_measure.py [--top N]

Prints the N largest modules (by line count) and every import circle between
slimeforge modules. Both module-level and function-level imports count: a
lazy import inside a function still ties the two modules together, it only
hides the circle from Python's import machinery. The duplicated-lines measure
is the separate `duplicates --most 40` command run on the whole tree.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "slimeforge"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str) -> set[str]:
    """Every slimeforge module that `path` imports, at any depth in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    # Imports under `if TYPE_CHECKING:` name a type for annotations only; they never run, so they
    # tie no module to another at import or call time.
    type_only = {id(n) for node in ast.walk(tree) if isinstance(node,
                                                                ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
                 for stmt in node.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("slimeforge"))
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = f"{base}.{node.module}" if node.level and node.module else (
                base if node.level else node.module or "")
            if not target.startswith("slimeforge"):
                continue
            found.add(target)
            # `from . import x` / `from .pkg import mod` may name submodules.
            for alias in node.names:
                found.add(f"{target}.{alias.name}")
    return found


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in files.items():
        # Keep only names that are modules; a package's __init__ imported for
        # a submodule is not an edge of its own.
        targets = {t for t in imports_of(path, name) if t in files and t != name}
        edges[name] = {t for t in targets if not name.startswith(t + ".")}
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                result.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=3)
    args = parser.parse_args()
    sizes = sorted(
        ((len(p.read_text().splitlines()), module_name(p)) for p in PACKAGE.rglob("*.py")),
        reverse=True,
    )
    print(f"modules: {len(sizes)}, lines: {sum(n for n, _ in sizes)}")
    for lines, name in sizes[: args.top]:
        print(f"  {lines:5d}  {name}")
    found = circles(graph())
    print(f"import circles: {len(found)}")
    for component in found:
        print("  " + " <-> ".join(component))


if __name__ == "__main__":
    main()
