"""The output convention (slimeforge/console.py, docs/output.md) as a user meets it: commands a
person can paste, quiet ends on a closed pipe, colour only on a terminal, and a build's progress."""

import json
import os
import pty
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from slimeforge import console, readback
from slimeforge.image.builder import buildprogress
from slimeforge.image.builder.buildkit import stream_build
from slimeforge.proc import Runner

ROOT = Path(__file__).resolve().parents[2]
AWKWARD = ["--label", "title=slimeforge cu13", "--build-arg", "A=it's $HOME `x`", "-f", "/tmp/a b/Dockerfile",
           "--no-cache", "--x=y z", "/ctx dir"]


def test_shell_lines_run_exactly_the_argv(tmp_path):
    """What is printed, pasted into bash, runs the same words: one option a line, each word quoted."""
    text = console.shell_lines([sys.executable, "-c", "import json, sys; print(json.dumps(sys.argv[1:]))", *AWKWARD],
                               {"DOCKER_BUILDKIT": "1"}, trailing=1)
    lines = text.splitlines()
    assert all(line.endswith(" \\") for line in lines[:-1]) and lines[-1] == "    '/ctx dir'"
    assert "    --label 'title=slimeforge cu13' \\" in lines and "    --no-cache \\" in lines
    res = subprocess.run(["bash", "-c", text], capture_output=True, text=True, check=True)
    assert json.loads(res.stdout) == AWKWARD


@pytest.mark.parametrize("task", [["stack.show"], ["stack.show", "--json"], ["wheels.ls", "--json"],
                                  ["run", "recipes/gsm8k.yaml", "--dry-run"]])
def test_a_closed_pipe_ends_quietly_with_141(task, tmp_path):
    """`invoke X | head`: no traceback, whichever task; the status a SIGPIPE'd writer has. The
    reader here (`true`) is gone before the task writes its first byte (Python starts slower), so
    the pipe is closed whatever the output's size (a small one would fit in the pipe's buffer)."""
    extra = ["--out", str(tmp_path / "run")] if task[0] == "run" else []
    command = shlex.join([sys.executable, "-m", "invoke", *task, *extra])
    text = f"{command} 2>{shlex.quote(str(tmp_path / 'err'))} | true; echo \"${{PIPESTATUS[0]}}\""
    res = subprocess.run(["bash", "-c", text], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "SLIMEFORGE_COMPILED_STORE": str(tmp_path / "store")})
    assert res.stdout == f"{console.CLOSED_PIPE_EXIT}\n"
    assert (tmp_path / "err").read_text() == ""  # not a word: no traceback, no "Exception ignored"


