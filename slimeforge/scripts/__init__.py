"""Programs that run on targets (hosts, allocations, images) with their standard library only.

`program(name, *helpers)` makes one of them a single self-contained program, for `python3 -` on
stdin over ssh, one file copied into a run directory, or a heredoc of launch.sh: each helper
module's source (and each module it needs, NEEDS) is registered under its own name before the
program runs, so the program's `import helper` finds it there.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
# The scripts each script imports (by name, registered first): a program carries them all.
NEEDS: dict[str, tuple[str, ...]] = {"hostrecord": ("procproof",), "headrecord": ("procproof",),
                                     "raynodes": ("procproof",),
                                     "pathcheck": ("procproof",), "awscheck": ("hostrecord",),
                                     "node_agent": ("hostrecord", "raynodes", "pathcheck", "awscheck"),
                                     "slurm_agent": ("node_agent", "raynodes")}


def _with_needs(names: tuple[str, ...]) -> list[str]:
    """`names` and what each needs, every module after the ones it imports, each once."""
    order: list[str] = []
    for name in names:
        for need in _with_needs(NEEDS.get(name, ())) + [name]:
            if need not in order:
                order.append(need)
    return order


def program(name: str, *helpers: str) -> str:
    sources = {h: (HERE / f"{h}.py").read_text() for h in _with_needs((*helpers, name)) if h != name}
    main = (HERE / f"{name}.py").read_text()
    # Each source compiled on its own (each keeps its `from __future__` line and its file name in tracebacks).
    return "\n".join([
        "import sys, types",
        f"for _name, _src in {sources!r}.items():",
        "    _mod = sys.modules[_name] = types.ModuleType(_name)",
        "    exec(compile(_src, _name + '.py', 'exec'), _mod.__dict__)",
        f"exec(compile({main!r}, {name + '.py'!r}, 'exec'), {{'__name__': '__main__'}})",
        "",
    ])


def node_agent_program() -> str:
    """The node agent with the modules it imports (hostrecord, raynodes, pathcheck, awscheck and what
    they need: NEEDS), as one program."""
    return program("node_agent", "hostrecord")


def headrecord_program() -> str:
    """launch.sh's head record and its proof (headrecord.py with procproof.py), as one program."""
    return program("headrecord")
