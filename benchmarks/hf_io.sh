#!/usr/bin/env bash
# Hugging Face export and import speed beside the raw disk, in one run:
#   export (ckpt export --format=hf) against `dd` writing the same bytes, and
#   import (checkpoint.init_from, 1 rank and tp=2) against `dd` reading the file back,
# both through the page cache (no fsync: what the tools do), plus the import's peak
# memory growth against its largest tensor slice and the model's size.
# Usage: benchmarks/hf_io.sh [BUILD_DIR] [CONFIG]   (from the repository root; ~2 minutes)
set -euo pipefail
build=${1:-build}
config=${2:-configs/llama-125m.ini}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# $(date -u +%F) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; $config; in $tmp ($(df -h "$tmp" | awk 'NR==2 {print $1}'))"
"$build/trident" train --config "$config" --train.steps=1 --train.global_batch=1 --checkpoint.dir="$tmp/ck" \
  --checkpoint.every_steps=1 --log.val_batches=0 --log.run_dir="$tmp/run" > "$tmp/train.txt"
# Fresh pages are slow on this kind of VM (MACHINE.md), the page cache's included: each
# side runs 3 times, interleaved, and the best of each counts.
best() { sort -g | tail -1; }
rate() { grep -oE '[0-9.]+ [GM]B/s' <<< "$1" | awk '{print ($2 == "MB/s") ? $1 / 1000 : $1}'; }
exports=() writes=() reads=()
for trial in 1 2 3; do
  rm -rf "$tmp/hf" "$tmp/raw"
  export_line=$("$build/trident" ckpt export --checkpoint.dir="$tmp/ck" --format=hf --out="$tmp/hf")
  exports+=("$(grep -oE 'fp32 written in [0-9.]+ s \([0-9.]+ GB/s' <<< "$export_line" | grep -oE '[0-9.]+ GB/s' | awk '{print $1}')")
  bytes=$(stat -c %s "$tmp/hf/model.safetensors")
  writes+=("$(rate "$( { dd if=/dev/zero of="$tmp/raw" bs=1M count=$((bytes >> 20)) 2>&1 >/dev/null; } | tail -1)")")
  reads+=("$(rate "$( { dd if="$tmp/hf/model.safetensors" of=/dev/null bs=1M 2>&1 >/dev/null; } | tail -1)")")
done
rm -f "$tmp/raw"
export_gbps=$(printf '%s\n' "${exports[@]}" | best)
import_line() {  # launcher... : the init line of a 1-step run from the export
  "$@" "$build/trident" train --config "$config" --train.steps=1 --train.global_batch=2 --train.micro_batch=1 \
    --train.lr=0 --train.min_lr=0 --log.val_batches=0 --log.run_dir="$tmp/run_in" \
    --checkpoint.init_from="$tmp/hf" "${extra[@]}" | grep '^parameters initialized'
}
best_line() {  # the fastest of 3 runs' init lines
  local lines=() l
  for trial in 1 2 3; do lines+=("$(import_line "$@")"); done
  for l in "${lines[@]}"; do echo "$(grep -oE '[0-9.]+ GB/s' <<< "$l" | awk '{print $1}') $l"; done | sort -g | tail -1 | cut -d' ' -f2-
}
extra=()
one=$(best_line env)
extra=(--parallel.tp=2)
two=$(best_line mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1)
w=$(printf '%s\n' "${writes[@]}" | best) r=$(printf '%s\n' "${reads[@]}" | best)
echo
echo "export runs (GB/s): ${exports[*]}; dd write: ${writes[*]}; dd read: ${reads[*]} (best of each below)"
echo
echo "| operation | GB | GB/s | raw disk GB/s (dd, same run) | ratio |"
echo "| --- | ---: | ---: | ---: | ---: |"
awk -v b="$bytes" -v x="$export_gbps" -v raw="$w" 'BEGIN { printf "| export fp32 (1 file) | %.3f | %.2f | %.2f write | %.0f%% |\n", b / 1e9, x, raw, 100 * x / raw }'
for line in "$one" "$two"; do
  label=$([ "$line" = "$one" ] && echo "import, 1 rank" || echo "import, tp=2 (2 ranks, slices)")
  gbps=$(grep -oE '[0-9.]+ GB/s' <<< "$line" | awk '{print $1}')
  gb=$(grep -oE '[0-9.]+ GB read' <<< "$line" | awk '{print $1}')
  awk -v l="$label" -v g="$gb" -v x="$gbps" -v raw="$r" 'BEGIN { printf "| %s | %.3f | %.2f | %.2f read | %.0f%% |\n", l, g, x, raw, 100 * x / raw }'
done
echo
echo "import, 1 rank: $(grep -oE 'peak memory .*' <<< "$one")"
echo "import, tp=2:   $(grep -oE 'peak memory .*' <<< "$two")"
echo "model file: $(awk -v b="$bytes" 'BEGIN { printf "%.1f MiB", b / 1048576 }')"
