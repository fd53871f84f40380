#!/usr/bin/env bash
# The GPU check (issues 7 and 54), on a machine with one NVIDIA GPU, from the repository
# root, sized for a loan of about 15 minutes of device time in all: every step has a time
# limit of its own and the whole check a deadline (CHECK_DEADLINE_S, default 540 s); once
# it has passed, the steps left are reported "skipped (deadline)". Each step prints one
# line "PASS|FAIL|SKIP: step (seconds) [note]"; a summary table closes the log.
#
#   0. the machine (nvidia-smi); the executables: the carried build/ where they start
#      here, else .gpu_bundle.tar.xz (benchmarks/gpu/bundle.sh, made on a Debian machine
#      with nvcc), else `make` as the last resort (never `make run` or `make deps`: they
#      install packages, and a loan machine is offline); then one line and exit 2 where
#      the driver's CUDA version is older than the build's;
#   1. every CUDA kernel against the CPU kernel on fresh random inputs, bf16 then fp32,
#      each in a process of its own (a CUDA fault is sticky), no timing
#      (build/bench/kernel_check);
#   2. the MoE router's memory at N 16384, E 128, K 8 (kernel_check --moe-router-memory;
#      an executable without that option fails this step only);
#   3. `trident verify --device=cuda` on every reference in tests/data (each file names
#      its family and options), fp32; the main ones (GPT-2, Llama, Mixtral, Qwen3-MoE) in
#      bf16 too; Llama in bf16 once more without memory pools (TRIDENT_CUDA_NO_MEMORY_POOLS);
#   4. 10 steps of a Qwen3-MoE-like model (4 layers, d 2048, 128 experts of 768, top 8,
#      bf16, batch 2 x 2048): host synchronizations per step (summary.json; target <= 2);
#   5. 5 steps of GPT-2 124M with Lion (train.optimizer=lion);
#   6. throughput: 20 steps of gpt2-124m (batch 16 x 1024) and 10 of a 1.2B Llama (16
#      layers, d 2048, 32 heads over 8, SwiGLU 8192, vocabulary 128256, batch 8 x 2048),
#      bf16: tokens/s, MFU against the datasheet bf16 rate of the GPU the driver names,
#      host syncs per step;
#   7. the kernel timing tables (kernel_check, bf16 then fp32), the experts' grouped vs
#      per-expert GEMM choice recorded in OUT/gpu_choices.json (TRIDENT_GPU_CHOICES);
#   8. with --sanitizer only, last: compute-sanitizer memcheck on step 1's checks.
#
#   bash benchmarks/gpu/check.sh [--sanitizer] [--dry-run] [OUT_DIR]
#
# The log and the runs go to $OUT when it is set (the device tool brings that folder
# back), else OUT_DIR, else runs/gpu_check; the log is check.log there.
# --dry-run: the same steps and deadline on the CPU backend (--device=cpu), tiny shapes
# and few steps, kernel_check --cpu-self-check for the kernel steps: a broken script shows
# here (tests/run_tests.sh runs it) and not on a loan. CHECK_DRY_RUN_FAULT=1 gives the
# first step (kernel_check) an unknown option, so that it fails: the test that a failing
# step fails the check (tests/unit/test_gpu_check_dry_run.sh). Exit: 0 no step failed; 1 some did; 2 nothing could be checked.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
source benchmarks/gpu/check_lib.sh
check_begin gpu_check "$@"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

check_machine name,memory.total,driver_version,clocks.max.sm || exit 2
if [ $check_dry_run = 0 ]; then
  # The CUDA the executables need, before any is run: the carried build's, the bundle's, nvcc's.
  wanted=$(check_build_cuda build/trident)
  [ -n "$wanted" ] || wanted=$({ tar -xJOf .gpu_bundle.tar.xz .gpu_bundle/cuda_version ||
    python3 -c "import tarfile; print(tarfile.open('.gpu_bundle.tar.xz').extractfile('.gpu_bundle/cuda_version').read().decode().strip())"; } 2>/dev/null)
  [ -n "$wanted" ] || wanted=$(nvcc --version 2>/dev/null | grep -oE 'release [0-9]+\.[0-9]+' | grep -oE '[0-9.]+$')
  check_driver "$wanted" || exit 2
