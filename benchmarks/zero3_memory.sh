#!/usr/bin/env bash
# Per-rank memory of ZeRO-3 against ZeRO-0 at dp 4 on issue 43's 92M model (GPT-2, 12
# layers, width 768, vocabulary 8192, tied; 256 tokens, micro-batch 1), each mode run
# `rounds` times, alternating (the machine is noisy; MPI's temporaries make the peak vary
# by tens of MiB between runs): rank 0's planned and measured peak growth, medians, the
# ratio to ZeRO-0, and the losses (which must be the same in every mode).
#
#   bash benchmarks/zero3_memory.sh [build/trident] [rounds] [extra flags for every run]
set -euo pipefail
trident=${1:-build/trident}
rounds=${2:-3}
extra=${3:-}
mpirun_cmd=(mpirun --oversubscribe -np 4 -x OMP_NUM_THREADS=1)
[[ $(id -u) == 0 ]] && mpirun_cmd+=(--allow-run-as-root)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

modes=(0 3)
for ((r = 1; r <= rounds; r++)); do
  for z in "${modes[@]}"; do
    # shellcheck disable=SC2086  # $extra: flags, split on purpose
    "${mpirun_cmd[@]}" "$trident" train --config configs/gpt2-124m.ini --model.vocab_size=8192 \
      --model.seq_len=256 --train.micro_batch=1 --train.global_batch=4 --train.steps=2 --parallel.zero="$z" \
      --log.val_batches=0 --data.tokenizer=byte --log.run_dir="$out/run_$z" $extra >"$out/z${z}_$r.log" 2>&1
  done
done

python3 - "$out" "$rounds" "${modes[@]}" <<'EOF'
import re, statistics, sys
out, rounds, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = {}
for z in modes:
    planned, taken, losses = [], [], set()
    for r in range(1, rounds + 1):
        text = open(f"{out}/z{z}_{r}.log").read()
        m = re.search(r"^memory: rank 0 planned ([0-9.]+) MiB, took ([0-9.]+) MiB", text, re.M)
        if not m:
            sys.exit(f"ZeRO-{z} round {r}: no memory line\n" + text[-2000:])
        planned.append(float(m.group(1)))
        taken.append(float(m.group(2)))
        losses.add(tuple(re.findall(r"^step \d+/\d+ \| loss ([0-9.]+)", text, re.M)))
    rows[z] = (statistics.median(planned), statistics.median(taken), taken, losses)
base = rows[modes[0]][1]
print(f"| ZeRO | planned (MiB) | took, median of {rounds} (MiB) | runs | vs ZeRO-0 | losses |")
print("| --- | ---: | ---: | --- | ---: | --- |")
for z in modes:
    planned, taken, runs, losses = rows[z]
    loss = " / ".join(" -> ".join(l) for l in sorted(losses))
    print(f"| {z} | {planned:.1f} | {taken:.1f} | {', '.join(f'{t:.0f}' for t in runs)} | {taken / base:.3f}x | {loss} |")
if len({rows[z][3].__repr__() for z in modes}) != 1:
    sys.exit("the modes' losses differ")
EOF
