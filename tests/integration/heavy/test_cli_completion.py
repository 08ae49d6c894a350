"""Shell completion completes task names and options (docs/cli.md), through the script invoke prints,
in real bash (moved from tests/unit/test_cli_flags.py: each completion starts invoke and bash)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def completions(words: str) -> list[str]:
    """What bash completes for `words` (ending in the word being completed), through the script
    `invoke --print-completion-script bash` prints, with this interpreter's invoke first on PATH."""
    script = cli("--print-completion-script", "bash")
    assert script.returncode == 0 and "complete -F _complete_invoke" in script.stdout
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    program = (f'{script.stdout}\nCOMP_WORDS=({words}); _complete_invoke invoke "${{COMP_WORDS[-1]}}" invoke\n'
               'printf "%s\\n" "${COMPREPLY[@]}"\n')
    out = subprocess.run(["bash", "-c", program], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_bash_completion_completes_task_names_and_options():
    assert set(completions("invoke run.s")) == {"run.start", "run.status", "run.stop"}
    assert "--router-sha256" in completions("invoke lock --r")
    assert "--complete" in completions("invoke lock --c")
    # A task awaiting its argument completes its options too (its usage error is a ParseError, as invoke's are).
    assert "--dry-run" in completions("invoke run --d")
    assert set(completions("invoke run.status --")) == {"--json", "--run", "--cluster", "--address", "--ssh-config"}
