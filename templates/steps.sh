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

sf_log() { printf 'slimeforge: %s\n' "$*" >&2; }
sf_die() { printf 'slimeforge: ERROR: %s\n' "$*" >&2; exit 1; }

# git refuses repositories owned by another user (bind-mounted build contexts, a user's checkout
# read by root); these repositories are read, never trusted for hooks or config.
sf_git() { git -c safe.directory='*' -c advice.detachedHead=false "$@"; }

# --- system packages ------------------------------------------------------------------------

# sf_apt_install PKG...: installs the missing ones, with the apt cache kept (the image build mounts
# it as a cache). On a host that already has them nothing runs; without root, missing ones stop here.
sf_apt_install() {
  (($#)) || return 0
  local p missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' -- "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then sf_log "apt: all present: $*"; return 0; fi
  if [[ $(id -u) -ne 0 ]]; then
    sf_die "apt packages missing: ${missing[*]} (as root: apt-get install -y ${missing[*]})"
  fi
  if [[ -f /etc/apt/apt.conf.d/docker-clean ]]; then rm -f /etc/apt/apt.conf.d/docker-clean; fi
  echo 'Binary::apt::APT::Keep-Downloaded-Packages "true";' >/etc/apt/apt.conf.d/99slimeforge-keep
  apt-get update -qq
  # `--`: a package name is never read as an option (the stack's grammar refuses a leading '-' too).
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -- "${missing[@]}"
}

# --- the venv -------------------------------------------------------------------------------

# sf_venv VENV UV_VERSION: creates the venv and installs the pinned uv into it (from PyPI).
sf_venv() {
  local venv=$1 uv_version=$2
  if [[ ! -x $venv/bin/python ]]; then python3 -m venv "$venv"; fi
  local have=""
  if [[ -x $venv/bin/uv ]]; then have=$("$venv/bin/uv" --version | awk '{print $2}'); fi
  if [[ $have != "$uv_version" ]]; then
    "$venv/bin/python" -m pip install --disable-pip-version-check -q "uv==$uv_version"
  fi
  mkdir -p "$SF_STATE/constraints"
}

# sf_uv VENV ARGS...: `uv pip install` into VENV, honouring the constraints recorded so far.
sf_uv() {
  local venv=$1
  shift
  local extra=() c
  for c in "$SF_STATE"/constraints/*.txt; do
    if [[ -s $c ]]; then extra+=(--constraint "$c"); fi
  done
  "$venv/bin/uv" pip install --python "$venv/bin/python" "${extra[@]}" "$@"
}

# sf_pip_step --venv V --req R... [--index-url U] [--no-binary P]... [--exclude P]... [--no-deps]
#             [--constrain-later] [--no-build-isolation] [--find-links DIR --no-index]: one `pip`
#             step of the stack (a wheel directory instead of the index for air-gapped installs).
sf_pip_step() {
  local venv="" index="" no_deps=0 constrain=0 isolation=1
  local reqs=() no_binary=() exclude=() args=()
  while (($#)); do
    case $1 in
      --venv) venv=$2; shift 2 ;;
      --req) reqs+=("$2"); shift 2 ;;
      --index-url) index=$2; shift 2 ;;
      --find-links) args+=(--find-links "$2"); shift 2 ;;
      --no-index) args+=(--no-index); shift ;;
      --no-binary) no_binary+=("$2"); shift 2 ;;
      --exclude) exclude+=("$2"); shift 2 ;;
      --no-deps) no_deps=1; shift ;;
      --constrain-later) constrain=1; shift ;;
      --no-build-isolation) isolation=0; shift ;;
      *) sf_die "sf_pip_step: unknown option $1" ;;
    esac
  done
  [[ -n $venv ]] || sf_die "sf_pip_step: --venv is required"
  ((${#reqs[@]})) || { sf_log "no packages in this step"; return 0; }
  if [[ -n $index ]]; then args+=(--extra-index-url "$index" --index-strategy unsafe-best-match); fi
  local p
  for p in "${no_binary[@]}"; do args+=(--no-binary "$p"); done
  if ((no_deps)); then args+=(--no-deps); fi
  if ((!isolation)); then args+=(--no-build-isolation); fi
  local own="$SF_STATE/constraints/${reqs[0]//[^A-Za-z0-9._-]/_}.txt"
  if ((constrain)); then rm -f "$own"; fi # a re-done step is not held to its own old pins
  sf_uv "$venv" "${args[@]}" "${reqs[@]}"
  # uv has no "install but never this dependency": remove the excluded ones right after.
  for p in "${exclude[@]}"; do
    if "$venv/bin/uv" pip show --python "$venv/bin/python" "$p" >/dev/null 2>&1; then
      "$venv/bin/uv" pip uninstall --python "$venv/bin/python" "$p"
    fi
  done
  if ((constrain)); then
    # One file per step (named by its first requirement): a re-done step replaces its own pins.
    mkdir -p "$SF_STATE/constraints"
    printf '%s\n' "${reqs[@]}" >"$own"
  fi
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
      if out=$(patch -d "$dir" -p"$strip" --fuzz=0 --forward --batch --dry-run -i "$file" 2>&1); then
        out=$(patch -d "$dir" -p"$strip" --fuzz=0 --forward --batch -i "$file" 2>&1) || {
          files=$(printf '%s\n' "$out" | _sf_patch_failed_files | paste -sd' ')
          sf_die "patch $name does not apply to $dir (files: ${files:-see output}): $out"
        }
      elif patch -d "$dir" -p"$strip" --fuzz=0 --reverse --batch --dry-run -i "$file" >/dev/null 2>&1; then
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
  sf_log "patch $name: applied to $dir"
  _sf_record_patch "$name" "$file" "$dir" applied
}

# sf_patch_applied NAME METHOD STRIP FILE DIR: succeeds when the patch is present (reverse check).
sf_patch_applied() {
  local name=$1 method=$2 strip=$3 file=$4 dir=$5
  case $method in
    git) sf_git -C "$dir" apply -p"$strip" --reverse --check "$file" >/dev/null 2>&1 ;;
    patch) patch -d "$dir" -p"$strip" --fuzz=0 --reverse --batch --dry-run -i "$file" >/dev/null 2>&1 ;;
    *) return 1 ;;
  esac || sf_die "patch $name is not present in $dir (reverse check failed)"
}

# --- one source step ------------------------------------------------------------------------

# sf_source_step --venv V --name N --url U --commit C --dest D [--patch NAME:METHOD:STRIP:FILE]...
#                [--req R]... [--editable] [--no-deps] [--config-setting K=V]...
# Fetch at the commit, apply its patches (before installing: a non-editable install copies the
# files), install its pinned requirements, then the checkout itself without build isolation (the
# compiled extensions build against the torch already installed).
sf_source_step() {
  local venv="" name="" url="" commit="" dest="" editable=0 no_deps=0
  local patches=() reqs=() settings=()
  while (($#)); do
    case $1 in
      --venv) venv=$2; shift 2 ;;
      --name) name=$2; shift 2 ;;
      --url) url=$2; shift 2 ;;
      --commit) commit=$2; shift 2 ;;
      --dest) dest=$2; shift 2 ;;
      --patch) patches+=("$2"); shift 2 ;;
      --req) reqs+=("$2"); shift 2 ;;
      --editable) editable=1; shift ;;
      --no-deps) no_deps=1; shift ;;
      --config-setting) settings+=(--config-setting "$2"); shift 2 ;;
      *) sf_die "sf_source_step: unknown option $1" ;;
    esac
  done
  sf_fetch_source "$name" "$url" "$commit" "$dest"
  local spec pname method strip file
  for spec in "${patches[@]}"; do
    IFS=: read -r pname method strip file <<<"$spec"
    sf_apply_patch "$pname" "$method" "$strip" "$file" "$dest"
  done
  if ((${#reqs[@]})); then sf_uv "$venv" "${reqs[@]}"; fi
  local args=(--no-build-isolation "${settings[@]}")
  if ((no_deps)); then args+=(--no-deps); fi
  if ((editable)); then args+=(--editable "$dest"); else args+=("$dest"); fi
  sf_uv "$venv" "${args[@]}"
}

# --- read back and verify -------------------------------------------------------------------

# sf_finalize VENV LOCK_IN LOCK_OUT FLAGS_OUT [--checkout NAME=DIR]... [--slime DIR]
# Writes the stack lock with what is really installed (importlib.metadata) and the commit of every
# checkout, and the flag catalog of slime's own argument parser.
sf_finalize() {
  local venv=$1 lock_in=$2 lock_out=$3 flags_out=$4
  shift 4
  local checkouts=() slime=""
  while (($#)); do
    case $1 in
      --checkout) checkouts+=("$2"); shift 2 ;;
      --slime) slime=$2; shift 2 ;;
      *) sf_die "sf_finalize: unknown option $1" ;;
    esac
  done
  local spec commits=()
  for spec in "${checkouts[@]}"; do
    commits+=("${spec%%=*}=$(sf_git -C "${spec#*=}" rev-parse HEAD)")
  done
  "$venv/bin/python" - "$lock_in" "$lock_out" "$SF_STATE/patches.applied" "${commits[@]}" <<'PY'
import importlib.metadata as md, json, pathlib, sys
lock_in, lock_out, applied = sys.argv[1:4]
lock = json.loads(pathlib.Path(lock_in).read_text())
lock["installed"] = dict(sorted((d.metadata["Name"], d.version) for d in md.distributions() if d.metadata["Name"]))
lock["checkouts"] = dict(a.split("=", 1) for a in sys.argv[4:])
rows = [line.split("\t") for line in pathlib.Path(applied).read_text().splitlines()] if pathlib.Path(applied).exists() else []
lock["patches_applied"] = [{"file": r[0], "sha256": r[1], "dir": r[2], "status": r[3]} for r in rows]
pathlib.Path(lock_out).write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")
PY
  if [[ -n $slime ]]; then sf_flag_catalog "$venv" "$slime" >"$flags_out"; fi
}

# sf_flag_catalog VENV SLIME_DIR: {"slime_commit": ..., "flags": [...]} from `train.py --help`.
sf_flag_catalog() {
  local venv=$1 slime=$2 help commit
  help=$(cd "$slime" && "$venv/bin/python" train.py --help 2>&1) || sf_die "flag catalog: '$slime/train.py --help' failed: $help"
  commit=$(sf_git -C "$slime" rev-parse HEAD)
  printf '%s' "$help" | "$venv/bin/python" -c '
import json, re, sys
flags = sorted(set(re.findall(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9_.-]*)", sys.stdin.read())))
if not flags:
    sys.exit("slimeforge: ERROR: flag catalog: train.py --help printed no --options")
print(json.dumps({"slime_commit": sys.argv[1], "flags": flags}, indent=2))
' "$commit"
}

# sf_smoke --venv V [--import M]... [--router-marker S] [--torch-cuda X.Y]
#          [--patch NAME:METHOD:STRIP:FILE:DIR]... [--flags FILE --slime DIR]
# Every check runs; all failures are listed, and any failure fails the smoke test.
sf_smoke() {
  local venv="" marker="" torch_cuda="" flags="" slime="" failed=0
  local imports=() patches=()
  while (($#)); do
    case $1 in
      --venv) venv=$2; shift 2 ;;
      --import) imports+=("$2"); shift 2 ;;
      --router-marker) marker=$2; shift 2 ;;
      --torch-cuda) torch_cuda=$2; shift 2 ;;
      --patch) patches+=("$2"); shift 2 ;;
      --flags) flags=$2; shift 2 ;;
      --slime) slime=$2; shift 2 ;;
      *) sf_die "sf_smoke: unknown option $1" ;;
    esac
  done
  local m out
  for m in "${imports[@]}"; do
    if out=$("$venv/bin/python" -c "import $m" 2>&1); then sf_log "smoke: import $m ok"; else
      printf 'slimeforge: ERROR: smoke: import %s failed: %s\n' "$m" "$(tail -n 3 <<<"$out")" >&2; failed=1; fi
  done
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
  local spec pname method strip file dir
  for spec in "${patches[@]}"; do
    IFS=: read -r pname method strip file dir <<<"$spec"
    if (sf_patch_applied "$pname" "$method" "$strip" "$file" "$dir"); then sf_log "smoke: patch $pname present"; else failed=1; fi
  done
  if [[ -n $flags ]]; then
    if out=$(sf_flag_catalog "$venv" "$slime") && [[ -s $flags ]] && [[ $out == "$(cat "$flags")" ]]; then
      sf_log "smoke: flag catalog $flags matches slime's parser"
    else printf 'slimeforge: ERROR: smoke: flag catalog %s is missing or differs from train.py --help\n' "$flags" >&2; failed=1; fi
  fi
  ((failed == 0)) || sf_die "smoke test failed"
  sf_log "smoke test passed"
}
