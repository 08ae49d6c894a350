"""The compiler's progress inside a long compile (issue 42 item 10): ninja's "[N/M]" lines, which
`pip wheel -v` passes through from torch's extension builder, read from a log's last 64 KiB by the
install's bash (templates/install.sh.j2 _sf_ninja_progress, for hosts without slimeforge) and by
`invoke build`'s Python (buildprogress.ninja_progress), held to the same real captures
(tests/fixtures/ninja/README.md says how each was made); the install's heartbeat against a log
that grows, and `invoke build`'s heartbeat against BuildKit's plain progress carrying the lines."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import build_support as bs  # noqa: E402

from slimeforge.image.builder.buildkit import stream_build  # noqa: E402
from slimeforge.image.builder.buildprogress import (  # noqa: E402
    TAIL_BYTES,
    compiling_text,
    ninja_progress,
)
from slimeforge.image.builder.install import render_install_script  # noqa: E402
from slimeforge.image.stack import load_stack  # noqa: E402
from slimeforge.proc import Runner  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ninja"
TORCH = (FIXTURES / "pip-wheel-v-torch-cpp-extension.log").read_text().splitlines()
PLAIN = (FIXTURES / "pip-wheel-v-setuptools-no-ninja.log").read_text().splitlines()
BUILDKIT = (FIXTURES / "buildkit-plain-apex.log").read_text().splitlines()
ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}



def ninja_progress_of(path: Path) -> tuple[int, int] | None:
    """ninja_progress of the last TAIL_BYTES of a log file (a tail that starts inside a line drops
    that piece)."""
    with path.open("rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(max(0, size - TAIL_BYTES))
        lines = fh.read(TAIL_BYTES).decode("utf-8", "replace").split("\n")
    return ninja_progress(lines[1:] if size > TAIL_BYTES else lines)

def upto(text: str) -> list[str]:
    """The real capture up to (and with) its first line that starts with `text` after pip's indent."""
    i = next(i for i, line in enumerate(TORCH) if line.strip().startswith(text))
    return TORCH[: i + 1]


def line_of(obj: str) -> str:
    """The capture's ninja line that compiled `obj` (a.o, b.o, c.o, d.o)."""
    return next(line for line in TORCH if f"temp.linux-x86_64-cpython-311/{obj}.d " in line)


# Each case: lines of a log, and the (done, total) both parsers must read from it.
CASES = {
    # Serial builds, one per extension (apex without APEX_PARALLEL_BUILD): the one running now.
    "first-object": (upto("[1/2]"), (1, 2)),
    "first-extension-built": (upto("[2/2]"), (2, 2)),
    "first-linked": (upto("g++"), (2, 2)),
    "second-extension-started": (TORCH[: TORCH.index(line_of("c.o")) + 1], (1, 2)),
    "whole-capture": (TORCH, (2, 2)),
    # setuptools without ninja counts nothing.
    "setuptools-no-ninja": (PLAIN, None),
    # Extensions built at once (APEX_PARALLEL_BUILD): the real lines interleaved as two threads'
    # ninja builds write them; the running builds are summed.
    "two-at-once": ([line_of("a.o"), line_of("c.o")], (2, 4)),
    "two-at-once-one-ended": ([line_of("a.o"), line_of("c.o"), line_of("b.o")], (1, 2)),
    # Builds of different sizes at once (the counts of real lines changed to tell them apart).
    "three-and-two": ([line_of("a.o").replace("[1/2]", "[1/3]"), line_of("c.o"),
                       line_of("b.o").replace("[2/2]", "[2/3]")], (3, 5)),
    # Not ninja's status: a bracket inside a line, N over M, a zero total, over 7 digits, an escape
    # sequence before it; none of them is a count.
    "not-a-count": (["  building [1/2] later", "[5/3] x", "[0/0] x", "[12345678/99999999] x", "\x1b[2J  [1/2] x"],
                    None),
    # A status line with control characters after it: the count is read, the text never shown.
    "count-before-escapes": (["  [3/8] \x1b]0;owned\x07 c++ \x1b[2J"], (3, 8)),
    "empty": ([], None),
}


