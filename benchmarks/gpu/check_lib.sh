# shellcheck shell=bash
# Sourced by check.sh and check2.sh: the steps of a GPU check under one deadline.
#
#   check_begin NAME "$@"   parses --dry-run, --sanitizer and OUT_DIR; sets check_dry_run,
#                           check_sanitizer, out (under $OUT when set, else OUT_DIR, else
#                           runs/NAME); logs to $out/check.log; starts the deadline clock
#   step NAME LIMIT_S CMD...   runs CMD (a command or an exported function) under
#                           `timeout LIMIT_S`, cut to the time left; prints one line
#                           "PASS|FAIL|SKIP: NAME (S s) [note]"; once the deadline has passed it
#                           runs nothing and records "skipped (deadline)". Exit 0: PASS; 77:
#                           SKIP (the step said why in $CHECK_NOTE); else FAIL (124: timed out).
#   check_end               prints the summary table; exits 0 (no FAIL) or 1
#
# A step writes one line to the file $CHECK_NOTE to put it beside its verdict (a
# throughput, a reason to skip). CHECK_DEADLINE_S: the whole check's time (default 540 s).
# Steps run in their own process (`timeout` kills the step's whole process group), so the
# functions and variables they use must be exported (export -f, export).

# shellcheck disable=SC2034  # check_sanitizer, out: read by the script that sources this
check_begin() {  # name, the script's arguments
  local name=$1 arg
  shift
  check_dry_run=0 check_sanitizer=0
  local out_dir=""
  for arg in "$@"; do
    case $arg in
      --dry-run) check_dry_run=1 ;;
      --sanitizer) check_sanitizer=1 ;;
      -h | --help) sed -n '2,/^set /p' "$0" | sed '$d'; exit 0 ;;
      -*) echo "$name: unknown option $arg (--dry-run, --sanitizer, OUT_DIR)" >&2; exit 2 ;;
      *) [ -z "$out_dir" ] || { echo "$name: one OUT_DIR only (got $out_dir and $arg)" >&2; exit 2; }
         out_dir=$arg ;;
    esac
  done
  CHECK_DEADLINE_S=${CHECK_DEADLINE_S:-540}
  [[ $CHECK_DEADLINE_S =~ ^[0-9]+$ ]] || { echo "$name: CHECK_DEADLINE_S=$CHECK_DEADLINE_S is not a whole number of seconds" >&2; exit 2; }
  # $OUT: the device tool's folder whose files come back; it wins over OUT_DIR.
  out=${OUT:-${out_dir:-runs/$name}}
  mkdir -p "$out" || { echo "$name: cannot make $out" >&2; exit 2; }
  out=$(cd "$out" && pwd)
  exec > >(tee "$out/check.log") 2>&1
  check_t0=$SECONDS
  check_rows=()
  check_failed=0 check_deadline_skips=0
  export CHECK_NOTE=$out/.step_note
  echo "$name: deadline ${CHECK_DEADLINE_S} s, output in $out$([ $check_dry_run = 1 ] && echo ", dry run on the CPU")"
}

check_elapsed() { echo $((SECONDS - check_t0)); }

check_record() {  # verdict, name, seconds, note
  local line="$1: $2 ($3 s)${4:+ $4}"
  echo "$line"
  check_rows+=("$line")
  [ "$1" != FAIL ] || check_failed=$((check_failed + 1))
}

step() {  # name, limit in seconds, command...
  local name=$1 limit=$2
  shift 2
  local left=$((CHECK_DEADLINE_S - $(check_elapsed)))
  if [ "$left" -le 0 ]; then
    check_record SKIP "$name" 0 "skipped (deadline)"
    check_deadline_skips=$((check_deadline_skips + 1))
    return 0
  fi
  [ "$limit" -le "$left" ] || limit=$left
  echo
  echo "=== $name (at $(check_elapsed) s, at most $limit s): $*"
  rm -f "$CHECK_NOTE"
  local t=$SECONDS rc
  # A function runs in a bash of its own so that timeout can end it, children included.
  if declare -F "$1" > /dev/null; then
    timeout -k 10 "$limit" bash -c '"$@"' step "$@"
  else
    timeout -k 10 "$limit" "$@"
  fi
  rc=$?
  local note=""
  [ ! -s "$CHECK_NOTE" ] || note=$(head -1 "$CHECK_NOTE")
  case $rc in
    0) check_record PASS "$name" $((SECONDS - t)) "$note" ;;
    77) check_record SKIP "$name" $((SECONDS - t)) "$note" ;;
    124 | 137) check_record FAIL "$name" $((SECONDS - t)) "timed out after $limit s${note:+; $note}" ;;
    *) check_record FAIL "$name" $((SECONDS - t)) "exit $rc${note:+; $note}" ;;
  esac
  return 0
}

