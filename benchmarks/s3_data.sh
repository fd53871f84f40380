#!/usr/bin/env bash
# Training data from S3 (data/s3_data.h), measured against `aws s3 cp --recursive` of the
# same files from the same server (Ceph's RADOS Gateway on this machine,
# tests/s3/s3_server.sh, objects in the OSD's memory), rounds alternating, each into an
# empty folder: 8 llm.c shards of 128 MiB (1 GiB) copied by trident before a one-step run
# (`data: copied ... in S s` from its output: listing, GETs, MD5 check) and by awscli
# (Debian's, its defaults: 10 requests in flight, 8 MiB parts). Then one round of each
# through tests/s3/slowdown_proxy.py, which counts the requests: requests per GB.
# Usage: benchmarks/s3_data.sh [BUILD_DIR] [ROUNDS]   (from the repository root)
set -euo pipefail
trap 'echo "s3_data.sh: line $LINENO failed (exit $?)" >&2' ERR
build=${1:-build}
rounds=${2:-3}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/s3_bench_server.sh"

# 8 llm.c shards (header: magic 20240520, version 1, token count; then uint16 tokens < 256).
mkdir -p "$work/shards"
/usr/bin/python3 - "$work/shards" <<'PY'
import numpy as np, sys
rng = np.random.default_rng(1)
tokens = (128 << 20) // 2 - 512
for i in range(8):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, tokens]
    with open(f"{sys.argv[1]}/data_train_{i:06d}.bin", "wb") as f:
        f.write(header.tobytes())
        f.write(rng.integers(0, 256, tokens, dtype=np.uint16).tobytes())
PY
$aws --endpoint-url "$endpoint" s3 cp --recursive --only-show-errors "$work/shards" s3://data/shards/
bytes=$(du -cb "$work"/shards/*.bin | tail -1 | cut -f1)
rm -rf "$work/shards"  # the server keeps them in memory: room for the copies

train=("$build/trident" train --config configs/tiny.ini --model.n_layer=1 --model.d_model=64 --train.steps=1
       --train.global_batch=1 --log.val_batches=0 --log.sample_every_steps=0 --data.val_fraction=0
       --data.path='s3://data/shards/*.bin')
ours() {  # endpoint -> seconds of trident's copy
  rm -rf "$work/ours"
  "${train[@]}" --data.cache_dir="$work/ours" --checkpoint.s3_endpoint="$1" > "$work/ours.log" 2>&1 ||
    { tail -20 "$work/ours.log"; exit 1; }
  sed -n 's/^data: copied 8 objects, .* in \([0-9.]*\) s .*/\1/p' "$work/ours.log"
}
theirs() {  # endpoint -> seconds of awscli's
  rm -rf "$work/aws"
  local t0 t1
  t0=$(date +%s.%N)
  $aws --endpoint-url "$1" s3 cp --recursive --only-show-errors s3://data/shards/ "$work/aws/"
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
: > "$work/ours_s"; : > "$work/aws_s"
for r in $(seq "$rounds"); do
  ours "$endpoint" >> "$work/ours_s"
  theirs "$endpoint" >> "$work/aws_s"
  cmp -s "$work/ours/data/shards/data_train_000003.bin" "$work/aws/data_train_000003.bin" || { echo "copies differ"; exit 1; }
done

# Requests, counted by the proxy in front of the server.
start_counting_proxy
before=$(requests); ours "$proxy" >/dev/null; ours_requests=$(( $(requests) - before ))
before=$(requests); theirs "$proxy" >/dev/null; aws_requests=$(( $(requests) - before ))

gb=$(echo "$bytes / 1000000000" | bc -l)
o=$(median < "$work/ours_s") a=$(median < "$work/aws_s")
echo
echo "8 llm.c shards, $(printf %.3f "$gb") GB, into an empty folder, median of $rounds rounds:"
echo "| client | seconds | GB/s | requests | requests per GB |"
echo "| --- | ---: | ---: | ---: | ---: |"
printf "| trident (data.path=s3://..., before training) | %.2f | %.3f | %d | %.1f |\n" "$o" "$(echo "$gb / $o" | bc -l)" \
  "$ours_requests" "$(echo "$ours_requests / $gb" | bc -l)"
printf "| aws s3 cp --recursive | %.2f | %.3f | %d | %.1f |\n" "$a" "$(echo "$gb / $a" | bc -l)" \
  "$aws_requests" "$(echo "$aws_requests / $gb" | bc -l)"
printf "trident / aws (speed): %.2fx\n" "$(echo "$a / $o" | bc -l)"