def render_lib(tmp: Path) -> Path:
    """The rendered install script up to its prerequisites (settings, step library, runner), its
    state under `tmp`."""
    text = render_install_script(load_stack(bs.TEST_STACK), str(tmp / "prefix"), patches=[],
                                 lock=bs.render_lock(load_stack(bs.TEST_STACK)))
    path = tmp / "lib.sh"
    path.write_text(text[: text.index("# --- prerequisites")])
    return path


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> Path:
    return render_lib(tmp_path_factory.mktemp("lib"))


def bash(lib: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"source {lib}; {code}"], capture_output=True, text=True, timeout=60,
                          env={**ENV, **env})


def bash_progress(lib: Path, log: Path) -> tuple[int, int] | None:
    res = bash(lib, '_sf_ninja_progress "$F"', F=str(log))
    assert res.returncode == 0, res.stderr
    # Only the digits parsed reach the terminal: the whole output is "DONE TOTAL" or nothing.
    assert re.fullmatch(r"([0-9]+ [0-9]+\n)?", res.stdout), repr(res.stdout)
    return (int(res.stdout.split()[0]), int(res.stdout.split()[1])) if res.stdout else None


@pytest.mark.parametrize("case", sorted(CASES))
def test_both_parsers_read_the_same_count_from_real_output(case, lib, tmp_path):
    lines, want = CASES[case]
    log = tmp_path / "step.log"
    log.write_bytes("".join(f"{line}\n" for line in lines).encode())
    assert ninja_progress(lines) == want
    assert ninja_progress_of(log) == want
    assert bash_progress(lib, log) == want


def test_only_the_last_64_KiB_is_read_and_a_cut_line_is_not_a_line(lib, tmp_path):
    log = tmp_path / "big.log"
    # A count well before the tail: not seen. The tail's first piece starts with a count-like text
    # inside a longer line (the cut falls just before it): not a line, so no count.
    head = line_of("a.o") + "\n" + "x" * 70000 + "\n"
    cut_line = "make: " + line_of("c.o").lstrip()
    rest = "\n" + "y" * (TAIL_BYTES - (len(cut_line) - len("make: ")) - 2) + "\n"
    log.write_bytes((head + cut_line + rest).encode())
    assert (log.read_bytes()[-TAIL_BYTES:]).startswith(b"[1/2] ")
    assert ninja_progress_of(log) is None and bash_progress(lib, log) is None
    # A count inside the tail is read by both.
    with log.open("a") as fh:
        fh.write(line_of("d.o") + "\n")
    assert ninja_progress_of(log) == (2, 2) == bash_progress(lib, log)


@pytest.mark.parametrize("done,total,elapsed,last,want", [
    (143, 412, 4021, 6720, "compiling 143/412 (34 %), 1h 07m so far, about 44m 59s left (last run 1h 52m)"),
    (143, 412, 4021, None, "compiling 143/412 (34 %), 1h 07m so far, about 2h 06m left at this rate"),
    (143, 412, 7000, 6720, "compiling 143/412 (34 %), 1h 56m so far, longer than the last run (1h 52m)"),
    (20, 412, 300, 6720, "compiling 20/412 (4 %), 5m 00s so far (last run 1h 52m)"),  # under 5 %: no estimate
    (20, 412, 300, None, "compiling 20/412 (4 %), 5m 00s so far"),
    (2, 2, 42, None, "compiling 2/2 (100 %), 42s so far, about <1s left at this rate"),
])
def test_the_estimate_from_the_last_run_else_the_rate_and_none_before_5_percent(done, total, elapsed, last, want, lib):
    assert compiling_text(done, total, elapsed, last) == want
    # The install's words: the same rule, its own duration format (7m05s, 1h52m), whole seconds.
    last_seconds = ("rm -f $SF_STATE/steps/apex.seconds;" if last is None
                    else f"echo {last} >$SF_STATE/steps/apex.seconds;")
    res = bash(lib, f'mkdir -p "$SF_STATE/steps"; {last_seconds} '
                    f'printf "  [{done}/{total}] c++\\n" >"$SF_STATE/x.log"; '
                    f'_sf_progress "$SF_STATE/x.log" {elapsed} apex')
    assert res.returncode == 0, res.stderr
    head = f"compiling {done}/{total} ({100 * done // total} %), {elapsed}s so far"
    assert res.stdout.startswith(head)
    tail = res.stdout[len(head):]
    if done * 20 < total:
        assert tail == ("" if last is None else " (last run 1h52m)")
    elif last is None:
        assert tail == f", about {bs_dur(elapsed * (total - done) // done)} left at this rate"
    elif last > elapsed:
        assert tail == f", about {bs_dur(last - elapsed)} left (last run 1h52m)"
    else:
        assert tail == ", longer than the last run (1h52m)"


