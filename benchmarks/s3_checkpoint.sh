#!/usr/bin/env bash
# Checkpoints to S3, measured against a real S3 server on this machine (Ceph's RADOS
# Gateway, tests/s3/s3_server.sh, objects in the OSD's memory):
#   1. one 1 GiB file up and down: trident's S3 client (build/bench/s3_transfer: multipart,
#      8 parts of 64 MiB in flight, ranged GETs) beside `aws s3 cp` (Debian's awscli, its
#      defaults: 10 requests in flight, 8 MiB parts) of the same file to the same server,
#      rounds alternating, each to a new key;
#   2. the step-time cost of uploading in the background: GPT-2 124M on one rank (one
#      compute thread), a 1.49 GB checkpoint every 5 steps to disk, without and with
#      checkpoint.upload, the median step time of each;
#   3. the time from launch to the first step when a fresh start (an empty checkpoint.dir)
#      resumes from S3, beside resuming from disk;
#   4. the requests one checkpoint takes on 8 ranks as 2 nodes (one object per node)
#      beside one object per rank.
# In 1 the server and the clients share both cores. From 2 on the server runs on core 1
# (taskset); the training's compute thread is on core 0 and its upload threads go where
# the kernel puts them (a GPU node has cores to spare for them).
# Usage: benchmarks/s3_checkpoint.sh [BUILD_DIR] [ROUNDS]   (from the repository root)
set -euo pipefail
trap 'echo "s3_checkpoint.sh: line $LINENO failed (exit $?)" >&2' ERR
build=${1:-build}
rounds=${2:-3}
here=$(cd "$(dirname "$0")" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
S3_SERVER_MEMORY_GIB=8 source "$here/s3_bench_server.sh"
$aws --endpoint-url "$endpoint" s3api create-bucket --bucket bench >/dev/null

parts=${S3_BENCH_PARTS:-1 2 4}  # which to run: 1, 2 (with 3, which reads what 2 uploaded), 4
# 1. One file up and down.
if [[ " $parts " == *" 1 "* ]]; then
head -c 1G /dev/urandom > "$work/node_file"
: > "$work/ours_up"; : > "$work/ours_down"; : > "$work/aws_up"; : > "$work/aws_down"
seconds() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); echo "$t1 - $t0" | bc -l; }
for r in $(seq "$rounds"); do
  "$build/bench/s3_transfer" --endpoint "$endpoint" --bucket bench --file "$work/node_file" --rounds 1 > "$work/ours.txt"
  awk '/^upload/ {print $2}' "$work/ours.txt" >> "$work/ours_up"
  awk '/^download/ {print $2}' "$work/ours.txt" >> "$work/ours_down"
  seconds $aws --endpoint-url "$endpoint" s3 cp --only-show-errors "$work/node_file" "s3://bench/aws_$r" >> "$work/aws_up"
  seconds $aws --endpoint-url "$endpoint" s3 cp --only-show-errors "s3://bench/aws_$r" "$work/aws_back" >> "$work/aws_down"
  cmp -s "$work/node_file" "$work/aws_back" || { echo "awscli's copy differs"; exit 1; }
  $aws --endpoint-url "$endpoint" s3 rm --only-show-errors "s3://bench/aws_$r"
done
gb=$(echo "$(stat -c %s "$work/node_file") / 1000000000" | bc -l)
echo
echo "1 GiB file, median of $rounds rounds (seconds; GB/s):"
echo "| direction | trident's S3 client | aws s3 cp | trident / aws (speed) |"
echo "| --- | ---: | ---: | ---: |"
for dir in up down; do
  ours=$(median < "$work/ours_$dir") theirs=$(median < "$work/aws_$dir")
  printf "| %s | %.2f s, %.3f GB/s | %.2f s, %.3f GB/s | %.2fx |\n" "$([ $dir = up ] && echo upload || echo download)" "$ours" "$(echo "$gb / $ours" | bc -l)" \
    "$theirs" "$(echo "$gb / $theirs" | bc -l)" "$(echo "$theirs / $ours" | bc -l)"
done
rm -f "$work/node_file" "$work/aws_back"
fi

