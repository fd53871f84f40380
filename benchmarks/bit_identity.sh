#!/usr/bin/env bash
# Whether a change kept the training bit for bit: runs every `verify` layout of
# tests/unit/test_cli.cpp (Cli.VerifyEveryLayoutUnderMpirun) and five training runs with
# checkpoints under one binary, into OUT; then, given a second folder, compares the two:
# every printed figure of verify, the losses, norms and learning rates of every logged
# step, and every dataset of every checkpoint's node files (h5py: Debian's python3-h5py).
#   benchmarks/bit_identity.sh BINARY OUT          # about 4 minutes on 2 cores
#   benchmarks/bit_identity.sh --compare BASE OUT  # exit 0: identical
# Typical use: build the commit before, run it into /tmp/before; build yours, run it into
# /tmp/after; compare. (From the repository root, the default data prepared: make data.)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = "--compare" ]; then
  exec /usr/bin/python3 "$here/compare_runs.py" "$2" "$3"
fi
bin=$1 out=$2
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi="mpirun --oversubscribe -x OMP_NUM_THREADS=1"
# The layouts, as the test lists them: "np|reference|flags".
python3 - > "$out/layouts.txt" <<'PY'
import re
src = open('tests/unit/test_cli.cpp').read()
body = src[src.index('TEST(Cli, VerifyEveryLayoutUnderMpirun)'):]
body = body[:body.index('const auto launch')]
names = dict(re.findall(r'(\w+) = "(tests/data/[^"]+)"', body))
for np_, ref, flags in re.findall(r'\{(\d+),\s*(\w+),\s*((?:"[^"]*"\s*)+),\s*"[^"]*"\}', body):
    print(np_ + "|" + names[ref] + "|" + "".join(re.findall(r'"([^"]*)"', flags)))
PY
i=0
while IFS='|' read -r np ref flags; do
  $mpi -np "$np" "$bin" verify --reference "$ref" --parallel.bucket_mb=0.05 $flags < /dev/null > "$out/verify_$i.txt" 2>&1 &
  i=$((i + 1))
  if (( i % 2 == 0 )); then wait; fi  # two launches side by side
done < "$out/layouts.txt"
wait
echo "$i verify layouts run"
run_train() {  # name, ranks, flags...
  local name=$1 np=$2; shift 2
  rm -rf "$out/train_$name"
  $mpi -np "$np" "$bin" train "$@" --log.run_dir="$out/train_$name/run" --checkpoint.dir="$out/train_$name/ckpt" \
    --log.peak_gflops=1 --log.tensorboard_dir=none < /dev/null > "$out/train_$name.txt" 2>&1
  echo "exit $?" >> "$out/train_$name.txt"
}
run_train default 8 --config configs/tiny-bpe.ini --parallel.dp=2 --parallel.tp=2 --parallel.pp=2 --train.micro_batch=2 \
  --checkpoint.every_steps=300 --log.sample_every_steps=0
run_train llama_zero3 4 --config configs/tiny-llama.ini --train.steps=40 --parallel.zero=3 --parallel.tp=2 \
  --train.micro_batch=2 --checkpoint.every_steps=40 --log.val_every_steps=0 --train.recompute=selective
run_train gpt_zb1_bf16 4 --config configs/tiny.ini --train.steps=40 --parallel.pp=2 --parallel.schedule=zb1 \
  --train.micro_batch=2 --train.precision=bf16 --parallel.zero=2 --checkpoint.every_steps=40
run_train llama_interleaved_cp 8 --config configs/tiny-llama.ini --train.steps=30 --parallel.pp=2 --parallel.vpp=2 \
  --parallel.schedule=interleaved --parallel.cp=2 --train.micro_batch=1 --data.document_mask=true \
  --data.eod_token=10 --checkpoint.every_steps=30 --train.recompute=full
run_train gpt_sp_zero1 4 --config configs/tiny.ini --train.steps=40 --parallel.tp=2 --parallel.sequence_parallel=true \
  --parallel.zero=1 --checkpoint.every_steps=40
echo "5 training runs in $out"
