#!/usr/bin/env bash
# What a snapshot costs training: the memory tier (checkpoint.memory_every_steps) beside the
# disk tier (checkpoint.every_steps, async and sync) and beside no checkpoint at all, on
# GPT-2 124M at dp 2 (global batch 2 x 1024). A save after steps 3, 6, 9 and 12; the time
# each held training is read from its own line (the memory tier's, the disk's async stall,
# the disk's sync save), "first two" and "later" apart: the memory tier's first two
# snapshots are new files (a RAM file system's fresh pages are slow here), later ones are
# written over the oldest kept. "At N=10" is the later saves' time as a share of ten steps
# (one save every 10 steps). Step times of steps 2-13; step 1 is left out (first touch).
# NODES=2 plays two nodes on this host (TRIDENT_NODE_NAME, one rank each), so each
# snapshot is also sent to the partner node while the next step runs: the step after a
# save shows what that costs.
# Usage: [NODES=2] [TIERS="none memory disk_async disk_sync"] benchmarks/memory_tier.sh [BUILD_DIR] [DIR for the disk tier (default /tmp)]
set -euo pipefail
build=${1:-build}
base=${2:-/tmp}/trident_memory_tier_bench
nodes=${NODES:-1}
flags=${FLAGS:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rm -rf "$base"; mkdir -p "$base"
steps=13 every=3

run() {  # name, flags...: prints the run's output
  local name=$1; shift
  local args=(train --config configs/gpt2-124m.ini --parallel.dp=2 --train.global_batch=2 --train.micro_batch=1
              --train.steps=$steps --log.every_steps=1 --log.val_batches=0 --log.val_every_steps=0
              --log.sample_every_steps=0 --log.peak_gflops=100 --log.run_dir="$base/run_$name" $flags "$@")
  if [ "$nodes" = 2 ]; then
    mpirun --oversubscribe -x OMP_NUM_THREADS=1 -np 1 env TRIDENT_NODE_NAME=bench_a "$build/trident" "${args[@]}" \
      --parallel.ranks_per_node=1 : -np 1 env TRIDENT_NODE_NAME=bench_b "$build/trident" "${args[@]}" --parallel.ranks_per_node=1
  else
    mpirun --oversubscribe -x OMP_NUM_THREADS=1 -np 2 "$build/trident" "${args[@]}"
  fi
}
step_ms() {  # output, steps (awk regex): mean step time of those steps, ms
  echo "$1" | awk -v want="$2" '/^step +[0-9]+\// { split($2, s, "/"); if (s[1] ~ "^(" want ")$")
    for (i = 1; i < NF; i++) if ($(i + 1) == "ms") { sum += $i; n++ } } END { printf "%.0f", n ? sum / n : 0 }'
}
blocked_per_save() {  # tier, output, steps (3|6 or 9|12): the mean seconds those saves held training
  local pattern
  case $1 in
    memory) pattern="s/^memory tier: step \\($3\\) in node memory (.*, \\([0-9.]*\\) s).*/\\2/p" ;;
    disk_async) pattern="s/^checkpoint: step \\($3\\): training stalled \\([0-9.]*\\) s.*/\\2/p" ;;
    disk_sync) pattern="s/^checkpoint: step \\($3\\) saved to .* (\\([0-9.]*\\) s from its start)/\\2/p" ;;
  esac
  echo "$2" | sed -n "$pattern" | awk '{ sum += $1; n++ } END { printf "%.3f", n ? sum / n : -1 }'
}

echo "GPT-2 124M, dp 2 on $nodes node(s), $(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; a save after steps 3, 6, 9 and 12"
printf '| %-12s | %17s | %12s | %17s | %20s | %23s |\n' tier "blocked s (first 2)" "blocked s (later)" "step ms (no save)" "step ms (after save)" "later, at N=10, % step"
printf '| %s |\n' "--- | --- | --- | --- | --- | ---"
for tier in ${TIERS:-none memory disk_async disk_sync}; do
  case $tier in
    none) extra=() ;;
    memory) extra=(--checkpoint.dir="$base/ckpt_memory" --checkpoint.memory_every_steps=$every) ;;
    disk_async) extra=(--checkpoint.dir="$base/ckpt_async" --checkpoint.every_steps=$every --checkpoint.async=true) ;;
    disk_sync) extra=(--checkpoint.dir="$base/ckpt_sync" --checkpoint.every_steps=$every --checkpoint.async=false) ;;
  esac
  out=$(run "$tier" "${extra[@]}" 2>&1) || { echo "$tier: the run failed"; echo "$out" | grep -E "error" | head -5; exit 1; }
  plain=$(step_ms "$out" "2|3|5|6|8|9|11|12")
  after=$(step_ms "$out" "4|7|10|13")
  if [ "$tier" = none ]; then
    printf '| %-12s | %17s | %12s | %17s | %20s | %23s |\n' "$tier" - - "$plain" "$after" -
    continue
  fi
  first=$(blocked_per_save "$tier" "$out" "3\\|6")
  later=$(blocked_per_save "$tier" "$out" "9\\|12")
  share=$(awk -v s="$later" -v m="$plain" 'BEGIN { printf "%.2f%%", (m > 0 ? 100 * s / (10 * m / 1000) : 0) }')
  printf '| %-12s | %17s | %12s | %17s | %20s | %23s |\n' "$tier" "$first" "$later" "$plain" "$after" "$share"
  echo "$out" | grep -E '^memory tier:' | sed 's/^/    /' || true
done
rm -rf "$base"
ls /dev/shm | grep -c '^trident-' >/dev/null && echo "(snapshots of other runs remain in /dev/shm)" || true
