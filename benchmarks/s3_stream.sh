#!/usr/bin/env bash
# data.stream (data/s3_stream.h) against the copy before training (data/s3_data.h), the same
# Megatron dataset (1 GiB of uint16 tokens) on the same server (Ceph's RADOS Gateway on this
# machine, tests/s3/s3_server.sh, objects in the OSD's memory), rounds alternating: the
# wall time of a short run (start to exit: listing, copy or index, the steps), and
# through tests/s3/slowdown_proxy.py the requests each made and the bytes that came down.
# Usage: benchmarks/s3_stream.sh [BUILD_DIR] [ROUNDS] [STEPS]   (from the repository root)
set -euo pipefail
trap 'echo "s3_stream.sh: line $LINENO failed (exit $?)" >&2' ERR
build=${1:-build}
rounds=${2:-3}
steps=${3:-20}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/s3_bench_server.sh"

# A Megatron indexed dataset (MMIDIDX v1, uint16): 1024 documents of 512K tokens < 256.
mkdir -p "$work/megatron"
/usr/bin/python3 - "$work/megatron/web" <<'PY'
import numpy as np, struct, sys
rng = np.random.default_rng(1)
docs, length = 1024, 512 * 1024
with open(sys.argv[1] + ".bin", "wb") as f:
    for _ in range(docs):
        f.write(rng.integers(0, 256, length, dtype=np.uint16).tobytes())
with open(sys.argv[1] + ".idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8) + struct.pack("<QQ", docs, docs + 1))
    f.write(np.full(docs, length, dtype=np.int32).tobytes())
    f.write((np.arange(docs, dtype=np.int64) * length * 2).tobytes())
    f.write(np.arange(docs + 1, dtype=np.int64).tobytes())
PY
$aws --endpoint-url "$endpoint" s3 cp --recursive --only-show-errors "$work/megatron" s3://data/megatron/
bytes=$(du -cb "$work"/megatron/web.* | tail -1 | cut -f1)
rm -rf "$work/megatron"  # the server keeps them in memory: room for the copy

train=("$build/trident" train --config configs/tiny.ini --model.n_layer=4 --model.d_model=256 --train.steps="$steps"
       --train.global_batch=8 --log.val_batches=0 --log.sample_every_steps=0 --data.val_fraction=0
       --data.path=s3://data/megatron/web)
run() {  # mode endpoint -> seconds from start to exit
  rm -rf "$work/cache"
  local flags=() t0 t1
  [ "$1" = stream ] && flags=(--data.stream=true)
  t0=$(date +%s.%N)
  "${train[@]}" "${flags[@]}" --data.cache_dir="$work/cache" --checkpoint.s3_endpoint="$2" > "$work/$1.log" 2>&1 ||
    { tail -20 "$work/$1.log"; exit 1; }
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
: > "$work/copy_s"; : > "$work/stream_s"
for r in $(seq "$rounds"); do
  run copy "$endpoint" >> "$work/copy_s"
  run stream "$endpoint" >> "$work/stream_s"
done
grep -h "^data:\|^done:" "$work/copy.log" "$work/stream.log" || true
first_loss() { sed -n 's/^step 1\/[0-9]* | loss \([0-9.]*\).*/\1/p' "$work/$1.log"; }
[ "$(first_loss copy)" = "$(first_loss stream)" ] || { echo "the first losses differ"; exit 1; }

# Requests and bytes, counted by the proxy in front of the server.
start_counting_proxy
before=$(requests); run copy "$proxy" >/dev/null; copy_requests=$(( $(requests) - before ))
before=$(requests); run stream "$proxy" >/dev/null; stream_requests=$(( $(requests) - before ))
fetched=$(sed -n 's/.*streamed from S3: [0-9]* ranged GETs, \([0-9.]*\) MB fetched.*/\1/p' "$work/stream.log")

gb=$(echo "$bytes / 1000000000" | bc -l)
c=$(median < "$work/copy_s") s=$(median < "$work/stream_s")
echo
echo "Megatron dataset, $(printf %.3f "$gb") GB in S3; a $steps-step run of 8 sequences of 128 tokens a step, median of $rounds rounds:"
echo "| data | run, start to exit (s) | requests | MB from S3 |"
echo "| --- | ---: | ---: | ---: |"
printf "| copied first (data.stream=false) | %.2f | %d | %.0f |\n" "$c" "$copy_requests" "$(echo "$bytes / 1000000" | bc -l)"
printf "| streamed (data.stream=true) | %.2f | %d | %s |\n" "$s" "$stream_requests" "$fetched"
printf "streamed / copied (run time): %.2fx\n" "$(echo "$s / $c" | bc -l)"
