"""One pool of job slots for the compiled pieces (steps.sh sf_jobserver_plan / sf_jobserver_open /
_sf_ninja_shim, compilejobs.jobserver_plan / ninja_takes_jobserver), with real bash and a FIFO: the
two rules agree, the shim takes a slot for ninja's first job and gives it back whatever ninja's exit,
drops -j (which would turn ninja's jobserver client off), and install.sh's runner hands the pool to
every piece only when asked (SF_COMPILE_POOL=1) and the venv's ninja is 1.13 or later."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import build_support as bs  # noqa: E402

from slimeforge.image.builder.compilejobs import (  # noqa: E402
    QUEUE_APEX_AT_ONCE,
    QUEUE_FILES_PER_NINJA,
    jobserver_plan,
    ninja_takes_jobserver,
    queue_plan,
)
from slimeforge.image.builder.install import render_install_script  # noqa: E402
from slimeforge.image.stack import load_stack  # noqa: E402

LIB = Path(__file__).resolve().parents[3] / "templates" / "steps.sh"
SCRIPTS = Path(__file__).resolve().parents[3] / "slimeforge" / "scripts"


def sf(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f'source "$1"; shift; {script}', "sf", str(LIB), *args], capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", **(env or {})})


@pytest.mark.parametrize("cores,gib", [(2, 24), (16, 125), (16, 128), (1, 1), (1, 4), (64, 512), (8, 30), (3, 7), (128,
                                                                                                                   64)])
def test_host_pool_follows_the_python_rule(cores, gib):
    res = sf('sf_jobserver_plan "$@"', str(cores), str(gib * 1024 * 1024))
    assert res.returncode == 0, res.stderr
    assert tuple(int(x) for x in res.stdout.split()) == jobserver_plan(mem_bytes=gib << 30, cores=cores)


@pytest.mark.parametrize("cores,gib", [(2, 24), (16, 125), (16, 128), (1, 1), (1, 4), (64, 512), (8, 30), (3, 7), (128,
                                                                                                                   64)])
def test_host_queue_follows_the_python_rule(cores, gib):
    res = sf('sf_queue_plan "$@"', str(cores), str(gib * 1024 * 1024))
    assert res.returncode == 0, res.stderr
    assert tuple(int(x) for x in res.stdout.split()) == queue_plan(mem_bytes=gib << 30, cores=cores)


def test_the_measured_host_gets_the_measured_queue():
    # 16 cores, 125 GiB: 22 slots (169.5-180.3 s, 1.11-1.14 x the cores' limit, docs/build.md).
    assert queue_plan(mem_bytes=125 << 30, cores=16) == (22, 1)


def test_the_measured_host_gets_the_measured_pool():
    # 16 cores, 125 GiB: 40 slots, apex 16 extensions at once (196.0 s on the H200 host, docs/build.md).
    assert jobserver_plan(mem_bytes=125 << 30, cores=16)[:2] == (40, 16)


@pytest.mark.parametrize("version,ok", [("1.13.0", True), ("1.13.0.git.kitware.jobserver-pipe-1", True), ("1.13.2",
                                                                                                          True),
                                        ("1.14", True), ("2.0.0", True), ("1.12.1", False), ("1.11.1", False),
                                        ("1.9", False), ("", False), ("ninja", False), ("-1.13", False)])
def test_ninja_version_rule_is_one_rule(tmp_path, version, ok):
    fake = tmp_path / "ninja"
    fake.write_text(f"#!/bin/bash\nprintf '%s\\n' {version!r}\n")
    fake.chmod(0o755)
    assert ninja_takes_jobserver(version) is ok
    assert (sf('_sf_ninja_ok "$1"', str(fake)).returncode == 0) is ok


def fake_ninja(tmp_path: Path, rc: int = 0) -> Path:
    """A stand-in for the real ninja: records its argv and how many slots the pool held while it ran."""
    real = tmp_path / "real-ninja"
    real.write_text(f"""#!/bin/bash
if [[ $1 == --version ]]; then echo 1.13.0; exit 0; fi
printf '%s\\n' "$@" >"{tmp_path}/argv"
n=0
while IFS= read -r -n1 -t 0.2 -d '' c <"$SF_JOBSERVER_PEEK"; do
  n=$((n + 1)); printf %s "$c" >>"{tmp_path}/taken"
