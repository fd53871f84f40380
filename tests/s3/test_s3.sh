#!/usr/bin/env bash
# The S3 tests (test_s3.cpp's S3Store.*, test_s3_checkpoints.cpp's S3Checkpoints.*) against
# a real S3 server: a one-node Ceph with the RADOS Gateway (tests/s3/s3_server.sh),
# tests/s3/slowdown_proxy.py in front of it for the faults, and tests/s3/imds_server.py
# for an instance role's credentials (no EC2 here). All are stopped by a trap,
# whatever happens. Without the packages the server is not started and the tests skip
# themselves (GoogleTest's SKIPPED: counted as skipped, never as passed).
# Prints unit_tests' output, which ends with its "MPI summary" line.
# Usage: tests/s3/test_s3.sh [BUILD_DIR] [extra unit_tests arguments]   (from the repository root)
set -uo pipefail
build=${1:-build}
shift || true
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TEST_TMPDIR:-/tmp/}s3.XXXXXX")
proxy_pid=
imds_pid=
cleanup() {
  [ -z "$proxy_pid" ] || kill "$proxy_pid" 2>/dev/null
  [ -z "$imds_pid" ] || kill "$imds_pid" 2>/dev/null
  bash "$here/s3_server.sh" stop "$work/ceph" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_rc=0
start_out=$(bash "$here/s3_server.sh" start "$work/ceph" 2>&1) || start_rc=$?
echo "$start_out"
if [ $start_rc != 0 ]; then
  # The packages are there and the server would not start: a failure, not a skip.
  echo "tests/s3/s3_server.sh start failed (exit $start_rc): the S3 tests cannot run"
  exit 1
fi
if [ -f "$work/ceph/env" ]; then
  # shellcheck disable=SC1091
  source "$work/ceph/env"
  export NO_PROXY=127.0.0.1 no_proxy=127.0.0.1
  python3 "$here/slowdown_proxy.py" --upstream "$TRIDENT_TEST_S3_ENDPOINT" --port-file "$work/proxy.port" \
    --control "$work/control.json" --stats "$work/stats.json" 2>"$work/proxy.log" &
  proxy_pid=$!
  for _ in $(seq 100); do [ -s "$work/proxy.port" ] || ! kill -0 "$proxy_pid" 2>/dev/null && break; sleep 0.1; done
  if [ -s "$work/proxy.port" ]; then
    export TRIDENT_TEST_S3_PROXY=http://127.0.0.1:$(cat "$work/proxy.port")
    export TRIDENT_TEST_S3_PROXY_CONTROL=$work/control.json TRIDENT_TEST_S3_PROXY_STATS=$work/stats.json
  else
    echo "slowdown_proxy.py did not start: the tests that need it skip"; cat "$work/proxy.log"
  fi
  export TRIDENT_TEST_S3_DIR=$work/ceph
  # The instance role's credentials (the server's user) from a stand-in metadata service;
  # they expire in 4 minutes, inside the 5 minutes before expiry when they are fetched again.
  python3 "$here/imds_server.py" --port-file "$work/imds.port" --stats "$work/imds.json" --expire-seconds 240 \
    2>"$work/imds.log" &
  imds_pid=$!
  for _ in $(seq 100); do [ -s "$work/imds.port" ] || ! kill -0 "$imds_pid" 2>/dev/null && break; sleep 0.1; done
  if [ -s "$work/imds.port" ]; then
    export TRIDENT_TEST_IMDS_ENDPOINT=http://127.0.0.1:$(cat "$work/imds.port") TRIDENT_TEST_IMDS_STATS=$work/imds.json
  else
    echo "imds_server.py did not start: the instance role test skips"; cat "$work/imds.log"
  fi
elif [ -n "${TRIDENT_TEST_S3_REQUIRED:-}" ]; then
  echo "TRIDENT_TEST_S3_REQUIRED is set and the S3 server did not start"
  exit 1
fi
"$build/tests/unit_tests" --gtest_filter='S3Store.*:S3Checkpoints.*:S3Data.*' "$@"
