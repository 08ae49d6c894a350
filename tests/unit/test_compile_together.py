"""install.sh's step runner with real bash (the rendered script's runner and step library, stand-in
step functions): compiled pieces overlap under the shared budget, a failing piece is named while
the others are waited for, a re-run resumes without compiling again what compiled, installs come
one at a time in step order, and progress lines, estimates and the summary are printed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import build_support as bs  # noqa: E402

from slimeforge.image.builder.compilejobs import apex_shared, compile_share  # noqa: E402
from slimeforge.image.builder.install import render_install_script  # noqa: E402
from slimeforge.image.stack import load_stack  # noqa: E402
from slimeforge.image.steps import compiled_key  # noqa: E402

CORES = 4  # nproc honours OMP_NUM_THREADS: the budget is computed for 4 cores whatever the host has

# Each piece: in its compile phase it records its MAX_JOBS, says it is here and waits (up to 20 s)
# for every other piece of the run to be here too: a barrier that only pieces running at the same
# time pass. In its install phase it records the order. FAIL_<piece> makes its compile fail.
STANDINS = r'''
sf_piece() {
  local me=$1; shift
  case ${SF_COMPILED_PHASE:-} in
    compile)
      printf '%s %s\n' "$me" "$MAX_JOBS" >>"$T/jobs"
      printf 'compile %s\n' "$me" >>"$T/events"
      : >"$T/here.$me"
      if [[ -n ${FAIL_ME:-} && $FAIL_ME == "$me" ]]; then sleep 1; echo "slimeforge: ERROR: $me broke"; exit 3; fi
      local other waited=0
      for other in "$@"; do
        until [[ -f $T/here.$other ]]; do
          sleep 0.1; waited=$((waited + 1)); ((waited < 200)) || { echo "$other never came"; exit 4; }
        done
      done ;;
    install) printf 'install %s\n' "$me" >>"$T/events" ;;
    *) echo "no phase"; exit 5 ;;
  esac
}
sf_step_a() { sf_piece a b c; }
sf_step_b() { sf_piece b a c; }
sf_step_c() { sf_piece c a b; }
sf_step_after() { printf 'after\n' >>"$T/events"; }
'''


def runner(tmp_path: Path) -> str:
    """The rendered install script up to its prerequisites: settings, the step library, the runner."""
    text = render_install_script(load_stack(bs.TEST_STACK), str(tmp_path / "prefix"), patches=[],
                                 lock=bs.render_lock(load_stack(bs.TEST_STACK)))
    return text[:text.index("# --- prerequisites")]


def run(tmp_path: Path, fail: str = "", fresh: bool = True) -> subprocess.CompletedProcess:
    body = runner(tmp_path) + STANDINS + "SF_STEPS_TOTAL=4\n" + "".join(
        f"sf_run_step {n} hash-{n} --what compiled --together --env K{n}=v -- sf_step_{n}\n" for n in "abc"
    ) + "sf_run_together\nsf_run_step after hash-after -- sf_step_after\nsf_summary\n"
    script = tmp_path / "run.sh"
    script.write_text(body)
    for f in tmp_path.glob("here.*") if fresh else ():
        f.unlink()
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "T": str(tmp_path), "FAIL_ME": fail,
                               "OMP_NUM_THREADS": str(CORES), "SF_HEARTBEAT_S": "1"})


def share() -> tuple[int, int, int]:
    mem_kib = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                       if line.startswith("MemTotal:")))
    return compile_share(3, mem_kib * 1024, CORES)


def test_pieces_compile_at_once_under_one_budget_then_install_in_order(tmp_path):
    at_once, jobs, _ = share()
    if at_once < 3:
        pytest.skip(f"this host's memory allows {at_once} pieces at once; the barrier needs 3")
    res = run(tmp_path)
    assert res.returncode == 0, res.stderr
    events = (tmp_path / "events").read_text().split("\n")
    # All three passed the barrier, so they ran at the same time; the installs came after, in step order.
    assert sorted(events[:3]) == ["compile a", "compile b", "compile c"]
    assert events[3:7] == ["install a", "install b", "install c", "after"]
    assert sorted((tmp_path / "jobs").read_text().split("\n")[:-1]) == [f"{p} {jobs}" for p in "abc"]
    assert f"at most {at_once} at once; each MAX_JOBS={jobs}" in res.stderr
    assert "slimeforge: step 4/4 after: done in" in res.stderr and "step 1/4 a: done in" in res.stderr
    # The summary: one row per step with its outcome.
    assert (re.search(r"^slimeforge: a +[0-9]+s  compiled$", res.stderr, re.M)
            and re.search(r"^slimeforge: after +[0-9]+s  installed$", res.stderr, re.M))
    state = tmp_path / "prefix" / ".slimeforge"
    assert all((state / "steps" / f"{p}.done").read_text().split("\n")[0] == f"hash-{p}" for p in "abc")
    assert all((state / "steps" / f"{p}.seconds").read_text().strip().isdigit() for p in "abc")
    # A second run: all done, nothing runs; each has an estimate from the first run.
    again = run(tmp_path)
    assert again.returncode == 0 and (tmp_path / "events").read_text() == "\n".join(events)
    assert again.stderr.count("done already") == 4


def test_a_failing_piece_is_named_the_others_are_waited_for_and_a_rerun_resumes(tmp_path):
    at_once, _, _ = share()
    if at_once < 3:
        pytest.skip(f"this host's memory allows {at_once} pieces at once; the barrier needs 3")
    res = run(tmp_path, fail="b")
    state = tmp_path / "prefix" / ".slimeforge"
    assert res.returncode == 1
    assert (f"compiled step(s) failed: b (log: {state}/logs/b.log)" in res.stderr
            and "slimeforge: ERROR: b broke" in res.stderr)
    # a and c were waited for (b had reached the barrier before it failed) and their compiles are
    # recorded; nothing was installed, no step is done.
    steps = state / "steps"
    assert (steps / "a.compiled").read_text() == "hash-a\n" and (steps / "c.compiled").read_text() == "hash-c\n"
    assert not list((state / "steps").glob("*.done")) and "install" not in (tmp_path / "events").read_text()
    (tmp_path / "events").write_text("")
    # b alone now (a and c reached the barrier in the first run): a and c are not compiled again.
    again = run(tmp_path, fresh=False)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "events").read_text().split("\n")[:-1] == ["compile b", "install a", "install b", "install c",
                                                                  "after"]
    assert "a: compiled by an earlier run" in again.stderr
    assert not list((state / "steps").glob("*.compiled"))


def test_a_long_step_prints_a_heartbeat_with_its_log(tmp_path):
    body = runner(tmp_path) + "SF_STEPS_TOTAL=1\nsf_step_slow() { sleep 2.5; }\nsf_run_step slow h -- sf_step_slow\n"
    (tmp_path / "run.sh").write_text(body)
    res = subprocess.run(["bash", str(tmp_path / "run.sh")], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SF_HEARTBEAT_S": "1"})
    assert res.returncode == 0, res.stderr
    log = tmp_path / "prefix" / ".slimeforge" / "logs" / "slow.log"
    assert re.search(rf"^slimeforge: step 1/1 slow: still running, [0-9]+s so far \(log: {re.escape(str(log))}\)$",
                     res.stderr, re.M)
    assert "slimeforge: step 1/1 slow: done in" in res.stderr
    # The next run's estimate comes from this run's record; a record that breaks the grammar gives none.
    (tmp_path / "prefix" / ".slimeforge" / "steps" / "slow.done").unlink()
    res2 = subprocess.run(["bash", str(tmp_path / "run.sh")], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SF_HEARTBEAT_S": "9"})
    assert "; last run here: " in res2.stderr
    (tmp_path / "prefix" / ".slimeforge" / "steps" / "slow.done").unlink()
    (tmp_path / "prefix" / ".slimeforge" / "steps" / "slow.seconds").write_text("$(reboot)\n")
    res3 = subprocess.run(["bash", str(tmp_path / "run.sh")], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SF_HEARTBEAT_S": "9"})
    assert res3.returncode == 0 and "last run here" not in res3.stderr


@pytest.mark.parametrize("cores,gib", [(2, 24), (16, 125), (1, 4), (64, 512)])
def test_host_share_follows_the_image_build_rule(cores, gib, tmp_path):
    lib = Path(__file__).resolve().parents[2] / "templates" / "steps.sh"
    for pieces in (1, 3, 4):
        res = subprocess.run(["bash", "-c", 'source "$1"; sf_compile_share "$2" "$3" "$4"', "sf", str(lib),
                              str(pieces), str(cores), str(gib * 1024 * 1024)],
                             capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "SF_STATE": str(tmp_path)})
        assert tuple(int(x) for x in res.stdout.split()) == compile_share(pieces, gib << 30, cores)
    # On this machine's size two pieces run at once with one job each: both cores busy, as in series.
    assert compile_share(3, 24 << 30, 2) == (2, 1, 1)


@pytest.mark.parametrize("cores,gib", [(2, 24), (16, 125), (1, 4), (64, 512)])
def test_apex_beside_others_keeps_the_hosts_extension_count(cores, gib, tmp_path):
    """install.sh's group hands apex the extension count sf_apex_jobs gives the whole host's jobs, and
    sf_compiled splits its share into jobs per extension: the pair equals compilejobs.apex_shared."""
    lib = Path(__file__).resolve().parents[2] / "templates" / "steps.sh"
    _, share, _ = compile_share(3, gib << 30, cores)
    script = ('source "$1"; host=$(sf_compile_jobs "$2" "$3"); ext=$(sf_apex_jobs "${host%% *}"); '
              'per=$(sf_apex_jobs "$4"); echo "${ext%% *} ${per#* }"')
    res = subprocess.run(["bash", "-c", script, "sf", str(lib), str(cores), str(gib * 1024 * 1024), str(share)],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "SF_STATE": str(tmp_path)})
    assert tuple(int(x) for x in res.stdout.split()) == apex_shared(share, gib << 30, cores)
    # The H100 host's measured setting (docs/build.md): 8 extensions x 4 jobs beside TE's 6.
    assert apex_shared(compile_share(3, 125 << 30, 16)[1], 125 << 30, 16) == (8, 4)


# compiled_key values at 1a0fe99, before the pieces compiled side by side: running them together
# changes how they are run, never what is built.
KEYS_BEFORE = {
    "cu13": {"flash-attn": "cu13-flash-attn-bb1f0b2b5a864a6f",
             "transformer-engine": "cu13-transformer-engine-dd2a6a6f73c41857",
             "apex": "cu13-apex-49812b1f7c5e7322", "torch-memory-saver": "cu13-torch-memory-saver-2780d77a7d10f20e"},
    "cu129": {"flash-attn": "cu129-flash-attn-8112d97c3db10a29",
              "transformer-engine": "cu129-transformer-engine-3eb42034a158021a",
              "apex": "cu129-apex-a40d5a210c8373aa", "torch-memory-saver": "cu129-torch-memory-saver-63f7648e8fd0ee90"},
}


@pytest.mark.parametrize("flavor", ["cu13", "cu129"])
def test_the_compiled_keys_do_not_change(flavor):
    stack = load_stack(flavor)
    assert {s.name: compiled_key(stack, s.name) for s in stack.plan if s.compiles} == KEYS_BEFORE[flavor]
