#!/usr/bin/env bash
# Expert parallelism against data parallelism alone (issue 41): configs/tiny-mixtral.ini (8
# experts, top-2, 4 layers) on 2 ranks, dp 2 at ep 1 (every rank holds all 8 experts) and
# at ep 2 (4 each, tokens exchanged with all-to-all), the same seed and batches. Prints per
# layout the losses (the same to rounding: the same model), the all-to-all bytes per step
# against the formula (4 exchanges per MoE layer and micro-batch of tokens x K x d floats,
# all ranks together), tokens dropped, parameters and memory per rank, and the step time.
#
#   bash benchmarks/expert_parallel.sh [build/trident] [out_dir] [steps]
set -euo pipefail
trident=$(realpath "${1:-build/trident}")
out=${2:-runs/expert_parallel}
steps=${3:-200}
mkdir -p "$out"
for ep in 1 2; do
  run_dir="$out/ep_$ep"
  rm -rf "$run_dir"
  mpirun --oversubscribe --allow-run-as-root -x OMP_NUM_THREADS=1 -np 2 "$trident" train \
      --config configs/tiny-mixtral.ini --train.steps="$steps" --parallel.ep="$ep" --log.every_steps=10 \
      --log.val_every_steps=0 --log.sample_every_steps=0 --log.run_dir="$run_dir" > "$run_dir.log" 2>&1
done
/usr/bin/python3 - "$out" "$steps" <<'PY'
import json, re, sys
out, steps = sys.argv[1], int(sys.argv[2])
# tiny-mixtral: 4 MoE layers, global batch 16 x 128 tokens, top-2, d 128, fp32: every routed
# row's 4 exchanges. all_to_all_bytes counts the rows that leave their rank (about half at ep 2).
formula = 4 * 4 * 16 * 128 * 2 * 128 * 4
print(f"{'layout':>12} {'loss @' + str(steps):>10} {'all-to-all B/step':>18} {'all rows':>10} {'dropped':>7} "
      f"{'params/rank':>11} {'planned MiB':>11} {'took MiB':>8} {'step ms':>8}")
for ep in (1, 2):
    rows = [json.loads(l) for l in open(f"{out}/ep_{ep}/metrics.jsonl") if '"loss"' in l]
    log = open(f"{out}/ep_{ep}.log").read()
    memory = re.search(r"planned ([\d.]+) MiB, took ([\d.]+) MiB", log)
    params = re.search(r"memory plan of rank 0: [\d.]+ GiB: parameters ([\d.]+) GiB", log)
    summary = json.load(open(f"{out}/ep_{ep}/summary.json"))
    last = rows[-1]
    print(f"{'dp 2, ep ' + str(ep):>12} {last['loss']:10.4f} {last['all_to_all_bytes']:18.0f} "
          f"{formula if ep > 1 else 0:10d} {last['tokens_dropped']:7.0f} {float(params.group(1)) * 1024:9.1f}Mi "
          f"{float(memory.group(1)):11.1f} {float(memory.group(2)):8.1f} {1000 * summary['step_time_s']:8.1f}")
PY
