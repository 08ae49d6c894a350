"""A compile's output is another program's text: in the install's heartbeat and `invoke build`'s,
only the count parsed from it reaches the terminal, never its control characters, and what is not
ninja's status (too many digits, N over M, a count inside a line) is no count."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import build_support as bs  # noqa: E402

from slimeforge.image.builder.buildprogress import Progress  # noqa: E402
from slimeforge.image.builder.install import render_install_script  # noqa: E402
from slimeforge.image.stack import load_stack  # noqa: E402

NINJA_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ninja"
PLAIN = (NINJA_FIXTURES / "pip-wheel-v-setuptools-no-ninja.log").read_text().splitlines()
HOSTILE = [
    "  [3/8] \x1b]0;owned\x07 c++ \x1b[2J\r\x9b31m",
    "  [99999999/99999999] \x1b[2J",  # over 7 digits: not a count
    "  [9/8] more done than there are",
    "\x1b[2J  [7/8] after an escape: not at the line's start",
    "  make: [8/8] inside a line",
]


def test_install_heartbeat_prints_only_the_digits(tmp_path):
    text = render_install_script(load_stack(bs.TEST_STACK), str(tmp_path / "prefix"), patches=[],
                                 lock=bs.render_lock(load_stack(bs.TEST_STACK)))
    step = "sf_step_evil() { printf '%s\\n' \"${EVIL[@]}\"; sleep 2.5; }\n"
    head = text[: text.index("# --- prerequisites")]
    body = head + "SF_STEPS_TOTAL=1\nmapfile -t EVIL <\"$EVIL_FILE\"\n" + step + "sf_run_step evil h -- sf_step_evil\n"
    (tmp_path / "run.sh").write_text(body)
    (tmp_path / "evil.txt").write_bytes("".join(f"{line}\n" for line in HOSTILE).encode())
    res = subprocess.run(["bash", str(tmp_path / "run.sh")], capture_output=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SF_HEARTBEAT_S": "1",
                              "EVIL_FILE": str(tmp_path / "evil.txt")})
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 0, err
    assert re.search(r"^slimeforge: step 1/1 evil: compiling 3/8 \(37 %\), [0-9]+s so far, about [0-9]+s left at this "
                     r"rate \(log: .*\)$", err, re.M), err
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", err), repr(err)


def test_build_heartbeat_never_shows_the_output_text():
    """Control characters of a compile's output never reach the terminal: only its count does."""
    now = [0.0]
    said: list[str] = []
    p = Progress(said.append, Path("/tmp/build.log"), {}, heartbeat_s=60, clock=lambda: now[0])
    p.vertex("8", "4", "4", "apex")
    for line in HOSTILE:
        p.output("8", line)
    now[0] = 61.0
    p.beat()
    assert said[-1] == ("[ 1m 01s] step 4/4 apex: compiling 3/8 (37 %), 1m 01s so far, about 1m 41s left at this rate "
                       "(log: /tmp/build.log)")
    # A build without ninja: the heartbeat as before.
    p.vertex("9", "4", "4", "plain")
    for line in PLAIN:
        p.output("9", line)
    now[0] = 200.0
    p.beat()
    assert said[-1] == "[ 3m 20s] step 4/4 plain: still running, 2m 19s (log: /tmp/build.log)"
