#!/usr/bin/env bash
# What the replica check (train.replica_check_steps: silent data corruption) costs: GPT-2
# 124M on 2 dp ranks, a check after every step. Prints the check's mean time (hashing this
# rank's 124M parameters, gathering the hashes at rank 0, its answer back) against the
# median step time, and the share of training time it takes at the default interval of
# 1,000 steps.
# Usage: benchmarks/replica_check.sh [BUILD_DIR] [STEPS]   (from the repository root)
set -euo pipefail
build=${1:-build}
steps=${2:-6}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun --oversubscribe -x OMP_NUM_THREADS=1 -np 2 "$build/trident" train --config configs/gpt2-124m.ini \
  --train.global_batch=2 --train.micro_batch=1 --model.seq_len=256 --train.steps="$steps" \
  --train.replica_check_steps=1 --log.every_steps=1 --log.val_batches=0 --log.sample_every_steps=0 \
  --log.peak_gflops=100 --log.run_dir="$out/run" > "$out/log.txt"
/usr/bin/python3 - "$out/run" <<'PY'
import json, statistics, sys
run = sys.argv[1]
times = [json.loads(l)["step_time_s"] for l in open(run + "/metrics.jsonl") if "step_time_s" in l][1:]
s = json.load(open(run + "/summary.json"))
check = s["replica_check_seconds"] / s["replica_checks"]
step = statistics.median(times)
params = s["parameters"]
print("| model | ranks | checks | check (ms) | median step (ms) | check / step | share at every 1000 steps | hashed GB/s |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
print(f"| GPT-2 124M, T 256 | 2 (dp) | {s['replica_checks']} | {check * 1e3:.1f} | {step * 1e3:.0f} | "
      f"{check / step:.3f} | {check / (1000 * step) * 100:.4f}% | {params * 4 / check / 1e9:.2f} |")
PY