check_end() {
  echo
  echo "=== summary ($(check_elapsed) s of ${CHECK_DEADLINE_S} s)"
  printf '  %s\n' "${check_rows[@]}"
  local pass skip
  pass=$(printf '%s\n' "${check_rows[@]}" | grep -c '^PASS')
  skip=$(printf '%s\n' "${check_rows[@]}" | grep -c '^SKIP')
  echo "${#check_rows[@]} steps: $pass passed, $check_failed failed, $skip skipped ($check_deadline_skips at the deadline)"
  rm -f "$CHECK_NOTE"
  if [ "$check_failed" = 0 ]; then echo "check: PASS"; exit 0; fi
  echo "check: FAIL"
  exit 1
}

# The machine's lines, and `device` for the runs: cpu in a dry run, else cuda with the
# GPUs nvidia-smi lists ($1: its --query-gpu fields). Returns 2 where there is no GPU.
check_machine() {
  echo
  echo "=== machine"
  if [ $check_dry_run = 1 ]; then
    device=cpu
    echo "dry run: $(nproc) CPU cores, no GPU asked for"
    return 0
  fi
  device=cuda
  nvidia-smi --query-gpu="$1" --format=csv || { echo "no GPU (nvidia-smi failed)"; return 2; }
  echo "$(nproc) CPU cores"
}

# The driver's CUDA version against the build's: one line and exit 2 where the driver is
# older than the build's major.minor (CUDA's runtime refuses to start then, with a less
# clear error on every step). $1: the build's major.minor; $2 (tests): the driver's.
check_driver() {
  local build=$1 driver=${2:-}
  if [ -z "$driver" ]; then
    driver=$(nvidia-smi 2>/dev/null | grep -oE 'CUDA Version: *[0-9]+\.[0-9]+' | grep -oE '[0-9]+\.[0-9]+$' | head -1)
  fi
  if [ -z "$driver" ] || [ -z "$build" ]; then
    echo "driver check: the driver's CUDA version (${driver:-unknown}) or the build's (${build:-unknown}) unknown: not compared"
    return 0
  fi
  if [ "$(printf '%s\n%s\n' "$build" "$driver" | sort -V | head -1)" != "$build" ]; then
    echo "the driver supports CUDA $driver; this build needs CUDA $build: update the driver, or build with a CUDA $driver toolkit (make CUDA_HOME=...)"
    return 2
  fi
  echo "driver check: the driver supports CUDA $driver; this build needs CUDA $build: ok"
}

# The CUDA version (major.minor) a trident executable was built with, from --version.
check_build_cuda() { "$1" --version 2>/dev/null | sed -n 's/^  CUDA: built with \([0-9]*\.[0-9]*\).*/\1/p'; }

# Text for the training steps: the fortunes where installed, else this repository's.
check_corpus() {  # folder to fill when no corpus is installed; prints the data path
  if [ -d /usr/share/games/fortunes ]; then echo /usr/share/games/fortunes; return; fi
  mkdir -p "$1"
  cat README.md docs/*.md src/*/*.h src/*/*.cpp kernels/*/*.cpp kernels/*/*.cu > "$1/corpus.txt"
  echo "$1"
}

# Picks the executables: the carried build/ where they start here, else the bundle
# (.gpu_bundle.tar.xz), else `make` as the last resort. Sets and exports $build. $1: which
# executables must be there besides trident (e.g. bench/kernel_check); $2: "cuda" to
# require a CUDA build.
check_pick_build() {
  local need=$1 want_cuda=${2:-} exe ok
  build=""
  ok=1
  for exe in trident $need; do [ -x build/$exe ] || ok=0; done
  if [ $ok = 1 ] && build/trident --version > "$out/.version" 2>&1 &&
     { [ "$want_cuda" != cuda ] || grep -q 'CUDA: built with' "$out/.version"; }; then
    echo "executables: the carried build/"
    build=build
  else
    [ $ok = 0 ] || { echo "build/ does not start here (or is not a CUDA build):"; head -5 "$out/.version"; }
    if [ -f .gpu_bundle.tar.xz ]; then
      echo "executables: .gpu_bundle.tar.xz (built elsewhere by bundle.sh)"
      tar -C /tmp -xJf .gpu_bundle.tar.xz 2>/dev/null ||  # without the xz program: Python's lzma
        python3 -c "import tarfile; tarfile.open('.gpu_bundle.tar.xz').extractall('/tmp')" || return 2
      source benchmarks/gpu/bundle_env.sh /tmp/.gpu_bundle
      build=/tmp/.gpu_bundle/build
    else
      echo "executables: none carried and no bundle: make (the last resort)"
      source benchmarks/gpu/build_deps.sh
      local missing
      missing=$(missing_build_deps)
      [ -z "$missing" ] || { echo "missing here for a build:"; sed 's/^/  /' <<< "$missing"; return 2; }
      make -j"$(nproc)" all 2>&1 | grep -E "error|trident build|nvcc:|^  MPI" || true
      build=build
    fi
  fi
  for exe in trident $need; do
    [ -x $build/$exe ] || { echo "no $build/$exe: nothing to check with"; return 2; }
  done
  rm -f "$out/.version"
  export build
  $build/trident --version
}