fi
want_cuda=$([ $check_dry_run = 1 ] || echo cuda)
check_pick_build bench/kernel_check "$want_cuda" || { echo "no executables to check with"; exit 2; }
if [ $check_dry_run = 0 ]; then  # the executables picked may differ from the guess above
  check_driver "$(check_build_cuda $build/trident)" || exit 2
fi

fault=""
[ "${CHECK_DRY_RUN_FAULT:-0}" = 0 ] || fault=--no-such-option-the-fault-hook
data=$(check_corpus "$out/text")
export device data out
kc=$build/bench/kernel_check

# Shapes: the loan's, or the dry run's (tiny, a few steps).
if [ $check_dry_run = 1 ]; then
  # One OpenMP thread: on a busy machine (tests beside builds) spinning threads that share
  # cores make a 3-step run of a tiny model take 25 s instead of 1.
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  moe_shape="--model.n_layer=2 --model.d_model=64 --model.n_head=4 --model.n_kv_head=2 --model.ffn_dim=32
    --model.moe_ffn_dim=32 --model.n_experts=16 --model.n_experts_per_token=4 --model.vocab_size=256
    --model.seq_len=64 --train.global_batch=2 --train.micro_batch=2 --train.steps=3"
  small="--model.n_layer=2 --model.d_model=64 --model.n_head=4 --model.seq_len=64 --model.vocab_size=512
    --train.global_batch=2 --train.micro_batch=2"
  gpt2_shape="$small --train.steps=3"
  lion_shape="$small --train.steps=2"
  llama_shape="$small --model.n_kv_head=2 --model.ffn_dim=128 --train.steps=3"
  every=1
  tiny=" (dry run: tiny shapes)"
  # bf16 on the CPU is emulated and slow, and its MoE gradients exceed verify's bf16 bound
  # there (qwen3_moe_ref_e8: 0.24 against 0.05): the dry run's bf16 step is the plumbing only.
  bf16_references="gpt2_ref_a llama_ref_a"
else
  moe_shape="--model.n_layer=4 --model.d_model=2048 --model.n_head=32 --model.n_kv_head=4 --model.ffn_dim=768
    --model.moe_ffn_dim=768 --model.n_experts=128 --model.n_experts_per_token=8 --model.vocab_size=32768
    --model.seq_len=2048 --train.global_batch=2 --train.micro_batch=2 --train.steps=10"
  gpt2_shape="--train.global_batch=16 --train.micro_batch=16 --train.steps=20"
  lion_shape="--train.global_batch=8 --train.micro_batch=8 --train.steps=5"
  llama_shape="--model.n_layer=16 --model.d_model=2048 --model.n_head=32 --model.n_kv_head=8 --model.ffn_dim=8192
    --model.seq_len=2048 --train.global_batch=8 --train.micro_batch=8 --train.steps=10"
  every=5
  tiny=""
  bf16_references="gpt2_ref_a llama_ref_a mixtral_ref_e4 qwen3_moe_ref_e8"
fi

# A training run (name, trident train flags...): its log in $out/train_NAME.log, its run
# folder $out/train_NAME; the note: tok/s and MFU of its last logged step, host syncs per step.
train_run() {
  local name=$1
  shift
  $build/trident train --device=$device --train.warmup_steps=2 --data.path="$data" --data.tokenizer=byte \
    --log.run_dir="$out/train_$name" --log.val_batches=0 --log.every_steps=$every "$@" 2>&1 |
    tee "$out/train_$name.log"
  local rc=${PIPESTATUS[0]}
  local line summary=$out/train_$name/summary.json
  line=$(grep -E '^step +[0-9]+/' "$out/train_$name.log" | tail -1)
  local syncs
  syncs=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('host_syncs_per_step'))" "$summary" 2>/dev/null)
  echo "$(grep -oE '[0-9]+ tok/s' <<< "$line" || echo "no step logged"), $(grep -oE 'MFU [0-9.]+%' <<< "$line"), host syncs per step ${syncs:-n/a}" > "$CHECK_NOTE"
  grep -m1 '^MFU peak:' "$out/train_$name.log"
  [ "$rc" = 0 ] || return "$rc"
  [ -n "$syncs" ] || { echo "no host_syncs_per_step in $summary"; return 1; }
}
dry_skip() { echo "dry run: $*" > "$CHECK_NOTE"; return 77; }
export -f train_run dry_skip
export build every

