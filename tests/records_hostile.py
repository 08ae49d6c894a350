"""The hostile-records table: every record file of a run directory (and the head record of its
state directory) replaced in turn by garbage, non-UTF-8 bytes, a FIFO, a directory, a symlink to
/dev/zero and 10 MB; every `run.*` command run on it in-process, through the invoke tasks, with a
5 s watchdog. Each answer is recorded with what it acted on: signals sent (os.kill), commands run
that stop something (docker stop, scancel), Jobs API stop requests (POST), and files of the run
directory changed. Used by tests/unit/hostile/test_records_hostile.py (asserts) and
benchmarks/hostile_records.py (prints the table).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import yaml
from helpers import SEED_RECIPE
from invoke import Context, Exit

ROOT = Path(__file__).resolve().parents[1]

TOKEN = "0123456789abcdef0123456789abcdef"
BOOT = "0f0e0d0c-0b0a-4908-8706-050403020100"
WATCHDOG_S = 5.0


def _garbage(p: Path) -> None:
    p.write_bytes(b"--help; $(touch /tmp/sf-pwned)\n")


def _non_utf8(p: Path) -> None:
    p.write_bytes(b"\xff\xfe\x80 not utf-8 \xc3\x28\n")


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _directory(p: Path) -> None:
    p.mkdir()


def _dev_zero(p: Path) -> None:
    p.symlink_to("/dev/zero")


def _ten_mb(p: Path) -> None:
    p.write_bytes(b"7" * (10 << 20))


VARIANTS: dict[str, Callable[[Path], None]] = {"garbage": _garbage, "non-UTF-8": _non_utf8, "FIFO": _fifo,
                                               "directory": _directory,
                                               "symlink to /dev/zero": _dev_zero, "10 MB": _ten_mb}
RAY_RECORDS = ("plan.json", "run_token", "submission_id", "ray_address", "container.id", "state/head.json")
SLURM_RECORDS = ("plan.json", "run_token", "slurm_job_id", "slurm_submitted_at", "submission_id")


@dataclass
class Answer:
    code: int | None  # None: no answer within the watchdog
    text: str
    seconds: float
    acted: list[str]


def setup(root: Path, port: int) -> dict[str, Path]:
    """A recipe, its Ray run directory (records of a launch whose head is gone) and its Slurm run directory."""
    from slimeforge.run.recipecheck import parse_recipe
    from slimeforge.run.rundir import build_run_dir, write_run_dir
    from slimeforge.run.targets import slurm
    from slimeforge.run.targets.base import ResolvedRun

    data = {**SEED_RECIPE, "exp_id": "hostile-exp", "ray_port": port, "ray_dashboard_port": port + 1}
    recipe_path = root / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(data))
    recipe, stack = parse_recipe(data, "test")
    ray_dir, slurm_dir, state = root / "ray-run", root / "slurm-run", root / "state" / f"ray-{port}"
    write_run_dir(build_run_dir(recipe, stack, ray_dir, str(recipe_path), environ={}))
    (ray_dir / "run_token").write_text(TOKEN + "\n")
    (ray_dir / "submission_id").write_text("hostile-exp-20261125-080000-abcdef\n")
    (ray_dir / "ray_address").write_text(f"http://127.0.0.1:{port + 1}\n")  # a head that is gone: nobody listens
    # container.id: not in a host-mode run directory; its rows put one there (and take it away after).
    state.mkdir(parents=True)
    # A head record of this run whose pid is alive (this process) but whose start time is not: a recycled pid.
    (state / "head.json").write_text(json.dumps({"pid": os.getpid(), "start_time": 1, "boot_id": BOOT,
                                                 "exp_id": "hostile-exp", "run_token": TOKEN}))
    write_run_dir(slurm.SlurmTarget(slurm.Options()).plan(ResolvedRun(recipe, stack, slurm_dir.resolve(),
                                                                      str(recipe_path), {})).rundir)
    (slurm_dir / "run_token").write_text(TOKEN + "\n")
    (slurm_dir / "slurm_job_id").write_text("424242\n")
    (slurm_dir / "slurm_submitted_at").write_text("1795000000.000\n")
    return {"recipe": recipe_path, "ray": ray_dir, "slurm": slurm_dir, "state": state}


def commands(recipe: Path) -> dict[str, Callable[[Context, Path], object]]:
    if str(ROOT) not in sys.path:  # tasks.py lies at the repository's root, which pytest does not put on the path
        sys.path.insert(0, str(ROOT))
    import tasks

    return {
        "run.status": lambda c, d: tasks.run_status(c, str(d)),
        "run.logs": lambda c, d: tasks.run_logs(c, str(d)),
        "run.stop": lambda c, d: tasks.run_stop(c, str(d)),
        "run.stop --head": lambda c, d: tasks.run_stop(c, str(d), head=True),
        "run --dry-run --out": lambda c, d: tasks.run_start(c, str(recipe), dry_run=True, out=str(d)),
    }


def snapshot(d: Path) -> dict[str, str]:
    out = {}
    for p in sorted(d.rglob("*")):
        st = os.lstat(p)
        if p.is_symlink() or not p.is_file() or p.name == ".slimeforge.lock":
            out[str(p.relative_to(d))] = f"{st.st_mode:o}"
        else:
            out[str(p.relative_to(d))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@contextlib.contextmanager
def spies(acted: list[str]) -> Iterator[None]:
    """Record every act (never let one through): a signal, a stopping command, a stop request."""
    from slimeforge.proc import Runner

    real_run, real_open, real_kill = Runner.run, urllib.request.urlopen, os.kill

    def run(self, argv, **kw):
        if argv[:2] == ["docker", "stop"] or argv[:1] == ["scancel"]:
            acted.append(" ".join(map(str, argv)))
            raise AssertionError("acted")
        return real_run(self, argv, **kw)

    def urlopen(req, *a, **kw):
        if getattr(req, "method", None) == "POST":
            acted.append(f"POST {req.full_url}")
            raise AssertionError("acted")
        return real_open(req, *a, **kw)

    def kill(pid, sig):
        if sig != 0:
            acted.append(f"kill {pid} {sig}")
            raise AssertionError("acted")
        return real_kill(pid, sig)

    Runner.run, urllib.request.urlopen, os.kill = run, urlopen, kill
    try:
        yield
    finally:
        Runner.run, urllib.request.urlopen, os.kill = real_run, real_open, real_kill


def answer(command: Callable[[Context, Path], object], run_dir: Path) -> Answer:
    acted: list[str] = []
    result: dict[str, object] = {}
    out = io.StringIO()

    def call() -> None:
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                command(Context(), run_dir)
            result["code"] = 0
        except Exit as exc:
            result["code"], result["text"] = exc.code, str(exc.message or "")
        except BaseException as exc:  # noqa: BLE001 - a traceback is what this table must never show
            result["code"], result["text"] = -1, f"TRACEBACK {type(exc).__name__}: {exc}"

    t0 = time.monotonic()
    with spies(acted):
        th = threading.Thread(target=call, daemon=True)
        th.start()
        th.join(WATCHDOG_S)
    seconds = time.monotonic() - t0
    if th.is_alive():
        return Answer(None, "HUNG (no answer within 5 s)", seconds, acted)
    text = str(result.get("text") or out.getvalue()).strip()
    return Answer(int(result["code"]), text, seconds, acted)  # type: ignore[arg-type]


def reset(pristine: Path, live: Path) -> None:
    """The run and state directories as setup() made them (pristine holds regular files only)."""
    for sub in ("ray-run", "slurm-run", "state"):
        path = live / sub
        if path.exists():
            for p in sorted(path.rglob("*"), reverse=True):  # FIFOs and links are removed, never opened
                if p.is_dir() and not p.is_symlink():
                    p.rmdir()
                else:
                    p.unlink()
            path.rmdir()
        shutil.copytree(pristine / sub, path)


def table(root: Path, port: int) -> list[tuple[str, str, str, str, Answer]]:
    """Every (kind, record, variant, command) -> Answer; each on a fresh copy of the directories."""
    pristine, live = root / "pristine", root / "live"
    live.mkdir(parents=True)
    recipe = setup(live, port)["recipe"]
    for sub in ("ray-run", "slurm-run", "state"):
        shutil.copytree(live / sub, pristine / sub)
    rows = []
    # The commands run in this process and read the state directory from the environment: set for
    # the table only, restored after it (whatever happens), so no later test sees it.
    with mock.patch.dict(os.environ, {"SLIMEFORGE_STATE_DIR": str(live / "state")}):
        for kind, names in (("ray", RAY_RECORDS), ("slurm", SLURM_RECORDS)):
            run_dir = live / f"{kind}-run"
            for name in names:
                path = live / "state" / f"ray-{port}" / "head.json" if name == "state/head.json" else run_dir / name
                for variant in VARIANTS:
                    for cmd_name, cmd in commands(recipe).items():
                        reset(pristine, live)
                        path.unlink(missing_ok=True)
                        VARIANTS[variant](path)
                        before = snapshot(run_dir)
                        ans = answer(cmd, run_dir)
                        if snapshot(run_dir) != before:
                            ans.acted.append("the run directory changed")
                        rows.append((kind, name, variant, cmd_name, ans))
    return rows


OUTCOMES = ("stopped:", "ended:", "refused:", "none:", "failed:")


def summary(text: str, width: int = 160) -> str:
    """The answer's gist for the table: run.stop's outcome lines, else the line naming the problem."""
    lines = [line.strip(" -") for line in text.splitlines() if line.strip()]
    outcomes = [line for line in lines if line.startswith(OUTCOMES)]
    if outcomes:
        return " / ".join(line[:width // len(outcomes)] for line in outcomes)
    pick = next((line for line in lines if ": " in line and not line.endswith("problem(s):")),
                lines[0] if lines else "")
    return pick[:width]
