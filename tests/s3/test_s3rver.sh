#!/usr/bin/env bash
# The S3 tests that a second, independent S3 implementation can serve, against npm's
# s3rver 3.7 (what a new user reaches for first): objects listed in pages, read and
# deleted; a multipart upload and ranged download checked with awscli; two nodes
# uploading checkpoints and a new cluster resuming from them; training data read from it. s3rver checks SigV4
# signatures (its fixed keys S3RVER / S3RVER); it is installed from npm into
# BUILD/s3rver, started on a free port and stopped by a trap. Without node, npm or the
# registry the server is not started and the tests skip themselves (counted as skipped).
# Prints unit_tests' output, which ends with its "MPI summary" line.
# Usage: tests/s3/test_s3rver.sh [BUILD_DIR]   (from the repository root)
set -uo pipefail
build=${1:-build}
dir=$(realpath -m "$build/s3rver")
work=$(mktemp -d "${TEST_TMPDIR:-/tmp/}s3rver.XXXXXX")
server_pid=
cleanup() {
  [ -z "$server_pid" ] || kill "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start() {
  command -v node >/dev/null && command -v npm >/dev/null || { echo "SKIP: no node and npm"; return 1; }
  mkdir -p "$dir"
  [ -f "$dir/package.json" ] || echo '{"name": "trident-s3rver", "private": true}' > "$dir/package.json"
  if [ ! -f "$dir/node_modules/s3rver/bin/s3rver.js" ] &&
     ! (cd "$dir" && npm install --prefer-offline --no-audit --no-fund --no-save --loglevel=error s3rver@3.7.1); then
    echo "SKIP: npm install s3rver@3.7.1 failed (no registry reachable?)"
    return 1
  fi
  node "$dir/node_modules/s3rver/bin/s3rver.js" -d "$work/data" -a 127.0.0.1 -p 0 > "$work/server.log" 2>&1 &
  server_pid=$!
  # Its first line names the port it took.
  local port=
  for _ in $(seq 300); do
    port=$(sed -n 's/^S3rver listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/server.log")
    [ -n "$port" ] || ! kill -0 "$server_pid" 2>/dev/null && break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    echo "s3rver did not start:"; cat "$work/server.log"
    return 2
  fi
  echo "s3rver $(node "$dir/node_modules/s3rver/bin/s3rver.js" --version) on 127.0.0.1:$port"
  export TRIDENT_TEST_S3_ENDPOINT=http://127.0.0.1:$port
  export AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER AWS_DEFAULT_REGION=us-east-1
  unset AWS_SESSION_TOKEN AWS_PROFILE
  export AWS_EC2_METADATA_DISABLED=true NO_PROXY=127.0.0.1 no_proxy=127.0.0.1
  return 0
}
mkdir -p "$work/data"
start
rc=$?
if [ $rc = 2 ]; then
  echo "s3rver was installed and would not start: the tests cannot run"
  exit 1
fi
"$build/tests/unit_tests" --gtest_filter='S3Store.ObjectsListedReadAndDeleted:S3Store.MultipartUploadAndRangedDownload:S3Checkpoints.TwoNodesUploadAndANewClusterResumesFromS3:S3Data.*-S3Data.NoRangedGetAfterTheCopyIsComplete'