if [[ " $parts " == *" 2 "* ]]; then  # 2 and 3
# 2. Step time with and without uploads in the background.
for pidfile in "$work"/ceph/pids/*.pid; do taskset -a -cp 1 "$(cat "$pidfile")" >/dev/null; done
common=(--config configs/gpt2-124m.ini --train.global_batch=1 --train.micro_batch=1 --model.seq_len=256
        --checkpoint.every_steps=5 --checkpoint.keep_last=1 --log.every_steps=1 --log.val_batches=0
        --log.sample_every_steps=0 --log.peak_gflops=100 --data.path=/usr/share/games/fortunes)
train() { OMP_NUM_THREADS=1 OMP_PROC_BIND=false "$build/trident" train "${common[@]}" --train.steps=20 "$@"; }
# The steady steps' times (the first, warm-up, left out) and the checkpoint steps' too.
step_times() { /usr/bin/python3 -c "
import json, sys
times = [json.loads(l)['step_time_s'] for l in open(sys.argv[1]) if 'step_time_s' in l]
print('\n'.join(str(t) for t in times[1:]))" "$1"; }
: > "$work/off"; : > "$work/on"
for r in $(seq "$rounds"); do
  rm -rf "$work/ck_off" "$work/run_off" "$work/ck_on" "$work/run_on"
  train --checkpoint.dir="$work/ck_off" --log.run_dir="$work/run_off" > "$work/off.log" 2>&1 || { tail -20 "$work/off.log"; exit 1; }
  step_times "$work/run_off/metrics.jsonl" >> "$work/off"
  train --checkpoint.dir="$work/ck_on" --log.run_dir="$work/run_on" --checkpoint.upload="s3://bench/run$r" \
    --checkpoint.s3_endpoint="$endpoint" > "$work/on.log" 2>&1 || { tail -20 "$work/on.log"; exit 1; }
  step_times "$work/run_on/metrics.jsonl" >> "$work/on"
  # The OSD keeps objects in memory: only the last run's checkpoints stay (part 3 reads them).
  [ "$r" = 1 ] || $aws --endpoint-url "$endpoint" s3 rm --only-show-errors --recursive "s3://bench/run$((r - 1))"
done
off=$(median < "$work/off") on=$(median < "$work/on")
echo
echo "GPT-2 124M, 1 rank, batch 1 x 256, a checkpoint (1.49 GB) every 5 steps, 20 steps x $rounds runs:"
grep -E 'checkpoint: step [0-9]+ uploaded' "$work/on.log" | sed 's/^/  [last run] /' || true
echo "| checkpoints | median step (s) | with upload / disk only |"
echo "| --- | ---: | ---: |"
printf "| disk only | %.3f | |\n| disk, then S3 in the background | %.3f | %.4f |\n" "$off" "$on" "$(echo "$on / $off" | bc -l)"

# 3. Launch to the first step: resuming from S3 into an empty folder, and from disk.
first_step_after() {  # seconds from launch to the first "step" line; flags...
  /usr/bin/python3 - "$@" <<'EOF'
import os, subprocess, sys, time
t0 = time.monotonic()
env = dict(os.environ, OMP_NUM_THREADS="1")
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
seen = None
tail = []
for line in p.stdout:
    tail = (tail + [line])[-15:]
    if seen is None and line.startswith("step "):
        seen = time.monotonic() - t0
    if line.startswith("resuming from S3") or line.startswith("resumed from"):
        sys.stderr.write("  " + line)
if p.wait() != 0 or seen is None:
    sys.stderr.write("".join(tail))
print(f"{seen:.2f}" if seen is not None else "nan")
EOF
}
resume=("$build/trident" train "${common[@]}" --train.steps=21 --log.run_dir="$work/run_resume")
rm -rf "$work/ck_fresh"
from_s3=$(first_step_after "${resume[@]}" --checkpoint.dir="$work/ck_fresh" --checkpoint.upload="s3://bench/run$rounds" \
  --checkpoint.s3_endpoint="$endpoint")
from_disk=$(first_step_after "${resume[@]}" --checkpoint.dir="$work/ck_on")
echo "| resume | launch to the first step (s) |"
echo "| --- | ---: |"
printf "| from S3 (empty checkpoint.dir) | %s |\n| from disk | %s |\n" "$from_s3" "$from_disk"

fi

if [[ " $parts " == *" 4 "* ]]; then
# 4. Requests per checkpoint, 8 ranks as 2 nodes (their memory back from the OSD first:
# the objects deleted, its garbage collection run).
rm -rf "$work/ck8" "$work/ck_on" "$work/ck_off" "$work/ck_fresh"
$aws --endpoint-url "$endpoint" s3 rm --only-show-errors --recursive "s3://bench/run$rounds"
for _ in $(seq 60); do [ "$(awk '/MemAvailable/ {print int($2 / 1048576)}' /proc/meminfo)" -ge 16 ] && break; sleep 1; done
mpirun --oversubscribe -np 8 -x OMP_NUM_THREADS=1 "$build/trident" train --config configs/gpt2-124m.ini \
  --parallel.dp=2 --parallel.tp=2 --parallel.pp=2 --parallel.ranks_per_node=4 --train.global_batch=2 \
  --train.micro_batch=1 --model.seq_len=256 --train.steps=1 --checkpoint.every_steps=1 --log.val_batches=0 \
  --log.peak_gflops=100 --data.path=/usr/share/games/fortunes --checkpoint.dir="$work/ck8" \
  --log.run_dir="$work/run8" --checkpoint.upload=s3://bench/eight --checkpoint.s3_endpoint="$endpoint" > "$work/eight.log" 2>&1 ||
  { tail -20 "$work/eight.log"; exit 1; }
line=$(grep 'checkpoint: step 1 uploaded' "$work/eight.log")
echo "  $line"
ours=$(echo "$line" | grep -oE '[0-9]+ requests' | awk '{print $1}')
# One object per rank instead: each rank's piece (node file / 4 ranks) its own upload, with
# the same part rule (one PUT up to 64 MiB, else initiate + parts + complete), and the
# manifest and latest.
per_rank=$(/usr/bin/python3 - "$work"/ck8/step_00000001/node_*.h5 <<'EOF'
import math, os, sys
mib = 1 << 20
total = 2
for f in sys.argv[1:]:
    piece = os.path.getsize(f) / 4
    parts = math.ceil(piece / (64 * mib))
    total += 4 * (1 if parts <= 1 else parts + 2)
print(total)
EOF
)
echo "| objects per checkpoint | requests per checkpoint |"
echo "| --- | ---: |"
echo "| one per node (trident): 2 node files + manifest + latest | $ours |"
echo "| one per rank: 8 pieces + manifest + latest | $per_rank |"
fi