def test_behind_the_queue_no_rate_only_the_last_run(lib):
    # The queue runs the costliest files of every piece first: a piece's rate says nothing of its rest.
    for last, want in ((None, "compiling 143/412 (34 %), 4021s so far"),
                       (6720, "compiling 143/412 (34 %), 4021s so far, about 44m59s left (last run 1h52m)")):
        setup = "rm -f $SF_STATE/steps/apex.seconds;" if last is None else f"echo {last} >$SF_STATE/steps/apex.seconds;"
        res = bash(lib, f'mkdir -p "$SF_STATE/steps"; {setup} printf "  [143/412] c++\\n" >"$SF_STATE/x.log"; '
                        '_sf_progress "$SF_STATE/x.log" 4021 apex 1')
        assert res.returncode == 0 and res.stdout == want, res.stdout + res.stderr


def bs_dur(s: int) -> str:
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


def test_no_count_no_progress_line(lib, tmp_path):
    (tmp_path / "plain.log").write_text("\n".join(PLAIN) + "\n")
    res = bash(lib, '_sf_progress "$F" 60 apex', F=str(tmp_path / "plain.log"))
    assert res.returncode == 1 and res.stdout == ""


# --- the install's heartbeat against a log that grows ------------------------------------------

STAGES = r'''
sf_stage() { sed -n "$1p" "$FX"; sleep 3; }
sf_step_ninja() {
  # In a together group, only the compile phase compiles; the install phase installs.
  [[ ${SF_COMPILED_PHASE:-compile} == compile ]] || return 0
  sf_stage 1,8; sf_stage 9,9; sf_stage 10,14
}
sf_step_plain() {
  [[ ${SF_COMPILED_PHASE:-compile} == compile ]] || return 0
  cat "$PLAIN"; sleep 2.5
}
'''


def install_run(lib: Path, tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    script = tmp_path / "run.sh"
    script.write_text(lib.read_text() + STAGES + body)
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120,
                          env={**ENV, "HOME": str(tmp_path), "SF_HEARTBEAT_S": "1", "OMP_NUM_THREADS": "2",
                               "FX": str(FIXTURES / "pip-wheel-v-torch-cpp-extension.log"),
                               "PLAIN": str(FIXTURES / "pip-wheel-v-setuptools-no-ninja.log")})


def beats(stderr: str, label: str) -> list[str]:
    return [line.split(f"{label}: ", 1)[1] for line in stderr.splitlines()
            if line.startswith(f"slimeforge: {label}: compiling")]


def test_install_heartbeat_shows_the_count_as_the_log_grows(tmp_path):
    lib = render_lib(tmp_path)
    state = Path(bash(lib, 'printf %s "$SF_STATE"').stdout)
    res = install_run(lib, tmp_path, "SF_STEPS_TOTAL=1\nsf_run_step apex h -- sf_step_ninja\n")
    assert res.returncode == 0, res.stderr
    said = beats(res.stderr, "step 1/1 apex")
    log = state / "logs" / "apex.log"
    # First ext's first object, its second (the build ended), then the second ext's build.
    counts = [s.split(",", 1)[0] for s in said]
    assert counts[0] == "compiling 1/2 (50 %)" and "compiling 2/2 (100 %)" in counts, res.stderr
    assert counts.index("compiling 2/2 (100 %)") > 0 and all(c in ("compiling 1/2 (50 %)",
                                                                   "compiling 2/2 (100 %)") for c in counts)
    assert all(re.fullmatch(r"compiling [12]/2 \([0-9]+ %\), [0-9]+s so far, about [0-9hms]+ left at this rate "
                            rf"\(log: {re.escape(str(log))}\)", s)
               for s in said), said
    # The next run: the estimate from this run's time.
    (state / "steps" / "apex.done").unlink()
    (state / "steps" / "apex.seconds").write_text("3600\n")
    again = install_run(lib, tmp_path, "SF_STEPS_TOTAL=1\nsf_run_step apex h -- sf_step_ninja\n")
    assert again.returncode == 0, again.stderr
    assert any(re.fullmatch(r"compiling 1/2 \(50 %\), [0-9]s so far, about 59m[0-9]{2}s left \(last run 1h00m\) "
                            r"\(log: .*\)", s)
               for s in beats(again.stderr, "step 1/1 apex")), again.stderr


