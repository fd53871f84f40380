#!/usr/bin/env bash
# Self-check of the S3 test harness: tests/s3/s3_server.sh (a real one-node Ceph with the
# RADOS Gateway) and tests/s3/slowdown_proxy.py (faults in front of it). Checks that
# awscli round-trips a 12 MiB object through the proxy, rides out 503 SlowDown and a cut
# download by its retries, that the gateway refuses a wrong secret (SignatureDoesNotMatch:
# signatures are really checked), and that the gateway can be stopped in the middle of an
# upload and started again with the cluster still usable.
# Prints "PASS ..." per check and exits 0; the first failure prints "FAIL ..." and exits 1
# (the folder with the logs is kept). Without the packages: "SKIP: ..." and exit 0.
# Usage: tests/s3/test_s3_server.sh   (apt-get install ceph-mon ceph-osd radosgw ceph-common awscli)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
for bin in ceph ceph-mon ceph-osd radosgw radosgw-admin monmaptool aws curl python3; do
  command -v "$bin" >/dev/null || { echo "SKIP: $bin is not installed"; exit 0; }
done

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
t_all=$(now)
work=$(mktemp -d)
proxy_pid=
ok=0
cleanup() {
  [ -z "$proxy_pid" ] || kill "$proxy_pid" 2>/dev/null || true
  "$here/s3_server.sh" stop "$work/ceph" || true
  if [ $ok = 1 ]; then rm -rf "$work"; else echo "logs kept in $work" >&2; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() { echo "FAIL $*"; exit 1; }
# Poll a command every 0.1 s for at most $1 seconds.
poll() { local limit=$1 t0; shift; t0=$(now); until "$@"; do
  awk -v a="$t0" -v b="$(now)" -v l="$limit" 'BEGIN { exit !(b - a > l) }' && return 1; sleep 0.1; done; }

start_out=$("$here/s3_server.sh" start "$work/ceph")
echo "$start_out"
case $start_out in SKIP:*) ok=1; exit 0 ;; esac
t_start=$(sed -n 's/.*started in \([0-9.]*\) s.*/\1/p' <<<"$start_out")
source "$work/ceph/env"
export NO_PROXY=127.0.0.1 no_proxy=127.0.0.1
gateway=$TRIDENT_TEST_S3_ENDPOINT
echo "PASS server started in $t_start s: $gateway"

python3 "$here/slowdown_proxy.py" --upstream "$gateway" --port-file "$work/proxy.port" \
  --control "$work/control.json" --stats "$work/stats.json" 2>"$work/proxy.log" &
proxy_pid=$!
poll 10 test -s "$work/proxy.port" || fail "proxy: no port file"
proxy=http://127.0.0.1:$(cat "$work/proxy.port")
control() { echo "$1" >"$work/control.tmp"; mv "$work/control.tmp" "$work/control.json"; }
stat_of() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$work/stats.json" "$1"; }
s3() { aws --endpoint-url "$proxy" "$@"; }
cp3() { s3 s3 cp --only-show-errors "$@"; }
# curl signing with SigV4 like an SDK: secret, then curl's arguments.
scurl() { local secret=$1; shift
  curl -q -sS --aws-sigv4 'aws:amz:us-east-1:s3' -u "$AWS_ACCESS_KEY_ID:$secret" \
    -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' "$@"; }
bucket=trident-selfcheck

s3 s3api create-bucket --bucket $bucket >/dev/null || fail "create-bucket"
head -c 12M /dev/urandom >"$work/big"
cp3 "$work/big" s3://$bucket/big || fail "put 12 MiB"
cp3 s3://$bucket/big "$work/big.back" || fail "get 12 MiB"
cmp "$work/big" "$work/big.back" || fail "12 MiB object came back different"
echo "PASS bucket created, 12 MiB put and got back through the proxy ($(stat_of requests) requests)"

control '{"slowdown_requests": 2}'
echo small >"$work/small"
cp3 "$work/small" s3://$bucket/small || fail "put with 2 SlowDowns"
[ "$(stat_of slowdowns)" = 2 ] || fail "expected 2 slowdowns, proxy counted $(stat_of slowdowns)"
echo "PASS awscli retried past 2 SlowDown answers (proxy: $(stat_of slowdowns) slowdowns)"

control '{"slowdown_seconds": 1}'
code=$(scurl "$AWS_SECRET_ACCESS_KEY" -o "$work/body" -w '%{http_code}' "$proxy/$bucket/small")
[ "$code" = 503 ] && grep -q '<Code>SlowDown</Code>' "$work/body" || fail "slowdown_seconds: got $code"
small_is_200() { [ "$(scurl "$AWS_SECRET_ACCESS_KEY" -o /dev/null -w '%{http_code}' "$proxy/$bucket/small")" = 200 ]; }
poll 10 small_is_200 ||
  fail "slowdown_seconds=1: still no 200 after 10 s"
echo "PASS slowdown_seconds: 503 SlowDown, then 200 once the second is over"

control '{"truncate_get_bytes": 1000, "truncate_get_requests": 1}'
rc=0; scurl "$AWS_SECRET_ACCESS_KEY" -o "$work/cut" "$proxy/$bucket/big" 2>/dev/null || rc=$?
[ $rc = 18 ] && [ "$(stat -c %s "$work/cut")" = 1000 ] || fail "truncated GET: curl exit $rc, $(stat -c %s "$work/cut") bytes"
control '{"truncate_get_bytes": 1000, "truncate_get_requests": 1}'
rm -f "$work/big.back"
cp3 s3://$bucket/big "$work/big.back" || fail "get with one cut answer"
cmp "$work/big" "$work/big.back" || fail "12 MiB object came back different after a cut"
[ "$(stat_of truncated)" = 2 ] || fail "expected 2 truncated, proxy counted $(stat_of truncated)"
control '{}'
echo "PASS a GET cut after 1000 bytes: curl sees a partial file (exit 18), awscli retries to the whole object"

scurl "$AWS_SECRET_ACCESS_KEY" -o /dev/null -H 'Range: bytes=5-9' "$proxy/$bucket/small" || fail "ranged GET"
ranges=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["ranges"].get(sys.argv[2]))' \
  "$work/stats.json" "/$bucket/small")
