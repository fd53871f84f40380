#!/usr/bin/env bash
# What watching a run costs: the step time with TensorBoard and the Prometheus endpoint on
# (a scraper reading it every second) against both off, on the default job's model and on
# GPT-2 124M, every step logged (the writers' worst case); runs alternate off/on so that
# the machine's drift falls on both. Prints the median step time of each and their ratio,
# the time the writers themselves took (summary.json's monitor_seconds: TensorBoard, the
# exporter, the machine's telemetry) against the steps' time, which the A/B's noise hides,
# and the event file's bytes per 1,000 logged steps.
# Usage: benchmarks/monitor_cost.sh [BUILD_DIR] [ROUNDS]   (from the repository root)
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
out=$(mktemp -d)
trap 'kill $scraper 2>/dev/null || true; rm -rf "$out"' EXIT
port=$((20000 + RANDOM % 20000))
scraper=
median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
# The steady steps' times of a run's metrics.jsonl (the first, warm-up, left out).
step_times() { /usr/bin/python3 -c "
import json, sys
times = [json.loads(l)['step_time_s'] for l in open(sys.argv[1]) if 'step_time_s' in l]
print('\n'.join(str(t) for t in times[1:]))" "$1"; }

echo "| model | steps x runs | off: median step (ms) | on: median step (ms) | on / off | writers' time / step time | event file bytes per 1000 steps |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
for model in tiny-bpe gpt2-124m; do
  if [ $model = tiny-bpe ]; then
    config=(--config configs/tiny.ini --model.vocab_size=4096) steps=60
  else
    config=(--config configs/gpt2-124m.ini --train.global_batch=1 --train.micro_batch=1 --model.seq_len=256) steps=6
  fi
  common=("${config[@]}" --train.steps=$steps --log.every_steps=1 --log.val_batches=0 --log.sample_every_steps=0
          --log.peak_gflops=100 --data.path=/usr/share/games/fortunes)
  : > "$out/off.txt"; : > "$out/on.txt"; : > "$out/share.txt"
  for r in $(seq "$rounds"); do
    "$build/trident" train "${common[@]}" --log.run_dir="$out/off" --log.tensorboard_dir=none > /dev/null
    step_times "$out/off/metrics.jsonl" >> "$out/off.txt"
    rm -rf "$out/on"
    "$build/trident" train "${common[@]}" --log.run_dir="$out/on" --log.metrics_port=$port > "$out/on.log" &
    run=$!
    ( while kill -0 $run 2>/dev/null; do curl -s -o /dev/null "http://127.0.0.1:$port/metrics" || true; sleep 1; done ) &
    scraper=$!
    wait $run
    wait $scraper 2>/dev/null || true
    step_times "$out/on/metrics.jsonl" >> "$out/on.txt"
    /usr/bin/python3 -c "
import json, sys
s = json.load(open(sys.argv[1] + '/summary.json'))
steps = sum(json.loads(l)['step_time_s'] for l in open(sys.argv[1] + '/metrics.jsonl') if 'step_time_s' in l)
print(s['monitor_seconds'] / steps)" "$out/on" >> "$out/share.txt"
  done
  off=$(median < "$out/off.txt") on=$(median < "$out/on.txt")
  bytes=$(stat -c %s "$out"/on/tensorboard/events.out.tfevents.* | head -1)
  share=$(median < "$out/share.txt")
  printf "| %s | %d x %d | %.2f | %.2f | %.4f | %.5f | %.0f |\n" $model $steps "$rounds" "$(echo "$off * 1000" | bc -l)" \
    "$(echo "$on * 1000" | bc -l)" "$(echo "$on / $off" | bc -l)" "$share" "$(echo "$bytes * 1000 / $steps" | bc -l)"
done
