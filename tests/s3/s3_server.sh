#!/usr/bin/env bash
# A real S3 server for the tests: a one-node Ceph cluster (one monitor, one memstore OSD,
# no manager) with the RADOS Gateway in front, all under one folder, on free ports of
# 127.0.0.1, as the invoking user (no --setuser, nothing read or written in /etc/ceph or
# /var/lib/ceph: every command gets -c DIR/ceph.conf). The gateway checks SigV4 signatures
# like AWS does, which is why the tests use it rather than a mock.
#
#   s3_server.sh start DIR [--memory-gib N]   build and start it (N GiB of OSD memory, default 2);
#                                             writes DIR/env (endpoint and a fresh user's keys)
#   s3_server.sh stop DIR                     stop every daemon of DIR (safe to repeat)
#   s3_server.sh stop-gateway DIR             stop only radosgw (the cluster keeps the data)
#   s3_server.sh start-gateway DIR            start radosgw again and wait until it answers
#
# Debian 12: apt-get install ceph-mon ceph-osd radosgw ceph-common. Without them "start"
# prints "SKIP: ..." and exits 0 (DIR/env is then not written).
set -euo pipefail

usage() { sed -n '8,12s/^# //p' "$0" >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1
mkdir -p "$2"
dir=$(cd "$2" && pwd)
shift 2
conf=$dir/ceph.conf
poll_limit=60   # seconds any one wait may take

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
die() { echo "s3_server: $*" >&2; exit 1; }

# A free TCP port on 127.0.0.1 below the ephemeral range, so that no outgoing connection
# of these daemons can take it between this choice and the daemon's bind.
free_port() {
  python3 - "$@" <<'EOF'
import random, socket, sys
taken = {int(p) for p in sys.argv[1:]}
for _ in range(1000):
    port = random.randint(20000, 32000)
    if port in taken:
        continue
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    print(port)
    sys.exit(0)
sys.exit("no free port")
EOF
}

# Is the daemon of this pid file alive (and ours: its command line names our ceph.conf)?
alive() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "-c $conf "
}

# Start a daemon in the foreground mode (-f), in the background, its pid in DIR/pids/NAME.pid.
launch() {  # name, command...
  local name=$1; shift
  "$@" -f </dev/null >>"$dir/log/$name.out" 2>&1 &
  echo $! >"$dir/pids/$name.pid"
}

# Poll CHECK (a shell command) every 0.2 s until it succeeds; on timeout or when the daemon
# WHAT dies first, print the end of its log and exit 1.
wait_for() {  # what, description, check
  local what=$1 desc=$2 check=$3 t0
  t0=$(now)
  until eval "$check" >/dev/null 2>&1; do
    if ! alive "$dir/pids/$what.pid" || awk -v a="$t0" -v b="$(now)" -v l=$poll_limit 'BEGIN { exit !(b - a > l) }'; then
      echo "s3_server: $desc: not after $(since "$t0") s (daemon $what $(alive "$dir/pids/$what.pid" && echo running || echo exited)); end of its logs:" >&2
      tail -n 20 "$dir/log/$what.out" "$dir/log/"*"$what"*.log 2>/dev/null >&2 || true
      exit 1
    fi
    sleep 0.2
  done
}

# Stop one daemon: SIGTERM, up to 20 s to exit, then SIGKILL.
stop_daemon() {  # name
  local pidfile=$dir/pids/$1.pid pid i
  if alive "$pidfile"; then
    pid=$(cat "$pidfile")
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do alive "$pidfile" || break; sleep 0.2; done
    if alive "$pidfile"; then
      echo "s3_server: $1 (pid $pid) ignored SIGTERM for 20 s: SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
      for ((i = 0; i < 50; i++)); do alive "$pidfile" || break; sleep 0.1; done
    fi
  fi
  rm -f "$pidfile"
}

stop_all() {
  local name
  for name in rgw osd mon; do stop_daemon "$name"; done
}

ceph_cli() { ceph -c "$conf" --connect-timeout 10 "$@"; }
rgw_port() { sed -n 's/^rgw_frontends = .*endpoint=127\.0\.0\.1:\([0-9]*\).*/\1/p' "$conf"; }
gateway_answers() { curl -q -s --noproxy '*' -o /dev/null --max-time 5 "http://127.0.0.1:$(rgw_port)/"; }

start_gateway() {
  alive "$dir/pids/rgw.pid" && die "radosgw of $dir is running already"
  launch rgw radosgw -c "$conf" -n client.rgw
  wait_for rgw "radosgw answering on port $(rgw_port)" gateway_answers
}

