# Sourced by the S3 benchmarks (s3_checkpoint.sh, s3_data.sh, s3_stream.sh): a one-node Ceph
# (RADOS Gateway, tests/s3/s3_server.sh, objects in the OSD's memory: $S3_SERVER_MEMORY_GIB,
# default 6) in a fresh $work folder, stopped with it on exit, a bucket "data", and
# start_counting_proxy (tests/s3/slowdown_proxy.py in front of it, counting requests: $proxy,
# requests). Needs $here (the benchmarks folder).
work=$(mktemp -d "/tmp/trident_$(basename "$0" .sh).XXXXXX")
proxy_pid=
trap '[ -z "$proxy_pid" ] || kill "$proxy_pid"; bash "$here/../tests/s3/s3_server.sh" stop "$work/ceph" >/dev/null 2>&1; rm -rf "$work"' EXIT
aws=/usr/bin/aws
[ -x $aws ] || aws=$(command -v aws)
median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }

start=$(bash "$here/../tests/s3/s3_server.sh" start "$work/ceph" --memory-gib "${S3_SERVER_MEMORY_GIB:-6}")
echo "$start"
case $start in SKIP:*) exit 0 ;; esac
source "$work/ceph/env"
export NO_PROXY=127.0.0.1 no_proxy=127.0.0.1
endpoint=$TRIDENT_TEST_S3_ENDPOINT
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
$aws --endpoint-url "$endpoint" s3api create-bucket --bucket data >/dev/null

start_counting_proxy() {
  python3 "$here/../tests/s3/slowdown_proxy.py" --upstream "$endpoint" --port-file "$work/proxy.port" \
    --stats "$work/stats.json" 2>"$work/proxy.log" &
  proxy_pid=$!
  for _ in $(seq 100); do [ -s "$work/proxy.port" ] && break; sleep 0.1; done
  proxy=http://127.0.0.1:$(cat "$work/proxy.port")
}
requests() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['requests'])" "$work/stats.json"; }