def test_together_heartbeat_shows_the_count_or_says_there_is_none(tmp_path):
    lib = render_lib(tmp_path)
    body = ("SF_STEPS_TOTAL=2\nsf_run_step apex h1 --what compiled --together -- sf_step_ninja\n"
            "sf_run_step plain h2 --what compiled --together -- sf_step_plain\nsf_run_together\n")
    res = install_run(lib, tmp_path, body)
    assert res.returncode == 0, res.stderr
    assert "compiling 1/2 (50 %)" in "\n".join(beats(res.stderr, "step 1/2 apex")), res.stderr
    plain = [line for line in res.stderr.splitlines() if line.startswith("slimeforge: step 2/2 plain: compiling (no "
                                                                         "progress count), ")]
    assert plain and "still compiling" not in res.stderr, res.stderr


# --- invoke build's heartbeat: BuildKit's plain progress carrying ninja's lines -----------------

def test_build_heartbeat_shows_the_count_from_buildkit_output(tmp_path):
    """The real BuildKit capture, printed by a real process in three stages with pauses: the
    heartbeat names the count as it grows, with the last run's estimate."""
    script = tmp_path / "buildkit.sh"
    fx = tmp_path / "bk.log"
    fx.write_text("\n".join(BUILDKIT) + "\n")
    script.write_text(f"sed -n 1,9p {fx}; sleep 2; sed -n 10,10p {fx}; sleep 2; sed -n 11,99p {fx}\n")
    said: list[str] = []
    rc, _ = stream_build(Runner(), ["bash", str(script)], {}, tmp_path / "build.log", said.append,
                         estimates={"apex": 3600.0}, heartbeat_s=0.5)
    assert rc == 0
    beat = [s.split("] ", 1)[1] for s in said if "apex: compiling" in s]
    counts = [b.split(",", 1)[0] for b in beat]
    assert counts[0] == "step 4/4 apex: compiling 1/2 (50 %)" and "step 4/4 apex: compiling 2/2 (100 %)" in counts, said
    assert all(re.fullmatch(r"step 4/4 apex: compiling [12]/2 \([0-9]+ %\), (<1s|[0-9]+s) so far, about 59m [0-9]{2}s "
                            r"left \(last run 1h 00m\) "
                            rf"\(log: {re.escape(str(tmp_path / 'build.log'))}\)", b) for b in beat), beat
    assert said[-1].endswith("step 4/4 apex: done in 4s")


def test_the_status_lines_the_step_library_streams_give_the_same_count(lib, tmp_path):
    """_sf_store_make streams only ninja's status lines, cut short (the whole output goes to its
    compile log): its own filter, taken from steps.sh, on the real capture, read by both parsers."""
    steps = (Path(__file__).resolve().parents[3] / "templates" / "steps.sh").read_text()
    grep = re.search(r"\{ (LC_ALL=C grep --line-buffered -oE '[^']+') \|\| true; \}", steps)
    assert grep, "the status-line filter of _sf_store_make"
    for case in ("first-object", "second-extension-started", "whole-capture"):
        lines, want = CASES[case]
        full = tmp_path / "full.log"
        full.write_text("".join(f"{line}\n" for line in lines))
        res = subprocess.run(["bash", "-c", f'{grep.group(1)} <"$F" || true'], capture_output=True, text=True,
                             env={**ENV, "F": str(full)})
        streamed = res.stdout.splitlines()
        assert streamed and all(len(s) <= 130 and NINJA_LINE.match(s) for s in streamed), streamed
        (tmp_path / "streamed.log").write_text(res.stdout)
        assert ninja_progress(streamed) == want == bash_progress(lib, tmp_path / "streamed.log")


NINJA_LINE = re.compile(r"  \[[0-9]/2\] ccache c\+\+ ")
