# slimeforge step library: the per-step shell logic shared by the image build (every Dockerfile RUN
# goes through /opt/slimeforge/sf, which sources this file) and the bare-metal install.sh (which
# includes this file verbatim), so both paths run identical code.
#
# Every function fails closed: `set -euo pipefail` is on, loops check each item, and a problem
# prints one "slimeforge: ERROR:" line that names the step, patch or file before exiting non-zero.
# SF_STATE is where records live (/opt/slimeforge in images, <prefix>/.slimeforge on hosts).
# shellcheck shell=bash
set -euo pipefail

SF_STATE=${SF_STATE:-/opt/slimeforge}

# A CA bundle for TLS-intercepting egress proxies: the image build mounts the host's bundle as a
# BuildKit secret (never stored in a layer, not part of any cache key); hosts set SF_CA_BUNDLE.
if [[ -n ${SF_CA_BUNDLE:-} && -s $SF_CA_BUNDLE ]]; then
  export SSL_CERT_FILE=$SF_CA_BUNDLE PIP_CERT=$SF_CA_BUNDLE REQUESTS_CA_BUNDLE=$SF_CA_BUNDLE GIT_SSL_CAINFO=$SF_CA_BUNDLE
  export UV_NATIVE_TLS=1
fi

# pip is given only local files or files by sha256, yet a host's pip configuration (find-links,
# constraints, extra indexes, a target directory) would still steer it: the steps read none of it.
export PIP_CONFIG_FILE=/dev/null
unset PIP_FIND_LINKS PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_CONSTRAINT PIP_REQUIREMENT PIP_NO_INDEX PIP_PRE \
  PIP_ONLY_BINARY PIP_NO_BINARY PIP_TARGET PIP_PREFIX PIP_USER PIP_REQUIRE_VIRTUALENV

sf_log() { printf 'slimeforge: %s\n' "$*" >&2; }
# sf_phase STEP PHASE: marks where a phase of a step begins (PHASE "end": where the last one ends),
# with the wall clock, so that benchmarks/store_hit_bench.py can split a step into its phases.
sf_phase() { printf 'slimeforge: phase %s %s %s\n' "$1" "$2" "${EPOCHREALTIME/,/.}" >&2; }
sf_die() { printf 'slimeforge: ERROR: %s\n' "$*" >&2; exit 1; }
# _sf_printable < TEXT: text another program wrote (a compiler, uv, a package's build) as it may reach
# a terminal, line by line: control characters (C0, DEL, C1 in UTF-8), line separators and
# bidirectional controls each become '?', a tab a space (schema.printable's rule, in sed).
_sf_printable() {
  LC_ALL=C sed -e 's/\t/ /g' -e 's/[[:cntrl:]]/?/g' -e 's/\xc2[\x80-\x9f]/?/g' -e 's/\xe2\x80[\x8e\x8f\xa8-\xae]/?/g' \
    -e 's/\xe2\x81[\xa6-\xa9]/?/g' -e 's/\xd8\x9c/?/g'
}

