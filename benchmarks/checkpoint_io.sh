#!/usr/bin/env bash
# Checkpoint write and read throughput beside the raw sequential write speed of the same
# disk (dd with fsync), and the training stall per checkpoint with async off and on.
# GPT-2 124M on 8 ranks as (dp, tp, pp) = (2, 2, 2), 2 "nodes" of 4 ranks.
# Usage: benchmarks/checkpoint_io.sh [BUILD_DIR] [DIR (default /tmp)]
set -euo pipefail
build=${1:-build}
base=${2:-/tmp}/trident_ckpt_bench
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rm -rf "$base"; mkdir -p "$base"

raw=$(dd if=/dev/zero of="$base/raw" bs=1M count=1024 conv=fsync 2>&1 | grep -oE '[0-9.]+ [MG]B/s')
rm -f "$base/raw"
echo "raw sequential write, 1 GiB, dd bs=1M conv=fsync: $raw"

run() {  # extra flags...
  mpirun --oversubscribe -np 8 -x OMP_NUM_THREADS=1 "$build/trident" train --config configs/gpt2-124m.ini \
    --parallel.dp=2 --parallel.tp=2 --parallel.pp=2 --parallel.ranks_per_node=4 --train.global_batch=2 \
    --train.micro_batch=1 --log.val_batches=0 --log.peak_gflops=100 --log.run_dir="$base/run" "$@"
}
for async in false true; do
  dir="$base/ckpt_$async"
  out=$(run --train.steps=3 --checkpoint.every_steps=1 --checkpoint.keep_last=2 --checkpoint.async=$async --checkpoint.dir="$dir" 2>&1)
  echo "$out" | grep -E '^step |checkpoint:' | sed "s/^/  [async=$async] /"
  bytes=$(cat "$dir"/step_00000003/node_*.h5 | wc -c)
  echo "  [async=$async] checkpoint size: $(awk "BEGIN{print $bytes/1e9}") GB"
done
out=$(run --train.steps=3 --checkpoint.dir="$base/ckpt_false" 2>&1)
echo "$out" | grep -E 'resumed from' | sed 's/^/  [load] /'
rm -rf "$base"
