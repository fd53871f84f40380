#!/usr/bin/env bash
# A capacity factor's cost and effect: configs/tiny-mixtral.ini (8 experts, top-2) on one
# rank for STEPS steps, dropless and at capacity factors 1.0 and 1.25 (both drop policies
# at 1.0), one after the other in this run. Prints the share of the routed (token, expert)
# pairs dropped (over the logged steps: every 5th), the last logged loss, the validation
# loss and the mean step time (the last three quarters of the run) relative to the dropless
# run's.
# Usage: bash benchmarks/moe_capacity.sh [build] [steps]
set -euo pipefail
build=${1:-build}
steps=${2:-200}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run() {  # name, flags...
  local name=$1; shift
  "$build/trident" train --config configs/tiny-mixtral.ini --train.steps="$steps" --log.val_every_steps="$steps" --log.every_steps=5 \
    --checkpoint.dir="$out/$name/ckpt" --log.run_dir="$out/$name" "$@" > "$out/$name.log" 2>&1
}
# Per run: the mean share of pairs dropped per logged step, the last logged loss, the
# validation loss, the mean step ms. $routed: the pairs a step routes.
summary() {
  python3 - "$out/$1/metrics.jsonl" "$routed" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in rows if "loss" in r]
share = sum(r.get("tokens_dropped", 0) for r in steps) / len(steps) / float(sys.argv[2])
val = [r["val_loss"] for r in rows if "val_loss" in r]
ms = [r["step_time_s"] * 1000 for r in steps[len(steps) // 4:]]
print(100 * share, steps[-1]["loss"], val[-1] if val else float("nan"), sum(ms) / len(ms))
PY
}
names=(dropless cf1.0 cf1.0-position cf1.25)
run dropless
run cf1.0 --model.moe_capacity_factor=1.0
run cf1.0-position --model.moe_capacity_factor=1.0 --model.moe_token_drop_policy=position
run cf1.25 --model.moe_capacity_factor=1.25
# Pairs a step routes: global batch x seq_len x top-k x MoE layers.
routed=$(python3 -c "
import configparser; c = configparser.ConfigParser(inline_comment_prefixes=('#',)); c.read('configs/tiny-mixtral.ini')
g = lambda s, k, d: int(c.get(s, k, fallback=d))
print(g('train', 'global_batch', 0) * g('model', 'seq_len', 0) * g('model', 'n_experts_per_token', 2) * g('model', 'n_layer', 0))")
printf "| run | pairs dropped | loss @%d | val loss | step (ms) | vs dropless |\n| --- | ---: | ---: | ---: | ---: | ---: |\n" "$steps"
base=
for n in "${names[@]}"; do
  read -r share loss val ms < <(summary "$n")
  [ -n "$base" ] || base=$ms
  printf "| %s | %.1f%% | %.4f | %.4f | %.1f | %.2fx |\n" "$n" "$share" "$loss" "$val" "$ms" \
    "$(python3 -c "print($ms / $base)")"
done