start() {
  local memory_gib=2
  while [ $# -gt 0 ]; do
    case $1 in
      --memory-gib) memory_gib=$2; shift 2 ;;
      *) usage ;;
    esac
  done
  local bin
  for bin in ceph ceph-mon ceph-osd radosgw radosgw-admin monmaptool curl python3; do
    command -v "$bin" >/dev/null || { echo "SKIP: $bin is not installed (apt-get install ceph-mon ceph-osd radosgw ceph-common curl)"; exit 0; }
  done
  local name
  for name in mon osd rgw; do
    alive "$dir/pids/$name.pid" && die "a cluster of $dir is running; stop it first"
  done
  local t0
  t0=$(now)
  # Whatever fails from here on, no daemon is left behind.
  trap 'rc=$?; [ $rc -eq 0 ] || { echo "s3_server: start failed: stopping what was started" >&2; stop_all; }' EXIT
  trap 'exit 130' INT TERM
  rm -rf "$dir/mon" "$dir/osd" "$dir/run" "$dir/log" "$dir/pids" "$dir/env" "$dir/monmap"
  mkdir -p "$dir/mon" "$dir/osd/osd.0" "$dir/run" "$dir/log" "$dir/pids"

  local fsid mon_port rgw_port
  fsid=$(cat /proc/sys/kernel/random/uuid)
  mon_port=$(free_port)
  rgw_port=$(free_port "$mon_port")
  # auth none everywhere (so no keyring is needed or looked for); ms_mon_client_mode=crc
  # because radosgw otherwise asks for 'secure' and fails with "get_initial_auth_request
  # returned -13". memstore keeps the objects in the OSD's memory; the name and namespace
  # limits are the ones a non-BlueStore OSD needs for radosgw's object names.
  cat >"$conf" <<EOF
[global]
fsid = $fsid
mon_host = 127.0.0.1:$mon_port
public_addr = 127.0.0.1
ms_bind_ipv6 = false
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
ms_mon_client_mode = crc
paxos_propose_interval = 0.05
osd_pool_default_size = 1
osd_pool_default_min_size = 1
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
osd_pool_default_pg_num = 8
mon_max_pg_per_osd = 1000
run_dir = $dir/run
log_file = $dir/log/\$name.log
mon_cluster_log_file = default=$dir/log/\$channel.log
admin_socket = $dir/run/\$name.asok
crash_dir = $dir/crash
mon_data = $dir/mon/\$name
osd_data = $dir/osd/\$name
osd_objectstore = memstore
memstore_device_bytes = $((memory_gib * 1024 * 1024 * 1024))
osd_max_object_name_len = 256
osd_max_object_namespace_len = 64
[client.rgw]
rgw_frontends = beast endpoint=127.0.0.1:$rgw_port
rgw_dns_name = localhost
rgw_enable_lc_threads = false
# Deleted objects' data freed within seconds, not hours (the OSD keeps it in memory)
rgw_gc_obj_min_wait = 0
rgw_gc_processor_period = 5
rgw_gc_processor_max_time = 5
rgw_data = $dir/rgw
EOF

  monmaptool -c "$conf" --create --add a "127.0.0.1:$mon_port" --fsid "$fsid" "$dir/monmap" >/dev/null
  ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" >>"$dir/log/mon.out" 2>&1
  launch mon ceph-mon -c "$conf" -i a
  wait_for mon "monitor answering on port $mon_port" 'ceph_cli mon stat'

  local osd_uuid osd_id
  osd_uuid=$(cat /proc/sys/kernel/random/uuid)
  osd_id=$(ceph_cli osd new "$osd_uuid")
  [ "$osd_id" = 0 ] || die "the OSD got id '$osd_id', not 0"
  ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" >>"$dir/log/osd.out" 2>&1
  launch osd ceph-osd -c "$conf" -i 0
  wait_for osd "OSD up" "ceph_cli osd stat -f json | grep -q '\"num_up_osds\":1'"

  start_gateway

  # A user with fresh keys: 20 upper-case hex characters and 40 base64 ones, like AWS's.
  local key secret
  key=$(head -c 10 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr a-f A-F)
  secret=$(head -c 30 /dev/urandom | base64 | tr '+/' 'xy')
  radosgw-admin -c "$conf" user create --uid=trident --display-name=trident \
    --access-key="$key" --secret-key="$secret" >/dev/null 2>>"$dir/log/radosgw-admin.out"
  cat >"$dir/env" <<EOF
export TRIDENT_TEST_S3_ENDPOINT=http://127.0.0.1:$rgw_port
export AWS_ACCESS_KEY_ID=$key
export AWS_SECRET_ACCESS_KEY=$secret
export AWS_DEFAULT_REGION=us-east-1
export AWS_EC2_METADATA_DISABLED=true
EOF
  trap - EXIT INT TERM
  echo "s3_server: started in $(since "$t0") s: http://127.0.0.1:$rgw_port (source $dir/env)"
}

case $cmd in
  start) start "$@" ;;
  stop) [ $# -eq 0 ] || usage; stop_all ;;
  stop-gateway) [ $# -eq 0 ] || usage; stop_daemon rgw ;;
  start-gateway)
    [ $# -eq 0 ] || usage
    [ -f "$conf" ] || die "no cluster in $dir"
    alive "$dir/pids/mon.pid" && alive "$dir/pids/osd.pid" || die "the cluster of $dir is not running"
    t0=$(now)
    start_gateway
    echo "s3_server: gateway started in $(since "$t0") s"
    ;;
  *) usage ;;
esac
