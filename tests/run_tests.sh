#!/usr/bin/env bash
# Runs every test binary of the build and prints one closing line "N passed, N failed".
# Usage: tests/run_tests.sh [BUILD_DIR]   (from the repository root)
set -uo pipefail
build=${1:-build}
export TRIDENT_BIN=$build/trident
# Open MPI refuses root unless told; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

passed=0
failed=0
report=$(mktemp -d)
trap 'rm -rf "$report"' EXIT

run_gtest() {  # name, command...
  local name=$1; shift
  local xml="$report/$name.xml"
  echo "=== $name: $*"
  "$@" --gtest_output="xml:$xml"
  local rc=$?
  if [ -f "$xml" ]; then
    local tests failures errors
    tests=$(grep -m1 -o 'tests="[0-9]*"' "$xml" | grep -o '[0-9]*')
    failures=$(grep -m1 -o 'failures="[0-9]*"' "$xml" | grep -o '[0-9]*')
    errors=$(grep -m1 -o 'errors="[0-9]*"' "$xml" | grep -o '[0-9]*')
    local bad=$((failures + errors))
    passed=$((passed + tests - bad))
    failed=$((failed + bad))
    [ $rc -ne 0 ] && [ $bad -eq 0 ] && { echo "$name exited $rc"; failed=$((failed + 1)); }
  else
    echo "$name produced no report (exit $rc)"
    failed=$((failed + 1))
  fi
}

run_gtest unit_tests "$build/tests/unit_tests"

echo
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