[ "$ranges" = "['bytes=5-9']" ] || fail "the small object's ranged GETs: expected ['bytes=5-9'], proxy recorded $ranges"
echo "PASS the proxy records each path's ranged GETs ($ranges)"

# awscli 1.x prints "argument of type 'NoneType' is not iterable" for the gateway's errors
# (their <Message> is empty): the error code is read from its --debug log.
rc=0; AWS_SECRET_ACCESS_KEY=wrong-secret-0123456789 aws --debug --endpoint-url "$gateway" \
  s3api list-objects-v2 --bucket $bucket >/dev/null 2>"$work/aws.log" || rc=$?
[ $rc != 0 ] && grep -q '<Code>SignatureDoesNotMatch</Code>' "$work/aws.log" || fail "awscli with a wrong secret: exit $rc"
code=$(scurl wrong-secret-0123456789 -o "$work/body" -w '%{http_code}' "$gateway/$bucket/small")
[ "$code" = 403 ] && grep -q '<Code>SignatureDoesNotMatch</Code>' "$work/body" || fail "curl with a wrong secret: $code $(cat "$work/body")"
code=$(scurl "$AWS_SECRET_ACCESS_KEY" -o "$work/body" -w '%{http_code}' "$gateway/$bucket/small")
[ "$code" = 200 ] && cmp -s "$work/body" "$work/small" || fail "curl with the right secret: $code"
echo "PASS a wrong secret gets 403 SignatureDoesNotMatch (awscli and curl --aws-sigv4); the right one 200"

# The gateway stopped in the middle of a rate-limited upload (curl, 32 MiB at 4 MiB/s).
head -c 32M /dev/urandom >"$work/huge"
curl -q -sS --aws-sigv4 'aws:amz:us-east-1:s3' -u "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
  -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' --limit-rate 4M -T "$work/huge" -o /dev/null \
  "$gateway/$bucket/huge" 2>"$work/curl.err" &
curl_pid=$!
# curl's reads of the file (rchar) run ahead of its sends by no more than its buffer.
under_way() { [ "$(awk '/^rchar/ { print $2 }' "/proc/$curl_pid/io" 2>/dev/null || echo 0)" -gt $((8 << 20)) ]; }
poll 20 under_way || fail "the upload did not get going"
t0=$(now)
"$here/s3_server.sh" stop-gateway "$work/ceph"
t_stop=$(since "$t0")
rc=0; wait $curl_pid || rc=$?
[ $rc != 0 ] || fail "the upload ended well though the gateway stopped under it"
rc=0; curl -q -sS -o /dev/null "$proxy/" 2>/dev/null || rc=$?
[ $rc = 52 ] && [ "$(stat_of upstream_errors)" = 1 ] || fail "proxy with the gateway down: curl exit $rc"
t0=$(now)
"$here/s3_server.sh" start-gateway "$work/ceph" >/dev/null
t_restart=$(since "$t0")
rc=0; s3 s3api head-object --bucket $bucket --key huge >/dev/null 2>&1 || rc=$?
[ $rc != 0 ] || fail "the interrupted upload left an object"
rm -f "$work/big.back"
cp3 "$work/big" s3://$bucket/big2 || fail "put after the gateway restart"
cp3 s3://$bucket/big2 "$work/big.back" || fail "get after the gateway restart"
cmp "$work/big" "$work/big.back" || fail "object put after the restart came back different"
echo "PASS gateway stopped mid-upload (curl exit $(grep -o 'curl: ([0-9]*)' "$work/curl.err" | head -1), stop ${t_stop} s)," \
  "the proxy closed its client's connection, start-gateway in ${t_restart} s, 12 MiB put/get again"

ok=1
echo "PASS s3 self-check: start $t_start s, gateway restart $t_restart s, all $(since "$t_all") s"