# 1. kernels
if [ $check_dry_run = 1 ]; then
  step "kernels: kernel_check --cpu-self-check (dry run)" 60 $kc --cpu-self-check --seed 1 $fault
else
  for precision in bf16 fp32; do
    step "kernels: CUDA against CPU, $precision, no timing" 180 $kc --precision $precision --no-timing --seed 1 $fault
    fault=""
  done
fi
# 2. the MoE router's memory
if [ $check_dry_run = 1 ]; then
  step "kernel_check --moe-router-memory" 10 dry_skip "needs a GPU (cudaMemGetInfo)"
else
  step "kernel_check --moe-router-memory (N 16384, E 128, K 8)" 120 $kc --moe-router-memory
fi
# 3. every reference, fp32; the main ones in bf16 too
for reference in tests/data/*.h5; do
  step "verify $(basename "$reference" .h5) fp32" 90 $build/trident verify --reference "$reference" --device=$device \
    --train.precision=fp32
done
for reference in $bf16_references; do
  step "verify $reference bf16" 90 $build/trident verify --reference tests/data/$reference.h5 --device=$device \
    --train.precision=bf16
done
if [ $check_dry_run = 1 ]; then
  step "verify llama_ref_a bf16 without memory pools" 10 dry_skip "memory pools are CUDA's"
else
  step "verify llama_ref_a bf16 without memory pools" 90 env TRIDENT_CUDA_NO_MEMORY_POOLS=1 $build/trident verify \
    --reference tests/data/llama_ref_a.h5 --device=cuda --train.precision=bf16
fi
# 4. a Qwen3-MoE-like model: host syncs per step
# shellcheck disable=SC2086  # the shapes are lists of flags
step "qwen3_moe L4 d2048 E128x768 top8, bf16$tiny" 240 train_run qwen3_moe --config configs/tiny-mixtral.ini \
  --model.family=qwen3_moe $moe_shape --train.precision=bf16
# 5. Lion
# shellcheck disable=SC2086
step "gpt2-124m with Lion, bf16$tiny" 150 train_run lion --config configs/gpt2-124m.ini --train.optimizer=lion \
  --train.lr=1e-4 $lion_shape --train.precision=bf16
# 6. throughput
# shellcheck disable=SC2086
step "throughput: gpt2-124m, batch 16 x 1024, bf16$tiny" 180 train_run gpt2 --config configs/gpt2-124m.ini \
  $gpt2_shape --train.precision=bf16
# shellcheck disable=SC2086
step "throughput: Llama 1.2B, batch 8 x 2048, bf16$tiny" 240 train_run llama --config configs/llama3-8b.ini \
  --train.precision=bf16 --parallel.tp=1 --parallel.pp=1 --parallel.zero=0 $llama_shape
# 7. the kernel timing tables
if [ $check_dry_run = 1 ]; then
  step "kernel timings" 10 dry_skip "timings need a GPU"
else
  for precision in bf16 fp32; do
    # The experts' grouped vs per-expert GEMM timing, kept for the runs that follow
    # (TRIDENT_GPU_CHOICES=$out/gpu_choices.json; docs/performance.md).
    step "kernel timings, $precision" 180 $kc --precision $precision --seed 2 --record "$out/gpu_choices.json"
  done
fi
# 8. compute-sanitizer, asked for only
if [ $check_sanitizer = 1 ]; then
  if [ $check_dry_run = 1 ]; then
    step "compute-sanitizer memcheck" 10 dry_skip "compute-sanitizer needs a GPU"
  elif ! command -v compute-sanitizer > /dev/null; then
    step "compute-sanitizer memcheck" 10 bash -c 'echo "compute-sanitizer not installed" > "$CHECK_NOTE"; exit 77'
  else
    for precision in bf16 fp32; do
      step "compute-sanitizer memcheck, $precision" 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
        --log-file "$out/sanitizer_$precision.log" $kc --precision $precision --no-timing --seed 1
    done
  fi
fi
check_end
