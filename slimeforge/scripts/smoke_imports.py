"""The smoke test's imports in one pass, and slime's flag catalog in the same pass.

Run with the TARGET interpreter (the venv under test), standard library only:

    python smoke_imports.py --results DIR [--jobs N] [--timeout S] [--preload M]... [--import M]...
        [--catalog-out FILE --slime DIR [--megatron DIR] [--slime-commit SHA] [--megatron-commit SHA]]
    python smoke_imports.py --warm [--preload M]... [--import M]... [--slime DIR [--megatron DIR]]

This interpreter imports the --preload modules once (torch: its C++ extensions need libc10 loaded
first), then imports each --import module in a child forked from it, at most --jobs at once: each
child starts in the state a fresh `python -c "import torch; import M"` reaches before `import M`
(only the preload imported, nothing else of the pass), so a module is proved importable on its own,
without N interpreters each importing torch again (about 3 s of CPU each on a 2-core host). A child
not done after --timeout seconds (default 900) is killed and its import failed.

--catalog-out: one more child makes slime's flag catalog (flag_catalog.py, beside this file, the
catalog exactly as `flag_catalog.py --out FILE` writes it) and writes it to FILE, replaced whole.
Its entry point's module (slime.utils.arguments) is one of the smoke imports: when the catalog's
import of it was the same import (slime's and Megatron's packages found where this venv finds them
without the checkouts put first on the path, and no parser run while importing), that import is
the module's smoke import too; otherwise the module gets a child of its own. So slime, SGLang and
Megatron are imported once for both, not once by finalize and again by the smoke test.

--warm (install.sh, in the background from the patches step on): compiles the bytecode of what
the pass will import, without importing it: from the --preload, the catalog's entry module and the
--import modules, each module's source is compiled and its `.pyc` written through the loader an
import uses (importlib's SourceFileLoader.get_code), and the modules its code imports at module
level (outside `if TYPE_CHECKING:`; the entry module's functions too: the catalog calls one) are
followed. Only files of the venv's site-packages and the checkouts (--slime, --megatron) are
compiled; nothing is executed, no module is imported, and SIGTERM stops it between two files.
Why the proof still holds: bytecode is a cache that every import checks against its source (the
source's mtime and size are in the `.pyc`; one that does not match is compiled again), written by
the same loader from the same file, so a child imports the same code whether it compiles it or
finds it compiled; and the warmer runs in a process of its own, so no child's starting state (its
modules, sys.path, environment) changes. The files it compiles are not changed after it starts
(install.sh starts it after the last step that changes installed files: the patches). On cu13, 2
cores: the pass's catalog child 25.8 s with nothing compiled, 9.7 s with everything compiled.

Results in DIR (made empty by the caller): `<i>.rc` ("0" or "1") and `<i>.out` (what the import
printed) for the i-th --import (from 0, in the order given); `catalog.rc` and `catalog.out` for the
catalog; `seconds`: one line, the preload's and each child's wall-clock seconds. Exit status: 0
when the pass ran (the results say what passed), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import dis
import importlib
import importlib.machinery
import importlib.util
import os
import re
import signal
import sys
import sysconfig
import time
import traceback
import warnings

# A dotted module name as the smoke test's stack lists it (and nothing that could be code).
MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}(?:\.[A-Za-z_][A-Za-z0-9_]{0,99}){0,15}")
MAX_IMPORTS, MAX_JOBS = 256, 64
ENTRY = "slime.utils.arguments:parse_args"


def module_name(text: str) -> str:
    if not MODULE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text[:120]!r} is not a module name (dotted Python identifiers)")
    return text


def jobs(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,2}", text) or not 1 <= int(text) <= MAX_JOBS:
        raise argparse.ArgumentTypeError(f"{text[:20]!r} is not a number of jobs from 1 to {MAX_JOBS}")
    return int(text)


def seconds(text: str) -> float:
    """--timeout: digits with an optional fraction, more than 0 and at most a day (float() alone
    takes nan, inf and other digits)."""
    value = float(text) if re.fullmatch(r"[0-9]{1,6}(?:\.[0-9]{1,3})?", text) else 0.0
    if not 0 < value <= 86_400:
        raise argparse.ArgumentTypeError(f"{text[:20]!r} is not a timeout: seconds, more than 0 and at most 86400")
    return value


def _where_on(name: str, path: list[str]) -> tuple[str | None, tuple[str, ...]] | None:
    """Where this Python's finders find top-level module `name` with `path` for sys.path, whether or
    not it is imported already (sys.modules is not asked)."""
    saved = sys.path[:]
    sys.path[:] = path
    try:
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            try:
                spec = find(name, None)
            except Exception:  # noqa: BLE001 - a finder that cannot say has not found it
                continue
            if spec is not None:
                return _spec_place(spec)
        return None
    finally:
        sys.path[:] = saved


def _spec_place(spec) -> tuple[str | None, tuple[str, ...]]:
    dirs: list[str] = []
    for d in spec.submodule_search_locations or ():
        real = os.path.realpath(d)
        if real not in dirs:
            dirs.append(real)
    return (os.path.realpath(spec.origin) if spec.origin and os.path.isabs(spec.origin) else spec.origin), tuple(dirs)


def _write(path: str, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _to_file(path: str) -> None:
    """This child's stdout and stderr (the descriptors: what C code prints too) into `path`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _exit(code: int) -> None:
    """Leave the child at once: no interpreter shutdown (a module's non-daemon thread cannot hang
    the pass; atexit handlers of an import test have nothing to do)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream has nothing left to say
            pass
    os._exit(code)


def import_child(module: str, out: str, rc: str) -> None:
    _to_file(out)
    sys.argv = ["-c"]  # what a module reading its argv at import sees under `python -c "import M"`
    code = 1
    try:
        importlib.import_module(module)
        code = 0
    except BaseException:  # noqa: BLE001 - any failure of the import is the result (SystemExit too)
        traceback.print_exc()
    _write(rc, f"{code}\n")
    _exit(code)


def _under(place: tuple[str | None, tuple[str, ...]], roots: list[str]) -> bool:
    paths = [p for p in (place[0], *place[1]) if p and os.path.isabs(p)]
    return any(p == r or p.startswith(r + os.sep) for p in paths for r in roots)


def same_import(trace: dict, venv_path: list[str], checkouts: list[str]) -> bool:
    """Whether the catalog's import of its entry module (the checkouts first on the path, as slime's
    launch runs) imported the code a plain `import` in this venv imports: it got that far, no parser
    parsed while importing, and every top-level module it loaded from a checkout is where this venv
    finds it without the checkouts put first (an editable install of that checkout)."""
    if not trace.get("imported") or trace.get("parsed_while_importing") != 0:
        return False
    roots = [os.path.realpath(c) for c in checkouts]
    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        if "." in name or spec is None:
            continue
        place = _spec_place(spec)
        if _under(place, roots) and _where_on(name, venv_path) != place:
            return False
    return True


def catalog_child(opts: argparse.Namespace, results: str) -> None:
    """The flag catalog (flag_catalog.catalog_of, as `flag_catalog.py` makes it), and whether its
    import of the entry's module is the smoke import of that module (catalog.same: "1")."""
    _to_file(os.path.join(results, "catalog.out"))

    import flag_catalog  # beside this script; imported before sys.path lost this script's directory

    # As flag_catalog.py runs from sf_flag_catalog: no GPU is asked for (the child's own environment,
    # read when CUDA starts, which torch's import does not do).
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    venv_path = sys.path[:]
    trace: dict = {}
    code = 1
    try:
        flag_catalog.write_catalog(opts.catalog_out, opts.slime, opts.megatron, ENTRY, opts.slime_commit,
                                   opts.megatron_commit, trace=trace)
        code = 0
    except SystemExit as exc:  # the catalog's own one-line error
        print(exc, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - reported, and the catalog is not written
        traceback.print_exc()
    same = same_import(trace, venv_path, [c for c in (opts.slime, opts.megatron) if c])
    _write(os.path.join(results, "catalog.same"), "1\n" if same else "0\n")
    _write(os.path.join(results, "catalog.rc"), f"{code}\n")
    _exit(code)



# --- --warm: the pass's bytecode compiled ahead of it ---------------------------------------------

_FUNCTION = 0x1 | 0x2  # CO_OPTIMIZED | CO_NEWLOCALS: a function's code (a class body's has neither)
_CODE = type(compile("", "", "exec"))


def _locate(name: str, found: dict, path: list[str]) -> tuple[str | None, list[str] | None] | None:
    """(its source file or None, its search directories or None) for module `name`, found as the
    path finder finds it (a package's __init__, an extension, a .py, else a namespace's directories),
    without running anything (importlib.util.find_spec imports the parents); None: not found."""
    if name in found:
        return found[name]
    found[name] = None
    parent, _, last = name.rpartition(".")
    if parent:
        above = _locate(parent, found, path)
        if above is None or not above[1]:
            return None
        dirs = above[1]
    else:
        dirs = path
    portions: list[str] = []
    result: tuple[str | None, list[str] | None] | None = None
    for d in dirs:
        base = os.path.join(d, last)
        if os.path.isfile(os.path.join(base, "__init__.py")):
            result = (os.path.join(base, "__init__.py"), [base])
        elif any(os.path.isfile(os.path.join(base, "__init__" + x)) for x in importlib.machinery.EXTENSION_SUFFIXES):
            result = (None, [base])
        elif any(os.path.isfile(base + x) for x in importlib.machinery.EXTENSION_SUFFIXES):
            result = (None, None)
        elif os.path.isfile(base + ".py"):
            result = (base + ".py", None)
        elif os.path.isdir(base):
            portions.append(base)
        if result is not None:
            break
    if result is None and portions:
        result = (None, portions)
    found[name] = result
    return result


def _imports_in(code, functions: bool) -> list[tuple[str, int, tuple | None]]:
    """(name, level, fromlist) of each import the code runs at module level (class bodies too; the
    functions' with `functions`), those under `if TYPE_CHECKING:` left out."""
    out = []
    todo = [code]
    while todo:
        c = todo.pop()
        skip_to, prev, prev2 = -1, None, None
        for ins in dis.get_instructions(c) if "TYPE_CHECKING" in c.co_names else ():
            if ins.offset < skip_to:
                continue
            if (ins.opname.startswith("POP_JUMP") and "FALSE" in ins.opname and prev is not None
                    and prev.argval == "TYPE_CHECKING" and isinstance(ins.argval, int)):
                skip_to = ins.argval
            elif ins.opname == "IMPORT_NAME" and prev is not None and prev2 is not None:
                out.append((ins.argval, prev2.argval if isinstance(prev2.argval, int) else 0,
                            prev.argval if isinstance(prev.argval, tuple) else None))
            prev2, prev = prev, ins
        if "TYPE_CHECKING" not in c.co_names:
            # Most code objects: modulefinder's reader, over raw opcodes. The walk above builds an
            # Instruction per opcode; used for every code object it made the warm-up 37.6 s where
            # this takes 27-31 s on cu13 (and the store-hit install 66.6 s against 54.5 s).
            out += list(dis._find_imports(c))  # type: ignore[attr-defined]
        todo += [k for k in c.co_consts if isinstance(k, _CODE) and (functions or not k.co_flags & _FUNCTION)]
    return out


_STOP: list[bool] = []


def warm(roots: list[str], first: list[str], with_functions: set[str]) -> int:
    """Compile (and write the .pyc of) each module reached from `roots` that lies in this venv's
    site-packages or a `first` directory (put first on the path, as the catalog does), depth first
    in the order the roots are given. Returns how many it compiled or found compiled."""
    signal.signal(signal.SIGTERM, lambda *_: _STOP.append(True))
    sys.dont_write_bytecode = False
    warnings.simplefilter("ignore")  # a SyntaxWarning is the import's to print, when it compiles
    paths = sysconfig.get_paths()
    under = [os.path.realpath(d) + os.sep for d in {paths["purelib"], paths["platlib"], *first}]
    path = [os.path.abspath(d or ".") for d in [*first, *sys.path]]
    found: dict = {}
    done: set[str] = set()
    todo = list(reversed(roots))
    n = 0
    while todo and not _STOP:
        name = todo.pop()
        if name in done:
            continue
        done.add(name)
        where = _locate(name, found, path)
        if where is None:
            continue
        source, search = where
        parts = name.split(".")
        nxt = [".".join(parts[:i]) for i in range(1, len(parts))]  # its packages run first
        if source and os.path.realpath(source).startswith(tuple(under)):
            try:
                code = importlib.machinery.SourceFileLoader(name, source).get_code(name)
            except Exception:  # noqa: BLE001 - the import will say what is wrong with it
                code = None
            if code is not None:
                n += 1
                package = name if search else name.rpartition(".")[0]
                for iname, level, fromlist in _imports_in(code, name in with_functions):
                    try:
                        full = importlib.util.resolve_name("." * level + iname, package) if level else iname
                    except (ImportError, ValueError):
                        continue
                    if full:
                        ps = full.split(".")
                        nxt += [".".join(ps[:i]) for i in range(1, len(ps) + 1)]
                        nxt += [f"{full}.{f}" for f in fromlist or () if f != "*"]
        todo += [m for m in reversed(nxt) if m not in done]
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", help="an empty directory for the results")
    ap.add_argument("--warm", action="store_true", help="compile the pass's bytecode, import nothing")
    ap.add_argument("--jobs", type=jobs, default=1)
    ap.add_argument("--preload", type=module_name, action="append", default=[])
    ap.add_argument("--import", dest="imports", type=module_name, action="append", default=[])
    ap.add_argument("--timeout", type=seconds, default=900.0, help="seconds one import may take (default 900)")
    ap.add_argument("--catalog-out")
    ap.add_argument("--slime")
    ap.add_argument("--megatron")
    ap.add_argument("--slime-commit")
    ap.add_argument("--megatron-commit")
    opts = ap.parse_args(argv)
    if len(opts.imports) > MAX_IMPORTS:
        ap.error(f"at most {MAX_IMPORTS} --import")
    if opts.catalog_out and not opts.slime:
        ap.error("--catalog-out needs --slime (the slime checkout)")
    if opts.warm:
        entry = [ENTRY.partition(":")[0]] if opts.slime else []
        first = [d for d in (opts.slime, opts.megatron) if d]
        t0 = time.monotonic()
        n = warm([*opts.preload, *entry, *opts.imports], first, set(entry))
        print(f"slimeforge: bytecode warm-up: {n} modules compiled or found compiled in {time.monotonic() - t0:.1f}s"
              f"{' (stopped)' if _STOP else ''}", file=sys.stderr)
        return 0
    if not opts.results:
        ap.error("--results is required (or --warm)")
    results = opts.results
    if not os.path.isdir(results):
        ap.error(f"--results {results[:200]!r} is not a directory")
    if opts.catalog_out:
        import flag_catalog  # noqa: F401 - loaded before the path loses this script's directory
    # Imports come from the venv alone: not from this script's directory (sys.path[0]) nor the
    # working directory.
    here = os.path.dirname(os.path.realpath(__file__))
    sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != here]

    preload_error = ""
    t0 = time.monotonic()
    for m in opts.preload:
        try:
            importlib.import_module(m)
        except BaseException:  # noqa: BLE001 - every import after it fails with this
            preload_error = f"the preload `import {m}` failed:\n{traceback.format_exc()}"
            break

    preload_s = time.monotonic() - t0
    entry_module = ENTRY.partition(":")[0]
    todo: list[tuple[str, int]] = []  # ("catalog", -1) or ("import", i), in the order they start
    if opts.catalog_out:
        todo.append(("catalog", -1))
    todo += [("import", i) for i in range(len(opts.imports))]
    if preload_error:
        for i in range(len(opts.imports)):
            _write(os.path.join(results, f"{i}.out"), preload_error)
            _write(os.path.join(results, f"{i}.rc"), "1\n")
        if opts.catalog_out:
            _write(os.path.join(results, "catalog.out"), preload_error)
            _write(os.path.join(results, "catalog.rc"), "1\n")
        return 0

    # The entry's module waits for the catalog: its import is that module's when the catalog says so.
    waiting = [i for i, m in enumerate(opts.imports) if m == entry_module] if opts.catalog_out else []
    todo = [t for t in todo if not (t[0] == "import" and t[1] in waiting)]
    running: dict[int, tuple[str, int]] = {}
    began: dict[tuple[str, int], float] = {}
    killed: set[tuple[str, int]] = set()
    took: list[str] = []
    sys.stdout.flush()
    sys.stderr.flush()
    while todo or running:
        while todo and len(running) < opts.jobs:
            kind, i = todo.pop(0)
            pid = os.fork()
            if pid == 0:
                if kind == "catalog":
                    catalog_child(opts, results)
                m = opts.imports[i]
                import_child(m, os.path.join(results, f"{i}.out"), os.path.join(results, f"{i}.rc"))
            running[pid] = (kind, i)
            began[(kind, i)] = time.monotonic()
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:  # none ended: one past its time is killed (a hang never holds the smoke test)
            now = time.monotonic()
            for child, (kind, i) in running.items():
                if now - began[(kind, i)] > opts.timeout and (kind, i) not in killed:
                    killed.add((kind, i))
                    with open(os.path.join(results, "catalog.out" if kind == "catalog" else f"{i}.out"), "a") as fh:
                        fh.write(f"\nnot done after {opts.timeout:g} s: killed\n")
                    os.kill(child, signal.SIGKILL)
            time.sleep(0.05)
            continue
        if pid not in running:  # a process a preload module started, not one of the pass
            continue
        kind, i = running.pop(pid)
        took.append(f"{'catalog' if kind == 'catalog' else opts.imports[i]} {time.monotonic() - began[(kind, i)]:.1f}")
        code = os.waitstatus_to_exitcode(status)
        rc_file = os.path.join(results, "catalog.rc" if kind == "catalog" else f"{i}.rc")
        if not os.path.exists(rc_file):  # killed by a signal, or died before it could say
            with open(os.path.join(results, "catalog.out" if kind == "catalog" else f"{i}.out"), "a") as fh:
                fh.write(f"\nthe process ended with status {code} (a signal when negative)\n")
            _write(rc_file, "1\n")
        if kind == "catalog":
            same = _read(os.path.join(results, "catalog.same")) == "1" and _read(rc_file) == "0"
            for j in waiting:
                if same:
                    _write(os.path.join(results, f"{j}.out"), "imported by the flag catalog's child\n")
                    _write(os.path.join(results, f"{j}.rc"), "0\n")
                else:
                    todo.insert(0, ("import", j))
            waiting = []
    # Each child's wall-clock seconds, in the order they ended (where a pass's time goes).
    _write(os.path.join(results, "seconds"), f"preload {preload_s:.1f}, " + ", ".join(took) + "\n")
    return 0


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read(16).strip()
    except OSError:
        return ""


if __name__ == "__main__":
    sys.exit(main())
