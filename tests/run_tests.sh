#!/usr/bin/env bash
# Runs every test binary of the build and prints one closing line "N passed, N failed".
# unit_tests runs as one process (an MPI singleton; it launches mpirun itself for the
# command-line tests); mpi_tests runs under mpirun on 2, 3 and 4 ranks. Each binary ends
# with "MPI summary: N tests on R rank(s), F failed on some rank".
# Usage: tests/run_tests.sh [BUILD_DIR]   (from the repository root)
set -uo pipefail
build=${1:-build}
export TRIDENT_BIN=$build/trident
# Open MPI refuses root unless told; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

passed=0
failed=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

run() {  # label, command...
  local label=$1; shift
  echo "=== $label: $*"
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local summary
  summary=$(grep -E '^MPI summary: [0-9]+ tests' "$log" | tail -1)
  if [ -z "$summary" ]; then
    echo "$label: no summary (exit $rc): counted as one failure"
    failed=$((failed + 1))
    return
  fi
  local tests bad
  tests=$(echo "$summary" | awk '{print $3}')
  bad=$(echo "$summary" | awk '{print $8}')
  passed=$((passed + tests - bad))
  failed=$((failed + bad))
  if [ "$rc" -ne 0 ] && [ "$bad" -eq 0 ]; then
    echo "$label: exit $rc with no failed test: counted as one failure"
    failed=$((failed + 1))
  fi
}

start=$SECONDS
run unit_tests "$build/tests/unit_tests"
# One OpenMP thread per rank: the ranks share the machine's cores.
for np in 2 3 4; do
  run "mpi_tests, $np ranks" timeout 600 mpirun --oversubscribe -x OMP_NUM_THREADS=1 -np "$np" "$build/tests/mpi_tests"
done

# CUDA builds: the GPU check's comparison program, run against the CPU backend (its
# harness, checked without a GPU).
if [ -x "$build/bench/kernel_check" ]; then
  echo "=== kernel_check --cpu-self-check"
  if "$build/bench/kernel_check" --cpu-self-check --seed 1 > "$log" 2>&1 && grep -q '^PASS: 0 failed' "$log"; then
    passed=$((passed + 1))
  else
    cat "$log"
    failed=$((failed + 1))
  fi
fi

# The GPU check's shell helpers (bundle_env.sh's library search, build_deps.sh), on fake
# trees: one test.
echo "=== tests/unit/test_gpu_scripts.sh"
if bash tests/unit/test_gpu_scripts.sh > "$log" 2>&1; then
  passed=$((passed + 1))
else
  cat "$log"
  failed=$((failed + 1))
fi

echo
echo "tests took $((SECONDS - start)) s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
