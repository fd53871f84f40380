#!/usr/bin/env bash
# Memory per rank and step time under each of issue 16's modes, one run each, in one
# session (the machine is noisy: compare within a run). Every run prints its memory plan
# and what it then took; this script collects rank 0's into a table and a CSV, and
# benchmarks/plot_memory.py draws memory per rank against dp for every mode.
#
#   bash benchmarks/memory_modes.sh [build/trident] [out_dir]
#
# Part 1: GPT-2 124M (T=256, micro-batch 1) on 1, 2 and 4 ranks under ZeRO 0, 1, 2, 3, and
#         on 4 ranks with recomputation and with tp 2 (+ sequence parallelism): plan and
#         measured peak growth of rank 0, against the formula of the model states
#         (4 bytes parameters + 4 gradients + 8 optimizer per parameter; ZeRO-1 and -2
#         divide the 8 by dp, ZeRO-2 keeps only the embeddings' and two blocks' gradients,
#         ZeRO-3 also their parameters, plus its 1/dp master shard and gradient shard).
# Part 2: step time, a 6-layer width-512 GPT-2 (T=256): ZeRO-2 and -3 against ZeRO-1 at dp 2;
#         recompute selective and full against none on one rank.
set -euo pipefail
trident=${1:-build/trident}
out=${2:-benchmarks/memory_modes}
mkdir -p "$out"
mpirun_cmd=(mpirun --oversubscribe -x OMP_NUM_THREADS=1)
[[ $(id -u) == 0 ]] && mpirun_cmd+=(--allow-run-as-root)

csv="$out/memory_modes.csv"
echo "part,mode,ranks,dp,tp,planned_mib,taken_mib,step_s,states_formula_mib" > "$csv"

# planned, taken (MiB) and the last steady step time of one run's output.
parse() {
  local log=$1
  local planned taken step
  planned=$(sed -n 's/^memory: rank 0 planned \([0-9.]*\) MiB.*/\1/p' "$log")
  taken=$(sed -n 's/^memory: rank 0 planned [0-9.]* MiB, took \([0-9.]*\) MiB.*/\1/p' "$log")
  step=$(python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['step_time_s'], 3))" "$3/summary.json")
  echo "$planned,$taken,$step"
}

run_point() {  # part mode ranks dp tp flags...
  local part=$1 mode=$2 ranks=$3 dp=$4 tp=$5
  shift 5
  local run_dir="$out/run_${part}_${mode}_${ranks}"
  local log="$run_dir.log"
  rm -rf "$run_dir"
  "${mpirun_cmd[@]}" -np "$ranks" "$trident" train "$@" --log.run_dir="$run_dir" --log.peak_gflops=1 \
      --log.val_batches=0 --log.every_steps=1 > "$log" 2>&1
  local n
  n=$(sed -n 's/^model: .*: \([0-9.]*\)M parameters,.*/\1/p' "$log")
  local zero=0
  [[ $mode == zero1* ]] && zero=1
  [[ $mode == zero2* ]] && zero=2
  [[ $mode == zero3* ]] && zero=3
  # The model states of one rank by the formula (ZeRO-2's kept gradients come from the plan line).
  local states
  # GPT-2 124M at T=256: embeddings + final norm 50257*768 + 256*768 + 2*768, a block 12*768^2 + 13*768.
  states=$(python3 -c "
n=float('$n')*1e6; dp=$dp; tp=$tp; z=$zero
kept = 50257*768 + 256*768 + 2*768 + 2*(12*768*768 + 13*768)
grads = 4*n/tp if z < 2 else 4*kept
params = 4*n/tp if z < 3 else 4*kept + 4*n/dp + 4*n/dp  # ZeRO-3: kept + windows, master shard, gradient shard
print(round((params + grads + 8*n/tp/(dp if z>0 else 1))/2**20, 1))")
  [[ $part == memory ]] || states=-  # the formula is GPT-2 124M's
  echo "$part,$mode,$ranks,$dp,$tp,$(parse "$log" "$log" "$run_dir"),$states" >> "$csv"
}

gpt2="--config configs/gpt2-124m.ini --model.seq_len=256 --train.micro_batch=1 --train.steps=2"
for dp in 1 2 4; do
  for zero in 0 1 2 3; do
    [[ $dp == 1 && $zero != 0 ]] && continue
    run_point memory "zero$zero" "$dp" "$dp" 1 $gpt2 --train.global_batch="$dp" --parallel.zero="$zero"
  done
done
run_point memory zero1_selective 4 4 1 $gpt2 --train.global_batch=4 --parallel.zero=1 --train.recompute=selective
run_point memory zero1_full 4 4 1 $gpt2 --train.global_batch=4 --parallel.zero=1 --train.recompute=full
run_point memory tp2 4 2 2 $gpt2 --train.global_batch=2 --parallel.tp=2
run_point memory tp2_sequence_parallel 4 2 2 $gpt2 --train.global_batch=2 --parallel.tp=2 --parallel.sequence_parallel=true

small="--config configs/tiny.ini --model.n_layer=6 --model.d_model=512 --model.n_head=8 --model.seq_len=256 --train.steps=6 --train.global_batch=8 --train.micro_batch=4"
run_point time zero1 2 2 1 $small --parallel.zero=1
run_point time zero2 2 2 1 $small --parallel.zero=2
run_point time zero3 2 2 1 $small --parallel.zero=3
for r in none selective full; do
  run_point time "recompute_$r" 1 1 1 $small --train.recompute="$r"
done

python3 - "$csv" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print(f"{'part':6} {'mode':24} {'ranks':>5} {'dp':>3} {'tp':>3} {'planned MiB':>12} {'took MiB':>9} {'took/plan':>9} {'states formula MiB':>19} {'step s':>7}")
for r in rows:
    ratio = float(r['taken_mib']) / float(r['planned_mib'])
    print(f"{r['part']:6} {r['mode']:24} {r['ranks']:>5} {r['dp']:>3} {r['tp']:>3} {r['planned_mib']:>12} {r['taken_mib']:>9} {ratio:>9.3f} {r['states_formula_mib']:>19} {r['step_s']:>7}")
t = {r['mode']: float(r['step_s']) for r in rows if r['part'] == 'time'}
print(f"\nZeRO-2 / ZeRO-1 step time at dp 2: {t['zero2'] / t['zero1']:.3f}, ZeRO-3 / ZeRO-1: {t['zero3'] / t['zero1']:.3f}")
print(f"recompute selective / none: {t['recompute_selective'] / t['recompute_none']:.3f}, full / none: {t['recompute_full'] / t['recompute_none']:.3f}")
m = {r['mode']: float(r['taken_mib']) for r in rows if r['part'] == 'time'}
print(f"memory taken, selective / none: {m['recompute_selective'] / m['recompute_none']:.3f}, full / none: {m['recompute_full'] / m['recompute_none']:.3f}")
EOF
