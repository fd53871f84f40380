#!/usr/bin/env bash
# The default job (configs/tiny-bpe.ini on 8 ranks as (dp, tp, pp) = (2, 2, 2), 4
# micro-batches of 2 per step) under each pipeline schedule: the loss of every step beside
# 1F1B's (the same sums in other orders: equal to float rounding) and the mean step time.
#   bash benchmarks/schedule_losses.sh [STEPS]     (after `make data`)
set -euo pipefail
steps=${1:-100}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
root=$([ "$(id -u)" = 0 ] && echo --allow-run-as-root || true)
for schedule in "1f1b" "interleaved --parallel.vpp=2" "zb1"; do
  name=${schedule%% *}
  mpirun --oversubscribe $root -x OMP_NUM_THREADS=1 -np 8 build/trident train --config configs/tiny-bpe.ini \
    --parallel.dp=2 --parallel.tp=2 --parallel.pp=2 --train.micro_batch=2 --train.steps="$steps" \
    --log.every_steps=1 --log.val_every_steps=0 --log.sample_every_steps=0 --log.run_dir="$out/$name" \
    --parallel.schedule=$schedule > "$out/$name.log" < /dev/null
  grep -oE '^step +[0-9]+/[0-9]+ \| loss [0-9.]+' "$out/$name.log" | awk '{print $NF}' > "$out/$name.loss"
done
echo "| schedule | steps | max abs loss difference from 1f1b | final loss | mean step (ms, steps 11+) | mean bubble, rank 0 (ms) |"
echo "| --- | --- | --- | --- | --- | --- |"
for name in 1f1b interleaved zb1; do
  diff=$(paste "$out/1f1b.loss" "$out/$name.loss" | awk '{d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d} END {printf "%.1e", m}')
  mean_ms() { grep -oE "\"$1\":[0-9.e+-]+" "$out/$name/metrics.jsonl" | awk -F: 'NR > 10 {s += $2; n++} END {printf "%.0f", 1000 * s / n}'; }
  echo "| $name | $(wc -l < "$out/$name.loss") | $diff | $(tail -1 "$out/$name.loss") | $(mean_ms step_time_s) | $(mean_ms bubble_s) |"
done