def _on_a_terminal(code: str, env: dict[str, str]) -> str:
    """What `code` prints with stdout a pseudo-terminal (as a person's shell has it)."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(sys.executable, [sys.executable, "-c", code], {**os.environ, **env, "COLUMNS": "100"})
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.waitpid(pid, 0)
    return out.decode()


TABLE = "from slimeforge.console import table; table('t', ['host', 'error'], [['a', 'x' * 150]])"


@pytest.mark.parametrize("no_color", ["", "1"])
def test_colour_only_on_a_terminal_and_never_with_no_color(no_color):
    env = {"NO_COLOR": no_color, "TERM": "xterm-256color"}
    on_tty = _on_a_terminal(TABLE, env)
    assert ("\x1b[" in on_tty) is (not no_color), on_tty  # rich's bold header: colour allowed unless NO_COLOR
    piped = subprocess.run([sys.executable, "-c", TABLE], capture_output=True, text=True, check=True,
                           env={**os.environ, **env, "COLUMNS": "100"}).stdout
    # off a terminal: plain, and the cell whole, not cut at 80 or 100
    assert "\x1b[" not in piped and "x" * 150 in piped
    visible = re.sub(r"\x1b\[[0-9;]*m", "", on_tty)
    assert max(len(line) for line in visible.splitlines()) <= 100  # on one: the terminal's width


BUILDKIT = r"""
echo '#1 [internal] load build definition from Dockerfile'
echo '#1 DONE 0.0s'
echo '#2 [1/3] FROM docker.io/library/debian@sha256:abc'
echo '#2 CACHED'
echo '#3 [2/3] RUN /opt/slimeforge/sf apex'
echo '#3 0.101 compiling apex'
sleep {sleep}
echo '#3 DONE {sleep}.0s'
echo '#4 [3/3] RUN /opt/slimeforge/sf finalize'
echo '#4 0.050 slimeforge: ERROR: finalize: no venv'
echo '#4 ERROR: process "/bin/sh -c /opt/slimeforge/sf finalize" did not complete successfully: exit code: 2'
exit 1
"""


def test_build_progress_steps_estimates_heartbeat_and_times(tmp_path):
    """BuildKit's plain progress (a real process printing it) -> "step N/M name" lines, a heartbeat
    while a step runs, its time at the end; raw lines only in the log; times kept for the next build."""
    script = tmp_path / "buildkit.sh"
    script.write_text(BUILDKIT.format(sleep=2))
    said: list[str] = []
    rc, lines = stream_build(Runner(), ["bash", str(script)], {}, tmp_path / "build.log", said.append,
                             estimates={"apex": 420.0}, heartbeat_s=0.5)
    assert rc == 1 and (tmp_path / "build.log").read_text().splitlines() == lines
    progress = [s.split("] ", 1)[1] for s in said if s.startswith("[") and "still running" not in s]
    assert progress == [
        "step 1/3 FROM docker.io/library/debian@sha256:abc: cached",  # a cached step is one line
        "step 2/3 apex: running (last run 7m 00s)",
        "step 2/3 apex: done in 2s",
        "step 3/3 finalize: running",
        f"step 3/3 finalize: FAILED after <1s (log: {tmp_path / 'build.log'})",
    ]
    beats = [s for s in said if "still running" in s]
    assert beats and all("step 2/3 apex: still running" in b and "of ~7m 00s" in b and str(tmp_path / "build.log") in b
                         for b in beats)
    assert "  #4 0.050 slimeforge: ERROR: finalize: no venv" in said  # the step library's error reaches the screen
    assert not any(line.startswith("#3 0.101") for line in said)  # raw output only in the log (and with --verbose)
    # The measured time is the next build's estimate; a damaged record gives none, never a wrong one.
    assert buildprogress.read_times(tmp_path / buildprogress.TIMES) == {"apex": 2.0}
    assert buildprogress.past_times(tmp_path / "nowhere", "cu13", tmp_path) == {"apex": 2.0}
    (tmp_path / buildprogress.TIMES).write_text('{"schema": "slimeforge.step-times/1", "steps": {"apex": "soon"}}')
    with pytest.raises(readback.RecordError, match="seconds 'soon' is not a number"):
        buildprogress.read_times(tmp_path / buildprogress.TIMES)
    assert buildprogress.past_times(tmp_path / "nowhere", "cu13", tmp_path) == {}


def test_verbose_shows_every_raw_line(tmp_path):
    script = tmp_path / "buildkit.sh"
    script.write_text(BUILDKIT.format(sleep=0))
    said: list[str] = []
    _, lines = stream_build(Runner(), ["bash", str(script)], {}, tmp_path / "build.log", said.append, verbose=True)
    # each raw line once, in order, beside the progress lines
    assert [s for s in said if not s.startswith("[")] == lines


def test_durations_read_as_a_person_reads_them():
    assert [buildprogress.took(s) for s in (0, 42.9, 60, 425, 3600, 3725)] == ["<1s", "42s", "1m 00s", "7m 05s",
                                                                               "1h 00m", "1h 02m"]


def test_preflight_errors_are_printed_once(tmp_path):
    """`invoke run` on a host that fails its preflight: the table (each error with its fix), then
    one line counting them, not the same errors listed again."""
    res = subprocess.run([sys.executable, "-m", "invoke", "run", "recipes/gsm8k.yaml", "--mode", "host", "--no-network",
                          "--out", str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    fixes = [line for line in res.stdout.splitlines() if line.strip().startswith("fix: ")]
    assert fixes and all(res.stdout.count(f.strip()) == 1 for f in fixes)
    assert all(f.strip()[5:] not in res.stderr for f in fixes)
    (line,) = res.stderr.splitlines()
    assert (line.startswith("error: preflight of recipes/gsm8k.yaml: ")
            and "each with its fix in the table above" in line)


@pytest.mark.parametrize("steps, why", [
    ('{"apex": "soon"}', "seconds 'soon' is not a number"),
    ('{"apex": -1}', "is not a number from 0 to 1e7"),
    ('{"apex": true}', "is not a number"),
    ('{"a\\u001b[2J": 1}', "without control characters"),
    ('[]', "`steps` is not an object"),
])
def test_a_damaged_step_times_record_is_refused_by_name(tmp_path, steps, why):
    (tmp_path / buildprogress.TIMES).write_text(f'{{"schema": "slimeforge.step-times/1", "steps": {steps}}}')
    with pytest.raises(readback.RecordError, match=re.escape(why)):
        buildprogress.read_times(tmp_path / buildprogress.TIMES)


def test_buildkit_text_reaches_the_screen_and_the_record_without_control_characters(tmp_path):
    script = tmp_path / "buildkit.sh"
    script.write_text("printf '#2 [1/1] RUN echo \\033[2Jgone\\n#2 0.1 x\\n#2 DONE 1.0s\\n'\n")
    said: list[str] = []
    rc, _ = stream_build(Runner(), ["bash", str(script)], {}, tmp_path / "build.log", said.append, verbose=True)
    assert rc == 0 and not any("\x1b" in s for s in said) and "step 1/1 RUN echo ?[2Jgone: done in 1s" in said[-1]
    assert buildprogress.read_times(tmp_path / buildprogress.TIMES) == {"RUN echo ?[2Jgone": 1.0}


def test_a_cell_is_plain_text_never_markup_nor_an_escape_sequence():
    """Cells carry other tools' text (ssh's errors): rich markup in it is shown as written (a stray
    "[/]" would otherwise stop the table), a control character as "?"."""
    import io

    out = io.StringIO()
    console.table("hosts", ["host", "error"], [["a", "ssh: [Errno 111] [bold]refused[/bold] [/] \x1b[2J"], ["b", None]],
                  out)
    assert "ssh: [Errno 111] [bold]refused[/bold] [/] ?[2J" in out.getvalue() and "\x1b" not in out.getvalue()