done
echo "$n" >"{tmp_path}/free"
cat "{tmp_path}/taken" 2>/dev/null >"$SF_JOBSERVER" || true
rm -f "{tmp_path}/taken"
exit {rc}
""")
    real.chmod(0o755)
    return real


@pytest.mark.parametrize("rc", [0, 7])
def test_shim_takes_a_slot_drops_j_and_gives_the_slot_back(tmp_path, rc):
    real = fake_ninja(tmp_path, rc)
    script = ('sf_jobserver_open "$1" 3 "$2" || exit 90; for kv in "${SF_JOBSERVER_ENV[@]}"; do export "$kv"; done; '
              'export SF_JOBSERVER_PEEK=$SF_JOBSERVER; '
              'rc=0; ninja -v -j 16 -C build -j4 all || rc=$?; echo "rc=$rc"; '
              'n=0; while IFS= read -r -n1 -t 0.2 -d "" c <&"$SF_JOBSERVER_FD"; do n=$((n + 1)); done; echo "back=$n"; '
              'echo "$MAKEFLAGS"; command -v ninja')
    res = sf(script, str(tmp_path / "pool"), str(real))
    assert res.returncode == 0, res.stderr
    # ninja ran without any -j, with the shim holding one of the 3 slots: 2 were free in the pool.
    assert (tmp_path / "argv").read_text().split() == ["-v", "-C", "build", "all"]
    assert (tmp_path / "free").read_text().strip() == "2"
    assert f"rc={rc}" in res.stdout
    assert "back=3" in res.stdout  # every slot back, ninja's exit status passed on
    assert f"-j3 --jobserver-auth=fifo:{tmp_path}/pool/slots" in res.stdout
    assert res.stdout.strip().endswith(f"{tmp_path}/pool/bin/ninja")
    assert oct((tmp_path / "pool" / "slots").stat().st_mode & 0o777) == "0o600"


def test_shim_passes_version_without_a_slot(tmp_path):
    real = fake_ninja(tmp_path)
    res = sf('sf_jobserver_open "$1" 1 "$2" || exit 90; for kv in "${SF_JOBSERVER_ENV[@]}"; do export "$kv"; done; '
             # the pool's one slot taken first: a shim that wanted a slot would wait for it
             'IFS= read -r -n1 -d "" c <&"$SF_JOBSERVER_FD"; timeout 5 ninja --version', str(tmp_path / "pool"),
             str(real))
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "1.13.0"


def test_old_ninja_opens_no_pool_and_bad_slots_are_refused(tmp_path):
    old = tmp_path / "ninja"
    old.write_text("#!/bin/bash\necho 1.11.1\n")
    old.chmod(0o755)
    res = sf('if sf_jobserver_open "$1" 4 "$2"; then echo opened; else echo refused; fi; ls -A "$(dirname "$1")"',
             str(tmp_path / "pool"), str(old))
    assert res.returncode == 0, res.stderr
    assert "refused" in res.stdout and "pool" not in res.stdout
    for bad, shown in (("0", "0"), ("x", "x"), ("3+1", "3+1"), ("12345", "12345"), ("-1", "-1"), ("4\x1b[2J", "4?[2J")):
        res = sf('sf_jobserver_open "$1" "$2" "$3"', str(tmp_path / "pool"), bad, str(old))
        assert res.returncode == 1 and f"got '{shown}'" in res.stderr and "\x1b" not in res.stderr, res.stderr


# --- install.sh's runner with the pool ------------------------------------------------------------

STANDINS = r'''
sf_piece() {
  local me=$1; shift
  case ${SF_COMPILED_PHASE:-} in
    compile)
      printf '%s|%s|%s|%s|%s|%s|%s|%s\n' "$me" "${SF_JOBSERVER:-none}" "${MAKEFLAGS:-none}" \
        "$(command -v ninja || echo none)" "${APEX_PARALLEL_BUILD:-}" "${CXX:-none}" "${PYTORCH_NVCC:-none}" \
        "$MAX_JOBS" >>"$T/seen"
      # Behind the queue: one real compile through its wrapper (the host's c++).
      if [[ ${SF_COMPILE_QUEUE:-} == 1 ]]; then
        printf 'int %s(void) { return 1; }\n' "$me" >"$T/$me.c"
        "$CXX" -x c -c "$T/$me.c" -o "$T/$me.o" || exit 6
      fi
      : >"$T/here.$me"
      # one piece at a time asked for (SF_COMPILE_AT_ONCE=1): no barrier, the order and jobs recorded
      if [[ -n ${SF_COMPILE_AT_ONCE:-} ]]; then printf '%s %s\n' "$me" "$MAX_JOBS" >>"$T/order"; return; fi
      local other waited=0
      for other in "$@"; do
        until [[ -f $T/here.$other ]]; do
          sleep 0.1; waited=$((waited + 1)); ((waited < ${BARRIER_TRIES:-200})) || { echo "$other never came"; exit 4; }
        done
      done ;;
    install) : ;;
    *) exit 5 ;;
  esac
}
sf_step_a() { sf_piece a b c; }
sf_step_b() { sf_piece b a c; }
sf_step_c() { sf_piece c a b; }
'''


def run_install(tmp_path: Path, pool: str, ninja_version: str = "1.13.0",
                extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    text = render_install_script(load_stack(bs.TEST_STACK), str(tmp_path / "prefix"), patches=[],
                                 lock=bs.render_lock(load_stack(bs.TEST_STACK)))
    venv = re.search(r"^VENV=(.*)$", text, re.M)
    assert venv
    venv_dir = Path(subprocess.run(["bash", "-c", f"printf %s {venv.group(1)}"], capture_output=True, text=True).stdout)
    (venv_dir / "bin").mkdir(parents=True, exist_ok=True)
    (venv_dir / "bin" / "ninja").write_text(f"#!/bin/bash\necho {ninja_version}\n")
    (venv_dir / "bin" / "ninja").chmod(0o755)
    if not (venv_dir / "bin" / "python").exists():
        (venv_dir / "bin" / "python").symlink_to(sys.executable)
    # install.sh writes the target scripts to SF_STATE before its steps; this runner starts at the steps.
    state = Path(subprocess.run(["bash", "-c", f"printf %s {re.search(r'^export SF_STATE=(.*)$', text, re.M)[1]}"],
                                capture_output=True, text=True).stdout)
    state.mkdir(parents=True, exist_ok=True)
    for name in ("compile_queue.py", "compile_costs.json"):
        (state / name).write_bytes((SCRIPTS / name).read_bytes())
    body = text[:text.index("# --- prerequisites")] + STANDINS + "SF_STEPS_TOTAL=3\n" + "".join(
        f"sf_run_step {n} hash-{n} --what compiled --together -- sf_step_{n}\n" for n in "abc") + "sf_run_together\n"
    script = tmp_path / "run.sh"
    script.write_text(body)
    for f in tmp_path.glob("here.*"):
        f.unlink()
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "T": str(tmp_path),
                               "OMP_NUM_THREADS": "1",
                               "SF_COMPILE_POOL": pool, "SF_HEARTBEAT_S": "1", **(extra or {})})


def test_install_runs_every_piece_at_once_under_one_pool(tmp_path):
    # One core: the shares would run one piece at a time, so the barrier passes only with the pool.
    res = run_install(tmp_path, "1")
    assert res.returncode == 0, res.stderr
    assert "one pool of" in res.stderr
    seen = [line.split("|") for line in (tmp_path / "seen").read_text().splitlines()]
    assert sorted(s[0] for s in seen) == ["a", "b", "c"]
    for _, fifo, makeflags, ninja, _apex, *_ in seen:
        assert fifo.endswith("/jobs/slots") and f"--jobserver-auth=fifo:{fifo}" in makeflags
        assert ninja == fifo.replace("/slots", "/bin/ninja")
    assert not os.path.exists(seen[0][1]) or Path(seen[0][1]).is_fifo()


def test_install_keeps_the_shares_by_default_and_with_an_old_ninja(tmp_path):
    # One piece at a time (one core, the shares): a piece's barrier would wait its 20 s for the others
    # in vain; what is checked here is only how each piece was started, so it waits 0.1 s.
    quick = {"BARRIER_TRIES": "1"}
    res = run_install(tmp_path, "1", ninja_version="1.11.1", extra=quick)
    assert "older than 1.13" in res.stderr and "at most" in res.stderr
    assert all(line.split("|")[1] == "none" for line in (tmp_path / "seen").read_text().splitlines())
    (tmp_path / "seen").unlink()
    res = run_install(tmp_path, "0", extra=quick)
    assert "one pool of" not in res.stderr and "at most" in res.stderr


def test_install_refuses_a_bad_pool_setting(tmp_path):
    res = run_install(tmp_path, "yes\x1b[31m")
    assert res.returncode != 0
    assert "SF_COMPILE_POOL: 'yes?[31m' must be queue" in res.stderr and "\x1b" not in res.stderr


def test_install_compiles_one_piece_at_a_time_when_asked(tmp_path):
    # SF_COMPILE_AT_ONCE=1: the series install (docs/install.md's cold figures), each piece with the
    # whole host's jobs; a value outside 1-9 is refused, shown printable.
    res = run_install(tmp_path, "0", extra={"SF_COMPILE_AT_ONCE": "1", "MAX_JOBS": "7"})
    assert res.returncode == 0, res.stderr
    assert "(at most 1 at once; each MAX_JOBS=7" in res.stderr
    assert [line.split() for line in (tmp_path / "order").read_text().splitlines()] == [["a", "7"], ["b", "7"],
                                                                                           ["c", "7"]]
    for i, bad in enumerate(("0", "10", "x", "1\x1b[2J")):
        (tmp_path / str(i)).mkdir()
        res = run_install(tmp_path / str(i), "0", extra={"SF_COMPILE_AT_ONCE": bad})
        assert res.returncode != 0 and "SF_COMPILE_AT_ONCE: '" in res.stderr and "\x1b" not in res.stderr
        assert "must be a number of pieces from 1 to 9" in res.stderr


def test_compiled_step_finds_the_venvs_ninja_first(tmp_path):
    # torch's extension builder runs `ninja` from PATH and, finding none, compiles each extension's
    # files one after another: a compiled step with a venv has the venv's tools first, after the
    # pool's shim when there is a pool.
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    script = 'sf_show() { printf "%s\\n" "$PATH"; }; sf_compiled --key k --venv "$1" -- show'
    env = {"SF_STATE": str(tmp_path), "HOME": str(tmp_path), "MAX_JOBS": "2", "NVCC_THREADS": "1"}
    res = sf(script, str(venv), env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"{venv}/bin:/usr/bin:/bin"
    pool = tmp_path / "jobs"
    res = sf(script, str(venv), env={**env, "SF_JOBSERVER": f"{pool}/slots", "PATH": f"{pool}/bin:/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"{pool}/bin:{venv}/bin:/usr/bin:/bin"


def test_install_runs_every_piece_at_once_behind_one_queue(tmp_path):
    # SF_COMPILE_POOL=queue: every piece at once (one core: the shares would run them one at a time,
    # so the barrier passes only this way), each with the queue's wrappers as its compilers, every
    # ninja's files at once (MAX_JOBS), apex's extensions all at once; a real compile goes through.
    res = run_install(tmp_path, "queue")
    assert res.returncode == 0, res.stderr
    assert "behind one queue of 1 slots" in res.stderr
    seen = [line.split("|") for line in (tmp_path / "seen").read_text().splitlines()]
    assert sorted(s[0] for s in seen) == ["a", "b", "c"]
    for _me, fifo, _mk, _ninja, apex, cxx, nvcc, jobs in seen:
        assert fifo == "none" and cxx.endswith("/queue/bin/g++") and nvcc.endswith("/queue/bin/nvcc")
        assert (apex, jobs) == (str(QUEUE_APEX_AT_ONCE), str(QUEUE_FILES_PER_NINJA))
        assert (tmp_path / f"{_me}.o").stat().st_size > 0
    queue_dir = Path(seen[0][5]).parent.parent
    log = queue_dir.with_name("queue.log").read_text()
    assert log.count(" go cxx ") == 3 and log.count(" end cxx ") == 3, log
    assert not queue_dir.exists(), "the queue's directory outlived the compile"
    pid_alive = subprocess.run(["pgrep", "-f", str(queue_dir)], capture_output=True).returncode == 0
    assert not pid_alive, "the queue outlived the compile"


def test_install_queue_is_not_the_default_on_a_small_host(tmp_path):
    # Unset (here: empty): the queue only where the host has 16 or more compile jobs; this one has fewer.
    res = run_install(tmp_path, "", extra={"BARRIER_TRIES": "1"})
    assert "behind one queue" not in res.stderr and "at most" in res.stderr
    assert all(line.split("|")[5] == "none" for line in (tmp_path / "seen").read_text().splitlines())



def test_a_queue_that_does_not_start_leaves_nothing_and_bad_slots_are_refused(tmp_path):
    for name in ("compile_queue.py", "compile_costs.json"):
        (tmp_path / name).write_bytes((SCRIPTS / name).read_bytes())
    script = ('if sf_queue_open "$1" 4 /bin/false; then echo opened; else echo refused; fi; '
              'echo "env=${#SF_QUEUE_ENV[@]} pid=$SF_QUEUE_PID"; ls -A "$SF_STATE"')
    res = sf(script, str(tmp_path / "queue"), env={"SF_STATE": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    assert "refused" in res.stdout and "env=0 pid=\n" in res.stdout
    assert sorted(res.stdout.split("\n", 2)[2].split()) == ["compile_costs.json", "compile_queue.py", "queue.log"]
    for bad, shown in (("0", "0"), ("x", "x"), ("12345", "12345"), ("4\x1b[2J", "4?[2J")):
        res = sf('sf_queue_open "$1" "$2" /bin/false', str(tmp_path / "queue"), bad, env={"SF_STATE": str(tmp_path)})
        assert res.returncode == 1 and f"got '{shown}'" in res.stderr and "\x1b" not in res.stderr, res.stderr
