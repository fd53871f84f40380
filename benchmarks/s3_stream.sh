#!/usr/bin/env bash
# data.stream (data/s3_stream.h) against the copy before training (data.wait_for_copy=true)
# and the copy while training (the default: the token file streamed until its copy is
# there; data/s3_data.h), the same Megatron dataset (1 GiB of uint16 tokens) on the same
# server (Ceph's RADOS Gateway on this machine, tests/s3/s3_server.sh, objects in the OSD's
# memory), rounds alternating: the wall time of a short run to its first step and to its
# exit (listing, copy or index, the steps), and through tests/s3/slowdown_proxy.py the
# requests each made and the bytes that came down.
# Usage: benchmarks/s3_stream.sh [BUILD_DIR] [ROUNDS] [STEPS] [LONG_STEPS]   (from the repository root)
set -euo pipefail
trap 'echo "s3_stream.sh: line $LINENO failed (exit $?)" >&2' ERR
build=${1:-build}
rounds=${2:-3}
steps=${3:-20}
long_steps=${4:-300}
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
       --train.global_batch=8 --log.every_steps=1 --log.val_batches=0 --log.sample_every_steps=0 --data.val_fraction=0
       --data.path=s3://data/megatron/web)
modes="copy while stream"
run() {  # mode endpoint -> seconds from start to the first step's line, and to exit
  rm -rf "$work/cache"
  local flags=() t0 first=""
  [ "$1" = copy ] && flags=(--data.wait_for_copy=true)
  [ "$1" = stream ] && flags=(--data.stream=true)
  t0=$(date +%s.%N)
  : > "$work/$1.log"
  while IFS= read -r line; do  # each line as it comes: when the first step's appears
    echo "$line" >> "$work/$1.log"
    [ -z "$first" ] && [[ "$line" =~ ^step\ +1/ ]] && first=$(date +%s.%N)
  done < <("${train[@]}" "${flags[@]}" --data.cache_dir="$work/cache" --checkpoint.s3_endpoint="$2" 2>&1 ||
           echo "FAILED")
  grep -q "^FAILED" "$work/$1.log" && { tail -20 "$work/$1.log"; exit 1; }
  echo "$(echo "$first - $t0" | bc -l) $(echo "$(date +%s.%N) - $t0" | bc -l)"
}
for m in $modes; do : > "$work/${m}_s"; done
for r in $(seq "$rounds"); do
  for m in $modes; do run $m "$endpoint" >> "$work/${m}_s"; done
done
for m in $modes; do grep -h "^data:\|^done:" "$work/$m.log" || true; done
losses() { grep -oE '^step +[0-9]+/[0-9]+ \| loss [0-9.]+' "$work/$1.log"; }
[ -n "$(losses copy)" ] && [ "$(losses copy)" = "$(losses stream)" ] && [ "$(losses copy)" = "$(losses while)" ] ||
  { echo "the losses differ"; exit 1; }

# Requests and bytes, counted by the proxy in front of the server.
start_counting_proxy
declare -A requested
for m in $modes; do
  before=$(requests); run $m "$proxy" >/dev/null; requested[$m]=$(( $(requests) - before ))
done
fetched=$(sed -n 's/.*streamed from S3: [0-9]* ranged GETs, \([0-9.]*\) MB fetched.*/\1/p' "$work/stream.log")

gb=$(echo "$bytes / 1000000000" | bc -l)
median_of() { cut -d' ' -f"$2" "$work/$1_s" | median; }
echo
echo "Megatron dataset, $(printf %.3f "$gb") GB in S3; a $steps-step run of 8 sequences of 128 tokens a step, median of $rounds rounds:"
echo "| data | to the first step (s) | start to exit (s) | requests |"
echo "| --- | ---: | ---: | ---: |"
printf "| copied first (data.wait_for_copy=true) | %.2f | %.2f | %d |\n" "$(median_of copy 1)" "$(median_of copy 2)" "${requested[copy]}"
printf "| copied while training (default) | %.2f | %.2f | %d |\n" "$(median_of while 1)" "$(median_of while 2)" "${requested[while]}"
printf "| streamed (data.stream=true, %s MB fetched) | %.2f | %.2f | %d |\n" "$fetched" "$(median_of stream 1)" \
  "$(median_of stream 2)" "${requested[stream]}"
printf "first step, while copying / copied first: %.2fx\n" "$(echo "$(median_of while 1) / $(median_of copy 1)" | bc -l)"

# A run long enough for its copy to finish (one core left to it: OMP_NUM_THREADS=1): when
# the copy was done, and the step from which the run read it.
train=("${train[@]/--train.steps=$steps/--train.steps=$long_steps}")
OMP_NUM_THREADS=1 run while "$endpoint" > "$work/long_s"
copy_line=$(grep -m1 "in the background (" "$work/while.log" || echo "not copied")
switched_after=$(awk '/its copy is complete/ {print last; exit} /^step +[0-9]+\// {last = $2}' "$work/while.log")
echo
echo "A $long_steps-step run while copying: $copy_line; read from the copy after step ${switched_after:-none};"
echo "$(grep -m1 '^done:' "$work/while.log" | grep -oE 'data wait [0-9.]+%')"