# _sf_script NAME: the path of a slimeforge/scripts/ file the library runs with a venv's Python:
# $SF_STATE/NAME where the image and install.sh put it, else beside this library in a checkout
# (templates/../slimeforge/scripts/: tests, patches.check).
_sf_script() {
  local here=${BASH_SOURCE[0]%/*}
  if [[ -f $SF_STATE/$1 ]]; then printf '%s\n' "$SF_STATE/$1"
  elif [[ -f $here/../slimeforge/scripts/$1 ]]; then printf '%s\n' "$here/../slimeforge/scripts/$1"
  else sf_die "$1 is missing from $SF_STATE (the image and install.sh put it there)"; fi
}

# git refuses repositories owned by another user (bind-mounted build contexts, a user's checkout
# read by root); these repositories are read, never trusted for hooks or config.
sf_git() { git -c safe.directory='*' -c advice.detachedHead=false "$@"; }

# --- system packages ------------------------------------------------------------------------

_sf_dpkg_has() { dpkg-query -W -f='${Status}' -- "$1" 2>/dev/null | grep -q "install ok installed"; }

_sf_apt_get() {
  if [[ $(id -u) -ne 0 ]]; then
    sf_die "apt packages missing: $* (as root: apt-get install -y $*)"
  fi
  if [[ -f /etc/apt/apt.conf.d/docker-clean ]]; then rm -f /etc/apt/apt.conf.d/docker-clean; fi
  echo 'Binary::apt::APT::Keep-Downloaded-Packages "true";' >/etc/apt/apt.conf.d/99slimeforge-keep
  apt-get update -qq
  # SF_DPKG_UNSAFE_IO=1 (the image's apt steps only): dpkg without an fsync per file. A build that
  # stops discards its layer, so the syncs buy nothing there (Docker's own Debian and Ubuntu images
  # set the same); a host keeps them.
  local dpkg=()
  if [[ ${SF_DPKG_UNSAFE_IO:-0} == 1 ]]; then dpkg=(-o Dpkg::Options::=--force-unsafe-io); fi
  # `--`: a package name is never read as an option (the stack's grammar refuses a leading '-' too).
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ${dpkg[@]+"${dpkg[@]}"} -- "$@"
}

# _sf_python_ok PY: PY runs, has venv/ensurepip, and the headers extensions compile against.
_sf_python_ok() {
  "$1" -c 'import ensurepip, os, sys, sysconfig, venv
sys.exit(0 if os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)' >/dev/null 2>&1
}

# sf_system [--python PY] [--python-package PKG]... [--need SPEC]... : the system step. The stack's
# packages, each checked first: present when dpkg knows it, or when what it provides is here (a host
# whose git, compilers or Python come from elsewhere: conda, modules, pyenv, another distro).
#   SPEC = PKG:COMMANDS:FILES:DNF[:optional] (comma lists): every command on PATH, and one of the
#   files, shows PKG is there; DNF names it on RHEL-like hosts. With no COMMANDS and FILES, only dpkg
#   can tell. An optional package (it only makes things faster) is installed where apt can, and
#   otherwise named and skipped.
# The interpreter (PY, a name on PATH or a path) is never installed when it is there with venv and
# its headers: the --python-package list (python3.12, -venv, -dev) is asked of apt only otherwise.
# Without apt (RHEL, Rocky, Amazon Linux), nothing is installed: what is missing is listed with its
# apt and dnf names, and the step stops.
sf_system() {
  local python="" pypkgs=() needs=()
  while (($#)); do
    case $1 in
      --python) python=$2; shift 2 ;;
      --python-package) pypkgs+=("$2"); shift 2 ;;
      --need) needs+=("$2"); shift 2 ;;
      --) shift; break ;;
      *) sf_die "sf_system: unknown option $1" ;;
    esac
  done
  local have_apt=0 spec pkg cmds files dnf opt c f ok missing=() dnf_missing=() unknown=() optional=()
  if command -v apt-get >/dev/null && command -v dpkg-query >/dev/null; then have_apt=1; fi
  for spec in "${needs[@]}"; do
    IFS=: read -r pkg cmds files dnf opt <<<"$spec"
    if ((have_apt)) && _sf_dpkg_has "$pkg"; then continue; fi
    ok=0
    if [[ -n $cmds || -n $files ]]; then
      ok=1
      for c in ${cmds//,/ }; do command -v "$c" >/dev/null || ok=0; done
      if [[ -n $files ]]; then
        local any=0
        for f in ${files//,/ }; do [[ -e $f ]] && any=1; done
        ((any)) || ok=0
      fi
    elif ((!have_apt)); then
      unknown+=("$pkg")
      continue
    fi
    ((ok)) && continue
    if [[ $opt == optional ]]; then optional+=("$pkg"); continue; fi
    missing+=("$pkg")
    dnf_missing+=("${dnf//,/ }")
  done
  if ((${#optional[@]})) && { ((!have_apt)) || [[ $(id -u) -ne 0 ]]; }; then
    sf_log "system: optional, not installed (no apt-get here, or not root): ${optional[*]}; the install goes on without them"
    optional=()
  fi
  missing+=("${optional[@]}")
  if [[ -n $python ]]; then
    if _sf_python_ok "$python"; then
      sf_log "system: $python is there with venv and its headers ($(command -v "$python")): no interpreter is installed"
    else
      missing+=("${pypkgs[@]}")
      dnf_missing+=("${python##*/}" "${python##*/}-devel")
    fi
  fi
  if ((${#missing[@]} == 0 && ${#unknown[@]} == 0)); then sf_log "system: all required packages present"; return 0; fi
  if ((!have_apt)); then
    local msg="system: this host has no apt-get, and these are missing: ${missing[*]:-} (apt names)"
    ((${#missing[@]})) && msg+="; on RHEL, Rocky or Amazon Linux: dnf install -y ${dnf_missing[*]}"
    ((${#unknown[@]})) && msg+="; cannot be checked without dpkg: ${unknown[*]}"
    [[ -n $python ]] && msg+="; or name an interpreter that has venv and its headers: invoke install --python /path/to/${python##*/}"
    sf_die "$msg"
  fi
  _sf_apt_get "${missing[@]}"
}

# --- the venv -------------------------------------------------------------------------------

# sf_venv VENV UV_VERSION PYTHON SLICE: creates the venv with the stack's interpreter, called by its
# version (python3.12): a CUDA base has no python3, and on a host python3 may be another version.
# SLICE: the venv step's slice of the lock, `uv @ URL --hash=sha256:H`: the pinned uv is that one
# wheel, hash-checked (pip --require-hashes), never a file an index picks by version.
# The venv gets an identity when it is made ($VENV/slimeforge-venv.id, 32 random hex digits): a
# step's done record names it (sf_step_proof), so a venv removed or made again is never taken for
# the one the steps installed into. A venv whose python no longer runs (its interpreter removed or
# upgraded under it) is made again, with a new identity.
sf_venv() {
  local venv=$1 uv_version=$2 python=${3:-python3} slice=${4:-}
  if [[ -e $venv/bin/python || -L $venv/bin/python ]] && ! "$venv/bin/python" -I -c '' >/dev/null 2>&1; then
    # --clear empties the directory: only one that is a venv (its pyvenv.cfg), never another's.
    [[ -f $venv/pyvenv.cfg ]] || sf_die "venv: $venv/bin/python does not run and $venv has no pyvenv.cfg (not a venv): move it away, or name another --venv"
    sf_log "venv: $venv/bin/python does not run: the venv is made again (every step after it runs again)"
    command -v "$python" >/dev/null || sf_die "venv: $python not found (the system step installs it; on a host: apt-get install $python $python-venv $python-dev)"
    "$python" -m venv --clear "$venv"
    _sf_venv_new_id "$venv"
  elif [[ ! -x $venv/bin/python ]]; then
    command -v "$python" >/dev/null || sf_die "venv: $python not found (the system step installs it; on a host: apt-get install $python $python-venv $python-dev)"
    "$python" -m venv "$venv"
    _sf_venv_new_id "$venv"
  elif [[ -z $(_sf_venv_id "$venv") ]]; then
    _sf_venv_new_id "$venv"  # a venv made before venvs had an identity: from now on it has one
  fi
  [[ -n $slice && -f $slice ]] || sf_die "venv: its slice of the lock (${slice:-none given}) is missing"
  local have=""
  if [[ -x $venv/bin/uv ]]; then have=$("$venv/bin/uv" --version | awk '{print $2}'); fi
  if [[ $have != "$uv_version" ]]; then
    "$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps --require-hashes -r "$slice" ||
      sf_die "venv: the pinned uv $uv_version could not be installed from its slice of the lock ($slice: $(grep -m1 '^[^#]' "$slice" | _sf_printable | cut -c1-200))"
  fi
  mkdir -p "$SF_STATE/constraints" "$SF_STATE/lock"
  cp -- "$slice" "$SF_STATE/lock/venv.txt"
}

_sf_venv_new_id() {
  local id
  id=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  [[ $id =~ ^[0-9a-f]{32}$ ]] || sf_die "venv: no random identity could be read from /dev/urandom"
  printf '%s\n' "$id" >"$1/.slimeforge-venv.id.tmp.$$"
  mv -f -- "$1/.slimeforge-venv.id.tmp.$$" "$1/slimeforge-venv.id"
}

# _sf_venv_id VENV: the venv's identity, printed only while its python runs and its id file is a
# regular file of the grammar sf_venv writes; nothing otherwise (no venv, a removed or broken one).
_sf_venv_id() {
  local file="$1/slimeforge-venv.id" id=""
  [[ -f $file && ! -L $file && $(stat -c %s -- "$file" 2>/dev/null) == 33 ]] || return 0
  IFS= read -r id <"$file" || return 0
  [[ $id =~ ^[0-9a-f]{32}$ ]] || return 0
  "$1/bin/python" -I -c '' >/dev/null 2>&1 || return 0
  printf '%s\n' "$id"
}

# --- what a step's "done" stands for (install.sh) ---------------------------------------------
# A step's record, $SF_STATE/steps/NAME.done, is three lines: the step's hash (its inputs, chained),
# `proof P` and `run R`. P is sha256 over what the step left behind, as it is when the record is
# written: the venv's identity (steps from the venv step on), the sha256 of its slice of the lock,
# and each of its outputs (a file by its sha256, a directory by its git HEAD, or its absence). A
# re-run takes the step as done only while P is what is there now, and, for a step with a slice,
# every distribution of the slice is installed at its version (venvlock.py present): a removed or
# remade venv, an uninstalled package or a deleted checkout runs the step again. R is random, new
# each time the step runs: the smoke test's record names every step's record (sf_smoke_record), so a
# step that ran since is seen by content, whatever the files' mtimes say.

# sf_step_proof VENV SLICE [OUTPUT...]: P (VENV or SLICE empty: not part of it).
sf_step_proof() {
  local venv=$1 slice=$2 o head
  shift 2
  {
    if [[ -n $venv ]]; then printf 'venv %s\n' "$(_sf_venv_id "$venv")"; fi
    if [[ -n $slice ]]; then
      if [[ -f $slice ]]; then printf 'slice %s\n' "$(sha256sum <"$slice" | cut -d' ' -f1)"; else printf 'slice missing\n'; fi
    fi
    for o in "$@"; do
      if [[ -L $o ]]; then printf 'link %s\n' "$(readlink -- "$o" | sha256sum | cut -d' ' -f1)"
      elif [[ -f $o ]]; then printf 'file %s\n' "$(sha256sum <"$o" | cut -d' ' -f1)"
      elif [[ -d $o ]]; then
        head=""
        if [[ -e $o/.git ]]; then head=$(sf_git -C "$o" rev-parse -q --verify HEAD 2>/dev/null || true); fi
        printf 'dir %s\n' "${head:-plain}"
      elif [[ -e $o ]]; then printf 'other\n'
      else printf 'missing\n'; fi
    done
  } | sha256sum | cut -d' ' -f1
}

# sf_record_clear FILE: a record about to be written again is removed; a directory at its name is
# not ours to remove (and `mv` would move the new record into it): the install stops naming it.
sf_record_clear() {
  if [[ -d $1 && ! -L $1 ]]; then sf_die "$1 is a directory, not a record slimeforge writes: move it away and run again"; fi
  rm -f -- "$1"
}

# sf_done_write FILE HASH PROOF: the record, written whole (a temporary name, then renamed).
sf_done_write() {
  local file=$1 run
  [[ $2 =~ ^[A-Za-z0-9._-]{1,128}$ ]] || sf_die "done record: '$2' is not a step hash"
  [[ $3 =~ ^[0-9a-f]{64}$ ]] || sf_die "done record: '$3' is not a sha256"
  run=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  sf_record_clear "$file"
  printf '%s\nproof %s\nrun %s\n' "$2" "$3" "$run" >"$file.tmp.$$"
  mv -fT -- "$file.tmp.$$" "$file"
}

# sf_done_holds FILE HASH PROOF [VENV SLICE]: succeeds when FILE is the record of a run with HASH
# whose proof is PROOF (what is there now: sf_step_proof) and, given VENV and SLICE, every
# distribution of the slice is installed at its version. A record that does not hold is said
# (stderr); one of another hash, or none, is silent: the step runs.
sf_done_holds() {
  local file=$1 hash=$2 proof=$3 venv=${4:-} slice=${5:-} lines=() out
  [[ -n $hash && -f $file && ! -L $file ]] || return 1
  (($(stat -c %s -- "$file" 2>/dev/null || echo 9999) <= 512)) || return 1
  mapfile -t -n 4 lines <"$file" || return 1
  [[ ${#lines[@]} -ge 1 && ${lines[0]} == "$hash" ]] || return 1
  if [[ ${#lines[@]} != 3 || ! ${lines[1]} =~ ^proof\ [0-9a-f]{64}$ || ! ${lines[2]} =~ ^run\ [0-9a-f]{32}$ ]]; then
    sf_log "${file##*/}: not a done record of this version (no proof of what the step left): the step runs again"
    return 1
  fi
  if [[ ${lines[1]} != "proof $proof" ]]; then
    sf_log "${file##*/}: what the step left is not there as it was (the venv, its slice, an output or an earlier step changed or is gone): the step runs again"
    return 1
  fi
  if [[ -n $venv && -n $slice ]] && grep -q '^[^#]' "$slice" 2>/dev/null; then
    if ! out=$("$venv/bin/python" -I "$(_sf_script venvlock.py)" present "$slice" 2>&1); then
      printf '%s\n' "$out" | head -n 20 >&2
      sf_log "${file##*/}: a distribution of its slice of the lock is missing or at another version: the step runs again"
      return 1
    fi
  fi
  return 0
}

# --- installs from the lock -----------------------------------------------------------------
# Every install is one step's slice of the flavor's lock (images/locks/pylock.<flavor>.toml), a
# requirements file of `name @ URL --hash=sha256:H  # ==VERSION` lines that slimeforge renders:
# uv fetches exactly those files, checks their hashes and resolves nothing (--no-deps), so a build
# a month later installs the same bytes. Each step's slice is kept in $SF_STATE/lock/<step>.txt;
# after the step, what the venv holds is compared with the slices so far (sf_lock_verify).

# sf_uv VENV ARGS...: `uv pip install` into VENV (no index configuration: every file is named).
sf_uv() {
  local venv=$1
  shift
  "$venv/bin/uv" pip install --python "$venv/bin/python" "$@"
}

# sf_lock_install VENV STEP FILE [--find-links DIR]: install one step's slice. With a wheel
# directory the lines are `name==version --hash=...` and the same files come from DIR (air-gapped hosts).
sf_lock_install() {
  local venv=$1 step=$2 file=$3
  shift 3
  [[ -f $file ]] || sf_die "step $step: its slice of the lock ($file) is missing"
  mkdir -p "$SF_STATE/lock"
  cp -- "$file" "$SF_STATE/lock/$step.txt"
  if ! grep -q '^[^#]' "$file"; then sf_log "step $step: nothing of its own in the lock (earlier steps installed it)"; return 0; fi
  local args=(--no-deps --no-build-isolation --no-index --require-hashes "$@")
  # Wheels first, then the sdists (after the marker line that slimeforge writes): a build without
  # isolation compiles against what the wheels installed.
  local wheels="$SF_STATE/lock/.$step.wheels" sdists="$SF_STATE/lock/.$step.sdists"
  awk -v w="$wheels" -v s="$sdists" 'BEGIN{o=w} /^# --- built from source/{o=s} {print > o}' "$file"
  touch "$wheels" "$sdists"
  # --reinstall-package for each wheel the venv already holds (a re-run on a host): it is fetched
  # and hash-checked again, never taken as it is (uv checks nothing of an installed package). Not
  # --reinstall for all: uv takes it as --refresh, and a fresh venv's wheels were downloaded again
  # though uv's cache held them; a cached archive is taken only when the sha256 uv recorded when it
  # downloaded it is the lock's --hash. Not for the sdists: that would recompile them (hours for
  # flash-attn); their hash was checked when they were built.
  if grep -q '^[^#]' "$wheels"; then
    local present=()
    mapfile -t present < <(_sf_installed_of "$venv" "$wheels")
    sf_phase "$step" install
    _sf_uv_slice "$venv" "$step" "$wheels" "${args[@]}" "${present[@]/#/--reinstall-package=}"
  fi
  if grep -q '^[^#]' "$sdists"; then
    # A compiled step with a store directory (sf_compiled --wheels/--wheel-out): the sdists become
    # wheels there once, and are installed from there as wheels.
    if [[ -n ${SF_COMPILED_WHEELS:-} ]]; then
      if [[ ${SF_COMPILED_MODE:-} == make ]]; then
        local src="$SF_STATE/lock/.$step.src"
        _sf_fetch_locked "$venv" "$step" "$sdists" "$src" "$@"
        _sf_store_make "$venv" "$step" "$src"/*
        rm -rf -- "$src"
      fi
      # The compile phase of pieces compiled side by side: the wheels only; the install comes after.
      if [[ ${SF_COMPILED_ONLY:-} != 1 ]]; then _sf_store_install "$venv" "$step" "$(grep -c '^[^#]' "$sdists")"; fi
    else
      _sf_uv_slice "$venv" "$step" "$sdists" "${args[@]}"
    fi
  fi
  rm -f -- "$wheels" "$sdists"
}

# _sf_installed_of VENV FILE: the names of FILE's requirement lines (`name @ URL ...`, `name==V ...`)
# that VENV holds a distribution of (a *.dist-info directory), one per line, normalized (PEP 503).
_sf_installed_of() {
  local venv=$1 file=$2 d n line
  local -A have=()
  for d in "$venv"/lib/python*/site-packages/*.dist-info; do
    [[ -d $d ]] || continue
    n=${d##*/}
    n=${n%%-*}
    n=${n,,}
    have[${n//[_.]/-}]=1
  done
  while IFS= read -r line; do
    [[ $line =~ ^([A-Za-z0-9][A-Za-z0-9._-]*)[[:space:]]*(@|==) ]] || continue
    n=${BASH_REMATCH[1],,}
    n=${n//[_.]/-}
    if [[ -n ${have[$n]:-} ]]; then printf '%s\n' "$n"; fi
  done <"$file"
}

_sf_uv_slice() {
  local venv=$1 step=$2 file=$3 out what
  shift 3
  if ! out=$(sf_uv "$venv" "$@" -r "$file" 2>&1); then
    printf '%s\n' "$out" >&2
    _sf_explain_uv_failure "$step" "$out"
  fi
  printf '%s\n' "$out" >&2
}

# _sf_first_error < OUTPUT: the compiler's first error (gcc's file:line: error, nvcc's file(line): error),
# else the first other error line that is not the installer's own wrapping.
_sf_first_error() {
  local out
  out=$(cat)
  printf '%s\n' "$out" | grep -m1 -E '[^ :]+:[0-9]+:([0-9]+:)? (fatal )?error:|\([0-9]+\): (catastrophic )?error:' ||
    printf '%s\n' "$out" | grep -v -E 'subprocess-exited-with-error|metadata-generation-failed|failed-wheel-build' | grep -m1 -E '(^|[^A-Za-z_])error:' ||
    true
}

# _sf_explain_uv_failure STEP OUTPUT: one true sentence for what failed: a hash mismatch speaks of
# the lock's sha256, a download of the network, a build of the compiler (its first error line).
_sf_explain_uv_failure() {
  local step=$1 out=$2 what first
  # shellcheck disable=SC2016 # the backticks are uv's quotes, matched literally
  what=$(printf '%s\n' "$out" | sed -n 's/.*Hash mismatch for `\([A-Za-z0-9._-]*\).*/\1/p' | sort -u | paste -sd' ')
  if [[ -n $what ]]; then
    sf_die "step $step: $what differs from its sha256 in the lock (a changed or corrupted file): refused"
  fi
  # shellcheck disable=SC2016
  what=$(printf '%s\n' "$out" | sed -n 's/.*Failed to \(build\|prepare metadata for\) `\([A-Za-z0-9._-]*\).*/\2/p' | sort -u | paste -sd' ')
  if [[ -n $what ]]; then
    first=$(printf '%s\n' "$out" | _sf_first_error)
    sf_die "step $step: $what failed to compile${first:+: $first} (the compiler's output is above)"
  fi
  # shellcheck disable=SC2016
  what=$(printf '%s\n' "$out" | sed -n 's/.*Failed to \(download\|fetch\) `\([A-Za-z0-9._-]*\).*/\2/p' | sort -u | paste -sd' ')
  if [[ -n $what ]]; then
    sf_die "step $step: $what cannot be fetched (network, proxy or CA bundle: SF_CA_BUNDLE); see above"
  fi
  # Otherwise uv's own cause (a full disk, a permission) is the line to read.
  what=$(printf '%s\n' "$out" | sed -n 's/^ *Caused by: *//p' | tail -n 1)
  sf_die "step $step: installing its slice of the lock failed: ${what:-$(printf '%s\n' "$out" | grep -m1 -iE 'error' || printf '%s\n' "$out" | tail -n 1)}"
}

# sf_lock_verify VENV STEP [--exact]: what the venv holds is exactly what the lock's slices so far
# allow: a package outside them, or at another version, fails naming it and the step. --exact
# (finalize) also fails on a locked package that is missing. Checkouts installed by a source step
# (a file:// direct_url) and the venv's own pip and uv are the only other distributions allowed.
sf_lock_verify() {
  local venv=$1 step=$2 exact=${3:-}
  sf_phase "$step" verify
  # -I: only the venv's own paths (not the working directory, not PYTHONPATH) are looked at.
  "$venv/bin/python" -I "$(_sf_script venvlock.py)" verify "$SF_STATE/lock" "$step" ${exact:+"$exact"}
  sf_phase "$step" end
}

# sf_pip_step --venv V --step NAME --lock FILE [--find-links DIR]: one `pip` (or wheel) step of the
# stack: its slice of the lock, then the check that nothing else came in or moved.
sf_pip_step() {
  local venv="" step="" lock=""
  local args=()
  while (($#)); do
    case $1 in
      --venv) venv=$2; shift 2 ;;
      --step) step=$2; shift 2 ;;
      --lock) lock=$2; shift 2 ;;
      --find-links) args+=(--find-links "$2"); shift 2 ;;
      *) sf_die "sf_pip_step: unknown option $1" ;;
    esac
  done
  [[ -n $venv && -n $step && -n $lock ]] || sf_die "sf_pip_step: --venv, --step and --lock are required"
  sf_lock_install "$venv" "$step" "$lock" "${args[@]}"
  if [[ ${SF_COMPILED_ONLY:-} != 1 ]]; then
    # In the step that installs them: a later RUN cannot shrink this layer (venvprune.py says what and why).
    if grep -q '^# prune: ' "$lock"; then
      sf_phase "$step" prune
      "$venv/bin/python" -I "$(_sf_script venvprune.py)" prune "$SF_STATE" "$step" "$lock" || sf_die "step $step: the prune failed (above)"
    fi
    sf_lock_verify "$venv" "$step"
  fi
}

# --- compiled steps -------------------------------------------------------------------------

# sf_compile_jobs CORES MEM_KIB: "MAX_JOBS NVCC_THREADS" for a build host, the rule of
# slimeforge.image.builder.compilejobs.compile_jobs (image builds get its result as build args; hosts compute it here):
# about 6 GiB per nvcc job, never more jobs than cores, the spare cores to nvcc threads (at most 4).
# apex splits its share further (sf_apex_jobs, below); measured figures in docs/build.md.
sf_compile_jobs() {
  local cores=$1 mem_kib=$2 jobs threads
  jobs=$((mem_kib / (6 * 1024 * 1024)))
  ((jobs <= cores)) || jobs=$cores
  ((jobs >= 1)) || jobs=1
  threads=$((cores / jobs))
  ((threads <= 4)) || threads=4
  ((threads >= 1)) || threads=1
  printf '%s %s\n' "$jobs" "$threads"
}

# sf_compile_share PIECES CORES MEM_KIB: "AT_ONCE MAX_JOBS NVCC_THREADS" for PIECES compiled steps that
# compile side by side, the rule of slimeforge.image.builder.compilejobs.compile_share: at most as many at
# once as the host has jobs (sf_compile_jobs), each given the per-piece rule on its share (the
# memory divided, rounded down; the cores divided, rounded up).
sf_compile_share() {
  local pieces=$1 cores=$2 mem_kib=$3 host at_once
  host=$(sf_compile_jobs "$cores" "$mem_kib")
  at_once=${host% *}
  ((pieces >= at_once)) || at_once=$pieces
  ((at_once >= 1)) || at_once=1
  printf '%s %s\n' "$at_once" "$(sf_compile_jobs $(((cores + at_once - 1) / at_once)) $((mem_kib / at_once)))"
}

# --- one pool of job slots for the pieces that compile side by side ---------------------------
# A GNU make jobserver: a FIFO holding one byte per free job slot. Every piece's ninja (1.13 and later
# are jobserver clients; torch's extension builder runs ninja for apex, Transformer Engine's torch
# extension and flash-attn) takes a slot for each job it runs and gives it back when the job ends, so
# cores that one piece leaves idle (it is done, or waits on its one long file) go to the others.
# Not the default: on the 16-core GPU host its best (40 slots) tied the fixed shares of sf_compile_share
# (196.0 s against 198.1 s), and a pool of the host's jobs alone was slower (245 s). ninja takes a slot
# only when it is about to start a job, so a ninja that finds the pool empty runs one job at a time:
# the pool serves whoever asks first (apex's ninjas), not the longest files (TE, 1 file of 28 in 200 s).
# install.sh uses it with SF_COMPILE_POOL=1; benchmarks/compile_bench.py --set jobserver measures it.
# Figures in docs/build.md "Compile parallelism".

# sf_jobserver_plan CORES MEM_KIB: "SLOTS APEX_PARALLEL_BUILD NVCC_THREADS", the rule of
# slimeforge.image.builder.compilejobs.jobserver_plan: two and a half slots per host job
# (sf_compile_jobs), at most one per 3 GiB; apex builds as many extensions at once as the host has jobs.
sf_jobserver_plan() {
  local host jobs slots
  host=$(sf_compile_jobs "$1" "$2")
  jobs=${host% *}
  slots=$((5 * jobs / 2))
  ((slots <= $2 / (3 * 1024 * 1024))) || slots=$(($2 / (3 * 1024 * 1024)))
  ((slots >= 1)) || slots=1
  printf '%s %s %s\n' "$slots" "$jobs" "${host#* }"
}

# _sf_ninja_ok NINJA: NINJA answers --version with 1.13 or later (compilejobs.ninja_takes_jobserver).
_sf_ninja_ok() {
  local v
  v=$("$1" --version 2>/dev/null) || return 1
  [[ $v =~ ^([0-9]{1,4})\.([0-9]{1,4}) ]] || return 1
  ((10#${BASH_REMATCH[1]} > 1 || (10#${BASH_REMATCH[1]} == 1 && 10#${BASH_REMATCH[2]} >= 13)))
}

# _sf_ninja_shim PATH: writes the `ninja` that the pieces find first on PATH. It takes one slot for
# ninja's own first job (a jobserver client runs one job without a slot: make's rule, where whoever
# starts a client holds a slot for it), drops any -j (torch passes `-j MAX_JOBS` when MAX_JOBS is
# set, flash-attn sets MAX_JOBS itself, and an explicit -j turns ninja's jobserver client off), and
# gives the slot back when ninja ends. ninja itself reads MAKEFLAGS for the pool.
_sf_ninja_shim() {
  cat >"$1" <<'SHIM'
#!/usr/bin/env bash
# slimeforge (steps.sh _sf_ninja_shim): ninja under the compiled set's one pool of job slots.
set -u
case ${1:-} in --version | -t | -h | --help) exec "$SF_NINJA_REAL" "$@" ;; esac
args=() skip=0
for a in "$@"; do
  if ((skip)); then skip=0; continue; fi
  case $a in -j) skip=1 ;; -j*) ;; *) args+=("$a") ;; esac
done
exec 9<>"$SF_JOBSERVER" || exit 1
slot=""
IFS= read -r -n1 -d '' slot <&9 || exit 1
trap 'printf %s "$slot" >&9' EXIT
trap 'exit 143' TERM INT HUP
"$SF_NINJA_REAL" ${args[@]+"${args[@]}"} 9>&-
SHIM
  chmod 755 "$1"
}

# sf_jobserver_open DIR SLOTS NINJA: a pool of SLOTS job slots in DIR (a FIFO this shell holds open
# for as long as the pool lives: a FIFO drops what it holds once nobody has it open), and the
# environment that hands it to a piece in SF_JOBSERVER_ENV (MAKEFLAGS, the shim first on PATH).
# Fails, leaving nothing, when NINJA is older than 1.13 (no jobserver client).
# shellcheck disable=SC2034  # SF_JOBSERVER_ENV: read by install.sh's sf_run_together
SF_JOBSERVER_FD="" SF_JOBSERVER_ENV=()
sf_jobserver_open() {
  local dir=$1 slots=$2 ninja=$3 i
  if ! [[ $slots =~ ^[0-9]{1,4}$ ]] || ((10#$slots < 1)); then sf_die "job pool: its slots (MAX_JOBS when given) must be a whole number from 1 to 9999, got '$(printf '%s' "${slots:0:40}" | _sf_printable)'"; fi
  _sf_ninja_ok "$ninja" || return 1
  rm -rf -- "$dir"
  mkdir -p -- "$dir" && chmod 700 -- "$dir" && mkdir -m 700 -- "$dir/bin"
  mkfifo -m 600 -- "$dir/slots"
  exec {SF_JOBSERVER_FD}<>"$dir/slots"
  for ((i = 0; i < 10#$slots; i++)); do printf +; done >&"$SF_JOBSERVER_FD"
  _sf_ninja_shim "$dir/bin/ninja"
  SF_JOBSERVER_ENV=("SF_JOBSERVER=$dir/slots" "SF_NINJA_REAL=$ninja" "MAKEFLAGS=-j$((10#$slots)) --jobserver-auth=fifo:$dir/slots"
    "PATH=$dir/bin:$PATH")
}

# sf_jobserver_close: the pool's FIFO closed (its slots are gone with it).
sf_jobserver_close() {
  if [[ -n $SF_JOBSERVER_FD ]]; then exec {SF_JOBSERVER_FD}>&-; fi
  # shellcheck disable=SC2034  # read by install.sh's sf_run_together
  SF_JOBSERVER_FD="" SF_JOBSERVER_ENV=()
}

# --- one queue in front of every compiler of the pieces that compile side by side -------------
# slimeforge/scripts/compile_queue.py, run with the venv's Python: every piece at once, every ninja
# with all its files at once (MAX_JOBS=64, apex's extensions all at once), each compile waiting in
# the queue, at most SLOTS at a time, a freed slot going to the costliest file waiting (the measured
# table compile_costs.json, else nvcc's files before the host compiler's). torch's extension builder
# runs the queue's wrappers as its compilers (CXX, PYTORCH_NVCC). The default on hosts of 16 or more
# compile jobs: measured there 1.11-1.15 x the cores' limit against 1.20-1.21 for the fixed shares
# and the pools (docs/build.md "A queue in front of every compiler"); smaller hosts keep the shares.

# sf_queue_plan CORES MEM_KIB: "SLOTS NVCC_THREADS", the rule of
# slimeforge.image.builder.compilejobs.queue_plan: the host's jobs (sf_compile_jobs) and three eighths
# more, at most one per 3 GiB.
sf_queue_plan() {
  local host jobs slots
  host=$(sf_compile_jobs "$1" "$2")
  jobs=${host% *}
  slots=$((jobs + 3 * jobs / 8))
  ((slots <= $2 / (3 * 1024 * 1024))) || slots=$(($2 / (3 * 1024 * 1024)))
  ((slots >= 1)) || slots=1
  printf '%s %s\n' "$slots" "${host#* }"
}

# sf_queue_open DIR SLOTS PYTHON: the queue served from DIR (made new by the queue, removed first when
# a former run left it: DIR is this run's own) by PYTHON, its pid in SF_QUEUE_PID and what hands it
# to a piece in SF_QUEUE_ENV (CXX and PYTORCH_NVCC: the wrappers; SF_COMPILE_QUEUE=1). The queue stands
# for the compilers a piece would find (CXX or c++; PYTORCH_NVCC, CUDA_HOME, nvcc on PATH or
# /usr/local/cuda), so it starts with a piece's PATH (the venv's tools first). Fails, leaving nothing
# running, when the queue does not answer in 30 s; its messages are in DIR.log.
# shellcheck disable=SC2034  # SF_QUEUE_ENV: read by install.sh's sf_run_together
SF_QUEUE_PID="" SF_QUEUE_DIR="" SF_QUEUE_ENV=()
sf_queue_open() {
  local dir=$1 slots=$2 python=$3 i parts=()
  if ! [[ $slots =~ ^[0-9]{1,4}$ ]] || ((10#$slots < 1)); then sf_die "compile queue: its slots (MAX_JOBS when given) must be a whole number from 1 to 9999, got '$(printf '%s' "${slots:0:40}" | _sf_printable)'"; fi
  rm -rf -- "$dir"
  PATH="$(dirname "$python"):$PATH" "$python" "$(_sf_script compile_queue.py)" serve "$dir" "$((10#$slots))" \
    "$(_sf_script compile_costs.json)" >"$dir.ready" 2>"$dir.log" &
  SF_QUEUE_PID=$! SF_QUEUE_DIR=$dir
  for ((i = 0; i < 300; i++)); do
    if [[ $(tail -c 6 "$dir.ready" 2>/dev/null) == ready ]]; then break; fi
    kill -0 "$SF_QUEUE_PID" 2>/dev/null || break
    sleep 0.1
  done
  mapfile -d '' -t parts <"$dir.ready" 2>/dev/null || parts=()
  if [[ $(tail -c 6 "$dir.ready" 2>/dev/null) != ready || ${parts[0]:-} != CXX=* || ${parts[1]:-} != PYTORCH_NVCC=* ]]; then
    sf_queue_close
    return 1
  fi
  SF_QUEUE_ENV=("${parts[0]}" "${parts[1]}" SF_COMPILE_QUEUE=1)
}

# _sf_queue_wrappers VENV KEY: a compile stage of an image whose build serves one queue for all its stages
# (invoke build's wheels-only build: `docker build --ssh sf-queue=...`, the stage's RUN mounting that
# socket at $SF_COMPILE_QUEUE_SOCK): the wrappers for this container's compilers, made here, exported
# as the piece's CXX and PYTORCH_NVCC with SF_COMPILE_QUEUE=1. Every compile then waits in the build
# host's queue, beside the other stages' (each stage is a container of its own).
_sf_queue_wrappers() {
  local venv=$1 key=$2 dir parts=()
  [[ -S $SF_COMPILE_QUEUE_SOCK ]] || sf_die "compiled step: SF_COMPILE_QUEUE_SOCK=$SF_COMPILE_QUEUE_SOCK is no socket (the build forwards the queue with --ssh sf-queue=SOCKET)"
  dir="$SF_STATE/queue-wrappers/$key"
  rm -rf -- "$dir"
  mkdir -p -- "${dir%/*}"
  mapfile -d '' -t parts < <("$venv/bin/python" "$(_sf_script compile_queue.py)" wrappers "$dir" "$SF_COMPILE_QUEUE_SOCK")
  # CXX, then PYTORCH_NVCC where this container has an nvcc, then "ready".
  local n=${#parts[@]}
  if ((n < 2 || n > 3)) || [[ ${parts[0]} != CXX=* || ${parts[n - 1]} != ready* ]] ||
    { ((n == 3)) && [[ ${parts[1]} != PYTORCH_NVCC=* ]]; }; then
    # A missing queue costs the order, never the build (as a wrapper that cannot reach it).
    sf_log "compiled step: the compile queue's wrappers could not be made in $dir (see above): compiling without the queue"
    return 0
  fi
  export "${parts[@]:0:${#parts[@]}-1}" SF_COMPILE_QUEUE=1
}

# sf_queue_close: the queue stopped (by its pid) and its directory removed; its log stays.
sf_queue_close() {
  if [[ -n $SF_QUEUE_PID ]]; then
    kill "$SF_QUEUE_PID" 2>/dev/null || true
    wait "$SF_QUEUE_PID" 2>/dev/null || true
  fi
  if [[ -n $SF_QUEUE_DIR ]]; then rm -rf -- "$SF_QUEUE_DIR" "$SF_QUEUE_DIR.ready"; fi
  # shellcheck disable=SC2034  # read by install.sh's sf_run_together
  SF_QUEUE_PID="" SF_QUEUE_DIR="" SF_QUEUE_ENV=()
}

# --- the compiled-wheel store (slimeforge/image/wheels/wheelstore.py) -------------------------------------
# A store entry is a directory of wheels and SHA256SUMS (`sha256sum` format, one line per wheel).
# The store's own record: the compiled wheels do not exist when the lock is made, so their sha256
# is not in the lock; it is checked here before anything is installed from the directory.

# _sf_store_make VENV STEP [--config-settings KEY=VALUE]... INPUT... (local inputs: sdist files or a
# checkout): compile each into $SF_COMPILED_WHEELS with build_wheel.py (the backend's build_wheel
# called once, no build isolation: against the torch already installed; pip wheel would run the
# piece's setup.py twice, metadata first) with the network cut off where this host allows
# (_sf_offline), and write its SHA256SUMS.
_sf_store_make() {
  local venv=$1 step=$2 dir=$SF_COMPILED_WHEELS clog first input settings=() inputs=()
  shift 2
  while (($#)); do
    case $1 in
      --config-settings) settings+=(--config-settings "$2"); shift 2 ;;
      *) inputs+=("$1"); shift ;;
    esac
  done
  ((${#inputs[@]})) || sf_die "step $step: nothing to compile"
  mkdir -p -- "$dir" "$SF_STATE/logs"
  clog="$SF_STATE/logs/compile-$step.log"
  : >"$clog"
  sf_log "step $step: compiling into $dir (store key ${SF_COMPILED_KEY:-?}; compiler output: $clog)"
  # No cache of built wheels here: the per-key store is the only one (a cache by the input's path
  # would be the same for every torch, CUDA and arch list).
  # The backend's output, ninja's "[N/M] command" status lines among it, goes into $clog as it
  # comes; those lines, cut short, stream to the step's output as well, where the install's
  # heartbeat and `invoke build` read the compile's progress. Not the whole output while it runs:
  # BuildKit keeps 2 MiB of a step's output, and the step's ERROR line must come within it.
  for input in "${inputs[@]}"; do
    if ! _sf_offline "$venv/bin/python" "$(_sf_script build_wheel.py)" --wheel-dir "$dir" \
      --work "$SF_STATE/compiled-src/$step" ${settings[@]+"${settings[@]}"} -- "$input" 2>&1 | tee -a -- "$clog" |
      { LC_ALL=C grep --line-buffered -oE '^[[:space:]]*\[[0-9]{1,7}/[0-9]{1,7}\] .{0,100}' || true; } >&2; then
      tail -n 40 "$clog" >&2
      first=$(_sf_first_error <"$clog")
      sf_die "step $step: ${input##*/} failed to compile${first:+: $first} (full output: $clog)"
    fi
  done
  rm -rf -- "$SF_STATE/compiled-src/$step"
  # Its output, as far as it stays well within BuildKit's 2 MiB (a compile's is long).
  if (($(wc -c <"$clog") > 262144)); then sf_log "step $step: the last 256 KiB of its compiler output (all of it: $clog):"; fi
  tail -c 262144 -- "$clog" >&2
  (cd -- "$dir" && sha256sum -- *.whl >SHA256SUMS) || sf_die "step $step: no wheel was built in $dir"
}

# _sf_offline CMD...: CMD in a network namespace of its own (`unshare --net`: only loopback, which
# is down) where this host permits it (root, or a builder that may unshare), so that no setup.py
# fetches a binary the lock does not name, whatever its defaults. Elsewhere (an image build's RUN
# may not unshare) CMD runs as it is, and says so.
_sf_offline() {
  if [[ ${SF_COMPILE_OFFLINE:-1} != 0 ]] && unshare --net -- true 2>/dev/null; then
    sf_log "compiling with no network (unshare --net)"
    unshare --net -- "$@"
  else
    sf_log "compiling with the network reachable (unshare --net is not permitted here); every input was fetched by its sha256 first"
    "$@"
  fi
}

# _sf_fetch_locked VENV STEP FILE DIR [--find-links DIR]: every line of FILE (`name @ URL
# --hash=sha256:H`, or `name==V --hash=sha256:H` found in a --find-links directory) fetched into
# DIR and checked against H, so that the compile that follows needs no network.
_sf_fetch_locked() {
  local venv=$1 step=$2 file=$3 dir=$4
  shift 4
  local links=()
  while (($#)); do
    case $1 in --find-links) links+=("$2"); shift 2 ;; *) shift ;; esac
  done
  rm -rf -- "$dir"
  mkdir -p -- "$dir"
  "$venv/bin/python" -I "$(_sf_script venvlock.py)" fetch "$step" "$file" "$dir" "${links[@]}" ||
    sf_die "step $step: fetching its sources from the lock failed (see above)"
}

# _sf_sums_line LINE: a SHA256SUMS line by its grammar (wheelstore.py's SUMS_LINE_RE, held to it by a
# pair test): sets SF_SUM_SHA and SF_SUM_FILE, or fails.
_sf_sums_line() {
  [[ $1 =~ ^([0-9a-f]{64})\ \ ([A-Za-z0-9_.+-]{1,200}\.whl)$ ]] || return 1
  SF_SUM_SHA=${BASH_REMATCH[1]} SF_SUM_FILE=${BASH_REMATCH[2]}
}

# _sf_store_install VENV STEP COUNT: install the wheels of $SF_COMPILED_WHEELS, each by its recorded
# sha256, with --no-build: nothing can compile here. COUNT: the wheels the step must find there.
_sf_store_install() {
  local venv=$1 step=$2 count=$3 dir=$SF_COMPILED_WHEELS line reqs=() n=0
  [[ -f $dir/SHA256SUMS ]] || sf_die "step $step: store entry $dir has no SHA256SUMS record"
  sf_phase "$step" store-check
  (cd -- "$dir" && sha256sum --check --strict --quiet SHA256SUMS) ||
    sf_die "step $step: a wheel in $dir differs from its sha256 record: refused (remove the entry and compile again)"
  while IFS= read -r line; do
    _sf_sums_line "$line" || sf_die "step $step: bad line in $dir/SHA256SUMS: ${line:0:200}"
    reqs+=("$dir/$SF_SUM_FILE --hash=sha256:$SF_SUM_SHA")
    n=$((n + 1))
  done <"$dir/SHA256SUMS"
  ((n == count)) || sf_die "step $step: store entry $dir holds $n wheel(s), the step builds $count"
  local req="$SF_STATE/lock/.$step.store"
  mkdir -p -- "$SF_STATE/lock"
  printf '%s\n' "${reqs[@]}" >"$req"
  sf_log "step $step: installing $n compiled wheel(s) from the store ($dir, sha256 verified); nothing is compiled"
  sf_phase "$step" install
  sf_uv "$venv" --no-deps --no-index --no-build --require-hashes -r "$req"
  rm -f -- "$req"
}

# sf_compiled --key KEY [--wheels DIR | --wheel-out DIR] -- FUNCTION ARGS...: runs one step function that compiles extensions.
# --wheels DIR: a store hit: the step installs DIR's wheels (checked against SHA256SUMS), compiles nothing.
# --wheel-out DIR: the step compiles its wheels into DIR (for the store), then installs them.
# Parallelism: MAX_JOBS / NVCC_THREADS as given (image: build args), else sized to this host; nvcc
# gets --threads through NVCC_APPEND_FLAGS (apex, torch_memory_saver), flash-attn reads NVCC_THREADS,
# Transformer Engine NVTE_BUILD_THREADS_PER_JOB. apex (its step sets APEX_CPP_EXT/APEX_CUDA_EXT)
# builds APEX_PARALLEL_BUILD extensions at once (given, else sf_apex_jobs), each with its own MAX_JOBS.
# Parallelism is never part of a step's env: that env is part of the key. The uv cache is the one of KEY (steps.compiled_key):
# a wheel compiled for one flavor, torch, CUDA, arch list, Python or base is never reused by another.
# SF_COMPILED_PHASE (set by whoever runs pieces side by side, never part of the key): `compile` compiles
# the wheels into their directory and installs none of them; `install` installs the wheels that the
# compile phase left there, as a store hit does (or compiles here, when they are not there).
sf_compiled() {
  local key="" wheels="" mode="" venv="" scratch=0
  while (($#)); do
    case $1 in
      --key) key=$2; shift 2 ;;
      --venv) venv=$2; shift 2 ;;
      --wheels) wheels=$2 mode=use; shift 2 ;;
      --wheel-out) wheels=$2 mode=make; shift 2 ;;
      --) shift; break ;;
      *) sf_die "sf_compiled: unknown option $1" ;;
    esac
  done
  [[ $key =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || sf_die "sf_compiled: --key must be a compiled-wheel key, got '$key'"
  (($#)) || sf_die "sf_compiled: no step function given"
  if [[ -z ${MAX_JOBS:-} || -z ${NVCC_THREADS:-} ]]; then
    local sized
    sized=$(sf_compile_jobs "$(nproc)" "$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)")
    MAX_JOBS=${MAX_JOBS:-${sized% *}} NVCC_THREADS=${NVCC_THREADS:-${sized#* }}
  fi
  # Given values (build args, the environment) by grammar, then read base 10: bash takes 010 as
  # octal and 08 as an error, and arithmetic on other text evaluates it.
  local n
  for n in MAX_JOBS NVCC_THREADS ${APEX_PARALLEL_BUILD:+APEX_PARALLEL_BUILD}; do
    if [[ ! ${!n} =~ ^[0-9]{1,4}$ ]] || ((10#${!n} < 1)); then
      sf_die "compiled step: $n must be a whole number from 1 to 9999 in ASCII digits, got '${!n}'"
    fi
    printf -v "$n" '%d' "$((10#${!n}))"
  done
  if [[ -n ${SF_COMPILE_QUEUE_SOCK:-} && ${SF_COMPILE_QUEUE:-} != 1 && ${SF_COMPILED_PHASE:-} == compile && -n $venv ]]; then
    _sf_queue_wrappers "$venv" "$key"
  fi
  # Behind the compile queue (SF_COMPILE_QUEUE=1) every extension's ninja starts all its files and
  # the queue bounds them: apex keeps the given MAX_JOBS and APEX_PARALLEL_BUILD.
  if [[ -n ${APEX_CPP_EXT:-}${APEX_CUDA_EXT:-} && ${SF_COMPILE_QUEUE:-} != 1 ]]; then
    local apex
    apex=$(sf_apex_jobs "$MAX_JOBS")
    APEX_PARALLEL_BUILD=${APEX_PARALLEL_BUILD:-${apex% *}} MAX_JOBS=${apex#* }
    export APEX_PARALLEL_BUILD
  fi
  export MAX_JOBS NVCC_THREADS NVTE_BUILD_THREADS_PER_JOB=$NVCC_THREADS
  export NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS:+$NVCC_APPEND_FLAGS }--threads $NVCC_THREADS"
  export UV_CACHE_DIR="${UV_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/uv}/compiled/$key"
  sf_log "compiled step: MAX_JOBS=$MAX_JOBS NVCC_THREADS=$NVCC_THREADS${APEX_PARALLEL_BUILD:+ APEX_PARALLEL_BUILD=$APEX_PARALLEL_BUILD}${SF_JOBSERVER:+ (every ninja job from the pool $SF_JOBSERVER)}${SF_COMPILE_QUEUE:+ (every compile behind the queue ${CXX%/bin/*})} archs=${TORCH_CUDA_ARCH_LIST:-none} uv cache $UV_CACHE_DIR"
  if [[ -n $venv ]]; then
    _sf_compile_env "$venv"
    # The venv's tools first, as the image's PATH has them: torch's extension builder runs `ninja` from
    # PATH and, finding none (a host without a system ninja; the install does not require one), falls
    # back to compiling each extension's files one after another, MAX_JOBS unused. The build-tools step
    # puts the lock's ninja in the venv. (The pool's shim, when SF_COMPILE_POOL=1, stays before it.)
    if [[ -n ${SF_JOBSERVER:-} && $PATH == "${SF_JOBSERVER%/slots}/bin:"* ]]; then
      PATH="${SF_JOBSERVER%/slots}/bin:$venv/bin:${PATH#"${SF_JOBSERVER%/slots}/bin:"}"
    else
      PATH="$venv/bin:$PATH"
    fi
    export PATH
  fi
  # Without the store, the wheels are compiled into a scratch directory all the same: one way to
  # compile (the inputs fetched by sha256 first, then compiled with no network), then installed.
  if [[ -z $wheels ]]; then wheels="$SF_STATE/compiled/$key" mode=make scratch=1; fi
  case ${SF_COMPILED_PHASE:-} in
    "") ;;
    compile)
      [[ $mode == make ]] || { sf_log "compiled step: its wheels come from the store: nothing to compile"; return 0; }
      export SF_COMPILED_ONLY=1
      scratch=0 ;;  # kept for the install phase
    install)
      if [[ $mode == make && -f $wheels/SHA256SUMS ]]; then mode=use
      elif [[ $mode == make ]]; then sf_log "compiled step: no wheels from a compile phase in $wheels: compiling them here"; fi ;;
    *) sf_die "compiled step: SF_COMPILED_PHASE must be compile or install, got '${SF_COMPILED_PHASE:0:40}'" ;;
  esac
  export SF_COMPILED_WHEELS=$wheels SF_COMPILED_MODE=$mode SF_COMPILED_KEY=$key
  if [[ $mode == make ]]; then rm -rf -- "$wheels"; fi
  local fn=$1
  shift
  if [[ ${SF_COMPILED_PHASE:-} == compile ]]; then
    mkdir -p -- "$wheels"
    "sf_$fn" "$@"
    # A step with nothing to compile (an empty slice) leaves an empty record: the install phase
    # then finds the directory (an image bind-mounts it) and installs nothing from it.
    if [[ ! -f $wheels/SHA256SUMS ]]; then : >"$wheels/SHA256SUMS"; fi
    return 0
  fi
  "sf_$fn" "$@"
  if ((scratch)); then rm -rf -- "$wheels"; fi
}

# _sf_compile_env VENV: what the compiled pieces include and link that a toolkit of nvcc alone
# (NVIDIA's wheels, conda's cuda-nvcc, a CUDA runtime base) lacks: cusparse.h, cublas_v2.h, nccl.h,
# cudnn.h ... ship in the venv's NVIDIA wheels (site-packages/nvidia/*/include and */lib). They go
# on CPATH / LIBRARY_PATH, which compilers search after the build's own -I/-L (the toolkit's), so a
# full toolkit still wins. Where no driver is installed (a build host, an image build), a stub
# libcuda.so (soname libcuda.so.1, no code) is made to link against; at run time the driver's own
# libcuda.so.1 is what loads.
_sf_compile_env() {
  local venv=$1 site d inc=() lib=() cuda_home=${CUDA_HOME:-/usr/local/cuda}
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || sf_die "compiled step: $venv/bin/python does not run"
  for d in "$site"/nvidia/*/include; do if [[ -d $d ]]; then inc+=("$d"); fi; done
  for d in "$site"/nvidia/*/lib; do if [[ -d $d ]]; then lib+=("$d"); fi; done
  if ! { /sbin/ldconfig -p 2>/dev/null || ldconfig -p 2>/dev/null; } | grep -q 'libcuda\.so ' &&
    [[ ! -e $cuda_home/lib64/stubs/libcuda.so && ! -e $cuda_home/lib64/libcuda.so ]]; then
    if [[ ! -e $SF_STATE/stubs/libcuda.so ]]; then
      mkdir -p -- "$SF_STATE/stubs"
      # Made under a name of its own, then renamed: pieces compiled side by side may both make it.
      gcc -shared -Wl,-soname,libcuda.so.1 -x c /dev/null -o "$SF_STATE/stubs/.libcuda.so.$$.$BASHPID" ||
        sf_die "compiled step: no libcuda.so here (no driver, no toolkit stubs) and gcc could not make a stub"
      mv -f -- "$SF_STATE/stubs/.libcuda.so.$$.$BASHPID" "$SF_STATE/stubs/libcuda.so"
    fi
    lib+=("$SF_STATE/stubs")
    # The stub defines no symbol, so the linker's default --as-needed would drop it and the
    # extension would not name libcuda.so.1 at all ("undefined symbol: cuMemCreate" at import, found
    # by the kernel check on an H100). setuptools and torch's extension builder add LDFLAGS to links.
    export LDFLAGS="${LDFLAGS:+$LDFLAGS }-Wl,--no-as-needed"
    sf_log "compiled step: no NVIDIA driver here: linking against a stub libcuda.so ($SF_STATE/stubs, --no-as-needed)"
  fi
  local joined
  if ((${#inc[@]})); then joined=$(IFS=:; printf '%s' "${inc[*]}"); export CPATH="$joined${CPATH:+:$CPATH}"; fi
  if ((${#lib[@]})); then joined=$(IFS=:; printf '%s' "${lib[*]}"); export LIBRARY_PATH="$joined${LIBRARY_PATH:+:$LIBRARY_PATH}"; fi
  sf_log "compiled step: headers and libraries of the venv's NVIDIA wheels on CPATH/LIBRARY_PATH (${#inc[@]} and ${#lib[@]} dirs)"
}

# --- sources --------------------------------------------------------------------------------

# sf_fetch_source NAME URL COMMIT DEST: DEST is a checkout of exactly COMMIT (fetched shallow).
sf_fetch_source() {
  local name=$1 url=$2 commit=$3 dest=$4 head
  if [[ -d $dest/.git ]] && head=$(sf_git -C "$dest" rev-parse HEAD 2>/dev/null) && [[ $head == "$commit" ]]; then
    sf_log "source $name: $dest is already at $commit"
    return 0
  fi
  if [[ -e $dest && ! -d $dest/.git ]]; then
    sf_die "source $name: $dest exists and is not a git checkout; move it away"
  fi
  if [[ ! -d $dest/.git ]]; then sf_git init -q -- "$dest"; fi
  # `--`: a URL such as --upload-pack=... is an operand, never an option of git fetch.
  sf_git -C "$dest" fetch -q --depth 1 -- "$url" "$commit" || sf_die "source $name: cannot fetch commit $commit from $url"
  sf_git -C "$dest" checkout -q --force FETCH_HEAD
  head=$(sf_git -C "$dest" rev-parse HEAD)
  [[ $head == "$commit" ]] || sf_die "source $name: $dest is at $head, not the pinned $commit"
  sf_log "source $name: $dest at $commit"
}

# --- patches --------------------------------------------------------------------------------

# The files a failed `git apply` / `patch` names, one per line.
_sf_failed_files() {
  sed -n -e 's/^error: patch failed: \(.*\):[0-9]*$/\1/p' \
    -e 's/^error: \(.*\): patch does not apply$/\1/p' \
    -e 's/^error: \(.*\): does not exist in index$/\1/p' \
    -e 's/^error: \(.*\): No such file or directory$/\1/p' \
    -e 's/^U \(.*\)$/\1/p' | sort -u
}

_sf_patch_failed_files() {
  awk '/^patching file /{f=substr($0,15)} /FAILED|saving rejects|No file to patch/{if (f!="") print f}' | sort -u
}

_sf_record_patch() {
  local name=$1 file=$2 dir=$3 status=$4
  mkdir -p "$SF_STATE"
  printf '%s\t%s\t%s\t%s\n' "$name" "$(sha256sum "$file" | awk '{print $1}')" "$dir" "$status" >>"$SF_STATE/patches.applied"
}

# sf_apply_patch NAME METHOD STRIP FILE DIR: applies, or recognises as already applied, or stops.
#   git:   `git apply --check` then `git apply --3way`; any `<<<<<<< ` marker left is a failure.
#   patch: `patch -p<STRIP> --dry-run` then apply (SGLang's wheel: paths a/python/sglang/...).
#          --fuzz=0: a hunk whose context differs is a failure, never a guess.
#   Already applied: the reverse check passes.
sf_apply_patch() {
  local name=$1 method=$2 strip=$3 file=$4 dir=$5 out files
  [[ -f $file ]] || sf_die "patch $name: patch file $file is missing"
  [[ -d $dir ]] || sf_die "patch $name: target directory $dir does not exist"
  case $method in
    git)
      if out=$(sf_git -C "$dir" apply -p"$strip" --check "$file" 2>&1); then
        out=$(sf_git -C "$dir" apply -p"$strip" --3way "$file" 2>&1) || {
          files=$(printf '%s\n' "$out" | _sf_failed_files | paste -sd' ')
          sf_die "patch $name does not apply to $dir (files: ${files:-see output}): $out"
        }
      elif sf_git -C "$dir" apply -p"$strip" --reverse --check "$file" >/dev/null 2>&1; then
        sf_log "patch $name: already applied to $dir"
        _sf_record_patch "$name" "$file" "$dir" already-applied
        return 0
      else
        files=$(printf '%s\n' "$out" | _sf_failed_files | paste -sd' ')
        sf_die "patch $name does not apply to $dir (files: ${files:-see output}): $out"
      fi
      local touched marked=()
      while IFS= read -r touched; do
        [[ -n $touched && -f $dir/$touched ]] || continue
        if grep -q '^<<<<<<< ' "$dir/$touched"; then marked+=("$touched"); fi
      done < <(sf_git -C "$dir" apply -p"$strip" --numstat "$file" 2>/dev/null | cut -f3)
      ((${#marked[@]} == 0)) || sf_die "patch $name left conflict markers in $dir: ${marked[*]}"
      ;;
    patch)
      # Already applied: the reverse check passes, with --force (--batch would take a patch that is
      # not applied for a reversed one and call it applied). A re-installed package gets its own
      # files back, but a file the patch created stays behind and blocks the patch: it is removed
      # when it is exactly what the patch creates (_sf_drop_created_files), and the patch applied.
      if out=$(patch -d "$dir" -p"$strip" --fuzz=0 --forward --batch --dry-run -i "$file" 2>&1) ||
        { ! _sf_reverse_check "$strip" "$file" "$dir" && _sf_drop_created_files "$name" "$strip" "$file" "$dir" &&
          out=$(patch -d "$dir" -p"$strip" --fuzz=0 --forward --batch --dry-run -i "$file" 2>&1); }; then
        out=$(patch -d "$dir" -p"$strip" --fuzz=0 --forward --batch -i "$file" 2>&1) || {
          files=$(printf '%s\n' "$out" | _sf_patch_failed_files | paste -sd' ')
          sf_die "patch $name does not apply to $dir (files: ${files:-see output}): $out"
        }
      elif _sf_reverse_check "$strip" "$file" "$dir"; then
        sf_log "patch $name: already applied to $dir"
        _sf_record_patch "$name" "$file" "$dir" already-applied
        return 0
      else
        files=$(printf '%s\n' "$out" | _sf_patch_failed_files | paste -sd' ')
        sf_die "patch $name does not apply to $dir (files: ${files:-see output}): $out"
      fi
      ;;
    *) sf_die "patch $name: unknown method $method (git or patch)" ;;
  esac
  # The bytecode of each file it changed goes (install.sh compiles bytecode ahead of the import
  # pass, before this step): a .pyc is checked against its source's mtime and size alone, and a
  # patched file of the same size written within the same second would pass that check.
  local rel
  while IFS= read -r rel; do
    if [[ $rel == *.py && $rel != */* ]]; then rm -f -- "$dir/__pycache__/${rel%.py}".*.pyc
    elif [[ $rel == *.py ]]; then rm -f -- "$dir/${rel%/*}/__pycache__/$(basename -- "${rel%.py}")".*.pyc; fi
  done < <(_sf_patch_paths "$strip" "$file")
  sf_log "patch $name: applied to $dir"
  _sf_record_patch "$name" "$file" "$dir" applied
}

_sf_reverse_check() { patch -d "$3" -p"$1" --fuzz=0 --reverse --force --dry-run -i "$2" >/dev/null 2>&1; }

# _sf_drop_created_files NAME STRIP FILE DIR: the files the patch creates (`--- /dev/null`) that lie in
# DIR with exactly the content the patch gives them are removed (a leftover of this patch, applied
# before the package was re-installed); succeeds when it removed any. One with other content stops.
_sf_drop_created_files() {
  local name=$1 strip=$2 file=$3 dir=$4 scratch rel removed=1
  scratch=$(mktemp -d)
  # Applied to an empty directory, the patch creates exactly its new files (the other hunks fail).
  patch -d "$scratch" -p"$strip" --force --batch -i "$file" >/dev/null 2>&1 || true
  while IFS= read -r rel; do
    [[ -f $scratch/$rel && -f $dir/$rel ]] || continue
    if cmp -s -- "$scratch/$rel" "$dir/$rel"; then
      rm -f -- "$dir/$rel"
      sf_log "patch $name: removed $rel, left by an earlier application of this patch (the package was re-installed)"
      removed=0
    else
      rm -rf -- "$scratch"
      sf_die "patch $name: $dir/$rel exists with content the patch does not give it; move it away"
    fi
  done < <(awk -v n="$strip" '/^--- \/dev\/null/ {getline; p = $2; sub(/\t.*/, "", p)
      for (i = 0; i < n; i++) sub(/^[^\/]*\//, "", p); print p}' "$file")
  rm -rf -- "$scratch"
  return "$removed"
}

# sf_patches_applied NAME:METHOD:STRIP:FILE:DIR...: succeeds when every patch is present. Patches of
# one directory are checked as the stack they are: several touch the same files (slime's four
# sglang patches share nine), so one alone no longer reverses once later ones are applied. The
# files they touch are copied to a scratch directory, and the patches reversed there for real, last
# applied first; each must reverse cleanly (--fuzz=0). The installed tree is never changed.
sf_patches_applied() {
  local spec pname method strip file dir dirs=() failed=0
  for spec in "$@"; do
    IFS=: read -r pname method strip file dir <<<"$spec"
    [[ " ${dirs[*]-} " == *" $dir "* ]] || dirs+=("$dir")
  done
  local d scratch touched i specs
  for d in "${dirs[@]}"; do
    specs=()
    for spec in "$@"; do IFS=: read -r pname method strip file dir <<<"$spec"; [[ $dir == "$d" ]] && specs+=("$spec"); done
    scratch=$(mktemp -d)
    for spec in "${specs[@]}"; do
      IFS=: read -r pname method strip file dir <<<"$spec"
      [[ -f $file ]] || { printf 'slimeforge: ERROR: smoke: patch file %s is missing\n' "$file" >&2; failed=1; continue; }
      while IFS= read -r touched; do
        [[ -n $touched && -f $d/$touched ]] || continue
        mkdir -p -- "$scratch/$(dirname -- "$touched")"
        cp -p -- "$d/$touched" "$scratch/$touched"
      done < <(_sf_patch_paths "$strip" "$file")
    done
    for ((i = ${#specs[@]} - 1; i >= 0; i--)); do
      IFS=: read -r pname method strip file dir <<<"${specs[i]}"
      [[ -f $file ]] || continue
      if _sf_reverse_patch "$method" "$strip" "$file" "$scratch"; then
        sf_log "smoke: patch $pname present in $d"
      else
        printf 'slimeforge: ERROR: smoke: patch %s is not present in %s (reversing it, after the ones applied after it, failed)\n' "$pname" "$d" >&2
        failed=1
      fi
    done
    rm -rf -- "$scratch"
  done
  ((failed == 0)) || return 1
}

# _sf_patch_paths STRIP FILE: the paths a unified or git diff touches, less STRIP leading parts.
_sf_patch_paths() {
  local strip=$1 file=$2
  awk -v n="$strip" '/^(\+\+\+|---) / {
      p = $2; sub(/\t.*/, "", p); if (p == "/dev/null") next
      for (i = 0; i < n; i++) sub(/^[^\/]*\//, "", p)
      print p }' "$file" | sort -u
}

_sf_reverse_patch() {
  local method=$1 strip=$2 file=$3 dir=$4
  case $method in
    # Outside a repository, git apply patches the working directory's files; the ceiling keeps git
    # from finding a repository above the scratch directory.
    git) (cd -- "$dir" && GIT_CEILING_DIRECTORIES=${dir%/*} sf_git apply -p"$strip" --reverse "$file") >/dev/null 2>&1 ;;
    # --force, not --batch: batch mode takes a patch that is not applied for a reversed one, and applies it.
    patch) patch -d "$dir" -p"$strip" --fuzz=0 --reverse --force -i "$file" >/dev/null 2>&1 ;;
    *) return 1 ;;
  esac
}

# --- one source step ------------------------------------------------------------------------

# sf_source_step --venv V --step S --name N --url U --commit C --dest D [--patch NAME:METHOD:STRIP:FILE]...
#                [--lock FILE] [--editable] [--no-deps] [--config-setting K=V]...
# Fetch at the commit, apply its patches (before installing: a non-editable install copies the
# files), install its slice of the lock (its requirements), then the checkout itself without
# build isolation (the compiled extensions build against the torch already installed) and
# without dependencies (the lock holds them), then check the venv against the lock.
sf_source_step() {
  local venv="" step="" name="" url="" commit="" dest="" lock="" editable=0
  local patches=() settings=()
  while (($#)); do
    case $1 in
      --venv) venv=$2; shift 2 ;;
      --step) step=$2; shift 2 ;;
      --name) name=$2; shift 2 ;;
      --url) url=$2; shift 2 ;;
      --commit) commit=$2; shift 2 ;;
      --dest) dest=$2; shift 2 ;;
      --patch) patches+=("$2"); shift 2 ;;
      --lock) lock=$2; shift 2 ;;
      --editable) editable=1; shift ;;
      --config-setting) settings+=(--config-setting "$2"); shift 2 ;;
      *) sf_die "sf_source_step: unknown option $1" ;;
    esac
  done
  [[ -n $step ]] || step=$name
  sf_phase "$step" fetch
  sf_fetch_source "$name" "$url" "$commit" "$dest"
  if [[ ${SF_COMPILED_MODE:-} == make ]]; then
    # A compile starts from the pinned commit alone: pip builds a checkout in place, and setuptools
    # takes an extension in build/ for up to date when its sources did not change, so a re-run (new
    # flags, another torch) would ship the old binary. The checkout is slimeforge's own.
    sf_git -C "$dest" reset -q --hard
    sf_git -C "$dest" clean -q -xdf
    sf_log "source $name: reset to $commit, untracked and build files removed: the compile starts clean"
  fi
  local spec pname method strip file
  sf_phase "$step" patch
  for spec in "${patches[@]}"; do
    IFS=: read -r pname method strip file <<<"$spec"
    sf_apply_patch "$pname" "$method" "$strip" "$file" "$dest"
  done
  # The slice holds the checkout's requirements, never the store's wheels (those are the checkout's).
  if [[ -n $lock ]]; then SF_COMPILED_WHEELS="" sf_lock_install "$venv" "$step" "$lock"; fi
  sf_phase "$step" install
  # The checkout is pinned by its commit, not by a hash uv could check: no --require-hashes here.
  local args=(--no-deps --no-build-isolation --no-index "${settings[@]}")
  if [[ -n ${SF_COMPILED_WHEELS:-} ]]; then
    ((!editable)) || sf_die "step $step: an editable checkout cannot be installed from the compiled-wheel store"
    if [[ ${SF_COMPILED_MODE:-} == make ]]; then _sf_store_make "$venv" "$step" "${settings[@]/#--config-setting/--config-settings}" "$dest"; fi
    # The compile phase of pieces compiled side by side: the wheel only; the install comes after.
    if [[ ${SF_COMPILED_ONLY:-} == 1 ]]; then return 0; fi
    _sf_store_install "$venv" "$step" 1
    # Installed from a wheel file, not from the checkout's path: sf_lock_verify would not know it as
    # the checkout. Its name and version (from the wheel's file name) join the lock records; it is
    # pinned by the commit it was compiled from (part of the store key).
    local whl
    _sf_sums_line "$(head -n 1 -- "$SF_COMPILED_WHEELS/SHA256SUMS")" || sf_die "step $step: bad first line in $SF_COMPILED_WHEELS/SHA256SUMS"
    whl=$SF_SUM_FILE
    printf '%s==%s\n' "$(cut -d- -f1 <<<"$whl")" "$(cut -d- -f2 <<<"$whl")" >"$SF_STATE/lock/$step.checkout.txt"
  else
    if ((editable)); then args+=(--editable "$dest"); else args+=("$dest"); fi
    # A fresh prefix builds its checkout at other paths than the last prefix did (the checkout, the
    # venv's pybind11 headers), and Python's CFLAGS hold -g, so ccache hashed the working directory
    # too: every fresh install missed (Megatron's helpers, about 12 s on 2 cores). Paths under the
    # directory holding both are hashed relative to the checkout (CCACHE_BASEDIR) and the working
    # directory is left out (CCACHE_NOHASHDIR): the same source, flags and headers hit. Only the
    # object's debug information may then name the first prefix's directory, never its code.
    local base
    base=$(_sf_common_dir "$venv" "$dest")
    if [[ $base != / && -z ${CCACHE_BASEDIR:-} ]]; then
      CCACHE_BASEDIR=$base CCACHE_NOHASHDIR=1 _sf_with_ccache sf_uv "$venv" "${args[@]}"
    else
      _sf_with_ccache sf_uv "$venv" "${args[@]}"
    fi
  fi
  sf_lock_verify "$venv" "$step"
}

# _sf_common_dir A B: the deepest directory holding both paths (their real paths), / at least.
_sf_common_dir() {
  local a b
  a=$(realpath -m -- "$1")/ b=$(realpath -m -- "$2")/
  while [[ ${b#"$a"} == "$b" ]]; do a=${a%/*/}/; done
  a=${a%/}
  printf '%s\n' "${a:-/}"
}

# _sf_with_ccache CMD...: CMD with its C and C++ compiles through ccache where it is installed (the
# system step installs it where apt can). A checkout built in place (Megatron's editable install
# compiles its dataset helpers) compiles again on every image build and fresh install: setuptools
# builds an editable install's extensions in a temporary directory. By ccache's own compiler links
# first on PATH (Debian and Ubuntu: /usr/lib/ccache, RHEL: /usr/lib64/ccache, beside its bin/), the
# build runs the very commands it runs without it (Python's sysconfig CC: gcc, x86_64-linux-gnu-gcc),
# each keyed by its preprocessed source, flags and compiler, so a hit is the same object: on cu13,
# Megatron's install 17.1 s -> 3.5 s. An image build keeps its cache in a BuildKit cache mount.
# ccache only makes a compile faster, so it never makes one fail: before its links go first on
# PATH, one tiny compile goes through them (CCACHE_RECACHE: compiled and stored, never a hit, so the
# cache is written). A cache directory that cannot be written, a bad configuration file or a broken
# ccache fails that compile: ccache steps aside, with a note naming why, and the build compiles as
# it does without it.
_sf_with_ccache() {
  local bin dir why
  if bin=$(command -v ccache); then
    for dir in "${bin%/bin/ccache}/lib/ccache" "${bin%/bin/ccache}/lib64/ccache"; do
      if [[ -x $dir/gcc && -x $dir/g++ ]]; then
        if why=$(_sf_ccache_probe "$dir"); then PATH="$dir:$PATH" "$@"; return; fi
        sf_log "ccache: not used for this compile: a test compile through it failed ($why); compiling without it (fix: a writable CCACHE_DIR, or ccache's config: ccache -p)"
        break
      fi
    done
  fi
  "$@"
}

# _sf_ccache_probe DIR: succeeds when a tiny C compile through DIR's gcc works and writes the cache;
# otherwise prints ccache's first error line (printable, at most 200 characters).
_sf_ccache_probe() {
  local dir=$1 t out rc=0
  t=$(mktemp -d) || { printf 'no temporary directory'; return 1; }
  printf 'int sf_ccache_probe(void) { return 0; }\n' >"$t/probe.c"
  out=$(cd "$t" && CCACHE_RECACHE=1 PATH="$dir:$PATH" timeout 60 gcc -c probe.c -o probe.o 2>&1) || rc=$?
  if ((rc == 0)) && [[ ! -s $t/probe.o ]]; then rc=1 out="no object file was written"; fi
  rm -rf -- "$t"
  ((rc == 0)) && return 0
  out=$(printf '%s\n' "$out" | grep -m1 -i 'error' || printf '%s\n' "$out" | head -n 1)
  out=$(printf '%s' "$out" | LC_ALL=C tr -c '[:print:]' '?')
  printf '%s' "${out:0:200}"
  return 1
}

# --- read back and verify -------------------------------------------------------------------

# sf_finalize VENV LOCK_IN LOCK_OUT FLAGS_OUT [--lock ALL] [--checkout NAME=DIR]... [--slime DIR [--megatron DIR]]
#             [--imports-to DIR [--import M]... [--needs-gpu M]... [--preload M]...]
# Compares what is installed with the whole lock (any difference fails the build), then writes the
# stack lock with what is really installed (importlib.metadata) and the commit of every checkout,
# and the flag catalog of slime's own argument parsers. --imports-to (install.sh): the catalog is
# made in the smoke test's import pass (sf_import_pass, the smoke test's own --import, --needs-gpu
# and --preload), whose results go to DIR for the smoke test right after (sf_smoke --imports-from):
# slime, SGLang and Megatron are imported once for both (on cu13, 2 cores: the catalog's 35 s and
# the imports' 32 s were one after the other). An import that fails there fails the smoke test, not
# finalize; a catalog that cannot be made whole fails finalize, as without --imports-to.
sf_finalize() {
  local venv=$1 lock_in=$2 lock_out=$3 flags_out=$4
  shift 4
  local checkouts=() slime="" megatron="" imports_to="" pass=()
  while (($#)); do
    case $1 in
      --lock) mkdir -p "$SF_STATE/lock" && cp -- "$2" "$SF_STATE/lock/_all.txt"; shift 2 ;;
      --checkout) checkouts+=("$2"); shift 2 ;;
      --slime) slime=$2; shift 2 ;;
      --megatron) megatron=$2; shift 2 ;;
      --imports-to) imports_to=$2; shift 2 ;;
      --import | --needs-gpu | --preload) pass+=("$1" "$2"); shift 2 ;;
      *) sf_die "sf_finalize: unknown option $1" ;;
    esac
  done
  [[ -n $imports_to || -z ${pass[*]-} ]] || sf_die "sf_finalize: --import, --needs-gpu and --preload go with --imports-to"
  sf_lock_verify "$venv" finalize --exact
  # A step re-run on a venv that holds its wheels installs them with --reinstall-package, which uv
  # takes to mean --refresh-package: it fetches them again and leaves the old unpacked copies
  # unreachable in the cache (5 re-runs of cu13 left 54 GiB). Prune what nothing refers to any more:
  # in the background, beside the record and the import pass (2.6 s of the cache's disk on cu13;
  # what the venv holds are its own links to the files), waited for at the end.
  local prune_pid
  ("$venv/bin/uv" cache prune --quiet || sf_log "finalize: uv cache prune failed (the cache keeps its unreachable entries)") &
  prune_pid=$!
  sf_phase finalize record
  local spec commits=()
  for spec in "${checkouts[@]}"; do
    commits+=("${spec%%=*}=$(sf_git -C "${spec#*=}" rev-parse HEAD)")
  done
  "$venv/bin/python" -I "$(_sf_script venvlock.py)" record "$lock_in" "$lock_out" "$SF_STATE/patches.applied" "${commits[@]}" ||
    { wait "$prune_pid" || true; sf_die "finalize: recording what is installed in $lock_out failed (see above)"; }
  if [[ -n $imports_to ]]; then
    sf_phase finalize imports
    local cat=()
    if [[ -n $slime ]]; then cat=(--catalog-out "$flags_out" --slime "$slime" --megatron "$megatron"); fi
    sf_import_pass --venv "$venv" --results "$imports_to" ${pass[@]+"${pass[@]}"} ${cat[@]+"${cat[@]}"}
    if [[ -n $slime ]] && ! _sf_rc_ok "$imports_to/catalog.rc"; then
      _sf_tail "$imports_to/catalog.out" 20 >&2
      wait "$prune_pid" || true
      sf_die "flag catalog: $venv/bin/python could not read slime's parsers in $slime (see above)"
    fi
  elif [[ -n $slime ]]; then sf_phase finalize flags; sf_flag_catalog "$venv" "$slime" "$megatron" "$flags_out"; fi
  sf_phase finalize prune
  wait "$prune_pid" || true
  sf_phase finalize end
}

# _sf_rc_ok FILE: FILE (an exit status the import pass wrote) says 0.
_sf_rc_ok() { [[ -f $1 && ! -L $1 && $(head -c 8 -- "$1") == 0 ]]; }

# _sf_tail FILE N: the last N lines of what a Python printed, as they may reach a terminal.
_sf_tail() { { tail -n "$2" -- "$1" 2>/dev/null || true; } | _sf_printable; }

# sf_import_pass --venv V --results DIR [--import M]... [--needs-gpu M]... [--preload M]...
#                [--catalog-out FILE --slime DIR [--megatron DIR]]
# The smoke test's imports in one pass ($SF_STATE/smoke_imports.py, slimeforge/scripts/): the
# --preload modules imported once, then each module in a child forked from that interpreter (the
# state a fresh `python -c "import torch; import M"` reaches before `import M`), one per core, at most
# 4 (each holds torch, about 1.5 GB); an import the stack marks --needs-gpu is skipped where no GPU
# is present. --catalog-out: the flag catalog is made in the same pass (its import of slime's
# argument module is that module's smoke import, when it is the same import). DIR is made empty;
# then DIR/plan (`import M` or `skip M`, one line per --import, in order), each import's result
# (N.rc, N.out), the catalog's (catalog.rc, catalog.out) and, last, DIR/done. Nothing is reported
# here: _sf_import_report reads DIR.
sf_import_pass() {
  local venv="" dir="" out="" slime="" megatron="" m g need gpu=0 par
  local imports=() needs_gpu=() args=()
  while (($#)); do
    case $1 in
      --venv) venv=$2; shift 2 ;;
      --results) dir=$2; shift 2 ;;
      --import) imports+=("$2"); shift 2 ;;
      --needs-gpu) needs_gpu+=("$2"); shift 2 ;;
      --preload) args+=(--preload "$2"); shift 2 ;;
      --catalog-out) out=$2; shift 2 ;;
      --slime) slime=$2; shift 2 ;;
      --megatron) megatron=$2; shift 2 ;;
      *) sf_die "sf_import_pass: unknown option $1" ;;
    esac
  done
  [[ -n $venv && -n $dir ]] || sf_die "sf_import_pass: --venv and --results are required"
  [[ -f $SF_STATE/smoke_imports.py ]] || sf_die "smoke imports: $SF_STATE/smoke_imports.py is missing"
  rm -rf -- "$dir"
  mkdir -p -- "$dir"
  if sf_gpu_present "$venv"; then gpu=1; fi
  : >"$dir/plan"
  for m in ${imports[@]+"${imports[@]}"}; do
    need=0
    for g in ${needs_gpu[@]+"${needs_gpu[@]}"}; do if [[ $g == "$m" ]]; then need=1; fi; done
    if ((need && !gpu)); then printf 'skip %s\n' "$m" >>"$dir/plan"; else
      printf 'import %s\n' "$m" >>"$dir/plan"
      args+=(--import "$m")
    fi
  done
  if [[ -n $out ]]; then
    [[ -f $SF_STATE/flag_catalog.py ]] || sf_die "flag catalog: $SF_STATE/flag_catalog.py is missing"
    local commit
    commit=$(sf_git -C "$slime" rev-parse HEAD 2>/dev/null) ||
      sf_die "flag catalog: slime at '$slime' is not a git checkout (the catalog records its commit)"
    args+=(--catalog-out "$out" --slime "$slime" --slime-commit "$commit")
    if [[ -n $megatron ]]; then
      commit=$(sf_git -C "$megatron" rev-parse HEAD 2>/dev/null) ||
        sf_die "flag catalog: Megatron at '$megatron' is not a git checkout (the catalog records its commit)"
      args+=(--megatron "$megatron" --megatron-commit "$commit")
    fi
  fi
  par=$(nproc 2>/dev/null || echo 1)
  ((par <= 4)) || par=4
  ((par >= 1)) || par=1
  # The venv alone decides what is imported (not the caller's PYTHONPATH). Bytecode is written (the
  # image sets PYTHONDONTWRITEBYTECODE for its steps; uv installs none): compiled once here, by
  # whichever child imports a module first, and read by every process of a run after.
  PYTHONDONTWRITEBYTECODE="" PYTHONPATH="" "$venv/bin/python" "$SF_STATE/smoke_imports.py" --results "$dir" --jobs "$par" \
    ${args[@]+"${args[@]}"} || sf_die "smoke imports: $SF_STATE/smoke_imports.py failed to run (see above)"
  if [[ -f $dir/seconds ]]; then sf_log "import pass, seconds: $(head -c 2000 -- "$dir/seconds" | _sf_printable)"; fi
  : >"$dir/done"
}

# _sf_pass_of DIR M...: DIR holds a whole pass (sf_import_pass) of exactly the modules M..., in order.
_sf_pass_of() {
  local dir=$1 kind m i=0
  shift
  [[ -d $dir && ! -L $dir && -f $dir/done && -f $dir/plan ]] || return 1
  while read -r kind m; do
    [[ $kind == import || $kind == skip ]] && ((i < $#)) || return 1
    i=$((i + 1))
    [[ $m == "${!i}" ]] || return 1
  done <"$dir/plan"
  ((i == $#))
}

# _sf_import_report DIR: each import of DIR/plan (sf_import_pass), in order: skipped (by name),
# ok, or failed with its last lines; fails when one failed. SF_SKIPPED: the skipped ones.
_sf_import_report() {
  local dir=$1 kind m i=0 failed=0
  SF_SKIPPED=()
  while read -r kind m; do
    if [[ $kind == skip ]]; then
      sf_log "smoke: SKIPPED import $m: it needs a GPU and none is present"
      SF_SKIPPED+=("$m")
      continue
    fi
    if _sf_rc_ok "$dir/$i.rc"; then sf_log "smoke: import $m ok"; else
      printf 'slimeforge: ERROR: smoke: import %s failed: %s\n' "$m" "$(_sf_tail "$dir/$i.out" 3)" >&2
      failed=1
    fi
    i=$((i + 1))
  done <"$dir/plan"
  ((failed == 0))
}

# sf_finalize_smoked FINALIZE_ARGS... -- SMOKE_ARGS...: the image's last step, as install.sh runs
# finalize and the smoke test: finalize's import pass (--imports-to) makes the flag catalog and
# imports the smoke test's modules, writing their bytecode (read by every process of a run); then the
# smoke test (--imports-from) reports that pass and runs its other checks. One set of imports for
# both: side by side, each imported slime, SGLang and Megatron (35-49 s on 2 cores). The smoke test
# runs whatever finalize did, so that every failure is named (a pass that did not finish is not
# taken: the smoke test then imports itself); either failure fails the step, and an image whose smoke
# test failed is never made. The smoke test's arguments hold no --flags: finalize fails when the
# catalog cannot be made whole.
# A BuildKit RUN cannot drop its network on Docker 20.10's builder (no `RUN --network=none`, no
# `unshare --net`), so both send their HTTP to a closed local port through every proxy variable
# (Python's HTTP clients, libcurl and gRPC read them): an import that fetches fails as it would
# offline. `invoke build --verify` runs the smoke test again in a container without a network.
sf_finalize_smoked() {
  local fin=() fin_rc=0 smoke_rc=0 closed=http://127.0.0.1:9
  while (($#)) && [[ $1 != -- ]]; do fin+=("$1"); shift; done
  (($#)) || sf_die "sf_finalize_smoked: '--' and the smoke test's arguments are required"
  shift
  local env=(PYTHONDONTWRITEBYTECODE="" "http_proxy=$closed" "https_proxy=$closed" "HTTP_PROXY=$closed"
    "HTTPS_PROXY=$closed" "all_proxy=$closed" "ALL_PROXY=$closed" "grpc_proxy=$closed" no_proxy="" NO_PROXY="")
  (export "${env[@]}"; sf_finalize "${fin[@]}") || fin_rc=$?
  (export "${env[@]}"; sf_smoke "$@") || smoke_rc=$?
  ((fin_rc == 0)) || printf 'slimeforge: ERROR: finalize failed (exit %s; its error is above)\n' "$fin_rc" >&2
  ((smoke_rc == 0)) || printf 'slimeforge: ERROR: the smoke test failed (exit %s; its errors are above)\n' "$smoke_rc" >&2
  ((fin_rc == 0 && smoke_rc == 0))
}

# sf_flag_catalog VENV SLIME_DIR MEGATRON_DIR OUT: the flag catalog of slime's real parsers (every
# parser slime builds, each option with its parser; not `train.py --help`, which only the last
# parser answers), made by $SF_STATE/flag_catalog.py (slimeforge/scripts/flag_catalog.py) run with
# the venv's Python. MEGATRON_DIR may be empty (a stack without Megatron). No GPU is needed.
sf_flag_catalog() {
  local venv=$1 slime=$2 megatron=$3 out=$4 args=()
  [[ -f $SF_STATE/flag_catalog.py ]] || sf_die "flag catalog: $SF_STATE/flag_catalog.py is missing"
  args=(--slime "$slime" --out "$out" --slime-commit "$(sf_git -C "$slime" rev-parse HEAD)")
  if [[ -n $megatron ]]; then args+=(--megatron "$megatron" --megatron-commit "$(sf_git -C "$megatron" rev-parse HEAD)"); fi
  # PYTHONPATH of the caller must not decide what is imported; no GPU is asked for. Bytecode is
  # written (the image sets PYTHONDONTWRITEBYTECODE for its steps; uv installs none): of the
  # catalog's 34 s on cu13, 20 s is compiling what slime, SGLang and Megatron import, done here once
  # and then read by the smoke test and every process of a run (`import sglang` 15 s -> 7 s).
  PYTHONDONTWRITEBYTECODE="" PYTHONPATH="" CUDA_VISIBLE_DEVICES="" "$venv/bin/python" "$SF_STATE/flag_catalog.py" "${args[@]}" ||
    sf_die "flag catalog: $venv/bin/python could not read slime's parsers in $slime (see above)"
}

# sf_gpu_present VENV: succeeds when an NVIDIA GPU can be used here (a driver that lists one):
# $SF_STATE/kernel_check.py --probe, the one "is there a GPU" of the image and the install.
sf_gpu_present() {
  [[ -f $SF_STATE/kernel_check.py ]] || sf_die "GPU probe: $SF_STATE/kernel_check.py is missing"
  PYTHONPATH="" "$1/bin/python" "$SF_STATE/kernel_check.py" --probe >/dev/null
}

# sf_smoke --venv V [--import M]... [--needs-gpu M]... [--versions LOCK] [--router-marker S]
#          [--torch-cuda X.Y] [--patch NAME:METHOD:STRIP:FILE:DIR]... [--flags FILE --slime DIR [--megatron DIR]]
#          [--flags-made-now] [--imports-from DIR]
# Every check runs; all failures are listed, and any failure fails the smoke test. An import the
# stack marks --needs-gpu is skipped where no GPU is present, by name (printed, and counted in the
# last line), never silently. --versions: each pinned distribution at the lock's version
# (venvlock.py pins). --flags-made-now: finalize made the flag catalog from slime's parsers in this
# same run (install.sh knows), so making it again to compare (half a minute on cu13: slime, SGLang
# and Megatron imported) would compare the same code's output with itself: only its presence is checked.
# --imports-from DIR: finalize's import pass in this same run (sf_finalize --imports-to DIR, with
# this test's --import, --needs-gpu and --preload) imported every module after the last step; its
# results are reported, not made again (a pass that did not finish, or of other modules, is not taken:
# the imports run here). Otherwise the imports run here, in one pass with the flag catalog made
# again to compare (sf_import_pass).
sf_smoke() {
  local venv="" marker="" torch_cuda="" flags="" slime="" megatron="" versions="" failed=0 flags_now=0
  local imports=() patches=() needs_gpu=() preload=() kernels=0 from=""
  while (($#)); do
    case $1 in
      --venv) venv=$2; shift 2 ;;
      --import) imports+=("$2"); shift 2 ;;
      --needs-gpu) needs_gpu+=("$2"); shift 2 ;;
      --preload) preload+=("$2"); shift 2 ;;
      --kernel-check) kernels=1; shift ;;
      --versions) versions=$2; shift 2 ;;
      --router-marker) marker=$2; shift 2 ;;
      --torch-cuda) torch_cuda=$2; shift 2 ;;
      --patch) patches+=("$2"); shift 2 ;;
      --flags) flags=$2; shift 2 ;;
      --slime) slime=$2; shift 2 ;;
      --megatron) megatron=$2; shift 2 ;;
      --flags-made-now) flags_now=1; shift ;;
      --imports-from) from=$2; shift 2 ;;
      *) sf_die "sf_smoke: unknown option $1" ;;
    esac
  done
  local m out gpu=0 pass=() scratch="" fresh="" catalog=0
  sf_phase smoke imports
  if sf_gpu_present "$venv"; then gpu=1; fi
  for m in ${imports[@]+"${imports[@]}"}; do pass+=(--import "$m"); done
  for m in ${needs_gpu[@]+"${needs_gpu[@]}"}; do pass+=(--needs-gpu "$m"); done
  for m in ${preload[@]+"${preload[@]}"}; do pass+=(--preload "$m"); done
  # A pass without the catalog cannot stand for a test that must compare it.
  if [[ -n $from && -n $flags ]] && ((!flags_now)); then from=""; fi
  if [[ -n $from ]] && ! _sf_pass_of "$from" ${imports[@]+"${imports[@]}"}; then
    sf_log "smoke: finalize's import pass ($from) did not finish or imported other modules: importing here"
    from=""
  fi
  if [[ -n $from ]]; then
    sf_log "smoke: imports from finalize's pass in this run (each module in its own process after the last step)"
    scratch=$from
  else
    scratch=$(mktemp -d)
    # The flag catalog is made again in the same pass, to compare (slime, SGLang and Megatron imported once).
    if [[ -n $flags && -n $slime ]] && ((!flags_now)); then
      fresh=$(mktemp) catalog=1
      pass+=(--catalog-out "$fresh" --slime "$slime" --megatron "$megatron")
    fi
    sf_import_pass --venv "$venv" --results "$scratch" "${pass[@]}"
  fi
  local skipped=()
  _sf_import_report "$scratch" || failed=1
  skipped=(${SF_SKIPPED[@]+"${SF_SKIPPED[@]}"})
  if ((catalog)) && ! _sf_rc_ok "$scratch/catalog.rc"; then _sf_tail "$scratch/catalog.out" 20 >&2; fi
  rm -rf -- "$scratch"
  sf_phase smoke versions
  if [[ -n $versions ]]; then
    if "$venv/bin/python" -I "$(_sf_script venvlock.py)" pins "$versions"; then sf_log "smoke: every pinned version is installed"; else failed=1; fi
  fi
  if [[ -n $marker ]]; then
    if out=$("$venv/bin/python" -c 'import sglang_router; print(sglang_router.__version__)' 2>&1) && [[ $out == *"$marker"* ]]; then
      sf_log "smoke: sglang_router $out is the fork"
    else printf 'slimeforge: ERROR: smoke: sglang_router.__version__ %q lacks %q (not slime'"'"'s fork)\n' "$out" "$marker" >&2; failed=1; fi
  fi
  if [[ -n $torch_cuda ]]; then
    if out=$("$venv/bin/python" -c 'import torch; print(torch.version.cuda)' 2>&1) && [[ $out == "$torch_cuda"* ]]; then
      sf_log "smoke: torch built for CUDA $out"
    else printf 'slimeforge: ERROR: smoke: torch CUDA %s does not match the flavor %s\n' "$out" "$torch_cuda" >&2; failed=1; fi
  fi
  sf_phase smoke patches
  if ((${#patches[@]})); then
    if (sf_patches_applied "${patches[@]}"); then sf_log "smoke: all ${#patches[@]} patch(es) present"; else failed=1; fi
  fi
  sf_phase smoke flags
  if [[ -n $flags ]] && ((flags_now)); then
    if [[ -s $flags ]]; then sf_log "smoke: flag catalog $flags made from slime's parsers by finalize in this run: not made again"
    else printf 'slimeforge: ERROR: smoke: flag catalog %s is missing\n' "$flags" >&2; failed=1; fi
  elif [[ -n $flags ]]; then
    if ((catalog)) && [[ -s $fresh && -s $flags ]] && cmp -s "$fresh" "$flags"; then
      sf_log "smoke: flag catalog $flags matches slime's parsers"
    else printf 'slimeforge: ERROR: smoke: flag catalog %s is missing or differs from slime'"'"'s parsers\n' "$flags" >&2; failed=1; fi
  fi
  if [[ -n $fresh ]]; then rm -f -- "$fresh"; fi
  # On a GPU host, each compiled piece runs one small operation against torch (sf_kernel_check).
  sf_phase smoke kernels
  if ((kernels && gpu)); then
    if (sf_kernel_check "$venv"); then sf_log "smoke: kernel check passed"; else failed=1; fi
  elif ((kernels)); then
    sf_log "smoke: SKIPPED the kernel check: no GPU is present"
  fi
  sf_phase smoke end
  ((failed == 0)) || sf_die "smoke test failed"
  if ((${#skipped[@]})); then
    sf_log "smoke test passed, with ${#skipped[@]} GPU import(s) skipped (no GPU here): ${skipped[*]}"
  else
    sf_log "smoke test passed"
  fi
}

# --- the smoke test's record (install.sh) -----------------------------------------------------
# $SF_STATE/smoke.passed: the hash install.sh gives (every step's chained hash and the smoke test's
# own arguments), then one line per step, `step NAME SHA256`, the sha256 of the step's done record
# when the test passed. Written when the smoke test passed, by rename (never half there). The steps
# are SF_STEP_NAMES (install.sh's sf_run_step lists every step it saw in this run).

# _sf_smoke_content HASH: the record as it would be written now.
_sf_smoke_content() {
  local name rec sum
  printf '%s\n' "$1"
  for name in ${SF_STEP_NAMES[@]+"${SF_STEP_NAMES[@]}"}; do
    rec="$SF_STATE/steps/$name.done"
    if [[ -f $rec && ! -L $rec ]]; then sum=$(sha256sum <"$rec" | cut -d' ' -f1); else sum=missing; fi
    printf 'step %s %s\n' "$name" "$sum"
  done
}

# sf_smoke_recorded HASH: succeeds when the record says the smoke test passed with HASH and with
# every step's done record as it is now: a step that ran since wrote a new record (a new `run`
# line), so it differs by content; no file times are compared (a copied state directory, a clock
# set wrong). The record is input: a regular file, at most 64 KiB, exactly the content above, else
# it is no record (the test runs).
sf_smoke_recorded() {
  local want=$1 rec="$SF_STATE/smoke.passed" size have expect
  [[ $want =~ ^[0-9a-f]{64}$ && -f $rec && ! -L $rec ]] || return 1
  size=$(stat -c %s -- "$rec" 2>/dev/null) || return 1
  ((size <= 65536)) || return 1
  expect=$(_sf_smoke_content "$want" | sha256sum | cut -d' ' -f1)
  have=$(sha256sum <"$rec" | cut -d' ' -f1)
  [[ $have == "$expect" ]]
}

# sf_smoke_record HASH: the smoke test passed with HASH and the steps' records as they are now
# (written to a temporary name, then renamed).
sf_smoke_record() {
  [[ $1 =~ ^[0-9a-f]{64}$ ]] || sf_die "smoke record: '$1' is not a sha256 (64 hex digits)"
  sf_record_clear "$SF_STATE/smoke.passed"
  _sf_smoke_content "$1" >"$SF_STATE/smoke.passed.tmp.$$"
  mv -fT -- "$SF_STATE/smoke.passed.tmp.$$" "$SF_STATE/smoke.passed"
}

# --- compile parallelism and the kernel check (issue 21) --------------------------------------

# sf_apex_jobs JOBS: "APEX_PARALLEL_BUILD MAX_JOBS" for apex on a host whose MAX_JOBS is JOBS, the
# rule of slimeforge.image.builder.compilejobs.apex_jobs: at most 4 jobs per extension, twice JOBS in all (an apex
# nvcc job peaks at 2.7 GiB: two fit the 6 GiB per job of sf_compile_jobs). On 16 cores: 8 x 4, 158 s
# cold (MAX_JOBS=16 alone, extensions one after another: over 480 s).
sf_apex_jobs() {
  local jobs=$1 per=4
  ((per <= jobs)) || per=$jobs
  ((per >= 1)) || per=1
  local parallel=$((2 * jobs / per))
  ((parallel >= 1)) || parallel=1
  printf '%s %s\n' "$parallel" "$per"
}

# sf_kernel_check VENV: one small operation of every compiled piece on the GPU against torch
# ($SF_STATE/kernel_check.py, slimeforge/scripts/kernel_check.py, run with the venv's Python). Where
# no GPU is present the script imports nothing and names each piece skipped (`apex: skipped: no
# GPU`, ...); a piece that fails on a GPU fails the check.
sf_kernel_check() {
  local venv=$1
  [[ -f $SF_STATE/kernel_check.py ]] || sf_die "kernel check: $SF_STATE/kernel_check.py is missing"
  # PYTHONPATH of the caller must not decide what is imported.
  PYTHONPATH="" "$venv/bin/python" "$SF_STATE/kernel_check.py" >&2 ||
    sf_die "kernel check: a compiled piece failed on the GPU (see above)"
}
