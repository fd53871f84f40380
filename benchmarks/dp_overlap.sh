#!/usr/bin/env bash
# Fraction of step time spent waiting for the data-parallel gradient reduction, with the
# buckets reduced during backward (overlap) and only after it, without ZeRO, with ZeRO-1
# and with ZeRO-2 (which reduces each block as its backward ends, overlap or not).
# Usage: benchmarks/dp_overlap.sh [BUILD_DIR]   (from the repository root)
set -euo pipefail
build=${1:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
model="--model.n_layer=6 --model.d_model=384 --model.n_head=6 --model.seq_len=128 --model.vocab_size=256"
args="train --config configs/tiny.ini $model --train.steps=12 --log.every_steps=100 --log.val_batches=0
      --log.peak_gflops=100 --log.run_dir=/tmp/trident_dp_overlap --parallel.bucket_mb=2"
echo "| ranks | ZeRO | overlap | buckets | step time (s) | dp wait, % of step |"
echo "| --- | --- | --- | --- | --- | --- |"
for np in 2 4; do
  for zero in 0 1 2; do
    for overlap in true false; do
      out=$(mpirun --oversubscribe -np $np -x OMP_NUM_THREADS=1 "$build/trident" $args \
            --train.global_batch=$((4 * np)) --parallel.zero=$zero --parallel.overlap=$overlap 2>&1)
      buckets=$(echo "$out" | grep -oE '[0-9]+ gradient buckets' | cut -d' ' -f1)
      steps_s=$(echo "$out" | grep -oE '^step +12/12 .*' | grep -oE '[0-9.]+ ms' | cut -d' ' -f1)
      wait=$(echo "$out" | grep -oE 'dp wait [0-9.]+%' | grep -oE '[0-9.]+')
      echo "| $np | $zero | $overlap | $buckets | $(awk "BEGIN{print $steps_s/1000}") | $wait |"
    done
  done
done
