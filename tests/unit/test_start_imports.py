"""What a command loads before it does anything (issue 42: `--help` at most 0.3 CPU-seconds, a dry
run at most 0.6; benchmarks/start_bench.py measures them). Timing is the benchmark's; this holds
the cause: the modules each start imports, in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Imported by a task that needs them, never at start: each costs tens of milliseconds or more.
HEAVY = {"ray", "docker", "boto3", "botocore", "requests", "urllib3", "rich", "packaging", "zstandard", "uv"}
# A recipe needs these, `--help` does not.
RECIPE_ONLY = {"pydantic", "pydantic_core", "jinja2"}


def modules_after(code: str, cwd: Path) -> set[str]:
    """The top-level packages loaded once `code` ran (a SystemExit from invoke's Program included)."""
    probe = ("import atexit, json, sys\n"
             "atexit.register(lambda: sys.__stderr__.write('MODULES ' + json.dumps(sorted({m.split('.')[0] for m in "
             "sys.modules})) + '\\n'))\n"
             + code)
    res = subprocess.run([sys.executable, "-c", probe], cwd=cwd, capture_output=True, text=True, timeout=120)
    line = next(x for x in res.stderr.splitlines() if x.startswith("MODULES "))
    return set(json.loads(line.removeprefix("MODULES ")))


def test_help_and_list_load_no_library_a_task_needs():
    for argv in (["slimeforge", "--help"], ["slimeforge", "--list"], ["slimeforge", "run", "--help"]):
        loaded = modules_after(f"sys.argv = {argv!r}\nfrom slimeforge.cli import main\nmain()", ROOT)
        assert "invoke" in loaded and not loaded & (HEAVY | RECIPE_ONLY), (argv, sorted(loaded & (HEAVY | RECIPE_ONLY)))
    # The checkout's tasks/ is the same module: `invoke --list` loads no more.
    loaded = modules_after("import tasks", ROOT)
    assert not loaded & (HEAVY | RECIPE_ONLY), sorted(loaded & (HEAVY | RECIPE_ONLY))


def test_a_dry_run_loads_what_a_recipe_needs_and_no_more(tmp_path):
    out = tmp_path / "run"
    argv = ["slimeforge", "run", str(ROOT / "recipes" / "gsm8k.yaml"), "--dry-run", "--out", str(out)]
    loaded = modules_after(f"sys.argv = {argv!r}\nfrom slimeforge.cli import main\nmain()", tmp_path)
    assert (out / "launch.sh").is_file()  # it did run
    assert RECIPE_ONLY <= loaded and not loaded & HEAVY, sorted(loaded & HEAVY)
