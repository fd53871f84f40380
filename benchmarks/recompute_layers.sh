#!/usr/bin/env bash
# Full recomputation of some layers (train.recompute_layers, issue 55): memory planned and
# taken, step time and the last loss against none and full, one rank, the 6-layer width-512
# GPT-2 of memory_modes.sh's step-time part (T=256, global batch 8, micro-batch 4, 6 steps).
# Usage: benchmarks/recompute_layers.sh [TRIDENT] [OUT_DIR]
set -euo pipefail
trident=${1:-build/trident}
out=${2:-$(mktemp -d)}
mkdir -p "$out"
small="--config configs/tiny.ini --model.n_layer=6 --model.d_model=512 --model.n_head=8 --model.seq_len=256
       --train.steps=6 --train.global_batch=8 --train.micro_batch=4"
printf "%-22s %12s %9s %7s %10s\n" run "planned MiB" "took MiB" "step s" "last loss"
run() {  # name flags...
  local name=$1
  shift
  local dir="$out/$name"
  rm -rf "$dir"
  # shellcheck disable=SC2086
  "$trident" train $small "$@" --log.run_dir="$dir" --log.val_batches=0 --log.every_steps=1 > "$dir.log" 2>&1
  local planned taken step loss
  planned=$(sed -n 's/^memory: rank 0 planned \([0-9.]*\) MiB.*/\1/p' "$dir.log")
  taken=$(sed -n 's/^memory: rank 0 planned [0-9.]* MiB, took \([0-9.]*\) MiB.*/\1/p' "$dir.log")
  step=$(python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['step_time_s'], 3))" "$dir/summary.json")
  loss=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['loss_last'])" "$dir/summary.json")
  printf "%-22s %12s %9s %7s %10s\n" "$name" "$planned" "$taken" "$step" "$loss"
}
run none --train.recompute=none
for n in 2 4; do
  run "full_${n}_block" --train.recompute=full --train.recompute_layers=$n --train.recompute_method=block
done
run full_4_uniform --train.recompute=full --train.recompute_layers=4 --train.recompute_method=uniform
run full --train.recompute=full
