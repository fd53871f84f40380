#!/usr/bin/env bash
# Expert load balance over a run of the default data, with the load-balancing loss on and
# off (issue 41): configs/tiny-mixtral.ini (8 experts, top-2, 4 layers) trained twice from
# the same seed, router_aux_loss_coef 0.01 against 0 (the z-loss 0.001 in both). Each step
# logs every layer's expert load (the most loaded expert's tokens over the mean expert's:
# 1 balanced, E/K = 4 every token to the same 2); this prints the mean over the last
# quarter of the steps of the least balanced layer's load, the loss and the step time, and
# benchmarks/plot_moe_balance.py draws the load of each layer over the run for both.
#
#   bash benchmarks/moe_balance.sh [build/trident] [out_dir] [steps]
set -euo pipefail
trident=$(realpath "${1:-build/trident}")
out=${2:-runs/moe_balance}
steps=${3:-600}
mkdir -p "$out"
for coef in 0.01 0; do
  run_dir="$out/aux_$coef"
  rm -rf "$run_dir"
  OMP_NUM_THREADS=2 "$trident" train --config configs/tiny-mixtral.ini --train.steps="$steps" \
      --model.router_aux_loss_coef="$coef" --log.every_steps=5 --log.val_every_steps=0 \
      --log.sample_every_steps=0 --log.run_dir="$run_dir" > "$run_dir.log" 2>&1
done
/usr/bin/python3 - "$out" "$steps" <<'PY'
import json, sys
out, steps = sys.argv[1], int(sys.argv[2])
print(f"{'router_aux_loss_coef':>20} {'max load, last 1/4':>18} {'layers (mean)':>28} {'loss, last 1/4':>14} {'val loss':>8} {'step ms':>8}")
for coef in ("0.01", "0"):
    rows = [json.loads(l) for l in open(f"{out}/aux_{coef}/metrics.jsonl")]
    train = [r for r in rows if "expert_load" in r]
    tail = [r for r in train if r["step"] > 3 * steps // 4]
    layers = len(tail[0]["expert_load_per_layer"])
    per_layer = [sum(r["expert_load_per_layer"][i] for r in tail) / len(tail) for i in range(layers)]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    summary = json.load(open(f"{out}/aux_{coef}/summary.json"))
    print(f"{coef:>20} {sum(r['expert_load'] for r in tail) / len(tail):18.3f} "
          f"{' '.join(f'{x:.2f}' for x in per_layer):>28} {sum(r['loss'] for r in tail) / len(tail):14.4f} "
          f"{val[-1] if val else float('nan'):8.4f} {1000 * summary['step_time_s']:8.1f}")
PY
/usr/bin/python3 benchmarks/plot_moe_balance.py "$out/aux_0.01/metrics.jsonl" "$out/aux_0/metrics.jsonl" \
    --labels "aux loss 0.01" "aux loss off" --out benchmarks/moe_balance.png
