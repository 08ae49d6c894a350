"""Every command-line option slime accepts, read from slime's own parsers (not from --help).

Run with the TARGET interpreter (the venv that imports slime), standard library only, no GPU:

    python flag_catalog.py --slime DIR [--megatron DIR] --out FILE [--slime-commit SHA] [--megatron-commit SHA]

slime parses argv with several argparse parsers (at a74ae3a0: a pre-parse, SGLang + router with
add_help=False, Megatron + slime, the only one that answers --help), each with parse_known_args,
so `train.py --help` shows only the last. This script calls slime's own argument entry point
(`slime.utils.arguments:parse_args`, the one train.py calls) with no arguments, and records every
parser that parses, in order, with the function that built it and each of its options. Parsing
itself is replaced by "return the defaults": no argv is read, no required option can stop it.

After the parser that answers --help has been recorded, slime's own checks of the (default) values
may raise; that ends the run and is recorded as `stopped_by`. An ImportError at any point, or any
error before that parser, is a failure (exit 1, one line on stderr): the catalog would be partial.
Writes one JSON document (the catalog, format version 2) to --out, replaced whole (never half
written); whatever slime prints goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import sys
import types

FORMAT, VERSION = "slimeforge.flag-catalog", 2


def _built_by() -> str:
    """module.function of the first caller outside argparse (the code that built the parser)."""
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename == argparse.__file__:
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_name}"


def catalog(entry: str, trace: dict | None = None) -> dict:
    """`trace`, when given, learns `imported` (the entry's module imported) and
    `parsed_while_importing` (parsers that parsed during that import: smoke_imports.py takes the
    import for the module's smoke import only when none did)."""
    parsers: list[dict] = []
    seen: list[argparse.ArgumentParser] = []  # kept alive: a freed parser's id() can be reused

    def parse_known_args(self, args=None, namespace=None):
        if not any(p is self for p in seen):
            seen.append(self)
            options = sorted({s for a in self._actions for s in a.option_strings})
            parsers.append({"built_by": _built_by(), "add_help": bool(self.add_help), "options": options})
        ns = namespace if namespace is not None else argparse.Namespace()
        for action in self._actions:
            if action.dest is not argparse.SUPPRESS and not hasattr(ns, action.dest):
                setattr(ns, action.dest, action.default)
        for key, value in self._defaults.items():
            if not hasattr(ns, key):
                setattr(ns, key, value)
        return ns, []

    module_name, _, func_name = entry.partition(":")
    stopped_by = None
    original = argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_known_args = parse_known_args  # type: ignore[method-assign]
    try:
        module = importlib.import_module(module_name)
        if trace is not None:
            trace.update(imported=True, parsed_while_importing=len(parsers))
        getattr(module, func_name)()
    except ImportError as exc:
        raise SystemExit(f"slimeforge: ERROR: flag catalog: {entry} needs a module this Python lacks: {exc}") from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any stop is judged below
        if not any(p["add_help"] for p in parsers):
            raise SystemExit(f"slimeforge: ERROR: flag catalog: {entry} stopped before its main parser "
                             f"(parsers so far: {[p['built_by'] for p in parsers]}): {type(exc).__name__}: "
                             f"{exc}") from None
        stopped_by = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]
    if not any(p["add_help"] for p in parsers):
        raise SystemExit(f"slimeforge: ERROR: flag catalog: {entry} returned without a parser that answers --help "
                         f"(parsers: {[p['built_by'] for p in parsers]})")
    flags = sorted({o for p in parsers for o in p["options"] if o.startswith("--")})
    return {"format": FORMAT, "version": VERSION, "entry": entry, "python": platform.python_version(),
            "parsers": parsers, "stopped_by": stopped_by, "flags": flags}


def catalog_of(slime: str, megatron: str | None, entry: str = "slime.utils.arguments:parse_args",
               trace: dict | None = None) -> dict:
    """The catalog of the slime checkout at `slime` (Megatron's from `megatron`, else from wherever
    this Python finds it). Raises SystemExit with one line when it cannot be made whole."""
    # Checkouts first on the path, as slime's launch does (PYTHONPATH=<Megatron-LM>); argv is only
    # what train.py would see with no arguments, so no option is set.
    sys.path[:0] = [d for d in (slime, megatron) if d]
    sys.argv = [os.path.join(slime, "train.py")]
    with contextlib.redirect_stdout(sys.stderr):
        return catalog(entry, trace)


def write_catalog(out: str, slime: str, megatron: str | None, entry: str, slime_commit: str | None,
                  megatron_commit: str | None, trace: dict | None = None) -> None:
    """The catalog with its commits, written whole or not at all (a temp file beside `out`, renamed);
    SystemExit with one line, as catalog_of, when it cannot be made."""
    doc = catalog_of(slime, megatron, entry, trace=trace)
    doc["slime_commit"] = slime_commit
    doc["megatron_commit"] = megatron_commit
    tmp = f"{out}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slime", required=True, help="slime checkout (holds the slime package)")
    ap.add_argument("--megatron", help="Megatron-LM checkout (holds megatron.training)")
    ap.add_argument("--slime-commit", default=None)
    ap.add_argument("--megatron-commit", default=None)
    ap.add_argument("--entry", default="slime.utils.arguments:parse_args")
    ap.add_argument("--out", required=True, help="the catalog file to write")
    opts = ap.parse_args(argv)
    write_catalog(opts.out, opts.slime, opts.megatron, opts.entry, opts.slime_commit, opts.megatron_commit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
