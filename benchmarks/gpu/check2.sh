#!/usr/bin/env bash
# The two-GPU check, for a loan of a machine with two NVIDIA GPUs (issue 54), from the
# repository root: `trident verify --device=cuda` under `mpirun -np 2` (one GPU per rank)
# on the layouts that need more than one GPU, under the same deadline, step lines and
# summary as check.sh (benchmarks/gpu/check_lib.sh; CHECK_DEADLINE_S, default 540 s):
#   expert parallelism ep 2 (Mixtral, Qwen3-MoE; bf16 too), context parallelism cp 2
#   (GPT-2, Llama at 24 tokens; the capacity-factor MoE reference), tensor parallelism tp 2
#   (GPT-2, Llama; bf16 too), ZeRO-3 (GPT-2, Llama) and the data-parallel baseline.
#
#   bash benchmarks/gpu/check2.sh [--dry-run] [OUT_DIR]
#
# Output: $OUT when set, else OUT_DIR, else runs/gpu_check2 (check.log there).
# Executables as check.sh picks them (the carried build/, the bundle, make); mpirun comes
# from PATH (the bundle holds Open MPI's libraries, not its launcher).
# --dry-run: the same runs on the CPU backend (mpirun --oversubscribe -np 2 --device=cpu,
# one OpenMP thread per rank), so that a broken script shows before a loan. Exit: 0 no
# step failed; 1 some did; 2 nothing could be checked.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
source benchmarks/gpu/check_lib.sh
check_begin gpu_check2 "$@"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

check_machine name,memory.total,driver_version || exit 2
if [ $check_dry_run = 0 ]; then
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
  [ "$gpus" -ge 2 ] || { echo "check2.sh needs 2 GPUs; this machine has $gpus (run check.sh)"; exit 2; }
fi
command -v mpirun > /dev/null || { echo "no mpirun on PATH: check2.sh launches 2 ranks with it"; exit 2; }
want_cuda=$([ $check_dry_run = 1 ] || echo cuda)
check_pick_build "" "$want_cuda" || { echo "no executables to check with"; exit 2; }
[ $check_dry_run = 1 ] || check_driver "$(check_build_cuda $build/trident)" || exit 2

# One OpenMP thread per rank on the CPU (the ranks share its cores); the environment the
# bundle set (LD_LIBRARY_PATH, OPAL_PREFIX) forwarded to both ranks.
mpirun=(mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1)
[ -z "${LD_LIBRARY_PATH:-}" ] || mpirun+=(-x LD_LIBRARY_PATH)
[ -z "${OPAL_PREFIX:-}" ] || mpirun+=(-x OPAL_PREFIX)
[ "$(id -u)" != 0 ] || mpirun+=(--allow-run-as-root)

verify2() {  # name, reference (tests/data/NAME.h5), flags...
  local name=$1 reference=$2
  shift 2
  step "np 2: $name" 120 "${mpirun[@]}" $build/trident verify --reference "tests/data/$reference.h5" \
    --device=$device "$@"
}
verify2 "dp 2, gpt2_ref_a" gpt2_ref_a
verify2 "ep 2, mixtral_ref_e4" mixtral_ref_e4 --parallel.ep=2
verify2 "ep 2, qwen3_moe_ref_e8" qwen3_moe_ref_e8 --parallel.ep=2
verify2 "cp 2, gpt2_ref_t24" gpt2_ref_t24 --parallel.cp=2
verify2 "cp 2, llama_ref_t24" llama_ref_t24 --parallel.cp=2
verify2 "cp 2, mixtral_ref_capacity" mixtral_ref_capacity --parallel.cp=2
verify2 "tp 2, gpt2_ref_a" gpt2_ref_a --parallel.tp=2
verify2 "tp 2, llama_ref_a" llama_ref_a --parallel.tp=2
verify2 "ZeRO-3, gpt2_ref_a" gpt2_ref_a --parallel.zero=3
verify2 "ZeRO-3, llama_ref_a" llama_ref_a --parallel.zero=3
if [ $check_dry_run = 0 ]; then  # bf16 on the CPU is emulated: slow, and the plumbing is the same
  verify2 "ep 2, mixtral_ref_e4, bf16" mixtral_ref_e4 --parallel.ep=2 --train.precision=bf16
  verify2 "tp 2, llama_ref_a, bf16" llama_ref_a --parallel.tp=2 --train.precision=bf16
  verify2 "ZeRO-3, llama_ref_a, bf16" llama_ref_a --parallel.zero=3 --train.precision=bf16
fi
check_end
